//! The write buffer of one table on one shard: a virtual file of fixed-size blocks.
//!
//! Rows are appended to the active block (Arrow builders plus the hidden `_create_ts`). A full
//! block becomes immutable and waits in a queue to be flushed to the object store; once every
//! block of a full virtual file is flushed, the blocks are combined into one regular Parquet
//! file under the same file id. A row's location `(file id, offset)` is fixed when it is
//! appended, so neither a flush nor a combination touches the index.
//!
//! Until then, readers would open one small object per flushed block. So each run of flushed
//! blocks as long as a row group is combined into a *segment*: one object that readers open
//! instead of the run's blocks. Segments only serve reads: the blocks stay until the file is
//! combined (a checkpoint and recovery never need a segment), and the file's combination then
//! reads the segments instead of their blocks.
//!
//! The flushed blocks past the last segment (fewer than a segment's worth) would still be an
//! object each, and the segments one each. When a file has taken no row and flushed no block
//! for a while (the caller says how long, in ticks), those blocks and
//! the file's segments where it has at most [`TAIL_SEGMENTS`] of them, two objects or more,
//! are combined into a *tail* segment (a row group per segment's worth), which readers open in
//! their place until a longer tail or the next full segment supersedes it; a superseded tail
//! is handed back to retire. So a small quiet file is read as one object, as a combined file
//! is. While rows keep coming no tail is written, so a table being written to pays
//! nothing for them. A full file's combination reads its tail too.

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{
    ArrayRef, BooleanBuilder, Date32Builder, Decimal128Builder, Float32Builder, Float64Builder,
    Int32Builder, Int64Array, Int64Builder, StringBuilder, Time64MicrosecondBuilder,
    TimestampMicrosecondBuilder,
};
use arrow::record_batch::RecordBatch;
use object_store::path::Path;

use crate::config::StorageConfig;
use crate::index::{FileId, RowId, RowLocation};
use crate::schema::{ColumnType, TableSchema};
use crate::ts::Timestamp;
use crate::value::{RowRef, ValueRef};

/// A block of a virtual file: the file and the block's index in it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockId {
    pub file: FileId,
    pub index: u32,
}

/// The object-store path of a regular file.
pub fn file_path(table: &str, file: FileId) -> Path {
    Path::from(format!("tables/{table}/{file}.parquet"))
}

/// The object-store path of a flushed write-buffer block.
pub fn block_path(table: &str, block: BlockId) -> Path {
    Path::from(format!(
        "tables/{table}/buffer/{}-{:05}.parquet",
        block.file, block.index
    ))
}

/// The most full segments a tail takes in, besides the flushed blocks past them: a quiet file
/// of up to this many segments and a tail (at the defaults, up to about 360K rows) is then
/// read as one object, its segments' row groups copied as they are. A longer file's tail
/// takes in no segment. Each object a query opens costs it about 0.3 ms of opening and
/// pruning (`retina bench overhead`).
pub const TAIL_SEGMENTS: u32 = 4;

/// The object-store path of the segment of `blocks` blocks from `first` on.
pub fn segment_path(table: &str, first: BlockId, blocks: u32) -> Path {
    Path::from(format!(
        "tables/{table}/buffer/{}-{:05}-{blocks}.parquet",
        first.file, first.index
    ))
}

enum ColumnBuilder {
    Boolean(BooleanBuilder),
    Int32(Int32Builder),
    Int64(Int64Builder),
    Float32(Float32Builder),
    Float64(Float64Builder),
    Decimal(Decimal128Builder, u8, i8),
    Utf8(StringBuilder),
    Date(Date32Builder),
    /// `Timestamp` and `TimestampTz`, the latter with its time zone.
    Timestamp(TimestampMicrosecondBuilder, Option<Arc<str>>),
    Time(Time64MicrosecondBuilder),
}

impl ColumnBuilder {
    fn new(ty: ColumnType, rows: usize) -> Self {
        match ty {
            ColumnType::Boolean => Self::Boolean(BooleanBuilder::with_capacity(rows)),
            ColumnType::Int32 => Self::Int32(Int32Builder::with_capacity(rows)),
            ColumnType::Int64 => Self::Int64(Int64Builder::with_capacity(rows)),
            ColumnType::Float32 => Self::Float32(Float32Builder::with_capacity(rows)),
            ColumnType::Float64 => Self::Float64(Float64Builder::with_capacity(rows)),
            ColumnType::Decimal { precision, scale } => {
                Self::Decimal(Decimal128Builder::with_capacity(rows), precision, scale)
            }
            ColumnType::Utf8 => Self::Utf8(StringBuilder::with_capacity(rows, rows * 16)),
            ColumnType::Date => Self::Date(Date32Builder::with_capacity(rows)),
            ColumnType::Timestamp => {
                Self::Timestamp(TimestampMicrosecondBuilder::with_capacity(rows), None)
            }
            ColumnType::TimestampTz => Self::Timestamp(
                TimestampMicrosecondBuilder::with_capacity(rows),
                Some("UTC".into()),
            ),
            ColumnType::Time => Self::Time(Time64MicrosecondBuilder::with_capacity(rows)),
        }
    }

    /// Appends a value that was checked against the column.
    #[inline]
    fn push(&mut self, v: ValueRef<'_>) {
        match (self, v) {
            (Self::Boolean(b), ValueRef::Boolean(x)) => b.append_value(x),
            (Self::Int32(b), ValueRef::Int(x)) => b.append_value(x as i32),
            (Self::Int64(b), ValueRef::Int(x)) => b.append_value(x),
            (Self::Float32(b), ValueRef::Float(x)) => b.append_value(x as f32),
            (Self::Float64(b), ValueRef::Float(x)) => b.append_value(x),
            (Self::Decimal(b, ..), ValueRef::Decimal(x)) => b.append_value(x),
            (Self::Utf8(b), ValueRef::Utf8(x)) => b.append_value(x),
            (Self::Date(b), ValueRef::Date(x)) => b.append_value(x),
            (Self::Timestamp(b, _), ValueRef::Timestamp(x)) => b.append_value(x),
            (Self::Time(b), ValueRef::Time(x)) => b.append_value(x),
            (Self::Boolean(b), ValueRef::Null) => b.append_null(),
            (Self::Int32(b), ValueRef::Null) => b.append_null(),
            (Self::Int64(b), ValueRef::Null) => b.append_null(),
            (Self::Float32(b), ValueRef::Null) => b.append_null(),
            (Self::Float64(b), ValueRef::Null) => b.append_null(),
            (Self::Decimal(b, ..), ValueRef::Null) => b.append_null(),
            (Self::Utf8(b), ValueRef::Null) => b.append_null(),
            (Self::Date(b), ValueRef::Null) => b.append_null(),
            (Self::Timestamp(b, _), ValueRef::Null) => b.append_null(),
            (Self::Time(b), ValueRef::Null) => b.append_null(),
            (_, v) => panic!("a {} value reached the write buffer unchecked", v.kind()),
        }
    }

