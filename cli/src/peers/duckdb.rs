//! DuckDB as a peer: an embedded transactional analytics database in a file, the tables created
//! from the same DDL (`bench/ddl/ch.sql`, primary keys included). The initial load goes through
//! DuckDB's appender. Each batch of source transactions the applier takes (every whole
//! transaction queued at that moment: one at low rates, more when DuckDB falls behind) is
//! collapsed per key, appended to a staging table per source table, and applied set-based in one
//! DuckDB transaction: `INSERT OR REPLACE INTO t SELECT ... FROM staged` for the newest rows and
//! `DELETE FROM t USING staged` for the deleted keys. (Row-at-a-time prepared statements ran at
//! about 1 ms each here, about 1K rows/s.) Readers are connections of the same database, each
//! query at the newest committed state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use duckdb::Connection;
use duckdb::types::{TimeUnit, Value as Duck};
use retina_bench::workload::Txn;
use retina_storage::{ColumnType, RowOp, TableSchema, Value};

use super::collapse::Collapsed;
use super::target::{Reader, Target, dir_bytes};

/// The statements that apply one table's staged changes.
struct TableSql {
    stage: String,
    upsert: String,
    delete: String,
    clear: String,
}

impl TableSql {
    fn new(schema: &TableSchema) -> Self {
        let name = schema.name();
        let stage = format!("_stage_{name}");
        let cols = schema
            .columns()
            .iter()
            .map(|c| c.name.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        let keys = schema
            .primary_key()
            .iter()
            .map(|&i| {
                let c = &schema.columns()[i].name;
                format!("{name}.{c} = s.{c}")
            })
            .collect::<Vec<_>>()
            .join(" AND ");
        TableSql {
            upsert: format!(
                "INSERT OR REPLACE INTO {name} SELECT {cols} FROM {stage} WHERE NOT _deleted"
            ),
            delete: format!("DELETE FROM {name} USING {stage} s WHERE {keys} AND s._deleted"),
            clear: format!("DELETE FROM {stage}"),
            stage,
        }
    }
}

pub(super) struct DuckDbTarget {
    conn: Connection,
    path: PathBuf,
    schemas: Vec<Arc<TableSchema>>,
    sql: Vec<TableSql>,
}

impl DuckDbTarget {
    pub(super) fn open(dir: &Path, schemas: &[Arc<TableSchema>]) -> anyhow::Result<Self> {
        let path = dir.join("ch.duckdb");
        let conn = Connection::open(&path).context("opening the DuckDB database")?;
        conn.execute_batch(retina_bench::chgen::DDL)
            .context("creating the tables from bench/ddl/ch.sql")?;
        let sql: Vec<TableSql> = schemas.iter().map(|s| TableSql::new(s)).collect();
        for (schema, sql) in schemas.iter().zip(&sql) {
            conn.execute_batch(&format!(
                "CREATE TABLE {} AS SELECT *, false AS _deleted FROM {} LIMIT 0",
                sql.stage,
                schema.name()
            ))?;
        }
        Ok(DuckDbTarget {
            conn,
            path,
            schemas: schemas.to_vec(),
            sql,
        })
    }

