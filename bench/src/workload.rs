//! What the workload generators share: a transaction as row operations, the clock that stamps
//! `fresh_ts`, the initial load handed out from a queue in transactions of a set size, the
//! self-check of a stream's shape, and the writer of Debezium JSON lines (the PostgreSQL
//! connector's format with transaction metadata).

use std::collections::VecDeque;
use std::fmt;
use std::io::Write;
use std::sync::Arc;

use retina_storage::{ColumnType, RowOp, TableId, TableOp, TableSchema, Value};

/// A transaction: row operations in order.
pub type Txn = Vec<TableOp<Vec<Value>>>;

/// The time an initial load is stamped with (2026-01-01T00:00:00Z, in microseconds): every
/// load row's `fresh_ts`. A snapshot reads rows written before it began, so one stamp for all
/// of them is what a source database would hold.
pub const LOAD_US: i64 = 1_767_225_600_000_000;

/// Where `fresh_ts` values come from: a logical clock (deterministic bytes for a seed) or the
/// wall clock (for a stream emitted at a rate, where `fresh_ts` must be the emit time).
#[derive(Clone, Copy, Debug)]
pub enum FreshClock {
    /// `next_us`, then `step_us` later for each transaction.
    Logical {
        next_us: i64,
        step_us: i64,
    },
    Wall,
}

impl FreshClock {
    /// One millisecond per transaction, starting a second after the load.
    pub fn logical() -> Self {
        FreshClock::Logical {
            next_us: LOAD_US + 1_000_000,
            step_us: 1000,
        }
    }

    pub fn now_us(&mut self) -> i64 {
        match self {
            FreshClock::Logical { next_us, step_us } => {
                let now = *next_us;
                *next_us += *step_us;
                now
            }
            FreshClock::Wall => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("the clock is after 1970")
                .as_micros() as i64,
        }
    }
}

/// Sets `fresh_ts` of every after-image in `txn` to `now_us` (a driver emitting a stream at a
/// rate stamps each transaction as it emits it); `fresh_cols[t]` is table `t`'s column.
pub fn stamp_fresh(txn: &mut [TableOp<Vec<Value>>], now_us: i64, fresh_cols: &[usize]) {
    for op in txn {
        let col = fresh_cols[op.table as usize];
        match &mut op.op {
            RowOp::Insert(r) | RowOp::Update { after: r, .. } | RowOp::Upsert(r) => {
                r[col] = Value::Timestamp(now_us)
            }
            RowOp::Delete(_) | RowOp::Truncate => {}
        }
    }
}

pub(crate) fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("the model holds an integer here, not {other:?}"),
    }
}

pub(crate) fn decimal(v: &Value) -> i128 {
    match v {
        Value::Decimal(d) => *d,
        other => panic!("the model holds a decimal here, not {other:?}"),
    }
}

pub(crate) fn insert(table: TableId, row: Vec<Value>) -> TableOp<Vec<Value>> {
    TableOp {
        table,
        op: RowOp::Insert(row),
    }
}

pub(crate) fn update(table: TableId, before: Vec<Value>, after: Vec<Value>) -> TableOp<Vec<Value>> {
    TableOp {
        table,
        op: RowOp::Update { before, after },
    }
}

// ---- The initial load ----

/// A generator whose initial load is made a unit at a time (a table, a warehouse, a run of
/// ids) onto a queue of inserts and handed out from it in transactions of a set size. The
/// generators keep their public `next_load_txn` / `load` as inherent methods that call these.
pub(crate) trait QueuedLoad {
    /// The load's inserts generated and not yet handed out.
    fn load_queue(&mut self) -> &mut VecDeque<TableOp<Vec<Value>>>;

    /// Whether every unit of the load has been generated.
    fn load_generated(&self) -> bool;

    /// Generates the next unit of the load onto the queue (nothing once it is all generated).
    fn load_next_unit(&mut self);

    /// The next transaction of the initial load: up to `rows_per_txn` inserts. `None` once
    /// the load is complete.
    fn next_load_txn(&mut self, rows_per_txn: usize) -> Option<Txn> {
        assert!(
            rows_per_txn > 0,
            "a load transaction holds at least one row"
        );
        while self.load_queue().len() < rows_per_txn && !self.load_generated() {
            self.load_next_unit();
        }
        let queue = self.load_queue();
        if queue.is_empty() {
            return None;
        }
        let n = rows_per_txn.min(queue.len());
        Some(queue.drain(..n).collect())
    }

