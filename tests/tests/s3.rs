//! The lake on S3, against a real S3 server (moto's, started per test on loopback; skipped
//! with a note where `moto_server` is not installed, except in CI): replay into the bucket
//! and read it back through the DataFusion connector; a node on a new machine (an empty data
//! directory) recovering from the newest complete checkpoint in the lake after the first one
//! "crashed"; storage GC deleting only objects no query reads; failed PUTs that replay
//! retries, losing nothing; multipart uploads; and a missing bucket refused at start.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use retina_node::catalog::Catalog;
use retina_node::debezium::TxnMode;
use retina_node::lake::LakeSpec;
use retina_node::node::{Node, NodeHandle, NodeOptions};
use retina_node::settings::Settings;
use retina_node::sink::{OnError, SinkOptions, SourceSpec, run_sink};
use retina_query::{QuerySession, Retina};
use retina_storage::fault::FaultyStore;
use retina_storage::{RowOp, TableOp, Value};
use retina_tests::bank::{self, visible};
use retina_tests::cdc::{Model, V};
use retina_tests::ints;
use retina_tests::s3::{Moto, keys};

fn start(data: &Path, lake: LakeSpec, ddl: &str, settings: Settings) -> Node {
    Node::start(NodeOptions {
        data_dir: data.to_path_buf(),
        lake,
        catalog: Arc::new(Catalog::from_ddl(ddl, "s3.sql").unwrap()),
        settings,
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap()
}

fn bank_settings() -> Settings {
    Settings {
        shards: 2,
        ..retina_tests::small_files(5, 10)
    }
}

fn sink_options(stream: &Path, checkpoint_every: Option<Duration>) -> SinkOptions {
    SinkOptions {
        source: SourceSpec::File(stream.to_path_buf()),
        follow: false,
        mode: TxnMode::Metadata,
        on_error: OnError::Stop,
        dead_letter: stream.with_extension("dead"),
        max_group_txns: 16,
        group_commit_interval: Duration::from_millis(2),
        checkpoint_interval: checkpoint_every,
        max_txn_bytes: Settings::default().max_txn_bytes,
        decode_lanes: 2,
    }
}

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A connector to `node` reading bucket `bucket` of `moto`.
fn connector(node: &Node, moto: &Moto, bucket: &str) -> Retina {
    let url = url::Url::parse(&format!("s3://{bucket}")).unwrap();
    Retina::connect(node.coordinator_addr().unwrap(), "")
        .unwrap()
        .with_object_store(&url, moto.bucket_store(bucket))
}

/// The bank tables through the DataFusion connector: accounts as (id, balance in cents),
/// transfers as (id, src, dst, amount in cents).
async fn bank_through_sql(session: &QuerySession) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let accounts = session
        .collect(
            "SELECT CAST(id AS BIGINT), CAST(balance * 100 AS BIGINT) FROM bank.accounts \
             ORDER BY 1",
        )
        .await
        .unwrap();
    let transfers = session
        .collect(
            "SELECT id, CAST(src AS BIGINT), CAST(dst AS BIGINT), CAST(amount * 100 AS BIGINT) \
             FROM bank.transfers ORDER BY 1",
        )
        .await
        .unwrap();
    (ints(&accounts), ints(&transfers))
}

fn model_through_sql(model: &Model) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let int = |v: &V| match v {
        V::I(i) => *i,
        other => panic!("not an integer: {other:?}"),
    };
    let pick = |t: usize, cols: &[usize]| -> Vec<Vec<i64>> {
        model.tables[t]
            .values()
            .map(|r| cols.iter().map(|&c| int(&r[c])).collect())
            .collect()
    };
    (pick(0, &[0, 2]), pick(1, &[0, 1, 2, 3]))
}

/// The node's rows equal the model's, read with the node's API (the lake's objects read on
/// the I/O thread's runtime) and through the connector (DataFusion reading `s3://`).
fn check_bank(node: &Node, moto: &Moto, bucket: &str, model: &Model) {
    assert_eq!(visible(node), model.tables, "the node's rows");
    let retina = connector(node, moto, bucket);
    let through_sql = retina_tests::runtime().block_on(async {
        let session = retina.begin().await.unwrap();
        bank_through_sql(&session).await
    });
    assert_eq!(
        through_sql,
        model_through_sql(model),
        "the connector's rows"
    );
}

