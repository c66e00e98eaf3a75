//! [`RetinaTable`]: one table at one query's snapshot, read with VFoR.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::Session;
use datafusion::common::stats::Precision;
use datafusion::common::{DFSchema, ScalarValue, Statistics};
use datafusion::config::TableParquetOptions;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::physical_plan::parquet::CachedParquetFileReaderFactory;
use datafusion::datasource::physical_plan::parquet::{ParquetAccessPlan, RowGroupAccess};
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::datasource::table_schema::TableSchema;
use datafusion::datasource::{TableProvider, TableType};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, Operator, TableProviderFilterPushDown};
use datafusion::parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, Literal};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::union::UnionExec;
use futures::future::try_join_all;
use object_store::ObjectStoreExt;
use object_store::path::Path;
use retina_client::{
    BufferPart, ClientError, Connection, PartData, PlanFile, QueryInfo, RowGroupBitmap, ScanPlan,
    TableInfo,
};
use retina_protocol::query::MAX_ROW_GROUPS_PER_CALL;
use retina_storage::file::filter_visible_columns;
use retina_storage::{CREATE_TS_COLUMN, Timestamp};

use crate::live::{LiveRowsExec, Liveness};
use crate::masked::{Live, MaskedFile, MaskedScanExec};
use crate::parts::{OwnPartitionsExec, balance};
use crate::{QueryRef, RunningQuery, external};

/// Whether a scan applies visibility. `Ignore` reads every stored row, deleted or not and
/// whatever its creation time: it exists to measure what the check costs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Visibility {
    Check,
    Ignore,
}

/// A Retina table at one query's snapshot.
#[derive(Debug)]
pub struct RetinaTable {
    query: QueryRef,
    table: TableInfo,
    /// The user's columns, without `_create_ts`.
    schema: SchemaRef,
    visibility: Visibility,
}

impl RetinaTable {
    pub fn new(query: Arc<RunningQuery>, table: TableInfo, visibility: Visibility) -> RetinaTable {
        RetinaTable::of(QueryRef::Begun(query), table, visibility)
    }

    /// A table of a query that may still be beginning: its scans wait for the begin.
    pub(crate) fn of(query: QueryRef, table: TableInfo, visibility: Visibility) -> RetinaTable {
        RetinaTable {
            query,
            schema: user_schema(&table),
            table,
            visibility,
        }
    }
}

/// A table's columns as queries see them: the stored ones without `_create_ts`.
pub fn user_schema(table: &TableInfo) -> SchemaRef {
    let stored = table.schema.arrow_schema();
    let user = stored.project(&(0..table.schema.columns().len()).collect::<Vec<_>>());
    Arc::new(user.expect("the user's columns are a prefix of the stored ones"))
}

/// A write-buffer part in the object store: a flushed block, a segment, or a file combined
/// after the plan was made.
struct ObjectPart {
    path: String,
    rows: u64,
    bytes: Option<u64>,
    /// Every row was created by the snapshot (or visibility is not checked).
    settled: bool,
    /// Bit i = the object's row i, 1 = deleted at the snapshot.
    deleted: Vec<u64>,
    /// The newest `_create_ts` of its rows, where the node told it with the object's size:
    /// with the size, it tells this object from another written at the same path by an
    /// earlier run of the shard, and its footer may be cached (see [`object_file`]).
    identity: Option<u64>,
}

/// Whether each of `rows` rows has its bit set in `deleted` (bit i = row i).
fn every_row_deleted(rows: u64, deleted: &[u64]) -> bool {
    let full = (rows / 64) as usize;
    let rest = rows % 64;
    let words = full + usize::from(rest > 0);
    deleted.len() >= words
        && deleted[..full].iter().all(|&w| w == u64::MAX)
        && (rest == 0 || deleted[full] | (u64::MAX << rest) == u64::MAX)
}

/// A write-buffer object as DataFusion's scan reads it. DataFusion's footer cache checks an
/// entry against the object's size and modification time; an identified object's
/// modification time is its rows' newest `_create_ts` (as nanoseconds since the epoch). Within
/// a run of a shard an object is written once at its path; a shard restarted from a
/// checkpoint on a node of its own writes the blocks after the checkpoint again at the same
/// paths (a cluster's restarted shards number their files afresh), and a connection does not
/// outlive that node's restart. Size and newest `_create_ts` tell such objects apart besides.
fn object_file(o: &ObjectPart) -> PartitionedFile {
    let bytes = o.bytes.expect("every object's size is known by now");
    let mut pf = PartitionedFile::new(o.path.clone(), bytes);
    if let Some(ts) = o.identity {
        let secs = (ts / 1_000_000_000) as i64;
        pf.object_meta.last_modified =
            chrono::DateTime::from_timestamp(secs, (ts % 1_000_000_000) as u32)
                .expect("2^64 ns after the epoch is within chrono's range");
    }
    pf
}