    /// The whole initial load, in transactions of `rows_per_txn` inserts.
    fn load(&mut self, rows_per_txn: usize) -> Vec<Txn> {
        std::iter::from_fn(|| self.next_load_txn(rows_per_txn)).collect()
    }

    /// Generates (and drops) the rest of the load, if it was not drained: the stream updates
    /// the load's rows, so its model must hold them all.
    fn finish_load(&mut self) {
        while !(self.load_generated() && self.load_queue().is_empty()) {
            self.load_queue().clear();
            self.load_next_unit();
        }
    }
}

// ---- Self-check ----

/// Operations on one table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableCounts {
    pub inserts: u64,
    pub updates: u64,
    pub deletes: u64,
}

impl TableCounts {
    pub fn rows(&self) -> u64 {
        self.inserts + self.updates + self.deletes
    }
}

/// The shape of a run of transactions: rows per transaction, insert/update/delete shares and
/// per-table shares (bench/README.md says what each workload's stream should show).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfCheck {
    pub transactions: u64,
    /// Per table, by table id: its name and counts.
    pub tables: Vec<(String, TableCounts)>,
}

impl SelfCheck {
    pub fn new(schemas: &[Arc<TableSchema>]) -> Self {
        SelfCheck {
            transactions: 0,
            tables: schemas
                .iter()
                .map(|s| (s.name().to_owned(), TableCounts::default()))
                .collect(),
        }
    }

    /// The self-check of `txns` on `schemas`' tables.
    pub fn of(schemas: &[Arc<TableSchema>], txns: &[Txn]) -> Self {
        let mut check = SelfCheck::new(schemas);
        txns.iter().for_each(|t| check.add(t));
        check
    }

    pub fn add(&mut self, txn: &[TableOp<Vec<Value>>]) {
        self.transactions += 1;
        for op in txn {
            let counts = &mut self.tables[op.table as usize].1;
            match op.op {
                RowOp::Insert(_) | RowOp::Upsert(_) => counts.inserts += 1,
                RowOp::Update { .. } => counts.updates += 1,
                RowOp::Delete(_) | RowOp::Truncate => counts.deletes += 1,
            }
        }
    }

    fn total(&self) -> TableCounts {
        self.tables
            .iter()
            .fold(TableCounts::default(), |a, (_, t)| TableCounts {
                inserts: a.inserts + t.inserts,
                updates: a.updates + t.updates,
                deletes: a.deletes + t.deletes,
            })
    }

    pub fn rows(&self) -> u64 {
        self.total().rows()
    }

    pub fn rows_per_txn(&self) -> f64 {
        self.rows() as f64 / self.transactions.max(1) as f64
    }

    fn share(&self, n: u64) -> f64 {
        n as f64 / self.rows().max(1) as f64
    }

    /// Shares of all rows, 0..=1.
    pub fn insert_share(&self) -> f64 {
        self.share(self.total().inserts)
    }

    pub fn update_share(&self) -> f64 {
        self.share(self.total().updates)
    }

    pub fn delete_share(&self) -> f64 {
        self.share(self.total().deletes)
    }

    /// The share of all rows on table `name` (0 for a table it does not know).
    pub fn table_share(&self, name: &str) -> f64 {
        self.tables
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0.0, |(_, t)| self.share(t.rows()))
    }
}

impl fmt::Display for SelfCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |x: f64| format!("{:.1}%", 100.0 * x);
        writeln!(
            f,
            "{} transactions, {} rows, {:.2} rows/transaction; c {} / u {} / d {}",
            self.transactions,
            self.rows(),
            self.rows_per_txn(),
            pct(self.insert_share()),
            pct(self.update_share()),
            pct(self.delete_share()),
        )?;
        let w = self
            .tables
            .iter()
            .map(|(n, _)| n.len())
            .max()
            .unwrap_or(0)
            .max(10);
        writeln!(
            f,
            "{:<w$} {:>10} {:>7} {:>10} {:>10} {:>10}",
            "table", "rows", "share", "inserts", "updates", "deletes"
        )?;
        let mut tables: Vec<_> = self.tables.iter().filter(|(_, t)| t.rows() > 0).collect();
        tables.sort_by_key(|(name, t)| (std::cmp::Reverse(t.rows()), name.clone()));
        for (name, t) in tables {
            writeln!(
                f,
                "{:<w$} {:>10} {:>7} {:>10} {:>10} {:>10}",
                name,
                t.rows(),
                pct(self.share(t.rows())),
                t.inserts,
                t.updates,
                t.deletes
            )?;
        }
        Ok(())
    }
}

