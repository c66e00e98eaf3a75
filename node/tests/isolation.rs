//! Snapshot isolation under load, through the query contract: while a node replays transfers
//! between accounts (two tables: balances and a ledger), concurrent clients read both tables
//! under one query, and every result is exactly the naive model's state at that query's
//! snapshot; the total never changes and no partial transaction is ever seen. Freshness: a
//! transaction is visible to the first query that begins after HWM passes it, active
//! write-buffer block included.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::on_executor;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_client as client;
use retina_node::catalog::Catalog;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_storage::batch_rows;
use retina_storage::{RowOp, TableOp, Value};

const DDL: &str = "CREATE TABLE bank.accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL);
                   CREATE TABLE bank.ledger (n BIGINT PRIMARY KEY, src INT NOT NULL, dst INT NOT NULL, amount BIGINT NOT NULL);";
const ACCOUNTS: i64 = 40;
const TOTAL: i64 = ACCOUNTS * 1000;

type State = (BTreeMap<i64, i64>, Vec<(i64, i64, i64, i64)>);

fn start(dir: &std::path::Path) -> Node {
    Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "bank.sql").unwrap()),
        settings: Settings {
            shards: 2,
            tile_rows: 64,
            block_rows: 64,
            row_group_rows: 128,
            file_rows: 256,
            flush_interval_ms: 2,
            gc_interval_ms: 5,
            ..Settings::default()
        },
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap()
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("{other:?}"),
    }
}

/// Both tables at one query's snapshot, through the contract.
async fn read_state(
    c: &retina_protocol::retina_capnp::coordinator::Client,
    lake: &std::path::Path,
) -> (u64, State) {
    let store = retina_storage::file::local_store(lake).unwrap();
    let q = client::begin(c).await.unwrap();
    let snapshot = q.snapshot;
    let (schema_a, a) = client::read_at(c, "", store.as_ref(), "bank.accounts", &q, None)
        .await
        .unwrap();
    let (schema_l, l) = client::read_at(c, "", store.as_ref(), "bank.ledger", &q, None)
        .await
        .unwrap();
    client::end(c, q.id).await.unwrap();
    let types =
        |s: &retina_storage::TableSchema| s.columns().iter().map(|c| c.ty).collect::<Vec<_>>();
    let accounts = a
        .iter()
        .flat_map(|b| batch_rows(b, &types(&schema_a)))
        .map(|r| (int(&r[0]), int(&r[1])))
        .collect();
    let mut ledger: Vec<_> = l
        .iter()
        .flat_map(|b| batch_rows(b, &types(&schema_l)))
        .map(|r| (int(&r[0]), int(&r[1]), int(&r[2]), int(&r[3])))
        .collect();
    ledger.sort();
    (snapshot.get(), (accounts, ledger))
}

#[test]
fn concurrent_queries_see_exactly_the_model_at_their_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"));
    let h = node.handle().clone();
    let addr: SocketAddr = node.coordinator_addr().unwrap();
    let lake = dir.path().join("data/lake");

    // Every transaction up front, and the model after each.
    let row = |id: i64, bal: i64| vec![Value::Int(id), Value::Int(bal)];
    let mut rng = SmallRng::seed_from_u64(11);
    let mut balances: BTreeMap<i64, i64> = (0..ACCOUNTS).map(|i| (i, 1000)).collect();
    let mut txns: Vec<Vec<TableOp<Vec<Value>>>> = vec![
        balances
            .iter()
            .map(|(&i, &b)| TableOp {
                table: 0,
                op: RowOp::Insert(row(i, b)),
            })
            .collect(),
    ];
    let mut states: Vec<State> = vec![(balances.clone(), Vec::new())];
    for n in 0..600i64 {
        let (a, b) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
        if a == b {
            continue;
        }
        let x = rng.random_range(1..200);
        let (ba, bb) = (balances[&a], balances[&b]);
        balances.insert(a, ba - x);
        balances.insert(b, bb + x);
        txns.push(vec![
            TableOp {
                table: 0,
                op: RowOp::Update {
                    before: row(a, ba),
                    after: row(a, ba - x),
                },
            },
            TableOp {
                table: 1,
                op: RowOp::Insert(vec![
                    Value::Int(n),
                    Value::Int(a),
                    Value::Int(b),
                    Value::Int(x),
                ]),
            },
            TableOp {
                table: 0,
                op: RowOp::Update {
                    before: row(b, bb),
                    after: row(b, bb + x),
                },
            },
        ]);
        let mut ledger = states.last().unwrap().1.clone();
        ledger.push((n, a, b, x));
        states.push((balances.clone(), ledger));
    }

    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let h = h.clone();
        let done = done.clone();
        std::thread::spawn(move || {
            let mut first = None;
            for chunk in txns.chunks(3) {
                let range = h.submit(chunk).unwrap();
                first.get_or_insert(*range.start());
                std::thread::sleep(Duration::from_micros(300));
            }
            done.store(true, Ordering::Release);
            first.unwrap()
        })
    };
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let lake = lake.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                on_executor(move || async move {
                    let c = client::coordinator(addr, "").await.unwrap();
                    let mut seen = Vec::new();
                    loop {
                        let finished = done.load(Ordering::Acquire);
                        seen.push(read_state(&c, &lake).await);
                        if finished {
                            break;
                        }
                    }
                    seen
                })
            })
        })
        .collect();
    let first_ts = writer.join().unwrap();
    let mut checked = 0;
    let mut distinct = std::collections::BTreeSet::new();
    for r in readers {
        for (snapshot, state) in r.join().unwrap() {
            if snapshot < first_ts {
                assert!(
                    state.0.is_empty() && state.1.is_empty(),
                    "nothing before the first transaction"
                );
                continue;
            }
            let k = (snapshot - first_ts) as usize;
            assert_eq!(
                state.0.values().sum::<i64>(),
                TOTAL,
                "the total never changes (snapshot {snapshot})"
            );
            assert_eq!(state, states[k], "the model at snapshot {snapshot}");
            checked += 1;
            distinct.insert(snapshot);
        }
    }
    assert!(
        checked >= 10 && distinct.len() >= 5,
        "queries ran during replay: {checked} reads, {} snapshots",
        distinct.len()
    );
    assert!(h.status().error().is_none());
    node.shutdown();
}