/// Regular files (not write-buffer blocks) of `table` in the lake at `prefix`.
fn regular_files(store: &Arc<dyn ObjectStore>, prefix: &str, table: &str) -> BTreeSet<String> {
    let dir = format!("{prefix}/tables/{table}/");
    keys(store, &format!("{prefix}/tables/{table}"))
        .into_iter()
        .filter_map(|k| k.strip_prefix(&dir).map(str::to_owned))
        .filter(|k| !k.contains('/'))
        .collect()
}

/// Checkpoint folders in the lake at `prefix`, and whether each has its record.
fn lake_checkpoints(store: &Arc<dyn ObjectStore>, prefix: &str) -> BTreeMap<String, bool> {
    let mut out = BTreeMap::new();
    for k in keys(store, &format!("{prefix}/checkpoints")) {
        let rest = k.strip_prefix(&format!("{prefix}/checkpoints/")).unwrap();
        let (id, name) = rest.split_once('/').unwrap();
        *out.entry(id.to_owned()).or_insert(false) |= name == "record";
    }
    out
}

#[test]
fn replay_into_s3_reads_back_through_the_connector() {
    let Some(moto) = Moto::start() else { return };
    moto.create_bucket("lake-a");
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("bank.json");
    let model = bank::generate(11, 1200, &stream);
    let data = dir.path().join("data");
    let node = start(
        &data,
        moto.lake("lake-a", "retina/a"),
        bank::DDL,
        bank_settings(),
    );
    let report = run_sink(
        node.handle(),
        &sink_options(&stream, Some(Duration::from_millis(50))),
    );
    assert_eq!(report.stopped_by, None);
    assert!(
        node.handle()
            .wait_visible(report.last_ts.unwrap(), Duration::from_secs(30))
    );
    let store = moto.bucket_store("lake-a");
    wait_for("combined files in the bucket", 60, || {
        !regular_files(&store, "retina/a", "bank.accounts").is_empty()
    });
    check_bank(&node, &moto, "lake-a", &model);
    // The sink's last checkpoint is in the bucket, whole, and the only one there.
    let checkpoints = lake_checkpoints(&store, "retina/a");
    assert_eq!(checkpoints.len(), 1, "{checkpoints:?}");
    assert!(checkpoints.values().all(|&complete| complete));
    assert!(!data.join("lake").exists(), "nothing went to a local lake");
    node.shutdown();
}

/// A bank stream in a temporary folder and a node replaying into a new bucket of `moto`
/// through a [`FaultyStore`] (whose writes a test can make fail).
struct FaultyBank {
    dir: tempfile::TempDir,
    stream: std::path::PathBuf,
    model: Model,
    faulty: Arc<FaultyStore>,
    node: Node,
}

/// Creates `bucket`, writes the stream of `(seed, transactions)` and starts a node whose data
/// directory is `data` in the folder and whose lake is `s3://bucket/prefix/`, faulty.
fn faulty_bank(
    moto: &Moto,
    bucket: &str,
    prefix: &str,
    (seed, transactions): (u64, usize),
    data: &str,
) -> FaultyBank {
    moto.create_bucket(bucket);
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("bank.json");
    let model = bank::generate(seed, transactions, &stream);
    let s3 = retina_node::lake::s3_lake_store(bucket, prefix, &moto.options()).unwrap();
    let faulty = Arc::new(FaultyStore::new(s3));
    let node = start(
        &dir.path().join(data),
        LakeSpec::Store {
            store: faulty.clone(),
            url: format!("s3://{bucket}/{prefix}/"),
        },
        bank::DDL,
        bank_settings(),
    );
    FaultyBank {
        dir,
        stream,
        model,
        faulty,
        node,
    }
}

