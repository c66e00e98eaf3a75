//! The query path end to end, through the DataFusion connector: while a node replays transfers
//! between accounts (two tables: balances and a ledger), concurrent SQL sessions read both
//! tables at one snapshot each, and every result is exactly the naive model's state at that
//! snapshot: the total never changes, no partial transaction is seen. The node's files are
//! small, so queries read regular files listed in the plan (with bitmaps, and `_create_ts`
//! filtering where a row group straddles the snapshot), flushed blocks and in-memory blocks.
//! Also: freshness, typed errors, the lease, and the query ending with its stream.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::array::RecordBatch;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_client::Refusal;
use retina_node::catalog::Catalog;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_query::{QuerySession, Retina, refusal};
use retina_storage::{RowOp, TableOp, Value};
use retina_tests::ints;

const DDL: &str = "CREATE TABLE bank.accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
                   CREATE TABLE bank.ledger (n BIGINT PRIMARY KEY, src BIGINT NOT NULL, dst BIGINT NOT NULL, amount BIGINT NOT NULL);";
const ACCOUNTS: i64 = 40;
const TOTAL: i64 = ACCOUNTS * 1000;

type State = (BTreeMap<i64, i64>, Vec<(i64, i64, i64, i64)>);
type Txn = Vec<TableOp<Vec<Value>>>;

fn start(dir: &std::path::Path, lease_ms: u64) -> Node {
    start_with(
        dir,
        Settings {
            query_lease_ms: lease_ms,
            ..retina_tests::small_files(2, 5)
        },
    )
}

fn start_with(dir: &std::path::Path, settings: Settings) -> Node {
    Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "bank.sql").unwrap()),
        settings,
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap()
}

/// `EXPLAIN sql` in `session`, as a table.
async fn explain_plan(session: &QuerySession, sql: &str) -> String {
    let plan = session.collect(&format!("EXPLAIN {sql}")).await.unwrap();
    datafusion::arrow::util::pretty::pretty_format_batches(&plan)
        .unwrap()
        .to_string()
}

/// The write-buffer objects on the store that `session`'s snapshot reads of `table`, shard by
/// shard, as the shards answer for it.
async fn buffer_objects(
    retina: &Retina,
    session: &QuerySession,
    table: &str,
) -> Vec<Vec<retina_client::BufferPart>> {
    let conn = retina.connection();
    let plan = conn.plan(session.query_id(), table).await.unwrap();
    let mut shards = Vec::new();
    for &service in &plan.buffers {
        let mut parts = conn
            .write_buffer(service, session.info(), plan.table.id, vec![], vec![])
            .await
            .unwrap();
        parts.retain(|p| matches!(p.data, retina_client::PartData::Path(_)));
        shards.push(parts);
    }
    shards
}

/// Both tables at one session's snapshot.
async fn read_state(session: &QuerySession) -> State {
    let accounts = ints(
        &session
            .collect("SELECT id, balance FROM bank.accounts")
            .await
            .unwrap(),
    )
    .into_iter()
    .map(|r| (r[0], r[1]))
    .collect();
    let mut ledger: Vec<_> = ints(
        &session
            .collect("SELECT n, src, dst, amount FROM bank.ledger")
            .await
            .unwrap(),
    )
    .into_iter()
    .map(|r| (r[0], r[1], r[2], r[3]))
    .collect();
    ledger.sort();
    (accounts, ledger)
}

/// Ledger entries `from..to`, `per_txn` to a transaction, replayed and visible.
fn insert_ledger(h: &retina_node::node::NodeHandle, from: i64, to: i64, per_txn: usize) {
    let txns: Vec<Txn> = (from..to)
        .collect::<Vec<_>>()
        .chunks(per_txn)
        .map(|c| {
            c.iter()
                .map(|&n| TableOp {
                    table: 1,
                    op: RowOp::Insert(vec![
                        Value::Int(n),
                        Value::Int(n % 3),
                        Value::Int(n % 5),
                        Value::Int(n),
                    ]),
                })
                .collect()
        })
        .collect();
    let ts = h.submit(&txns).unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(10)));
}

/// Inserts account `id` with `balance` in a transaction of its own, and waits until a query
/// begun now sees it (submit returns when the shards have it, not when they applied it).
fn insert_visible(h: &retina_node::node::NodeHandle, id: i64, balance: i64) -> u64 {
    let ts = h
        .submit(&[vec![TableOp {
            table: 0,
            op: RowOp::Insert(row(id, balance)),
        }]])
        .unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(10)));
    *ts.end()
}

