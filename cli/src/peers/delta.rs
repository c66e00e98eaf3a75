//! Delta Lake as a peer, through delta-rs, the lakehouse way: one Delta table per source table
//! in a local folder; the initial load written as each table's first version; changes buffered
//! in memory (collapsed to each key's newest image or its deletion) and MERGEd into the tables
//! every commit interval: `MERGE ... WHEN MATCHED AND deleted THEN DELETE WHEN MATCHED THEN
//! UPDATE WHEN NOT MATCHED AND NOT deleted THEN INSERT`, one Delta commit per changed table
//! (Delta Lake has no transaction across tables), files rewritten copy-on-write as delta-rs
//! does it. Readers refresh each table they query to its newest version and scan it through
//! delta-rs's DataFusion provider: the same SQL engine Retina's connector uses.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use arrow::array::{ArrayRef, BooleanArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use deltalake::DeltaTable;
use deltalake::datafusion::prelude::SessionContext;
use retina_bench::workload::Txn;
use retina_storage::{RowOp, TableSchema, Value, user_columns};

use super::collapse::{Collapsed, KeyChanges};
use super::target::{Reader, Target, dir_bytes, first_row_ints};

/// The merge source's column that marks a deletion.
const DELETED: &str = "_deleted";

pub(super) struct DeltaTarget {
    runtime: tokio::runtime::Runtime,
    root: std::path::PathBuf,
    schemas: Vec<Arc<TableSchema>>,
    /// Each table's newest version as this writer committed it (taken while an operation runs).
    tables: Vec<Option<DeltaTable>>,
    /// The changes since the last commit.
    pending: Collapsed,
    commit_every: Duration,
    next_commit: Instant,
}