    /// The column so far, leaving the builder as it is (for reads of the active block).
    fn snapshot(&self) -> ArrayRef {
        match self {
            Self::Boolean(b) => Arc::new(b.finish_cloned()),
            Self::Int32(b) => Arc::new(b.finish_cloned()),
            Self::Int64(b) => Arc::new(b.finish_cloned()),
            Self::Float32(b) => Arc::new(b.finish_cloned()),
            Self::Float64(b) => Arc::new(b.finish_cloned()),
            Self::Decimal(b, p, s) => Arc::new(
                b.finish_cloned()
                    .with_precision_and_scale(*p, *s)
                    .expect("precision and scale were checked with the schema"),
            ),
            Self::Utf8(b) => Arc::new(b.finish_cloned()),
            Self::Date(b) => Arc::new(b.finish_cloned()),
            Self::Timestamp(b, tz) => Arc::new(b.finish_cloned().with_timezone_opt(tz.clone())),
            Self::Time(b) => Arc::new(b.finish_cloned()),
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Self::Boolean(b) => Arc::new(b.finish()),
            Self::Int32(b) => Arc::new(b.finish()),
            Self::Int64(b) => Arc::new(b.finish()),
            Self::Float32(b) => Arc::new(b.finish()),
            Self::Float64(b) => Arc::new(b.finish()),
            Self::Decimal(b, p, s) => Arc::new(
                b.finish()
                    .with_precision_and_scale(*p, *s)
                    .expect("precision and scale were checked with the schema"),
            ),
            Self::Utf8(b) => Arc::new(b.finish()),
            Self::Date(b) => Arc::new(b.finish()),
            Self::Timestamp(b, tz) => Arc::new(b.finish().with_timezone_opt(tz.clone())),
            Self::Time(b) => Arc::new(b.finish()),
        }
    }

    fn memory_bytes(&self) -> usize {
        use arrow::array::ArrayBuilder;
        let b: &dyn ArrayBuilder = match self {
            Self::Boolean(b) => b,
            Self::Int32(b) => b,
            Self::Int64(b) => b,
            Self::Float32(b) => b,
            Self::Float64(b) => b,
            Self::Decimal(b, ..) => b,
            Self::Utf8(b) => b,
            Self::Date(b) => b,
            Self::Timestamp(b, _) => b,
            Self::Time(b) => b,
        };
        // Builders do not report capacity; estimate from the rows they hold.
        let len = b.len();
        match self {
            Self::Boolean(_) => len / 8,
            Self::Int32(_) | Self::Float32(_) | Self::Date(_) => len * 4,
            Self::Int64(_) | Self::Float64(_) | Self::Timestamp(..) | Self::Time(_) => len * 8,
            Self::Decimal(..) => len * 16,
            Self::Utf8(s) => len * 4 + s.values_slice().len(),
        }
    }
}

/// The user's columns of `rows` (rows checked against `schema`) as Arrow arrays, in the
/// table's column order and without `_create_ts`: rows handed to another Arrow consumer.
pub fn user_columns<'a, R: RowRef + 'a>(
    schema: &TableSchema,
    rows: impl ExactSizeIterator<Item = &'a R>,
) -> Vec<ArrayRef> {
    let mut columns: Vec<_> = schema
        .columns()
        .iter()
        .map(|c| ColumnBuilder::new(c.ty, rows.len()))
        .collect();
    for row in rows {
        for (i, b) in columns.iter_mut().enumerate() {
            b.push(row.value(i));
        }
    }
    columns.iter_mut().map(|c| c.finish()).collect()
}

struct ActiveBlock {
    columns: Vec<ColumnBuilder>,
    create_ts: Vec<i64>,
}

impl ActiveBlock {
    fn new(schema: &TableSchema, rows: usize) -> Self {
        ActiveBlock {
            columns: schema
                .columns()
                .iter()
                .map(|c| ColumnBuilder::new(c.ty, rows))
                .collect(),
            create_ts: Vec::with_capacity(rows),
        }
    }

    fn rows(&self) -> usize {
        self.create_ts.len()
    }

    /// The block so far, leaving it to take more rows.
    fn snapshot(&self, schema: &TableSchema) -> RecordBatch {
        let arrays = self.columns.iter().map(|c| c.snapshot()).collect();
        batch(schema, arrays, self.create_ts.clone())
    }

    /// The block's rows, leaving it empty.
    fn finish(&mut self, schema: &TableSchema) -> RecordBatch {
        let arrays = self.columns.iter_mut().map(|c| c.finish()).collect();
        batch(schema, arrays, std::mem::take(&mut self.create_ts))
    }
}

fn batch(schema: &TableSchema, mut arrays: Vec<ArrayRef>, create_ts: Vec<i64>) -> RecordBatch {
    arrays.push(Arc::new(Int64Array::from(create_ts)));
    RecordBatch::try_new(schema.arrow_schema().clone(), arrays).expect("builders follow the schema")
}

/// Where a sealed block's rows are.
#[derive(Clone)]
enum BlockState {
    /// In memory, waiting to be flushed.
    Immutable(RecordBatch),
    /// In memory and being written; readers still use the memory copy.
    Flushing(RecordBatch),
    /// In the object store at [`block_path`]; the memory copy is gone.
    Flushed(ObjectFacts),
}

/// What a reader gets for one block of the buffer.
#[derive(Clone, Debug)]
pub enum BlockData {
    Memory(RecordBatch),
    Object(Path, ObjectFacts),
}

/// What a reader can know of an object without opening it: its size (a read needs no `HEAD`)
/// and its rows' newest creation time (a snapshot at or after it reads no `_create_ts`).
/// `None` where it is not known: a block flushed before a restart (checkpoints keep neither).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectFacts {
    pub bytes: Option<u64>,
    pub max_create_ts: Option<Timestamp>,
}

/// One block of the buffer as a reader sees it, with the rows' place in their file.
#[derive(Clone, Debug)]
pub struct BufferBlock {
    pub id: BlockId,
    /// Offset of the block's first row in its file.
    pub offset: u64,
    pub rows: u64,
    pub data: BlockData,
}

/// A virtual file: rows at fixed offsets under a pre-assigned file id, held as blocks.
pub struct VirtualFile {
    id: FileId,
    first_row: RowId,
    rows: u64,
    capacity: u64,
    sealed: Vec<BlockState>,
    active: Option<ActiveBlock>,
    combining: bool,
    /// Segments written: segment `k` holds blocks `k * segment_blocks` on, `segment_blocks`
    /// of them; readers use them in place of those blocks.
    segments: Vec<ObjectFacts>,
    /// Whether segment `segments` (or a tail) is being written.
    segment_in_flight: bool,
    /// A tail segment written; readers use it in place of its segments and blocks.
    tail: Option<Tail>,
    /// Ticks in a row in which the file took no row, flushed no block and wrote no segment.
    quiet_ticks: u32,
    /// Its rows at the last tick.
    rows_seen: u64,
}