/// One contiguous run of a file's row groups that one partition reads.
struct Unit {
    file: usize,
    row_group: usize,
    rows: u64,
    access: RowGroupAccess,
    /// The row group has rows created after the snapshot.
    straddles: bool,
    /// The row group's deleted rows (bit i = row i), where it has some and is read whole
    /// with them masked out as it is decoded.
    masked: Option<Vec<u64>>,
}

#[async_trait::async_trait]
impl TableProvider for RetinaTable {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Filters prune row groups and pages by their statistics and, with the session's
    /// `pushdown_filters`, run inside the Parquet reader; DataFusion checks them again.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let query = self.query.get().await?;
        let (plan, early) = query
            .plan(self.table.schema.name())
            .await
            .map_err(external)?;
        let snapshot = plan.snapshot;
        let schema = plan.table.schema.clone();
        let projection: Vec<usize> = match projection {
            Some(p) => p.clone(),
            None => (0..schema.columns().len()).collect(),
        };
        let out_schema = Arc::new(self.schema.project(&projection)?);
        let (url, prefix) = split_store_url(&plan.store_url)?;
        register_store(state, &url)?;
        let check = self.visibility == Visibility::Check;

        // The bitmaps and write buffers asked for with the plan, in the columns the statement
        // may read, where those hold the ones the scan reads; else asked for now. Memory parts
        // come in the columns asked for (and `_create_ts`).
        let early = match early {
            Some(e) if check && projection.iter().all(|c| e.columns.contains(c)) => {
                e.inputs.await.map(|inputs| (inputs, e.columns.to_vec()))
            }
            _ => None,
        };
        let (inputs, sent) = match early {
            Some(early) => early,
            None => {
                // An empty list would ask for every column: a scan that reads none (a row
                // count) asks for the first.
                let sent = if projection.is_empty() && !schema.columns().is_empty() {
                    vec![0]
                } else {
                    projection.clone()
                };
                let columns: Vec<u16> = sent.iter().map(|&c| c as u16).collect();
                let inputs = scan_inputs(&query.conn, query.info(), &plan, check, columns)
                    .await
                    .map_err(external)?;
                (Arc::new(inputs), sent)
            }
        };
        let ScanInputs { bitmaps, buffers } = &*inputs;

        let units = units(&plan.files, bitmaps, snapshot, check);
        let file_schema = schema.arrow_schema().clone();
        let predicate = pruning_predicate(state, &file_schema, filters)?;
        let partitions = state.config_options().execution.target_partitions.max(1);
        let mut inputs: Vec<Arc<dyn ExecutionPlan>> = Vec::new();

        let (straddling, whole): (Vec<Unit>, Vec<Unit>) =
            units.into_iter().partition(|u| check && u.straddles);
        let (masked, plain): (Vec<Unit>, Vec<Unit>) =
            whole.into_iter().partition(|u| u.masked.is_some());
        // `limit` only where every row read is returned: not before a filter on `_create_ts`
        // or on deleted rows.
        // Scans that read `_create_ts` prune by it too: row groups (and pages) whose rows were
        // all created after the snapshot.
        let ts = schema.create_ts_index();
        let created_predicate: Arc<dyn PhysicalExpr> = {
            let created = created_by(snapshot, ts);
            match &predicate {
                Some(p) => Arc::new(BinaryExpr::new(p.clone(), Operator::And, created)),
                None => created,
            }
        };
        let scan = |units: Vec<Unit>,
                    parts: usize,
                    columns: Vec<usize>,
                    limit: Option<usize>,
                    predicate: Option<Arc<dyn PhysicalExpr>>| {
            parquet_scan(
                state,
                &url,
                &prefix,
                &plan.files,
                units,
                parts,
                &file_schema,
                predicate,
                columns,
                limit,
            )
        };
        let plain_rows: u64 = plain.iter().map(|u| u.rows).sum();
        let masked_rows: u64 = masked.iter().map(|u| u.rows).sum();
        let share = |rows: u64| {
            let total = (plain_rows + masked_rows).max(1);
            ((partitions as u64 * rows).div_ceil(total) as usize).max(1)
        };
        if !plain.is_empty() {
            inputs.push(scan(
                plain,
                share(plain_rows),
                projection.clone(),
                limit,
                predicate.clone(),
            )?);
        }
        if !masked.is_empty() {
            // Row groups with deleted rows: read whole, the deleted rows masked out as each
            // batch is decoded.
            inputs.push(Arc::new(MaskedScanExec::new(
                url.clone(),
                masked_parts(&prefix, &plan.files, masked, share(masked_rows)),
                &file_schema,
                projection.clone(),
                predicate.clone(),
            )?));
        }
        if !straddling.is_empty() {
            // Row groups with rows created after the snapshot: read `_create_ts` as well, keep
            // the rows at or before the snapshot, and drop the column again.
            let mut columns = projection.clone();
            columns.push(ts);
            let input = scan(
                straddling,
                1,
                columns,
                None,
                Some(created_predicate.clone()),
            )?;
            let live = Liveness {
                at: projection.len(),
                created_by: Some(snapshot.get() as i64),
                bitmaps: None,
            };
            inputs.push(Arc::new(LiveRowsExec::try_new(input, live)?));
        }

