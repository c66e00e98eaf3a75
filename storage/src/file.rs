//! Parquet files: how blocks and combined files are written (statistics on, `_create_ts`
//! delta-encoded), and how a snapshot reads them with VFoR (vectorized filter on read):
//! row groups created after the snapshot are skipped, `_create_ts <= snapshot` is checked only
//! where a row group's max exceeds the snapshot, and the visibility bitmap masks deleted rows.

use std::sync::Arc;

use arrow::array::{Array, BooleanArray, Int64Array, RecordBatch};
use arrow::compute::filter_record_batch;
use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parquet::arrow::ArrowWriter;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{
    ArrowPredicateFn, ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReaderBuilder,
    RowFilter, RowSelection, RowSelector,
};
use parquet::basic::{Compression, Encoding, ZstdLevel};
use parquet::column::writer::ColumnCloseResult;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use parquet::file::properties::{EnabledStatistics, WriterProperties, WriterPropertiesBuilder};
use parquet::file::statistics::Statistics;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::ColumnPath;

use crate::buffer::{CombineJob, CombineKind, FlushJob, ObjectFacts};
use crate::config::StorageConfig;
use crate::error::{Result, StorageError};
use crate::index::FileId;
use crate::schema::{CREATE_TS_COLUMN, TableSchema};
use crate::ts::{Timestamp, is_visible};

/// Writer settings for the Parquet files the engine writes: combined and rewritten files.
///
/// `_create_ts` is non-decreasing within a file (rows are appended in timestamp order), so it
/// is DELTA_BINARY_PACKED without a dictionary: a bulk load (one timestamp) costs almost
/// nothing, a replayed stream a bit or two per row before compression.
pub fn writer_properties(config: &StorageConfig) -> WriterProperties {
    let compression = match config.zstd_level {
        0 => Compression::UNCOMPRESSED,
        level => Compression::ZSTD(ZstdLevel::try_new(level).expect("level was validated")),
    };
    properties(config, compression).build()
}

/// Writer settings for write-buffer blocks: objects of a few thousand rows that every query
/// reads until their virtual file is combined. They are LZ4 (raw) compressed: parquet-rs sets
/// up a zstd compression and decompression context for every column chunk it reads or writes,
/// which for a block costs more than its data (measured with `retina bench peers`: CH Q1 over
/// 1.2M order lines in blocks 121 ms with zstd, 68 ms with LZ4). Combined files, which stay,
/// get zstd.
///
/// Blocks have no dictionaries: queries read a block only until a segment or its combined file
/// replaces it, and building a dictionary hashes every value of every column (in `retina bench
/// replay`, a third of the writer's time went to it). Segments, which queries read in place of
/// their blocks until the file is combined, keep theirs ([`segment_writer_properties`]): without
/// them queries over unfilled files were about 10% slower (`retina bench overhead`).
pub fn block_writer_properties(config: &StorageConfig) -> WriterProperties {
    lz4_properties(config).set_dictionary_enabled(false).build()
}

/// Writer settings for segments: as blocks, with dictionaries.
pub fn segment_writer_properties(config: &StorageConfig) -> WriterProperties {
    lz4_properties(config).build()
}

fn lz4_properties(config: &StorageConfig) -> WriterPropertiesBuilder {
    let compression = match config.zstd_level {
        0 => Compression::UNCOMPRESSED,
        _ => Compression::LZ4_RAW,
    };
    properties(config, compression)
}

/// Every kind of object: no bloom filters (readers skip looking for them, see the connector's
/// scans), chunk statistics, `_create_ts` delta-encoded.
fn properties(config: &StorageConfig, compression: Compression) -> WriterPropertiesBuilder {
    let ts = ColumnPath::from(CREATE_TS_COLUMN);
    WriterProperties::builder()
        .set_max_row_group_row_count(Some(config.row_group_rows as usize))
        .set_compression(compression)
        .set_statistics_enabled(EnabledStatistics::Chunk)
        .set_column_dictionary_enabled(ts.clone(), false)
        .set_column_encoding(ts, Encoding::DELTA_BINARY_PACKED)
        .set_created_by(format!("retina {}", env!("CARGO_PKG_VERSION")))
}