// ---- Debezium JSON ----

/// How an insert is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertOp {
    /// `c`: a row the source created.
    Create,
    /// `r`: a snapshot read (the initial load).
    Read,
}

/// Writes transactions as Debezium JSON lines the way a PostgreSQL connector with
/// `provide.transaction.metadata=true` and `schemas.enable=false` does: BEGIN, the change
/// events (columns in table order, decimals as strings, timestamps as microseconds), END with
/// its per-table counts. Transaction ids count up from 1 across every call, so a load and a
/// stream written through one writer never share an id.
pub struct DebeziumWriter {
    schemas: Vec<Arc<TableSchema>>,
    /// Each table's `fresh_ts` column, which dates `ts_ms`.
    fresh: Vec<Option<usize>>,
    /// The connector's logical name and the source database, in every event's `source`.
    database: String,
    next_id: u64,
    line: Vec<u8>,
}

impl DebeziumWriter {
    pub fn new(schemas: Vec<Arc<TableSchema>>) -> Self {
        let fresh = schemas.iter().map(|s| s.column_index("fresh_ts")).collect();
        DebeziumWriter {
            schemas,
            fresh,
            database: "ch".into(),
            next_id: 1,
            line: Vec::with_capacity(4096),
        }
    }

    /// Names the source (the connector and its database) `database` instead of `ch`.
    pub fn with_database(mut self, database: &str) -> Self {
        self.database = database.into();
        self
    }

    /// Numbers the transactions from `id` instead of 1.
    pub fn numbered_from(mut self, id: u64) -> Self {
        self.next_id = id;
        self
    }

    /// The id the next transaction gets.
    pub fn next_id(&self) -> u64 {
        self.next_id
    }

