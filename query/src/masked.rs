//! [`MaskedScanExec`]: row groups with deleted rows, read by the Parquet reader with the
//! deleted rows masked out as each batch is decoded: those of regular files the plan lists,
//! and whole write-buffer objects (segments and blocks) whose rows the snapshot all sees.
//! DataFusion's own scan cannot be told which rows of a batch to drop (its file streams take
//! files from each other's partitions, so a batch's file is known only from a column added
//! for it); this scan knows each file's row groups and bitmap, and adds no column.
//!
//! A filter right above the scan is taken into it (DataFusion's filter pushdown): each batch
//! is then decoded whole and copied once, keeping the rows that are live and pass the filter,
//! where the filter would copy the live rows a second time.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use datafusion::arrow::array::{
    Array, AsArray, BooleanArray, BooleanBufferBuilder, RecordBatchOptions,
};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::Statistics;
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::{
    CachedParquetFileReaderFactory, DefaultParquetFileReaderFactory, ParquetAccessPlan,
    RowGroupAccessPlanFilter,
};
use datafusion::datasource::physical_plan::{ParquetFileMetrics, ParquetFileReaderFactory};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, RowSelection, RowSelectionPolicy,
};
use datafusion::parquet::arrow::async_reader::AsyncFileReader;
use datafusion::parquet::arrow::{ParquetRecordBatchStreamBuilder, ProjectionMask};
use datafusion::parquet::file::metadata::ParquetMetaData;
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr, conjunction};
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation, PushedDown,
};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::future::BoxFuture;
use futures::{StreamExt, TryStreamExt};

/// A file's rows to read, and which of them are live.
#[derive(Clone, Debug)]
pub(crate) struct MaskedFile {
    /// The object as the reader opens it (its path, size and, for a write-buffer object, the
    /// modification time that identifies it to the footer cache).
    pub file: PartitionedFile,
    /// Its footer may be kept in the session runtime's metadata cache across queries (the
    /// object is never written again at its path with other contents).
    pub cache: bool,
    pub live: Live,
}

/// Which rows of a [`MaskedFile`] are read, and which of them are live.
#[derive(Clone, Debug)]
pub(crate) enum Live {
    /// Row groups of a regular file, in file order, each with one bit per row (set = live).
    Groups(Vec<(usize, BooleanBuffer)>),
    /// Every row of a write-buffer object, one bit each (set = live): the plan does not list
    /// its row groups, so the bits are split by those of its footer.
    Whole(BooleanBuffer),
}

/// One bit per row of `rows`, set for the rows whose bit in `deleted` (bit i = row i) is clear.
fn live_bits(rows: u64, deleted: &[u64]) -> BooleanBuffer {
    let rows = rows as usize;
    let words = deleted.len().min(rows.div_ceil(64));
    let mut bits = vec![0u64; rows.div_ceil(64)];
    bits[..words].copy_from_slice(&deleted[..words]);
    !&BooleanBuffer::new(Buffer::from_vec(bits), 0, rows)
}

impl MaskedFile {
    /// A regular file with no row group yet, its footer cached (a regular file is written
    /// once, under its id).
    pub fn new(path: String, bytes: u64) -> MaskedFile {
        MaskedFile {
            file: PartitionedFile::new(path, bytes),
            cache: true,
            live: Live::Groups(Vec::new()),
        }
    }

    /// A write-buffer object of `rows` rows read whole, whose deleted rows are the set bits
    /// of `deleted` (bit i = row i).
    pub fn whole(file: PartitionedFile, cache: bool, rows: u64, deleted: &[u64]) -> MaskedFile {
        MaskedFile {
            file,
            cache,
            live: Live::Whole(live_bits(rows, deleted)),
        }
    }

    /// Adds row group `g` of `rows` rows, whose deleted rows are the set bits of `deleted`.
    pub fn push(&mut self, g: usize, rows: u64, deleted: &[u64]) {
        match &mut self.live {
            Live::Groups(groups) => groups.push((g, live_bits(rows, deleted))),
            Live::Whole(_) => unreachable!("an object read whole takes no row group"),
        }
    }

    pub fn path(&self) -> &str {
        self.file.object_meta.location.as_ref()
    }

    pub fn rows(&self) -> u64 {
        match &self.live {
            Live::Groups(groups) => groups.iter().map(|(_, l)| l.len() as u64).sum(),
            Live::Whole(live) => live.len() as u64,
        }
    }

