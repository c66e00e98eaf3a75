//! The shard state machine: one shard's tables, each with its write buffer, primary index,
//! row-id map and the visibility of every file it wrote. A mirror transaction's operations are
//! applied at one timestamp, all or nothing; a snapshot answers which rows a query sees.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use object_store::ObjectStore;
use object_store::path::Path;

use crate::buffer::{BlockData, BlockId, CombineJob, FlushJob, WriteBuffer, file_path};
use crate::checkpoint::{FileImage, ShardImage, TableImage};
use crate::config::StorageConfig;
use crate::error::{Result, StorageError};
use crate::file::{self, Projection, RowGroupInfo};
use crate::index::{Extent, FileId, PrimaryIndex, RowIdMap};
use crate::key::{display_key, encode_key};
use crate::schema::TableSchema;
use crate::ts::Timestamp;
use crate::value::RowRef;
use crate::visibility::FileVisibility;

/// A table's position in the shard's (and the catalog's) table list.
pub type TableId = u32;

/// One row operation of a source transaction. A delete's row needs only its key columns; an
/// update's `before` likewise. An update may change the key.
#[derive(Clone, Debug, PartialEq)]
pub enum RowOp<R> {
    Insert(R),
    Delete(R),
    Update { before: R, after: R },
}

/// A row operation on a table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableOp<R> {
    pub table: TableId,
    pub op: RowOp<R>,
}

/// A row operation the shard can read in place: an owned [`TableOp`] or an archived wire op.
pub trait TableOpRef {
    type Row: RowRef + ?Sized;
    fn table(&self) -> TableId;
    fn op(&self) -> RowOp<&Self::Row>;
}

impl<R: RowRef> TableOpRef for TableOp<R> {
    type Row = R;

    fn table(&self) -> TableId {
        self.table
    }

    fn op(&self) -> RowOp<&R> {
        match &self.op {
            RowOp::Insert(r) => RowOp::Insert(r),
            RowOp::Delete(r) => RowOp::Delete(r),
            RowOp::Update { before, after } => RowOp::Update { before, after },
        }
    }
}

/// What one applied transaction did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Row operations applied (an update counts once).
    pub ops: u64,
    pub inserted: u64,
    pub deleted: u64,
}

/// A file's place in the shard: its visibility, and once combined, its row groups.
struct FileEntry {
    visibility: FileVisibility,
    regular: Option<Vec<RowGroupInfo>>,
}

/// Objects that left the catalog when the applied timestamp was `replaced_at`: no query that
/// begins after that can read them, so they go once LWM passes it.
struct Retired {
    replaced_at: Timestamp,
    /// The newest checkpoint taken before they left: it may still need them, so they stay
    /// until a later checkpoint is complete.
    after_checkpoint: u64,
    paths: Vec<Path>,
}

struct TableState {
    schema: Arc<TableSchema>,
    index: PrimaryIndex,
    row_ids: RowIdMap,
    buffer: WriteBuffer,
    files: BTreeMap<FileId, FileEntry>,
    retired: Vec<Retired>,
}

/// Memory held by a shard, by structure.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub index_bytes: usize,
    pub write_buffer_bytes: usize,
    pub visibility_bytes: usize,
}

/// One row group's deleted rows at a snapshot (bit i = the row group's row i).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowGroupBitmap {
    pub row_group: u32,
    pub rows: u64,
    pub deleted: Vec<u64>,
}

/// What a query reads of one table at a snapshot: regular files and flushed blocks by path,
/// in-memory blocks as batches, each with its deleted-rows bitmap at the snapshot.
pub struct TableSnapshot {
    pub schema: Arc<TableSchema>,
    pub snapshot: Timestamp,
    pub parts: Vec<SnapshotPart>,
}

pub struct SnapshotPart {
    /// The file the rows belong to and the offset of the part's first row there.
    pub file: FileId,
    pub offset: u64,
    pub rows: u64,
    pub data: BlockData,
    /// Deleted rows at the snapshot, bit i = row `offset + i`.
    pub deleted: Vec<u64>,
}