        // The write buffers: in-memory blocks as they came; flushed blocks (and files combined
        // after the plan was made) are Parquet objects, scanned like files: in partitions, as
        // the query runs, pruned by their statistics.
        let mut memory = Vec::new();
        let mut objects = Vec::new();
        for part in buffers.iter().flatten() {
            match &part.data {
                PartData::Memory(batches) => memory.extend(memory_part(
                    &schema,
                    snapshot,
                    part,
                    batches,
                    &projection,
                    &sent,
                    &out_schema,
                    check,
                )?),
                PartData::Path(path) => objects.push(ObjectPart {
                    path: format!("{prefix}{path}"),
                    rows: part.rows,
                    bytes: part.bytes,
                    // Every row created by the snapshot: `_create_ts` need not be read.
                    settled: !check || part.max_create_ts.is_some_and(|t| t <= snapshot.get()),
                    deleted: part.deleted.clone(),
                    identity: part.max_create_ts.filter(|_| part.bytes.is_some()),
                }),
            }
        }
        // An object whose every row is deleted at the snapshot (each row of a block updated or
        // deleted since) holds nothing for it: it is not opened at all.
        if check {
            objects.retain(|o| !every_row_deleted(o.rows, &o.deleted));
        }
        tracing::debug!(
            table = self.table.schema.name(),
            files = plan.files.len(),
            blocks_in_store = objects.len(),
            rows_in_memory = memory.iter().map(RecordBatch::num_rows).sum::<usize>(),
            "scan"
        );
        // Sizes the node did not know (blocks flushed before it restarted) come from the store.
        let unknown: Vec<usize> = (0..objects.len())
            .filter(|&i| objects[i].bytes.is_none())
            .collect();
        if !unknown.is_empty() {
            let store = state.runtime_env().object_store(&url)?;
            let sizes = try_join_all(unknown.iter().map(|&i| {
                let store = store.clone();
                let path = Path::from(objects[i].path.as_str());
                async move { store.head(&path).await }
            }))
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
            for (i, meta) in unknown.into_iter().zip(sizes) {
                objects[i].bytes = Some(meta.size);
            }
        }
        // Objects whose rows the snapshot all sees are read like plain files, or where any of
        // them has deleted rows, all by one scan that reads each whole with those masked out
        // as they are decoded (as regular files' row groups are; one scan rather than two
        // measured the same in `retina bench overhead`); the others with `_create_ts`, kept
        // at or before the snapshot.
        let (settled, recent): (Vec<ObjectPart>, Vec<ObjectPart>) =
            objects.into_iter().partition(|o| o.settled);
        let any_deleted = check && settled.iter().any(|o| o.deleted.iter().any(|&w| w != 0));
        let (masked, settled): (Vec<ObjectPart>, Vec<ObjectPart>) = match any_deleted {
            true => (settled, Vec::new()),
            false => (Vec::new(), settled),
        };
        if !masked.is_empty() {
            let files = masked.iter().map(|o| {
                MaskedFile::whole(object_file(o), o.identity.is_some(), o.rows, &o.deleted)
            });
            inputs.push(Arc::new(MaskedScanExec::new(
                url.clone(),
                spread(files, partitions),
                &file_schema,
                projection.clone(),
                predicate.clone(),
            )?));
        }
        for (objects, settled) in [(settled, true), (recent, false)] {
            if objects.is_empty() {
                continue;
            }
            let rows: u64 = objects.iter().map(|o| o.rows).sum();
            let created = check && !settled;
            // Deleted rows are dropped by their number in the object (DataFusion's scan takes
            // objects across partitions, so each row carries its object too).
            let tagged = check && objects.iter().any(|o| o.deleted.iter().any(|&w| w != 0));
            // Footers are kept across queries where every object is identified (a block
            // flushed before the node restarted is not).
            let cache_footers = objects.iter().all(|o| o.identity.is_some());
            let blocks: Vec<PartitionedFile> = objects
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    let mut pf = object_file(o);
                    if tagged {
                        pf.partition_values = vec![ScalarValue::UInt32(Some(i as u32))];
                    }
                    pf
                })
                .collect();
            let (groups, balanced) = balance(
                blocks
                    .into_iter()
                    .map(|pf| (pf.object_meta.size, pf))
                    .collect(),
                partitions,
            );
            let mut columns = projection.clone();
            if created {
                columns.push(ts);
            }
            if tagged {
                let n = file_schema.fields().len();
                columns.extend([n, n + 1]);
            }
            let filtered = created || tagged;
            let input = scan_exec(
                state,
                &url,
                groups,
                rows,
                &file_schema,
                if created {
                    Some(created_predicate.clone())
                } else {
                    predicate.clone()
                },
                columns,
                if filtered { None } else { limit },
                tagged,
                cache_footers,
            )?;
            let input = Arc::new(OwnPartitionsExec::new(input, balanced));
            if filtered {
                let live = Liveness {
                    at: projection.len(),
                    created_by: created.then_some(snapshot.get() as i64),
                    bitmaps: tagged
                        .then(|| Arc::new(objects.into_iter().map(|o| o.deleted).collect())),
                };
                inputs.push(Arc::new(LiveRowsExec::try_new(input, live)?));
            } else {
                inputs.push(input);
            }
        }
        if !memory.is_empty() {
            inputs.push(MemorySourceConfig::try_new_exec(
                &[memory],
                out_schema.clone(),
                None,
            )?);
        }
        match inputs.len() {
            0 => Ok(Arc::new(EmptyExec::new(out_schema))),
            _ => UnionExec::try_new(inputs),
        }
    }
}

