//! Garbage collection: memory GC folds old deletes and drops index versions no snapshot can
//! see; storage GC rewrites files with many dead rows; objects that left the catalog are
//! handed out for deletion once no query or checkpoint can still read them.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::path::Path;

use super::{FileEntry, Retired, Shard, Superseded};
use crate::buffer::file_path;
use crate::error::Result;
use crate::file::{self, RewriteJob, RowGroupInfo};
use crate::index::{Extent, FileId, KeptRows};
use crate::op::TableId;
use crate::ts::Timestamp;
use crate::visibility::FileVisibility;

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

impl Shard {
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
        // Deletes after the safe timestamp, at their new offsets, in timestamp order: a tile
        // takes its deletes in timestamp order, and the old file's pending deletes come tile by
        // tile, while one tile of the new file may hold rows of several old tiles.
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
}