impl TableSnapshot {
    /// Reads every visible row: objects from `store`, in-memory blocks as they are.
    pub async fn read(
        &self,
        store: &dyn ObjectStore,
        projection: Projection<'_>,
    ) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for part in &self.parts {
            match &part.data {
                BlockData::Memory(batch) => out.push(file::filter_visible(
                    batch,
                    &self.schema,
                    self.snapshot,
                    &part.deleted,
                    projection,
                )?),
                BlockData::Object(path) => {
                    let bytes = file::get(store, path).await?;
                    out.extend(file::read_visible(
                        bytes,
                        &self.schema,
                        self.snapshot,
                        &part.deleted,
                        projection,
                    )?);
                }
            }
        }
        Ok(out)
    }
}

/// One shard's storage: every table's rows that hash to this shard.
pub struct Shard {
    id: u16,
    config: StorageConfig,
    tables: Vec<TableState>,
    next_file_seq: u64,
    applied_through: Timestamp,
    /// The id of the newest checkpoint taken of this shard (0: none).
    last_checkpoint: u64,
    plan: Plan,
}

/// The key state a transaction has produced so far, ahead of the index.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Planned {
    Present,
    Absent,
}

/// Scratch space of [`Shard::apply`], kept between transactions so that planning allocates
/// nothing in the steady state.
#[derive(Default)]
struct Plan {
    /// Every encoded key of the transaction, back to back.
    arena: Vec<u8>,
    /// Each operation's keys in `arena`, in order (an update has two).
    keys: Vec<std::ops::Range<usize>>,
    /// Keys the transaction touched so far and their state: (table, key, state, previous
    /// entry with the same hash).
    touched: Vec<(TableId, std::ops::Range<usize>, Planned, Option<usize>)>,
    /// Hash of (table, key) -> newest entry in `touched` with that hash.
    heads: HashMap<u64, usize, rustc_hash::FxBuildHasher>,
}

impl Plan {
    fn clear(&mut self) {
        self.arena.clear();
        self.keys.clear();
        self.touched.clear();
        self.heads.clear();
    }

    fn hash(table: TableId, key: &[u8]) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = rustc_hash::FxBuildHasher.build_hasher();
        table.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    /// The state this transaction left `key` in, if it touched it.
    fn touched(&self, table: TableId, key: std::ops::Range<usize>) -> Option<Planned> {
        let bytes = &self.arena[key];
        let mut at = self.heads.get(&Self::hash(table, bytes)).copied();
        while let Some(i) = at {
            let (t, range, state, prev) = &self.touched[i];
            if *t == table && &self.arena[range.clone()] == bytes {
                return Some(*state);
            }
            at = *prev;
        }
        None
    }

    fn set(&mut self, table: TableId, key: std::ops::Range<usize>, state: Planned) {
        let h = Self::hash(table, &self.arena[key.clone()]);
        let i = self.touched.len();
        let prev = self.heads.insert(h, i);
        self.touched.push((table, key, state, prev));
    }
}

impl Shard {
    /// An empty shard. File ids start at sequence 0: a restart either restores the sequence
    /// from its checkpoint or starts from a lake with no files of this node.
    pub fn new(id: u16, config: StorageConfig) -> Result<Self> {
        config.validate()?;
        Ok(Shard {
            id,
            config,
            tables: Vec::new(),
            next_file_seq: 0,
            applied_through: Timestamp::GENESIS,
            last_checkpoint: 0,
            plan: Plan::default(),
        })
    }

    pub fn id(&self) -> u16 {
        self.id
    }

    pub fn config(&self) -> &StorageConfig {
        &self.config
    }

    /// Adds a table; its id is its position.
    pub fn add_table(&mut self, schema: Arc<TableSchema>) -> TableId {
        self.tables.push(TableState {
            buffer: WriteBuffer::new(schema.clone(), &self.config),
            schema,
            index: PrimaryIndex::new(),
            row_ids: RowIdMap::new(),
            files: BTreeMap::new(),
            retired: Vec::new(),
        });
        (self.tables.len() - 1) as TableId
    }

    pub fn schema(&self, table: TableId) -> Result<&Arc<TableSchema>> {
        Ok(&self.table(table)?.schema)
    }