impl VirtualFile {
    pub fn id(&self) -> FileId {
        self.id
    }

    /// The path of its tail segment, if one was written.
    fn tail_path(&self, table: &str) -> Option<Path> {
        self.tail
            .map(|t| self.object_path(table, t.first, t.blocks))
    }

    fn object_path(&self, table: &str, first: u32, blocks: u32) -> Path {
        let first = BlockId {
            file: self.id,
            index: first,
        };
        segment_path(table, first, blocks)
    }

    /// The objects readers open in place of the file's first flushed blocks, in row order:
    /// its segments up to its tail, then the tail; each `(first block, blocks, facts)`.
    fn objects(&self, segment_blocks: u32) -> impl Iterator<Item = (u32, u32, ObjectFacts)> {
        let before_tail = self
            .tail
            .map_or(self.segments.len(), |t| (t.first / segment_blocks) as usize);
        let segments = self.segments[..before_tail]
            .iter()
            .enumerate()
            .map(move |(k, facts)| (k as u32 * segment_blocks, segment_blocks, *facts));
        segments.chain(self.tail.map(|t| (t.first, t.blocks, t.facts)))
    }

    /// The flushed blocks its segments and tail cover, from its first on.
    fn covered(&self, segment_blocks: u32) -> u32 {
        let segments = self.segments.len() as u32 * segment_blocks;
        self.tail
            .map_or(segments, |t| segments.max(t.first + t.blocks))
    }

    pub fn first_row(&self) -> RowId {
        self.first_row
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
}

/// A tail segment: the flushed blocks from `first` on (a segment's first block) combined into
/// one object, `blocks` of them, with at most [`TAIL_SEGMENTS`] full segments' worth and fewer
/// than a segment's worth past them.
#[derive(Copy, Clone)]
struct Tail {
    first: u32,
    blocks: u32,
    facts: ObjectFacts,
}

/// A block the caller should write to the object store.
pub struct FlushJob {
    pub block: BlockId,
    pub batch: RecordBatch,
    pub path: Path,
}

/// Flushed rows of a virtual file the caller should combine into one object at `target`:
/// `sources`, in row order, hold `rows` rows.
#[derive(Clone, Debug)]
pub struct CombineJob {
    pub file: FileId,
    pub rows: u64,
    pub sources: Vec<Path>,
    pub target: Path,
    pub kind: CombineKind,
}

/// What a [`CombineJob`] makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CombineKind {
    /// The full virtual file's regular file; then every object of the virtual file (`retire`)
    /// goes once no query can read it.
    File { retire: Vec<Path> },
    /// A segment of `blocks` blocks from block `first` on, for readers: a full one, or a
    /// tail (see [`TAIL_SEGMENTS`]). Its first `segments` sources are full segments, whose
    /// row groups it takes as they are.
    Segment {
        first: u32,
        blocks: u32,
        segments: u32,
    },
}

/// What a finished [`CombineJob`] changed.
#[must_use]
pub enum Combined {
    /// The combined file's virtual file, which left the buffer.
    File(VirtualFile),
    /// Readers use the segment from now on; it superseded this tail segment, which should
    /// retire once no query can read it.
    Segment { superseded: Option<Path> },
}

/// A virtual file the buffer started: the caller maps its row ids and tracks its visibility.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct NewFile {
    pub file: FileId,
    pub first_row: RowId,
    pub capacity: u64,
}

/// The write buffer of one table.
pub struct WriteBuffer {
    schema: Arc<TableSchema>,
    block_rows: usize,
    file_rows: u64,
    /// Blocks per segment: a row group's worth.
    segment_blocks: u32,
    /// Oldest first; only the last one may be appending.
    files: VecDeque<VirtualFile>,
    next_row: u64,
}

impl WriteBuffer {
    pub fn new(schema: Arc<TableSchema>, config: &StorageConfig) -> Self {
        WriteBuffer {
            schema,
            block_rows: config.block_rows as usize,
            file_rows: config.file_rows,
            segment_blocks: segment_blocks(config),
            files: VecDeque::new(),
            next_row: 0,
        }
    }

    pub fn schema(&self) -> &Arc<TableSchema> {
        &self.schema
    }

    /// Whether the next append needs a new virtual file (and so a file id).
    pub fn needs_file(&self) -> bool {
        self.files.back().is_none_or(|f| f.rows == f.capacity)
    }

    /// Starts a virtual file under the pre-assigned `id`; the next rows go there.
    pub fn start_file(&mut self, id: FileId) -> NewFile {
        assert!(self.needs_file(), "the appending file still has room");
        let first_row = RowId(self.next_row);
        self.next_row += self.file_rows;
        self.files.push_back(VirtualFile {
            id,
            first_row,
            rows: 0,
            capacity: self.file_rows,
            sealed: Vec::new(),
            active: None,
            combining: false,
            segments: Vec::new(),
            segment_in_flight: false,
            tail: None,
            quiet_ticks: 0,
            rows_seen: 0,
        });
        NewFile {
            file: id,
            first_row,
            capacity: self.file_rows,
        }
    }

    /// Appends a row (checked against the schema) created at `ts`. The caller has started a
    /// file when [`Self::needs_file`] said so.
    pub fn append<R: RowRef + ?Sized>(&mut self, row: &R, ts: Timestamp) -> (RowId, RowLocation) {
        let schema = &self.schema;
        let block_rows = self.block_rows;
        let file = self.files.back_mut().expect("a file was started");
        assert!(file.rows < file.capacity, "the appending file is full");
        let active = file
            .active
            .get_or_insert_with(|| ActiveBlock::new(schema, block_rows));
        for (i, col) in active.columns.iter_mut().enumerate() {
            col.push(row.value(i));
        }
        active.create_ts.push(ts.get() as i64);
        let location = RowLocation {
            file: file.id,
            offset: file.rows,
        };
        let row_id = RowId(file.first_row.0 + file.rows);
        file.rows += 1;
        if active.rows() == block_rows {
            let batch = active.finish(schema);
            file.sealed.push(BlockState::Immutable(batch));
            file.active = None;
        }
        (row_id, location)
    }

    /// Every immutable block not yet being flushed; they are marked as flushing.
    pub fn take_flush_jobs(&mut self) -> Vec<FlushJob> {
        let table = self.schema.name();
        let mut jobs = Vec::new();
        for file in &mut self.files {
            for (index, state) in file.sealed.iter_mut().enumerate() {
                if let BlockState::Immutable(batch) = state {
                    let block = BlockId {
                        file: file.id,
                        index: index as u32,
                    };
                    let batch = batch.clone();
                    jobs.push(FlushJob {
                        block,
                        path: block_path(table, block),
                        batch: batch.clone(),
                    });
                    *state = BlockState::Flushing(batch);
                }
            }
        }
        jobs
    }

