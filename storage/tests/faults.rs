//! Failed flushes and combinations lose nothing: the blocks stay in memory and readable, the
//! work is offered again, and it succeeds once the store does.

use std::sync::atomic::Ordering;

use futures::executor::block_on;
use retina_storage::fault::FaultyStore;
use retina_storage::file::local_store;
use retina_storage::{
    ColumnDef, ColumnType, RowOp, Shard, StorageConfig, TableOp, TableSchema, Timestamp, Value,
};

fn count(shard: &Shard, store: &FaultyStore, at: u64) -> usize {
    let snap = shard.snapshot(0, Timestamp::new(at).unwrap()).unwrap();
    block_on(snap.read(store, None))
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum()
}

#[test]
fn failed_flushes_and_combinations_are_retried_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let store = FaultyStore::new(local_store(dir.path()).unwrap());
    let config = StorageConfig {
        tile_rows: 64,
        block_rows: 64,
        row_group_rows: 128,
        file_rows: 256,
        zstd_level: 1,
    };
    let mut shard = Shard::new(0, config).unwrap();
    shard.add_table(
        TableSchema::new(
            "t",
            vec![
                ColumnDef::new("id", ColumnType::Int64, false),
                ColumnDef::new("s", ColumnType::Utf8, true),
            ],
            &["id"],
        )
        .unwrap(),
    );
    let mut ts = 1;
    for chunk in (0..300i64).collect::<Vec<_>>().chunks(10) {
        ts += 1;
        let ops: Vec<_> = chunk
            .iter()
            .map(|&i| TableOp {
                table: 0,
                op: RowOp::Insert(vec![Value::Int(i), Value::Utf8(format!("r{i}"))]),
            })
            .collect();
        shard.apply(Timestamp::new(ts).unwrap(), &ops).unwrap();
    }

    store.fail_writes.store(true, Ordering::Relaxed);
    assert!(block_on(shard.flush_and_combine(&store)).is_err());
    assert!(store.injected.load(Ordering::Relaxed) > 0);
    assert_eq!(
        count(&shard, &store, ts),
        300,
        "nothing is lost while the store fails"
    );
    assert_eq!(count(&shard, &store, 5), 40);

    store.fail_writes.store(false, Ordering::Relaxed);
    block_on(shard.flush_and_combine(&store)).unwrap();
    assert_eq!(count(&shard, &store, ts), 300);

    // Combination reads the flushed blocks back; a failed read leaves them as they were.
    let mut more = Vec::new();
    for i in 300..600i64 {
        more.push(TableOp {
            table: 0,
            op: RowOp::Insert(vec![Value::Int(i), Value::Null]),
        });
    }
    ts += 1;
    shard.apply(Timestamp::new(ts).unwrap(), &more).unwrap();
    let flushed: Vec<_> = shard.take_flush_jobs();
    for (t, job) in flushed {
        let schema = shard.schema(t).unwrap().clone();
        let bytes = block_on(retina_storage::file::flush_block(
            &store,
            &schema,
            shard.config(),
            &job,
        ))
        .unwrap();
        shard.flush_done(t, job.block, bytes);
    }
    store.fail_reads.store(true, Ordering::Relaxed);
    let err = block_on(shard.flush_and_combine(&store)).unwrap_err();
    assert!(err.is_retryable(), "{err}");
    store.fail_reads.store(false, Ordering::Relaxed);
    assert_eq!(count(&shard, &store, ts), 600);
    block_on(shard.flush_and_combine(&store)).unwrap();
    assert_eq!(count(&shard, &store, ts), 600);
    let combined = std::fs::read_dir(dir.path().join("tables/t"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "parquet")
        })
        .count();
    assert_eq!(combined, 2, "two full files were combined");

    // The combined files' blocks retire; they go once LWM passes, and a delete that could not
    // be sent is offered again.
    assert!(
        shard
            .take_deletable(Timestamp::new(2).unwrap(), u64::MAX)
            .is_empty(),
        "a query may still read them"
    );
    let retired = shard.take_deletable(Timestamp::new(ts + 1).unwrap(), u64::MAX);
    assert_eq!(retired.len(), 8, "4 blocks of 64 rows per file");
    shard.defer_deletes(retired.clone());
    assert_eq!(
        shard.take_deletable(Timestamp::new(ts + 1).unwrap(), u64::MAX),
        retired
    );
}