/// Waits until the node runs `n` queries.
fn wait_running(h: &retina_node::node::NodeHandle, n: u64) {
    let start = Instant::now();
    while h.status().running_queries.load(Ordering::Acquire) != n {
        assert!(start.elapsed() < Duration::from_secs(10), "{n} queries");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn row(id: i64, bal: i64) -> Vec<Value> {
    vec![Value::Int(id), Value::Int(bal)]
}

/// The transfers, and the model's state after each transaction (the first opens the accounts).
fn transfers(seed: u64, n: i64) -> (Vec<Txn>, Vec<State>) {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut balances: BTreeMap<i64, i64> = (0..ACCOUNTS).map(|i| (i, 1000)).collect();
    let mut txns: Vec<Txn> = vec![
        balances
            .iter()
            .map(|(&i, &b)| TableOp {
                table: 0,
                op: RowOp::Insert(row(i, b)),
            })
            .collect(),
    ];
    let mut states: Vec<State> = vec![(balances.clone(), Vec::new())];
    for n in 0..n {
        let (a, b) = (rng.random_range(0..ACCOUNTS), rng.random_range(0..ACCOUNTS));
        if a == b {
            continue;
        }
        let x = rng.random_range(1..200);
        let (ba, bb) = (balances[&a], balances[&b]);
        balances.insert(a, ba - x);
        balances.insert(b, bb + x);
        let mut ops = vec![
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
        ];
        let mut ledger = states.last().unwrap().1.clone();
        ledger.push((n, a, b, x));
        // Now and then an old ledger entry is deleted: deletes in regular files.
        if n % 7 == 3 {
            let (m, s, d, y) = ledger.remove(rng.random_range(0..ledger.len()));
            ops.push(TableOp {
                table: 1,
                op: RowOp::Delete(vec![
                    Value::Int(m),
                    Value::Int(s),
                    Value::Int(d),
                    Value::Int(y),
                ]),
            });
        }
        txns.push(ops);
        states.push((balances.clone(), ledger));
    }
    (txns, states)
}

#[test]
fn concurrent_sql_sessions_see_exactly_the_model_at_their_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 10_000);
    let h = node.handle().clone();
    let addr: SocketAddr = node.coordinator_addr().unwrap();
    let (txns, states) = transfers(11, 900);

    let done = Arc::new(AtomicBool::new(false));
    // Reads finished so far: the writer paces itself on them, so that queries run all through
    // replay however slowly a loaded machine runs them.
    let reads = Arc::new(AtomicU64::new(0));
    let writer = {
        let h = h.clone();
        let (done, reads) = (done.clone(), reads.clone());
        std::thread::spawn(move || {
            let mut first = None;
            for (i, chunk) in txns.chunks(3).enumerate() {
                let range = h.submit(chunk).unwrap();
                first.get_or_insert(*range.start());
                std::thread::sleep(Duration::from_micros(300));
                if i % 20 == 19 {
                    // At least one more read before the next 20 groups (or 10 s).
                    let (seen, start) = (reads.load(Ordering::Acquire), Instant::now());
                    while reads.load(Ordering::Acquire) == seen
                        && start.elapsed() < Duration::from_secs(10)
                    {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
            done.store(true, Ordering::Release);
            first.unwrap()
        })
    };
    let rt = retina_tests::runtime();
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (done, reads) = (done.clone(), reads.clone());
            rt.spawn(async move {
                let retina = Retina::connect(addr, "").unwrap();
                let mut seen = Vec::new();
                loop {
                    let finished = done.load(Ordering::Acquire);
                    let session = retina.begin().await.unwrap();
                    seen.push((session.snapshot().get(), read_state(&session).await));
                    reads.fetch_add(1, Ordering::Release);
                    if finished {
                        break;
                    }
                }
                seen
            })
        })
        .collect();
    // One statement per query (`Retina::sql`, whose begin brings the tables' plans), reading
    // both tables and one of them twice, all at the query's snapshot.
    let whole = {
        let (done, reads) = (done.clone(), reads.clone());
        rt.spawn(async move {
            use futures::TryStreamExt;
            let retina = Retina::connect(addr, "").unwrap();
            let mut seen = Vec::new();
            loop {
                let finished = done.load(Ordering::Acquire);
                let (snapshot, stream) = retina
                    .sql(
                        "SELECT (SELECT sum(balance) FROM bank.accounts) AS total, \
                                (SELECT count(*) FROM bank.accounts) AS accounts, \
                                (SELECT count(*) FROM bank.ledger) AS entries, \
                                (SELECT count(*) FROM bank.ledger a JOIN bank.ledger b \
                                 ON a.n = b.n AND a.amount = b.amount) AS pairs",
                    )
                    .await
                    .unwrap();
                let batches: Vec<RecordBatch> = stream.try_collect().await.unwrap();
                seen.push((snapshot.get(), ints(&batches)));
                reads.fetch_add(1, Ordering::Release);
                if finished {
                    break;
                }
            }
            seen
        })
    };
    let first_ts = writer.join().unwrap();
    let mut statements = 0;
    for (snapshot, got) in rt.block_on(whole).unwrap() {
        let (total, accounts, entries) = match snapshot.checked_sub(first_ts) {
            Some(k) => {
                let (a, l) = &states[k as usize];
                (TOTAL, a.len() as i64, l.len() as i64)
            }
            None => (0, 0, 0),
        };
        if snapshot >= first_ts {
            statements += 1;
        }
        let sum = got[0][0]; // NULL (no account yet) reads as 0
        assert_eq!(
            vec![sum, got[0][1], got[0][2], got[0][3]],
            vec![total, accounts, entries, entries],
            "one statement at snapshot {snapshot}"
        );
    }
    assert!(
        statements >= 3,
        "statements ran during replay: {statements}"
    );
    let mut checked = 0;
    let mut distinct = std::collections::BTreeSet::new();
    for r in readers {
        for (snapshot, state) in rt.block_on(r).unwrap() {
            if snapshot < first_ts {
                assert!(state.0.is_empty() && state.1.is_empty());
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

    // The last state, with SQL doing the work, and the plan listing regular files.
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        let session = retina.begin().await.unwrap();
        let last = states.last().unwrap();
        let sums = ints(
            &session
                .collect(
                    "SELECT sum(balance), count(*) AS accounts, (SELECT count(*) FROM bank.ledger) AS entries \
                     FROM bank.accounts",
                )
                .await
                .unwrap(),
        );
        assert_eq!(sums, vec![vec![TOTAL, ACCOUNTS, last.1.len() as i64]]);
        let big = ints(
            &session
                .collect("SELECT n FROM bank.ledger WHERE amount >= 150 ORDER BY n")
                .await
                .unwrap(),
        );
        let expected: Vec<Vec<i64>> = last
            .1
            .iter()
            .filter(|e| e.3 >= 150)
            .map(|e| vec![e.0])
            .collect();
        assert_eq!(big, expected, "a pushed-down filter keeps exactly its rows");
        let plan = retina
            .connection()
            .plan(session.query_id(), "bank.ledger")
            .await
            .unwrap();
        assert!(
            plan.files.len() >= 2,
            "the plan lists regular files: {:?}",
            plan.files.iter().map(|f| &f.path).collect::<Vec<_>>()
        );
    });
    assert!(h.status().error().is_none());
    node.shutdown();
}

#[test]
fn a_transaction_is_visible_to_the_first_sql_query_after_hwm_passes_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 10_000);
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let rt = retina_tests::runtime();
    let retina = Retina::connect(addr, "").unwrap();
    for i in 0..5i64 {
        // One row: it sits in the active write-buffer block, never flushed.
        let visible = insert_visible(&h, i, 100 + i);
        let (snapshot, rows, reversed) = rt.block_on(async {
            let session = retina.begin().await.unwrap();
            let rows = ints(
                &session
                    .collect(&format!("SELECT balance FROM bank.accounts WHERE id = {i}"))
                    .await
                    .unwrap(),
            );
            // The shard projects memory parts to the columns asked, in their order.
            let reversed = ints(
                &session
                    .collect("SELECT balance, id FROM bank.accounts ORDER BY id")
                    .await
                    .unwrap(),
            );
            (session.snapshot().get(), rows, reversed)
        });
        assert!(snapshot >= visible);
        assert_eq!(
            rows,
            vec![vec![100 + i]],
            "row {i} is visible once HWM passed it"
        );
        let expected: Vec<Vec<i64>> = (0..=i).map(|j| vec![100 + j, j]).collect();
        assert_eq!(reversed, expected);
    }
    node.shutdown();
}