    /// The block is durable in the object store, `bytes` long: drop its memory copy.
    pub fn flush_done(&mut self, block: BlockId, bytes: u64) {
        let ts = self.schema.create_ts_index();
        let Some(file) = self.files.iter_mut().find(|f| f.id == block.file) else {
            return;
        };
        file.quiet_ticks = 0;
        if let Some(state) = file.sealed.get_mut(block.index as usize) {
            let BlockState::Flushing(batch) = state else {
                panic!("{block:?} was not flushing");
            };
            let facts = ObjectFacts {
                bytes: Some(bytes),
                max_create_ts: max_create_ts(batch, ts),
            };
            *state = BlockState::Flushed(facts);
        }
    }

    /// The flush failed: the block goes back to waiting.
    pub fn flush_failed(&mut self, block: BlockId) {
        if let Some(state) = self.block_state(block)
            && let BlockState::Flushing(batch) = state
        {
            *state = BlockState::Immutable(batch.clone());
        }
    }

    fn block_state(&mut self, block: BlockId) -> Option<&mut BlockState> {
        self.files
            .iter_mut()
            .find(|f| f.id == block.file)
            .and_then(|f| f.sealed.get_mut(block.index as usize))
    }

    /// The next combination to make, marked as in flight: the oldest full virtual file whose
    /// blocks are all flushed (and no segment in flight), else the oldest run of
    /// `segment_blocks` flushed blocks past a file's segments (one segment in flight per file,
    /// none in a full file, whose combination comes soon).
    pub fn take_combine_job(&mut self) -> Option<CombineJob> {
        let table = self.schema.name();
        let seg = self.segment_blocks;
        let flushed = |s: &BlockState| matches!(s, BlockState::Flushed(_));
        let block = |file: FileId, index: u32| block_path(table, BlockId { file, index });
        if let Some(file) = self.files.iter_mut().find(|f| {
            !f.combining
                && !f.segment_in_flight
                && f.rows == f.capacity
                && f.active.is_none()
                && f.sealed.iter().all(flushed)
        }) {
            file.combining = true;
            let blocks = file.sealed.len() as u32;
            let id = file.id;
            // Read the objects readers read (segments, and a tail) in place of their blocks.
            let mut sources: Vec<Path> = file
                .objects(seg)
                .map(|(first, n, _)| file.object_path(table, first, n))
                .collect();
            sources.extend((file.covered(seg)..blocks).map(|i| block(id, i)));
            // (A segment written before a restart is known to no checkpoint: recovery deleted
            // it with the other objects no shard reads.)
            let mut retire: Vec<Path> = (0..blocks).map(|i| block(id, i)).collect();
            retire.extend(
                (0..file.segments.len() as u32).map(|k| file.object_path(table, k * seg, seg)),
            );
            retire.extend(file.tail_path(table));
            return Some(CombineJob {
                file: id,
                rows: file.rows,
                sources,
                target: file_path(table, id),
                kind: CombineKind::File { retire },
            });
        }
        let file = self.files.iter_mut().find(|f| {
            let next = f.segments.len() * seg as usize;
            !f.combining
                && !f.segment_in_flight
                && f.rows < f.capacity
                && f.sealed
                    .get(next..next + seg as usize)
                    .is_some_and(|run| run.iter().all(flushed))
        })?;
        file.segment_in_flight = true;
        let first = file.segments.len() as u32 * seg;
        Some(segment_job(
            table,
            file.id,
            (first, seg),
            (0, seg),
            self.block_rows,
        ))
    }

    /// Counts a tick for every file (a quiet one if the file took no row since the last) and
    /// returns a tail segment to write, marked as in flight: of the flushed blocks past a
    /// file's segments and, where it has at most [`TAIL_SEGMENTS`], its segments, where those
    /// are two objects or more and more blocks than its tail has, in a file that is not full,
    /// has no segment in flight and has been quiet for `quiet_ticks` ticks in a row (counting
    /// this one; a flush or a segment written starts the count again). A table that keeps
    /// taking rows, however slowly, makes no tails. The caller calls this once a tick.
    pub fn take_tail_job(&mut self, quiet_ticks: u32) -> Option<CombineJob> {
        let table = self.schema.name();
        let seg = self.segment_blocks;
        for f in &mut self.files {
            if f.rows == f.rows_seen {
                f.quiet_ticks = f.quiet_ticks.saturating_add(1);
            } else {
                f.rows_seen = f.rows;
                f.quiet_ticks = 0;
            }
        }
        let (file, first, blocks, taken) = self.files.iter_mut().find_map(|f| {
            let segments = f.segments.len() as u32;
            let past = f
                .sealed
                .iter()
                .skip((segments * seg) as usize)
                .take_while(|s| matches!(s, BlockState::Flushed(_)))
                .count() as u32;
            // A small file's segments all, a longer file's none: taking in the last few
            // segments of a longer one measured slower for its full scans (Q1 at 4 warehouses
            // in `retina bench overhead`).
            let taken = if segments <= TAIL_SEGMENTS {
                segments
            } else {
                0
            };
            let first = (segments - taken) * seg;
            let blocks = taken * seg + past;
            // (A tail is dropped once a segment is written, so one left is of these segments.)
            let longer = taken + past >= 2 && f.tail.is_none_or(|t| blocks > t.blocks);
            (longer
                && past < seg
                && f.quiet_ticks >= quiet_ticks
                && !f.combining
                && !f.segment_in_flight
                && f.rows < f.capacity)
                .then_some((f, first, blocks, taken))
        })?;
        file.segment_in_flight = true;
        Some(segment_job(
            table,
            file.id,
            (first, blocks),
            (taken, seg),
            self.block_rows,
        ))
    }

    /// The combination is durable, as `facts` say. A combined file's virtual file leaves the
    /// buffer (and is returned); readers use a segment from now on, and a tail it supersedes
    /// is returned to retire.
    pub fn combine_done(&mut self, job: &CombineJob, facts: ObjectFacts) -> Combined {
        let table = self.schema.name();
        let seg = self.segment_blocks;
        let at = self.files.iter().position(|f| f.id == job.file);
        match job.kind {
            CombineKind::File { .. } => {
                let at = at.expect("a combined file was in the buffer");
                Combined::File(self.files.remove(at).expect("position is in range"))
            }
            CombineKind::Segment { first, blocks, .. } => {
                let f = &mut self.files[at.expect("a segment's file is in the buffer")];
                assert!(
                    f.segment_in_flight,
                    "a segment of file {} was in flight",
                    f.id
                );
                f.segment_in_flight = false;
                f.quiet_ticks = 0;
                let superseded = f.tail_path(table);
                // A tail has fewer than a segment's worth of blocks past the segments it takes
                // in, so only the next full segment starts at the segments' end and is a
                // segment long.
                if first == f.segments.len() as u32 * seg && blocks == seg {
                    f.segments.push(facts);
                    f.tail = None;
                } else {
                    f.tail = Some(Tail {
                        first,
                        blocks,
                        facts,
                    });
                }
                Combined::Segment { superseded }
            }
        }
    }

