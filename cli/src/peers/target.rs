//! What a system measured by `retina bench peers` implements, and helpers for implementing it.

use std::path::Path;

use anyhow::Context;
use arrow::record_batch::RecordBatch;
use retina_bench::workload::Txn;

/// A system the stream is replayed into.
pub(super) trait Target {
    /// Applies the initial load, whole, before the clock starts; returns once it is visible.
    fn load(&mut self, txns: &[Txn]) -> anyhow::Result<()>;
    /// Takes source transactions, whole and in order: returns once they are handed over
    /// (Retina), committed (DuckDB) or buffered (Delta Lake).
    fn apply(&mut self, txns: Vec<Txn>) -> anyhow::Result<()>;
    /// Called between applies and when idle: time-driven work (Delta Lake's commits).
    fn tick(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Makes every transaction taken so far visible to readers, and waits for that.
    fn finish(&mut self) -> anyhow::Result<()>;
    /// A reader with its own connection, for another thread.
    fn reader(&self) -> anyhow::Result<Box<dyn Reader>>;
    /// What the system holds on disk, in bytes.
    fn disk_bytes(&self) -> u64;
}

/// Queries on one connection, each at the newest snapshot the system shows.
pub(super) trait Reader: Send {
    /// One row of integers (NULL as `None`).
    fn ints(&mut self, sql: &str) -> anyhow::Result<Vec<Option<i64>>>;
    /// Runs a query to the end; returns its rows.
    fn rows(&mut self, sql: &str) -> anyhow::Result<usize>;
    /// `max(fresh_ts)` of district in microseconds since the epoch.
    fn max_fresh_us(&mut self) -> anyhow::Result<Option<i64>> {
        Ok(self
            .ints("SELECT CAST(max(fresh_ts) AS BIGINT) FROM district")?
            .first()
            .copied()
            .flatten())
    }
}

/// The first row of a result, every column cast to a 64-bit integer.
pub(super) fn first_row_ints(batches: &[RecordBatch]) -> anyhow::Result<Vec<Option<i64>>> {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::{DataType, Int64Type};
    let batch = batches
        .iter()
        .find(|b| b.num_rows() > 0)
        .context("the query returned no row")?;
    batch
        .columns()
        .iter()
        .map(|c| {
            let c = arrow::compute::cast(&c.slice(0, 1), &DataType::Int64)?;
            let c = c.as_primitive::<Int64Type>();
            Ok(c.is_valid(0).then(|| c.value(0)))
        })
        .collect()
}

/// Bytes of the files under `dir`.
pub(super) fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            _ => e.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}
