//! What the generator tests share: determinism, load sizes, the DDL against the node's catalog,
//! the Debezium JSON read back by the node's parser, and a plain model of the source database
//! that every transaction is applied to.

use std::collections::BTreeMap;
use std::sync::Arc;

use retina_bench::chgen::ChWorkload;
use retina_bench::hybench::HyWorkload;
use retina_bench::workload::{LOAD_US, Txn};
use retina_node::catalog::Catalog;
use retina_node::debezium::{SourcePosition, TxnAssembler, TxnMode, parse_line};
use retina_storage::{RowOp, TableSchema, Value};

/// A generated workload: its load, its stream and its Debezium JSON.
pub trait Generated {
    fn load(&self) -> &[Txn];
    fn stream(&self) -> &[Txn];
    fn json(&self) -> Vec<u8>;
}

macro_rules! generated {
    ($($workload:ty),*) => {$(
        impl Generated for $workload {
            fn load(&self) -> &[Txn] {
                &self.load
            }

            fn stream(&self) -> &[Txn] {
                &self.stream
            }

            fn json(&self) -> Vec<u8> {
                let mut out = Vec::new();
                self.write_debezium(&mut out).unwrap();
                out
            }
        }
    )*};
}

generated!(ChWorkload, HyWorkload);

/// The same seed gives the same transactions and bytes, another seed others; `wall` (seed 7's
/// stream stamped by the wall clock) draws the same transactions as seed 7's.
pub fn assert_deterministic<W: Generated>(generate: impl Fn(u64) -> W, wall: &[Txn]) {
    let a = generate(7);
    let b = generate(7);
    assert_eq!(a.load(), b.load());
    assert_eq!(a.stream(), b.stream());
    let bytes = a.json();
    assert_eq!(bytes, b.json());
    let c = generate(8);
    assert_ne!(a.stream(), c.stream());
    assert_ne!(bytes, c.json());
    // Stamping real time changes only the timestamps, not the draws.
    assert_eq!(wall.len(), a.stream().len());
    for (x, y) in wall.iter().zip(a.stream()) {
        assert_eq!(x.len(), y.len());
        assert!(x.iter().zip(y).all(|(p, q)| p.table == q.table));
    }
}

/// The whole load from `next_load_txn`, checking every transaction but the last is full.
pub fn load_in_txns_of(
    rows_per_txn: usize,
    mut next_load_txn: impl FnMut(usize) -> Option<Txn>,
) -> Vec<Txn> {
    let mut load = Vec::new();
    while let Some(t) = next_load_txn(rows_per_txn) {
        assert!(!t.is_empty() && t.len() <= rows_per_txn);
        load.push(t);
    }
    assert!(
        load[..load.len() - 1]
            .iter()
            .all(|t| t.len() == rows_per_txn)
    );
    load
}

/// The catalog `ddl` (from `path`) builds is `ours`, and every table has a `fresh_ts`.
pub fn assert_ddl_is(ddl: &str, path: &str, ours: &[Arc<TableSchema>]) -> Catalog {
    let catalog = Catalog::from_ddl(ddl, path).unwrap();
    assert_eq!(catalog.tables().len(), ours.len());
    for (theirs, ours) in catalog.tables().iter().zip(ours) {
        assert_eq!(theirs.name(), ours.name());
        assert_eq!(theirs.columns(), ours.columns(), "{}", ours.name());
        assert_eq!(theirs.primary_key(), ours.primary_key(), "{}", ours.name());
        let fresh = ours
            .column_index("fresh_ts")
            .expect("every table has fresh_ts");
        assert!(!ours.columns()[fresh].nullable);
    }
    catalog
}

/// Every transaction of the Debezium JSON, as the node's parser and assembler read it, with
/// table ids from `ddl`'s catalog, and whether it is a snapshot read.
pub fn parse(ddl: &str, source: &str, bytes: &[u8]) -> Vec<(Txn, bool)> {
    let catalog = Catalog::from_ddl(ddl, &format!("{source}.sql")).unwrap();
    let lookup = |name: &str| -> Option<Arc<TableSchema>> {
        catalog
            .resolve(name)
            .and_then(|id| catalog.get(id).cloned())
    };
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    let mut txns = Vec::new();
    let file: Arc<str> = format!("{source}.json").into();
    let text = std::str::from_utf8(bytes).unwrap();
    for (n, line) in text.lines().enumerate() {
        let pos = SourcePosition::new(file.clone(), n as u64 + 1);
        let msg = parse_line(line, &pos, &lookup).unwrap_or_else(|e| panic!("{e}\n{line}"));
        if let Some(t) = asm.push(msg).unwrap_or_else(|e| panic!("{e}")) {
            asm.mark_applied(&t.id, &t.end);
            let snapshot = t.events.iter().all(|e| e.snapshot);
            let ops = t
                .events
                .into_iter()
                .map(|e| retina_storage::TableOp {
                    table: catalog.resolve(e.table.name()).unwrap(),
                    op: e.op.into(),
                })
                .collect();
            txns.push((ops, snapshot));
        }
    }
    assert_eq!(asm.open_transaction(), None);
    assert_eq!(asm.duplicates_skipped(), 0, "transaction ids are unique");
    txns
}