    /// The combination failed: it will be offered again.
    pub fn combine_failed(&mut self, job: &CombineJob) {
        let Some(f) = self.files.iter_mut().find(|f| f.id == job.file) else {
            return;
        };
        match job.kind {
            CombineKind::File { .. } => f.combining = false,
            CombineKind::Segment { .. } => f.segment_in_flight = false,
        }
    }

    /// Every block of every virtual file, for a reader: in-memory blocks (the active one
    /// included, as it is now) and flushed ones by path, a written segment or tail in place
    /// of its blocks (its id is its first block's).
    pub fn blocks(&self) -> Vec<BufferBlock> {
        let table = self.schema.name();
        let seg = self.segment_blocks;
        let mut out = Vec::new();
        for file in &self.files {
            // The segments, then a tail.
            for (first, blocks, facts) in file.objects(seg) {
                let id = BlockId {
                    file: file.id,
                    index: first,
                };
                out.push(BufferBlock {
                    id,
                    offset: u64::from(first) * self.block_rows as u64,
                    rows: u64::from(blocks) * self.block_rows as u64,
                    data: BlockData::Object(segment_path(table, id, blocks), facts),
                });
            }
            let covered = file.covered(seg) as usize;
            let mut offset = covered as u64 * self.block_rows as u64;
            for (index, state) in file.sealed.iter().enumerate().skip(covered) {
                let id = BlockId {
                    file: file.id,
                    index: index as u32,
                };
                let (rows, data) = match state {
                    BlockState::Immutable(b) | BlockState::Flushing(b) => {
                        (b.num_rows() as u64, BlockData::Memory(b.clone()))
                    }
                    // Every sealed block is full.
                    BlockState::Flushed(facts) => (
                        self.block_rows as u64,
                        BlockData::Object(block_path(table, id), *facts),
                    ),
                };
                out.push(BufferBlock {
                    id,
                    offset,
                    rows,
                    data,
                });
                offset += rows;
            }
            if let Some(active) = &file.active
                && active.rows() > 0
            {
                let batch = active.snapshot(&self.schema);
                out.push(BufferBlock {
                    id: BlockId {
                        file: file.id,
                        index: file.sealed.len() as u32,
                    },
                    offset,
                    rows: active.rows() as u64,
                    data: BlockData::Memory(batch),
                });
            }
        }
        out
    }

    pub fn files(&self) -> impl Iterator<Item = &VirtualFile> {
        self.files.iter()
    }

    /// Bytes of row data held in memory (active, immutable and flushing blocks).
    pub fn memory_bytes(&self) -> usize {
        let mut total = 0;
        for file in &self.files {
            for state in &file.sealed {
                if let BlockState::Immutable(b) | BlockState::Flushing(b) = state {
                    total += b.get_array_memory_size();
                }
            }
            if let Some(active) = &file.active {
                total += active.create_ts.capacity() * 8;
                total += active
                    .columns
                    .iter()
                    .map(|c| c.memory_bytes())
                    .sum::<usize>();
            }
        }
        total
    }
}

/// The newest `_create_ts` of `batch`'s rows (its column `ts`), if it has rows.
fn max_create_ts(batch: &RecordBatch, ts: usize) -> Option<Timestamp> {
    let column = batch.column(ts).as_any().downcast_ref::<Int64Array>()?;
    let max = arrow::compute::max(column)?;
    Timestamp::new(u64::try_from(max).ok()?).ok()
}

/// A sealed block as a checkpoint holds it.
pub enum BlockImage {
    /// In the object store at [`block_path`].
    Flushed,
    Memory(RecordBatch),
}

/// A virtual file as a checkpoint holds it.
pub struct VirtualFileImage {
    pub id: FileId,
    pub first_row: RowId,
    pub rows: u64,
    pub capacity: u64,
    pub sealed: Vec<BlockImage>,
    /// The rows of the partly filled block, if any.
    pub active: Option<RecordBatch>,
}

/// A write buffer as a checkpoint holds it: every row it has, in memory or by path.
pub struct BufferImage {
    pub next_row: u64,
    pub files: Vec<VirtualFileImage>,
}

impl WriteBuffer {
    /// The buffer as it is now, for a checkpoint. A block being flushed counts as in memory:
    /// the checkpoint must not depend on a write that may not finish.
    pub fn image(&self) -> BufferImage {
        BufferImage {
            next_row: self.next_row,
            files: self
                .files
                .iter()
                .map(|f| VirtualFileImage {
                    id: f.id,
                    first_row: f.first_row,
                    rows: f.rows,
                    capacity: f.capacity,
                    sealed: f
                        .sealed
                        .iter()
                        .map(|s| match s {
                            BlockState::Immutable(b) | BlockState::Flushing(b) => {
                                BlockImage::Memory(b.clone())
                            }
                            BlockState::Flushed(_) => BlockImage::Flushed,
                        })
                        .collect(),
                    active: f
                        .active
                        .as_ref()
                        .filter(|a| a.rows() > 0)
                        .map(|a| a.snapshot(&self.schema)),
                })
                .collect(),
        }
    }

    /// The objects the buffer reads: its flushed blocks.
    pub fn flushed_blocks(&self) -> Vec<Path> {
        let table = self.schema.name();
        let mut out = Vec::new();
        for f in &self.files {
            for (index, s) in f.sealed.iter().enumerate() {
                if matches!(s, BlockState::Flushed(_)) {
                    out.push(block_path(
                        table,
                        BlockId {
                            file: f.id,
                            index: index as u32,
                        },
                    ));
                }
            }
        }
        out
    }