#[test]
fn bad_statements_and_unknown_tables_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 10_000);
    let addr = node.coordinator_addr().unwrap();
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        let session = retina.begin().await.unwrap();
        // In a session, and as one-statement queries (whose begin asks for the tables' plans).
        for (sql, names) in [("SELEC 1", "SELEC"), ("SELECT * FROM bank.nope", "nope")] {
            let e = session.sql(sql).await.err().expect("an error");
            assert!(e.to_string().contains(names), "{e}");
            let e = retina.sql(sql).await.err().expect("an error");
            assert!(e.to_string().contains(names), "{e}");
        }
        // Through the contract, an unknown table is a typed refusal.
        let e = retina
            .connection()
            .plan(session.query_id(), "bank.nope")
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                retina_client::ClientError::Refused(Refusal::UnknownTable(ref t)) if t == "bank.nope"
            ),
            "{e}"
        );
    });
    let wrong = "127.0.0.1:1".parse().unwrap();
    let e = Retina::connect(wrong, "")
        .err()
        .expect("nothing listens there");
    assert!(e.to_string().contains("127.0.0.1:1"), "{e}");
    node.shutdown();
}

#[test]
fn a_query_ends_with_its_stream_and_lives_while_renewed() {
    let dir = tempfile::tempdir().unwrap();
    // A short lease: the connection renews it at a third of its length.
    let node = start(&dir.path().join("data"), 300);
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let rt = retina_tests::runtime();
    insert_visible(&h, 1, 5);
    let wait_running = |n: u64| wait_running(&h, n);
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        let (_, stream) = retina
            .sql("SELECT balance FROM bank.accounts")
            .await
            .unwrap();
        wait_running(1);
        // Held well past its lease: renewed, so still running and still readable.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        wait_running(1);
        use futures::TryStreamExt;
        let batches: Vec<RecordBatch> = stream.try_collect().await.unwrap();
        assert_eq!(ints(&batches), vec![vec![5]]);
        wait_running(0);

        // A query the node does not hold (never begun, or expired) is refused, typed.
        let q = retina.connection().renew(u64::MAX).await.unwrap_err();
        assert!(
            matches!(
                q,
                retina_client::ClientError::Refused(Refusal::LeaseExpired(_))
            ),
            "{q}"
        );
    });
    node.shutdown();
}