    /// The newest timestamp this shard has applied.
    pub fn applied_through(&self) -> Timestamp {
        self.applied_through
    }

    fn table(&self, table: TableId) -> Result<&TableState> {
        self.tables
            .get(table as usize)
            .ok_or(StorageError::UnknownTable(table))
    }

    /// Applies one mirror transaction's operations (those that belong to this shard) at `ts`,
    /// in order. Either every operation applies or, on an error naming the operation, none
    /// does and the shard is exactly as before.
    pub fn apply<O: TableOpRef>(&mut self, ts: Timestamp, ops: &[O]) -> Result<ApplyStats> {
        if ts <= self.applied_through {
            return Err(StorageError::TimestampBackwards {
                last: self.applied_through,
                got: ts,
            });
        }
        let mut plan = std::mem::take(&mut self.plan);
        let planned = self.plan(ts, ops, &mut plan);
        if let Err(e) = planned {
            self.plan = plan;
            return Err(e);
        }
        let mut stats = ApplyStats::default();
        let mut keys = plan.keys.iter().map(|r| &plan.arena[r.clone()]);
        stats.ops = ops.len() as u64;
        for op in ops {
            let t = op.table() as usize;
            match op.op() {
                RowOp::Insert(row) => {
                    self.insert(t, keys.next().expect("planned"), row, ts);
                    stats.inserted += 1;
                }
                RowOp::Delete(_) => {
                    self.delete(t, keys.next().expect("planned"), ts);
                    stats.deleted += 1;
                }
                RowOp::Update { after, .. } => {
                    self.delete(t, keys.next().expect("planned"), ts);
                    self.insert(t, keys.next().expect("planned"), after, ts);
                    stats.deleted += 1;
                    stats.inserted += 1;
                }
            }
        }
        self.plan = plan;
        self.applied_through = ts;
        Ok(stats)
    }

    /// Marks every timestamp up to `ts` as applied on this shard (it had no operations there).
    pub fn advance(&mut self, ts: Timestamp) -> Result<()> {
        if ts < self.applied_through {
            return Err(StorageError::TimestampBackwards {
                last: self.applied_through,
                got: ts,
            });
        }
        self.applied_through = ts;
        Ok(())
    }

    /// Checks every operation without changing anything, leaving their encoded keys in
    /// `plan` in order (an update's before-key, then its after-key).
    fn plan<O: TableOpRef>(&self, ts: Timestamp, ops: &[O], plan: &mut Plan) -> Result<()> {
        plan.clear();
        for (index, op) in ops.iter().enumerate() {
            let fail = |source| StorageError::Op {
                index,
                ts,
                source: Box::new(source),
            };
            let table = op.table();
            let t = self.table(table).map_err(fail)?;
            let schema = &t.schema;
            // Encodes a checked row's key into the arena; its state now: as this transaction
            // left it, else as the index has it.
            let key_of = |row: &O::Row, full: bool, plan: &mut Plan| -> Result<_> {
                if full {
                    schema.check_row(row)?;
                } else {
                    schema.check_key(row)?;
                }
                let start = plan.arena.len();
                encode_key(schema, row, &mut plan.arena);
                let range = start..plan.arena.len();
                let state = plan.touched(table, range.clone()).unwrap_or_else(|| {
                    if t.index.latest(&plan.arena[range.clone()]).is_some() {
                        Planned::Present
                    } else {
                        Planned::Absent
                    }
                });
                plan.keys.push(range.clone());
                Ok((range, state))
            };
            let not_found = |row: &O::Row| StorageError::KeyNotFound {
                table: schema.name().into(),
                key: display_key(schema, row),
            };
            let duplicate = |row: &O::Row| StorageError::DuplicateKey {
                table: schema.name().into(),
                key: display_key(schema, row),
            };
            match op.op() {
                RowOp::Insert(row) => {
                    let (key, state) = key_of(row, true, plan).map_err(fail)?;
                    if state == Planned::Present {
                        return Err(fail(duplicate(row)));
                    }
                    plan.set(table, key, Planned::Present);
                }
                RowOp::Delete(row) => {
                    let (key, state) = key_of(row, false, plan).map_err(fail)?;
                    if state == Planned::Absent {
                        return Err(fail(not_found(row)));
                    }
                    plan.set(table, key, Planned::Absent);
                }
                RowOp::Update { before, after } => {
                    let (old, state) = key_of(before, false, plan).map_err(fail)?;
                    if state == Planned::Absent {
                        return Err(fail(not_found(before)));
                    }
                    plan.set(table, old, Planned::Absent);
                    let (new, state) = key_of(after, true, plan).map_err(fail)?;
                    if state == Planned::Present {
                        return Err(fail(duplicate(after)));
                    }
                    plan.set(table, new, Planned::Present);
                }
            }
        }
        Ok(())
    }

