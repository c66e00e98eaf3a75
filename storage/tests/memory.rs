//! After a stream that updates and deletes heavily, memory GC brings visibility back to about
//! one bit per stored row and the index to one version per live key, and storage GC then drops
//! the dead rows from the files, so the bit per row is paid for live rows (structural
//! properties, not times).

use retina_storage::{
    ColumnDef, ColumnType, RowOp, Shard, StorageConfig, TableOp, TableSchema, Timestamp, Value,
};

#[test]
fn gc_leaves_about_one_bit_per_row_and_one_version_per_key() {
    let dir = tempfile::tempdir().unwrap();
    let store = retina_storage::file::local_store(dir.path()).unwrap();
    // Files of 64K rows, so the stream fills and combines several.
    let config = StorageConfig {
        row_group_rows: 16_384,
        file_rows: 65_536,
        zstd_level: 0,
        ..StorageConfig::default()
    };
    let mut shard = Shard::new(0, config).unwrap();
    shard.add_table(
        TableSchema::new(
            "t",
            vec![
                ColumnDef::new("id", ColumnType::Int64, false),
                ColumnDef::new("v", ColumnType::Int64, false),
            ],
            &["id"],
        )
        .unwrap(),
    );
    let row = |id: i64, v: i64| vec![Value::Int(id), Value::Int(v)];
    let mut ts = 1;
    let mut apply = |shard: &mut Shard, ops: Vec<TableOp<Vec<Value>>>| {
        ts += 1;
        shard.apply(Timestamp::new(ts).unwrap(), &ops).unwrap();
        ts
    };
    const N: i64 = 200_000;
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        apply(
            &mut shard,
            chunk
                .iter()
                .map(|&i| TableOp {
                    table: 0,
                    op: RowOp::Insert(row(i, 0)),
                })
                .collect(),
        );
    }
    // Every row updated twice, a fifth deleted.
    for round in 1..=2 {
        for chunk in (0..N).collect::<Vec<_>>().chunks(500) {
            let ops = chunk
                .iter()
                .map(|&i| TableOp {
                    table: 0,
                    op: RowOp::Update {
                        before: row(i, round - 1),
                        after: row(i, round),
                    },
                })
                .collect();
            apply(&mut shard, ops);
        }
    }
    let mut last = 0;
    for chunk in (0..N).step_by(5).collect::<Vec<_>>().chunks(500) {
        last = apply(
            &mut shard,
            chunk
                .iter()
                .map(|&i| TableOp {
                    table: 0,
                    op: RowOp::Delete(row(i, 2)),
                })
                .collect(),
        );
    }
    let (stored, deleted) = shard.row_counts(0).unwrap();
    assert_eq!(stored as i64, 3 * N);
    assert_eq!(deleted as i64, 2 * N + N / 5);
    let before = shard.memory().visibility_bytes as f64 * 8.0 / stored as f64;
    assert!(
        shard.index_versions(0).unwrap() as i64 > 3 * N,
        "versions pile up before GC"
    );

    shard.gc(Timestamp::new(last).unwrap());
    let after = shard.memory().visibility_bytes as f64 * 8.0 / stored as f64;
    assert!(
        after <= 1.2,
        "{after:.3} bits per row after GC ({before:.3} before)"
    );
    assert!(
        before > 2.0 * after,
        "GC freed the delete chains: {before:.3} -> {after:.3}"
    );
    assert_eq!(shard.live_keys(0).unwrap() as i64, N - N / 5);
    assert_eq!(
        shard.index_versions(0).unwrap() as i64,
        N - N / 5,
        "one version per live key"
    );

    // Storage GC: files combined, then every file more than half dead is rewritten without
    // its dead rows; once no query can read the old files they leave, with their visibility.
    futures::executor::block_on(shard.flush_and_combine(store.as_ref())).unwrap();
    let last = Timestamp::new(last).unwrap();
    let mut replaced = 0;
    loop {
        // A GC starts a bounded number of rewrites; the next one takes the rest.
        let r =
            futures::executor::block_on(shard.gc_and_rewrite(store.as_ref(), last, 0.5)).unwrap();
        if r.is_empty() {
            break;
        }
        replaced += r.len();
    }
    // Rounds 0 and 1 fill six files and die whole; round 2 is four fifths live.
    assert!(
        replaced >= 6,
        "files more than half dead were rewritten: {replaced}"
    );
    let gone = shard.take_deletable(Timestamp::new(last.get() + 1).unwrap(), u64::MAX);
    let files_gone = gone
        .iter()
        .filter(|p| !p.as_ref().contains("/buffer/"))
        .count();
    assert_eq!(files_gone, replaced, "each old file leaves once");
    let (stored_after, deleted_after) = shard.row_counts(0).unwrap();
    let live = (N - N / 5) as u64;
    assert_eq!(stored_after - deleted_after, live, "no live row lost");
    assert!(
        stored_after < stored / 2,
        "storage GC dropped the dead rows: {stored_after} of {stored} stored"
    );
    let bits = shard.memory().visibility_bytes as f64 * 8.0 / stored_after as f64;
    assert!(
        bits <= 1.2,
        "{bits:.3} bits per stored row after storage GC"
    );
    assert_eq!(
        shard.index_versions(0).unwrap() as i64,
        N - N / 5,
        "row ids kept their keys"
    );
}