#[test]
fn refusals_stay_typed_through_datafusion() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 200);
    let addr = node.coordinator_addr().unwrap();
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        let session = retina.begin().await.unwrap();
        // The node forgets the query: the next scan is refused, and says why.
        retina.connection().end(session.query_id()).await.unwrap();
        let e = session
            .collect("SELECT * FROM bank.accounts")
            .await
            .unwrap_err();
        assert_eq!(
            refusal(&e),
            Some(&Refusal::LeaseExpired(session.query_id())),
            "{e}"
        );
    });
    node.shutdown();
}

#[test]
fn a_one_statement_query_begun_while_its_statement_is_planned_holds_and_ends_as_before() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 10_000);
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let visible = insert_visible(&h, 1, 5);
    let running = || h.status().running_queries.load(Ordering::Acquire);
    let wait_running = |n: u64| wait_running(&h, n);
    let rt = retina_tests::runtime();
    rt.block_on(async {
        use futures::TryStreamExt;
        let retina = Retina::connect(addr, "").unwrap();
        // The first query lists the node's tables; from the second on, a one-statement query
        // begins while DataFusion plans its statement.
        let (_, first) = retina.sql("SELECT 1").await.unwrap();
        drop(first);
        wait_running(0);
        let (snapshot, stream) = retina
            .sql("SELECT balance FROM bank.accounts")
            .await
            .unwrap();
        assert!(snapshot.get() >= visible);
        assert_eq!(running(), 1, "held while its stream lives");
        let batches: Vec<RecordBatch> = stream.try_collect().await.unwrap();
        assert_eq!(ints(&batches), vec![vec![5]]);
        wait_running(0);

        // A statement that plans no scan still has a snapshot and holds its query.
        let (snapshot, stream) = retina
            .sql("SELECT balance FROM bank.accounts WHERE false")
            .await
            .unwrap();
        assert!(snapshot.get() >= visible);
        assert_eq!(running(), 1);
        assert!(ints(&stream.try_collect::<Vec<_>>().await.unwrap()).is_empty());
        wait_running(0);

        // A statement DataFusion refuses after the begin went out: the error names it, and the
        // query begun for it ends.
        let e = retina
            .sql("SELECT nope FROM bank.accounts")
            .await
            .err()
            .expect("no such column");
        assert!(e.to_string().contains("nope"), "{e}");
        wait_running(0);

        // A begin the node refuses is the node's typed refusal, as it was before planning.
        let mut held = Vec::new();
        let refused = loop {
            match retina.sql("SELECT balance FROM bank.accounts").await {
                Ok((_, s)) => held.push(s),
                Err(e) => break e,
            }
            assert!(held.len() <= 256, "a connection runs at most 256 queries");
        };
        assert_eq!(held.len(), 256);
        assert!(
            matches!(refusal(&refused), Some(Refusal::TooManyQueries(256))),
            "{refused}"
        );
        drop(held);
        wait_running(0);
    });
    node.shutdown();
}