#[test]
fn a_node_on_a_new_machine_recovers_from_the_lake_after_a_crash() {
    let Some(moto) = Moto::start() else { return };
    let FaultyBank {
        dir,
        stream,
        model,
        faulty,
        node,
    } = faulty_bank(&moto, "lake-b", "b", (12, 3000), "machine-1");
    let sink = retina_node::sink::spawn(
        node.handle().clone(),
        sink_options(&stream, Some(Duration::from_millis(20))),
    )
    .unwrap();
    let status = node.handle().status().clone();
    wait_for("two checkpoints", 60, || {
        status.checkpoint_id.load(Ordering::Acquire) >= 2
    });
    // The crash, as the lake sees it: from here on nothing reaches the bucket (flushes,
    // combinations, images, records), while the node goes on a little.
    faulty.fail_writes.store(true, Ordering::Relaxed);
    let frozen_at = status.hwm().get().get();
    wait_for("replay past the crash", 60, || {
        status.hwm().get().get() > frozen_at + 100 || sink.is_finished()
    });
    sink.stop();
    let _ = sink.join();
    node.shutdown();
    assert!(faulty.injected.load(Ordering::Relaxed) > 0);
    let store = moto.bucket_store("lake-b");
    let complete: Vec<String> = lake_checkpoints(&store, "b")
        .into_iter()
        .filter(|(_, c)| *c)
        .map(|(id, _)| id)
        .collect();
    assert!(!complete.is_empty(), "a complete checkpoint in the lake");

    // A new machine: an empty data directory, the same lake and source.
    let data = dir.path().join("machine-2");
    let node = start(&data, moto.lake("lake-b", "b"), bank::DDL, bank_settings());
    let resumed = node
        .handle()
        .resume()
        .expect("resumed from the lake's checkpoint");
    assert!(resumed.offset > 0);
    assert!(data.join("coordinator.state").exists());
    // Only the checkpoint it recovered from is left in the lake.
    let left = lake_checkpoints(&store, "b");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left.keys().next(), complete.last());
    let report = run_sink(
        node.handle(),
        &sink_options(&stream, Some(Duration::from_millis(50))),
    );
    assert_eq!(report.stopped_by, None);
    assert!(
        node.handle()
            .wait_visible(report.last_ts.unwrap(), Duration::from_secs(30))
    );
    // Nothing lost, nothing applied twice.
    check_bank(&node, &moto, "lake-b", &model);
    node.shutdown();
}

