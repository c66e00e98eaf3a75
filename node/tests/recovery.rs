//! Recovery at the node's API, step by step: a checkpoint taken between two groups, a stop,
//! and a restart that resumes from the checkpoint. Redone transactions get the timestamps they
//! had, rows after the checkpoint are gone until they are redone, and a query that begins
//! before HWM is back where queries saw it waits until it is.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

mod common;

use retina_client::{ClientError, Refusal};
use retina_node::catalog::Catalog;
use retina_node::coordinator::SourceMark;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_storage::{RowOp, TableOp, Value};

const DDL: &str = "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT NOT NULL);";

fn start(dir: &std::path::Path) -> Node {
    Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "t.sql").unwrap()),
        settings: Settings {
            shards: 2,
            tile_rows: 64,
            block_rows: 64,
            row_group_rows: 128,
            file_rows: 256,
            flush_interval_ms: 2,
            ..Settings::default()
        },
        listen: None,
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap()
}

/// Transaction `k`: inserts row `k`, and from the second on, updates row `k - 1` and deletes
/// row `k - 2`.
fn txn(k: i64) -> Vec<TableOp<Vec<Value>>> {
    let mut ops = vec![TableOp {
        table: 0,
        op: RowOp::Insert(vec![Value::Int(k), Value::Int(0)]),
    }];
    if k >= 1 {
        ops.push(TableOp {
            table: 0,
            op: RowOp::Update {
                before: vec![Value::Int(k - 1), Value::Int(0)],
                after: vec![Value::Int(k - 1), Value::Int(k)],
            },
        });
    }
    if k >= 2 {
        ops.push(TableOp {
            table: 0,
            op: RowOp::Delete(vec![Value::Int(k - 2), Value::Int(k - 1)]),
        });
    }
    ops
}

fn ids(node: &Node, ts: u64) -> Vec<i64> {
    let batches = node
        .handle()
        .read_table(0, retina_storage::Timestamp::new(ts).unwrap())
        .unwrap();
    let mut out: Vec<i64> = batches
        .iter()
        .flat_map(|b| {
            retina_storage::batch_rows(
                b,
                &[
                    retina_storage::ColumnType::Int64,
                    retina_storage::ColumnType::Int64,
                    retina_storage::ColumnType::Int64,
                ],
            )
        })
        .map(|r| match r[0] {
            Value::Int(i) => i,
            _ => unreachable!(),
        })
        .collect();
    out.sort();
    out
}

fn wait_checkpoint(node: &Node, id: u64) {
    let start = Instant::now();
    while node.handle().status().checkpoint_id.load(Ordering::Acquire) < id {
        assert!(start.elapsed() < Duration::from_secs(10), "checkpoint {id}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_restart_redoes_after_the_checkpoint_with_the_same_timestamps() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path());
    let h = node.handle().clone();
    let first: Vec<_> = (0..300).map(txn).collect();
    assert_eq!(h.submit(&first).unwrap(), 2..=301);
    let mark = SourceMark {
        offset: 12_345,
        line: 300,
    };
    let id = h
        .checkpoint(mark, Vec::new())
        .unwrap()
        .expect("no checkpoint on its way");
    wait_checkpoint(&node, id);
    let second: Vec<_> = (300..400).map(txn).collect();
    assert_eq!(h.submit(&second).unwrap(), 302..=401);
    assert!(h.wait_visible(401, Duration::from_secs(10)));
    assert_eq!(ids(&node, 401), vec![398, 399]);
    node.shutdown();

    // The restart resumes at the checkpoint: 300 transactions, timestamps through 301.
    let node = start(dir.path());
    let h = node.handle().clone();
    assert_eq!(h.resume(), Some(mark));
    assert_eq!(h.status().hwm().get().get(), 302);
    assert_eq!(ids(&node, 301), vec![298, 299]);
    // A query waits: a query before the stop may have seen HWM 402.
    let waiting = {
        let h = h.clone();
        std::thread::spawn(move || h.begin_query().unwrap())
    };
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        !waiting.is_finished(),
        "a query began behind what one saw before"
    );
    assert_eq!(h.submit(&second).unwrap(), 302..=401, "the same timestamps");
    let (_, snapshot) = waiting.join().unwrap();
    assert_eq!(snapshot.get(), 401);
    assert_eq!(ids(&node, 401), vec![398, 399]);
    // It goes on from there, and a later checkpoint replaces the first.
    assert_eq!(h.submit(&[txn(400)]).unwrap(), 402..=402);
    let id = h
        .checkpoint(SourceMark::default(), Vec::new())
        .unwrap()
        .unwrap();
    wait_checkpoint(&node, id);
    assert_eq!(id, 2);
    assert!(!dir.path().join("checkpoints/0000000000000001").exists());
    node.shutdown();
}

fn start_with(dir: &std::path::Path, ddl: &str, query_wait_ms: u64) -> Result<Node, String> {
    Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(ddl, "t.sql").unwrap()),
        settings: Settings {
            shards: 2,
            query_wait_ms,
            ..Settings::default()
        },
        // Loopback without a token: the contract's clients may ask too.
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .map_err(|e| e.to_string())
}