#[test]
fn a_query_never_sees_rows_created_after_its_snapshot_in_files_combined_later() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 10_000);
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let insert = |from: i64, to: i64| insert_ledger(&h, from, to, 10);
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        insert(0, 100);
        let old = retina.begin().await.unwrap();
        // The files being filled at the old snapshot fill up, flush and combine: later plans
        // list them, with rows on both sides of the old snapshot.
        insert(100, 1200);
        let s = old.snapshot().get();
        let start = Instant::now();
        loop {
            let plan = retina
                .connection()
                .plan(old.query_id(), "bank.ledger")
                .await
                .unwrap();
            let straddling = plan.files.iter().any(|f| {
                f.row_groups
                    .iter()
                    .any(|g| g.min_create_ts <= s && g.max_create_ts > s)
            });
            if straddling {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no file combined"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let rows = ints(
            &old.collect("SELECT n FROM bank.ledger ORDER BY n")
                .await
                .unwrap(),
        );
        assert_eq!(rows, (0..100).map(|n| vec![n]).collect::<Vec<_>>());
        let now = retina.begin().await.unwrap();
        let count = ints(
            &now.collect("SELECT count(*) FROM bank.ledger")
                .await
                .unwrap(),
        );
        assert_eq!(count, vec![vec![1200]]);
    });
    node.shutdown();
}

#[test]
fn sessions_of_one_connection_each_keep_their_snapshot_whichever_began_last() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 10_000);
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let insert = |from: i64, to: i64| insert_ledger(&h, from, to, 1);
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        async fn count(s: &QuerySession) -> Vec<Vec<i64>> {
            ints(&s.collect("SELECT count(*) FROM bank.ledger").await.unwrap())
        }
        insert(0, 10);
        let first = retina.begin().await.unwrap();
        insert(10, 30);
        // One statement in a query of its own between the sessions' statements, on a clone.
        let (_, stream) = retina
            .clone()
            .sql("SELECT n FROM bank.ledger")
            .await
            .unwrap();
        let rows: usize = futures::TryStreamExt::try_collect::<Vec<RecordBatch>>(stream)
            .await
            .unwrap()
            .iter()
            .map(RecordBatch::num_rows)
            .sum();
        assert_eq!(rows, 30);
        let second = retina.begin().await.unwrap();
        insert(30, 60);
        assert_eq!(count(&first).await, vec![vec![10]]);
        assert_eq!(count(&second).await, vec![vec![30]]);
        assert_eq!(count(&retina.begin().await.unwrap()).await, vec![vec![60]]);
        assert_eq!(count(&first).await, vec![vec![10]]);
    });
    node.shutdown();
}

#[test]
fn limit_n_returns_n_rows_where_row_groups_straddle_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 10_000);
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let insert = |from: i64, to: i64| insert_ledger(&h, from, to, 1);
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        insert(0, 100);
        let old = retina.begin().await.unwrap();
        insert(100, 1200);
        // Wait until every shard's first file is combined: its row groups straddle the old
        // snapshot (old rows first, newer ones after them).
        let s = old.snapshot().get();
        let start = Instant::now();
        loop {
            let plan = retina
                .connection()
                .plan(old.query_id(), "bank.ledger")
                .await
                .unwrap();
            let owners: std::collections::BTreeSet<_> = plan
                .files
                .iter()
                .filter(|f| {
                    f.row_groups
                        .iter()
                        .any(|g| g.min_create_ts <= s && g.max_create_ts > s)
                })
                .map(|f| f.owner)
                .collect();
            if owners.len() == 2 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no straddling file on every shard"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for n in [100, 99, 60, 1] {
            let rows = ints(
                &old.collect(&format!("SELECT n FROM bank.ledger LIMIT {n}"))
                    .await
                    .unwrap(),
            );
            assert_eq!(rows.len(), n, "LIMIT {n}");
            assert!(rows.iter().all(|r| r[0] < 100), "only rows at the snapshot");
        }
    });
    node.shutdown();
}

