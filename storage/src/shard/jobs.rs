//! Background work on the write buffer: flushing immutable blocks to objects, combining runs
//! of flushed blocks into segments for readers, and a full virtual file's blocks into one
//! regular file. The node runs each job on its I/O thread and reports back;
//! [`Shard::flush_and_combine`] runs them inline.

use object_store::ObjectStore;

use super::{Retired, Shard};
use crate::buffer::{BlockId, CombineJob, CombineKind, Combined, FlushJob};
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

    /// Tail segments to write in files that took no row for `quiet_ticks` ticks, marked as
    /// in flight; the caller calls this once a tick.
    pub fn take_tail_jobs(&mut self, quiet_ticks: u32) -> Vec<(TableId, CombineJob)> {
        let mut jobs = Vec::new();
        for (t, table) in self.tables.iter_mut().enumerate() {
            jobs.extend(
                table
                    .buffer
                    .take_tail_job(quiet_ticks)
                    .map(|job| (t as TableId, job)),
            );
        }
        jobs
    }

    /// The combination is durable. A segment: readers use it in place of its blocks, and a
    /// tail segment it superseded retires until no query can read it. A combined file: later
    /// snapshots read it instead of the virtual file's objects, which retire the same way.
    pub fn combine_done(&mut self, table: TableId, job: CombineJob, combined: CombinedFile) {
        // Objects readers no longer get: they go once no query and no restorable checkpoint
        // can read them.
        let retired = Retired {
            replaced_at: self.applied_through,
            after_checkpoint: self.last_checkpoint,
            paths: Vec::new(),
            file: None,
        };
        let t = &mut self.tables[table as usize];
        let virtual_file = match t.buffer.combine_done(&job, combined.facts()) {
            Combined::File(f) => f,
            Combined::Segment { superseded } => {
                if let Some(path) = superseded {
                    t.retired.push(Retired {
                        paths: vec![path],
                        ..retired
                    });
                }
                return;
            }
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
            paths: retire,
            ..retired
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

#[cfg(test)]
mod tests {
    use futures::executor::block_on;

    use crate::buffer::{BlockData, BlockId, segment_path};
    use crate::file::local_store;
    use crate::{
        ColumnDef, ColumnType, RowOp, Shard, StorageConfig, TableOp, TableSchema, Timestamp, Value,
    };

    fn insert(shard: &mut Shard, ts: u64, ids: std::ops::Range<i64>) {
        let ops: Vec<_> = ids
            .map(|i| TableOp {
                table: 0,
                op: RowOp::Insert(vec![Value::Int(i)]),
            })
            .collect();
        shard.apply(Timestamp::new(ts).unwrap(), &ops).unwrap();
    }

    /// The rows a query at `at` reads, and what it opens: objects by path, `None` for memory.
    fn read(
        shard: &Shard,
        store: &dyn object_store::ObjectStore,
        at: u64,
    ) -> (usize, Vec<Option<String>>) {
        let snap = shard.snapshot(0, Timestamp::new(at).unwrap()).unwrap();
        let rows = block_on(snap.read(store, None))
            .unwrap()
            .iter()
            .map(|b| b.num_rows())
            .sum();
        let parts = snap
            .parts
            .iter()
            .map(|p| match &p.data {
                BlockData::Object(path, _) => Some(path.to_string()),
                BlockData::Memory(_) => None,
            })
            .collect();
        (rows, parts)
    }

    #[test]
    fn a_tail_segment_serves_every_snapshot_and_retires_once_superseded_and_unread() {
        let dir = tempfile::tempdir().unwrap();
        let store = local_store(dir.path()).unwrap();
        let config = StorageConfig {
            tile_rows: 64,
            block_rows: 64,
            row_group_rows: 256,
            file_rows: 768,
            zstd_level: 1,
        };
        let mut shard = Shard::new(0, config).unwrap();
        shard.add_table(
            TableSchema::new(
                "t",
                vec![ColumnDef::new("id", ColumnType::Int64, false)],
                &["id"],
            )
            .unwrap(),
        );
        // Three blocks and a part at ts 2, then rows of blocks 0 and 2 deleted at ts 3.
        insert(&mut shard, 2, 0..64 * 3 + 10);
        let deletes: Vec<_> = [5i64, 130, 131]
            .map(|i| TableOp {
                table: 0,
                op: RowOp::Delete(vec![Value::Int(i)]),
            })
            .to_vec();
        shard.apply(Timestamp::new(3).unwrap(), &deletes).unwrap();
        block_on(shard.flush_and_combine(&store)).unwrap();
        let file = shard.snapshot(0, Timestamp::new(3).unwrap()).unwrap().parts[0].file;
        let seg = |blocks| segment_path("t", BlockId { file, index: 0 }, blocks);
        assert_eq!(
            read(&shard, &store, 3).1.len(),
            4,
            "three blocks, one in memory"
        );

        let run = |shard: &mut Shard| {
            // The first tick sees the rows; the next one is quiet.
            assert!(shard.take_tail_jobs(1).is_empty());
            let jobs = shard.take_tail_jobs(1);
            assert_eq!(jobs.len(), 1);
            for (t, job) in jobs {
                let schema = shard.schema(t).unwrap().clone();
                let combined = block_on(crate::file::combine_blocks(
                    &store,
                    &schema,
                    shard.config(),
                    &job,
                ))
                .unwrap();
                shard.combine_done(t, job, combined);
            }
        };
        run(&mut shard);
        let tail = Some(seg(3).to_string());
        assert_eq!(read(&shard, &store, 3), (64 * 3 + 10 - 3, vec![tail, None]));
        assert_eq!(read(&shard, &store, 2).0, 64 * 3 + 10, "before the deletes");

        // The fourth block makes the full segment, which supersedes the tail: the tail's
        // object stays while a query may still read it.
        insert(&mut shard, 4, 1000..1064);
        block_on(shard.flush_and_combine(&store)).unwrap();
        assert_eq!(read(&shard, &store, 4).0, 64 * 4 + 10 - 3);
        assert_eq!(read(&shard, &store, 4).1, [Some(seg(4).to_string()), None]);
        assert!(dir.path().join(seg(3).to_string()).exists());
        assert!(
            shard
                .take_deletable(Timestamp::new(4).unwrap(), u64::MAX)
                .is_empty(),
            "a query at 4 may still read the tail"
        );
        assert_eq!(
            shard.take_deletable(Timestamp::new(5).unwrap(), u64::MAX),
            [seg(3)]
        );
    }
}