    /// Writes one transaction; `ts_ms` is its newest `fresh_ts` (the time it was emitted).
    pub fn write_txn(
        &mut self,
        out: &mut impl Write,
        txn: &[TableOp<Vec<Value>>],
        insert: InsertOp,
    ) -> std::io::Result<()> {
        let id = self.next_id;
        self.next_id += 1;
        let ts_ms = txn
            .iter()
            .filter_map(|op| {
                let row = match &op.op {
                    RowOp::Insert(r)
                    | RowOp::Update { after: r, .. }
                    | RowOp::Delete(r)
                    | RowOp::Upsert(r) => r,
                    RowOp::Truncate => return None,
                };
                match self.fresh[op.table as usize].map(|i| &row[i]) {
                    Some(Value::Timestamp(t)) => Some(t.div_euclid(1000)),
                    _ => None,
                }
            })
            .max()
            .unwrap_or(0);
        writeln!(
            out,
            r#"{{"status":"BEGIN","id":"{id}","ts_ms":{ts_ms},"event_count":null,"data_collections":null}}"#
        )?;
        // Tables in order of first appearance, with their event counts.
        let mut per_table: Vec<(TableId, u64)> = Vec::new();
        for (i, op) in txn.iter().enumerate() {
            let order = match per_table.iter_mut().find(|(t, _)| *t == op.table) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    per_table.push((op.table, 1));
                    1
                }
            };
            self.line.clear();
            self.event(op, insert, id, ts_ms, i as u64 + 1, order)?;
            out.write_all(&self.line)?;
        }
        write!(
            out,
            r#"{{"status":"END","id":"{id}","ts_ms":{ts_ms},"event_count":{},"data_collections":["#,
            txn.len()
        )?;
        for (k, (t, n)) in per_table.iter().enumerate() {
            let sep = if k == 0 { "" } else { "," };
            write!(
                out,
                r#"{sep}{{"data_collection":"public.{}","event_count":{n}}}"#,
                self.schemas[*t as usize].name()
            )?;
        }
        writeln!(out, "]}}")
    }

    fn event(
        &mut self,
        op: &TableOp<Vec<Value>>,
        insert: InsertOp,
        id: u64,
        ts_ms: i64,
        total_order: u64,
        collection_order: u64,
    ) -> std::io::Result<()> {
        let t = op.table as usize;
        let (code, before, after) = match &op.op {
            RowOp::Insert(r) => (
                match insert {
                    InsertOp::Create => "c",
                    InsertOp::Read => "r",
                },
                None,
                Some(r),
            ),
            RowOp::Update { before, after } => ("u", Some(before), Some(after)),
            RowOp::Delete(r) => ("d", Some(r), None),
            RowOp::Upsert(r) => ("r", None, Some(r)),
            RowOp::Truncate => ("t", None, None),
        };
        self.line.extend_from_slice(br#"{"before":"#);
        self.image(t, before)?;
        self.line.extend_from_slice(br#","after":"#);
        self.image(t, after)?;
        let snapshot = code == "r";
        write!(
            self.line,
            r#","source":{{"connector":"postgresql","name":"{db}","ts_ms":{ts_ms},"snapshot":"{snapshot}","db":"{db}","schema":"public","table":"{}"}},"op":"{code}","ts_ms":{ts_ms},"transaction":{{"id":"{id}","total_order":{total_order},"data_collection_order":{collection_order}}}}}"#,
            self.schemas[t].name(),
            db = self.database
        )?;
        self.line.push(b'\n');
        Ok(())
    }

    fn image(&mut self, t: usize, row: Option<&Vec<Value>>) -> std::io::Result<()> {
        let Some(row) = row else {
            self.line.extend_from_slice(b"null");
            return Ok(());
        };
        let schema = &self.schemas[t];
        self.line.push(b'{');
        for (k, (c, v)) in schema.columns().iter().zip(row).enumerate() {
            if k > 0 {
                self.line.push(b',');
            }
            serde_json::to_writer(&mut self.line, &c.name)?;
            self.line.push(b':');
            json_value(&mut self.line, c.ty, v)?;
        }
        self.line.push(b'}');
        Ok(())
    }
}

/// Writes a generated workload through `writer`: the load as snapshot reads (`r`), then the
/// stream.
pub(crate) fn write_load_and_stream(
    mut writer: DebeziumWriter,
    out: &mut impl Write,
    load: &[Txn],
    stream: &[Txn],
) -> std::io::Result<()> {
    for txn in load {
        writer.write_txn(out, txn, InsertOp::Read)?;
    }
    for txn in stream {
        writer.write_txn(out, txn, InsertOp::Create)?;
    }
    Ok(())
}

/// A value as Debezium's JSON converter writes it with `decimal.handling.mode=string` and
/// `time.precision.mode=adaptive_time_microseconds`.
fn json_value(out: &mut Vec<u8>, ty: ColumnType, v: &Value) -> std::io::Result<()> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Boolean(b) => write!(out, "{b}")?,
        Value::Int(i) | Value::Timestamp(i) | Value::Time(i) => write!(out, "{i}")?,
        Value::Date(d) => write!(out, "{d}")?,
        Value::Float(f) if f.is_finite() => serde_json::to_writer(&mut *out, f)?,
        Value::Float(f) if f.is_nan() => out.extend_from_slice(b"\"NaN\""),
        Value::Float(f) if *f > 0.0 => out.extend_from_slice(b"\"Infinity\""),
        Value::Float(_) => out.extend_from_slice(b"\"-Infinity\""),
        Value::Utf8(s) => serde_json::to_writer(&mut *out, s)?,
        Value::Decimal(d) => {
            let scale = match ty {
                ColumnType::Decimal { scale, .. } => scale.max(0) as u32,
                _ => 0,
            };
            let sign = if *d < 0 { "-" } else { "" };
            let p = 10u128.pow(scale);
            let (whole, frac) = (d.unsigned_abs() / p, d.unsigned_abs() % p);
            if scale == 0 {
                write!(out, "\"{sign}{whole}\"")?;
            } else {
                write!(out, "\"{sign}{whole}.{frac:0w$}\"", w = scale as usize)?;
            }
        }
    }
    Ok(())
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_written_at_their_scale() {
        let mut out = Vec::new();
        let d = ColumnType::Decimal {
            precision: 6,
            scale: 2,
        };
        for v in [-1000, -5, 0, 123_456] {
            json_value(&mut out, d, &Value::Decimal(v)).unwrap();
            out.push(b' ');
        }
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#""-10.00" "-0.05" "0.00" "1234.56" "#
        );
    }
}