    /// Appends `rows` (with `_deleted` when `deleted` is given) through DuckDB's appender.
    fn append<'a>(
        &self,
        table: &str,
        schema: &TableSchema,
        rows: impl Iterator<Item = (&'a Vec<Value>, Option<bool>)>,
    ) -> anyhow::Result<()> {
        let mut appender = self.conn.appender(table)?;
        for (row, deleted) in rows {
            let mut values: Vec<Duck> = row
                .iter()
                .enumerate()
                .map(|(i, v)| duck(schema, i, v))
                .collect();
            values.extend(deleted.map(Duck::Boolean));
            let refs: Vec<&dyn duckdb::ToSql> =
                values.iter().map(|v| v as &dyn duckdb::ToSql).collect();
            appender.append_row(refs.as_slice())?;
        }
        appender.flush()?;
        Ok(())
    }
}

/// A value of column `col` as DuckDB takes it.
fn duck(schema: &TableSchema, col: usize, v: &Value) -> Duck {
    match (schema.columns()[col].ty, v) {
        (_, Value::Null) => Duck::Null,
        (_, Value::Boolean(b)) => Duck::Boolean(*b),
        (ColumnType::Int32, Value::Int(i)) => Duck::Int(*i as i32),
        (_, Value::Int(i)) => Duck::BigInt(*i),
        (ColumnType::Float32, Value::Float(f)) => Duck::Float(*f as f32),
        (_, Value::Float(f)) => Duck::Double(*f),
        (ColumnType::Decimal { precision, scale }, Value::Decimal(d)) => Duck::Decimal(
            duckdb::types::Decimal::new(precision, scale as u8, *d)
                .expect("the schema's precision and scale fit DuckDB's"),
        ),
        (_, Value::Decimal(d)) => Duck::HugeInt(*d),
        (_, Value::Utf8(s)) => Duck::Text(s.clone()),
        (_, Value::Date(d)) => Duck::Date32(*d),
        (_, Value::Timestamp(t)) => Duck::Timestamp(TimeUnit::Microsecond, *t),
        (_, Value::Time(t)) => Duck::Time64(TimeUnit::Microsecond, *t),
    }
}

impl Target for DuckDbTarget {
    fn load(&mut self, txns: &[Txn]) -> anyhow::Result<()> {
        for (t, schema) in self.schemas.iter().enumerate() {
            let rows = txns
                .iter()
                .flatten()
                .filter(|op| op.table as usize == t)
                .map(|op| match &op.op {
                    RowOp::Insert(row) => Ok((row, None)),
                    _ => anyhow::bail!("the initial load holds only inserts"),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            self.append(schema.name(), schema, rows.into_iter())?;
        }
        self.conn.execute_batch("CHECKPOINT")?;
        Ok(())
    }

    fn apply(&mut self, txns: Vec<Txn>) -> anyhow::Result<()> {
        let mut changes = Collapsed::new(&self.schemas);
        changes.add(txns);
        let mut changed = Vec::new();
        for (t, schema) in self.schemas.iter().enumerate() {
            let rows = changes.take(t);
            if !rows.is_empty() {
                self.append(
                    &self.sql[t].stage,
                    schema,
                    rows.values().map(|(d, r)| (r, Some(*d))),
                )?;
                changed.push(t);
            }
        }
        self.conn.execute_batch("BEGIN TRANSACTION")?;
        let applied = changed.iter().try_for_each(|&t| {
            let sql = &self.sql[t];
            self.conn.execute_batch(&sql.upsert)?;
            self.conn.execute_batch(&sql.delete)?;
            self.conn.execute_batch(&sql.clear)
        });
        match applied {
            Ok(()) => Ok(self.conn.execute_batch("COMMIT")?),
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e.into())
            }
        }
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        // Every transaction is committed when `apply` returns.
        Ok(())
    }

    fn reader(&self) -> anyhow::Result<Box<dyn Reader>> {
        Ok(Box::new(DuckDbReader {
            conn: self.conn.try_clone()?,
        }))
    }

    fn disk_bytes(&self) -> u64 {
        dir_bytes(self.path.parent().expect("the database is in a directory"))
    }
}

struct DuckDbReader {
    conn: Connection,
}

impl Reader for DuckDbReader {
    fn ints(&mut self, sql: &str) -> anyhow::Result<Vec<Option<i64>>> {
        let mut stmt = self.conn.prepare(sql)?;
        let mut rows = stmt.query([])?;
        let row = rows.next()?.context("the query returned no row")?;
        let n = row.as_ref().column_count();
        (0..n).map(|i| Ok(row.get::<_, Option<i64>>(i)?)).collect()
    }

    fn rows(&mut self, sql: &str) -> anyhow::Result<usize> {
        let mut stmt = self.conn.prepare(sql)?;
        let mut rows = stmt.query([])?;
        let mut n = 0;
        while rows.next()?.is_some() {
            n += 1;
        }
        Ok(n)
    }

    fn max_fresh_us(&mut self) -> anyhow::Result<Option<i64>> {
        Ok(self
            .ints("SELECT epoch_us(max(fresh_ts)) FROM district")?
            .first()
            .copied()
            .flatten())
    }
}