#[test]
fn a_query_that_cannot_catch_up_is_refused_within_its_wait() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(dir.path(), DDL, 200).unwrap();
    let h = node.handle().clone();
    let first: Vec<_> = (0..10).map(txn).collect();
    h.submit(&first).unwrap();
    let id = h
        .checkpoint(SourceMark::default(), b"state".to_vec())
        .unwrap()
        .unwrap();
    wait_checkpoint(&node, id);
    h.submit(&[txn(10)]).unwrap();
    assert!(h.wait_visible(12, Duration::from_secs(10)));
    // A query sees 12 before the stop.
    let (q, snapshot) = h.begin_query().unwrap();
    assert_eq!(snapshot.get(), 12);
    h.end_query(q);
    node.shutdown();

    // Nothing replays what came after the checkpoint: a query waits its 200 ms, then is
    // refused with the reason, instead of hanging.
    let node = start_with(dir.path(), DDL, 200).unwrap();
    assert_eq!(node.handle().resume_state(), b"state");
    let began = Instant::now();
    let err = node.handle().begin_query().unwrap_err().to_string();
    assert!(began.elapsed() < Duration::from_secs(5));
    assert!(
        err.contains(
            "catching up with its source: it is at snapshot 11, queries wait for snapshot 12"
        ),
        "{err}"
    );
    // Through the contract, the refusal is typed.
    let addr = node.coordinator_addr().unwrap();
    let refused = common::on_executor(move || async move {
        let c = retina_client::coordinator(addr, "").await.unwrap();
        retina_client::begin(&c).await.map(|q| q.id)
    });
    assert!(
        matches!(
            refused,
            Err(ClientError::Refused(Refusal::CatchingUp {
                snapshot: 11,
                target: 12
            }))
        ),
        "{refused:?}"
    );
    node.shutdown();
}

#[test]
fn a_data_directory_serves_one_node_with_the_schema_it_was_written_with() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(dir.path(), DDL, 1000).unwrap();
    let err = start_with(dir.path(), DDL, 1000)
        .err()
        .expect("a second node");
    assert!(err.contains("is in use by another node (pid "), "{err}");
    let h = node.handle().clone();
    h.submit(&[txn(0)]).unwrap();
    let id = h
        .checkpoint(SourceMark::default(), Vec::new())
        .unwrap()
        .unwrap();
    wait_checkpoint(&node, id);
    node.shutdown();

    // The checkpoint holds rows of `t (id BIGINT, v BIGINT)`: a changed column is refused.
    let changed = "CREATE TABLE t (id BIGINT PRIMARY KEY, v INT NOT NULL);";
    let err = start_with(dir.path(), changed, 1000)
        .err()
        .expect("refused");
    assert!(
        err.contains("was `t (id bigint not null, v bigint not null, primary key (id))`")
            && err.contains("is now `t (id bigint not null, v int not null, primary key (id))`"),
        "{err}"
    );
    let added = format!("{DDL} CREATE TABLE u (k INT PRIMARY KEY);");
    let err = start_with(dir.path(), &added, 1000).err().expect("refused");
    assert!(err.contains("was `(none)`, is now `u (k int"), "{err}");
    // The schema it was written with still starts, after the first node let go of the lock.
    start_with(dir.path(), DDL, 1000).unwrap().shutdown();
}
