//! The shard actor: one glommio executor pinned to its core, owning a storage [`Shard`], its
//! visibility checkpoints and its scan service's running queries. It serves its control queue
//! (from the coordinator) before its data queue (batches from the sink, reads, timer ticks and
//! the I/O thread's answers); each arm of [`ShardActor::on_message`] is one call.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::Either;
use retina_protocol::OpBatch;
use retina_storage::buffer::{CombineJob, CombineKind};
use retina_storage::file::CombinedFile;
use retina_storage::{BlockId, FileId, RewriteJob, Shard, StorageError, TableId, Timestamp};

use super::msg::{ShardMsg, Watermarks};
use super::scan_service::{RunningQueries, serve_scan};
use super::vis_checkpoint::VisCheckpoints;
use crate::catalog::Catalog;
use crate::coordinator::{CoordMsg, PlanFile, QueryId, checkpoint_dir};
use crate::handle::BatchBuffers;
use crate::io::IoRequest;
use crate::lake::LakeCheckpoints;
use crate::status::NodeStatus;

/// What a shard needs from the node that starts it (sent to its executor's thread).
pub struct ShardSetup {
    pub id: u16,
    pub shards: u16,
    pub shard: Shard,
    pub catalog: Arc<Catalog>,
    pub coord: flume::Sender<CoordMsg>,
    pub io: flume::Sender<IoRequest>,
    pub status: Arc<NodeStatus>,
    /// Its own data queue, for its timers, GC steps and scan service.
    pub own: flume::Sender<ShardMsg>,
    pub flush_interval: Duration,
    pub gc_interval: Duration,
    /// Storage GC rewrites a file once more than this fraction of it is dead (1: never).
    pub dead_fraction: f64,
    /// Where checkpoint images go, and whether the node takes checkpoints at all.
    pub data_dir: PathBuf,
    /// A remote lake, which receives a copy of every image (`None`: a local lake).
    pub lake_checkpoints: Option<LakeCheckpoints>,
    pub checkpoints: bool,
    /// The watermarks the node starts with.
    pub watermarks: Watermarks,
    /// The scan service's bound listener, and the token its clients present.
    /// Bound and non-blocking; owned here until the actor serves it.
    pub scan_listener: Option<std::net::TcpListener>,
    pub auth_token: Option<String>,
    /// Where an applied batch's buffer goes back to the sink (`None`: it is freed).
    pub(crate) batch_buffers: Option<BatchBuffers>,
}

/// How long a file takes no row before its flushed blocks past its last segment are combined
/// into a tail segment: a table that went quiet is read as a few objects soon after.
const TAIL_QUIET: Duration = Duration::from_secs(1);

/// [`TAIL_QUIET`] in ticks of `flush_interval`, at least one.
fn tail_quiet_ticks(flush_interval: Duration) -> u32 {
    let ticks = TAIL_QUIET.as_millis() / flush_interval.as_millis().max(1);
    u32::try_from(ticks).unwrap_or(u32::MAX).max(1)
}

pub struct ShardActor {
    id: u16,
    shard: Shard,
    /// Ticks a file takes no row before its tail becomes a segment.
    tail_quiet_ticks: u32,
    coord: flume::Sender<CoordMsg>,
    io: flume::Sender<IoRequest>,
    status: Arc<NodeStatus>,
    own: flume::Sender<ShardMsg>,
    dead_fraction: f64,
    data_dir: PathBuf,
    lake_checkpoints: Option<LakeCheckpoints>,
    checkpoints: bool,
    watermarks: Watermarks,
    vis: VisCheckpoints,
    /// The running queries the scan service serves: on this core only, shared with it.
    queries: Rc<RefCell<RunningQueries>>,
    /// Set once a transaction fails: the shard applies nothing after it, but still answers
    /// reads.
    stopped: bool,
    /// Checkpoint images being written: the actor waits for them before it ends.
    writing: Rc<std::cell::Cell<usize>>,
    batch_buffers: Option<BatchBuffers>,
}

