//! The shard state machine: one shard's tables, each with its write buffer, primary index,
//! row-id map and the visibility of every file it wrote. A mirror transaction's operations are
//! applied at one timestamp, all or nothing; a snapshot answers which rows a query sees.
//!
//! [`Shard`] and its per-table state live here; its methods are split by concern: `apply.rs`
//! (transactions), `read.rs` (what a query reads at a snapshot), `jobs.rs` (flushing and
//! combining the write buffer), `gc.rs` (memory and storage GC, retired objects) and
//! `image.rs` (checkpoints).

mod apply;
mod gc;
mod image;
mod jobs;
mod plan;
mod read;

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::path::Path;

use crate::buffer::{WriteBuffer, file_path};
use crate::config::StorageConfig;
use crate::error::{Result, StorageError};
use crate::file::RowGroupInfo;
use crate::index::{FileId, KeptRows, PrimaryIndex, RowIdMap};
use crate::op::TableId;
use crate::schema::TableSchema;
use crate::ts::Timestamp;
use crate::visibility::FileVisibility;

pub use apply::ApplyStats;
pub use gc::{MAX_REWRITES_PER_GC, Replacement};
pub use read::{BufferPart, RowGroupBitmap, TableSnapshot};

use plan::Plan;

/// One shard's storage: every table's rows that hash to this shard.
pub struct Shard {
    id: u16,
    config: StorageConfig,
    tables: Vec<TableState>,
    next_file_seq: u64,
    applied_through: Timestamp,
    /// The id of the newest checkpoint taken of this shard (0: none).
    last_checkpoint: u64,
    /// Set by [`Shard::set_owner`]: the shard count keys are routed over; [`Shard::apply`]
    /// refuses a key that routes to another shard. `None`: keys are not checked.
    owner: Option<u16>,
    /// Scratch space of [`Shard::apply`].
    plan: Plan,
}

/// One table of the shard.
struct TableState {
    schema: Arc<TableSchema>,
    index: PrimaryIndex,
    row_ids: RowIdMap,
    buffer: WriteBuffer,
    files: BTreeMap<FileId, FileEntry>,
    retired: Vec<Retired>,
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

/// Memory held by a shard, by structure.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryUsage {
    pub index_bytes: usize,
    pub write_buffer_bytes: usize,
    pub visibility_bytes: usize,
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
            owner: None,
            plan: Plan::default(),
        })
    }

    pub fn id(&self) -> u16 {
        self.id
    }

    /// Files made from now on take sequences from `seq` up (or from where they were, if
    /// later): a cluster's new leader starts its files at its epoch's base, so none shares an
    /// id (and an object name) with a file of a former leader that may still be writing.
    pub fn skip_file_seq_to(&mut self, seq: u64) {
        self.next_file_seq = self.next_file_seq.max(seq);
    }

    /// Makes this shard the owner of the keys that [`crate::route::shard_for_key`] sends to its
    /// id among `of` shards: from now on [`Self::apply`] refuses a transaction with any other
    /// key ([`StorageError::WrongShard`]), leaving the shard as it was. Not part of a checkpoint
    /// image: a restored shard checks nothing until this is called again.
    pub fn set_owner(&mut self, of: u16) {
        assert!(self.id < of, "shard {} is not one of {of} shards", self.id);
        self.owner = Some(of);
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

    /// Tables of the shard.
    pub fn table_count(&self) -> usize {
        self.tables.len()
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