/// Encodes batches of the table's stored schema as one Parquet file.
pub fn encode(
    schema: &TableSchema,
    batches: &[RecordBatch],
    props: WriterProperties,
) -> Result<Bytes> {
    let mut writer = ArrowWriter::try_new(Vec::new(), schema.arrow_schema().clone(), Some(props))?;
    for b in batches {
        writer.write(b)?;
    }
    Ok(Bytes::from(writer.into_inner()?))
}

/// One row group of a file: its rows' place in the file and its `_create_ts` range.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RowGroupInfo {
    pub offset: u64,
    pub rows: u64,
    pub min_create_ts: u64,
    pub max_create_ts: u64,
}

/// A regular file as [`combine_blocks`] or [`rewrite_file`] wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CombinedFile {
    pub groups: Vec<RowGroupInfo>,
    /// The object's size.
    pub bytes: u64,
}

impl CombinedFile {
    /// What a reader may know of the object without opening it.
    pub fn facts(&self) -> ObjectFacts {
        ObjectFacts {
            bytes: Some(self.bytes),
            max_create_ts: max_create_ts(&self.groups),
        }
    }
}

/// The newest creation time in row groups `groups`, if there is one.
pub fn max_create_ts(groups: &[RowGroupInfo]) -> Option<Timestamp> {
    let max = groups.iter().map(|g| g.max_create_ts).max()?;
    Timestamp::new(max).ok()
}

/// How VFoR reads a row group at a snapshot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum RowGroupRead {
    /// Every row was created after the snapshot.
    Skip,
    /// Every row was created at or before the snapshot: only the bitmap applies.
    Bitmap,
    /// Some rows were created after the snapshot: the bitmap and the `_create_ts` filter apply.
    BitmapAndCreateTs,
}

impl RowGroupInfo {
    pub fn read_at(&self, snapshot: Timestamp) -> RowGroupRead {
        let s = snapshot.get();
        if !is_visible(self.min_create_ts, false, s) {
            RowGroupRead::Skip
        } else if is_visible(self.max_create_ts, false, s) {
            RowGroupRead::Bitmap
        } else {
            RowGroupRead::BitmapAndCreateTs
        }
    }
}

/// The row groups of a file with their `_create_ts` statistics, which every file the engine
/// writes has; a file without them is corrupt.
pub fn row_groups(metadata: &ParquetMetaData, schema: &TableSchema) -> Result<Vec<RowGroupInfo>> {
    let ts_col = schema.create_ts_index();
    let mut offset = 0;
    let mut out = Vec::with_capacity(metadata.num_row_groups());
    for (i, rg) in metadata.row_groups().iter().enumerate() {
        let corrupt = |reason: &str| StorageError::Corrupt {
            what: format!("row group {i} of a `{}` file", schema.name()),
            reason: reason.into(),
        };
        let rows = rg.num_rows() as u64;
        let (min, max) = match rg.column(ts_col).statistics() {
            Some(Statistics::Int64(s)) => match (s.min_opt(), s.max_opt()) {
                (Some(&min), Some(&max)) if min > 0 && min <= max => (min as u64, max as u64),
                _ => return Err(corrupt("`_create_ts` statistics lack min/max")),
            },
            _ => return Err(corrupt("`_create_ts` has no int64 statistics")),
        };
        out.push(RowGroupInfo {
            offset,
            rows,
            min_create_ts: min,
            max_create_ts: max,
        });
        offset += rows;
    }
    Ok(out)
}

/// Which stored columns to read: `None` is every user column (not `_create_ts`); indices are
/// into the stored schema, so `_create_ts` is read only when asked for.
pub type Projection<'a> = Option<&'a [usize]>;

fn projected(schema: &TableSchema, projection: Projection<'_>) -> Vec<usize> {
    match projection {
        Some(p) => p.to_vec(),
        None => (0..schema.columns().len()).collect(),
    }
}