/// The node reads back from `w`'s Debezium JSON exactly its transactions: the load as
/// snapshot reads, then the stream.
pub fn assert_reads_back(ddl: &str, source: &str, w: &impl Generated) {
    let parsed = parse(ddl, source, &w.json());
    assert_eq!(parsed.len(), w.load().len() + w.stream().len());
    let (load, stream) = parsed.split_at(w.load().len());
    for ((txn, snapshot), ours) in load.iter().zip(w.load()) {
        assert!(*snapshot, "the load is written as snapshot reads");
        // A snapshot read replays as an upsert of the row it read.
        let ours: Vec<_> = ours
            .iter()
            .map(|t| match &t.op {
                RowOp::Insert(row) => retina_storage::TableOp {
                    table: t.table,
                    op: RowOp::Upsert(row.clone()),
                },
                _ => panic!("the load only inserts"),
            })
            .collect();
        assert_eq!(txn, &ours);
    }
    for (i, ((txn, snapshot), ours)) in stream.iter().zip(w.stream()).enumerate() {
        assert!(!*snapshot);
        assert_eq!(txn, ours, "stream transaction {i}");
    }
}

/// `row`'s encoded primary key.
fn key(schema: &TableSchema, row: &[Value]) -> Vec<u8> {
    let mut k = Vec::new();
    schema.check_key(row).unwrap();
    retina_storage::key::encode_key(schema, row, &mut k);
    k
}

/// A plain model of the source database: rows by encoded primary key, per table.
pub struct Model {
    schemas: Vec<Arc<TableSchema>>,
    pub tables: Vec<BTreeMap<Vec<u8>, Vec<Value>>>,
    last_fresh: i64,
}

impl Model {
    pub fn new(schemas: Vec<Arc<TableSchema>>) -> Self {
        Model {
            tables: vec![BTreeMap::new(); schemas.len()],
            schemas,
            last_fresh: LOAD_US,
        }
    }

    /// Applies transaction `n`: inserts are new rows, every update's and delete's
    /// before-image is the stored row, keys never change; a load row's `fresh_ts` is
    /// [`LOAD_US`], a stream transaction writes one `fresh_ts`, later than the last.
    pub fn apply(&mut self, n: usize, txn: &Txn, in_stream: bool) {
        let mut fresh = None;
        for op in txn {
            let t = op.table as usize;
            let schema = self.schemas[t].clone();
            let fresh_col = schema.column_index("fresh_ts").unwrap();
            let written = match &op.op {
                RowOp::Insert(row) => {
                    schema.check_row(row).unwrap();
                    let old = self.tables[t].insert(key(&schema, row), row.clone());
                    assert!(
                        old.is_none(),
                        "txn {n}: insert of an existing {} row",
                        schema.name()
                    );
                    Some(row)
                }
                RowOp::Update { before, after } => {
                    schema.check_row(after).unwrap();
                    let k = key(&schema, before);
                    assert_eq!(k, key(&schema, after), "txn {n}: a key never changes");
                    let stored = self.tables[t].insert(k, after.clone());
                    assert_eq!(
                        stored.as_ref(),
                        Some(before),
                        "txn {n}: the before-image of a {} update is the stored row",
                        schema.name()
                    );
                    Some(after)
                }
                // Snapshot reads (the initial load) are upserts.
                RowOp::Upsert(row) => {
                    schema.check_row(row).unwrap();
                    self.tables[t].insert(key(&schema, row), row.clone());
                    Some(row)
                }
                RowOp::Truncate => panic!("txn {n}: the workloads never truncate"),
                RowOp::Delete(row) => {
                    let stored = self.tables[t].remove(&key(&schema, row));
                    assert_eq!(
                        stored.as_ref(),
                        Some(row),
                        "txn {n}: delete on {}",
                        schema.name()
                    );
                    None
                }
            };
            if let Some(row) = written {
                let Value::Timestamp(ts) = row[fresh_col] else {
                    panic!("fresh_ts is a timestamp")
                };
                if in_stream {
                    assert!(
                        fresh.is_none_or(|f| f == ts),
                        "one fresh_ts per transaction"
                    );
                    fresh = Some(ts);
                } else {
                    assert_eq!(ts, LOAD_US);
                }
            }
        }
        if let Some(ts) = fresh {
            assert!(ts > self.last_fresh, "fresh_ts increases");
            self.last_fresh = ts;
        }
    }

    /// Rows in table `t`.
    pub fn count(&self, t: u32) -> usize {
        self.tables[t as usize].len()
    }

    /// The storage engine agrees: every transaction of `txns` applies, and it holds the rows
    /// this model holds.
    pub fn assert_storage_agrees<'a>(&self, txns: impl IntoIterator<Item = &'a Txn>) {
        let mut shard = retina_storage::Shard::new(0, Default::default()).unwrap();
        for s in &self.schemas {
            shard.add_table(s.clone());
        }
        for (i, t) in txns.into_iter().enumerate() {
            let ts = retina_storage::Timestamp::new(i as u64 + 2).unwrap();
            shard
                .apply(ts, t)
                .unwrap_or_else(|e| panic!("txn {i}: {e}"));
        }
        for (t, rows) in self.tables.iter().enumerate() {
            assert_eq!(
                shard.live_keys(t as u32).unwrap(),
                rows.len(),
                "{}",
                self.schemas[t].name()
            );
        }
    }
}