    /// Its row groups with their live bits: as listed, or for an object read whole, every row
    /// group of its footer `md` with its share of the bits, which must cover the object's
    /// rows exactly.
    fn row_groups(&self, md: &ParquetMetaData) -> Result<Vec<(usize, BooleanBuffer)>> {
        match &self.live {
            Live::Groups(groups) => Ok(groups.clone()),
            Live::Whole(live) => {
                let rows: i64 = md.row_groups().iter().map(|g| g.num_rows()).sum();
                if rows != live.len() as i64 {
                    return Err(DataFusionError::Execution(format!(
                        "{}: the node says {} rows, the object has {rows}",
                        self.path(),
                        live.len()
                    )));
                }
                let mut at = 0;
                Ok(md
                    .row_groups()
                    .iter()
                    .enumerate()
                    .map(|(g, r)| {
                        let n = r.num_rows() as usize;
                        at += n;
                        (g, live.slice(at - n, n))
                    })
                    .collect())
            }
        }
    }
}

/// The live rows of some files' row groups, in the columns `columns` of the files, one
/// partition per list of files; with a filter, those of them that pass it.
#[derive(Clone, Debug)]
pub(crate) struct MaskedScanExec {
    url: ObjectStoreUrl,
    parts: Vec<Vec<MaskedFile>>,
    /// Stored columns read, in the output's order.
    columns: Vec<usize>,
    /// The files' schema, and what prunes row groups by their statistics.
    file_schema: SchemaRef,
    pruning: Option<Arc<PruningPredicate>>,
    /// The filter taken from the plan above, over the output's columns: only the rows it
    /// keeps (true, not null) are given.
    filter: Option<Arc<dyn PhysicalExpr>>,
    /// Rows in all, deleted ones included (an estimate for the planner).
    rows: u64,
    cache: Arc<PlanProperties>,
    /// What `EXPLAIN ANALYZE` shows: the rows given and masked out, the time spent reading
    /// and decoding, and the Parquet reader's own (bytes read, row groups pruned, by file).
    metrics: ExecutionPlanMetricsSet,
    /// The files no partition of this execution has taken yet: a partition done with a file
    /// takes the next one, whichever partition it was planned in, so a partition slowed down
    /// (its core busy with other work) is helped by the others, as DataFusion's own file
    /// streams share work; where its `enable_file_stream_work_stealing` is off, each partition
    /// reads its own files. One execution per plan, as DataFusion's scans:
    /// [`ExecutionPlan::reset_state`] gives a plan that runs again.
    work: Arc<OnceLock<Work>>,
}

/// The files of a [`MaskedScanExec`] that no partition has taken yet.
type Work = Arc<Mutex<VecDeque<MaskedFile>>>;

impl MaskedScanExec {
    pub(crate) fn new(
        url: ObjectStoreUrl,
        parts: Vec<Vec<MaskedFile>>,
        file_schema: &SchemaRef,
        columns: Vec<usize>,
        predicate: Option<Arc<dyn PhysicalExpr>>,
    ) -> Result<MaskedScanExec> {
        let schema = Arc::new(file_schema.project(&columns)?);
        let rows = parts.iter().flatten().map(MaskedFile::rows).sum();
        // A predicate that cannot prune (or cannot be read as one) prunes nothing.
        let pruning = predicate.and_then(|p| {
            PruningPredicateBuilder::new()
                .with_file_schema(file_schema.clone())
                .build(p)
        });
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(parts.len()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(MaskedScanExec {
            url,
            parts,
            columns,
            file_schema: file_schema.clone(),
            pruning,
            filter: None,
            rows,
            cache,
            metrics: ExecutionPlanMetricsSet::new(),
            work: Arc::default(),
        })
    }
}

impl TakesFilter for MaskedScanExec {
    fn filter(&self) -> Option<&Arc<dyn PhysicalExpr>> {
        self.filter.as_ref()
    }

