//! The shard state machine against a naive in-memory table: random transactions (some of them
//! invalid), flushes, combinations, memory GC, storage GC (with transactions running while a
//! rewrite is on its way) and long queries pinned by a visibility checkpoint; at every check,
//! the rows visible at any snapshot at or below the last applied one are exactly the model's,
//! `_create_ts` included, and a pinned query still reads its snapshot after GC passed it.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::executor::block_on;
use object_store::ObjectStore;
use proptest::prelude::*;
use retina_storage::batch_rows;
use retina_storage::file::local_store;
use retina_storage::{
    ColumnDef, ColumnType, RewriteJob, RowOp, Shard, StorageConfig, StorageError, TableOp,
    TableSchema, Timestamp, Value, VisibilityImage,
};

fn schemas() -> [Arc<TableSchema>; 2] {
    let a = TableSchema::new(
        "orders",
        vec![
            ColumnDef::new("id", ColumnType::Int32, false),
            ColumnDef::new("name", ColumnType::Utf8, true),
            ColumnDef::new(
                "amount",
                ColumnType::Decimal {
                    precision: 10,
                    scale: 2,
                },
                false,
            ),
            ColumnDef::new("day", ColumnType::Date, true),
            ColumnDef::new("at", ColumnType::Timestamp, true),
            ColumnDef::new("flag", ColumnType::Boolean, true),
            ColumnDef::new("score", ColumnType::Float64, true),
        ],
        &["id"],
    )
    .unwrap();
    let b = TableSchema::new(
        "stock",
        vec![
            ColumnDef::new("region", ColumnType::Utf8, false),
            ColumnDef::new("n", ColumnType::Int64, false),
            ColumnDef::new("qty", ColumnType::Int64, true),
        ],
        &["region", "n"],
    )
    .unwrap();
    [a, b]
}

/// An operation, resolved against the model when it runs: deletes and updates pick one of the
/// live keys (or, now and then, a key that may not exist), so most transactions are valid.
#[derive(Clone, Debug)]
enum GenOp {
    Insert {
        table: u32,
        k: u8,
        seed: u16,
    },
    Delete {
        table: u32,
        pick: u16,
        any: Option<u8>,
    },
    Update {
        table: u32,
        pick: u16,
        to_k: Option<u8>,
        seed: u16,
    },
    /// A re-sent snapshot read: the row whether or not its key is live.
    Upsert {
        table: u32,
        k: u8,
        seed: u16,
    },
    Truncate {
        table: u32,
    },
}