    fn insert<R: RowRef + ?Sized>(&mut self, t: usize, key: &[u8], row: &R, ts: Timestamp) {
        if self.tables[t].buffer.needs_file() {
            let id = FileId::new(self.id, self.next_file_seq);
            self.next_file_seq += 1;
            let table = &mut self.tables[t];
            let new = table.buffer.start_file(id);
            table.row_ids.map(
                new.first_row,
                Extent {
                    file: id,
                    offset: 0,
                    rows: new.capacity,
                },
            );
            table.files.insert(
                id,
                FileEntry {
                    visibility: FileVisibility::new(self.config.tile_rows)
                        .expect("tile rows were validated"),
                    regular: None,
                },
            );
        }
        let table = &mut self.tables[t];
        let (row_id, at) = table.buffer.append(row, ts);
        table
            .files
            .get_mut(&at.file)
            .expect("the appending file is tracked")
            .visibility
            .extend_to(at.offset + 1);
        table
            .index
            .put(key, ts, row_id)
            .expect("transactions apply in timestamp order");
    }

    fn delete(&mut self, t: usize, key: &[u8], ts: Timestamp) {
        let table = &mut self.tables[t];
        let row_id = table
            .index
            .delete_latest(key, ts)
            .expect("transactions apply in timestamp order")
            .expect("planned deletes hit live keys");
        let at = table
            .row_ids
            .locate(row_id)
            .expect("every row id is mapped");
        table
            .files
            .get_mut(&at.file)
            .expect("every mapped file is tracked")
            .visibility
            .delete(at.offset, ts)
            .expect("a live key's row is not deleted");
    }

    /// What a query at `snapshot` reads of `table`. A snapshot newer than the applied
    /// timestamp, or older than the last fold, is refused.
    pub fn snapshot(&self, table: TableId, snapshot: Timestamp) -> Result<TableSnapshot> {
        self.snapshot_except(table, snapshot, &[])
    }

    /// [`Self::snapshot`] without the regular files in `known` (a query reads those by their
    /// row groups, from the coordinator's plan).
    pub fn snapshot_except(
        &self,
        table: TableId,
        snapshot: Timestamp,
        known: &[FileId],
    ) -> Result<TableSnapshot> {
        if snapshot > self.applied_through {
            return Err(StorageError::SnapshotInFuture {
                requested: snapshot,
                applied_through: self.applied_through,
            });
        }
        let t = self.table(table)?;
        let mut parts = Vec::new();
        for (&id, entry) in &t.files {
            if known.contains(&id) {
                continue;
            }
            if let Some(groups) = &entry.regular {
                let rows = groups.iter().map(|g| g.rows).sum();
                let mut deleted = Vec::new();
                entry
                    .visibility
                    .bitmap_range(0, rows, snapshot, &mut deleted)?;
                parts.push(SnapshotPart {
                    file: id,
                    offset: 0,
                    rows,
                    data: BlockData::Object(file_path(t.schema.name(), id)),
                    deleted,
                });
            }
        }
        for block in t.buffer.blocks() {
            let vis = &t.files[&block.id.file].visibility;
            let mut deleted = Vec::new();
            vis.bitmap_range(block.offset, block.rows, snapshot, &mut deleted)?;
            parts.push(SnapshotPart {
                file: block.id.file,
                offset: block.offset,
                rows: block.rows,
                data: block.data,
                deleted,
            });
        }
        Ok(TableSnapshot {
            schema: t.schema.clone(),
            snapshot,
            parts,
        })
    }

