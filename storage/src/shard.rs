//! The shard state machine: one shard's tables, each with its write buffer, primary index,
//! row-id map and the visibility of every file it wrote. A mirror transaction's operations are
//! applied at one timestamp, all or nothing; a snapshot answers which rows a query sees.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use object_store::ObjectStore;
use object_store::path::Path;

use crate::buffer::{BlockData, BlockId, CombineJob, FlushJob, WriteBuffer, file_path};
use crate::checkpoint::VisibilityImage;
use crate::checkpoint::{FileImage, ShardImage, TableImage};
use crate::config::StorageConfig;
use crate::error::{Result, StorageError};
use crate::file::{self, Projection, RewriteJob, RowGroupInfo};
use crate::index::{Extent, FileId, KeptRows, PrimaryIndex, RowIdMap};
use crate::key::{display_key, encode_key};
use crate::op::{RowOp, TableId, TableOpRef};
use crate::schema::TableSchema;
use crate::ts::Timestamp;
use crate::value::RowRef;
use crate::visibility::FileVisibility;

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
    /// A rewritten file holds only the rows visible at its rewrite's safe timestamp: older
    /// snapshots read the file it replaced.
    min_snapshot: Timestamp,
    /// The file storage GC rewrote into this one.
    replaces: Option<FileId>,
    /// Which of that file's rows this one holds, while that file is still around: a long
    /// query's visibility checkpoint knows that file, not this one.
    replaced_kept: Option<Arc<KeptRows>>,
    /// Set once storage GC replaced this file; it stays, frozen, for the queries that may
    /// still read it, and leaves with its object.
    superseded: Option<Superseded>,
    /// A rewrite of this file is on its way: its deletes are not folded, so the rewrite can
    /// carry every one newer than its safe timestamp across.
    rewriting: bool,
}

impl FileEntry {
    fn new(visibility: FileVisibility, regular: Option<Vec<RowGroupInfo>>) -> Self {
        FileEntry {
            visibility,
            regular,
            min_snapshot: Timestamp::GENESIS,
            replaces: None,
            replaced_kept: None,
            superseded: None,
            rewriting: false,
        }
    }

    /// A regular file later scans read (not one storage GC replaced).
    fn current_regular(&self) -> Option<&Vec<RowGroupInfo>> {
        self.regular.as_ref().filter(|_| self.superseded.is_none())
    }
}

/// How storage GC replaced a file.
#[derive(Copy, Clone, Debug)]
struct Superseded {
    /// The rewritten file (`None`: every row was dead).
    by: Option<FileId>,
    /// Snapshots from here on read the replacement.
    from: Timestamp,
}

/// Rewrites a shard starts per memory GC at most, so background work stays bounded.
pub const MAX_REWRITES_PER_GC: usize = 4;

/// What a finished rewrite changed, for the catalog: later scan plans list `by` (when some
/// row survived) instead of `file` for snapshots from `from` on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacement {
    pub file: FileId,
    pub by: Option<FileId>,
    pub from: Timestamp,
}

/// Objects that left the catalog when the applied timestamp was `replaced_at`: no query that
/// begins after that can read them, so they go once LWM passes it.
struct Retired {
    replaced_at: Timestamp,
    /// The newest checkpoint taken before they left: it may still need them, so they stay
    /// until a later checkpoint is complete.
    after_checkpoint: u64,
    paths: Vec<Path>,
    /// A file storage GC replaced: its frozen visibility leaves with its object.
    file: Option<FileId>,
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
    /// Tables the transaction truncated so far, each with the length of `touched` at its last
    /// truncate: every key of the table not touched since is absent.
    truncated: Vec<(TableId, usize)>,
}

impl Plan {
    fn clear(&mut self) {
        self.arena.clear();
        self.keys.clear();
        self.touched.clear();
        self.heads.clear();
        self.truncated.clear();
    }