impl ShardActor {
    /// Starts the scan service and the timers, then serves `control` and `data` until
    /// [`ShardMsg::Stop`].
    pub async fn run(
        setup: ShardSetup,
        control: flume::Receiver<ShardMsg>,
        data: flume::Receiver<ShardMsg>,
    ) {
        let queries = Rc::new(RefCell::new(RunningQueries::default()));
        // Canceled when the actor stops, which closes the listener: a node started again in
        // this process can bind the port at once.
        let scan_fd = setup.scan_listener.map(std::os::fd::IntoRawFd::into_raw_fd);
        let stop = scan_fd.and_then(|fd| crate::rpc::ListenerStop::new(fd).ok());
        let scan = scan_fd.map(|fd| {
            // SAFETY: a bound, non-blocking TCP listener whose ownership passed here.
            let listener =
                unsafe { <glommio::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            glommio::spawn_local(serve_scan(
                listener,
                setup.own.clone(),
                setup.catalog.clone(),
                queries.clone(),
                setup.auth_token.clone(),
            ))
        });
        // Timers never act: they send a tick into the actor.
        let ticks: [(Duration, fn() -> ShardMsg); 2] = [
            (setup.flush_interval, || ShardMsg::Tick),
            (setup.gc_interval, || ShardMsg::GcTick),
        ];
        for (every, msg) in ticks {
            let tick = setup.own.clone();
            glommio::spawn_local(async move {
                loop {
                    glommio::timer::sleep(every).await;
                    if tick.send_async(msg()).await.is_err() {
                        break;
                    }
                }
            })
            .detach();
        }
        let mut shard = setup.shard;
        // Routing is the sink's alone; a key that is not this shard's means a routing bug,
        // and applying it would split the key across shards: storage refuses it where it
        // encodes the key anyway.
        shard.set_owner(setup.shards);
        let mut actor = ShardActor {
            id: setup.id,
            shard,
            coord: setup.coord,
            io: setup.io,
            status: setup.status,
            own: setup.own,
            dead_fraction: setup.dead_fraction,
            tail_quiet_ticks: tail_quiet_ticks(setup.flush_interval),
            vis: VisCheckpoints::new(&setup.data_dir, setup.id),
            data_dir: setup.data_dir,
            lake_checkpoints: setup.lake_checkpoints,
            checkpoints: setup.checkpoints,
            watermarks: setup.watermarks,
            queries,
            stopped: false,
            writing: Rc::default(),
            batch_buffers: setup.batch_buffers,
        };
        let mut control_open = true;
        while let Some(msg) = next(&control, &data, &mut control_open).await {
            if !actor.on_message(msg).await {
                break;
            }
            glommio::yield_if_needed().await;
        }
        // The last checkpoint's images are written before the shard reports that it stopped.
        while actor.writing.get() > 0 {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        if let Some(scan) = scan {
            scan.cancel().await;
        }
        drop(stop);
    }

    /// Handles one message; false once the actor stops.
    async fn on_message(&mut self, msg: ShardMsg) -> bool {
        match msg {
            ShardMsg::Apply(bytes) => {
                self.on_apply(&bytes).await;
                if let Some(buffers) = &self.batch_buffers {
                    buffers.give_back(bytes);
                }
            }
            ShardMsg::Snapshot {
                table,
                ts,
                except,
                reply,
            } => drop(reply.send(self.snapshot(table, ts, &except))),
            ShardMsg::Bitmaps {
                file,
                ts,
                row_groups,
                reply,
            } => drop(reply.send(self.bitmaps(file, ts, &row_groups))),
            ShardMsg::Tick => self.on_tick(),
            ShardMsg::GcTick => self.on_gc(None),
            ShardMsg::GcStep { table, safe } => self.on_gc(Some((table, safe))),
            ShardMsg::Watermarks(w) => self.watermarks = w,
            ShardMsg::VisCheckpoint { query, snapshot } => {
                self.on_vis_checkpoint(query, snapshot).await
            }
            ShardMsg::DropVisCheckpoint { query } => self.vis.remove(query),
            ShardMsg::QueryBegun {
                query,
                snapshot,
                secret,
            } => self.on_query_begun(query, snapshot, secret),
            ShardMsg::QueryEnded { query } => self.queries.borrow_mut().ended(query),
            ShardMsg::Checkpoint { id, ts } => self.on_checkpoint(id, ts).await,
            ShardMsg::Flushed {
                table,
                block,
                result,
            } => self.on_flushed(table, block, result),
            ShardMsg::Combined { table, job, result } => self.on_combined(table, job, result).await,
            ShardMsg::Rewritten { table, job, result } => {
                self.on_rewritten(table, job, result).await
            }
            ShardMsg::Stop => return false,
        }
        true
    }

    /// Applies one batch. After a transaction fails the shard applies nothing more.
    async fn on_apply(&mut self, bytes: &[u8]) {
        self.status.backlog_batches.fetch_sub(1, Ordering::Relaxed);
        if self.stopped {
            return;
        }
        if let Err(failed) = self.apply(bytes) {
            self.stopped = true;
            self.report_failure(failed).await;
            return;
        }
        let through = self.shard.applied_through();
        let _ = self
            .coord
            .send_async(CoordMsg::Applied {
                shard: self.id,
                ts: through,
            })
            .await;
        self.queries.borrow_mut().applied_through(through);
    }

    /// Applies every transaction of the batch and advances to its "applied through".
    fn apply(&mut self, bytes: &[u8]) -> Result<(), Failure> {
        let batch = OpBatch::access(bytes).map_err(|e| self.poisoned(e))?;
        for txn in batch.txns.iter() {
            let ts = Timestamp::new(txn.ts.to_native()).map_err(|e| self.poisoned(e))?;
            match self.shard.apply(ts, &txn.ops[..]) {
                Ok(stats) => {
                    self.status
                        .rows_applied
                        .fetch_add(stats.ops, Ordering::Relaxed);
                }
                Err(e) => {
                    return Err(Failure::Txn {
                        ts,
                        error: e.to_string(),
                    });
                }
            }
        }
        let through =
            Timestamp::new(batch.applied_through.to_native()).map_err(|e| self.poisoned(e))?;
        self.shard.advance(through).map_err(|e| self.poisoned(e))
    }

    /// A batch this shard cannot read at all: the node fails.
    fn poisoned(&self, e: impl std::fmt::Display) -> Failure {
        Failure::Poisoned(format!("shard {}: {e}", self.id))
    }

    /// Something this shard cannot go on from: the coordinator fails the node with `error`.
    async fn fail_node(&self, error: String) {
        let _ = self.coord.send_async(CoordMsg::Failed { error }).await;
    }

    /// The transaction at `ts` failed: everything before it was applied, so report that (HWM
    /// may reach `ts`, never pass it), then the failure.
    async fn report_failure(&mut self, failed: Failure) {
        let (ts, error) = match failed {
            Failure::Txn { ts, error } => (ts, error),
            Failure::Poisoned(error) => return self.fail_node(error).await,
        };
        let before = ts.prev_or_genesis();
        if self
            .shard
            .advance(before.max(self.shard.applied_through()))
            .is_ok()
        {
            let _ = self
                .coord
                .send_async(CoordMsg::Applied {
                    shard: self.id,
                    ts: before,
                })
                .await;
        }
        let _ = self
            .coord
            .send_async(CoordMsg::ShardFailed {
                shard: self.id,
                ts,
                error,
            })
            .await;
    }

    /// What `table` looks like at `ts` without the files in `except`; a long query whose
    /// snapshot memory GC passed reads from its visibility checkpoint.
    fn snapshot(
        &mut self,
        table: TableId,
        ts: Timestamp,
        except: &[FileId],
    ) -> retina_storage::Result<retina_storage::TableSnapshot> {
        let r = self.shard.snapshot_except(table, ts, except);
        if matches!(r, Err(StorageError::SnapshotTooOld { .. }))
            && let Some(image) = self.vis.image(ts)
        {
            return self.shard.snapshot_with(table, ts, except, Some(&image));
        }
        r
    }

    /// The bitmaps of `file`'s `row_groups` at `ts` (from a visibility checkpoint likewise).
    fn bitmaps(
        &mut self,
        file: FileId,
        ts: Timestamp,
        row_groups: &[u32],
    ) -> retina_storage::Result<Vec<retina_storage::RowGroupBitmap>> {
        let r = self.shard.row_group_bitmaps(file, ts, row_groups);
        if matches!(r, Err(StorageError::SnapshotTooOld { .. }))
            && let Some(image) = self.vis.image(ts)
        {
            return self
                .shard
                .row_group_bitmaps_with(file, ts, row_groups, Some(&image));
        }
        r
    }

    /// Hands full blocks and files to the I/O thread, retired objects no query or checkpoint
    /// reads to deletion, and publishes the shard's memory.
    fn on_tick(&mut self) {
        let shard = &mut self.shard;
        for (table, job) in shard.take_flush_jobs() {
            let schema = shard.schema(table).expect("a shard's own table").clone();
            let req = IoRequest::Flush {
                schema,
                table,
                job,
                reply: self.own.clone(),
            };
            if let Err(flume::TrySendError::Full(IoRequest::Flush { table, job, .. })) =
                self.io.try_send(req)
            {
                shard.flush_failed(table, job.block);
            }
        }
        let mut combine = shard.take_combine_jobs();
        combine.extend(shard.take_tail_jobs(self.tail_quiet_ticks));
        for (table, job) in combine {
            let schema = shard.schema(table).expect("a shard's own table").clone();
            let req = IoRequest::Combine {
                schema,
                table,
                job,
                reply: self.own.clone(),
            };
            if let Err(flume::TrySendError::Full(IoRequest::Combine { table, job, .. })) =
                self.io.try_send(req)
            {
                shard.combine_failed(table, &job);
            }
        }
        // Objects stay while any query may read them, a long one reading from its visibility
        // checkpoint included. With checkpoints, an object leaves only once a checkpoint that
        // does not read it is complete: a restart may load the one before.
        let checkpointed = if self.checkpoints {
            self.watermarks.checkpoint_id
        } else {
            u64::MAX
        };
        let paths = shard.take_deletable(self.watermarks.retain_lwm, checkpointed);
        if !paths.is_empty()
            && let Err(flume::TrySendError::Full(IoRequest::Delete { paths })) =
                self.io.try_send(IoRequest::Delete { paths })
        {
            shard.defer_deletes(paths);
        }
        let m = shard.memory();
        let mem = &self.status.shard_memory[usize::from(self.id)];
        mem.index_bytes
            .store(m.index_bytes as u64, Ordering::Relaxed);
        mem.write_buffer_bytes
            .store(m.write_buffer_bytes as u64, Ordering::Relaxed);
        mem.visibility_bytes.store(
            (m.visibility_bytes + self.vis.memory_bytes()) as u64,
            Ordering::Relaxed,
        );
    }

    /// Memory GC at `min(LWM, HWM - 1)`, and no further than this shard has applied. Both
    /// watermarks only grow and LWM <= HWM - 1, so a query that begins after they were sent
    /// reads at or above the fold point. One table per message: the next table's step goes
    /// to the back of the shard's queue, so replay and scans go on between tables. After the
    /// last table, storage GC picks the files to rewrite.
    fn on_gc(&mut self, step: Option<(TableId, Timestamp)>) {
        let (mut table, safe) = step.unwrap_or_else(|| {
            let w = self.watermarks;
            let safe = w
                .lwm
                .min(w.hwm.snapshot())
                .min(self.shard.applied_through());
            (0, safe)
        });
        let tables = self.shard.table_count() as TableId;
        while table < tables {
            let start = Instant::now();
            let dropped = self.shard.gc_table(table, safe);
            tracing::debug!(
                "shard {}: memory GC of table {table} at {safe} dropped {dropped} index versions in {:?}",
                self.id,
                start.elapsed()
            );
            table += 1;
            if table < tables {
                match self.own.try_send(ShardMsg::GcStep { table, safe }) {
                    Ok(()) => return,
                    // A full queue: the rest now.
                    Err(_) => continue,
                }
            }
        }
        self.status.gc_runs.fetch_add(1, Ordering::Relaxed);
        if self.dead_fraction >= 1.0 {
            return;
        }
        let jobs = match self.shard.take_rewrite_jobs(safe, self.dead_fraction) {
            Ok(jobs) => jobs,
            Err(e) => {
                tracing::warn!("shard {}: storage GC at {safe}: {e}", self.id);
                return;
            }
        };
        for (table, job) in jobs {
            let schema = self
                .shard
                .schema(table)
                .expect("a shard's own table")
                .clone();
            let req = IoRequest::Rewrite {
                schema,
                table,
                job,
                reply: self.own.clone(),
            };
            // Not sent (a full queue, or the I/O thread is gone): the file stays as it was.
            if let Err(e) = self.io.try_send(req)
                && let IoRequest::Rewrite { table, job, .. } = e.into_inner()
            {
                self.shard.rewrite_failed(table, job.file);
            }
        }
    }

    /// Writes query `query`'s bitmaps at `snapshot` to a file and reports to the coordinator.
    async fn on_vis_checkpoint(&mut self, query: QueryId, snapshot: Timestamp) {
        let ok = match self.vis.write(&self.shard, query, snapshot).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(
                    "shard {}: visibility checkpoint of query {query}: {e}",
                    self.id
                );
                false
            }
        };
        let _ = self
            .coord
            .send_async(CoordMsg::VisCheckpointDone {
                query,
                shard: self.id,
                ok,
            })
            .await;
    }