    fn with_filter(&self, filter: Arc<dyn PhysicalExpr>) -> Self {
        MaskedScanExec {
            filter: Some(filter),
            metrics: ExecutionPlanMetricsSet::new(),
            work: Arc::default(),
            ..self.clone()
        }
    }
}

impl DisplayAs for MaskedScanExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let files: usize = self.parts.iter().map(Vec::len).sum();
        write!(
            f,
            "MaskedScanExec: files={files}, partitions={}, columns={:?}",
            self.parts.len(),
            self.columns
        )?;
        if let Some(filter) = &self.filter {
            write!(f, ", filter={filter}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for MaskedScanExec {
    fn name(&self) -> &str {
        "MaskedScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        visit_filter(self.filter.as_ref(), f)
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        crate::parts::leaf(self, &children)
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        let mut exec = Arc::unwrap_or_clone(self);
        exec.work = Arc::default();
        Ok(Arc::new(exec))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    /// Takes the filters of the plan above (a `FilterExec`'s, through a union or a projection):
    /// see [`take_filters`].
    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        Ok(take_filters(self, phase, child_pushdown_result))
    }

    fn partition_statistics(&self, _: Option<usize>) -> Result<Arc<Statistics>> {
        let mut s = Statistics::new_unknown(&self.schema());
        s.num_rows = Precision::Inexact(self.rows as usize);
        Ok(Arc::new(s))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let runtime = context.runtime_env();
        // Footers are kept in the runtime's metadata cache across queries, as DataFusion's own
        // scans of regular files keep them.
        let store = runtime.object_store(&self.url)?;
        let cached = CachedParquetFileReaderFactory::new(
            store.clone(),
            runtime.cache_manager.get_file_metadata_cache(),
        );
        let uncached = DefaultParquetFileReaderFactory::new(store);
        let metrics = self.metrics.clone();
        let baseline = BaselineMetrics::new(&metrics, partition);
        let masked = MetricBuilder::new(&metrics).counter("rows_masked", partition);
        let scan = Arc::new(FileScan::new(
            &self.columns,
            self.schema(),
            self.file_schema.clone(),
            self.pruning.clone(),
            self.filter.clone(),
            context.session_config().batch_size(),
        ));
        let files: Box<dyn Iterator<Item = MaskedFile> + Send> = if context
            .session_config()
            .options()
            .execution
            .enable_file_stream_work_stealing
        {
            let work = self.work.get_or_init(|| {
                let files = self.parts.iter().flatten().cloned().collect();
                Arc::new(Mutex::new(files))
            });
            let work = work.clone();
            Box::new(std::iter::from_fn(move || {
                work.lock().unwrap_or_else(|e| e.into_inner()).pop_front()
            }))
        } else {
            let files = self.parts.get(partition).cloned().unwrap_or_default();
            Box::new(files.into_iter())
        };
        let mut stream = futures::stream::iter(files)
            .then(move |file| {
                let factory: &dyn ParquetFileReaderFactory = match file.cache {
                    true => &cached,
                    false => &uncached,
                };
                let reader = factory.create_reader(partition, file.file.clone(), None, &metrics);
                let file_metrics = ParquetFileMetrics::new(partition, file.path(), &metrics);
                scan.clone()
                    .read(file, reader, file_metrics, masked.clone())
            })
            .try_flatten()
            .boxed();
        // The time spent in the stream: reading (where the store answers at once) and
        // decoding.
        let timed = futures::stream::poll_fn(move |cx| {
            let _compute = baseline.elapsed_compute().timer();
            baseline.record_poll(stream.poll_next_unpin(cx))
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            timed,
        )))
    }
}

/// How each file of a partition is read.
struct FileScan {
    /// The columns read, in file order (the reader gives them so): the scan's, or the first
    /// for a scan that reads none (a row count), dropped again.
    read: Vec<usize>,
    /// Each output column's place in `read`.
    order: Vec<usize>,
    out: SchemaRef,
    file_schema: SchemaRef,
    pruning: Option<Arc<PruningPredicate>>,
    filter: Option<Arc<dyn PhysicalExpr>>,
    batch_size: usize,
}

impl FileScan {
    fn new(
        columns: &[usize],
        out: SchemaRef,
        file_schema: SchemaRef,
        pruning: Option<Arc<PruningPredicate>>,
        filter: Option<Arc<dyn PhysicalExpr>>,
        batch_size: usize,
    ) -> FileScan {
        let mut read = columns.to_vec();
        read.sort_unstable();
        read.dedup();
        if read.is_empty() {
            read.push(0);
        }
        let order = columns
            .iter()
            .map(|c| read.binary_search(c).expect("every column is read"))
            .collect();
        FileScan {
            read,
            order,
            out,
            file_schema,
            pruning,
            filter,
            batch_size,
        }
    }

