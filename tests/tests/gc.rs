//! GC under a long query, end to end through the DataFusion connector: a query begun before
//! heavy deletes and updates runs long enough to get a visibility checkpoint; LWM then moves
//! past it, memory GC folds past its snapshot and storage GC rewrites the files it read, and
//! the same SQL in the same query still returns exactly what it returned before. Later queries
//! read the rewritten files and see the newest state; the old files, and the query's
//! checkpoint files, go once it ends.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use retina_node::catalog::Catalog;
use retina_node::node::{Node, NodeHandle, NodeOptions};
use retina_node::settings::Settings;
use retina_query::{QuerySession, Retina};
use retina_storage::{RowOp, TableOp, Value};
use retina_tests::ints;

const DDL: &str = "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT NOT NULL);";
const ROWS: i64 = 4000;

async fn plan_files(retina: &Retina, session: &QuerySession) -> BTreeSet<u64> {
    retina
        .connection()
        .plan(session.query_id(), "t")
        .await
        .unwrap()
        .files
        .iter()
        .map(|f| f.file)
        .collect()
}

async fn read(session: &QuerySession) -> Vec<Vec<i64>> {
    ints(
        &session
            .collect("SELECT id, v FROM t ORDER BY id")
            .await
            .unwrap(),
    )
}

/// A node of small files and frequent GC, serving queries on loopback.
fn start(data: &Path) -> Node {
    Node::start(NodeOptions {
        data_dir: data.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "t.sql").unwrap()),
        settings: Settings {
            long_query_ms: 300,
            query_lease_ms: 60_000,
            // No sink takes checkpoints here: retired objects leave as soon as no query reads
            // them.
            checkpoint_interval_ms: 0,
            ..retina_tests::small_files(2, 20)
        },
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap()
}

fn submit(h: &NodeHandle, ops: Vec<TableOp<Vec<Value>>>) {
    let txns: Vec<Vec<_>> = ops.chunks(50).map(|c| c.to_vec()).collect();
    let ts = h.submit(&txns).unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(20)));
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