#[derive(Clone, Debug)]
enum Step {
    Txn(Vec<GenOp>),
    Flush,
    Gc {
        lag: u64,
    },
    Read {
        table: u32,
        lag: u64,
    },
    /// Checkpoint, encode, decode and go on with the restored shard (a restart).
    Restart,
    /// Memory GC, then storage GC of files more than `dead` dead, left on its way: later
    /// transactions delete rows of the files being rewritten.
    RewriteBegin {
        lag: u64,
        dead: f64,
        /// Whether memory GC runs first (the node's GC can pick files between table steps).
        memory_gc: bool,
    },
    /// The rewrites on their way are written and switched to.
    RewriteEnd,
    /// The rewrites on their way could not be written.
    RewriteFail,
    /// A long query: a visibility checkpoint at a snapshot, after which GC may pass it.
    Pin {
        lag: u64,
    },
    ReadPinned {
        table: u32,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let op = prop_oneof![
        5 => (0u32..2, any::<u8>(), any::<u16>())
            .prop_map(|(table, k, seed)| GenOp::Insert { table, k, seed }),
        2 => (0u32..2, any::<u16>(), proptest::option::weighted(0.05, any::<u8>()))
            .prop_map(|(table, pick, any)| GenOp::Delete { table, pick, any }),
        3 => (0u32..2, any::<u16>(), proptest::option::weighted(0.3, any::<u8>()), any::<u16>())
            .prop_map(|(table, pick, to_k, seed)| GenOp::Update { table, pick, to_k, seed }),
        2 => (0u32..2, any::<u8>(), any::<u16>())
            .prop_map(|(table, k, seed)| GenOp::Upsert { table, k, seed }),
        1 => (0u32..2).prop_map(|table| GenOp::Truncate { table }),
    ];
    prop_oneof![
        12 => proptest::collection::vec(op, 1..6).prop_map(Step::Txn),
        2 => Just(Step::Flush),
        1 => (0u64..8).prop_map(|lag| Step::Gc { lag }),
        3 => (0u32..2, 0u64..12).prop_map(|(table, lag)| Step::Read { table, lag }),
        1 => Just(Step::Restart),
        2 => (0u64..6, prop_oneof![Just(0.0), Just(0.2), Just(0.5)], any::<bool>())
            .prop_map(|(lag, dead, memory_gc)| Step::RewriteBegin { lag, dead, memory_gc }),
        2 => Just(Step::RewriteEnd),
        1 => Just(Step::RewriteFail),
        1 => (0u64..6).prop_map(|lag| Step::Pin { lag }),
        2 => (0u32..2).prop_map(|table| Step::ReadPinned { table }),
    ]
}

fn row(table: u32, k: u8, seed: u16) -> Vec<Value> {
    let s = i64::from(seed);
    let maybe = |v: Value| {
        if seed.is_multiple_of(5) {
            Value::Null
        } else {
            v
        }
    };
    if table == 0 {
        vec![
            Value::Int(k.into()),
            maybe(Value::Utf8(format!("name-{seed}"))),
            Value::Decimal(i128::from(s) * 101 - 3_000_000),
            maybe(Value::Date(19_000 + (s % 400) as i32)),
            maybe(Value::Timestamp(1_700_000_000_000_000 + s * 1_000_003)),
            maybe(Value::Boolean(seed.is_multiple_of(2))),
            maybe(Value::Float(f64::from(seed) / 7.0)),
        ]
    } else {
        vec![
            Value::Utf8(["north", "south", "e\0ast"][usize::from(k % 3)].into()),
            Value::Int(i64::from(k / 3) - 40),
            maybe(Value::Int(s * 3)),
        ]
    }
}

/// The key columns of a row as a model key.
fn model_key(table: u32, r: &[Value]) -> String {
    if table == 0 {
        format!("{:?}", r[0])
    } else {
        format!("{:?}/{:?}", r[0], r[1])
    }
}

type TableModel = BTreeMap<String, (Vec<Value>, u64)>;

/// The naive database: every table's rows (with create ts) after each applied transaction.
struct Model {
    history: Vec<(u64, [TableModel; 2])>,
}

impl Model {
    fn at(&self, ts: u64) -> &[TableModel; 2] {
        &self.history.iter().rev().find(|(t, _)| *t <= ts).unwrap().1
    }