    fn truncate(&mut self, table: TableId) {
        let mark = self.touched.len();
        match self.truncated.iter_mut().find(|(t, _)| *t == table) {
            Some(entry) => entry.1 = mark,
            None => self.truncated.push((table, mark)),
        }
    }

    fn hash(table: TableId, key: &[u8]) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = rustc_hash::FxBuildHasher.build_hasher();
        table.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    /// The state this transaction left `key` in, if it touched it (or truncated its table).
    fn touched(&self, table: TableId, key: std::ops::Range<usize>) -> Option<Planned> {
        let truncated_at = self
            .truncated
            .iter()
            .find(|(t, _)| *t == table)
            .map(|&(_, mark)| mark);
        let bytes = &self.arena[key];
        let mut at = self.heads.get(&Self::hash(table, bytes)).copied();
        while let Some(i) = at {
            let (t, range, state, prev) = &self.touched[i];
            if *t == table && &self.arena[range.clone()] == bytes {
                return match truncated_at {
                    Some(mark) if i < mark => Some(Planned::Absent),
                    _ => Some(*state),
                };
            }
            at = *prev;
        }
        truncated_at.map(|_| Planned::Absent)
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
                RowOp::Upsert(row) => {
                    let key = keys.next().expect("planned");
                    // The index is up to date with the earlier operations of this transaction.
                    if self.tables[t].index.latest(key).is_some() {
                        self.delete(t, key, ts);
                        stats.deleted += 1;
                    }
                    self.insert(t, key, row, ts);
                    stats.inserted += 1;
                }
                RowOp::Truncate => stats.deleted += self.truncate(t, ts),
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
                RowOp::Upsert(row) => {
                    let (key, _) = key_of(row, true, plan).map_err(fail)?;
                    plan.set(table, key, Planned::Present);
                }
                RowOp::Truncate => plan.truncate(table),
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
            table
                .row_ids
                .map(new.first_row, Extent::dense(id, 0, new.capacity));
            table.files.insert(
                id,
                FileEntry::new(
                    FileVisibility::new(self.config.tile_rows).expect("tile rows were validated"),
                    None,
                ),
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

    /// Deletes every live row of table `t` at `ts`; returns how many.
    fn truncate(&mut self, t: usize, ts: Timestamp) -> u64 {
        let live: Vec<Vec<u8>> = self.tables[t]
            .index
            .iter_latest()
            .filter(|(_, row)| row.is_some())
            .map(|(key, _)| key.to_vec())
            .collect();
        for key in &live {
            self.delete(t, key, ts);
        }
        live.len() as u64
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

    /// [`Self::snapshot`] without the regular files in `known`, sorted (a query reads those by
    /// their row groups, from the coordinator's plan).
    pub fn snapshot_except(
        &self,
        table: TableId,
        snapshot: Timestamp,
        known: &[FileId],
    ) -> Result<TableSnapshot> {
        self.snapshot_with(table, snapshot, known, None)
    }

    /// [`Self::snapshot_except`] for a query whose visibility was checkpointed to `image`:
    /// where memory GC folded past the snapshot, its bitmaps come from the image.
    pub fn snapshot_with(
        &self,
        table: TableId,
        snapshot: Timestamp,
        known: &[FileId],
        image: Option<&VisibilityImage>,
    ) -> Result<TableSnapshot> {
        assert!(
            known.is_sorted(),
            "known files are sorted, to be found by binary search"
        );
        self.check_snapshot(snapshot, image)?;
        let t = self.table(table)?;
        let mut parts = Vec::new();
        for (&id, entry) in &t.files {
            let Some(groups) = &entry.regular else {
                continue;
            };
            if !Self::serves(t, id, snapshot, known) {
                continue;
            }
            let rows = groups.iter().map(|g| g.rows).sum();
            let mut deleted = Vec::new();
            Self::file_bitmap(t, id, 0, rows, snapshot, image, &mut deleted)?;
            parts.push(SnapshotPart {
                file: id,
                offset: 0,
                rows,
                data: BlockData::Object(file_path(t.schema.name(), id)),
                deleted,
            });
        }
        for block in t.buffer.blocks() {
            let id = block.id.file;
            let mut deleted = Vec::new();
            Self::file_bitmap(
                t,
                id,
                block.offset,
                block.rows,
                snapshot,
                image,
                &mut deleted,
            )?;
            parts.push(SnapshotPart {
                file: id,
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

    fn check_snapshot(&self, snapshot: Timestamp, image: Option<&VisibilityImage>) -> Result<()> {
        if snapshot > self.applied_through {
            return Err(StorageError::SnapshotInFuture {
                requested: snapshot,
                applied_through: self.applied_through,
            });
        }
        if let Some(image) = image {
            assert_eq!(
                image.snapshot, snapshot,
                "an image answers its own snapshot"
            );
        }
        Ok(())
    }

    /// Whether a query at `snapshot` that reads the regular files in `known` from its plan
    /// must also read regular file `id`: never two generations of one file's rows, and never
    /// a rewritten file older snapshots cannot read.
    fn serves(t: &TableState, id: FileId, snapshot: Timestamp, known: &[FileId]) -> bool {
        let entry = &t.files[&id];
        let known = |f: &FileId| known.binary_search(f).is_ok();
        if known(&id) || snapshot < entry.min_snapshot {
            return false;
        }
        // Files it replaced, and files that replaced it, that the query reads already.
        let mut older = entry.replaces;
        while let Some(f) = older {
            if known(&f) {
                return false;
            }
            older = t.files.get(&f).and_then(|e| e.replaces);
        }
        let mut newer = entry.superseded;
        while let Some(s) = newer {
            if snapshot >= s.from {
                return false;
            }
            let Some(by) = s.by else { break };
            if known(&by) {
                return false;
            }
            newer = t.files.get(&by).and_then(|e| e.superseded);
        }
        true
    }

    /// Rows `start .. start + len` of file `id` deleted at `snapshot`: from the file's
    /// visibility, or from `image` where memory GC folded past the snapshot. A rewritten file
    /// older snapshots cannot read at all.
    fn file_bitmap(
        t: &TableState,
        id: FileId,
        start: u64,
        len: u64,
        snapshot: Timestamp,
        image: Option<&VisibilityImage>,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        let entry = &t.files[&id];
        if snapshot < entry.min_snapshot {
            return Err(StorageError::SnapshotTooOld {
                requested: snapshot,
                oldest: entry.min_snapshot,
            });
        }
        match entry.visibility.bitmap_range(start, len, snapshot, out) {
            Err(StorageError::SnapshotTooOld { .. }) if image.is_some() => {
                let image = image.expect("matched");
                let whole = Self::image_bitmap(t, id, image);
                let whole: &[u64] = &whole;
                out.clear();
                out.resize(len.div_ceil(64) as usize, 0);
                let first = (start / 64) as usize;
                let upto = (start + len).div_ceil(64).min(whole.len() as u64) as usize;
                if upto > first {
                    out[..upto - first].copy_from_slice(&whole[first..upto]);
                }
                if !len.is_multiple_of(64)
                    && let Some(last) = out.last_mut()
                {
                    *last &= (1u64 << (len % 64)) - 1;
                }
                Ok(())
            }
            r => r,
        }
    }

    /// File `id`'s deleted rows at the image's snapshot (its rows as far as the image can
    /// tell). A file the image does not know was started after it, so none of its rows is
    /// visible there (the `_create_ts` check hides them), unless storage GC wrote it from one
    /// the image knows: then it is that file's bitmap, over the rows it kept.
    fn image_bitmap<'a>(
        t: &TableState,
        id: FileId,
        image: &'a VisibilityImage,
    ) -> std::borrow::Cow<'a, [u64]> {
        if let Some((_, words)) = image.files.get(&id) {
            return std::borrow::Cow::Borrowed(words);
        }
        let entry = &t.files[&id];
        let rows = entry.visibility.rows();
        let mut out = vec![0u64; rows.div_ceil(64) as usize];
        if let (Some(from), Some(kept)) = (entry.replaces, &entry.replaced_kept)
            && t.files.contains_key(&from)
        {
            let source = Self::image_bitmap(t, from, image);
            let mut j = 0usize;
            for (w, &word) in kept.bits().iter().enumerate() {
                let mut rest = word;
                while rest != 0 {
                    let b = rest.trailing_zeros() as usize;
                    rest &= rest - 1;
                    if source.get(w).is_some_and(|s| s >> b & 1 != 0) {
                        out[j / 64] |= 1 << (j % 64);
                    }
                    j += 1;
                }
            }
        }
        std::borrow::Cow::Owned(out)
    }

    /// The deleted-rows bitmaps of a regular file's row groups at `snapshot`, in the order
    /// asked.
    pub fn row_group_bitmaps(
        &self,
        file: FileId,
        snapshot: Timestamp,
        row_groups: &[u32],
    ) -> Result<Vec<RowGroupBitmap>> {
        self.row_group_bitmaps_with(file, snapshot, row_groups, None)
    }

    /// [`Self::row_group_bitmaps`] for a query whose visibility was checkpointed to `image`.
    pub fn row_group_bitmaps_with(
        &self,
        file: FileId,
        snapshot: Timestamp,
        row_groups: &[u32],
        image: Option<&VisibilityImage>,
    ) -> Result<Vec<RowGroupBitmap>> {
        self.check_snapshot(snapshot, image)?;
        let (t, entry) = self
            .tables
            .iter()
            .find_map(|t| t.files.get(&file).map(|e| (t, e)))
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
                Self::file_bitmap(t, file, g.offset, g.rows, snapshot, image, &mut deleted)?;
                Ok(RowGroupBitmap {
                    row_group: i,
                    rows: g.rows,
                    deleted,
                })
            })
            .collect()
    }

    /// A long query's visibility checkpoint: every file's deleted rows at `snapshot`, about one
    /// bit per row, so memory GC may fold past the snapshot while the query still reads.
    pub fn visibility_image(&self, snapshot: Timestamp) -> Result<VisibilityImage> {
        self.check_snapshot(snapshot, None)?;
        let mut files = std::collections::BTreeMap::new();
        for t in &self.tables {
            for (&id, f) in &t.files {
                if snapshot < f.min_snapshot {
                    continue;
                }
                let rows = f.visibility.rows();
                let mut deleted = Vec::new();
                f.visibility.bitmap_range(0, rows, snapshot, &mut deleted)?;
                files.insert(id, (rows, deleted));
            }
        }
        Ok(VisibilityImage {
            shard: self.id,
            snapshot,
            files,
        })
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
            file: None,
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
            let files = &mut t.files;
            t.retired.retain_mut(|r| {
                if r.replaced_at < lwm && r.after_checkpoint < checkpointed {
                    out.append(&mut r.paths);
                    if let Some(f) = r.file {
                        files.remove(&f);
                        for e in files.values_mut().filter(|e| e.replaces == Some(f)) {
                            e.replaced_kept = None;
                        }
                    }
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
                file: None,
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
        (0..self.tables.len() as TableId)
            .map(|t| self.gc_table(t, safe_ts))
            .sum()
    }

    /// [`Self::gc`] of one table, so a caller on a shared core can yield between tables.
    pub fn gc_table(&mut self, table: TableId, safe_ts: Timestamp) -> usize {
        assert!(
            safe_ts <= self.applied_through,
            "GC at {safe_ts} beyond the applied {}",
            self.applied_through
        );
        let t = &mut self.tables[table as usize];
        for f in t.files.values_mut().filter(|f| !f.rewriting) {
            f.visibility.fold(safe_ts);
        }
        t.index.purge(safe_ts)
    }

    /// Tables of the shard.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// Storage GC, after a memory GC at `safe_ts`: regular files with more than
    /// `dead_fraction` of their rows deleted at `safe_ts`, marked as rewriting (at most
    /// [`MAX_REWRITES_PER_GC`]). Each job writes the rows live at `safe_ts` to a new file; deletes
    /// that arrive meanwhile reach the old file and [`Self::rewrite_done`] carries them over.
    pub fn take_rewrite_jobs(
        &mut self,
        safe_ts: Timestamp,
        dead_fraction: f64,
    ) -> Result<Vec<(TableId, RewriteJob)>> {
        let mut jobs = Vec::new();
        for (t, table) in self.tables.iter_mut().enumerate() {
            for (&id, f) in table.files.iter_mut() {
                if jobs.len() >= MAX_REWRITES_PER_GC {
                    return Ok(jobs);
                }
                if f.rewriting || f.superseded.is_some() || f.regular.is_none() {
                    continue;
                }
                let rows = f.visibility.rows();
                // Rows dead now bound the rows dead at `safe_ts`: most files stop here without
                // a bitmap.
                if rows == 0 || (f.visibility.deleted_rows() as f64) <= dead_fraction * rows as f64
                {
                    continue;
                }
                // Every delete at or below `safe_ts` folds into the base first (the caller's
                // memory GC may have skipped this file while an earlier rewrite of it was on
                // its way), so whatever stays pending is newer and the rewrite carries it over.
                f.visibility.fold(safe_ts);
                let mut deleted = Vec::new();
                if f.visibility
                    .bitmap_range(0, rows, safe_ts, &mut deleted)
                    .is_err()
                {
                    // Folded past `safe_ts` already: the next GC looks again.
                    continue;
                }
                let dead: u64 = deleted.iter().map(|w| u64::from(w.count_ones())).sum();
                if (dead as f64) <= dead_fraction * rows as f64 {
                    continue;
                }
                let target_file = FileId::new(self.id, self.next_file_seq);
                self.next_file_seq += 1;
                f.rewriting = true;
                jobs.push((
                    t as TableId,
                    RewriteJob {
                        file: id,
                        source: file_path(table.schema.name(), id),
                        target_file,
                        target: file_path(table.schema.name(), target_file),
                        safe_ts,
                        rows,
                        deleted,
                    },
                ));
            }
        }
        Ok(jobs)
    }

    /// The rewritten file is durable with `groups`: the row-id map and later snapshots switch
    /// to it at once, with every delete the old file took after the job's safe timestamp;
    /// the old file stays, frozen, for queries that may still read it, and retires like
    /// combined blocks. Returns the change for the catalog.
    pub fn rewrite_done(
        &mut self,
        table: TableId,
        job: &RewriteJob,
        groups: Vec<RowGroupInfo>,
    ) -> Result<Replacement> {
        let applied = self.applied_through;
        let tile_rows = self.config.tile_rows;
        let t = &mut self.tables[table as usize];
        let kept = KeptRows::complement(job.rows, &job.deleted)?;
        let kept_rows = kept.kept();
        assert_eq!(
            groups.iter().map(|g| g.rows).sum::<u64>(),
            kept_rows,
            "a rewritten file holds the rows live at its safe timestamp"
        );
        let old = t
            .files
            .get_mut(&job.file)
            .expect("a file being rewritten stays tracked");
        assert!(old.rewriting, "file {} is being rewritten", job.file);
        // Deletes after the safe timestamp, at their new offsets, in timestamp order (each
        // tile's deletes must be.
        let mut moved: Vec<(Timestamp, u64)> = old
            .visibility
            .pending()
            .map(|(offset, ts)| {
                assert!(
                    ts > job.safe_ts,
                    "deletes at or below the safe timestamp were folded"
                );
                let to = kept
                    .rank(offset)
                    .expect("a row deleted after the safe timestamp was live there");
                (ts, to)
            })
            .collect();
        moved.sort_by_key(|&(ts, _)| ts);
        old.rewriting = false;
        old.superseded = Some(Superseded {
            by: (kept_rows > 0).then_some(job.target_file),
            from: job.safe_ts,
        });
        if kept_rows > 0 {
            let zeros = vec![0u64; kept_rows.div_ceil(64) as usize];
            let mut visibility =
                FileVisibility::from_bitmap(tile_rows, kept_rows, &zeros, job.safe_ts)?;
            for (ts, offset) in moved {
                visibility.delete(offset, ts)?;
            }
            t.files.insert(
                job.target_file,
                FileEntry {
                    visibility,
                    regular: Some(groups),
                    min_snapshot: job.safe_ts,
                    replaces: Some(job.file),
                    replaced_kept: Some(Arc::new(kept.clone())),
                    superseded: None,
                    rewriting: false,
                },
            );
        } else {
            assert!(moved.is_empty(), "no row was live to delete");
        }
        let (first, extent) = t
            .row_ids
            .extent_of(job.file)
            .map(|(r, e)| (r, e.clone()))
            .expect("a file's rows are mapped");
        assert_eq!(extent.offset, 0, "a file's row ids start at its first row");
        let kept = match &extent.kept {
            None => {
                assert_eq!(extent.rows, job.rows, "a file's row ids cover its rows");
                kept
            }
            Some(before) => before.then(&kept)?,
        };
        if kept_rows > 0 {
            t.row_ids.map(
                first,
                Extent {
                    file: job.target_file,
                    offset: 0,
                    rows: extent.rows,
                    kept: Some(Arc::new(kept)),
                },
            );
        } else {
            // No row of the range is live: no key maps into it any more.
            t.row_ids.unmap(first);
        }
        t.retired.push(Retired {
            replaced_at: applied,
            after_checkpoint: self.last_checkpoint,
            paths: vec![job.source.clone()],
            file: Some(job.file),
        });
        Ok(Replacement {
            file: job.file,
            by: (kept_rows > 0).then_some(job.target_file),
            from: job.safe_ts,
        })
    }

    /// The rewrite could not be written: the file stays as it was, and a later GC may try
    /// again.
    pub fn rewrite_failed(&mut self, table: TableId, file: FileId) {
        if let Some(f) = self.tables[table as usize].files.get_mut(&file) {
            f.rewriting = false;
        }
    }

    /// Memory GC at `safe_ts` and storage GC of files more than `dead_fraction` dead, inline
    /// (the node runs the rewrites on its I/O thread). Returns the replacements.
    pub async fn gc_and_rewrite(
        &mut self,
        store: &dyn ObjectStore,
        safe_ts: Timestamp,
        dead_fraction: f64,
    ) -> Result<Vec<Replacement>> {
        self.gc(safe_ts);
        let mut out = Vec::new();
        let mut first_error = None;
        for (t, job) in self.take_rewrite_jobs(safe_ts, dead_fraction)? {
            let schema = self.tables[t as usize].schema.clone();
            match file::rewrite_file(store, &schema, &self.config, &job).await {
                Ok(written) => out.push(self.rewrite_done(t, &job, written.groups)?),
                Err(e) => {
                    self.rewrite_failed(t, job.file);
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(out), Err)
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
            for (&fid, f) in t.files.iter().filter(|(_, f)| f.superseded.is_none()) {
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
                extents: t.row_ids.iter().map(|(r, x)| (r, x.clone())).collect(),
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
                files.insert(f.id, FileEntry::new(visibility, f.regular));
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
                if f.current_regular().is_some() {
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
            .filter_map(|(&id, f)| f.current_regular().map(|g| (id, g.clone())))
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
        Ok(t.files.values().filter(|f| f.superseded.is_none()).fold(
            (0, 0),
            |(rows, deleted), f| {
                (
                    rows + f.visibility.rows(),
                    deleted + f.visibility.deleted_rows(),
                )
            },
        ))
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