#[test]
fn flushed_blocks_are_read_at_the_snapshot_with_or_without_create_ts() {
    // Small blocks and large files: the rows stay in the write buffer, flushed as blocks and
    // segments, and are never combined into a file.
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(
        &dir.path().join("data"),
        Settings {
            file_rows: 1 << 16,
            query_lease_ms: 10_000,
            ..retina_tests::small_files(2, 5)
        },
    );
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    let image = |n: i64| {
        vec![
            Value::Int(n),
            Value::Int(n % 3),
            Value::Int(1),
            Value::Int(n),
        ]
    };
    let submit = |ops: Vec<RowOp<Vec<Value>>>| {
        let txns: Vec<Txn> = ops
            .chunks(10)
            .map(|c| {
                c.iter()
                    .map(|op| TableOp {
                        table: 1,
                        op: op.clone(),
                    })
                    .collect()
            })
            .collect();
        let ts = h.submit(&txns).unwrap();
        assert!(h.wait_visible(*ts.end(), Duration::from_secs(10)));
    };
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        submit((0..300).map(|n| RowOp::Insert(image(n))).collect());
        // Before the snapshot: every seventh row deleted.
        let deleted_before = |n: i64| n < 300 && n % 7 == 0;
        submit(
            (0..300)
                .filter(|&n| deleted_before(n))
                .map(|n| RowOp::Delete(image(n)))
                .collect(),
        );
        let old = retina.begin().await.unwrap();
        let s = old.snapshot().get();
        // After it: every fifth row left deleted, and 300 rows more.
        let deleted_after = |n: i64| n < 300 && !deleted_before(n) && n % 5 == 0;
        submit(
            (0..300)
                .filter(|&n| deleted_after(n))
                .map(|n| RowOp::Delete(image(n)))
                .collect(),
        );
        submit((300..600).map(|n| RowOp::Insert(image(n))).collect());
        // Wait until the old query reads, from the store, objects wholly before its snapshot
        // with rows deleted before it, and objects with rows created after it.
        let start = Instant::now();
        loop {
            let plan = retina
                .connection()
                .plan(old.query_id(), "bank.ledger")
                .await
                .unwrap();
            assert!(plan.files.is_empty(), "no file is combined");
            let objects: Vec<_> = buffer_objects(&retina, &old, "bank.ledger").await.concat();
            for o in &objects {
                assert!(
                    o.bytes.is_some_and(|b| b > 0),
                    "the node knows its objects' sizes"
                );
                assert!(
                    o.max_create_ts.is_some(),
                    "and their rows' newest creation time"
                );
            }
            let settled_with_deletes = objects
                .iter()
                .any(|o| o.max_create_ts.unwrap() <= s && o.deleted.iter().any(|&w| w != 0));
            let recent = objects.iter().any(|o| o.max_create_ts.unwrap() > s);
            if settled_with_deletes && recent {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no such objects on the store"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let rows = ints(
            &old.collect("SELECT n, dst FROM bank.ledger ORDER BY n")
                .await
                .unwrap(),
        );
        let at_old: Vec<i64> = (0..300).filter(|&n| !deleted_before(n)).collect();
        assert_eq!(rows, at_old.iter().map(|&n| vec![n, 1]).collect::<Vec<_>>());
        let count = ints(
            &old.collect("SELECT count(*) FROM bank.ledger")
                .await
                .unwrap(),
        );
        assert_eq!(count, vec![vec![at_old.len() as i64]]);
        let now = retina.begin().await.unwrap();
        let rows = ints(
            &now.collect("SELECT n FROM bank.ledger ORDER BY n")
                .await
                .unwrap(),
        );
        let expected: Vec<Vec<i64>> = (0..600)
            .filter(|&n| !deleted_before(n) && !deleted_after(n))
            .map(|n| vec![n])
            .collect();
        assert_eq!(rows, expected);
        // The objects' footers were kept for the connection's later queries (the node told
        // each object's size and newest creation time), and they answer the same.
        let cache = now
            .context()
            .runtime_env()
            .cache_manager
            .get_file_metadata_cache();
        let footers = cache
            .list_entries()
            .into_keys()
            .filter(|p| p.as_ref().contains("/buffer/"))
            .count();
        assert!(footers > 0, "buffer objects' footers are cached");
        let again = ints(
            &now.collect("SELECT n FROM bank.ledger ORDER BY n")
                .await
                .unwrap(),
        );
        assert_eq!(again, expected);
        // Every object is wholly before this snapshot and holds deleted rows: each is read
        // whole with those rows masked out as it is decoded, no row tagged with its number.
        let explain = explain_plan(&now, "SELECT n FROM bank.ledger").await;
        assert!(
            explain.contains("MaskedScanExec") && !explain.contains("LiveRowsExec"),
            "{explain}"
        );
        // A filter is taken into that scan, which keeps the live rows that pass it in one
        // copy; one that fails on a deleted row (7 is deleted: a division by zero) runs on
        // the live rows alone, as over the snapshot.
        let live_now = |n: &i64| !deleted_before(*n) && !deleted_after(*n);
        for (filter, passes) in [
            ("n % 3 = 1", (|n: i64| n % 3 == 1) as fn(i64) -> bool),
            ("100 / (n - 7) > 0", |n: i64| (8..=107).contains(&n)),
        ] {
            let sql = format!("SELECT n FROM bank.ledger WHERE {filter} ORDER BY n");
            let rows = ints(&now.collect(&sql).await.unwrap());
            let expected: Vec<Vec<i64>> = (0..600)
                .filter(|n| live_now(n) && passes(*n))
                .map(|n| vec![n])
                .collect();
            assert_eq!(rows, expected, "{sql}");
            let explain = explain_plan(&now, &sql).await;
            // (The rows still in memory keep a filter of their own.)
            let lines: Vec<&str> = explain.lines().collect();
            assert!(
                lines
                    .iter()
                    .any(|l| l.contains("MaskedScanExec") && l.contains("filter=")),
                "{explain}"
            );
            assert!(
                lines
                    .windows(2)
                    .all(|w| !(w[0].contains("FilterExec") && w[1].contains("MaskedScanExec"))),
                "{explain}"
            );
        }
        // The old snapshot's scans (the objects read whole beside those with rows created
        // after it, tagged) give the same rows under a filter, which both take.
        let sql = "SELECT n FROM bank.ledger WHERE n % 3 = 1 ORDER BY n";
        let rows = ints(&old.collect(sql).await.unwrap());
        let explain = explain_plan(&old, sql).await;
        for exec in ["MaskedScanExec", "LiveRowsExec"] {
            assert!(
                explain
                    .lines()
                    .any(|l| l.contains(exec) && l.contains("filter=")),
                "{explain}"
            );
        }
        let filtered: Vec<Vec<i64>> = at_old
            .iter()
            .filter(|&&n| n % 3 == 1)
            .map(|&n| vec![n])
            .collect();
        assert_eq!(rows, filtered);
        // A statement whose join matches on a column it does not name: the scans read a
        // column the begin did not ask the write buffers for, and ask again.
        use futures::TryStreamExt;
        let (_, stream) = retina
            .sql("SELECT count(*) FROM bank.ledger a JOIN bank.ledger b USING (amount)")
            .await
            .unwrap();
        let batches: Vec<RecordBatch> = stream.try_collect().await.unwrap();
        assert_eq!(ints(&batches), vec![vec![expected.len() as i64]]);
        // Every row but the last ten deleted: an object whose every row is deleted at the
        // snapshot is not opened at all.
        submit(
            (0..590)
                .filter(|&n| !deleted_before(n) && !deleted_after(n))
                .map(|n| RowOp::Delete(image(n)))
                .collect(),
        );
        let last = retina.begin().await.unwrap();
        let objects = buffer_objects(&retina, &last, "bank.ledger").await.concat();
        let (dead, kept): (Vec<_>, Vec<_>) = objects.iter().partition(|o| {
            (0..o.rows).all(|i| {
                o.deleted
                    .get((i / 64) as usize)
                    .is_some_and(|w| w >> (i % 64) & 1 == 1)
            })
        });
        assert!(!dead.is_empty(), "some object holds deleted rows only");
        let rows = ints(
            &last
                .collect("SELECT n FROM bank.ledger ORDER BY n")
                .await
                .unwrap(),
        );
        assert_eq!(rows, (590..600).map(|n| vec![n]).collect::<Vec<_>>());
        let explain = explain_plan(&last, "SELECT n FROM bank.ledger").await;
        // (The objects left are read by the masked scan where any of them has deleted rows.)
        if kept.iter().any(|o| o.deleted.iter().any(|&w| w != 0)) {
            let files = format!("MaskedScanExec: files={},", kept.len());
            assert!(explain.contains(&files), "{files} {explain}");
        } else {
            assert!(!explain.contains("MaskedScanExec"), "{explain}");
        }
    });
    node.shutdown();
}