/// Reads the rows of a Parquet file visible at `snapshot`. `deleted` holds the file's deleted
/// rows at the snapshot, one bit per row from the file's first row (1 = deleted).
pub fn read_visible(
    bytes: Bytes,
    schema: &TableSchema,
    snapshot: Timestamp,
    deleted: &[u64],
    projection: Projection<'_>,
) -> Result<Vec<RecordBatch>> {
    let meta = ArrowReaderMetadata::load(&bytes, ArrowReaderOptions::new())?;
    let groups = row_groups(meta.metadata(), schema)?;
    let columns = projected(schema, projection);
    let mut out = Vec::new();
    // Runs of consecutive row groups read the same way share one reader; in a file written in
    // timestamp order that is at most one run of each kind.
    let mut i = 0;
    while i < groups.len() {
        let kind = groups[i].read_at(snapshot);
        let mut j = i;
        while j < groups.len() && groups[j].read_at(snapshot) == kind {
            j += 1;
        }
        let descr = meta.metadata().file_metadata().schema_descr_ptr();
        let builder = || {
            ParquetRecordBatchReaderBuilder::new_with_metadata(bytes.clone(), meta.clone())
                .with_row_groups((i..j).collect())
                .with_projection(ProjectionMask::roots(&descr, columns.iter().copied()))
        };
        if kind == RowGroupRead::Bitmap {
            // Every row of these row groups was created by the snapshot: decode them whole and
            // drop deleted rows with the bitmap as a mask, a vectorized AND over words. (A row
            // selection of scattered deletes makes the decoder stop and start at every one.)
            let mut row = groups[i].offset;
            for batch in builder().build()? {
                let batch = batch?;
                let n = batch.num_rows() as u64;
                out.push(mask_deleted(&batch, deleted, row)?);
                row += n;
            }
        } else if kind == RowGroupRead::BitmapAndCreateTs {
            let mut selectors = Vec::new();
            for g in &groups[i..j] {
                select_live(deleted, g.offset, g.rows, &mut selectors);
            }
            // Some rows were created after the snapshot: the `_create_ts` filter and the bitmap
            // (as a row selection) both apply; this is at most the newest row group or two.
            let ts_mask = ProjectionMask::roots(&descr, [schema.create_ts_index()]);
            let s = snapshot.get();
            let predicate = ArrowPredicateFn::new(ts_mask, move |batch: RecordBatch| {
                let ts = batch
                    .column(0)
                    .as_any()
                    .downcast_ref::<Int64Array>()
                    .expect("`_create_ts` is int64");
                Ok(created_by(ts, s))
            });
            let reader = builder()
                .with_row_selection(RowSelection::from(selectors))
                .with_row_filter(RowFilter::new(vec![Box::new(predicate)]));
            for batch in reader.build()? {
                out.push(batch?);
            }
        }
        i = j;
    }
    Ok(out)
}

/// `batch` (rows `first ..` of the file) without the rows `deleted` marks.
fn mask_deleted(batch: &RecordBatch, deleted: &[u64], first: u64) -> Result<RecordBatch> {
    let n = batch.num_rows();
    let (start, end) = (first as usize, first as usize + n);
    let words = &deleted[start / 64..end.div_ceil(64).min(deleted.len())];
    if words.iter().all(|&w| w == 0) {
        return Ok(batch.clone());
    }
    let bits = arrow::buffer::Buffer::from_slice_ref(words);
    let deleted = arrow::buffer::BooleanBuffer::new(bits, start % 64, n);
    let live = BooleanArray::new(!&deleted, None);
    Ok(filter_record_batch(batch, &live)?)
}

/// `_create_ts <= snapshot`, row by row.
fn created_by(create_ts: &Int64Array, snapshot: u64) -> BooleanArray {
    let values: Vec<bool> = create_ts
        .values()
        .iter()
        .map(|&c| is_visible(c as u64, false, snapshot))
        .collect();
    BooleanArray::from(values)
}

/// Appends selectors for rows `offset .. offset + rows` of `deleted`: live rows selected,
/// deleted rows skipped. Whole zero words extend a run without looking at bits.
fn select_live(deleted: &[u64], offset: u64, rows: u64, out: &mut Vec<RowSelector>) {
    let mut push = |skip: bool, n: usize| match out.last_mut() {
        Some(last) if last.skip == skip => last.row_count += n,
        _ => out.push(if skip {
            RowSelector::skip(n)
        } else {
            RowSelector::select(n)
        }),
    };
    let (mut row, end) = (offset, offset + rows);
    while row < end {
        let word = deleted.get((row / 64) as usize).copied().unwrap_or(0);
        if row % 64 == 0 && end - row >= 64 && (word == 0 || word == u64::MAX) {
            push(word != 0, 64);
            row += 64;
        } else {
            push(word >> (row % 64) & 1 != 0, 1);
            row += 1;
        }
    }
}