    /// `file`'s live rows, batch by batch.
    async fn read(
        self: Arc<Self>,
        file: MaskedFile,
        reader: Result<Box<dyn AsyncFileReader + Send>>,
        metrics: ParquetFileMetrics,
        masked: Count,
    ) -> Result<impl futures::Stream<Item = Result<RecordBatch>>> {
        let mut reader = reader?;
        let options = ArrowReaderOptions::new();
        let metadata = reader.get_metadata(Some(&options)).await?;
        let metadata = ArrowReaderMetadata::try_new(metadata, options)?;
        let (row_groups, live) = self.live_row_groups(&file, metadata.metadata(), &metrics)?;
        let deleted = live.len() - live.count_set_bits();
        masked.add(deleted);
        let builder = ParquetRecordBatchStreamBuilder::new_with_metadata(Reader(reader), metadata);
        let mask = ProjectionMask::roots(builder.parquet_schema(), self.read.iter().copied());
        let mut builder = builder
            .with_projection(mask)
            .with_row_groups(row_groups)
            .with_batch_size(self.batch_size);
        // A file with no deleted row (a write-buffer object read with others that have) is
        // read without a selection. Under a filter the reader gives every row, and each batch
        // is copied once, its live rows that pass the filter kept.
        let mut live = (deleted > 0).then_some(live);
        if self.filter.is_none()
            && let Some(live) = live.take()
        {
            builder = builder
                .with_row_selection(RowSelection::from_boolean_buffer(live))
                .with_row_selection_policy(RowSelectionPolicy::Mask);
        }
        let stream = builder.build()?;
        let mut at = 0;
        Ok(stream.map(move |batch| {
            let batch = batch?;
            let columns = self
                .order
                .iter()
                .map(|&i| batch.column(i).clone())
                .collect();
            let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
            let batch = RecordBatch::try_new_with_options(self.out.clone(), columns, &options)?;
            let Some(filter) = &self.filter else {
                return Ok(batch);
            };
            // The batches follow one another through the row groups read, as their bits do.
            let live = live.as_ref().map(|l| l.slice(at, batch.num_rows()));
            at += batch.num_rows();
            select(batch, filter, live)
        }))
    }

    /// The row groups of `file` to read, those its statistics rule out left out as in
    /// DataFusion's own scan, and their live rows' bits in order.
    fn live_row_groups(
        &self,
        file: &MaskedFile,
        md: &ParquetMetaData,
        metrics: &ParquetFileMetrics,
    ) -> Result<(Vec<usize>, BooleanBuffer)> {
        let row_groups = file.row_groups(md)?;
        let mut kept: Option<Vec<usize>> = None;
        if let Some(pruning) = &self.pruning {
            let mut plan = ParquetAccessPlan::new_none(md.num_row_groups());
            for (g, _) in &row_groups {
                plan.scan(*g);
            }
            let mut filter = RowGroupAccessPlanFilter::new(plan);
            filter.prune_by_statistics(
                &self.file_schema,
                md.file_metadata().schema_descr(),
                md.row_groups(),
                pruning,
                metrics,
            );
            kept = Some(filter.row_group_indexes().collect());
        }
        let mut groups = Vec::new();
        let mut live = BooleanBufferBuilder::new(0);
        for (g, bits) in &row_groups {
            let rows = md.row_groups().get(*g).map(|r| r.num_rows());
            if rows != Some(bits.len() as i64) {
                return Err(DataFusionError::Execution(format!(
                    "row group {g} of {}: the plan says {} rows, the file {rows:?}",
                    file.path(),
                    bits.len()
                )));
            }
            if kept.as_ref().is_none_or(|k| k.binary_search(g).is_ok()) {
                groups.push(*g);
                live.append_buffer(bits);
            }
        }
        Ok((groups, live.finish()))
    }
}

/// An operator of ours that takes the filter of the plan above it and applies it with the
/// rows it drops, in one copy.
pub(crate) trait TakesFilter: ExecutionPlan + Sized + 'static {
    /// The filter it applies already.
    fn filter(&self) -> Option<&Arc<dyn PhysicalExpr>>;
    /// A copy of it that applies `filter` in place of its own (with metrics of its own).
    fn with_filter(&self, filter: Arc<dyn PhysicalExpr>) -> Self;
}