    /// The scan service serves `query` from now on. A query at a snapshot this shard has not
    /// reached is held until it has (a shard started again from a checkpoint catches up while
    /// HWM, and the queries, stay where they were): its scan calls wait meanwhile.
    fn on_query_begun(&mut self, query: QueryId, snapshot: Timestamp, secret: u64) {
        if snapshot > self.shard.applied_through() {
            self.queries.borrow_mut().hold(query, snapshot, secret);
        } else {
            self.queries.borrow_mut().begun(query, snapshot, secret);
        }
    }

    /// Takes this shard's image of checkpoint `id` now (the barrier comes right after the
    /// batch through `ts`, so the shard is exactly at `ts`), then writes it durably (and to a
    /// remote lake) in a task of its own, which reports to the coordinator: the shard goes on
    /// applying meanwhile, so an upload's latency never stalls replay.
    async fn on_checkpoint(&mut self, id: u64, ts: Timestamp) {
        let image = if self.stopped {
            None
        } else {
            self.checkpoint_image(id, ts).await
        };
        let coord = self.coord.clone();
        let shard = self.id;
        let Some(bytes) = image else {
            let _ = coord
                .send_async(CoordMsg::CheckpointDone {
                    id,
                    shard,
                    ok: false,
                })
                .await;
            return;
        };
        let path = checkpoint_dir(&self.data_dir, id).join(format!("shard-{shard}.ckpt"));
        let lake = self.lake_checkpoints.clone();
        let writing = self.writing.clone();
        writing.set(writing.get() + 1);
        glommio::spawn_local(async move {
            let ok = write_checkpoint(shard, id, &path, bytes, lake.as_ref(), &coord).await;
            let _ = coord
                .send_async(CoordMsg::CheckpointDone { id, shard, ok })
                .await;
            writing.set(writing.get() - 1);
        })
        .detach();
    }

