//! Background work on the write buffer: flushing immutable blocks to objects, combining runs
//! of flushed blocks into segments for readers, and a full virtual file's blocks into one
//! regular file. The node runs each job on its I/O thread and reports back;
//! [`Shard::flush_and_combine`] runs them inline.

use object_store::ObjectStore;

use super::{Retired, Shard};
use crate::buffer::{BlockId, CombineJob, CombineKind, FlushJob};
use crate::error::Result;
use crate::file::{self, CombinedFile};
use crate::op::TableId;

impl Shard {
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

    /// The block is durable, `bytes` long.
    pub fn flush_done(&mut self, table: TableId, block: BlockId, bytes: u64) {
        self.tables[table as usize].buffer.flush_done(block, bytes);
    }

    pub fn flush_failed(&mut self, table: TableId, block: BlockId) {
        self.tables[table as usize].buffer.flush_failed(block);
    }

    /// Full virtual files whose blocks are all flushed, and runs of flushed blocks to make
    /// segments of, marked as in flight.
    pub fn take_combine_jobs(&mut self) -> Vec<(TableId, CombineJob)> {
        let mut jobs = Vec::new();
        for (t, table) in self.tables.iter_mut().enumerate() {
            while let Some(job) = table.buffer.take_combine_job() {
                jobs.push((t as TableId, job));
            }
        }
        jobs
    }

    /// The combination is durable. A segment: readers use it in place of its blocks. A
    /// combined file: later snapshots read it instead of the virtual file's objects, which
    /// retire until no query can read them.
    pub fn combine_done(&mut self, table: TableId, job: CombineJob, combined: CombinedFile) {
        let applied = self.applied_through;
        let t = &mut self.tables[table as usize];
        let Some(virtual_file) = t.buffer.combine_done(&job, combined.facts()) else {
            return;
        };
        let CombineKind::File { retire } = job.kind else {
            unreachable!("only a combined file leaves the buffer");
        };
        let groups = combined.groups;
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
            paths: retire,
            file: None,
        });
    }

    pub fn combine_failed(&mut self, table: TableId, job: &CombineJob) {
        self.tables[table as usize].buffer.combine_failed(job);
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
                Ok(bytes) => self.flush_done(t, job.block, bytes),
                Err(e) => {
                    self.flush_failed(t, job.block);
                    first_error.get_or_insert(e);
                }
            }
        }
        // Segments first, then files (a file waits for its segment in flight); a job that
        // fails is not offered again in this call.
        loop {
            let jobs = self.take_combine_jobs();
            if jobs.is_empty() {
                break;
            }
            let mut failed = false;
            for (t, job) in jobs {
                let schema = self.tables[t as usize].schema.clone();
                match file::combine_blocks(store, &schema, &self.config, &job).await {
                    Ok(combined) => self.combine_done(t, job, combined),
                    Err(e) => {
                        self.combine_failed(t, &job);
                        first_error.get_or_insert(e);
                        failed = true;
                    }
                }
            }
            if failed {
                break;
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