impl DeltaTarget {
    pub(super) fn create(
        dir: &Path,
        schemas: &[Arc<TableSchema>],
        commit_every: Duration,
    ) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let root = dir.join("delta");
        let tables = schemas
            .iter()
            .map(|s| {
                let url = deltalake::ensure_table_uri(root.join(s.name()).to_string_lossy())?;
                // Not loaded: the folder is empty, and the first write creates the table.
                Ok(Some(deltalake::DeltaTableBuilder::from_url(url)?.build()?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(DeltaTarget {
            runtime,
            root,
            schemas: schemas.to_vec(),
            tables,
            pending: Collapsed::new(schemas),
            commit_every,
            next_commit: Instant::now() + commit_every,
        })
    }

    /// MERGEs every table's buffered changes, one Delta commit per changed table.
    fn commit(&mut self) -> anyhow::Result<()> {
        for t in 0..self.schemas.len() {
            let changes = self.pending.take(t);
            if changes.is_empty() {
                continue;
            }
            let schema = self.schemas[t].clone();
            let table = self.tables[t].take().expect("a table between operations");
            let merged = self
                .runtime
                .block_on(merge(table, &schema, changes))
                .with_context(|| format!("MERGE into {}", schema.name()))?;
            self.tables[t] = Some(merged);
        }
        Ok(())
    }
}

/// The table's arrow schema (without Retina's `_create_ts`).
fn arrow_schema(schema: &TableSchema) -> Schema {
    let stored = schema.arrow_schema();
    Schema::new(stored.fields()[..schema.columns().len()].to_vec())
}

async fn merge(
    table: DeltaTable,
    schema: &TableSchema,
    changes: KeyChanges,
) -> anyhow::Result<DeltaTable> {
    let mut fields = arrow_schema(schema).fields().to_vec();
    fields.push(Arc::new(Field::new(DELETED, DataType::Boolean, false)));
    let rows: Vec<&(bool, Vec<Value>)> = changes.values().collect();
    let mut columns = user_columns(schema, rows.iter().map(|(_, r)| r));
    columns.push(Arc::new(BooleanArray::from(
        rows.iter().map(|(d, _)| *d).collect::<Vec<_>>(),
    )) as ArrayRef);
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
    let source = SessionContext::new().read_batch(batch)?;
    let cols = schema.columns();
    let key = schema.primary_key();
    let predicate = key
        .iter()
        .map(|&i| format!("target.{0} = source.{0}", cols[i].name))
        .collect::<Vec<_>>()
        .join(" AND ");
    let (table, _metrics) = table
        .merge(source, predicate)
        .with_source_alias("source")
        .with_target_alias("target")
        .when_matched_delete(|d| d.predicate(format!("source.{DELETED}")))?
        .when_matched_update(|u| {
            (0..cols.len())
                .filter(|i| !key.contains(i))
                .fold(u, |u, i| {
                    u.update(cols[i].name.as_str(), format!("source.{}", cols[i].name))
                })
        })?
        .when_not_matched_insert(|ins| {
            cols.iter()
                .fold(ins.predicate(format!("NOT source.{DELETED}")), |ins, c| {
                    ins.set(c.name.as_str(), format!("source.{}", c.name))
                })
        })?
        .await?;
    Ok(table)
}

impl Target for DeltaTarget {
    fn load(&mut self, txns: &[Txn]) -> anyhow::Result<()> {
        let mut rows: Vec<Vec<&Vec<Value>>> = self.schemas.iter().map(|_| Vec::new()).collect();
        for op in txns.iter().flatten() {
            let RowOp::Insert(row) = &op.op else {
                anyhow::bail!("the initial load holds only inserts");
            };
            rows[op.table as usize].push(row);
        }
        for (t, rows) in rows.into_iter().enumerate() {
            let schema = &self.schemas[t];
            let batch = RecordBatch::try_new(
                Arc::new(arrow_schema(schema)),
                user_columns(schema, rows.into_iter()),
            )?;
            let table = self.tables[t].take().expect("a table between operations");
            let written = self
                .runtime
                .block_on(async { table.write(vec![batch]).await })
                .with_context(|| format!("writing {}", schema.name()))?;
            self.tables[t] = Some(written);
        }
        self.next_commit = Instant::now() + self.commit_every;
        Ok(())
    }

    fn apply(&mut self, txns: Vec<Txn>) -> anyhow::Result<()> {
        self.pending.add(txns);
        Ok(())
    }

    fn tick(&mut self) -> anyhow::Result<()> {
        let now = Instant::now();
        if now >= self.next_commit {
            self.next_commit = now + self.commit_every;
            self.commit()?;
        }
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        self.commit()
    }

    fn reader(&self) -> anyhow::Result<Box<dyn Reader>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let tables = self
            .schemas
            .iter()
            .map(|s| {
                let url = deltalake::ensure_table_uri(self.root.join(s.name()).to_string_lossy())?;
                Ok((
                    s.name().to_owned(),
                    runtime.block_on(deltalake::open_table(url))?,
                ))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Box::new(DeltaReader { runtime, tables }))
    }

    fn disk_bytes(&self) -> u64 {
        dir_bytes(&self.root)
    }
}

struct DeltaReader {
    runtime: tokio::runtime::Runtime,
    tables: Vec<(String, DeltaTable)>,
}

impl DeltaReader {
    /// Runs `sql` over the newest version of every table it names.
    fn collect(&mut self, sql: &str) -> anyhow::Result<Vec<RecordBatch>> {
        let words: Vec<&str> = sql
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .collect();
        self.runtime.block_on(async {
            let ctx = SessionContext::new();
            for (name, table) in &mut self.tables {
                if !words.contains(&name.as_str()) {
                    continue;
                }
                table.update_incremental(None).await?;
                table.update_datafusion_session(&ctx.state())?;
                ctx.register_table(name.as_str(), table.table_provider().await?)?;
            }
            anyhow::Ok(ctx.sql(sql).await?.collect().await?)
        })
    }
}

impl Reader for DeltaReader {
    fn ints(&mut self, sql: &str) -> anyhow::Result<Vec<Option<i64>>> {
        first_row_ints(&self.collect(sql)?)
    }

    fn rows(&mut self, sql: &str) -> anyhow::Result<usize> {
        Ok(self.collect(sql)?.iter().map(|b| b.num_rows()).sum())
    }
}