    /// This shard's image of checkpoint `id`, encoded; `None` if the shard is not at `ts` (the
    /// checkpoint is skipped) or could not encode it (the node fails).
    async fn checkpoint_image(&mut self, id: u64, ts: Timestamp) -> Option<Vec<u8>> {
        if self.shard.applied_through() != ts {
            tracing::warn!(
                "shard {}: checkpoint {id} at {ts} skipped: applied through {}",
                self.id,
                self.shard.applied_through()
            );
            return None;
        }
        match self.shard.checkpoint(id).and_then(|image| image.encode()) {
            Ok(b) => Some(b),
            Err(e) => {
                let error = format!("shard {}: checkpoint {id}: {e}", self.id);
                self.fail_node(error).await;
                None
            }
        }
    }

    fn on_flushed(&mut self, table: TableId, block: BlockId, result: Result<u64, String>) {
        match result {
            Ok(bytes) => self.shard.flush_done(table, block, bytes),
            Err(e) => {
                tracing::warn!(
                    "shard {}: flushing {block:?} failed, will retry: {e}",
                    self.id
                );
                self.shard.flush_failed(table, block);
            }
        }
    }

    async fn on_combined(
        &mut self,
        table: TableId,
        job: CombineJob,
        result: Result<CombinedFile, String>,
    ) {
        let combined = match result {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(
                    "shard {}: combining {} of file {} failed, will retry: {e}",
                    self.id,
                    match job.kind {
                        CombineKind::File { .. } => "the blocks",
                        CombineKind::Segment { .. } => "a segment",
                    },
                    job.file
                );
                self.shard.combine_failed(table, &job);
                return;
            }
        };
        if matches!(job.kind, CombineKind::Segment { .. }) {
            // Only the shard's scan service hands segments out, with the write buffer.
            return self.shard.combine_done(table, job, combined);
        }
        // The coordinator lists the file in later scan plans; until it has it, the scan
        // service hands the file out with the write buffer.
        let _ = self
            .coord
            .send_async(CoordMsg::FileAdded {
                table,
                file: PlanFile {
                    file: job.file,
                    path: job.target.clone(),
                    bytes: combined.bytes,
                    shard: self.id,
                    row_groups: combined.groups.clone(),
                    min_snapshot: Timestamp::GENESIS,
                    superseded_from: None,
                },
            })
            .await;
        self.shard.combine_done(table, job, combined)
    }

    /// A storage-GC rewrite finished: switch to the new file and tell the coordinator, which
    /// lists it in later plans (the shard's scan service already serves it).
    async fn on_rewritten(
        &mut self,
        table: TableId,
        job: RewriteJob,
        result: Result<CombinedFile, String>,
    ) {
        let written = match result {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(
                    "shard {}: rewriting file {} failed, a later GC may retry: {e}",
                    self.id,
                    job.file
                );
                self.shard.rewrite_failed(table, job.file);
                return;
            }
        };
        let replaced = match self.shard.rewrite_done(table, &job, written.groups.clone()) {
            Ok(r) => r,
            Err(e) => {
                let error = format!(
                    "shard {}: switching to rewritten file {}: {e}",
                    self.id, job.target_file
                );
                return self.fail_node(error).await;
            }
        };
        self.status.files_rewritten.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            "shard {}: storage GC rewrote file {} into {:?} ({} rows kept of {})",
            self.id,
            job.file,
            replaced.by,
            job.kept_rows(),
            job.rows
        );
        let new = replaced.by.map(|file| PlanFile {
            file,
            path: job.target.clone(),
            bytes: written.bytes,
            shard: self.id,
            row_groups: written.groups,
            min_snapshot: replaced.from,
            superseded_from: None,
        });
        let _ = self
            .coord
            .send_async(CoordMsg::FileReplaced {
                table,
                old: replaced.file,
                new,
                from: replaced.from,
            })
            .await;
    }
}