#[test]
fn failed_puts_are_retried_and_lose_nothing() {
    let Some(moto) = Moto::start() else { return };
    let FaultyBank {
        dir,
        stream,
        model,
        faulty,
        node,
    } = faulty_bank(&moto, "lake-d", "d", (13, 2000), "data");
    let sink = retina_node::sink::spawn(
        node.handle().clone(),
        sink_options(&stream, Some(Duration::from_millis(20))),
    )
    .unwrap();
    // Two outages while replay runs: flushes, combinations and checkpoint uploads fail.
    for _ in 0..2 {
        std::thread::sleep(Duration::from_millis(150));
        faulty.fail_writes.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(300));
        faulty.fail_writes.store(false, Ordering::Relaxed);
    }
    let report = sink.join().unwrap();
    assert_eq!(report.stopped_by, None, "replay retries failed writes");
    assert!(
        faulty.injected.load(Ordering::Relaxed) > 0,
        "faults were injected"
    );
    assert!(
        node.handle()
            .wait_visible(report.last_ts.unwrap(), Duration::from_secs(30))
    );
    check_bank(&node, &moto, "lake-d", &model);
    let checkpoint = node.handle().status().checkpoint_id.load(Ordering::Acquire);
    node.shutdown();
    // Its data directory is tied to that lake.
    let err = Node::start(NodeOptions {
        data_dir: dir.path().join("data"),
        lake: LakeSpec::Local,
        catalog: Arc::new(Catalog::from_ddl(bank::DDL, "s3.sql").unwrap()),
        settings: bank_settings(),
        listen: None,
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .err()
    .expect("another lake is refused")
    .to_string();
    assert!(
        err.contains("was written with the lake s3://lake-d/d/"),
        "{err}"
    );

    // And the lake alone holds it all: a new machine recovers the final state.
    let node = start(
        &dir.path().join("data-2"),
        moto.lake("lake-d", "d"),
        bank::DDL,
        bank_settings(),
    );
    assert_eq!(
        node.handle().status().checkpoint_id.load(Ordering::Acquire),
        checkpoint
    );
    check_bank(&node, &moto, "lake-d", &model);
    node.shutdown();
}

/// The lake refuses every write while a short stream replays, and for a while after the
/// source ended: the last checkpoint fails, and is put again until one holding everything is
/// complete, so the lake alone holds the final state once the sink's run has returned.
#[test]
fn a_last_checkpoint_that_fails_is_put_again() {
    let Some(moto) = Moto::start() else { return };
    let FaultyBank {
        dir,
        stream,
        model,
        faulty,
        node,
    } = faulty_bank(&moto, "lake-f", "f", (17, 200), "data");
    faulty.fail_writes.store(true, Ordering::Relaxed);
    let sink = retina_node::sink::spawn(
        node.handle().clone(),
        sink_options(&stream, Some(Duration::from_millis(20))),
    )
    .unwrap();
    // The outage lasts past the end of the source.
    wait_for("the end of the source", 30, || {
        node.handle().status().source_done.load(Ordering::Acquire)
            || node
                .handle()
                .status()
                .checkpoints_failed
                .load(Ordering::Acquire)
                > 0
    });
    std::thread::sleep(Duration::from_millis(400));
    let failed = node
        .handle()
        .status()
        .checkpoints_failed
        .load(Ordering::Acquire);
    faulty.fail_writes.store(false, Ordering::Relaxed);
    let report = sink.join().unwrap();
    assert_eq!(report.stopped_by, None);
    assert!(failed > 0, "checkpoints failed during the outage");
    let status = node.handle().status();
    assert!(
        status.checkpoint_ts.load(Ordering::Acquire) >= report.last_ts.unwrap(),
        "the last checkpoint holds every transaction once the run returned"
    );
    let checkpoint = status.checkpoint_id.load(Ordering::Acquire);
    node.shutdown();
    // A new machine recovers the final state from the lake alone.
    let node = start(
        &dir.path().join("data-2"),
        moto.lake("lake-f", "f"),
        bank::DDL,
        bank_settings(),
    );
    assert_eq!(
        node.handle().status().checkpoint_id.load(Ordering::Acquire),
        checkpoint
    );
    check_bank(&node, &moto, "lake-f", &model);
    node.shutdown();
}

const GC_DDL: &str = "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT NOT NULL);";
const GC_ROWS: i64 = 4000;

fn submit(h: &NodeHandle, ops: Vec<TableOp<Vec<Value>>>) {
    let txns: Vec<Vec<_>> = ops.chunks(50).map(|c| c.to_vec()).collect();
    let ts = h.submit(&txns).unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(30)));
}

async fn read_t(session: &QuerySession) -> Vec<Vec<i64>> {
    ints(
        &session
            .collect("SELECT id, v FROM t ORDER BY id")
            .await
            .unwrap(),
    )
}