/// Regular files of table `t` in the lake.
fn lake_files(data: &Path) -> BTreeSet<String> {
    std::fs::read_dir(data.join("lake/tables/t"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_long_query_reads_the_same_rows_before_and_after_gc_and_storage_gc() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = start(&data);
    let h = node.handle().clone();
    let status = h.status().clone();
    let row = |id: i64, v: i64| vec![Value::Int(id), Value::Int(v)];
    submit(
        &h,
        (0..ROWS)
            .map(|i| TableOp {
                table: 0,
                op: RowOp::Insert(row(i, 0)),
            })
            .collect(),
    );
    // 2000 rows per shard: seven full files each.
    wait_for("combined files", 20, || lake_files(&data).len() >= 14);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let retina = Retina::connect(node.coordinator_addr().unwrap(), "").unwrap();
        let long = retina.begin().await.unwrap();
        let before = read(&long).await;
        assert_eq!(before, (0..ROWS).map(|i| vec![i, 0]).collect::<Vec<_>>());
        let old_plan: BTreeSet<u64> = plan_files(&retina, &long).await;
        assert!(old_plan.len() >= 14, "the long query reads regular files");

        // In every four rows one stays, one is updated (its new version goes to a new file)
        // and two are deleted: every old file ends up three quarters dead.
        submit(
            &h,
            (0..ROWS)
                .filter(|i| i % 4 != 0)
                .map(|i| TableOp {
                    table: 0,
                    op: if i % 4 == 1 {
                        RowOp::Update {
                            before: row(i, 0),
                            after: row(i, 1),
                        }
                    } else {
                        RowOp::Delete(row(i, 0))
                    },
                })
                .collect(),
        );
        let s = long.snapshot().get();
        // The long query gets its visibility checkpoint, LWM passes it, memory GC folds past
        // its snapshot, and storage GC rewrites files it reads.
        wait_for("the long query's visibility checkpoint", 20, || {
            status.vis_checkpoints.load(Ordering::Acquire) == 1
        });
        assert!(
            std::fs::read_dir(data.join("vis")).unwrap().count() == 2,
            "a checkpoint file per shard"
        );
        wait_for("LWM past the long query", 20, || {
            status.lwm.load(Ordering::Acquire) > s
        });
        assert_eq!(
            status.retain_lwm.load(Ordering::Acquire),
            s,
            "its objects stay"
        );
        wait_for("storage GC", 20, || {
            status.files_rewritten.load(Ordering::Acquire) >= 14
        });
        let gc_runs = status.gc_runs.load(Ordering::Acquire);
        wait_for("another memory GC", 20, || {
            status.gc_runs.load(Ordering::Acquire) > gc_runs + 2
        });

        // The same SQL in the same query: the same rows, from the old files and the
        // checkpointed bitmaps.
        assert_eq!(
            read(&long).await,
            before,
            "the long query's rows did not change"
        );
        let again: BTreeSet<u64> = plan_files(&retina, &long).await;
        // (Files combined since, from rows created after its snapshot, may be listed too.)
        assert!(
            old_plan.is_subset(&again),
            "its plan still lists the files it read: {again:?} vs {old_plan:?}"
        );

        // Deletes after the rewrite find the rows that stayed in the rewritten files.
        submit(
            &h,
            (0..ROWS)
                .step_by(8)
                .map(|i| TableOp {
                    table: 0,
                    op: RowOp::Delete(row(i, 0)),
                })
                .collect(),
        );
        // A new query reads the rewritten files and sees the newest state.
        let now = retina.begin().await.unwrap();
        let expected: Vec<Vec<i64>> = (0..ROWS)
            .filter_map(|i| match i % 8 {
                4 => Some(vec![i, 0]),
                1 | 5 => Some(vec![i, 1]),
                _ => None,
            })
            .collect();
        assert_eq!(read(&now).await, expected);
        let new_plan: BTreeSet<u64> = plan_files(&retina, &now).await;
        assert!(
            new_plan.is_disjoint(&old_plan),
            "new queries read only rewritten files: {new_plan:?} vs {old_plan:?}"
        );
        drop(now);

        // Once the long query ends, its checkpoint files and the old files go.
        drop(long);
        wait_for("the visibility checkpoints removed", 20, || {
            status.vis_checkpoints.load(Ordering::Acquire) == 0
                && std::fs::read_dir(data.join("vis")).unwrap().count() == 0
        });
        let old_names: Vec<String> = old_plan
            .iter()
            .map(|id| format!("{id:016x}.parquet"))
            .collect();
        wait_for("the replaced files removed", 20, || {
            let now = lake_files(&data);
            old_names.iter().all(|n| !now.contains(n))
        });
        let newest = retina.begin().await.unwrap();
        assert_eq!(read(&newest).await, expected);
    });
    assert!(status.error().is_none(), "{:?}", status.error());
    node.shutdown();
}

/// Storage GC of files whose every row was deleted writes nothing and drops them (a rewrite
/// keeping no row has no object to make durable).
#[test]
fn files_whose_rows_are_all_deleted_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let node = start(&data);
    let h = node.handle().clone();
    let status = h.status().clone();
    let row = |id: i64| vec![Value::Int(id), Value::Int(0)];
    let ops = |op: fn(Vec<Value>) -> RowOp<Vec<Value>>| -> Vec<_> {
        (0..ROWS)
            .map(|i| TableOp {
                table: 0,
                op: op(row(i)),
            })
            .collect()
    };
    submit(&h, ops(RowOp::Insert));
    wait_for("combined files", 20, || lake_files(&data).len() >= 14);
    submit(&h, ops(RowOp::Delete));
    wait_for("storage GC of every file", 20, || {
        status.files_rewritten.load(Ordering::Acquire) >= 14
    });
    // The next transaction moves the watermarks past the rewrite: no query can read the dead
    // files any more.
    submit(
        &h,
        vec![TableOp {
            table: 0,
            op: RowOp::Insert(row(ROWS)),
        }],
    );
    wait_for("the dead files to go", 20, || lake_files(&data).is_empty());
    assert_eq!(status.error(), None);
    node.shutdown();
}