/// The filters of the plan above that `op` takes, as
/// [`ExecutionPlan::handle_child_pushdown_result`] answers: all of them where the plan is
/// being built, none of the dynamic filters that joins and top-k sorts publish as they run
/// (left to their own operators). Where it takes any, the plan gets `op` applying them and
/// its own as one conjunction.
pub(crate) fn take_filters<T: TakesFilter>(
    op: &T,
    phase: FilterPushdownPhase,
    result: ChildPushdownResult,
) -> FilterPushdownPropagation<Arc<dyn ExecutionPlan>> {
    let filters: Vec<_> = result
        .parent_filters
        .into_iter()
        .map(|f| f.filter)
        .collect();
    if phase != FilterPushdownPhase::Pre || filters.is_empty() {
        let none = vec![PushedDown::No; filters.len()];
        return FilterPushdownPropagation::with_parent_pushdown_result(none);
    }
    let taken = vec![PushedDown::Yes; filters.len()];
    let filter = conjunction(op.filter().cloned().into_iter().chain(filters));
    let op: Arc<dyn ExecutionPlan> = Arc::new(op.with_filter(filter));
    FilterPushdownPropagation::with_parent_pushdown_result(taken).with_updated_node(op)
}

/// `f` on `filter`, for [`ExecutionPlan::apply_expressions`] of an operator whose only
/// expression is the filter it took.
pub(crate) fn visit_filter(
    filter: Option<&Arc<dyn PhysicalExpr>>,
    f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
) -> Result<TreeNodeRecursion> {
    filter.map_or(Ok(TreeNodeRecursion::Continue), f)
}

/// The rows of `batch` that are live (a set bit in `live`; every row without it) and pass
/// `filter`, copied once.
pub(crate) fn select(
    batch: RecordBatch,
    filter: &Arc<dyn PhysicalExpr>,
    live: Option<BooleanBuffer>,
) -> Result<RecordBatch> {
    let passed = filter
        .evaluate(&batch)
        .and_then(|v| v.into_array(batch.num_rows()));
    let (passed, live) = match (passed, live) {
        (Ok(passed), live) => (passed, live),
        // The filter failed on some row (a division by zero, a cast): that may be a deleted
        // row, which the snapshot does not hold. The live rows are taken first and the filter
        // runs on them alone, as it would over the snapshot, its error then theirs.
        (Err(_), Some(live)) => {
            let live = BooleanArray::new(live, None);
            return select(filter_record_batch(&batch, &live)?, filter, None);
        }
        (Err(e), None) => return Err(e),
    };
    let passed = passed.as_boolean_opt().ok_or_else(|| {
        DataFusionError::Internal(format!(
            "the filter {filter} gives {}, not booleans",
            passed.data_type()
        ))
    })?;
    // A null is not a pass, as in `FilterExec`.
    let mut keep = match passed.nulls() {
        Some(nulls) => passed.values() & nulls.inner(),
        None => passed.values().clone(),
    };
    if let Some(live) = live {
        keep = &keep & &live;
    }
    Ok(filter_record_batch(&batch, &BooleanArray::new(keep, None))?)
}

/// DataFusion's reader of a file (its footers cached), as the Parquet crate's stream takes it:
/// the crate reads through a boxed reader only without `Send`.
struct Reader(Box<dyn AsyncFileReader + Send>);

impl AsyncFileReader for Reader {
    fn get_bytes(
        &mut self,
        range: std::ops::Range<u64>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Bytes>> {
        self.0.get_bytes(range)
    }

    fn get_byte_ranges(
        &mut self,
        ranges: Vec<std::ops::Range<u64>>,
    ) -> BoxFuture<'_, datafusion::parquet::errors::Result<Vec<Bytes>>> {
        self.0.get_byte_ranges(ranges)
    }