    /// Applies the transaction to a copy; `None` if any operation is invalid.
    fn apply(&self, ts: u64, ops: &[TableOp<Vec<Value>>]) -> Option<[TableModel; 2]> {
        let mut state = self.history.last().unwrap().1.clone();
        for op in ops {
            let t = &mut state[op.table as usize];
            match &op.op {
                RowOp::Insert(r) => {
                    if t.insert(model_key(op.table, r), (r.clone(), ts)).is_some() {
                        return None;
                    }
                }
                RowOp::Delete(r) => {
                    t.remove(&model_key(op.table, r))?;
                }
                RowOp::Update { before, after } => {
                    t.remove(&model_key(op.table, before))?;
                    if t.insert(model_key(op.table, after), (after.clone(), ts))
                        .is_some()
                    {
                        return None;
                    }
                }
                RowOp::Upsert(r) => {
                    t.insert(model_key(op.table, r), (r.clone(), ts));
                }
                RowOp::Truncate => t.clear(),
            }
        }
        Some(state)
    }
}

/// The model key's `k` back from a row (the inverse of `row`'s key columns).
fn k_of(table: u32, r: &[Value]) -> u8 {
    match (table, &r[0], &r[1]) {
        (0, Value::Int(id), _) => *id as u8,
        (_, Value::Utf8(region), Value::Int(n)) => {
            let r = ["north", "south", "e\0ast"]
                .iter()
                .position(|x| x == region)
                .unwrap();
            ((n + 40) * 3) as u8 + r as u8
        }
        _ => unreachable!(),
    }
}

fn to_ops(ops: &[GenOp], state: &[TableModel; 2]) -> Vec<TableOp<Vec<Value>>> {
    let pick = |table: u32, pick: u16| -> u8 {
        let live = &state[table as usize];
        if live.is_empty() {
            return pick as u8;
        }
        let (r, _) = live.values().nth(usize::from(pick) % live.len()).unwrap();
        k_of(table, r)
    };
    ops.iter()
        .map(|op| match *op {
            GenOp::Insert { table, k, seed } => TableOp {
                table,
                op: RowOp::Insert(row(table, k, seed)),
            },
            GenOp::Delete {
                table,
                pick: p,
                any,
            } => {
                // A delete's before-image may carry only the key.
                let mut r = row(table, any.unwrap_or_else(|| pick(table, p)), 1);
                let key_cols = if table == 0 { 1 } else { 2 };
                for v in &mut r[key_cols..] {
                    *v = Value::Null;
                }
                TableOp {
                    table,
                    op: RowOp::Delete(r),
                }
            }
            GenOp::Update {
                table,
                pick: p,
                to_k,
                seed,
            } => {
                let from = pick(table, p);
                TableOp {
                    table,
                    op: RowOp::Update {
                        before: row(table, from, 0),
                        after: row(table, to_k.unwrap_or(from), seed),
                    },
                }
            }
            GenOp::Upsert { table, k, seed } => TableOp {
                table,
                op: RowOp::Upsert(row(table, k, seed)),
            },
            GenOp::Truncate { table } => TableOp {
                table,
                op: RowOp::Truncate,
            },
        })
        .collect()
}

fn read_sorted(
    shard: &Shard,
    store: &dyn ObjectStore,
    table: u32,
    at: Timestamp,
    image: Option<&VisibilityImage>,
) -> Result<Vec<Vec<Value>>, StorageError> {
    let snap = shard.snapshot_with(table, at, &[], image)?;
    let schema = shard.schema(table).unwrap().clone();
    let mut projection: Vec<usize> = (0..schema.columns().len()).collect();
    projection.push(schema.create_ts_index());
    let mut types: Vec<ColumnType> = schema.columns().iter().map(|c| c.ty).collect();
    types.push(ColumnType::Int64);
    let batches = block_on(snap.read(store, Some(&projection)))?;
    let mut rows: Vec<Vec<Value>> = batches.iter().flat_map(|b| batch_rows(b, &types)).collect();
    rows.sort_by_key(|r| model_key(table, r));
    Ok(rows)
}

fn expected(model: &Model, table: u32, at: u64) -> Vec<Vec<Value>> {
    model.at(at)[table as usize]
        .values()
        .map(|(r, ts)| {
            let mut r = r.clone();
            r.push(Value::Int(*ts as i64));
            r
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    #[test]
    fn shard_matches_a_naive_table(
        small in any::<bool>(),
        steps in proptest::collection::vec(step(), 1..500),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = local_store(dir.path()).unwrap();
        // Small sizes so that a few hundred rows cross blocks, tiles, row groups and files.
        let config = if small {
            StorageConfig { tile_rows: 64, block_rows: 64, row_group_rows: 64, file_rows: 128, zstd_level: 0 }
        } else {
            StorageConfig { tile_rows: 64, block_rows: 64, row_group_rows: 128, file_rows: 256, zstd_level: 1 }
        };
        let mut shard = Shard::new(0, config.clone()).unwrap();
        for s in schemas() {
            shard.add_table(s);
        }
        let mut model = Model { history: vec![(1, [TableModel::new(), TableModel::new()])] };
        let mut next = 2u64;
        let mut gc_to = 1u64;
        let mut checkpoints = 0u64;
        let mut rewriting: Vec<(u32, RewriteJob)> = Vec::new();
        let mut pinned: Option<VisibilityImage> = None;
        for step in steps {
            match step {
                Step::Txn(ops) => {
                    let ops = to_ops(&ops, &model.history.last().unwrap().1);
                    let ts = Timestamp::new(next).unwrap();
                    let got = shard.apply(ts, &ops);
                    match model.apply(next, &ops) {
                        Some(state) => {
                            prop_assert!(got.is_ok(), "model applied, shard said {:?}", got);
                            model.history.push((next, state));
                            next += 1;
                        }
                        None => {
                            let err = got.expect_err("the model refused the transaction");
                            prop_assert!(matches!(err, StorageError::Op { .. }), "{}", err);
                            // The failed timestamp is reused: nothing of it was applied.
                        }
                    }
                }
                Step::Flush => block_on(shard.flush_and_combine(store.as_ref())).unwrap(),
                Step::Restart => {
                    checkpoints += 1;
                    let bytes = shard.checkpoint(checkpoints).unwrap().encode().unwrap();
                    let image = retina_storage::ShardImage::decode(&bytes).unwrap();
                    shard = Shard::from_image(config.clone(), &schemas(), image, checkpoints).unwrap();
                    // A restored shard knows no past before its checkpoint; rewrites on their
                    // way and queries died with the process.
                    gc_to = next - 1;
                    rewriting.clear();
                    pinned = None;
                }
                Step::Gc { lag } => {
                    let at = (next - 1).saturating_sub(lag).max(gc_to);
                    shard.gc(Timestamp::new(at).unwrap());
                    gc_to = at;
                }
                Step::RewriteBegin { lag, dead, memory_gc } => {
                    let at = (next - 1).saturating_sub(lag).max(gc_to);
                    let at_ts = Timestamp::new(at).unwrap();
                    if memory_gc {
                        shard.gc(at_ts);
                    }
                    gc_to = at;
                    rewriting.extend(shard.take_rewrite_jobs(at_ts, dead).unwrap());
                }
                Step::RewriteEnd => {
                    for (t, job) in rewriting.drain(..) {
                        let schema = shard.schema(t).unwrap().clone();
                        let written = block_on(retina_storage::file::rewrite_file(
                            store.as_ref(), &schema, &config, &job,
                        ))
                        .unwrap();
                        let r = shard.rewrite_done(t, &job, written.groups).unwrap();
                        prop_assert_eq!(r.file, job.file);
                    }
                }
                Step::RewriteFail => {
                    for (t, job) in rewriting.drain(..) {
                        shard.rewrite_failed(t, job.file);
                    }
                }
                Step::Pin { lag } => {
                    let at = (next - 1).saturating_sub(lag).max(gc_to);
                    let image = shard.visibility_image(Timestamp::new(at).unwrap()).unwrap();
                    pinned = Some(VisibilityImage::decode(&image.encode()).unwrap());
                }
                Step::ReadPinned { table } => {
                    if let Some(image) = &pinned {
                        let at = image.snapshot;
                        let rows = read_sorted(&shard, store.as_ref(), table, at, Some(image));
                        prop_assert!(rows.is_ok(), "pinned read at {}: {:?}", at, rows.err());
                        prop_assert_eq!(rows.unwrap(), expected(&model, table, at.get()), "pinned table {} at {}", table, at);
                    }
                }
                Step::Read { table, lag } => {
                    let at = (next - 1).saturating_sub(lag).max(1);
                    match read_sorted(&shard, store.as_ref(), table, Timestamp::new(at).unwrap(), None) {
                        Ok(rows) => prop_assert_eq!(rows, expected(&model, table, at), "table {} at {}", table, at),
                        Err(StorageError::SnapshotTooOld { .. }) => prop_assert!(at < gc_to),
                        Err(e) => prop_assert!(false, "read at {}: {}", at, e),
                    }
                }
            }
        }
        // Finally, every snapshot from the GC point to the last applied one.
        let last = next - 1;
        prop_assert_eq!(shard.applied_through().get(), last);
        for at in gc_to..=last {
            for table in 0..2 {
                let rows = read_sorted(&shard, store.as_ref(), table, Timestamp::new(at).unwrap(), None).unwrap();
                prop_assert_eq!(rows, expected(&model, table, at), "table {} at {}", table, at);
            }
        }
        // Rewrites still on their way finish, and the newest state reads the same.
        let pending = !rewriting.is_empty();
        for (t, job) in rewriting.drain(..) {
            let schema = shard.schema(t).unwrap().clone();
            let written = block_on(retina_storage::file::rewrite_file(store.as_ref(), &schema, &config, &job)).unwrap();
            shard.rewrite_done(t, &job, written.groups).unwrap();
        }
        if pending {
            for table in 0..2 {
                let rows = read_sorted(&shard, store.as_ref(), table, Timestamp::new(last).unwrap(), None).unwrap();
                prop_assert_eq!(rows, expected(&model, table, last), "table {} after the last rewrites", table);
            }
        }
        let future = shard.snapshot(0, Timestamp::new(last + 1).unwrap());
        let in_future = matches!(future, Err(StorageError::SnapshotInFuture { .. }));
        prop_assert!(in_future, "a snapshot past the applied timestamp is refused");
    }
}

#[test]
fn rejected_operations_name_the_key_and_change_nothing() {
    let mut shard = Shard::new(0, StorageConfig::default()).unwrap();
    let [a, _] = schemas();
    let t = shard.add_table(a);
    let ts = |v| Timestamp::new(v).unwrap();
    shard
        .apply(
            ts(2),
            &[TableOp {
                table: t,
                op: RowOp::Insert(row(0, 1, 1)),
            }],
        )
        .unwrap();
    let before = (
        shard.row_counts(t).unwrap(),
        shard.live_keys(t).unwrap(),
        shard.memory(),
    );

    let err = shard
        .apply(
            ts(3),
            &[
                TableOp {
                    table: t,
                    op: RowOp::Insert(row(0, 2, 1)),
                },
                TableOp {
                    table: t,
                    op: RowOp::Delete(row(0, 7, 1)),
                },
            ],
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "operation 1 of the transaction at ts 3: table `orders`: key (id=7) does not exist"
    );
    let err = shard
        .apply(
            ts(3),
            &[TableOp {
                table: t,
                op: RowOp::Insert(row(0, 1, 2)),
            }],
        )
        .unwrap_err();
    assert!(
        err.to_string().ends_with("key (id=1) already exists"),
        "{err}"
    );
    let mut bad = row(0, 3, 1);
    bad[2] = Value::Utf8("12.5".into());
    let err = shard
        .apply(
            ts(3),
            &[TableOp {
                table: t,
                op: RowOp::Insert(bad),
            }],
        )
        .unwrap_err();
    assert!(
        err.to_string()
            .ends_with("column `amount`: string value for a decimal(10,2) column"),
        "{err}"
    );
    let err = shard
        .apply(
            ts(3),
            &[TableOp {
                table: 9,
                op: RowOp::Insert(row(0, 3, 1)),
            }],
        )
        .unwrap_err();
    assert!(err.to_string().ends_with("unknown table id 9"), "{err}");
    let err = shard
        .apply(
            ts(2),
            &[TableOp {
                table: t,
                op: RowOp::Insert(row(0, 3, 1)),
            }],
        )
        .unwrap_err();
    assert!(
        matches!(err, StorageError::TimestampBackwards { .. }),
        "{err}"
    );

    assert_eq!(
        before,
        (
            shard.row_counts(t).unwrap(),
            shard.live_keys(t).unwrap(),
            shard.memory()
        )
    );
    assert_eq!(shard.applied_through(), ts(2));
}

#[test]
fn a_damaged_checkpoint_is_refused() {
    let mut shard = Shard::new(0, StorageConfig::default()).unwrap();
    for s in schemas() {
        shard.add_table(s);
    }
    let ops = vec![TableOp {
        table: 0,
        op: RowOp::Insert(row(0, 7, 3)),
    }];
    shard.apply(Timestamp::new(2).unwrap(), &ops).unwrap();
    let bytes = shard.checkpoint(1).unwrap().encode().unwrap();
    assert!(retina_storage::ShardImage::decode(&bytes).is_ok());
    for cut in [bytes.len() - 1, bytes.len() / 2, 9] {
        let err = retina_storage::ShardImage::decode(&bytes[..cut])
            .err()
            .unwrap();
        assert!(err.to_string().contains("checkpoint"), "{err}");
    }
    let mut flipped = bytes.clone();
    flipped[40] ^= 1;
    let err = retina_storage::ShardImage::decode(&flipped).err().unwrap();
    assert!(err.to_string().contains("checksum"), "{err}");
    // A schema other than the checkpoint's is refused by name.
    let image = retina_storage::ShardImage::decode(&bytes).unwrap();
    let err = Shard::from_image(StorageConfig::default(), &schemas()[..1], image, 1)
        .err()
        .unwrap();
    assert!(err.to_string().contains("schema"), "{err}");
}