/// The rows of an in-memory batch (stored schema) visible at `snapshot`, given its deleted
/// rows (bit i = row i).
pub fn filter_visible(
    batch: &RecordBatch,
    schema: &TableSchema,
    snapshot: Timestamp,
    deleted: &[u64],
    projection: Projection<'_>,
) -> Result<RecordBatch> {
    let columns = projected(schema, projection);
    filter_visible_columns(batch, schema.create_ts_index(), snapshot, deleted, &columns)
}

/// [`filter_visible`] of a batch holding `_create_ts` as column `create_ts` (a batch already
/// projected, say): the visible rows of `columns`.
pub fn filter_visible_columns(
    batch: &RecordBatch,
    create_ts: usize,
    snapshot: Timestamp,
    deleted: &[u64],
    columns: &[usize],
) -> Result<RecordBatch> {
    let ts = batch
        .column(create_ts)
        .as_any()
        .downcast_ref::<Int64Array>()
        .expect("`_create_ts` is int64");
    let s = snapshot.get();
    let mask: Vec<bool> = ts
        .values()
        .iter()
        .enumerate()
        .map(|(i, &c)| is_visible(c as u64, deleted[i / 64] >> (i % 64) & 1 != 0, s))
        .collect();
    // Only the columns kept are copied.
    Ok(filter_record_batch(
        &batch.project(columns)?,
        &BooleanArray::from(mask),
    )?)
}

/// Writes one write-buffer block to the object store.
pub async fn flush_block(
    store: &dyn ObjectStore,
    schema: &TableSchema,
    config: &StorageConfig,
    job: &FlushJob,
) -> Result<u64> {
    let bytes = encode(
        schema,
        std::slice::from_ref(&job.batch),
        block_writer_properties(config),
    )?;
    let size = bytes.len() as u64;
    put_object(store, &job.path, bytes).await?;
    Ok(size)
}

/// Combines flushed rows of a virtual file into one Parquet object at the job's target: a full
/// virtual file's into its regular file (zstd, as files stay), a run of blocks into a segment
/// (LZ4, as blocks: it only serves reads until the file is combined). Checks the rows before
/// writing and the written footer after. The sources are left in place: they go once no query
/// can still read them.
pub async fn combine_blocks(
    store: &dyn ObjectStore,
    schema: &TableSchema,
    config: &StorageConfig,
    job: &CombineJob,
) -> Result<CombinedFile> {
    // A tail's full segments are taken as they are (a row group each, encoded as a segment
    // is): only the blocks past them are encoded.
    let copied = match job.kind {
        CombineKind::Segment { segments, .. } => segments as usize,
        CombineKind::File { .. } => 0,
    };
    let mut segments = Vec::with_capacity(copied);
    for path in &job.sources[..copied] {
        segments.push(with_footer(get(store, path).await?)?);
    }
    let mut batches = Vec::new();
    for path in &job.sources[copied..] {
        let bytes = store.get(path).await?.bytes().await?;
        for b in ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()? {
            batches.push(b?);
        }
    }
    let mut rows: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    for (_, footer) in &segments {
        rows += footer.file_metadata().num_rows() as u64;
    }
    if rows != job.rows {
        return Err(StorageError::Corrupt {
            what: format!("blocks of file {}", job.file),
            reason: format!("{rows} rows read back, {} expected", job.rows),
        });
    }
    // A segment is encoded again, as one row group, rather than made of its blocks' column
    // chunks copied as they are: that spared the I/O thread about 0.25 us per replayed row,
    // but a segment of eight row groups made queries over unfilled files 15-20% slower
    // (`retina bench overhead`), since the reader sets up and fetches each row group apart.
    let props = match job.kind {
        CombineKind::File { .. } => writer_properties(config),
        CombineKind::Segment { .. } => segment_writer_properties(config),
    };
    let bytes = if segments.is_empty() {
        encode(schema, &batches, props)?
    } else {
        if !batches.is_empty() {
            segments.push(with_footer(encode(schema, &batches, props.clone())?)?);
        }
        concat(&segments, props)?
    };
    let meta = ArrowReaderMetadata::load(&bytes, ArrowReaderOptions::new())?;
    let groups = row_groups(meta.metadata(), schema)?;
    let written: u64 = groups.iter().map(|g| g.rows).sum();
    if written != job.rows {
        return Err(StorageError::Corrupt {
            what: format!("combined file {}", job.file),
            reason: format!("{written} rows encoded, {} expected", job.rows),
        });
    }
    let size = bytes.len() as u64;
    put_object(store, &job.target, bytes).await?;
    Ok(CombinedFile {
        groups,
        bytes: size,
    })
}