    fn get_metadata<'a>(
        &'a mut self,
        options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, datafusion::parquet::errors::Result<Arc<ParquetMetaData>>> {
        self.0.get_metadata(options)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    use datafusion::common::ScalarValue;
    use datafusion::execution::TaskContext;
    use datafusion::logical_expr::Operator;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::file::properties::WriterProperties;
    use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
    use datafusion::physical_plan::display::DisplayableExecutionPlan;
    use datafusion::prelude::SessionConfig;

    /// The schema of [`three_row_groups`]'s file: `v` = row number, `w` = -v.
    fn v_and_w() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int64, false),
            Field::new("w", DataType::Int64, false),
        ]))
    }

    /// A scan of `file` (three row groups of 100 rows: `v` = row number, `w` = -v) in
    /// `columns`, over two partitions, the second's files empty.
    fn two_partition_scan(
        file: MaskedFile,
        columns: Vec<usize>,
        predicate: Option<Arc<dyn PhysicalExpr>>,
    ) -> MaskedScanExec {
        MaskedScanExec::new(
            ObjectStoreUrl::local_filesystem(),
            vec![vec![file], Vec::new()],
            &v_and_w(),
            columns,
            predicate,
        )
        .unwrap()
    }

    /// Partition `partition` of `exec` run to its end under `config`: its batches, or the
    /// error it ends with.
    fn run_partition(
        exec: &dyn ExecutionPlan,
        partition: usize,
        config: SessionConfig,
    ) -> Result<Vec<RecordBatch>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let context = Arc::new(TaskContext::default().with_session_config(config));
        runtime.block_on(exec.execute(partition, context)?.try_collect())
    }

    /// Every batch of every partition of `exec`, each partition run to its end before the
    /// next starts.
    pub(crate) fn run_all(exec: &dyn ExecutionPlan) -> Vec<RecordBatch> {
        let partitions = exec.properties().partitioning.partition_count();
        (0..partitions)
            .flat_map(|p| run_partition(exec, p, SessionConfig::new()).unwrap())
            .collect()
    }

    /// Runs a scan of `file` in `columns` ([`two_partition_scan`]) and returns `v` of every
    /// row (or the row count for no column).
    fn scan(
        file: MaskedFile,
        columns: Vec<usize>,
        predicate: Option<Arc<dyn PhysicalExpr>>,
    ) -> Vec<i64> {
        let exec = two_partition_scan(file, columns.clone(), predicate);
        let mut out = Vec::new();
        for b in run_all(&exec) {
            assert_eq!(b.num_columns(), columns.len());
            match columns.iter().position(|&c| c == 0) {
                Some(i) => out.extend(b.column(i).as_primitive::<Int64Type>().values()),
                None => out.push(b.num_rows() as i64),
            }
            if let Some(i) = columns.iter().position(|&c| c == 1) {
                let w = b.column(i).as_primitive::<Int64Type>().values();
                let v: Vec<i64> = out[out.len() - w.len()..].to_vec();
                assert_eq!(w.iter().map(|x| -x).collect::<Vec<_>>(), v);
            }
        }
        out
    }

    /// `v >= min`, over a scan's first column `v`.
    fn v_at_least(min: i64) -> Arc<dyn PhysicalExpr> {
        Arc::new(BinaryExpr::new(
            Arc::new(Column::new("v", 0)),
            Operator::GtEq,
            Arc::new(Literal::new(ScalarValue::Int64(Some(min)))),
        ))
    }

    /// The error a scan of `file` in column `v` ends with.
    fn scan_error(file: MaskedFile) -> String {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
        let exec = MaskedScanExec::new(
            ObjectStoreUrl::local_filesystem(),
            vec![vec![file]],
            &schema,
            vec![0],
            None,
        )
        .unwrap();
        run_partition(&exec, 0, SessionConfig::new())
            .unwrap_err()
            .to_string()
    }

    /// A Parquet file of three row groups of 100 rows (`v` = row number, `w` = -v) in a
    /// folder of its own: the folder, and the file as a scan names it.
    fn three_row_groups(name: &str) -> (std::path::PathBuf, MaskedFile) {
        let dir = std::env::temp_dir().join(format!("retina-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.parquet");
        let schema = v_and_w();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .build();
        let mut w = ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            schema.clone(),
            Some(props),
        )
        .unwrap();
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(0..300)),
                Arc::new(Int64Array::from_iter_values((0..300).map(|v| -v))),
            ],
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let bytes = std::fs::metadata(&path).unwrap().len();
        let file = MaskedFile::new(path.to_str().unwrap()[1..].to_owned(), bytes);
        (dir, file)
    }

    #[test]
    fn a_file_s_live_rows_in_its_row_groups_and_columns_pruned_by_statistics() {
        let (dir, mut file) = three_row_groups("masked");
        // Row groups 0 and 2 (1 is not read): rows 3 and 64 of the first deleted, and 99 of
        // the last.
        file.push(0, 100, &[1 << 3, 1]);
        file.push(2, 100, &[0, 1 << 35]);
        let expected = |from: i64| -> Vec<i64> {
            (from..100)
                .chain(200..300)
                .filter(|v| ![3, 64, 299].contains(v))
                .collect()
        };
        assert_eq!(scan(file.clone(), vec![0], None), expected(0));
        assert_eq!(scan(file.clone(), vec![1, 0], None), expected(0));
        // No column: the rows' count.
        assert_eq!(scan(file.clone(), vec![], None).iter().sum::<i64>(), 197);
        // `v >= 150` rules out row group 0 by its statistics; the rest is the filter's job.
        let predicate = v_at_least(150);
        assert_eq!(scan(file, vec![0], Some(predicate)), expected(100));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn partitions_share_the_files_and_a_plan_reset_reads_them_again() {
        let (dir, file) = three_row_groups("masked-shared");
        // Row group g of the file in partition g, row 10 of each deleted.
        let parts: Vec<Vec<MaskedFile>> = (0..3)
            .map(|g| {
                let mut f = file.clone();
                f.push(g, 100, &[1 << 10, 0]);
                vec![f]
            })
            .collect();
        let exec: Arc<dyn ExecutionPlan> = Arc::new(
            MaskedScanExec::new(
                ObjectStoreUrl::local_filesystem(),
                parts,
                &v_and_w(),
                vec![0],
                None,
            )
            .unwrap(),
        );
        let expected = |groups: std::ops::Range<i64>| -> Vec<i64> {
            groups
                .flat_map(|g| (g * 100..g * 100 + 100).filter(move |v| v % 100 != 10))
                .collect()
        };
        let run = |exec: &Arc<dyn ExecutionPlan>, partition: usize, config: SessionConfig| {
            let batches = run_partition(exec.as_ref(), partition, config).unwrap();
            batches
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect::<Vec<i64>>()
        };
        let sharing = SessionConfig::new;
        // The partition that runs first takes every file the others have not started.
        assert_eq!(run(&exec, 1, sharing()), expected(0..3));
        assert_eq!(run(&exec, 0, sharing()), Vec::<i64>::new());
        assert_eq!(run(&exec, 2, sharing()), Vec::<i64>::new());
        // Reset, the plan reads them all again, shared as they are taken.
        let exec = exec.reset_state().unwrap();
        assert_eq!(run(&exec, 0, sharing()), expected(0..3));
        // Without work stealing each partition reads its own files, as DataFusion's scans do.
        let own = || {
            SessionConfig::new().set_bool(
                "datafusion.execution.enable_file_stream_work_stealing",
                false,
            )
        };
        let exec = exec.reset_state().unwrap();
        assert_eq!(run(&exec, 2, own()), expected(2..3));
        assert_eq!(run(&exec, 0, own()), expected(0..1));
        assert_eq!(run(&exec, 1, own()), expected(1..2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_object_read_whole_has_its_bits_split_by_the_row_groups_of_its_footer() {
        let (dir, regular) = three_row_groups("masked-whole");
        // Rows 3, 64 and 299 deleted: bits over the object's 300 rows, across its three row
        // groups of 100, which the scan learns from the footer.
        let mut deleted = vec![0u64; 5];
        for r in [3, 64, 299] {
            deleted[r / 64] |= 1 << (r % 64);
        }
        for cache in [false, true] {
            let file = MaskedFile::whole(regular.file.clone(), cache, 300, &deleted);
            let expected = |from: i64| -> Vec<i64> {
                (from..300).filter(|v| ![3, 64, 299].contains(v)).collect()
            };
            assert_eq!(scan(file.clone(), vec![0], None), expected(0));
            assert_eq!(scan(file.clone(), vec![1, 0], None), expected(0));
            assert_eq!(scan(file.clone(), vec![], None).iter().sum::<i64>(), 297);
            // `v >= 150` rules out row group 0 by its statistics.
            let predicate = v_at_least(150);
            assert_eq!(scan(file, vec![0], Some(predicate)), expected(100));
        }
        // Bits for fewer rows than the object has: an error naming it, no rows.
        let short = MaskedFile::whole(regular.file.clone(), false, 250, &deleted);
        let e = scan_error(short);
        assert!(
            e.contains("f.parquet") && e.contains("the node says 250 rows, the object has 300"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn its_metrics_count_the_rows_given_and_masked_and_the_row_groups_pruned() {
        use datafusion::physical_plan::metrics::MetricValue;
        let (dir, mut file) = three_row_groups("masked-metrics");
        file.push(0, 100, &[1 << 3, 1]);
        file.push(2, 100, &[0, 1 << 35]);
        // `v >= 150` rules out row group 0: its two deleted rows are never read.
        let predicate = v_at_least(150);
        let exec = two_partition_scan(file, vec![0], Some(predicate));
        run_all(&exec);
        let m = exec.metrics().unwrap();
        assert_eq!(m.output_rows(), Some(99));
        let count = |name: &str| m.sum_by_name(name).map(|v| v.as_usize());
        assert_eq!(count("rows_masked"), Some(1));
        assert!(count("bytes_scanned").unwrap() > 0);
        match m.sum_by_name("row_groups_pruned_statistics") {
            Some(MetricValue::PruningMetrics {
                pruning_metrics, ..
            }) => {
                assert_eq!(pruning_metrics.pruned(), 1);
                assert_eq!(pruning_metrics.matched(), 1);
            }
            other => panic!("row groups pruned: {other:?}"),
        }
        assert!(m.elapsed_compute().is_some());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_row_group_whose_rows_differ_from_the_plan_is_an_error_naming_it() {
        let (dir, mut file) = three_row_groups("masked-rows");
        file.push(1, 50, &[]);
        let e = scan_error(file);
        assert!(e.contains("row group 1 of") && e.contains("50 rows"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// `100 / (v - at) > 0`, over a scan's first column `v`: true for v in at+1..=at+100,
    /// and a division by zero where `v = at`.
    fn divides_by_v_minus(at: i64) -> Arc<dyn PhysicalExpr> {
        let lit = |v| Arc::new(Literal::new(ScalarValue::Int64(Some(v))));
        let v_minus = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("v", 0)),
            Operator::Minus,
            lit(at),
        ));
        let quotient = Arc::new(BinaryExpr::new(lit(100), Operator::Divide, v_minus));
        Arc::new(BinaryExpr::new(quotient, Operator::Gt, lit(0)))
    }

    #[test]
    fn a_filter_above_is_taken_into_the_scan_and_keeps_the_live_rows_that_pass_it() {
        use datafusion::common::config::ConfigOptions;
        use datafusion::physical_optimizer::PhysicalOptimizerRule;
        use datafusion::physical_optimizer::filter_pushdown::FilterPushdown;
        use datafusion::physical_plan::filter::FilterExec;
        let (dir, mut file) = three_row_groups("masked-filter");
        // Rows 3, 64, 150 and 299 deleted.
        file.push(0, 100, &[1 << 3, 1]);
        file.push(1, 100, &[1 << 50]);
        file.push(2, 100, &[0, 1 << 35]);
        let deleted = [3, 64, 150, 299];
        // The filter as the planner leaves it above the scan, and the plan once filters are
        // pushed down: the scan alone, holding it.
        let pushed = |filter: Arc<dyn PhysicalExpr>, file: MaskedFile| {
            let scan = Arc::new(two_partition_scan(file, vec![0], None));
            let plan = Arc::new(FilterExec::try_new(filter, scan).unwrap());
            let plan = FilterPushdown::new()
                .optimize(plan, &ConfigOptions::default())
                .unwrap();
            let scan = plan
                .downcast_ref::<MaskedScanExec>()
                .unwrap_or_else(|| panic!("the filter stays: {}", plan.name()))
                .clone();
            assert!(
                format!("{}", DisplayableExecutionPlan::new(&scan).one_line()).contains("filter="),
            );
            scan
        };
        let values = |exec: &MaskedScanExec| -> Vec<i64> {
            run_all(exec)
                .iter()
                .flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec())
                .collect()
        };
        let live_in = |range: std::ops::RangeInclusive<i64>| -> Vec<i64> {
            range.filter(|v| !deleted.contains(v)).collect()
        };
        // `v >= 150`, which no statistics pruned: the live rows from 150 on.
        let scan = pushed(v_at_least(150), file.clone());
        assert_eq!(values(&scan), live_in(150..=299));
        // Two filters, and a filter that gives nulls (no row passes a null).
        let both = Arc::new(BinaryExpr::new(
            v_at_least(60),
            Operator::And,
            Arc::new(BinaryExpr::new(
                Arc::new(Column::new("v", 0)),
                Operator::Lt,
                Arc::new(Literal::new(ScalarValue::Int64(Some(70)))),
            )),
        ));
        assert_eq!(values(&pushed(both, file.clone())), live_in(60..=69));
        let null = Arc::new(BinaryExpr::new(
            Arc::new(Column::new("v", 0)),
            Operator::GtEq,
            Arc::new(Literal::new(ScalarValue::Int64(None))),
        ));
        assert!(values(&pushed(null, file.clone())).is_empty());
        // A filter that fails on a deleted row (row 64) runs on the live rows alone, as over
        // the snapshot; on a live row (65) it fails the query.
        let scan = pushed(divides_by_v_minus(64), file.clone());
        assert_eq!(values(&scan), live_in(65..=164));
        let scan = pushed(divides_by_v_minus(65), file);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let stream = scan.execute(0, Arc::new(TaskContext::default())).unwrap();
        let e = runtime
            .block_on(stream.try_collect::<Vec<_>>())
            .unwrap_err();
        assert!(e.to_string().contains("Divide by zero"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