    /// The buffer a checkpoint holds. Its blocks' rows are checked against the layout: every
    /// sealed block full, the active one holding the rest.
    pub fn from_image(
        schema: Arc<TableSchema>,
        config: &StorageConfig,
        image: BufferImage,
    ) -> crate::error::Result<Self> {
        let corrupt = |reason: String| crate::error::StorageError::Corrupt {
            what: format!("the write buffer of `{}` in a checkpoint", schema.name()),
            reason,
        };
        let block_rows = config.block_rows as usize;
        let mut types: Vec<ColumnType> = schema.columns().iter().map(|c| c.ty).collect();
        types.push(ColumnType::Int64);
        let mut files = VecDeque::new();
        for f in image.files {
            let sealed_rows = (f.sealed.len() * block_rows) as u64;
            let active_rows = f.active.as_ref().map_or(0, |b| b.num_rows() as u64);
            if f.capacity != config.file_rows
                || sealed_rows + active_rows != f.rows
                || f.rows > f.capacity
                || active_rows >= block_rows as u64
            {
                return Err(corrupt(format!(
                    "file {} holds {} rows in {} sealed blocks and {active_rows} active rows \
                     (capacity {}); the settings' block and file rows must be the checkpoint's",
                    f.id,
                    f.rows,
                    f.sealed.len(),
                    f.capacity
                )));
            }
            let mut sealed = Vec::with_capacity(f.sealed.len());
            for b in f.sealed {
                sealed.push(match b {
                    // Checkpoints keep no facts of an object.
                    BlockImage::Flushed => BlockState::Flushed(ObjectFacts::default()),
                    BlockImage::Memory(batch) => {
                        if batch.num_rows() != block_rows
                            || batch.schema() != *schema.arrow_schema()
                        {
                            return Err(corrupt(format!(
                                "a sealed block of file {} does not match the table",
                                f.id
                            )));
                        }
                        BlockState::Immutable(batch)
                    }
                });
            }
            let active = match f.active {
                None => None,
                Some(batch) => {
                    if batch.schema() != *schema.arrow_schema() {
                        return Err(corrupt(format!(
                            "the active block of file {} does not match the table",
                            f.id
                        )));
                    }
                    let mut a = ActiveBlock::new(&schema, block_rows);
                    for row in crate::schema::batch_rows(&batch, &types) {
                        let (ts, values) = row.split_last().expect("_create_ts is last");
                        for (col, v) in a.columns.iter_mut().zip(values) {
                            col.push(v.as_ref());
                        }
                        match ts {
                            crate::value::Value::Int(ts) => a.create_ts.push(*ts),
                            other => return Err(corrupt(format!("_create_ts is {other:?}"))),
                        }
                    }
                    Some(a)
                }
            };
            files.push_back(VirtualFile {
                id: f.id,
                first_row: f.first_row,
                rows: f.rows,
                capacity: f.capacity,
                sealed,
                active,
                combining: false,
                segments: Vec::new(),
                segment_in_flight: false,
                tail: None,
                quiet_ticks: 0,
                rows_seen: f.rows,
            });
        }
        Ok(WriteBuffer {
            schema,
            block_rows,
            file_rows: config.file_rows,
            segment_blocks: segment_blocks(config),
            files,
            next_row: image.next_row,
        })
    }
}

/// The job that combines `blocks` flushed blocks of file `id` from block `first` on into a
/// segment (a full one, or a tail): read from the `segments` full segments of
/// `segment_blocks` blocks that start there, then the blocks past them.
fn segment_job(
    table: &str,
    id: FileId,
    (first, blocks): (u32, u32),
    (segments, segment_blocks): (u32, u32),
    block_rows: usize,
) -> CombineJob {
    let at = |index| BlockId { file: id, index };
    let past = first + segments * segment_blocks;
    let mut sources: Vec<Path> = (0..segments)
        .map(|k| segment_path(table, at(first + k * segment_blocks), segment_blocks))
        .collect();
    sources.extend((past..first + blocks).map(|index| block_path(table, at(index))));
    CombineJob {
        file: id,
        rows: u64::from(blocks) * block_rows as u64,
        sources,
        target: segment_path(table, at(first), blocks),
        kind: CombineKind::Segment {
            first,
            blocks,
            segments,
        },
    }
}