/// Parquet objects of one schema as one, their row groups copied as they are (column chunks,
/// statistics and page indexes), in order; the first one's key-value metadata (the Arrow
/// schema) kept.
fn concat(inputs: &[(Bytes, ParquetMetaData)], props: WriterProperties) -> Result<Bytes> {
    let first = inputs[0].1.file_metadata();
    let mut writer = SerializedFileWriter::new(
        Vec::new(),
        first.schema_descr().root_schema_ptr(),
        Arc::new(props),
    )?;
    for (input, meta) in inputs {
        if meta.file_metadata().schema() != first.schema() {
            return Err(StorageError::Corrupt {
                what: "a segment".into(),
                reason: "its schema is not the table's".into(),
            });
        }
        for (g, group) in meta.row_groups().iter().enumerate() {
            let mut out = writer.next_row_group()?;
            for (c, column) in group.columns().iter().enumerate() {
                out.append_column(
                    input,
                    ColumnCloseResult {
                        bytes_written: column.compressed_size() as u64,
                        rows_written: group.num_rows() as u64,
                        metadata: column.clone(),
                        bloom_filter: None,
                        column_index: chunk_of(meta.column_index(), g, c),
                        offset_index: chunk_of(meta.offset_index(), g, c),
                    },
                )?;
            }
            out.close()?;
        }
    }
    for kv in first.key_value_metadata().into_iter().flatten() {
        writer.append_key_value_metadata(kv.clone());
    }
    Ok(Bytes::from(writer.into_inner()?))
}

/// A Parquet object with its footer (and page indexes where it has them), read once.
fn with_footer(bytes: Bytes) -> Result<(Bytes, ParquetMetaData)> {
    let footer = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Optional)
        .parse_and_finish(&bytes)?;
    Ok((bytes, footer))
}

/// A page index's entry for column chunk `c` of row group `g`, if there is one.
fn chunk_of<T: Clone>(index: Option<&Vec<Vec<T>>>, g: usize, c: usize) -> Option<T> {
    index.and_then(|i| i.get(g)?.get(c).cloned())
}

/// Storage GC's work on one regular file: write the rows live at `safe_ts` (keeping their
/// `_create_ts`) to `target`, as file `target_file`. [`crate::Shard::take_rewrite_jobs`] makes
/// it, [`rewrite_file`] does it.
#[derive(Clone, Debug)]
pub struct RewriteJob {
    pub file: FileId,
    pub source: Path,
    pub target_file: FileId,
    pub target: Path,
    pub safe_ts: Timestamp,
    /// Rows of the file.
    pub rows: u64,
    /// Its deleted rows at `safe_ts` (bit i = row i): the rows the rewrite drops.
    pub deleted: Vec<u64>,
}

impl RewriteJob {
    /// Rows the rewritten file holds.
    pub fn kept_rows(&self) -> u64 {
        self.rows
            - self
                .deleted
                .iter()
                .map(|w| u64::from(w.count_ones()))
                .sum::<u64>()
    }
}

