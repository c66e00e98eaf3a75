//! DuckDB as a peer: an embedded transactional analytics database in a file, the tables created
//! from the same DDL (`bench/ddl/ch.sql`, primary keys included). The initial load goes through
//! DuckDB's appender; each batch of source transactions the applier takes (every whole
//! transaction queued at that moment: one at low rates, more when DuckDB falls behind) is one
//! DuckDB transaction of prepared `INSERT`, `UPDATE ... WHERE key` and `DELETE ... WHERE key`
//! statements. Readers are connections of the same database, each query at the newest committed
//! state.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use duckdb::types::{TimeUnit, Value as Duck};
use duckdb::{Connection, params_from_iter};
use retina_bench::workload::Txn;
use retina_storage::{ColumnType, RowOp, TableSchema, Value};

use super::{Reader, Target, dir_bytes};

/// The statements that apply a row operation to one table.
struct TableSql {
    insert: String,
    update: String,
    delete: String,
    /// Positions of the key columns, and of the others in `update`'s `SET` order.
    key: Vec<usize>,
    rest: Vec<usize>,
}

impl TableSql {
    fn new(schema: &TableSchema) -> Self {
        let cols = schema.columns();
        let key = schema.primary_key().to_vec();
        let rest: Vec<usize> = (0..cols.len()).filter(|i| !key.contains(i)).collect();
        let name = schema.name();
        let marks = vec!["?"; cols.len()].join(", ");
        let set = rest
            .iter()
            .map(|&i| format!("{} = ?", cols[i].name))
            .collect::<Vec<_>>()
            .join(", ");
        let wher = key
            .iter()
            .map(|&i| format!("{} = ?", cols[i].name))
            .collect::<Vec<_>>()
            .join(" AND ");
        TableSql {
            insert: format!("INSERT INTO {name} VALUES ({marks})"),
            update: format!("UPDATE {name} SET {set} WHERE {wher}"),
            delete: format!("DELETE FROM {name} WHERE {wher}"),
            key,
            rest,
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
        // Three statements per table.
        conn.set_prepared_statement_cache_capacity(3 * schemas.len() + 8);
        Ok(DuckDbTarget {
            conn,
            path,
            schemas: schemas.to_vec(),
            sql: schemas.iter().map(|s| TableSql::new(s)).collect(),
        })
    }

    fn apply_op(&self, table: usize, op: &RowOp<Vec<Value>>) -> anyhow::Result<()> {
        let schema = &self.schemas[table];
        let sql = &self.sql[table];
        let changed = match op {
            RowOp::Insert(row) => {
                self.conn
                    .prepare_cached(&sql.insert)?
                    .execute(params_from_iter(
                        row.iter().enumerate().map(|(i, v)| duck(schema, i, v)),
                    ))?
            }
            RowOp::Update { after, .. } => {
                self.conn
                    .prepare_cached(&sql.update)?
                    .execute(params_from_iter(
                        sql.rest
                            .iter()
                            .chain(&sql.key)
                            .map(|&i| duck(schema, i, &after[i])),
                    ))?
            }
            RowOp::Delete(before) => {
                self.conn
                    .prepare_cached(&sql.delete)?
                    .execute(params_from_iter(
                        sql.key.iter().map(|&i| duck(schema, i, &before[i])),
                    ))?
            }
        };
        anyhow::ensure!(
            changed == 1,
            "{} of a {} row changed {changed} rows",
            match op {
                RowOp::Insert(_) => "an insert",
                RowOp::Update { .. } => "an update",
                RowOp::Delete(_) => "a delete",
            },
            schema.name()
        );
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
    }
}

impl Target for DuckDbTarget {
    fn load(&mut self, txns: &[Txn]) -> anyhow::Result<()> {
        let mut appenders = self
            .schemas
            .iter()
            .map(|s| self.conn.appender(s.name()))
            .collect::<duckdb::Result<Vec<_>>>()?;
        for op in txns.iter().flatten() {
            let RowOp::Insert(row) = &op.op else {
                anyhow::bail!("the initial load holds only inserts");
            };
            let schema = &self.schemas[op.table as usize];
            let values: Vec<Duck> = row
                .iter()
                .enumerate()
                .map(|(i, v)| duck(schema, i, v))
                .collect();
            let refs: Vec<&dyn duckdb::ToSql> =
                values.iter().map(|v| v as &dyn duckdb::ToSql).collect();
            appenders[op.table as usize].append_row(refs.as_slice())?;
        }
        for mut a in appenders {
            a.flush()?;
        }
        self.conn.execute_batch("CHECKPOINT")?;
        Ok(())
    }

    fn apply(&mut self, txns: Vec<Txn>) -> anyhow::Result<()> {
        self.conn.execute_batch("BEGIN TRANSACTION")?;
        let applied = txns
            .iter()
            .flatten()
            .try_for_each(|op| self.apply_op(op.table as usize, &op.op));
        match applied {
            Ok(()) => Ok(self.conn.execute_batch("COMMIT")?),
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e)
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