/// Blocks per segment: a row group's worth, and at least two.
fn segment_blocks(config: &StorageConfig) -> u32 {
    (config.row_group_rows / config.block_rows).max(2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::ColumnDef;
    use crate::value::Value;

    /// Blocks of 64 rows, segments of two blocks, files of six blocks.
    fn config() -> StorageConfig {
        StorageConfig {
            tile_rows: 64,
            block_rows: 64,
            row_group_rows: 128,
            file_rows: 384,
            zstd_level: 0,
        }
    }

    fn buffer() -> WriteBuffer {
        buffer_with(&config())
    }

    fn buffer_with(config: &StorageConfig) -> WriteBuffer {
        let schema = TableSchema::new(
            "t",
            vec![ColumnDef::new("id", ColumnType::Int64, false)],
            &["id"],
        )
        .unwrap();
        WriteBuffer::new(schema, config)
    }

    fn append(b: &mut WriteBuffer, rows: usize) {
        for i in 0..rows {
            if b.needs_file() {
                b.start_file(FileId(b.files.len() as u64 + 1));
            }
            b.append(&vec![Value::Int(i as i64)], Timestamp::new(1).unwrap());
        }
    }

    fn flush_all(b: &mut WriteBuffer) {
        for job in b.take_flush_jobs() {
            b.flush_done(job.block, 1);
        }
    }

    /// Each block a reader gets: its first block, offset, rows and whether it is an object.
    fn layout(b: &WriteBuffer) -> Vec<(u32, u64, u64, Option<String>)> {
        b.blocks()
            .into_iter()
            .map(|x| {
                let path = match x.data {
                    BlockData::Object(p, _) => Some(p.to_string()),
                    BlockData::Memory(_) => None,
                };
                (x.id.index, x.offset, x.rows, path)
            })
            .collect()
    }

    #[test]
    fn runs_of_flushed_blocks_become_segments_readers_use_in_their_place() {
        let mut b = buffer();
        append(&mut b, 64 * 3 + 10);
        // Nothing flushed: no segment.
        assert!(b.take_combine_job().is_none());
        flush_all(&mut b);
        let job = b.take_combine_job().expect("blocks 0 and 1 make a segment");
        let f = FileId(1);
        assert_eq!(
            job.kind,
            CombineKind::Segment {
                first: 0,
                blocks: 2,
                segments: 0
            }
        );
        assert_eq!(job.rows, 128);
        assert_eq!(
            job.sources,
            [0, 1].map(|index| block_path("t", BlockId { file: f, index }))
        );
        assert_eq!(
            job.target,
            segment_path("t", BlockId { file: f, index: 0 }, 2)
        );
        // One segment of a file in flight at a time.
        assert!(b.take_combine_job().is_none());
        // Until it is written, readers read the blocks.
        assert_eq!(layout(&b).len(), 4);
        let _ = b.combine_done(&job, ObjectFacts::default());
        let seg = Some(segment_path("t", BlockId { file: f, index: 0 }, 2).to_string());
        let block2 = Some(block_path("t", BlockId { file: f, index: 2 }).to_string());
        assert_eq!(
            layout(&b),
            [
                (0, 0, 128, seg.clone()),
                (2, 128, 64, block2),
                (3, 192, 10, None)
            ]
        );
        // Block 2 alone is not a run: no job.
        assert!(b.take_combine_job().is_none());
    }

    #[test]
    fn readers_get_the_facts_of_flushed_blocks_and_segments_and_none_after_a_checkpoint() {
        let mut b = buffer();
        for i in 0..64 * 3 {
            if b.needs_file() {
                b.start_file(FileId(1));
            }
            // Row i created at 10 + i: block k's newest row is 10 + 64k + 63.
            b.append(&vec![Value::Int(i)], Timestamp::new(10 + i as u64).unwrap());
        }
        for job in b.take_flush_jobs() {
            b.flush_done(job.block, 1000 + u64::from(job.block.index));
        }
        let facts = |b: &WriteBuffer| -> Vec<ObjectFacts> {
            b.blocks()
                .into_iter()
                .filter_map(|x| match x.data {
                    BlockData::Object(_, f) => Some(f),
                    BlockData::Memory(_) => None,
                })
                .collect()
        };
        let known = |bytes: u64, ts: u64| ObjectFacts {
            bytes: Some(bytes),
            max_create_ts: Some(Timestamp::new(ts).unwrap()),
        };
        assert_eq!(
            facts(&b),
            [known(1000, 73), known(1001, 137), known(1002, 201)]
        );
        let job = b.take_combine_job().unwrap();
        let _ = b.combine_done(&job, known(5000, 137));
        assert_eq!(facts(&b), [known(5000, 137), known(1002, 201)]);
        // A checkpoint keeps the flushed blocks, not what was known of them.
        let restored = WriteBuffer::from_image(b.schema().clone(), &config(), b.image()).unwrap();
        assert_eq!(facts(&restored), [ObjectFacts::default(); 3]);
    }

    #[test]
    fn a_failed_segment_is_offered_again_and_a_full_file_reads_its_segments() {
        let mut b = buffer();
        append(&mut b, 64 * 4);
        flush_all(&mut b);
        let job = b.take_combine_job().unwrap();
        b.combine_failed(&job);
        let again = b.take_combine_job().unwrap();
        assert_eq!(again.kind, job.kind);
        let _ = b.combine_done(&again, ObjectFacts::default());
        let next = b.take_combine_job().unwrap();
        assert_eq!(
            next.kind,
            CombineKind::Segment {
                first: 2,
                blocks: 2,
                segments: 0
            }
        );
        // The file fills while the second segment is in flight: its combination waits.
        append(&mut b, 128);
        flush_all(&mut b);
        assert!(b.take_combine_job().is_none());
        let _ = b.combine_done(&next, ObjectFacts::default());
        let f = FileId(1);
        let file = b.take_combine_job().expect("the full file combines");
        let seg = |index| segment_path("t", BlockId { file: f, index }, 2);
        let block = |index| block_path("t", BlockId { file: f, index });
        assert_eq!(file.rows, 384);
        assert_eq!(file.target, file_path("t", f));
        assert_eq!(file.sources, [seg(0), seg(2), block(4), block(5)]);
        let CombineKind::File { retire } = &file.kind else {
            panic!("{:?}", file.kind)
        };
        let mut expected: Vec<Path> = (0..6).map(block).collect();
        expected.extend([seg(0), seg(2)]);
        assert_eq!(retire, &expected);
        // The next file starts with no segment; the combined one leaves.
        append(&mut b, 1);
        assert!(matches!(
            b.combine_done(&file, ObjectFacts::default()),
            Combined::File(_)
        ));
        assert_eq!(layout(&b), [(0, 0, 1, None)]);
    }

    /// Blocks of 64 rows, segments of four blocks, files of twelve blocks.
    fn four_block_segments() -> WriteBuffer {
        buffer_with(&StorageConfig {
            row_group_rows: 256,
            file_rows: 768,
            ..config()
        })
    }

    /// Ticks `b` until it offers a tail job (at most `ticks` times), with `quiet` ticks asked.
    fn tail_within(b: &mut WriteBuffer, quiet: u32, ticks: u32) -> Option<(u32, CombineJob)> {
        (1..=ticks).find_map(|tick| b.take_tail_job(quiet).map(|job| (tick, job)))
    }

    #[test]
    fn a_quiet_tail_becomes_a_segment_until_a_longer_one_or_the_full_segment_supersedes_it() {
        let mut b = four_block_segments();
        let f = FileId(1);
        let tail =
            |blocks| Some(segment_path("t", BlockId { file: f, index: 0 }, blocks).to_string());
        let path = |blocks| segment_path("t", BlockId { file: f, index: 0 }, blocks);
        // One flushed block is no tail, however quiet.
        append(&mut b, 64 + 10);
        flush_all(&mut b);
        assert!(tail_within(&mut b, 3, 10).is_none());
        // A second block: the tail comes once the file was quiet for 3 ticks (the tick that
        // sees its rows is not quiet).
        append(&mut b, 64);
        flush_all(&mut b);
        let (tick, job) = tail_within(&mut b, 3, 10).expect("two quiet blocks make a tail");
        assert_eq!(tick, 4);
        assert_eq!(
            job.kind,
            CombineKind::Segment {
                first: 0,
                blocks: 2,
                segments: 0
            }
        );
        assert_eq!((job.rows, job.target.clone()), (128, path(2)));
        assert_eq!(
            job.sources,
            [0, 1].map(|index| block_path("t", BlockId { file: f, index }))
        );
        // In flight: nothing more is offered, and readers still read the blocks.
        assert!(tail_within(&mut b, 1, 5).is_none());
        assert!(b.take_combine_job().is_none());
        assert_eq!(layout(&b).len(), 3);
        let Combined::Segment { superseded: None } = b.combine_done(&job, ObjectFacts::default())
        else {
            panic!("the first tail supersedes nothing")
        };
        assert_eq!(layout(&b), [(0, 0, 128, tail(2)), (2, 128, 10, None)]);
        // The same blocks are never written again.
        assert!(tail_within(&mut b, 1, 5).is_none());
        // A failed tail is offered again; a longer one supersedes the one before.
        append(&mut b, 64);
        flush_all(&mut b);
        let (_, job) = tail_within(&mut b, 3, 10).unwrap();
        b.combine_failed(&job);
        let (_, job) = tail_within(&mut b, 3, 10).expect("offered again");
        assert_eq!((job.rows, job.target.clone()), (192, path(3)));
        let Combined::Segment { superseded } = b.combine_done(&job, ObjectFacts::default()) else {
            panic!("a tail is a segment")
        };
        assert_eq!(superseded, Some(path(2)));
        assert_eq!(layout(&b), [(0, 0, 192, tail(3)), (3, 192, 10, None)]);
        // Four flushed blocks make the full segment, not a tail; it supersedes the tail.
        append(&mut b, 64);
        flush_all(&mut b);
        assert!(tail_within(&mut b, 1, 5).is_none());
        let job = b.take_combine_job().expect("the full segment");
        assert_eq!(job.target, path(4));
        let Combined::Segment { superseded } = b.combine_done(&job, ObjectFacts::default()) else {
            panic!("a segment")
        };
        assert_eq!(superseded, Some(path(3)));
        assert_eq!(layout(&b), [(0, 0, 256, tail(4)), (4, 256, 10, None)]);
    }

    #[test]
    fn a_small_file_s_tail_takes_in_its_segments_and_a_longer_one_s_none() {
        // Segments of four blocks, files of forty blocks.
        const SEG: u32 = 4;
        let mut b = buffer_with(&StorageConfig {
            row_group_rows: 64 * SEG,
            file_rows: 64 * 40,
            ..config()
        });
        let f = FileId(1);
        let at = |index| BlockId { file: f, index };
        let write_segments = |b: &mut WriteBuffer| {
            while let Some(job) = b.take_combine_job() {
                assert!(matches!(job.kind, CombineKind::Segment { blocks: SEG, .. }));
                let _ = b.combine_done(&job, ObjectFacts::default());
            }
        };
        let blocks = |b: &mut WriteBuffer, n: u32| {
            append(b, 64 * n as usize);
            flush_all(b);
        };
        // One full segment and nothing past it: a single object already, no tail.
        blocks(&mut b, SEG);
        write_segments(&mut b);
        assert!(tail_within(&mut b, 1, 5).is_none());
        // As many segments as a tail takes in and a block: one tail of them all, read from the
        // segments and the block.
        let small = SEG * TAIL_SEGMENTS;
        blocks(&mut b, small - SEG + 1);
        write_segments(&mut b);
        let (_, tail) = tail_within(&mut b, 1, 5).expect("a quiet file's tail");
        let kind = CombineKind::Segment {
            first: 0,
            blocks: small + 1,
            segments: TAIL_SEGMENTS,
        };
        assert_eq!(tail.kind, kind);
        let mut sources: Vec<Path> = (0..TAIL_SEGMENTS)
            .map(|k| segment_path("t", at(SEG * k), SEG))
            .collect();
        sources.push(block_path("t", at(small)));
        assert_eq!(tail.sources, sources);
        assert_eq!(tail.rows, 64 * u64::from(small + 1));
        let Combined::Segment { superseded: None } = b.combine_done(&tail, ObjectFacts::default())
        else {
            panic!("the first tail supersedes nothing")
        };
        let path = |first, n| Some(segment_path("t", at(first), n).to_string());
        assert_eq!(
            layout(&b),
            [(0, 0, 64 * u64::from(small + 1), path(0, small + 1))]
        );
        // The next full segment supersedes the tail: readers open every segment again.
        blocks(&mut b, SEG - 1);
        let job = b.take_combine_job().expect("the next segment");
        assert_eq!(job.target, segment_path("t", at(small), SEG));
        let Combined::Segment { superseded } = b.combine_done(&job, ObjectFacts::default()) else {
            panic!("a segment")
        };
        assert_eq!(superseded, Some(segment_path("t", at(0), small + 1)));
        let rows = 64 * u64::from(SEG);
        let segments = |n: u32| -> Vec<_> {
            (0..n)
                .map(|k| (SEG * k, rows * u64::from(k), rows, path(SEG * k, SEG)))
                .collect()
        };
        assert_eq!(layout(&b), segments(TAIL_SEGMENTS + 1));
        // A longer file: its tail takes in no segment, only the blocks past them.
        blocks(&mut b, 2);
        let (_, tail) = tail_within(&mut b, 1, 5).expect("a quiet file's tail");
        let past = small + SEG;
        let kind = CombineKind::Segment {
            first: past,
            blocks: 2,
            segments: 0,
        };
        assert_eq!(tail.kind, kind);
        let _ = b.combine_done(&tail, ObjectFacts::default());
        let mut expected = segments(TAIL_SEGMENTS + 1);
        expected.push((past, 64 * u64::from(past), 128, path(past, 2)));
        assert_eq!(layout(&b), expected);
    }

    #[test]
    fn blocks_still_coming_make_no_tail_and_a_full_file_retires_its_tail() {
        let mut b = four_block_segments();
        let f = FileId(1);
        // Rows that keep coming, however few, leave no 3 quiet ticks: a row each tick for a
        // while makes no tail of blocks 0 and 1.
        append(&mut b, 64 * 2);
        flush_all(&mut b);
        for _ in 0..10 {
            append(&mut b, 1);
            assert!(b.take_tail_job(3).is_none());
        }
        append(&mut b, 64 * 2 - 10);
        // A block flushed every other tick never leaves 3 quiet ticks either.
        for _ in 0..2 {
            flush_all(&mut b);
            assert!(b.take_tail_job(3).is_none());
            assert!(b.take_tail_job(3).is_none());
            append(&mut b, 64);
        }
        flush_all(&mut b);
        // Blocks 4 and 5 after the first segment: their tail takes in the segment.
        let job = b.take_combine_job().unwrap();
        let _ = b.combine_done(&job, ObjectFacts::default());
        let (_, tail) = tail_within(&mut b, 3, 10).unwrap();
        let segment = segment_path("t", BlockId { file: f, index: 0 }, 4);
        let tail_path = segment_path("t", BlockId { file: f, index: 0 }, 6);
        assert_eq!(
            (tail.target.clone(), tail.rows),
            (tail_path.clone(), 64 * 6)
        );
        let mut sources = vec![segment.clone()];
        sources.extend([4, 5].map(|index| block_path("t", BlockId { file: f, index })));
        assert_eq!(tail.sources, sources);
        let _ = b.combine_done(&tail, ObjectFacts::default());
        assert_eq!(layout(&b), [(0, 0, 64 * 6, Some(tail_path.to_string()))]);
        // The file fills: no tail for a full file, and its combination retires the tail.
        append(&mut b, 64 * 6);
        flush_all(&mut b);
        assert!(tail_within(&mut b, 1, 5).is_none());
        let mut kinds = Vec::new();
        while let Some(job) = b.take_combine_job() {
            kinds.push(job.kind.clone());
            if let CombineKind::File { retire } = &job.kind {
                assert!(retire.contains(&tail_path), "{retire:?}");
                assert!(retire.contains(&segment), "{retire:?}");
                // It reads the tail in place of its segment and blocks.
                let mut sources = vec![tail_path.clone()];
                sources.extend((6..12).map(|index| block_path("t", BlockId { file: f, index })));
                assert_eq!(job.sources, sources);
            }
            let _ = b.combine_done(&job, ObjectFacts::default());
        }
        assert!(
            matches!(kinds.last(), Some(CombineKind::File { .. })),
            "{kinds:?}"
        );
    }
}
