//! What a query reads at a snapshot: a table's files and write-buffer blocks with their
//! deleted-rows bitmaps, row-group bitmaps for the files a coordinator planned, and the
//! visibility checkpoint of a long query.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use object_store::ObjectStore;

use super::{Shard, TableState};
use crate::buffer::{BlockData, ObjectFacts, file_path};
use crate::checkpoint::VisibilityImage;
use crate::error::{Result, StorageError};
use crate::file::{self, Projection};
use crate::index::FileId;
use crate::op::TableId;
use crate::schema::TableSchema;
use crate::ts::Timestamp;

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
    pub parts: Vec<BufferPart>,
}

/// A piece of a [`TableSnapshot`]: a write-buffer block (in memory or flushed), or a whole
/// regular file the query does not read from its plan (with [`Shard::snapshot_except`]: one
/// combined or rewritten after the plan was made). Queries get it as the wire's `BufferPart`.
pub struct BufferPart {
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
                BlockData::Object(path, _) => {
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

impl Shard {
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
            parts.push(BufferPart {
                file: id,
                offset: 0,
                rows,
                data: BlockData::Object(
                    file_path(t.schema.name(), id),
                    ObjectFacts {
                        bytes: None,
                        max_create_ts: file::max_create_ts(groups),
                    },
                ),
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
            parts.push(BufferPart {
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
}