#[test]
fn a_transaction_is_visible_to_the_first_query_after_hwm_passes_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"));
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let lake = dir.path().join("data/lake");
    let (tx, rx) = std::sync::mpsc::channel::<u64>();
    let (back, seen) = std::sync::mpsc::channel::<(u64, State)>();
    let reader = std::thread::spawn(move || {
        on_executor(move || async move {
            let c = client::coordinator(addr, "").await.unwrap();
            while rx.recv().is_ok() {
                back.send(read_state(&c, &lake).await).unwrap();
            }
        })
    });
    for i in 0..5i64 {
        // One row: it sits in the active write-buffer block, never flushed.
        let ts = h
            .submit(&[vec![TableOp {
                table: 0,
                op: RowOp::Insert(vec![Value::Int(i), Value::Int(i)]),
            }]])
            .unwrap();
        assert!(h.wait_visible(*ts.end(), Duration::from_secs(10)));
        tx.send(*ts.end()).unwrap();
        let (snapshot, state) = seen.recv().unwrap();
        assert!(snapshot >= *ts.end());
        assert_eq!(
            state.0.get(&i),
            Some(&i),
            "row {i} is visible as soon as HWM passed it"
        );
    }
    drop(tx);
    reader.join().unwrap();
    node.shutdown();
}

#[test]
fn a_snapshot_folded_away_is_refused_as_too_old_never_answered_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"));
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let scan_addr = node.scan_addrs()[0];
    let row = |id: i64, v: i64| vec![Value::Int(id), Value::Int(v)];
    let all: Vec<_> = (0..64)
        .map(|i| TableOp {
            table: 0,
            op: RowOp::Insert(row(i, 0)),
        })
        .collect();
    let first = h.submit(&[all]).unwrap();
    let old = *first.end();
    // Delete and update on every shard, then let GC (every 5 ms, no query running) fold.
    let changes: Vec<_> = (0..64)
        .map(|i| {
            vec![TableOp {
                table: 0,
                op: RowOp::Update {
                    before: row(i, 0),
                    after: row(i, 1),
                },
            }]
        })
        .collect();
    let last = h.submit(&changes).unwrap();
    assert!(h.wait_visible(*last.end(), Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(100));
    let answer = on_executor(move || async move {
        let _ = client::coordinator(addr, "").await.unwrap();
        let scan = client::scan_service(scan_addr, "").await.unwrap();
        let mut req = scan.write_buffer_request();
        req.get().set_table(0);
        req.get().set_snapshot(old);
        let resp = req.send().promise.await.unwrap();
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            retina_protocol::retina_capnp::buffer_result::Which::Ok(_) => "rows".to_owned(),
            retina_protocol::retina_capnp::buffer_result::Which::Error(e) => {
                client::describe(e.unwrap())
            }
        }
    });
    // No running query reads that snapshot (a running query holds LWM at its own): refused.
    assert_eq!(answer, "the lease of query 0 expired", "{old}");
    node.shutdown();
}