/// What a scan needs from the shards besides its plan: each plan file's bitmaps (of the row
/// groups created by the snapshot; none without the visibility check) and each write buffer.
pub(crate) struct ScanInputs {
    pub bitmaps: Vec<Vec<RowGroupBitmap>>,
    pub buffers: Vec<Vec<BufferPart>>,
}

/// Asks the shards for a scan's inputs, all at once: one `fileBitmaps` call per owner shard
/// and one `writeBuffer` call per shard, memory parts in `columns` (empty: every column).
pub(crate) async fn scan_inputs(
    conn: &Connection,
    query: QueryInfo,
    plan: &ScanPlan,
    check: bool,
    columns: Vec<u16>,
) -> Result<ScanInputs, ClientError> {
    let known: Vec<u64> = plan.files.iter().map(|f| f.file).collect();
    let files = &plan.files;
    let bitmaps = async {
        let calls = bitmap_calls(files, plan.snapshot, check);
        let answers = try_join_all(calls.into_iter().map(|(owner, asked)| async move {
            let ids = asked.iter().map(|(i, g)| (files[*i].file, g.clone()));
            let answers = conn.file_bitmaps(owner, query, ids.collect()).await?;
            Ok::<_, ClientError>(asked.into_iter().map(|(i, _)| i).zip(answers))
        }))
        .await?;
        let mut bitmaps = vec![Vec::new(); files.len()];
        for (i, bits) in answers.into_iter().flatten() {
            bitmaps[i] = bits;
        }
        Ok::<_, ClientError>(bitmaps)
    };
    let buffers = try_join_all(plan.buffers.iter().map(|&service| {
        conn.write_buffer(
            service,
            query,
            plan.table.id,
            known.clone(),
            columns.clone(),
        )
    }));
    let (bitmaps, buffers) = futures::try_join!(bitmaps, buffers)?;
    Ok(ScanInputs { bitmaps, buffers })
}

/// One `fileBitmaps` call: the owner shard, and its files (their index in the plan) with
/// the row groups asked of each.
type BitmapCall = (SocketAddr, Vec<(usize, Vec<u32>)>);

/// The bitmap calls a scan makes: for each owner shard, its files (their index in the plan)
/// with the row groups created by the snapshot, in calls of at most
/// [`MAX_ROW_GROUPS_PER_CALL`] row groups. None without the visibility check.
fn bitmap_calls(files: &[PlanFile], snapshot: Timestamp, check: bool) -> Vec<BitmapCall> {
    let mut calls: Vec<BitmapCall> = Vec::new();
    let mut open: HashMap<SocketAddr, (usize, u64)> = HashMap::new();
    for (i, f) in files.iter().enumerate() {
        let groups: Vec<u32> = (0..f.row_groups.len() as u32)
            .filter(|&g| f.row_groups[g as usize].min_create_ts <= snapshot.get())
            .collect();
        if !check || groups.is_empty() {
            continue;
        }
        let n = groups.len() as u64;
        let call = match open.get_mut(&f.owner) {
            Some((call, count)) if *count + n <= u64::from(MAX_ROW_GROUPS_PER_CALL) => {
                *count += n;
                *call
            }
            _ => {
                calls.push((f.owner, Vec::new()));
                open.insert(f.owner, (calls.len() - 1, n));
                calls.len() - 1
            }
        };
        calls[call].1.push((i, groups));
    }
    calls
}