/// Writes shard `shard`'s image of checkpoint `id` durably at `path`, then to a remote lake;
/// false if it could not. A failed local write fails the node: it stops rather than carry on
/// with a checkpoint it cannot trust. An upload that fails (after the store's retries) fails
/// only this checkpoint: the next one tries again, and until one completes nothing the
/// previous one reads is deleted.
async fn write_checkpoint(
    shard: u16,
    id: u64,
    path: &std::path::Path,
    bytes: Vec<u8>,
    lake: Option<&LakeCheckpoints>,
    coord: &flume::Sender<CoordMsg>,
) -> bool {
    if let Err(e) = crate::durable::write_file(path, &bytes).await {
        let error = format!(
            "shard {shard}: writing {}: {e}; the node stops rather than trust a partial \
             checkpoint",
            path.display()
        );
        let _ = coord.send_async(CoordMsg::Failed { error }).await;
        return false;
    }
    // A remote lake keeps a copy, for a node on another machine.
    if let Some(lake) = lake {
        let name = format!("shard-{shard}.ckpt");
        if let Err(e) = lake.put(id, &name, bytes.into()).await {
            tracing::warn!(
                "shard {shard}: checkpoint {id} not uploaded to the lake, so it does not \
                 complete: {e}"
            );
            return false;
        }
    }
    true
}

/// Why a batch stopped applying.
enum Failure {
    /// The transaction at `ts` could not be applied; everything before it was.
    Txn { ts: Timestamp, error: String },
    /// The batch itself is unreadable: the node fails with this error.
    Poisoned(String),
}

/// The next message: the coordinator's control queue first, then whichever queue has one.
async fn next(
    control: &flume::Receiver<ShardMsg>,
    data: &flume::Receiver<ShardMsg>,
    control_open: &mut bool,
) -> Option<ShardMsg> {
    if *control_open {
        match control.try_recv() {
            Ok(m) => return Some(m),
            Err(flume::TryRecvError::Disconnected) => *control_open = false,
            Err(flume::TryRecvError::Empty) => {}
        }
    }
    if !*control_open {
        return data.recv_async().await.ok();
    }
    // Polled in order: a control message ready with a data one wins.
    match futures::future::select(control.recv_async(), data.recv_async()).await {
        Either::Left((Ok(m), _)) => Some(m),
        Either::Left((Err(_), data)) => {
            *control_open = false;
            data.await.ok()
        }
        Either::Right((m, _)) => m.ok(),
    }
}