    /// The deleted-rows bitmaps of a regular file's row groups at `snapshot`, in the order
    /// asked.
    pub fn row_group_bitmaps(
        &self,
        file: FileId,
        snapshot: Timestamp,
        row_groups: &[u32],
    ) -> Result<Vec<RowGroupBitmap>> {
        if snapshot > self.applied_through {
            return Err(StorageError::SnapshotInFuture {
                requested: snapshot,
                applied_through: self.applied_through,
            });
        }
        let entry = self
            .tables
            .iter()
            .find_map(|t| t.files.get(&file))
            .ok_or(StorageError::UnknownFile(file.0))?;
        let groups = entry
            .regular
            .as_ref()
            .ok_or(StorageError::UnknownFile(file.0))?;
        row_groups
            .iter()
            .map(|&i| {
                let g = groups
                    .get(i as usize)
                    .ok_or(StorageError::OffsetOutOfRange {
                        what: "row-group list",
                        offset: i.into(),
                        rows: groups.len() as u64,
                    })?;
                let mut deleted = Vec::new();
                entry
                    .visibility
                    .bitmap_range(g.offset, g.rows, snapshot, &mut deleted)?;
                Ok(RowGroupBitmap {
                    row_group: i,
                    rows: g.rows,
                    deleted,
                })
            })
            .collect()
    }

    /// Every immutable block waiting to be flushed, marked as flushing.
    pub fn take_flush_jobs(&mut self) -> Vec<(TableId, FlushJob)> {
        let mut jobs = Vec::new();
        for (t, table) in self.tables.iter_mut().enumerate() {
            jobs.extend(
                table
                    .buffer
                    .take_flush_jobs()
                    .into_iter()
                    .map(|j| (t as TableId, j)),
            );
        }
        jobs
    }

    pub fn flush_done(&mut self, table: TableId, block: BlockId) {
        self.tables[table as usize].buffer.flush_done(block);
    }

    pub fn flush_failed(&mut self, table: TableId, block: BlockId) {
        self.tables[table as usize].buffer.flush_failed(block);
    }

    /// Full virtual files whose blocks are all flushed, marked as combining.
    pub fn take_combine_jobs(&mut self) -> Vec<(TableId, CombineJob)> {
        let mut jobs = Vec::new();
        for (t, table) in self.tables.iter_mut().enumerate() {
            while let Some(job) = table.buffer.take_combine_job() {
                jobs.push((t as TableId, job));
            }
        }
        jobs
    }

    /// The combined file is durable: later snapshots read it instead of the blocks, which
    /// retire until no query can read them.
    pub fn combine_done(&mut self, table: TableId, job: CombineJob, groups: Vec<RowGroupInfo>) {
        let applied = self.applied_through;
        let t = &mut self.tables[table as usize];
        let virtual_file = t.buffer.combine_done(job.file);
        assert_eq!(
            groups.iter().map(|g| g.rows).sum::<u64>(),
            virtual_file.rows(),
            "a combined file holds its virtual file's rows"
        );
        t.files
            .get_mut(&job.file)
            .expect("a combined file is tracked")
            .regular = Some(groups);
        t.retired.push(Retired {
            replaced_at: applied,
            after_checkpoint: self.last_checkpoint,
            paths: job.blocks,
        });
    }

    pub fn combine_failed(&mut self, table: TableId, file: FileId) {
        self.tables[table as usize].buffer.combine_failed(file);
    }

    /// Objects no query can read any more now that every query older than `lwm` has ended,
    /// and that no checkpoint a restart could load refers to: checkpoint `checkpointed` (and
    /// every older one) is the newest complete one (`u64::MAX` when the node takes none).
    pub fn take_deletable(&mut self, lwm: Timestamp, checkpointed: u64) -> Vec<Path> {
        let mut out = Vec::new();
        for t in &mut self.tables {
            t.retired.retain_mut(|r| {
                if r.replaced_at < lwm && r.after_checkpoint < checkpointed {
                    out.append(&mut r.paths);
                    false
                } else {
                    true
                }
            });
        }
        out
    }