/// The row groups to read, in file order, with their access from the bitmaps.
fn units(
    files: &[PlanFile],
    bitmaps: &[Vec<RowGroupBitmap>],
    snapshot: Timestamp,
    check: bool,
) -> Vec<Unit> {
    let mut out = Vec::new();
    for (f, (file, bits)) in files.iter().zip(bitmaps).enumerate() {
        let mut bits = bits.iter().peekable();
        for (g, rg) in file.row_groups.iter().enumerate() {
            if check && rg.min_create_ts > snapshot.get() {
                continue;
            }
            let straddles = rg.max_create_ts > snapshot.get();
            let mut access = RowGroupAccess::Scan;
            let mut masked = None;
            if let Some(b) = bits.next_if(|b| b.row_group as usize == g) {
                let deleted: u64 = b.deleted.iter().map(|w| u64::from(w.count_ones())).sum();
                if deleted >= rg.rows {
                    continue;
                }
                if deleted > 0 && straddles {
                    access = RowGroupAccess::Selection(selection(&b.deleted, rg.rows));
                } else if deleted > 0 {
                    // Decoding every row and masking the deleted ones out is much cheaper than
                    // a row selection that skips a row here and there (measured with `retina
                    // bench vfor`: 1% scattered deletes cost a third more as skip/select runs).
                    masked = Some(b.deleted.clone());
                }
            }
            out.push(Unit {
                file: f,
                row_group: g,
                rows: rg.rows,
                access,
                straddles,
                masked,
            });
        }
    }
    out
}

/// Masked units in up to `parts` partitions of about as many rows each, a file's row groups
/// together in file order (a file can be split between partitions).
fn masked_parts(
    prefix: &str,
    files: &[PlanFile],
    units: Vec<Unit>,
    parts: usize,
) -> Vec<Vec<MaskedFile>> {
    let pieces = units.into_iter().map(|u| {
        let file = &files[u.file];
        let mut piece = MaskedFile::new(format!("{prefix}{}", file.path), file.bytes);
        piece.push(u.row_group, u.rows, u.masked.as_deref().unwrap_or_default());
        piece
    });
    spread(pieces, parts)
}