/// Storage GC: writes the rows of `job.source` live at the job's safe timestamp to
/// `job.target`, every column with `_create_ts` as stored, checking the rows before writing and
/// the footer after. A job that keeps no row writes nothing. The source is left in place: it
/// goes once no query can still read it.
pub async fn rewrite_file(
    store: &dyn ObjectStore,
    schema: &TableSchema,
    config: &StorageConfig,
    job: &RewriteJob,
) -> Result<CombinedFile> {
    let kept = job.kept_rows();
    if kept == 0 {
        return Ok(CombinedFile {
            groups: Vec::new(),
            bytes: 0,
        });
    }
    let bytes = get(store, &job.source).await?;
    let mut batches = Vec::new();
    let mut row = 0u64;
    for b in ParquetRecordBatchReaderBuilder::try_new(bytes)?.build()? {
        let b = b?;
        let n = b.num_rows() as u64;
        if row + n > job.rows {
            return Err(StorageError::Corrupt {
                what: format!("file {} being rewritten", job.file),
                reason: format!("more than the {} rows its visibility holds", job.rows),
            });
        }
        batches.push(mask_deleted(&b, &job.deleted, row)?);
        row += n;
    }
    let live: u64 = batches.iter().map(|b| b.num_rows() as u64).sum();
    if row != job.rows || live != kept {
        return Err(StorageError::Corrupt {
            what: format!("file {} being rewritten", job.file),
            reason: format!(
                "{row} rows read back ({live} live), {} expected ({kept} live)",
                job.rows
            ),
        });
    }
    let out = encode(schema, &batches, writer_properties(config))?;
    let meta = ArrowReaderMetadata::load(&out, ArrowReaderOptions::new())?;
    let groups = row_groups(meta.metadata(), schema)?;
    let written: u64 = groups.iter().map(|g| g.rows).sum();
    if written != kept {
        return Err(StorageError::Corrupt {
            what: format!("rewritten file {}", job.target_file),
            reason: format!("{written} rows encoded, {kept} expected"),
        });
    }
    let size = out.len() as u64;
    put_object(store, &job.target, out).await?;
    Ok(CombinedFile {
        groups,
        bytes: size,
    })
}

/// Objects larger than this go up in parts (S3 multipart upload) of [`MULTIPART_PART`] bytes.
pub const MULTIPART_THRESHOLD: usize = 16 << 20;
/// The part size of a multipart upload (S3's minimum is 5 MiB, all but the last part).
pub const MULTIPART_PART: usize = 8 << 20;
/// Parts of one object uploaded at once.
const MULTIPART_PARALLEL: usize = 4;

/// Writes `bytes` as the object at `path`: one PUT up to [`MULTIPART_THRESHOLD`], else a
/// multipart upload, aborted if any part fails. Either way the object appears whole or not
/// at all. Needs no particular async runtime beyond the store's own.
pub async fn put_object(store: &dyn ObjectStore, path: &Path, bytes: Bytes) -> Result<()> {
    put_object_with(store, path, bytes, MULTIPART_THRESHOLD, MULTIPART_PART).await
}

/// [`put_object`] with its threshold and part size (tests use small ones).
pub async fn put_object_with(
    store: &dyn ObjectStore,
    path: &Path,
    bytes: Bytes,
    threshold: usize,
    part: usize,
) -> Result<()> {
    use futures::{StreamExt, TryStreamExt};
    if bytes.len() <= threshold {
        store.put(path, PutPayload::from(bytes)).await?;
        return Ok(());
    }
    let mut upload = store.put_multipart(path).await?;
    // Each part's number is fixed when it is asked for, so they may finish in any order.
    let parts: Vec<_> = (0..bytes.len())
        .step_by(part)
        .map(|at| {
            upload.put_part(PutPayload::from(
                bytes.slice(at..(at + part).min(bytes.len())),
            ))
        })
        .collect();
    let sent = futures::stream::iter(parts)
        .buffer_unordered(MULTIPART_PARALLEL)
        .try_collect::<Vec<()>>()
        .await;
    let done = match sent {
        Ok(_) => upload.complete().await.map(|_| ()),
        Err(e) => Err(e),
    };
    if let Err(e) = done {
        if let Err(abort) = upload.abort().await {
            tracing::warn!("aborting the multipart upload of {path}: {abort}");
        }
        return Err(e.into());
    }
    Ok(())
}

/// Reads a whole object.
pub async fn get(store: &dyn ObjectStore, path: &Path) -> Result<Bytes> {
    Ok(store.get(path).await?.bytes().await?)
}