#[test]
fn storage_gc_on_s3_deletes_only_what_no_query_reads() {
    let Some(moto) = Moto::start() else { return };
    moto.create_bucket("lake-c");
    let dir = tempfile::tempdir().unwrap();
    let node = start(
        &dir.path().join("data"),
        moto.lake("lake-c", "c"),
        GC_DDL,
        Settings {
            long_query_ms: 300,
            query_lease_ms: 60_000,
            // No checkpoints: retired objects go as soon as no query reads them.
            checkpoint_interval_ms: 0,
            ..retina_tests::small_files(2, 20)
        },
    );
    let h = node.handle().clone();
    let status = h.status().clone();
    let store = moto.bucket_store("lake-c");
    let row = |id: i64, v: i64| vec![Value::Int(id), Value::Int(v)];
    submit(
        &h,
        (0..GC_ROWS)
            .map(|i| TableOp {
                table: 0,
                op: RowOp::Insert(row(i, 0)),
            })
            .collect(),
    );
    wait_for("combined files", 60, || {
        regular_files(&store, "c", "t").len() >= 14
    });
    let retina = connector(&node, &moto, "lake-c");
    retina_tests::runtime().block_on(async {
        let long = retina.begin().await.unwrap();
        let before = read_t(&long).await;
        assert_eq!(before, (0..GC_ROWS).map(|i| vec![i, 0]).collect::<Vec<_>>());
        let plan: BTreeSet<String> = retina
            .connection()
            .plan(long.query_id(), "t")
            .await
            .unwrap()
            .files
            .iter()
            .map(|f| f.path.trim_start_matches("tables/t/").to_owned())
            .collect();
        assert!(plan.len() >= 14);
        // Three rows in four deleted: every file the query reads ends up mostly dead.
        submit(
            &h,
            (0..GC_ROWS)
                .filter(|i| i % 4 != 0)
                .map(|i| TableOp {
                    table: 0,
                    op: RowOp::Delete(row(i, 0)),
                })
                .collect(),
        );
        wait_for("storage GC rewrites", 60, || {
            status.files_rewritten.load(Ordering::Relaxed) >= 4
        });
        // The query's files are all still in the bucket, and it reads the same rows.
        let files = regular_files(&store, "c", "t");
        assert!(plan.is_subset(&files), "{plan:?} not all in {files:?}");
        assert_eq!(read_t(&long).await, before);
        drop(long);

        // Once it ended, the files the rewrites replaced go; a new query reads the rest.
        // (A replaced file goes once retain LWM is past the rewrite: one more transaction.)
        submit(
            &h,
            vec![TableOp {
                table: 0,
                op: RowOp::Insert(row(GC_ROWS, 0)),
            }],
        );
        wait_for("replaced files deleted", 60, || {
            !plan.is_subset(&regular_files(&store, "c", "t"))
        });
        let now = retina.begin().await.unwrap();
        assert_eq!(
            read_t(&now).await,
            (0..=GC_ROWS)
                .filter(|i| i % 4 == 0)
                .map(|i| vec![i, 0])
                .collect::<Vec<_>>()
        );
        let files = regular_files(&store, "c", "t");
        for f in retina
            .connection()
            .plan(now.query_id(), "t")
            .await
            .unwrap()
            .files
        {
            let name = f.path.trim_start_matches("tables/t/").to_owned();
            assert!(files.contains(&name), "planned {name} is in the bucket");
        }
    });
    node.shutdown();
}

#[test]
fn large_objects_go_up_in_parts() {
    let Some(moto) = Moto::start() else { return };
    moto.create_bucket("lake-m");
    let store = retina_node::lake::s3_lake_store("lake-m", "m", &moto.options()).unwrap();
    let bytes = bytes::Bytes::from(
        (0..(17u32 << 20))
            .map(|i| (i % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let path = object_store::path::Path::from("tables/t/big.parquet");
    let read = retina_tests::runtime().block_on(async {
        retina_storage::file::put_object(store.as_ref(), &path, bytes.clone())
            .await
            .unwrap();
        retina_storage::file::get(store.as_ref(), &path)
            .await
            .unwrap()
    });
    assert_eq!(read.len(), bytes.len());
    assert!(read == bytes);
}

#[test]
fn a_missing_bucket_fails_the_start_with_the_reason() {
    let Some(moto) = Moto::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let err = Node::start(NodeOptions {
        data_dir: dir.path().to_path_buf(),
        lake: moto.lake("no-such-bucket", "x"),
        catalog: Arc::new(Catalog::from_ddl(GC_DDL, "t.sql").unwrap()),
        settings: Settings::default(),
        listen: None,
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .err()
    .expect("a missing bucket fails the start")
    .to_string();
    assert!(err.contains("s3://no-such-bucket/x/"), "{err}");
    assert!(err.contains("cannot be listed"), "{err}");
}