/// `pieces` in order over about `parts` partitions of about as many rows each, the row groups
/// of one file that fall in one partition as one [`MaskedFile`].
fn spread(pieces: impl Iterator<Item = MaskedFile>, parts: usize) -> Vec<Vec<MaskedFile>> {
    let pieces: Vec<MaskedFile> = pieces.collect();
    let total: u64 = pieces.iter().map(MaskedFile::rows).sum();
    let per_part = total.div_ceil(parts as u64).max(1);
    let mut out: Vec<Vec<MaskedFile>> = vec![Vec::new()];
    let mut rows = 0u64;
    for piece in pieces {
        rows += piece.rows();
        let part = out.last_mut().expect("never empty");
        match (part.last_mut(), &piece.live) {
            (
                Some(MaskedFile {
                    file,
                    live: Live::Groups(to),
                    ..
                }),
                Live::Groups(groups),
            ) if file.object_meta.location == piece.file.object_meta.location => {
                to.extend(groups.iter().cloned())
            }
            _ => part.push(piece),
        }
        if rows >= per_part {
            out.push(Vec::new());
            rows = 0;
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

/// The rows whose bit is clear, as a row selection over `rows` rows.
fn selection(deleted: &[u64], rows: u64) -> RowSelection {
    let bit = |i: u64| {
        deleted
            .get((i / 64) as usize)
            .is_some_and(|w| w >> (i % 64) & 1 == 1)
    };
    let mut selectors = Vec::new();
    let mut i = 0;
    while i < rows {
        let skip = bit(i);
        let start = i;
        // Whole words at a time where the run allows.
        while i < rows {
            if i % 64 == 0 && i + 64 <= rows {
                let w = deleted.get((i / 64) as usize).copied().unwrap_or(0);
                if (skip && w == u64::MAX) || (!skip && w == 0) {
                    i += 64;
                    continue;
                }
            }
            if bit(i) != skip {
                break;
            }
            i += 1;
        }
        let n = (i - start) as usize;
        selectors.push(if skip {
            RowSelector::skip(n)
        } else {
            RowSelector::select(n)
        });
    }
    RowSelection::from(selectors)
}

/// DataFusion's Parquet scan of `units` in up to `parts` partitions of contiguous row groups
/// (a file can be split between partitions), each file with an access plan.
#[allow(clippy::too_many_arguments)]
fn parquet_scan(
    state: &dyn Session,
    url: &ObjectStoreUrl,
    prefix: &str,
    files: &[PlanFile],
    units: Vec<Unit>,
    parts: usize,
    file_schema: &SchemaRef,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    columns: Vec<usize>,
    limit: Option<usize>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let total: u64 = units.iter().map(|u| u.rows).sum();
    let per_part = total.div_ceil(parts as u64).max(1);
    let mut groups: Vec<Vec<PartitionedFile>> = Vec::new();
    let mut current: Vec<PartitionedFile> = Vec::new();
    let mut current_rows = 0u64;
    let mut open: Option<(usize, ParquetAccessPlan)> = None;
    let close = |open: &mut Option<(usize, ParquetAccessPlan)>, out: &mut Vec<PartitionedFile>| {
        if let Some((f, plan)) = open.take() {
            let file = &files[f];
            let pf = PartitionedFile::new(format!("{prefix}{}", file.path), file.bytes)
                .with_extension(plan);
            out.push(pf);
        }
    };
    for u in units {
        if open.as_ref().is_some_and(|(f, _)| *f != u.file) {
            close(&mut open, &mut current);
        }
        let (_, plan) = open.get_or_insert_with(|| {
            (
                u.file,
                ParquetAccessPlan::new_none(files[u.file].row_groups.len()),
            )
        });
        plan.set(u.row_group, u.access);
        current_rows += u.rows;
        if current_rows >= per_part {
            close(&mut open, &mut current);
            groups.push(std::mem::take(&mut current));
            current_rows = 0;
        }
    }
    close(&mut open, &mut current);
    if !current.is_empty() {
        groups.push(current);
    }
    // The partitions read about as many rows each, which DataFusion could not tell by the
    // files' sizes (a partition reads some of a file's row groups).
    let exec = scan_exec(
        state,
        url,
        groups,
        total,
        file_schema,
        predicate,
        columns,
        limit,
        false,
        true,
    )?;
    Ok(Arc::new(OwnPartitionsExec::new(exec, true)))
}

/// DataFusion's Parquet scan of `groups` (one partition each), `rows` rows in all (before
/// filters: the join planner's estimate, which picks build sides and whether to repartition).
/// `tagged`: each file carries its index as [`FILE_COLUMN`] and every row its number in the
/// object as [`ROW_COLUMN`], after the stored columns. `cache_footers`: the objects' footers
/// are kept in the session runtime's metadata cache across queries (regular files, written
/// once under their id; identified write-buffer objects, see [`object_file`]).
#[allow(clippy::too_many_arguments)]
fn scan_exec(
    state: &dyn Session,
    url: &ObjectStoreUrl,
    groups: Vec<Vec<PartitionedFile>>,
    rows: u64,
    file_schema: &SchemaRef,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    columns: Vec<usize>,
    limit: Option<usize>,
    tagged: bool,
    cache_footers: bool,
) -> Result<Arc<dyn ExecutionPlan>> {
    let mut options = TableParquetOptions {
        global: state.config_options().execution.parquet.clone(),
        ..Default::default()
    };
    // Retina writes no bloom filters (`retina_storage::file`): looking for them would cost every
    // object's open a pruning pass over its row groups that can prune nothing (about 40 µs an
    // object, measured in `retina bench overhead`).
    options.global.bloom_filter_on_read = false;
    let mut table_schema = TableSchema::builder(file_schema.clone());
    if tagged {
        let row = Field::new(ROW_COLUMN, DataType::Int64, false)
            .with_extension_type(datafusion::parquet::arrow::RowNumber);
        table_schema = table_schema
            .with_table_partition_cols(vec![Arc::new(Field::new(
                FILE_COLUMN,
                DataType::UInt32,
                false,
            ))])
            .with_virtual_columns(vec![Arc::new(row)]);
    }
    let table_schema = table_schema.build();
    let statistics = Statistics {
        num_rows: Precision::Inexact(rows as usize),
        ..Statistics::new_unknown(table_schema.table_schema())
    };
    let mut source = ParquetSource::new(table_schema).with_table_parquet_options(options);
    if cache_footers {
        // A regular file's object is written once, under its file id, and never changed (a
        // rewrite gets a new id): its footer is kept in the session runtime's metadata cache
        // and later queries skip reading and parsing it again.
        let store = state.runtime_env().object_store(url)?;
        let cache = state.runtime_env().cache_manager.get_file_metadata_cache();
        source = source.with_parquet_file_reader_factory(Arc::new(
            CachedParquetFileReaderFactory::new(store, cache),
        ));
    }
    if let Some(p) = predicate {
        source = source.with_predicate(p);
    }
    let config = FileScanConfigBuilder::new(url.clone(), Arc::new(source))
        .with_file_groups(groups.into_iter().map(FileGroup::new).collect())
        .with_projection_indices(Some(columns))?
        .with_limit(limit)
        .with_statistics(statistics)
        .build();
    Ok(DataSourceExec::from_data_source(config))
}

/// `_create_ts <= snapshot`, with `_create_ts` the input's column `at`.
fn created_by(snapshot: Timestamp, at: usize) -> Arc<dyn PhysicalExpr> {
    Arc::new(BinaryExpr::new(
        Arc::new(Column::new(CREATE_TS_COLUMN, at)),
        Operator::LtEq,
        Arc::new(Literal::new(ScalarValue::Int64(
            Some(snapshot.get() as i64),
        ))),
    ))
}

/// The partition column a tagged scan of buffer objects marks rows with: the object's index.
const FILE_COLUMN: &str = "_retina_file";
/// The virtual column a tagged scan numbers rows with, within their object.
const ROW_COLUMN: &str = "_retina_row";

/// The filters as one physical predicate over the stored schema, for pruning.
fn pruning_predicate(
    state: &dyn Session,
    file_schema: &SchemaRef,
    filters: &[Expr],
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let Some(expr) = conjunction(filters.to_vec()) else {
        return Ok(None);
    };
    let df_schema = DFSchema::try_from(file_schema.as_ref().clone())?;
    Ok(Some(state.create_physical_expr(expr, &df_schema)?))
}

/// An in-memory write-buffer part's visible rows in the columns `projection`. The shard sent
/// the columns `sent`, in that order, and `_create_ts` after them (every column, stored
/// order, where `sent` is empty).
#[allow(clippy::too_many_arguments)]
fn memory_part(
    schema: &retina_storage::TableSchema,
    snapshot: Timestamp,
    part: &BufferPart,
    batches: &[RecordBatch],
    projection: &[usize],
    sent: &[usize],
    out_schema: &SchemaRef,
    check: bool,
) -> Result<Option<RecordBatch>> {
    if batches.is_empty() {
        return Ok(None);
    }
    let none = vec![0u64; part.rows.div_ceil(64) as usize];
    let deleted = if check { &part.deleted } else { &none };
    // Without the check every row is visible: the newest timestamp there can be.
    let at = if check { snapshot } else { Timestamp::MAX };
    // Where each column read lies in the batches, then `_create_ts`: only those are copied.
    let keep: Vec<usize> = if sent.is_empty() {
        projection
            .iter()
            .copied()
            .chain([schema.create_ts_index()])
            .collect()
    } else {
        let at_sent = |c: &usize| {
            sent.iter().position(|s| s == c).ok_or_else(|| {
                DataFusionError::Internal(format!("column {c} was not asked of the shards"))
            })
        };
        // The shards send `_create_ts` after the columns asked.
        projection
            .iter()
            .map(at_sent)
            .chain([Ok(sent.len())])
            .collect::<Result<_>>()?
    };
    let kept: Vec<RecordBatch> = batches
        .iter()
        .map(|b| b.project(&keep))
        .collect::<std::result::Result<_, _>>()?;
    let batch = concat_batches(&kept[0].schema(), &kept)?;
    let columns: Vec<usize> = (0..projection.len()).collect();
    let visible = filter_visible_columns(&batch, projection.len(), at, deleted, &columns)
        .map_err(|e| DataFusionError::External(Box::new(e)))?;
    Ok(Some(with_schema(visible, out_schema)?))
}

/// `batch` under the table's field names and metadata (a zero-column batch keeps its rows).
fn with_schema(batch: RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let options = datafusion::arrow::record_batch::RecordBatchOptions::new()
        .with_row_count(Some(batch.num_rows()));
    Ok(RecordBatch::try_new_with_options(
        schema.clone(),
        batch.columns().to_vec(),
        &options,
    )?)
}

/// Makes sure the session can read the store at `url`: `file://` is always there; an
/// `s3://BUCKET` store not registered yet (by the application, say with
/// [`crate::s3_store`]) is built from this process's environment (`AWS_ACCESS_KEY_ID`,
/// `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, ...) and
/// registered in the session's runtime. DataFusion reads its Parquet with range requests.
fn register_store(state: &dyn Session, url: &ObjectStoreUrl) -> Result<()> {
    let runtime = state.runtime_env();
    if runtime.object_store(url).is_ok() {
        return Ok(());
    }
    let parsed: &url::Url = url.as_ref();
    if parsed.scheme() != "s3" {
        return Err(DataFusionError::Plan(format!(
            "the node's lake is at {url}, which this client cannot read (only file:// and \
             s3:// are supported)"
        )));
    }
    let bucket = parsed.host_str().unwrap_or_default();
    let store = crate::s3_store(bucket, &[])
        .map_err(|e| DataFusionError::Plan(format!("the node's lake is at {url}: {e}")))?;
    runtime.register_object_store(parsed, Arc::new(store));
    Ok(())
}

/// `file:///dir/` → (`file://`, `dir/`); `s3://bucket/prefix/` → (`s3://bucket`, `prefix/`).
fn split_store_url(url: &str) -> Result<(ObjectStoreUrl, String)> {
    let bad = || DataFusionError::Plan(format!("the node gave a bad store URL `{url}`"));
    let (scheme, rest) = url.split_once("://").ok_or_else(bad)?;
    let (authority, path) = rest.split_once('/').ok_or_else(bad)?;
    let mut prefix = path.trim_matches('/').to_owned();
    if !prefix.is_empty() {
        prefix.push('/');
    }
    Ok((
        ObjectStoreUrl::parse(format!("{scheme}://{authority}"))?,
        prefix,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_dead_where_each_of_its_rows_has_its_bit() {
        assert!(every_row_deleted(0, &[]));
        assert!(every_row_deleted(3, &[0b111]));
        assert!(!every_row_deleted(3, &[0b101]));
        // Bits past the rows do not count, and a short bitmap leaves rows live.
        assert!(every_row_deleted(3, &[u64::MAX]));
        assert!(every_row_deleted(64, &[u64::MAX]));
        assert!(!every_row_deleted(65, &[u64::MAX]));
        assert!(every_row_deleted(65, &[u64::MAX, 1]));
        assert!(!every_row_deleted(128, &[u64::MAX, u64::MAX >> 1]));
    }

    fn runs(s: &RowSelection) -> Vec<(bool, usize)> {
        s.iter().map(|r| (r.skip, r.row_count)).collect()
    }

    #[test]
    fn bitmaps_are_asked_once_per_owner_within_the_bound() {
        use retina_storage::file::RowGroupInfo;
        let (a, b): (SocketAddr, SocketAddr) = (
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        );
        let file = |id: u64, owner, created: &[u64]| PlanFile {
            file: id,
            path: format!("{id}.parquet"),
            bytes: 1,
            owner,
            row_groups: created
                .iter()
                .map(|&ts| RowGroupInfo {
                    offset: 0,
                    rows: 1,
                    min_create_ts: ts,
                    max_create_ts: ts,
                })
                .collect(),
        };
        let snapshot = Timestamp::new(10).unwrap();
        // Row groups created after the snapshot are not asked; a file with none left is not.
        let files = vec![
            file(1, a, &[5, 20, 7]),
            file(2, b, &[3]),
            file(3, a, &[30]),
            file(4, a, &[10]),
        ];
        let calls = bitmap_calls(&files, snapshot, true);
        assert_eq!(
            calls,
            vec![
                (a, vec![(0, vec![0, 2]), (3, vec![0])]),
                (b, vec![(1, vec![0])])
            ]
        );
        assert!(bitmap_calls(&files, snapshot, false).is_empty());
        // Past the bound, an owner's files go into another call.
        let big = vec![1u64; 40_000];
        let files = vec![file(1, a, &big), file(2, a, &big), file(3, a, &[1])];
        let calls = bitmap_calls(&files, snapshot, true);
        let shape: Vec<Vec<usize>> = calls
            .iter()
            .map(|(_, f)| f.iter().map(|(i, _)| *i).collect())
            .collect();
        assert_eq!(shape, vec![vec![0], vec![1, 2]]);
    }

    #[test]
    fn a_selection_skips_exactly_the_deleted_rows() {
        let mut deleted = vec![0u64; 3];
        for i in [0u64, 1, 63, 64, 130] {
            deleted[(i / 64) as usize] |= 1 << (i % 64);
        }
        let s = selection(&deleted, 140);
        assert_eq!(
            runs(&s),
            vec![
                (true, 2),
                (false, 61),
                (true, 2),
                (false, 65),
                (true, 1),
                (false, 9)
            ]
        );
        let all_deleted = selection(&[u64::MAX, u64::MAX], 100);
        assert_eq!(runs(&all_deleted), vec![(true, 100)]);
        assert_eq!(runs(&selection(&[0, 0], 128)), vec![(false, 128)]);
    }

    #[test]
    fn store_urls_split_into_the_store_and_a_prefix() {
        let (url, prefix) = split_store_url("file:///var/lib/retina/lake/").unwrap();
        assert_eq!(url.as_str(), "file:///");
        assert_eq!(prefix, "var/lib/retina/lake/");
        let (url, prefix) = split_store_url("s3://bucket/a/b").unwrap();
        assert_eq!(url.as_str(), "s3://bucket/");
        assert_eq!(prefix, "a/b/");
        assert!(split_store_url("nonsense").is_err());
    }
}