/// An object store on a local directory (created if missing), the default lake storage.
pub fn local_store(dir: &std::path::Path) -> Result<Arc<dyn ObjectStore>> {
    std::fs::create_dir_all(dir).map_err(|e| {
        StorageError::ObjectStore(object_store::Error::Generic {
            store: "LocalFileSystem",
            source: Box::new(e),
        })
    })?;
    Ok(Arc::new(
        object_store::local::LocalFileSystem::new_with_prefix(dir)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{ColumnDef, ColumnType, batch_rows};
    use crate::value::Value;

    #[test]
    fn no_kind_of_object_has_bloom_filters() {
        let config = StorageConfig::default();
        let column = ColumnPath::from("id");
        for props in [
            writer_properties(&config),
            block_writer_properties(&config),
            segment_writer_properties(&config),
        ] {
            assert!(props.bloom_filter_properties(&column).is_none());
            assert!(
                props
                    .bloom_filter_properties(&ColumnPath::from(CREATE_TS_COLUMN))
                    .is_none()
            );
        }
    }

    /// A block of `rows` rows from `first` on (ids, names, `_create_ts` = id + 100).
    fn block(schema: &TableSchema, first: i64, rows: i64) -> RecordBatch {
        use arrow::array::{Int32Array, StringArray};
        let ids: Vec<i32> = (first..first + rows).map(|i| i as i32).collect();
        let names: Vec<Option<String>> = (first..first + rows)
            .map(|i| (i % 3 != 0).then(|| format!("name {i}")))
            .collect();
        let ts: Vec<i64> = (first..first + rows).map(|i| i + 100).collect();
        RecordBatch::try_new(
            schema.arrow_schema().clone(),
            vec![
                Arc::new(Int32Array::from(ids)),
                Arc::new(StringArray::from(names)),
                Arc::new(Int64Array::from(ts)),
            ],
        )
        .unwrap()
    }

    fn run<T>(f: impl std::future::Future<Output = T>) -> T {
        futures::executor::block_on(f)
    }

    #[test]
    fn a_segment_holds_its_blocks_rows_and_the_file_reads_it_back() {
        let schema = TableSchema::new(
            "t",
            vec![
                ColumnDef::new("id", ColumnType::Int32, false),
                ColumnDef::new("name", ColumnType::Utf8, true),
            ],
            &["id"],
        )
        .unwrap();
        let config = StorageConfig::default();
        let dir = tempfile::tempdir().unwrap();
        let store = local_store(dir.path()).unwrap();
        let sizes = [5i64, 7, 3, 4];
        let mut paths = Vec::new();
        let mut first = 0;
        for (index, &rows) in sizes.iter().enumerate() {
            let path = Path::from(format!("buffer/1-{index:05}.parquet"));
            let job = FlushJob {
                block: crate::buffer::BlockId {
                    file: FileId(1),
                    index: index as u32,
                },
                batch: block(&schema, first, rows),
                path: path.clone(),
            };
            run(flush_block(store.as_ref(), &schema, &config, &job)).unwrap();
            paths.push(path);
            first += rows;
        }
        let types: Vec<ColumnType> = schema
            .columns()
            .iter()
            .map(|c| c.ty)
            .chain([ColumnType::Int64])
            .collect();
        let read = |path: &Path| {
            let bytes = run(get(store.as_ref(), path)).unwrap();
            let reader = ParquetRecordBatchReaderBuilder::try_new(bytes).unwrap();
            // Other readers see the table's Arrow types (the schema travels in the footer).
            assert_eq!(reader.schema(), schema.arrow_schema());
            let groups = reader.metadata().num_row_groups();
            let rows: Vec<Vec<Value>> = reader
                .build()
                .unwrap()
                .flat_map(|b| batch_rows(&b.unwrap(), &types))
                .collect();
            (groups, rows)
        };
        // The first three blocks as a segment: one row group.
        let segment = Path::from("buffer/1-00000-3.parquet");
        let job = CombineJob {
            file: FileId(1),
            rows: 15,
            sources: paths[..3].to_vec(),
            target: segment.clone(),
            kind: CombineKind::Segment {
                first: 0,
                blocks: 3,
                segments: 0,
            },
        };
        let made = run(combine_blocks(store.as_ref(), &schema, &config, &job)).unwrap();
        let offsets: Vec<(u64, u64, u64, u64)> = made
            .groups
            .iter()
            .map(|g| (g.offset, g.rows, g.min_create_ts, g.max_create_ts))
            .collect();
        assert_eq!(offsets, [(0, 15, 100, 114)]);
        let expected: Vec<Vec<Value>> = paths.iter().flat_map(|p| read(p).1).collect();
        let (groups, rows) = read(&segment);
        assert_eq!(groups, 1);
        assert_eq!(rows, expected[..15]);
        // A wrong row count is refused, and nothing is written.
        let wrong = CombineJob {
            rows: 16,
            target: Path::from("buffer/1-00000-3-wrong.parquet"),
            ..job.clone()
        };
        assert!(run(combine_blocks(store.as_ref(), &schema, &config, &wrong)).is_err());
        assert!(run(get(store.as_ref(), &wrong.target)).is_err());
        // A tail that takes in the segment: its row group copied as it is, and the block
        // after it encoded as a second one.
        let tail = CombineJob {
            file: FileId(1),
            rows: 19,
            sources: vec![segment.clone(), paths[3].clone()],
            target: Path::from("buffer/1-00000-4.parquet"),
            kind: CombineKind::Segment {
                first: 0,
                blocks: 4,
                segments: 1,
            },
        };
        let made = run(combine_blocks(store.as_ref(), &schema, &config, &tail)).unwrap();
        let offsets: Vec<(u64, u64, u64, u64)> = made
            .groups
            .iter()
            .map(|g| (g.offset, g.rows, g.min_create_ts, g.max_create_ts))
            .collect();
        assert_eq!(offsets, [(0, 15, 100, 114), (15, 4, 115, 118)]);
        assert_eq!(read(&tail.target), (2, expected.clone()));
        let footer = |path: &Path| {
            let bytes = run(get(store.as_ref(), path)).unwrap();
            ArrowReaderMetadata::load(&bytes, ArrowReaderOptions::new())
                .unwrap()
                .metadata()
                .clone()
        };
        let (segment_md, tail_md) = (footer(&segment), footer(&tail.target));
        let chunks = |g: &parquet::file::metadata::RowGroupMetaData| {
            g.columns()
                .iter()
                .map(|c| (c.compressed_size(), c.statistics().cloned()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            chunks(tail_md.row_group(0)),
            chunks(segment_md.row_group(0))
        );
        // A wrong row count is refused there too, and nothing is written.
        let wrong = CombineJob {
            rows: 20,
            target: Path::from("buffer/1-00000-4-wrong.parquet"),
            ..tail
        };
        assert!(run(combine_blocks(store.as_ref(), &schema, &config, &wrong)).is_err());
        assert!(run(get(store.as_ref(), &wrong.target)).is_err());
        // The full file reads the segment and the block after it.
        let file = CombineJob {
            file: FileId(1),
            rows: 19,
            sources: vec![segment, paths[3].clone()],
            target: Path::from("tables/t/1.parquet"),
            kind: CombineKind::File { retire: vec![] },
        };
        let made = run(combine_blocks(store.as_ref(), &schema, &config, &file)).unwrap();
        assert_eq!(made.groups.iter().map(|g| g.rows).sum::<u64>(), 19);
        assert_eq!(read(&file.target).1, expected);
    }

    #[test]
    fn large_objects_go_up_in_parts_whole_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let store = local_store(dir.path()).unwrap();
        let bytes = Bytes::from((0..100u8).collect::<Vec<u8>>());
        let path = Path::from("tables/t/1.parquet");
        futures::executor::block_on(put_object_with(store.as_ref(), &path, bytes.clone(), 10, 7))
            .unwrap();
        assert_eq!(
            futures::executor::block_on(get(store.as_ref(), &path)).unwrap(),
            bytes
        );
        // A store that refuses writes leaves no object behind.
        let faulty = crate::fault::FaultyStore::new(store.clone());
        faulty
            .fail_writes
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let other = Path::from("tables/t/2.parquet");
        assert!(
            futures::executor::block_on(put_object_with(&faulty, &other, bytes, 10, 7)).is_err()
        );
        assert!(futures::executor::block_on(get(store.as_ref(), &other)).is_err());
    }

    #[test]
    fn selectors_follow_the_bitmap() {
        let mut deleted = vec![0u64; 3];
        deleted[0] = 0b110;
        deleted[2] = u64::MAX;
        let mut sel = Vec::new();
        select_live(&deleted, 0, 192, &mut sel);
        assert_eq!(
            sel,
            vec![
                RowSelector::select(1),
                RowSelector::skip(2),
                RowSelector::select(125),
                RowSelector::skip(64)
            ]
        );
        let mut sel = Vec::new();
        select_live(&deleted, 2, 3, &mut sel);
        assert_eq!(sel, vec![RowSelector::skip(1), RowSelector::select(2)]);
    }
}