/// Two shards, blocks of 64 rows and segments (and row groups) of 8 blocks: 2600 ledger rows
/// leave each shard about two segments and three blocks, which go quiet into one tail.
fn tail_settings() -> Settings {
    Settings {
        row_group_rows: 512,
        file_rows: 1 << 16,
        ..retina_tests::small_files(2, 5)
    }
}

/// Waits until each of the two shards reads `table`'s flushed rows from one object of more
/// than `rows` rows (its tail).
async fn wait_one_object_per_shard(retina: &Retina, table: &str, rows: u64) {
    let start = Instant::now();
    loop {
        let q = retina.begin().await.unwrap();
        let objects: Vec<Vec<u64>> = buffer_objects(retina, &q, table)
            .await
            .iter()
            .map(|shard| shard.iter().map(|p| p.rows).collect())
            .collect();
        if objects.len() == 2 && objects.iter().all(|o| o.len() == 1 && o[0] > rows) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no tail segment on every shard: {objects:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn objects_balanced_over_the_partitions_are_read_as_shared_out_and_pruned_by_the_filters_once() {
    // No deletes: each shard's rows become one tail of about the same size, which two
    // partitions read one each, and four in ranges.
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(&dir.path().join("data"), tail_settings());
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    insert_ledger(&h, 0, 2600, 10);
    let rt = retina_tests::runtime();
    rt.block_on(async {
        // DataFusion would split files of any size into byte ranges.
        let retina = |partitions| {
            let mut config =
                datafusion::prelude::SessionConfig::new().with_target_partitions(partitions);
            config.options_mut().optimizer.repartition_file_min_size = 0;
            Retina::connect(addr, "").unwrap().with_config(config)
        };
        let sql = "SELECT n FROM bank.ledger WHERE n < 300 ORDER BY n";
        // (partitions, who makes them)
        for (partitions, by) in [(2, "connector"), (4, "datafusion")] {
            let retina = retina(partitions);
            wait_one_object_per_shard(&retina, "bank.ledger", 1024).await;
            let session = retina.begin().await.unwrap();
            let rows = ints(&session.collect(sql).await.unwrap());
            assert_eq!(rows, (0..300).map(|n| vec![n]).collect::<Vec<_>>());
            let explain = explain_plan(&session, sql).await;
            let line = |name: &str| {
                explain
                    .lines()
                    .find(|l| l.contains(name))
                    .unwrap_or_else(|| panic!("no {name}: {explain}"))
                    .to_owned()
            };
            let own = line("OwnPartitionsExec");
            assert!(own.contains(&format!("partitions by {by},")), "{own}");
            // Two objects in two partitions stay whole; in four, DataFusion splits them.
            let scan = line("DataSourceExec");
            assert!(scan.contains(&format!("{partitions} groups")), "{scan}");
            let ranges = scan.matches(".parquet").count();
            assert!(ranges == 2 || by == "datafusion" && ranges >= 4, "{scan}");
            // The filter prunes the scan once: it is not pushed into it a second time.
            assert!(scan.contains(" predicate=n@0 < 300, "), "{scan}");
            assert!(scan.contains("pruning_predicate="), "{scan}");
        }
        // A join's dynamic filter still goes into the scan it probes.
        let session = retina(2).begin().await.unwrap();
        let join = "SELECT a.n FROM bank.ledger a \
                    JOIN (SELECT n FROM bank.ledger WHERE n < 5) b ON a.n = b.n";
        let plan = session
            .collect(&format!("EXPLAIN ANALYZE {join}"))
            .await
            .unwrap();
        let plan = datafusion::arrow::util::pretty::pretty_format_batches(&plan)
            .unwrap()
            .to_string();
        assert!(
            plan.lines()
                .any(|l| l.contains("OwnPartitionsExec") && l.contains("DynamicFilter [")),
            "{plan}"
        );
    });
    node.shutdown();
}

#[test]
fn a_table_gone_quiet_is_read_from_one_tail_object_per_shard_at_every_snapshot() {
    // Each shard has about two segments and three blocks flushed, which a tail takes in as one
    // object of three row groups, pruned by their statistics and masked by deletes like a
    // combined file's.
    let dir = tempfile::tempdir().unwrap();
    let node = start_with(
        &dir.path().join("data"),
        Settings {
            query_lease_ms: 10_000,
            ..tail_settings()
        },
    );
    let h = node.handle().clone();
    let addr = node.coordinator_addr().unwrap();
    const ROWS: i64 = 2600;
    insert_ledger(&h, 0, ROWS, 10);
    let ledger = |n: i64| {
        vec![
            Value::Int(n),
            Value::Int(n % 3),
            Value::Int(n % 5),
            Value::Int(n),
        ]
    };
    let deletes: Vec<Txn> = vec![
        (0..ROWS)
            .filter(|n| n % 7 == 0)
            .map(|n| TableOp {
                table: 1,
                op: RowOp::Delete(ledger(n)),
            })
            .collect(),
    ];
    let ts = h.submit(&deletes).unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(10)));
    let live = |n: &i64| n % 7 != 0;
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let retina = Retina::connect(addr, "").unwrap();
        // A query begun before the tails are written reads the same rows after.
        let early = retina.begin().await.unwrap();
        // Each shard's flushed blocks as one object of more than two row groups.
        wait_one_object_per_shard(&retina, "bank.ledger", 1024).await;
        for session in [&early, &retina.begin().await.unwrap()] {
            // Every row, and ranges that the first or the last row groups alone hold.
            for (filter, range) in [
                ("true", 0..ROWS),
                ("n < 300", 0..300),
                ("n >= 2100 AND n < 2300", 2100..2300),
            ] {
                let rows = ints(
                    &session
                        .collect(&format!(
                            "SELECT n FROM bank.ledger WHERE {filter} ORDER BY n"
                        ))
                        .await
                        .unwrap(),
                );
                let expected: Vec<Vec<i64>> = range.filter(live).map(|n| vec![n]).collect();
                assert_eq!(rows, expected, "{filter}");
            }
        }
    });
    node.shutdown();
}