    /// Objects from [`Self::take_deletable`] that could not be deleted now: offered again next
    /// time (they are already unreadable to every query).
    pub fn defer_deletes(&mut self, paths: Vec<Path>) {
        if let Some(t) = self.tables.first_mut() {
            t.retired.push(Retired {
                replaced_at: Timestamp::GENESIS,
                after_checkpoint: 0,
                paths,
            });
        }
    }

    /// Flushes every immutable block and combines every full virtual file, inline. The node
    /// runs the same steps on its I/O thread; tests, tools and the demo use this.
    pub async fn flush_and_combine(&mut self, store: &dyn ObjectStore) -> Result<()> {
        // Every job taken is finished or handed back, even after a failure, so none is left
        // marked as in flight; the first error is returned.
        let mut first_error = None;
        for (t, job) in self.take_flush_jobs() {
            let schema = self.tables[t as usize].schema.clone();
            match file::flush_block(store, &schema, &self.config, &job).await {
                Ok(()) => self.flush_done(t, job.block),
                Err(e) => {
                    self.flush_failed(t, job.block);
                    first_error.get_or_insert(e);
                }
            }
        }
        for (t, job) in self.take_combine_jobs() {
            let schema = self.tables[t as usize].schema.clone();
            match file::combine_blocks(store, &schema, &self.config, &job).await {
                Ok(combined) => self.combine_done(t, job, combined.groups),
                Err(e) => {
                    self.combine_failed(t, job.file);
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Memory GC: folds every delete at or before `safe_ts` into the base bitmaps and drops
    /// index versions no snapshot at or after it can see. Returns the versions dropped.
    pub fn gc(&mut self, safe_ts: Timestamp) -> usize {
        assert!(
            safe_ts <= self.applied_through,
            "GC at {safe_ts} beyond the applied {}",
            self.applied_through
        );
        let mut dropped = 0;
        for t in &mut self.tables {
            for f in t.files.values_mut() {
                f.visibility.fold(safe_ts);
            }
            dropped += t.index.purge(safe_ts);
        }
        dropped
    }

    /// The shard as of its applied timestamp, for checkpoint `id` (ids grow): what
    /// [`Self::from_image`] restores. Visibility is folded at the applied timestamp, since no
    /// query after a restart reads below it. Objects retired from now on stay until a later
    /// checkpoint is complete (see [`Self::take_deletable`]).
    pub fn checkpoint(&mut self, id: u64) -> Result<ShardImage> {
        assert!(id > self.last_checkpoint, "checkpoint ids grow");
        let at = self.applied_through;
        let mut tables = Vec::with_capacity(self.tables.len());
        for t in &self.tables {
            let mut files = Vec::with_capacity(t.files.len());
            for (&fid, f) in &t.files {
                let mut deleted = Vec::new();
                f.visibility
                    .bitmap_range(0, f.visibility.rows(), at, &mut deleted)?;
                files.push(FileImage {
                    id: fid,
                    rows: f.visibility.rows(),
                    deleted,
                    regular: f.regular.clone(),
                });
            }
            tables.push(TableImage {
                name: t.schema.name().to_owned(),
                keys: t
                    .index
                    .iter_latest()
                    .filter_map(|(k, r)| r.map(|r| (k.to_vec(), r)))
                    .collect(),
                extents: t.row_ids.iter().collect(),
                files,
                buffer: t.buffer.image(),
            });
        }
        self.last_checkpoint = id;
        Ok(ShardImage {
            shard: self.id,
            applied_through: at,
            next_file_seq: self.next_file_seq,
            tables,
        })
    }

    /// The shard a checkpoint image holds, with `schemas` as its tables in order (the
    /// catalog's, which must be the checkpoint's). `checkpoint` is the image's id.
    pub fn from_image(
        config: StorageConfig,
        schemas: &[Arc<TableSchema>],
        image: ShardImage,
        checkpoint: u64,
    ) -> Result<Self> {
        config.validate()?;
        let corrupt = |reason: String| StorageError::Corrupt {
            what: format!("the checkpoint of shard {}", image.shard),
            reason,
        };
        let names: Vec<&str> = image.tables.iter().map(|t| t.name.as_str()).collect();
        let want: Vec<&str> = schemas.iter().map(|s| s.name()).collect();
        if names != want {
            return Err(corrupt(format!(
                "it holds tables {names:?}, the schema has {want:?}; start with the schema it \
                 was taken with, or from an empty data directory"
            )));
        }
        let at = image.applied_through;
        let mut shard = Shard {
            id: image.shard,
            config,
            tables: Vec::with_capacity(schemas.len()),
            next_file_seq: image.next_file_seq,
            applied_through: at,
            last_checkpoint: checkpoint,
            plan: Plan::default(),
        };
        for (t, schema) in image.tables.into_iter().zip(schemas) {
            let mut index = PrimaryIndex::new();
            for (k, r) in &t.keys {
                index.put(k, at, *r)?;
            }
            let mut row_ids = RowIdMap::new();
            for (first, x) in t.extents {
                row_ids.map(first, x);
            }
            let mut files = BTreeMap::new();
            for f in t.files {
                let visibility =
                    FileVisibility::from_bitmap(shard.config.tile_rows, f.rows, &f.deleted, at)?;
                files.insert(
                    f.id,
                    FileEntry {
                        visibility,
                        regular: f.regular,
                    },
                );
            }
            let buffer = WriteBuffer::from_image(schema.clone(), &shard.config, t.buffer)?;
            for vf in buffer.files() {
                if files
                    .get(&vf.id())
                    .is_none_or(|f| f.visibility.rows() != vf.rows())
                {
                    return Err(corrupt(format!(
                        "virtual file {} of `{}` has no visibility of its rows",
                        vf.id(),
                        schema.name()
                    )));
                }
            }
            shard.tables.push(TableState {
                schema: schema.clone(),
                index,
                row_ids,
                buffer,
                files,
                retired: Vec::new(),
            });
        }
        Ok(shard)
    }

    /// Every object the shard reads: its tables' regular files and flushed blocks.
    pub fn objects(&self) -> Vec<Path> {
        let mut out = Vec::new();
        for t in &self.tables {
            for (&id, f) in &t.files {
                if f.regular.is_some() {
                    out.push(file_path(t.schema.name(), id));
                }
            }
            out.extend(t.buffer.flushed_blocks());
        }
        out
    }

    /// The regular files of `table` with their row groups.
    pub fn regular_files(&self, table: TableId) -> Result<Vec<(FileId, Vec<RowGroupInfo>)>> {
        Ok(self
            .table(table)?
            .files
            .iter()
            .filter_map(|(&id, f)| f.regular.clone().map(|g| (id, g)))
            .collect())
    }

    pub fn memory(&self) -> MemoryUsage {
        let mut m = MemoryUsage::default();
        for t in &self.tables {
            m.index_bytes += t.index.memory_bytes() + t.row_ids.memory_bytes();
            m.write_buffer_bytes += t.buffer.memory_bytes();
            m.visibility_bytes += t
                .files
                .values()
                .map(|f| f.visibility.memory_bytes())
                .sum::<usize>();
        }
        m
    }

    /// Rows stored for `table` (live or deleted) and rows deleted in the newest state.
    pub fn row_counts(&self, table: TableId) -> Result<(u64, u64)> {
        let t = self.table(table)?;
        Ok(t.files.values().fold((0, 0), |(rows, deleted), f| {
            (
                rows + f.visibility.rows(),
                deleted + f.visibility.deleted_rows(),
            )
        }))
    }

    /// Index versions of `table` (live, older and tombstones) not yet purged.
    pub fn index_versions(&self, table: TableId) -> Result<usize> {
        Ok(self.table(table)?.index.versions())
    }

    /// Live keys of `table` in the newest state.
    pub fn live_keys(&self, table: TableId) -> Result<usize> {
        Ok(self
            .table(table)?
            .index
            .iter_latest()
            .filter(|(_, r)| r.is_some())
            .count())
    }
}
