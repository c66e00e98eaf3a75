//! The node at run time: a coordinator, one replayer shard per core, and an object-store I/O
//! thread, talking only by message.
//!
//! - Each shard is a glommio executor pinned to its core. It owns a storage [`Shard`] and reads
//!   rkyv [`OpBatch`]es in place; nothing else touches its state.
//! - The coordinator is an executor of its own (placed on core 0 beside shard 0). It owns the
//!   timestamp allocator, HWM and LWM ([`CoordinatorState`]) and persists them.
//! - Object-store I/O (flushing blocks, combining files, deleting retired objects) runs on a
//!   tokio runtime on its own thread, since object_store needs tokio; shards reach it over flume.
//! - The sink ([`NodeHandle::submit`]) groups source transactions, takes their timestamps from
//!   the coordinator in one request (group begin), routes each operation to its shard and sends
//!   every shard its slice, ending in "applied through" (so HWM is a group commit).
//!
//! Every channel is bounded; a full shard queue blocks the sink, which stops reading the source.

use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};
use object_store::{ObjectStore, ObjectStoreExt};
use retina_protocol::{OpBatch, WireTableOp, WireTxn};
use retina_storage::buffer::{CombineJob, FlushJob};
use retina_storage::file::{self, RowGroupInfo, local_store};
use retina_storage::{
    BlockId, Hwm, RewriteJob, RowOp, RowRef, Shard, StorageError, TableId, TableOp, TableOpRef,
    TableSchema, TableSnapshot, Timestamp, Value,
};
use rkyv::util::AlignedVec;

use crate::catalog::Catalog;
use crate::coordinator::{
    BeginRefused, CheckpointRecord, CoordinatorError, CoordinatorState, LOCAL, Owner, QueryId,
    SourceMark, StateFile, checkpoint_dir,
};
use crate::debezium::DecimalHandling;
use crate::router::shard_of;
use crate::settings::Settings;
use crate::vis_checkpoint::VisCheckpoints;

/// Messages to a shard's executor. Delivered in the order sent by each sender.
pub enum ShardMsg {
    /// From the sink: a batch of transactions (an archived [`OpBatch`]), in timestamp order
    /// after every earlier batch. The shard applies them and reports "applied through".
    Apply(AlignedVec),
    /// From a reader: what `table` looks like at `ts`, without the regular files in `except`
    /// (the reader has them from its scan plan).
    Snapshot {
        table: TableId,
        ts: Timestamp,
        except: Vec<retina_storage::FileId>,
        reply: flume::Sender<retina_storage::Result<TableSnapshot>>,
    },
    /// From the scan service: bitmaps of a regular file's row groups at `ts`.
    Bitmaps {
        file: retina_storage::FileId,
        ts: Timestamp,
        row_groups: Vec<u32>,
        reply: flume::Sender<retina_storage::Result<Vec<retina_storage::RowGroupBitmap>>>,
    },
    /// From the shard's own timer: time to hand full blocks and files to the I/O thread.
    Tick,
    /// From the shard's own GC timer: time for memory GC.
    GcTick,
    /// From the shard itself: memory GC goes on with `table`, at `safe` (one table per
    /// message, so other messages are served in between).
    GcStep { table: TableId, safe: Timestamp },
    /// From the sink, after every batch through `ts`: write this shard's image of checkpoint
    /// `id` durably and report to the coordinator.
    Checkpoint { id: u64, ts: Timestamp },
    /// From the coordinator: query `query` has run long; write its bitmaps at `snapshot` to a
    /// file and report, after which memory GC may fold past the snapshot.
    VisCheckpoint { query: QueryId, snapshot: Timestamp },
    /// From the coordinator: query `query` ended; drop its visibility checkpoint, if any.
    DropVisCheckpoint { query: QueryId },
    /// From the coordinator, before the query's begin is answered: the scan service may serve
    /// `query` (presented with `secret`) at `snapshot`. The shard acknowledges on `ack` once
    /// it does, so a client's first call after beginQuery finds the query here.
    QueryBegun {
        query: QueryId,
        snapshot: Timestamp,
        secret: u64,
        ack: flume::Sender<()>,
    },
    /// From the coordinator: `query` ended (or its lease ran out, or its connection closed);
    /// the scan service refuses it from now on. May overtake its `QueryBegun`.
    QueryEnded { query: QueryId },
    /// From the I/O thread: a block flush finished.
    Flushed {
        table: TableId,
        block: BlockId,
        result: Result<(), String>,
    },
    /// From the I/O thread: a file combination finished.
    Combined {
        table: TableId,
        job: CombineJob,
        result: Result<file::CombinedFile, String>,
    },
    /// From the I/O thread: a storage-GC rewrite finished.
    Rewritten {
        table: TableId,
        job: RewriteJob,
        result: Result<file::CombinedFile, String>,
    },
    /// From the node: stop after the messages before this one.
    Stop,
}

/// Messages to the coordinator.
pub enum CoordMsg {
    /// From the sink: `n` timestamps for a group of transactions (group begin).
    Allocate {
        n: u64,
        reply: flume::Sender<Result<RangeInclusive<u64>, CoordinatorError>>,
    },
    /// From a shard: it applied every transaction through `ts` (group commit).
    Applied { shard: u16, ts: Timestamp },
    /// From a shard: the transaction at `ts` could not be applied; the shard stops there.
    ShardFailed {
        shard: u16,
        ts: Timestamp,
        error: String,
    },
    /// From the sink, after its last batch: start a checkpoint of everything handed out, taken
    /// at `source`. The reply is its record, or `None` while one is on its way.
    BeginCheckpoint {
        source: SourceMark,
        /// The sink's own state at `source` (what it needs to recognise redelivered
        /// transactions after a restart), written durably into the checkpoint.
        source_state: Vec<u8>,
        reply: flume::Sender<Option<CheckpointRecord>>,
    },
    /// From a shard: its image of checkpoint `id` is durable (`ok`), or could not be written.
    CheckpointDone { id: u64, shard: u16, ok: bool },
    /// From the sink: replay stopped (a bad source, an unreadable file): what is visible is all
    /// there will be, so queries waiting for more stop waiting.
    ReplayStopped,
    /// From the sink: it replayed the source as far as it reached before this run, through
    /// `ts` (`None`: it cannot tell). Queries that waited may begin once HWM passes it.
    CaughtUp { ts: Option<Timestamp> },
    /// From a reader (`owner`: its connection): begin a query at the current snapshot. After
    /// a restart the reply waits until HWM is back where queries saw it before; it comes once
    /// every shard's scan service knows the query.
    BeginQuery {
        owner: Owner,
        reply: flume::Sender<Result<QueryTicket, BeginRefused>>,
    },
    /// From a reader: `owner`'s query ended. The reply, if asked for, says whether it was
    /// still running (its lease had not run out) and `owner`'s.
    EndQuery {
        owner: Owner,
        id: QueryId,
        reply: Option<flume::Sender<bool>>,
    },
    /// From a reader: extend `owner`'s query's lease; the reply is its ticket, or `None` if
    /// it had ended, its lease ran out, or it is another owner's.
    RenewQuery {
        owner: Owner,
        id: QueryId,
        reply: flume::Sender<Option<QueryTicket>>,
    },
    /// From the coordinator service: `owner`'s connection closed; its queries end.
    ConnectionClosed { owner: Owner },
    /// From a shard: it combined a regular file of `table`; later scan plans list it.
    FileAdded { table: TableId, file: PlanFile },
    /// From a shard: storage GC replaced regular file `old` of `table` with `new` (none when no
    /// row survived); plans at snapshots from `from` on list the new one instead.
    FileReplaced {
        table: TableId,
        old: retina_storage::FileId,
        new: Option<PlanFile>,
        from: Timestamp,
    },
    /// From a shard: its visibility checkpoint of `query` is written (`ok`) or not.
    VisCheckpointDone {
        query: QueryId,
        shard: u16,
        ok: bool,
    },
    /// From the coordinator service: a query's scan plan of `table`. Renews the query's lease;
    /// the reply is `None` if the query had ended, its lease ran out, or it is another
    /// owner's.
    Plan {
        owner: Owner,
        id: QueryId,
        table: TableId,
        reply: flume::Sender<Option<(Timestamp, Vec<PlanFile>)>>,
    },
    /// From the coordinator's timer: expire leases, persist HWM.
    Tick,
    /// From the node: persist and stop.
    Stop { reply: flume::Sender<()> },
}

/// A running query as its beginner gets it: the scan services serve `id` at `snapshot` to
/// whoever presents `secret`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueryTicket {
    pub id: QueryId,
    pub snapshot: Timestamp,
    pub secret: u64,
}

/// The `file://` URL of the lake directory, which scan plans give readers.
fn lake_url(lake: &std::path::Path) -> Result<String, NodeError> {
    let abs = lake.canonicalize().map_err(|source| NodeError::DataDir {
        path: lake.to_owned(),
        source,
    })?;
    let text = abs.to_str().ok_or_else(|| NodeError::DataDir {
        path: lake.to_owned(),
        source: std::io::Error::other("the data directory's path is not UTF-8"),
    })?;
    Ok(format!("file://{}/", text.trim_end_matches('/')))
}

/// A regular file as scan plans list it.
#[derive(Clone, Debug)]
pub struct PlanFile {
    pub file: retina_storage::FileId,
    pub path: object_store::path::Path,
    pub bytes: u64,
    /// The shard that owns the file's visibility.
    pub shard: u16,
    pub row_groups: Vec<RowGroupInfo>,
    /// A file storage GC wrote serves snapshots from its rewrite's safe timestamp on.
    pub min_snapshot: Timestamp,
    /// Set once storage GC replaced the file: snapshots from here on read the replacement.
    pub superseded_from: Option<Timestamp>,
}

impl PlanFile {
    /// Whether a query at `snapshot` reads this file (and not its predecessor or successor).
    pub fn serves(&self, snapshot: Timestamp) -> bool {
        self.min_snapshot <= snapshot && self.superseded_from.is_none_or(|t| snapshot < t)
    }
}

/// Begins waiting for the node to catch up count toward the caps on running queries: a
/// connection may not queue more than it may run.
fn waiting_refused<T>(waiting: &[(Owner, T, Instant)], owner: Owner) -> Option<BeginRefused> {
    use crate::coordinator::{MAX_QUERIES_PER_CONNECTION, MAX_RUNNING_QUERIES};
    if owner == LOCAL {
        return None;
    }
    let mine = waiting.iter().filter(|(o, _, _)| *o == owner).count();
    if mine >= MAX_QUERIES_PER_CONNECTION as usize {
        return Some(BeginRefused::ConnectionLimit {
            limit: MAX_QUERIES_PER_CONNECTION,
        });
    }
    (waiting.len() >= MAX_RUNNING_QUERIES as usize).then_some(BeginRefused::NodeLimit {
        limit: MAX_RUNNING_QUERIES,
    })
}

/// Messages to the object-store I/O thread.
enum IoRequest {
    Flush {
        schema: Arc<TableSchema>,
        table: TableId,
        job: FlushJob,
        reply: flume::Sender<ShardMsg>,
    },
    Combine {
        schema: Arc<TableSchema>,
        table: TableId,
        job: CombineJob,
        reply: flume::Sender<ShardMsg>,
    },
    Delete {
        paths: Vec<object_store::path::Path>,
    },
    Rewrite {
        schema: Arc<TableSchema>,
        table: TableId,
        job: RewriteJob,
        reply: flume::Sender<ShardMsg>,
    },
}

/// What a lake write is, for [`NodeStatus::io_in_flight`].
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IoKind {
    /// A write-buffer block flushed as a small Parquet object.
    Flush,
    /// Flushed blocks combined into a file.
    Combine,
    /// A file storage GC rewrote without its dead rows.
    Rewrite,
    /// Retired objects deleted.
    Delete,
}

impl IoKind {
    pub const ALL: [IoKind; 4] = [
        IoKind::Flush,
        IoKind::Combine,
        IoKind::Rewrite,
        IoKind::Delete,
    ];

    /// Its name in metrics.
    pub fn name(self) -> &'static str {
        match self {
            IoKind::Flush => "flush",
            IoKind::Combine => "combine",
            IoKind::Rewrite => "rewrite",
            IoKind::Delete => "delete",
        }
    }
}

impl IoRequest {
    fn kind(&self) -> IoKind {
        match self {
            IoRequest::Flush { .. } => IoKind::Flush,
            IoRequest::Combine { .. } => IoKind::Combine,
            IoRequest::Rewrite { .. } => IoKind::Rewrite,
            IoRequest::Delete { .. } => IoKind::Delete,
        }
    }
}

/// I/O requests that may wait for the I/O thread before a shard's timer tick blocks.
const IO_QUEUE: usize = 1024;
/// Messages that may wait for the coordinator.
const COORD_QUEUE: usize = 1024;
/// io_uring buffer memory each executor registers (locked memory). Small, so a node runs under
/// a non-root user's default 8 MiB memlock limit; raise it when shards do DMA file I/O.
const EXECUTOR_IO_MEMORY: usize = 512 << 10;

/// Memory of one shard, by structure, as of its last tick.
#[derive(Default)]
pub struct ShardMemory {
    pub index_bytes: AtomicU64,
    pub write_buffer_bytes: AtomicU64,
    pub visibility_bytes: AtomicU64,
}

/// What the node reports: counters and gauges the actors update and metrics read.
#[derive(Default)]
pub struct NodeStatus {
    pub hwm: AtomicU64,
    pub lwm: AtomicU64,
    /// The oldest snapshot any running query reads, checkpointed long queries included:
    /// objects stay until it passes them.
    pub retain_lwm: AtomicU64,
    /// Running queries that read from a visibility checkpoint.
    pub vis_checkpoints: AtomicU64,
    /// Memory GC runs, over all shards.
    pub gc_runs: AtomicU64,
    /// Regular files storage GC rewrote (or dropped, every row dead).
    pub files_rewritten: AtomicU64,
    /// Source transactions handed to the shards.
    pub txns_submitted: AtomicU64,
    /// Source transactions visible (below HWM) since this node started.
    pub txns_applied: AtomicU64,
    /// Row operations the shards applied (an update counts once).
    pub rows_applied: AtomicU64,
    pub duplicates_skipped: AtomicU64,
    pub dead_lettered: AtomicU64,
    /// Source lines that carry no change and were skipped: Debezium heartbeats, logical
    /// decoding messages (`op: "m"`) and schema change events.
    pub heartbeats_skipped: AtomicU64,
    pub messages_skipped: AtomicU64,
    pub schema_changes_skipped: AtomicU64,
    /// Open source transactions restarted by a repeated BEGIN of the same transaction.
    pub txn_restarts: AtomicU64,
    /// Batches sent to shards and not yet applied, over all shards.
    pub backlog_batches: AtomicU64,
    pub running_queries: AtomicU64,
    /// The id of the newest complete checkpoint (0: none).
    pub checkpoint_id: AtomicU64,
    /// The timestamp it was taken at.
    pub checkpoint_ts: AtomicU64,
    pub shard_memory: Vec<ShardMemory>,
    pub source_done: AtomicBool,
    /// The timestamp of the transaction a shard refused (0: none); replay stopped before it.
    pub failed_ts: AtomicU64,
    /// Lake writes the I/O thread has in hand, by kind (see [`IoKind`]).
    pub io_in_flight: [AtomicU64; IoKind::ALL.len()],
    /// Whether a checkpoint is on its way through the shards (begun, not yet recorded).
    pub checkpoint_in_progress: AtomicBool,
    error: Mutex<Option<String>>,
}

impl NodeStatus {
    fn new(shards: u16) -> Self {
        NodeStatus {
            hwm: AtomicU64::new(Hwm::INITIAL.get().get()),
            lwm: AtomicU64::new(Timestamp::GENESIS.get()),
            retain_lwm: AtomicU64::new(Timestamp::GENESIS.get()),
            shard_memory: (0..shards).map(|_| ShardMemory::default()).collect(),
            ..Default::default()
        }
    }

    /// The first error that stopped replay, if any.
    pub fn error(&self) -> Option<String> {
        self.error.lock().expect("status lock").clone()
    }

    /// Records the error that stops replay; the first one wins.
    pub fn fail(&self, error: String) {
        let mut e = self.error.lock().expect("status lock");
        if e.is_none() {
            tracing::error!("{error}");
            *e = Some(error);
        }
    }

    pub fn hwm(&self) -> Hwm {
        let ts = Timestamp::new(self.hwm.load(Ordering::Acquire)).expect("HWM is a timestamp");
        Hwm::after(ts.prev_or_genesis()).expect("HWM - 1 is a timestamp")
    }
}

/// What the node needs to start.
pub struct NodeOptions {
    pub data_dir: PathBuf,
    pub catalog: Arc<Catalog>,
    pub settings: Settings,
    /// Where the coordinator's Cap'n Proto service listens (port 0: any free port); `None`
    /// serves no RPC.
    pub listen: Option<std::net::SocketAddr>,
    /// The token clients present at bootstrap; required beyond loopback.
    pub auth_token: Option<String>,
    /// Queries wait for the sink's [`NodeHandle::caught_up`] before they begin (a sink reads
    /// the source); else only until HWM is back where it was persisted.
    pub await_source: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("invalid setting: {0}")]
    Settings(#[from] crate::settings::SettingsError),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    #[error(transparent)]
    Storage(#[from] retina_storage::StorageError),
    #[error("starting executor for {what}: {reason}")]
    Executor { what: String, reason: String },
    #[error("the node has stopped")]
    Stopped,
    #[error(transparent)]
    Refused(#[from] BeginRefused),
    #[error("encoding a batch of transactions for the shards: {0}")]
    Batch(String),
    #[error("data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },
    #[error(
        "data directory {path} is in use by another node ({owner}); stop it first, or give \
         this node its own --data-dir"
    )]
    Locked { path: PathBuf, owner: String },
    #[error(
        "data directory {path} was written with another schema ({changes}); start with the \
         schema it was written with, or from an empty data directory"
    )]
    CatalogChanged { path: PathBuf, changes: String },
}

/// A cheap handle to a running node: submit transactions, read tables, watch status.
#[derive(Clone)]
pub struct NodeHandle {
    /// Held from timestamp allocation to the last send of a group: groups reach every shard
    /// in timestamp order even when several threads submit.
    submit_order: Arc<Mutex<()>>,
    shards: Vec<flume::Sender<ShardMsg>>,
    coord: flume::Sender<CoordMsg>,
    catalog: Arc<Catalog>,
    status: Arc<NodeStatus>,
    store: Arc<dyn ObjectStore>,
    /// Where the source resumes: the position of the checkpoint this run started from.
    resume: Option<SourceMark>,
    /// The sink's state recorded with that checkpoint (empty: none).
    resume_state: Arc<[u8]>,
    /// How the sink reads decimals of a stream without the envelope schema.
    decimal_handling: DecimalHandling,
}

/// A running node. Dropping it without [`Node::shutdown`] leaves its threads running.
pub struct Node {
    handle: NodeHandle,
    /// The data directory's lock, held while the node runs.
    _lock: std::fs::File,
    listening: Option<std::net::SocketAddr>,
    scan_addrs: Vec<std::net::SocketAddr>,
    coordinator: Option<glommio::ExecutorJoinHandle<()>>,
    executors: Vec<glommio::ExecutorJoinHandle<()>>,
    io_thread: Option<std::thread::JoinHandle<()>>,
    io: flume::Sender<IoRequest>,
}

impl Node {
    /// Starts the coordinator, the shards and the I/O thread over `options.data_dir`.
    pub fn start(mut options: NodeOptions) -> Result<Node, NodeError> {
        options.settings.validate()?;
        // Absolute once, here: glommio opens directories relative to no descriptor, so a
        // relative path fails there (EBADF) long after the start.
        options.data_dir =
            absolute_dir(&options.data_dir).map_err(|source| NodeError::DataDir {
                path: options.data_dir.clone(),
                source,
            })?;
        let settings = &options.settings;
        let shards = settings.shard_count();
        let lake = options.data_dir.join("lake");
        let store = local_store(&lake)?;
        let store_url = lake_url(&lake)?;
        let lock = lock_data_dir(&options.data_dir)?;
        let state_file = StateFile::new(&options.data_dir);
        let persisted = state_file.load()?;
        check_catalog(
            &options.data_dir,
            &options.catalog,
            persisted.checkpoint.is_some(),
        )?;
        let recovered = recover(&options, &persisted, &lake)?;
        let resume_state: Arc<[u8]> = match persisted.checkpoint {
            Some(c) => {
                let path = checkpoint_dir(&options.data_dir, c.id).join(SOURCE_STATE_FILE);
                match std::fs::read(&path) {
                    Ok(b) => b.into(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Arc::from([]),
                    Err(source) => return Err(NodeError::DataDir { path, source }),
                }
            }
            None => Arc::from([]),
        };
        let status = Arc::new(NodeStatus::new(shards));
        let resume_ts = persisted.checkpoint.map_or(Timestamp::GENESIS, |c| c.ts);
        status.hwm.store(
            Hwm::after(resume_ts)
                .expect("below the maximum")
                .get()
                .get(),
            Ordering::Release,
        );
        status.lwm.store(resume_ts.get(), Ordering::Release);
        status.retain_lwm.store(resume_ts.get(), Ordering::Release);
        if let Some(c) = persisted.checkpoint {
            status.checkpoint_id.store(c.id, Ordering::Release);
            status.checkpoint_ts.store(c.ts.get(), Ordering::Release);
            tracing::info!(
                "resuming from checkpoint {} at timestamp {} (source byte {}, line {})",
                c.id,
                c.ts,
                c.source.offset,
                c.source.line
            );
        }
        let mut plan_files: std::collections::HashMap<
            TableId,
            std::collections::BTreeMap<retina_storage::FileId, PlanFile>,
        > = Default::default();
        for shard in &recovered {
            for t in 0..options.catalog.tables().len() as TableId {
                let schema = options.catalog.get(t).expect("a catalog table");
                for (file, row_groups) in shard.regular_files(t)? {
                    let path = retina_storage::buffer::file_path(schema.name(), file);
                    let bytes = std::fs::metadata(lake.join(path.as_ref()))
                        .map(|m| m.len())
                        .map_err(|source| NodeError::DataDir {
                            path: lake.join(path.as_ref()),
                            source,
                        })?;
                    plan_files.entry(t).or_default().insert(
                        file,
                        PlanFile {
                            file,
                            path,
                            bytes,
                            shard: shard.id(),
                            row_groups,
                            min_snapshot: Timestamp::GENESIS,
                            superseded_from: None,
                        },
                    );
                }
            }
        }
        let mut recovered = recovered.into_iter();

        // Object-store I/O thread.
        let (io_tx, io_rx) = flume::bounded::<IoRequest>(IO_QUEUE);
        let io_thread = {
            let store = store.clone();
            let config = settings.storage();
            let lake: Arc<std::path::Path> = lake.clone().into();
            let status = status.clone();
            std::thread::Builder::new()
                .name("retina-io".into())
                .spawn(move || io_main(io_rx, store, config, lake, status))
                .map_err(|e| NodeError::Executor {
                    what: "the I/O thread".into(),
                    reason: e.to_string(),
                })?
        };

        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (coord_tx, coord_rx) = flume::bounded::<CoordMsg>(COORD_QUEUE);
        let mut executors = Vec::new();
        let spawn_err = |what: String| {
            move |e: glommio::GlommioError<()>| NodeError::Executor {
                what,
                reason: e.to_string(),
            }
        };

        // The coordinator's RPC listener, bound here so that a bad address fails the start.
        let mut listening = None;
        let listener_fd = match options.listen {
            Some(addr) => {
                crate::rpc::check_listen(addr, options.auth_token.as_deref()).map_err(
                    |reason| NodeError::Executor {
                        what: "the coordinator service".into(),
                        reason,
                    },
                )?;
                let listener =
                    std::net::TcpListener::bind(addr).map_err(|e| NodeError::Executor {
                        what: format!("the coordinator service on {addr}"),
                        reason: e.to_string(),
                    })?;
                listening = Some(listener.local_addr().map_err(|e| NodeError::Executor {
                    what: "the coordinator service".into(),
                    reason: e.to_string(),
                })?);
                listener
                    .set_nonblocking(true)
                    .map_err(|e| NodeError::Executor {
                        what: "the coordinator service".into(),
                        reason: e.to_string(),
                    })?;
                Some(std::os::fd::IntoRawFd::into_raw_fd(listener))
            }
            None => None,
        };

        // Each shard's scan service: the ports after the coordinator's (any free port when the
        // coordinator's is 0), on the same host.
        let mut scan_listeners = Vec::new();
        let mut scan_addrs = Vec::new();
        if let Some(base) = listening {
            for id in 0..shards {
                let mut addr = base;
                if base.port() != 0 {
                    addr.set_port(base.port() + 1 + id);
                }
                if options.listen.is_some_and(|l| l.port() == 0) {
                    addr.set_port(0);
                }
                let bind_err = |e: std::io::Error| NodeError::Executor {
                    what: format!("the scan service of shard {id} on {addr}"),
                    reason: e.to_string(),
                };
                let l = std::net::TcpListener::bind(addr).map_err(bind_err)?;
                scan_addrs.push(l.local_addr().map_err(bind_err)?);
                l.set_nonblocking(true).map_err(bind_err)?;
                scan_listeners.push(Some(std::os::fd::IntoRawFd::into_raw_fd(l)));
            }
        } else {
            scan_listeners.resize(shards.into(), None);
        }

        // Every shard's queue, created first: the coordinator sends to shards too.
        let (shard_txs, mut shard_rxs): (Vec<_>, Vec<_>) = (0..shards)
            .map(|_| flume::bounded::<ShardMsg>(settings.shard_queue_batches))
            .unzip();
        let mut shard_rxs = shard_rxs.drain(..);

        // Coordinator.
        {
            let status = status.clone();
            let tx = coord_tx.clone();
            let state = CoordinatorState::new(shards, persisted, options.await_source);
            let data_dir = options.data_dir.clone();
            let persist = Duration::from_millis(settings.persist_interval_ms);
            let lease = settings.query_lease_ms;
            let rpc_coord = coord_tx.clone();
            let rpc_catalog = options.catalog.clone();
            let token = options.auth_token.clone();
            let endpoints = scan_addrs.clone();
            let store_url = store_url.clone();
            let to_shards = shard_txs.clone();
            let long_query_ms = settings.long_query_ms;
            let query_wait = Duration::from_millis(settings.query_wait_ms);
            executors.push(
                LocalExecutorBuilder::new(Placement::Fixed(0))
                    .name("retina-coordinator")
                    .io_memory(EXECUTOR_IO_MEMORY)
                    .spawn(move || async move {
                        if let Some(fd) = listener_fd {
                            // SAFETY: the descriptor is a bound, non-blocking TCP listener whose
                            // ownership passed here from `into_raw_fd`.
                            let listener = unsafe {
                                <glommio::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(
                                    fd,
                                )
                            };
                            glommio::spawn_local(crate::rpc::serve(
                                listener,
                                rpc_coord,
                                rpc_catalog,
                                token,
                                lease,
                                endpoints,
                                store_url,
                            ))
                            .detach();
                        }
                        coordinator_main(
                            Coordinator {
                                state,
                                file: state_file,
                                data_dir,
                                files: plan_files,
                                status,
                                lease_ms: lease,
                                shards: to_shards,
                                long_query_ms,
                                query_wait,
                                secrets: std::hash::RandomState::new(),
                            },
                            coord_rx,
                            tx,
                            persist,
                        )
                        .await
                    })
                    .map_err(spawn_err("the coordinator".into()))?,
            );
        }
        let coordinator = executors.pop();

        // Shards.
        for id in 0..shards {
            let tx = shard_txs[usize::from(id)].clone();
            let rx = shard_rxs.next().expect("a queue per shard");
            let ctx = ShardContext {
                id,
                shards,
                catalog: options.catalog.clone(),
                coord: coord_tx.clone(),
                io: io_tx.clone(),
                status: status.clone(),
                own: tx,
                flush_interval: Duration::from_millis(settings.flush_interval_ms),
                gc_interval: Duration::from_millis(settings.gc_interval_ms),
                dead_fraction: settings.storage_gc_dead_fraction,
                data_dir: options.data_dir.clone(),
                checkpoints: settings.checkpoint_interval_ms > 0,
                scan_listener: scan_listeners[usize::from(id)],
                auth_token: options.auth_token.clone(),
            };
            let shard = match recovered.next() {
                Some(s) => s,
                None => {
                    let mut s = Shard::new(id, settings.storage())?;
                    for t in options.catalog.tables() {
                        s.add_table(t.clone());
                    }
                    s
                }
            };
            executors.push(
                LocalExecutorBuilder::new(Placement::Fixed(usize::from(id) % cores))
                    .name(&format!("retina-shard-{id}"))
                    .io_memory(EXECUTOR_IO_MEMORY)
                    .spawn(move || shard_main(ctx, shard, rx))
                    .map_err(spawn_err(format!("shard {id}")))?,
            );
        }

        Ok(Node {
            listening,
            scan_addrs,
            handle: NodeHandle {
                submit_order: Arc::new(Mutex::new(())),
                shards: shard_txs,
                coord: coord_tx,
                catalog: options.catalog,
                status,
                store,
                resume: persisted.checkpoint.map(|c| c.source),
                resume_state,
                decimal_handling: settings.decimal_handling,
            },
            _lock: lock,
            coordinator,
            executors,
            io_thread: Some(io_thread),
            io: io_tx,
        })
    }

    pub fn handle(&self) -> &NodeHandle {
        &self.handle
    }

    /// Where each shard's scan service listens, by shard (empty without `listen`).
    pub fn scan_addrs(&self) -> &[std::net::SocketAddr] {
        &self.scan_addrs
    }

    /// Where the coordinator's Cap'n Proto service listens, if it does.
    pub fn coordinator_addr(&self) -> Option<std::net::SocketAddr> {
        self.listening
    }

    /// Stops every actor after what was sent before, persists the coordinator, and waits.
    /// The shards stop first, so the coordinator records a checkpoint they finished.
    pub fn shutdown(mut self) {
        for s in &self.handle.shards {
            let _ = s.send(ShardMsg::Stop);
        }
        for e in self.executors.drain(..) {
            let _ = e.join();
        }
        let (tx, rx) = flume::bounded(1);
        if self.handle.coord.send(CoordMsg::Stop { reply: tx }).is_ok() {
            let _ = rx.recv();
        }
        if let Some(c) = self.coordinator.take() {
            let _ = c.join();
        }
        drop(self.io);
        if let Some(t) = self.io_thread.take() {
            let _ = t.join();
        }
    }
}

impl NodeHandle {
    pub fn status(&self) -> &Arc<NodeStatus> {
        &self.status
    }

    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// The `decimal_handling` setting: how a decimal without the envelope schema is encoded.
    pub fn decimal_handling(&self) -> DecimalHandling {
        self.decimal_handling
    }

    pub fn shard_count(&self) -> u16 {
        self.shards.len() as u16
    }

    /// Replays a group of source transactions (each a list of operations on catalog tables):
    /// takes their timestamps in one request, routes every operation to its shard (a
    /// key-changing update whose keys live on two shards becomes a delete on one and an insert
    /// on the other, in the same mirror transaction), and sends each shard its slice. Blocks
    /// while a shard's queue is full. Returns the timestamps the transactions got.
    pub fn submit<R: AsRef<[Value]> + RowRef>(
        &self,
        txns: &[Vec<TableOp<R>>],
        sources: &[String],
    ) -> Result<RangeInclusive<u64>, NodeError> {
        let _order = self.submit_order.lock().expect("submit lock");
        let range = self.allocate(txns.len() as u64)?;
        let batches = self.encode_group(txns, range.clone(), sources)?;
        self.send_encoded(batches)?;
        self.status
            .txns_submitted
            .fetch_add(txns.len() as u64, Ordering::Relaxed);
        Ok(range)
    }

    /// Where the source resumes after a restart: the position of the checkpoint this run
    /// started from (`None`: from the start).
    pub fn resume(&self) -> Option<SourceMark> {
        self.resume
    }

    /// The sink's state recorded with the checkpoint this run started from (empty without
    /// one, or for a checkpoint written before sinks recorded state).
    pub fn resume_state(&self) -> &[u8] {
        &self.resume_state
    }

    /// Puts a checkpoint barrier after every transaction submitted so far, taken at `source`
    /// (where the source stands after the last of them). Returns its id, or `None` while an
    /// earlier one is still on its way; [`NodeStatus::checkpoint_id`] says when it is complete.
    pub fn checkpoint(
        &self,
        source: SourceMark,
        source_state: Vec<u8>,
    ) -> Result<Option<u64>, NodeError> {
        let _order = self.submit_order.lock().expect("submit lock");
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send(CoordMsg::BeginCheckpoint {
                source,
                source_state,
                reply: tx,
            })
            .map_err(|_| NodeError::Stopped)?;
        let Some(record) = rx.recv().map_err(|_| NodeError::Stopped)? else {
            return Ok(None);
        };
        for s in &self.shards {
            s.send(ShardMsg::Checkpoint {
                id: record.id,
                ts: record.ts,
            })
            .map_err(|_| NodeError::Stopped)?;
        }
        Ok(Some(record.id))
    }

    /// Replay stopped on `error` (the sink's own: bad input, an unreadable source): the node
    /// fails (logged, in the metrics) and keeps serving what is visible.
    pub fn stop_replay(&self, error: String) {
        self.status.fail(error);
        let _ = self.coord.send(CoordMsg::ReplayStopped);
    }

    /// The sink replayed the source as far as it reached before this run, through `ts`
    /// (`None`: it cannot tell, as with stdin): queries waiting for that may begin.
    pub fn caught_up(&self, ts: Option<u64>) {
        let ts = ts.and_then(|t| Timestamp::new(t).ok());
        let _ = self.coord.send(CoordMsg::CaughtUp { ts });
    }

    /// `n` consecutive timestamps from the coordinator (group begin).
    pub fn allocate(&self, n: u64) -> Result<RangeInclusive<u64>, NodeError> {
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send(CoordMsg::Allocate { n, reply: tx })
            .map_err(|_| NodeError::Stopped)?;
        Ok(rx.recv().map_err(|_| NodeError::Stopped)??)
    }

    /// Routes a group of transactions that got the timestamps `range` and encodes every
    /// shard's slice as an op batch (one per shard, in shard order). `sources` names where each
    /// transaction came from, for errors (or is empty).
    pub fn encode_group<R: AsRef<[Value]> + RowRef>(
        &self,
        txns: &[Vec<TableOp<R>>],
        range: RangeInclusive<u64>,
        sources: &[String],
    ) -> Result<Vec<AlignedVec>, NodeError> {
        assert_eq!(
            txns.len() as u64,
            range.end() - range.start() + 1,
            "a timestamp per transaction"
        );
        let shards = self.shard_count();
        let mut slices: Vec<Vec<WireTxn>> = vec![Vec::new(); shards.into()];
        let mut scratch = Vec::new();
        for (i, (txn, ts)) in txns.iter().zip(range.clone()).enumerate() {
            let source = sources.get(i).cloned().unwrap_or_default();
            let mut per_shard: Vec<Vec<WireTableOp>> = vec![Vec::new(); shards.into()];
            for op in txn {
                let schema = self.catalog.get(op.table).expect("ops name catalog tables");
                match &op.op {
                    RowOp::Insert(r) | RowOp::Delete(r) | RowOp::Upsert(r) => {
                        let s = shard_of(schema, r, shards, &mut scratch);
                        per_shard[usize::from(s)].push(WireTableOp::from(op));
                    }
                    // The table's rows are spread over every shard by key hash.
                    RowOp::Truncate => {
                        for ops in &mut per_shard {
                            ops.push(WireTableOp::from(op));
                        }
                    }
                    RowOp::Update { before, after } => {
                        let from = shard_of(schema, before, shards, &mut scratch);
                        let to = shard_of(schema, after, shards, &mut scratch);
                        if from == to {
                            per_shard[usize::from(from)].push(WireTableOp::from(op));
                        } else {
                            // A key-changing update across shards: a delete on one, an insert
                            // on the other, in the same mirror transaction.
                            let delete = TableOp {
                                table: op.table,
                                op: RowOp::Delete(before.as_ref()),
                            };
                            let insert = TableOp {
                                table: op.table,
                                op: RowOp::Insert(after.as_ref()),
                            };
                            per_shard[usize::from(from)].push(wire_of(&delete));
                            per_shard[usize::from(to)].push(wire_of(&insert));
                        }
                    }
                }
            }
            for (s, ops) in per_shard.into_iter().enumerate() {
                if !ops.is_empty() {
                    slices[s].push(WireTxn {
                        ts,
                        source: source.clone(),
                        ops,
                    });
                }
            }
        }
        slices
            .into_iter()
            .map(|txns| {
                OpBatch {
                    txns,
                    applied_through: *range.end(),
                }
                .encode()
                .map_err(|e| NodeError::Batch(e.to_string()))
            })
            .collect()
    }

    /// Sends each shard its batch (from [`Self::encode_group`]), blocking while a queue is full.
    pub fn send_encoded(&self, batches: Vec<AlignedVec>) -> Result<(), NodeError> {
        assert_eq!(batches.len(), self.shards.len(), "a batch per shard");
        for (s, bytes) in batches.into_iter().enumerate() {
            // Counted before the send, so the shard's decrement never comes first.
            self.status.backlog_batches.fetch_add(1, Ordering::Relaxed);
            if self.shards[s].send(ShardMsg::Apply(bytes)).is_err() {
                self.status.backlog_batches.fetch_sub(1, Ordering::Relaxed);
                return Err(NodeError::Stopped);
            }
        }
        Ok(())
    }

    /// Waits until HWM passes `ts` (every transaction through `ts` is visible), an error stops
    /// replay, or `timeout` passes. True if HWM passed.
    pub fn wait_visible(&self, ts: u64, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self.status.hwm.load(Ordering::Acquire) > ts {
                return true;
            }
            if self.status.error().is_some() || start.elapsed() > timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Begins a query: its id and snapshot. LWM stays at or below the snapshot until it ends.
    pub fn begin_query(&self) -> Result<(QueryId, Timestamp), NodeError> {
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send(CoordMsg::BeginQuery {
                owner: LOCAL,
                reply: tx,
            })
            .map_err(|_| NodeError::Stopped)?;
        let q = rx.recv().map_err(|_| NodeError::Stopped)??;
        Ok((q.id, q.snapshot))
    }

    /// Extends a running query's lease; false if the query had ended or its lease ran out.
    pub fn renew_query(&self, id: QueryId) -> Result<bool, NodeError> {
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send(CoordMsg::RenewQuery {
                owner: LOCAL,
                id,
                reply: tx,
            })
            .map_err(|_| NodeError::Stopped)?;
        Ok(rx.recv().map_err(|_| NodeError::Stopped)?.is_some())
    }

    pub fn end_query(&self, id: QueryId) {
        let _ = self.coord.send(CoordMsg::EndQuery {
            owner: LOCAL,
            id,
            reply: None,
        });
    }

    /// Every row of `table` visible at `ts`, from every shard, with the stored columns
    /// (`_create_ts` last).
    pub fn read_table(
        &self,
        table: TableId,
        ts: Timestamp,
    ) -> Result<Vec<arrow::record_batch::RecordBatch>, NodeError> {
        let schema = self
            .catalog
            .get(table)
            .ok_or(retina_storage::StorageError::UnknownTable(table))?;
        // Only what is below HWM is committed on every shard.
        let hwm = self.status.hwm();
        if ts >= hwm.get() {
            return Err(retina_storage::StorageError::SnapshotInFuture {
                requested: ts,
                applied_through: hwm.snapshot(),
            }
            .into());
        }
        let mut projection: Vec<usize> = (0..schema.columns().len()).collect();
        projection.push(schema.create_ts_index());
        let mut out = Vec::new();
        for s in &self.shards {
            let (tx, rx) = flume::bounded(1);
            s.send(ShardMsg::Snapshot {
                table,
                ts,
                except: Vec::new(),
                reply: tx,
            })
            .map_err(|_| NodeError::Stopped)?;
            let snap = rx.recv().map_err(|_| NodeError::Stopped)??;
            out.extend(futures::executor::block_on(
                snap.read(self.store.as_ref(), Some(&projection)),
            )?);
        }
        Ok(out)
    }
}

/// The file in a checkpoint's folder holding the sink's state.
const SOURCE_STATE_FILE: &str = "source.state";

/// Takes the data directory's exclusive lock (`DATA_DIR/lock`, holding the owner's pid), so
/// that a second node on the same directory is refused instead of corrupting it.
fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File, NodeError> {
    use std::io::{Read, Seek, Write};
    let path = dir.join("lock");
    let io = |source| NodeError::DataDir {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut owner = String::new();
            let _ = file.read_to_string(&mut owner);
            return Err(NodeError::Locked {
                path: dir.to_owned(),
                owner: owner.trim().to_owned(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "pid {}", std::process::id()).map_err(io)?;
    Ok(file)
}

/// The catalog the data directory was written with (`DATA_DIR/catalog.txt`) must be the one
/// the node starts with: a checkpoint's rows are laid out by it. The first start records it.
fn check_catalog(
    dir: &std::path::Path,
    catalog: &Catalog,
    has_checkpoint: bool,
) -> Result<(), NodeError> {
    let path = dir.join("catalog.txt");
    let now = catalog.describe();
    match std::fs::read_to_string(&path) {
        Ok(before) if before == now => Ok(()),
        Ok(before) if has_checkpoint => {
            let changed: Vec<String> = now
                .lines()
                .zip(before.lines().chain(std::iter::repeat("(none)")))
                .filter(|(n, b)| n != b)
                .map(|(n, b)| format!("was `{b}`, is now `{n}`"))
                .chain(
                    before
                        .lines()
                        .skip(now.lines().count())
                        .map(|b| format!("`{b}` was removed")),
                )
                .collect();
            Err(NodeError::CatalogChanged {
                path: dir.to_owned(),
                changes: changed.join("; "),
            })
        }
        // No checkpoint reads the old layout: the new catalog replaces it.
        Ok(_) => write_durably(&path, now.as_bytes()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_durably(&path, now.as_bytes()),
        Err(source) => Err(NodeError::DataDir { path, source }),
    }
}

/// Replaces `path` with `bytes` with blocking calls: a temporary file, fsync, rename, fsync
/// of the folder.
fn write_durably(path: &std::path::Path, bytes: &[u8]) -> Result<(), NodeError> {
    let io = |source| NodeError::DataDir {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    crate::durable::sync_dir(path.parent().expect("a file in the data directory")).map_err(io)
}

/// `dir`, created if missing, as an absolute path (not resolving symbolic links, so the
/// path the user gave stays recognisable in messages).
pub fn absolute_dir(dir: &std::path::Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::path::absolute(dir)
}

fn wire_of(op: &TableOp<&[Value]>) -> WireTableOp {
    let row = |r: &[Value]| retina_protocol::WireRow::from(r);
    WireTableOp {
        table: op.table,
        op: match &op.op {
            RowOp::Insert(r) => retina_protocol::WireOp::Insert(row(r)),
            RowOp::Delete(r) => retina_protocol::WireOp::Delete(row(r)),
            RowOp::Update { before, after } => retina_protocol::WireOp::Update {
                before: row(before),
                after: row(after),
            },
            RowOp::Upsert(r) => retina_protocol::WireOp::Upsert(row(r)),
            RowOp::Truncate => retina_protocol::WireOp::Truncate,
        },
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The coordinator actor's state: the deterministic [`CoordinatorState`] and what it needs to
/// persist and answer.
struct Coordinator {
    state: CoordinatorState,
    file: StateFile,
    data_dir: PathBuf,
    /// The regular files of each table, as the shards report them.
    files: std::collections::HashMap<
        TableId,
        std::collections::BTreeMap<retina_storage::FileId, PlanFile>,
    >,
    status: Arc<NodeStatus>,
    lease_ms: u64,
    /// Every shard's queue, for visibility checkpoints of long queries.
    shards: Vec<flume::Sender<ShardMsg>>,
    /// A query running this long gets a visibility checkpoint (0: never).
    long_query_ms: u64,
    /// How long a begin waits for HWM to catch up after a restart.
    query_wait: Duration,
    /// The key of query secrets (random per run): a secret is a keyed hash of the query id,
    /// which no client can compute.
    secrets: std::hash::RandomState,
}

impl Coordinator {
    /// Persists `p` durably (direct I/O on this core); a failure poisons the node.
    async fn persist(&mut self, p: crate::coordinator::Persisted) -> bool {
        let bytes = StateFile::encode(&p);
        match crate::durable::write_file(self.file.path(), &bytes).await {
            Ok(()) => {
                self.state.persisted_hwm(p);
                true
            }
            Err(e) => {
                self.status.fail(format!(
                    "coordinator: writing {}: {e}; the node stops rather than lose state",
                    self.file.path().display()
                ));
                false
            }
        }
    }

    fn publish(&self) {
        let s = &self.status;
        s.running_queries
            .store(self.state.running_queries() as u64, Ordering::Relaxed);
        s.vis_checkpoints
            .store(self.state.vis_checkpointed() as u64, Ordering::Relaxed);
        s.lwm.store(self.state.lwm().get().get(), Ordering::Release);
        s.retain_lwm
            .store(self.state.retain_lwm().get().get(), Ordering::Release);
    }

    /// Sends `msg(shard)` to every shard (or one) from a task of its own: a full shard queue
    /// must not stall the coordinator, which the shards report to.
    fn to_shards(&self, only: Option<u16>, msg: impl Fn() -> ShardMsg + 'static) {
        let targets: Vec<_> = match only {
            Some(s) => self
                .shards
                .get(usize::from(s))
                .cloned()
                .into_iter()
                .collect(),
            None => self.shards.clone(),
        };
        glommio::spawn_local(async move {
            for s in targets {
                let _ = s.send_async(msg()).await;
            }
        })
        .detach();
    }

    /// Asks the shards for visibility checkpoints of queries that ran long, and to drop those
    /// of queries that ended.
    fn long_queries(&mut self) {
        if self.long_query_ms > 0 {
            for (query, snapshot) in self
                .state
                .start_vis_checkpoints(now_ms(), self.long_query_ms)
            {
                tracing::info!(
                    "query {query} at snapshot {snapshot} ran {} ms or longer: taking its \
                     visibility checkpoint",
                    self.long_query_ms
                );
                self.to_shards(None, move || ShardMsg::VisCheckpoint { query, snapshot });
            }
        }
        for query in self.state.take_vis_to_drop() {
            self.to_shards(None, move || ShardMsg::DropVisCheckpoint { query });
        }
    }

    /// Begins `owner`'s query and answers once every shard's scan service knows it (from its
    /// own task: the coordinator goes on meanwhile). Shards learn of it and of its end in the
    /// order the coordinator sends, both from tasks it spawns in that order.
    fn begin_query(
        &mut self,
        owner: Owner,
        reply: flume::Sender<Result<QueryTicket, BeginRefused>>,
    ) {
        let (id, snapshot) = match self.state.begin_query(owner, now_ms(), self.lease_ms) {
            Ok(q) => q,
            Err(refused) => {
                let _ = reply.send(Err(refused));
                return;
            }
        };
        self.publish();
        let secret = self.secret(id);
        let shards = self.shards.clone();
        glommio::spawn_local(async move {
            let mut acks = Vec::with_capacity(shards.len());
            for s in &shards {
                let (ack, done) = flume::bounded(1);
                let msg = ShardMsg::QueryBegun {
                    query: id,
                    snapshot,
                    secret,
                    ack,
                };
                if s.send_async(msg).await.is_ok() {
                    acks.push(done);
                }
            }
            for done in acks {
                let _ = done.recv_async().await;
            }
            let _ = reply.send(Ok(QueryTicket {
                id,
                snapshot,
                secret,
            }));
        })
        .detach();
    }

    /// Query `id`'s secret.
    fn secret(&self, id: QueryId) -> u64 {
        std::hash::BuildHasher::hash_one(&self.secrets, id)
    }

    /// Tells every shard's scan service that `ended` queries ended.
    fn queries_ended(&mut self, ended: Vec<QueryId>) {
        for query in ended {
            self.to_shards(None, move || ShardMsg::QueryEnded { query });
        }
        self.long_queries();
        self.publish();
    }
}

async fn coordinator_main(
    mut c: Coordinator,
    rx: flume::Receiver<CoordMsg>,
    own: flume::Sender<CoordMsg>,
    persist_every: Duration,
) {
    // Timers never act: they send a tick into the actor.
    glommio::spawn_local(async move {
        loop {
            glommio::timer::sleep(persist_every).await;
            if own.send_async(CoordMsg::Tick).await.is_err() {
                break;
            }
        }
    })
    .detach();
    let mut dirty = false;
    // Queries that began before HWM was back where a query saw it before the restart.
    // Each waits at most `query_wait_ms`, then is refused with a typed error.
    type BeginReply = flume::Sender<Result<QueryTicket, BeginRefused>>;
    let mut waiting: Vec<(Owner, BeginReply, Instant)> = Vec::new();
    while let Ok(msg) = rx.recv_async().await {
        match msg {
            CoordMsg::Allocate { n, reply } => {
                let _ = reply.send(c.state.allocate(n));
            }
            CoordMsg::Applied { shard, ts } => match c.state.applied(shard, ts) {
                Ok(Some(hwm)) => {
                    c.status.hwm.store(hwm.get().get(), Ordering::Release);
                    c.status
                        .txns_applied
                        .store(c.state.applied_this_run(), Ordering::Relaxed);
                    c.publish();
                    dirty = true;
                }
                Ok(None) => {}
                Err(e) => c.status.fail(format!("coordinator: {e}")),
            },
            CoordMsg::ShardFailed { shard, ts, error } => {
                let _ = c.status.failed_ts.compare_exchange(
                    0,
                    ts.get(),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                );
                c.status.fail(format!(
                    "shard {shard} stopped at the transaction with timestamp {ts}: {error}; \
                     HWM stays below it and every earlier transaction stays visible"
                ));
                c.state.replay_stopped();
            }
            CoordMsg::CaughtUp { ts } => c.state.caught_up(ts),
            CoordMsg::ReplayStopped => c.state.replay_stopped(),
            CoordMsg::BeginCheckpoint {
                source,
                source_state,
                reply,
            } => {
                let record = c.state.begin_checkpoint(source);
                if let Some(r) = record {
                    // Durable before any shard confirms, so before the record that makes the
                    // checkpoint complete.
                    let dir = checkpoint_dir(&c.data_dir, r.id);
                    // The folder's entry in checkpoints/ is made durable too.
                    let made = std::fs::create_dir_all(&dir).and_then(|()| {
                        crate::durable::sync_dir(dir.parent().expect("checkpoints/<id>"))
                    });
                    let written = match made {
                        Ok(()) => {
                            crate::durable::write_file(&dir.join(SOURCE_STATE_FILE), &source_state)
                                .await
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = written {
                        c.status.fail(format!(
                            "coordinator: writing checkpoint {}: {e}",
                            dir.display()
                        ));
                        c.state.checkpoint_done(r.id, 0, false);
                        let _ = reply.send(None);
                        continue;
                    }
                }
                let _ = reply.send(record);
            }
            CoordMsg::CheckpointDone { id, shard, ok } => {
                if let Some(record) = c.state.checkpoint_done(id, shard, ok) {
                    // The commit point: from here on a restart starts from this checkpoint.
                    let p = c.state.persisted_with(record);
                    if c.persist(p).await {
                        let replaced = c.state.checkpoint_recorded(record);
                        // The checkpoint it replaced goes before the new one is published, so
                        // that a published checkpoint is the only one on disk.
                        if let Some(old) = replaced {
                            let dir = checkpoint_dir(&c.data_dir, old.id);
                            if let Err(e) = std::fs::remove_dir_all(&dir) {
                                tracing::warn!("removing {}: {e}", dir.display());
                            }
                        }
                        c.status.checkpoint_id.store(record.id, Ordering::Release);
                        c.status
                            .checkpoint_ts
                            .store(record.ts.get(), Ordering::Release);
                        tracing::debug!("checkpoint {} at {} is complete", record.id, record.ts);
                    }
                } else if !ok {
                    let dir = checkpoint_dir(&c.data_dir, id);
                    let _ = std::fs::remove_dir_all(&dir);
                }
            }
            CoordMsg::BeginQuery { owner, reply } => {
                if c.state.ready() {
                    c.begin_query(owner, reply);
                } else if let Some(refused) = waiting_refused(&waiting, owner) {
                    let _ = reply.send(Err(refused));
                } else {
                    waiting.push((owner, reply, Instant::now() + c.query_wait));
                }
            }
            CoordMsg::RenewQuery { owner, id, reply } => {
                let ticket = c
                    .state
                    .renew_query(owner, id, now_ms(), c.lease_ms)
                    .map(|snapshot| QueryTicket {
                        id,
                        snapshot,
                        secret: c.secret(id),
                    });
                let _ = reply.send(ticket);
            }
            CoordMsg::ConnectionClosed { owner } => {
                waiting.retain(|(o, _, _)| *o != owner);
                let ended = c.state.end_owner(owner);
                c.queries_ended(ended);
            }
            CoordMsg::FileAdded { table, file } => {
                c.files.entry(table).or_default().insert(file.file, file);
            }
            CoordMsg::FileReplaced {
                table,
                old,
                new,
                from,
            } => {
                let files = c.files.entry(table).or_default();
                if let Some(f) = files.get_mut(&old) {
                    f.superseded_from = Some(from);
                }
                if let Some(new) = new {
                    files.insert(new.file, new);
                }
            }
            CoordMsg::VisCheckpointDone { query, shard, ok } => {
                if !ok {
                    tracing::warn!(
                        "shard {shard} could not write the visibility checkpoint of query \
                         {query}: it keeps holding LWM"
                    );
                }
                if c.state.vis_checkpoint_done(query, ok) {
                    tracing::info!("query {query} reads from its visibility checkpoint");
                }
                c.long_queries();
                c.publish();
            }
            CoordMsg::Plan {
                owner,
                id,
                table,
                reply,
            } => {
                let plan = c
                    .state
                    .renew_query(owner, id, now_ms(), c.lease_ms)
                    .map(|snapshot| {
                        let listed = c
                            .files
                            .get(&table)
                            .map(|f| f.values().filter(|f| f.serves(snapshot)).cloned().collect())
                            .unwrap_or_default();
                        (snapshot, listed)
                    });
                let _ = reply.send(plan);
            }
            CoordMsg::EndQuery { owner, id, reply } => {
                let running = c.state.end_query(owner, id);
                if let Some(reply) = reply {
                    let _ = reply.send(running);
                }
                c.queries_ended(if running { vec![id] } else { Vec::new() });
            }
            CoordMsg::Tick => {
                let now = Instant::now();
                waiting.retain(|(_, reply, deadline)| {
                    if now < *deadline {
                        return true;
                    }
                    let _ = reply.send(Err(c.state.catching_up()));
                    false
                });
                let expired = c.state.expire_queries(now_ms());
                c.queries_ended(expired);
                // Files storage GC replaced leave the plans once no query may read them.
                let oldest = c.state.retain_lwm().get();
                for files in c.files.values_mut() {
                    files.retain(|_, f| f.superseded_from.is_none_or(|t| t > oldest));
                }
                c.publish();
                if dirty && c.persist(c.state.persisted()).await {
                    dirty = false;
                }
            }
            CoordMsg::Stop { reply } => {
                c.persist(c.state.persisted()).await;
                let _ = reply.send(());
                break;
            }
        }
        c.status
            .checkpoint_in_progress
            .store(c.state.checkpoint_pending(), Ordering::Relaxed);
        if !waiting.is_empty() && c.state.ready() {
            for (owner, reply, _) in std::mem::take(&mut waiting) {
                c.begin_query(owner, reply);
            }
        }
    }
}

/// What a restart finds in the data directory: each shard restored from the newest complete
/// checkpoint (none without one), every lake object that checkpoint does not read removed
/// (files written after it, or by a run that never checkpointed), and every other checkpoint
/// removed (incomplete ones).
fn recover(
    options: &NodeOptions,
    persisted: &crate::coordinator::Persisted,
    lake: &std::path::Path,
) -> Result<Vec<Shard>, NodeError> {
    let shards = options.settings.shard_count();
    let mut restored = Vec::new();
    if let Some(c) = persisted.checkpoint {
        if c.shards != shards {
            return Err(NodeError::Checkpoint {
                path: checkpoint_dir(&options.data_dir, c.id),
                reason: format!(
                    "it was taken with {} shards, this node runs {shards}: start with --shards {}",
                    c.shards, c.shards
                ),
            });
        }
        let schemas: Vec<Arc<TableSchema>> = options.catalog.tables().to_vec();
        for id in 0..shards {
            let path = checkpoint_dir(&options.data_dir, c.id).join(format!("shard-{id}.ckpt"));
            let err = |reason: String| NodeError::Checkpoint {
                path: path.clone(),
                reason,
            };
            let bytes = std::fs::read(&path).map_err(|e| err(e.to_string()))?;
            let image =
                retina_storage::ShardImage::decode(&bytes).map_err(|e| err(e.to_string()))?;
            if image.shard != id || image.applied_through != c.ts {
                return Err(err(format!(
                    "it holds shard {} at {}, the record says shard {id} at {}",
                    image.shard, image.applied_through, c.ts
                )));
            }
            let shard = Shard::from_image(options.settings.storage(), &schemas, image, c.id)
                .map_err(|e| err(e.to_string()))?;
            restored.push(shard);
        }
    }
    let keep: std::collections::HashSet<PathBuf> = restored
        .iter()
        .flat_map(|s| s.objects())
        .map(|p| lake.join(p.as_ref()))
        .collect();
    let mut removed = 0usize;
    remove_unreferenced(&lake.join("tables"), &keep, &mut removed).map_err(|source| {
        NodeError::DataDir {
            path: lake.to_owned(),
            source,
        }
    })?;
    if removed > 0 {
        tracing::info!("removed {removed} lake objects no checkpoint refers to");
    }
    // No query survives a restart, so neither does a visibility checkpoint.
    let vis = crate::vis_checkpoint::vis_dir(&options.data_dir);
    let _ = std::fs::remove_dir_all(&vis);
    std::fs::create_dir_all(&vis).map_err(|source| NodeError::DataDir {
        path: vis.clone(),
        source,
    })?;
    let checkpoints = options.data_dir.join("checkpoints");
    if let Ok(entries) = std::fs::read_dir(&checkpoints) {
        let current = persisted
            .checkpoint
            .map(|c| checkpoint_dir(&options.data_dir, c.id));
        for e in entries.flatten() {
            if Some(e.path()) != current {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(restored)
}

fn remove_unreferenced(
    dir: &std::path::Path,
    keep: &std::collections::HashSet<PathBuf>,
    removed: &mut usize,
) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let path = e.path();
        if e.file_type()?.is_dir() {
            remove_unreferenced(&path, keep, removed)?;
        } else if !keep.contains(&path) {
            std::fs::remove_file(&path)?;
            *removed += 1;
        }
    }
    Ok(())
}

struct ShardContext {
    id: u16,
    shards: u16,
    catalog: Arc<Catalog>,
    coord: flume::Sender<CoordMsg>,
    io: flume::Sender<IoRequest>,
    status: Arc<NodeStatus>,
    own: flume::Sender<ShardMsg>,
    flush_interval: Duration,
    gc_interval: Duration,
    /// Storage GC rewrites a file once more than this fraction of it is dead (1: never).
    dead_fraction: f64,
    /// Where checkpoint images go, and whether the node takes checkpoints at all.
    data_dir: PathBuf,
    checkpoints: bool,
    /// The scan service's bound listener, and the token its clients present.
    scan_listener: Option<std::os::fd::RawFd>,
    auth_token: Option<String>,
}

async fn shard_main(ctx: ShardContext, mut shard: Shard, rx: flume::Receiver<ShardMsg>) {
    // The running queries the scan service serves: on this core only, shared with the service.
    let queries = std::rc::Rc::new(std::cell::RefCell::new(
        crate::rpc::RunningQueries::default(),
    ));
    if let Some(fd) = ctx.scan_listener {
        // SAFETY: a bound, non-blocking TCP listener whose ownership passed here.
        let listener =
            unsafe { <glommio::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        glommio::spawn_local(crate::rpc::serve_scan(
            listener,
            ctx.own.clone(),
            ctx.catalog.clone(),
            queries.clone(),
            ctx.auth_token.clone(),
        ))
        .detach();
    }
    // Timers never act: they send a tick into the actor.
    let ticks: [(Duration, fn() -> ShardMsg); 2] = [
        (ctx.flush_interval, || ShardMsg::Tick),
        (ctx.gc_interval, || ShardMsg::GcTick),
    ];
    for (every, msg) in ticks {
        let tick = ctx.own.clone();
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
    // Set once a transaction fails: the shard applies nothing after it, but still answers reads.
    let mut stopped = false;
    let mut scratch = Vec::new();
    let mut vis = VisCheckpoints::new(&ctx.data_dir, ctx.id);
    while let Ok(msg) = rx.recv_async().await {
        match msg {
            ShardMsg::Apply(bytes) => {
                ctx.status.backlog_batches.fetch_sub(1, Ordering::Relaxed);
                if !stopped {
                    stopped = !on_apply(&ctx, &mut shard, &bytes, &mut scratch);
                }
            }
            ShardMsg::Snapshot {
                table,
                ts,
                except,
                reply,
            } => {
                let mut r = shard.snapshot_except(table, ts, &except);
                // Memory GC passed a long query's snapshot: its checkpoint answers.
                if matches!(r, Err(StorageError::SnapshotTooOld { .. }))
                    && let Some(image) = vis.image(ts)
                {
                    r = shard.snapshot_with(table, ts, &except, Some(&image));
                }
                let _ = reply.send(r);
            }
            ShardMsg::Bitmaps {
                file,
                ts,
                row_groups,
                reply,
            } => {
                let mut r = shard.row_group_bitmaps(file, ts, &row_groups);
                if matches!(r, Err(StorageError::SnapshotTooOld { .. }))
                    && let Some(image) = vis.image(ts)
                {
                    r = shard.row_group_bitmaps_with(file, ts, &row_groups, Some(&image));
                }
                let _ = reply.send(r);
            }
            ShardMsg::Tick => on_tick(&ctx, &mut shard, &vis),
            ShardMsg::GcTick => on_gc(&ctx, &mut shard, None),
            ShardMsg::GcStep { table, safe } => on_gc(&ctx, &mut shard, Some((table, safe))),
            ShardMsg::VisCheckpoint { query, snapshot } => {
                let ok = match vis.write(&shard, query, snapshot).await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(
                            "shard {}: visibility checkpoint of query {query}: {e}",
                            ctx.id
                        );
                        false
                    }
                };
                let _ = ctx
                    .coord
                    .send_async(CoordMsg::VisCheckpointDone {
                        query,
                        shard: ctx.id,
                        ok,
                    })
                    .await;
            }
            ShardMsg::DropVisCheckpoint { query } => vis.remove(query),
            ShardMsg::QueryBegun {
                query,
                snapshot,
                secret,
                ack,
            } => {
                queries.borrow_mut().begun(query, snapshot, secret);
                let _ = ack.send(());
            }
            ShardMsg::QueryEnded { query } => queries.borrow_mut().ended(query),
            ShardMsg::Rewritten { table, job, result } => {
                on_rewritten(&ctx, &mut shard, table, job, result).await
            }
            ShardMsg::Checkpoint { id, ts } => {
                let ok = !stopped && on_checkpoint(&ctx, &mut shard, id, ts).await;
                let _ = ctx
                    .coord
                    .send_async(CoordMsg::CheckpointDone {
                        id,
                        shard: ctx.id,
                        ok,
                    })
                    .await;
            }
            ShardMsg::Flushed {
                table,
                block,
                result,
            } => match result {
                Ok(()) => shard.flush_done(table, block),
                Err(e) => {
                    tracing::warn!(
                        "shard {}: flushing {block:?} failed, will retry: {e}",
                        ctx.id
                    );
                    shard.flush_failed(table, block);
                }
            },
            ShardMsg::Combined { table, job, result } => match result {
                Ok(combined) => {
                    // The coordinator lists the file in later scan plans; until it has it,
                    // the scan service hands the file out with the write buffer.
                    let _ = ctx
                        .coord
                        .send_async(CoordMsg::FileAdded {
                            table,
                            file: PlanFile {
                                file: job.file,
                                path: job.target.clone(),
                                bytes: combined.bytes,
                                shard: ctx.id,
                                row_groups: combined.groups.clone(),
                                min_snapshot: Timestamp::GENESIS,
                                superseded_from: None,
                            },
                        })
                        .await;
                    shard.combine_done(table, job, combined.groups)
                }
                Err(e) => {
                    tracing::warn!(
                        "shard {}: combining file {} failed, will retry: {e}",
                        ctx.id,
                        job.file
                    );
                    shard.combine_failed(table, job.file);
                }
            },
            ShardMsg::Stop => break,
        }
        glommio::yield_if_needed().await;
    }
}

/// Applies one batch; false if a transaction failed (the shard then stops applying).
fn on_apply(ctx: &ShardContext, shard: &mut Shard, bytes: &[u8], scratch: &mut Vec<u8>) -> bool {
    let batch = match OpBatch::access(bytes) {
        Ok(b) => b,
        Err(e) => {
            ctx.status.fail(format!("shard {}: {e}", ctx.id));
            return false;
        }
    };
    for txn in batch.txns.iter() {
        let ts = match Timestamp::new(txn.ts.to_native()) {
            Ok(ts) => ts,
            Err(e) => {
                ctx.status.fail(format!("shard {}: {e}", ctx.id));
                return false;
            }
        };
        // Routing is the sink's alone; a key that is not this shard's means a routing bug, and
        // applying it would split the key across shards.
        for op in txn.ops.iter() {
            let Some(schema) = ctx.catalog.get(op.table()) else {
                return fail_txn(ctx, shard, ts, format!("unknown table id {}", op.table()));
            };
            let rows: [Option<&retina_protocol::ops::ArchivedWireRow>; 2] = match op.op() {
                RowOp::Insert(r) | RowOp::Delete(r) | RowOp::Upsert(r) => [Some(r), None],
                RowOp::Update { before, after } => [Some(before), Some(after)],
                RowOp::Truncate => [None, None],
            };
            for r in rows.into_iter().flatten() {
                if schema.check_key(r).is_ok() && shard_of(schema, r, ctx.shards, scratch) != ctx.id
                {
                    return fail_txn(
                        ctx,
                        shard,
                        ts,
                        format!(
                            "a key of table `{}` routed to the wrong shard",
                            schema.name()
                        ),
                    );
                }
            }
        }
        match shard.apply(ts, &txn.ops[..]) {
            Ok(stats) => {
                ctx.status
                    .rows_applied
                    .fetch_add(stats.ops, Ordering::Relaxed);
            }
            Err(e) => {
                let error = match txn.source.as_str() {
                    "" => e.to_string(),
                    source => format!("{source}: {e}"),
                };
                return fail_txn(ctx, shard, ts, error);
            }
        }
    }
    let through = match Timestamp::new(batch.applied_through.to_native()) {
        Ok(t) => t,
        Err(e) => {
            ctx.status.fail(format!("shard {}: {e}", ctx.id));
            return false;
        }
    };
    if let Err(e) = shard.advance(through) {
        ctx.status.fail(format!("shard {}: {e}", ctx.id));
        return false;
    }
    let _ = ctx.coord.send(CoordMsg::Applied {
        shard: ctx.id,
        ts: through,
    });
    true
}

/// The transaction at `ts` failed: everything before it was applied, so report that (HWM may
/// reach `ts`, never pass it), then the failure.
fn fail_txn(ctx: &ShardContext, shard: &mut Shard, ts: Timestamp, error: String) -> bool {
    let before = ts.prev_or_genesis();
    if shard.advance(before.max(shard.applied_through())).is_ok() {
        let _ = ctx.coord.send(CoordMsg::Applied {
            shard: ctx.id,
            ts: before,
        });
    }
    let _ = ctx.coord.send(CoordMsg::ShardFailed {
        shard: ctx.id,
        ts,
        error,
    });
    false
}

fn on_tick(ctx: &ShardContext, shard: &mut Shard, vis: &VisCheckpoints) {
    for (table, job) in shard.take_flush_jobs() {
        let schema = shard.schema(table).expect("a shard's own table").clone();
        let req = IoRequest::Flush {
            schema,
            table,
            job,
            reply: ctx.own.clone(),
        };
        if let Err(flume::TrySendError::Full(IoRequest::Flush { table, job, .. })) =
            ctx.io.try_send(req)
        {
            shard.flush_failed(table, job.block);
        }
    }
    for (table, job) in shard.take_combine_jobs() {
        let schema = shard.schema(table).expect("a shard's own table").clone();
        let req = IoRequest::Combine {
            schema,
            table,
            job,
            reply: ctx.own.clone(),
        };
        if let Err(flume::TrySendError::Full(IoRequest::Combine { table, job, .. })) =
            ctx.io.try_send(req)
        {
            shard.combine_failed(table, job.file);
        }
    }
    // Objects stay while any query may read them, a long one reading from its visibility
    // checkpoint included.
    let lwm =
        Timestamp::new(ctx.status.retain_lwm.load(Ordering::Acquire)).unwrap_or(Timestamp::GENESIS);
    // With checkpoints, an object leaves only once a checkpoint that does not read it is
    // complete: a restart may load the one before.
    let checkpointed = if ctx.checkpoints {
        ctx.status.checkpoint_id.load(Ordering::Acquire)
    } else {
        u64::MAX
    };
    let paths = shard.take_deletable(lwm, checkpointed);
    if !paths.is_empty()
        && let Err(flume::TrySendError::Full(IoRequest::Delete { paths })) =
            ctx.io.try_send(IoRequest::Delete { paths })
    {
        shard.defer_deletes(paths);
    }
    let m = shard.memory();
    let mem = &ctx.status.shard_memory[usize::from(ctx.id)];
    mem.index_bytes
        .store(m.index_bytes as u64, Ordering::Relaxed);
    mem.write_buffer_bytes
        .store(m.write_buffer_bytes as u64, Ordering::Relaxed);
    mem.visibility_bytes.store(
        (m.visibility_bytes + vis.memory_bytes()) as u64,
        Ordering::Relaxed,
    );
}

/// Writes this shard's image of checkpoint `id` durably; false if it could not. The barrier
/// comes right after the batch through `ts`, so the shard is exactly at `ts`. A failed write
/// poisons the node: it stops rather than carry on with a checkpoint it cannot trust.
async fn on_checkpoint(ctx: &ShardContext, shard: &mut Shard, id: u64, ts: Timestamp) -> bool {
    if shard.applied_through() != ts {
        tracing::warn!(
            "shard {}: checkpoint {id} at {ts} skipped: applied through {}",
            ctx.id,
            shard.applied_through()
        );
        return false;
    }
    let path = checkpoint_dir(&ctx.data_dir, id).join(format!("shard-{}.ckpt", ctx.id));
    let bytes = match shard.checkpoint(id).and_then(|image| image.encode()) {
        Ok(b) => b,
        Err(e) => {
            ctx.status
                .fail(format!("shard {}: checkpoint {id}: {e}", ctx.id));
            return false;
        }
    };
    match crate::durable::write_file(&path, &bytes).await {
        Ok(()) => true,
        Err(e) => {
            ctx.status.fail(format!(
                "shard {}: writing {}: {e}; the node stops rather than trust a partial checkpoint",
                ctx.id,
                path.display()
            ));
            false
        }
    }
}

/// Memory GC at `min(LWM, HWM - 1)`, and no further than this shard has applied. Both
/// watermarks only grow and LWM <= HWM - 1, so a query that begins after they were read reads
/// at or above the fold point. One table per message: the next table's step goes to the back of
/// the shard's queue, so replay and scans go on between tables. After the last table, storage
/// GC picks the files to rewrite.
fn on_gc(ctx: &ShardContext, shard: &mut Shard, step: Option<(TableId, Timestamp)>) {
    let (mut table, safe) = step.unwrap_or_else(|| {
        let lwm =
            Timestamp::new(ctx.status.lwm.load(Ordering::Acquire)).unwrap_or(Timestamp::GENESIS);
        let safe = lwm
            .min(ctx.status.hwm().snapshot())
            .min(shard.applied_through());
        (0, safe)
    });
    let tables = shard.table_count() as TableId;
    while table < tables {
        let start = Instant::now();
        let dropped = shard.gc_table(table, safe);
        tracing::debug!(
            "shard {}: memory GC of table {table} at {safe} dropped {dropped} index versions in {:?}",
            ctx.id,
            start.elapsed()
        );
        table += 1;
        if table < tables {
            match ctx.own.try_send(ShardMsg::GcStep { table, safe }) {
                Ok(()) => return,
                // A full queue: the rest now.
                Err(_) => continue,
            }
        }
    }
    ctx.status.gc_runs.fetch_add(1, Ordering::Relaxed);
    if ctx.dead_fraction >= 1.0 {
        return;
    }
    let jobs = match shard.take_rewrite_jobs(safe, ctx.dead_fraction) {
        Ok(jobs) => jobs,
        Err(e) => {
            tracing::warn!("shard {}: storage GC at {safe}: {e}", ctx.id);
            return;
        }
    };
    for (table, job) in jobs {
        let schema = shard.schema(table).expect("a shard's own table").clone();
        let req = IoRequest::Rewrite {
            schema,
            table,
            job,
            reply: ctx.own.clone(),
        };
        // Not sent (a full queue, or the I/O thread is gone): the file stays as it was.
        if let Err(e) = ctx.io.try_send(req)
            && let IoRequest::Rewrite { table, job, .. } = e.into_inner()
        {
            shard.rewrite_failed(table, job.file);
        }
    }
}

/// A storage-GC rewrite finished: switch to the new file and tell the coordinator, which
/// lists it in later plans (the shard's scan service already serves it).
async fn on_rewritten(
    ctx: &ShardContext,
    shard: &mut Shard,
    table: TableId,
    job: RewriteJob,
    result: Result<file::CombinedFile, String>,
) {
    let written = match result {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                "shard {}: rewriting file {} failed, a later GC may retry: {e}",
                ctx.id,
                job.file
            );
            shard.rewrite_failed(table, job.file);
            return;
        }
    };
    let replaced = match shard.rewrite_done(table, &job, written.groups.clone()) {
        Ok(r) => r,
        Err(e) => {
            ctx.status.fail(format!(
                "shard {}: switching to rewritten file {}: {e}",
                ctx.id, job.target_file
            ));
            return;
        }
    };
    ctx.status.files_rewritten.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        "shard {}: storage GC rewrote file {} into {:?} ({} rows kept of {})",
        ctx.id,
        job.file,
        replaced.by,
        job.kept_rows(),
        job.rows
    );
    let new = replaced.by.map(|file| PlanFile {
        file,
        path: job.target.clone(),
        bytes: written.bytes,
        shard: ctx.id,
        row_groups: written.groups,
        min_snapshot: replaced.from,
        superseded_from: None,
    });
    let _ = ctx
        .coord
        .send_async(CoordMsg::FileReplaced {
            table,
            old: replaced.file,
            new,
            from: replaced.from,
        })
        .await;
}

fn io_main(
    rx: flume::Receiver<IoRequest>,
    store: Arc<dyn ObjectStore>,
    config: retina_storage::StorageConfig,
    lake: Arc<std::path::Path>,
    status: Arc<NodeStatus>,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a tokio runtime for object-store I/O");
    rt.block_on(async move {
        while let Ok(req) = rx.recv_async().await {
            let store = store.clone();
            let config = config.clone();
            let lake = lake.clone();
            let status = status.clone();
            let kind = req.kind() as usize;
            status.io_in_flight[kind].fetch_add(1, Ordering::Relaxed);
            // Encoding Parquet is CPU work: keep it off the thread that polls I/O.
            tokio::task::spawn_blocking(move || {
                futures::executor::block_on(handle_io(req, store.as_ref(), &config, &lake));
                status.io_in_flight[kind].fetch_sub(1, Ordering::Relaxed);
            });
        }
    });
}

/// Makes the local lake object at `path` durable: its data, and its entry in its folder (and
/// the folders above it up to the lake, which the store may have just created). A checkpoint
/// may refer to it once the shard hears it was written, and the checkpoint is fsynced.
fn sync_object(lake: &std::path::Path, path: &object_store::path::Path) -> Result<(), String> {
    let file = lake.join(path.as_ref());
    let err = |e: std::io::Error| format!("syncing {}: {e}", file.display());
    std::fs::File::open(&file)
        .and_then(|f| f.sync_all())
        .map_err(err)?;
    let mut dir = file.parent();
    while let Some(d) = dir {
        crate::durable::sync_dir(d).map_err(err)?;
        if d == lake {
            break;
        }
        dir = d.parent();
    }
    Ok(())
}

async fn handle_io(
    req: IoRequest,
    store: &dyn ObjectStore,
    config: &retina_storage::StorageConfig,
    lake: &std::path::Path,
) {
    match req {
        IoRequest::Flush {
            schema,
            table,
            job,
            reply,
        } => {
            let result = file::flush_block(store, &schema, config, &job)
                .await
                .map_err(|e| e.to_string())
                .and_then(|()| sync_object(lake, &job.path));
            let _ = reply
                .send_async(ShardMsg::Flushed {
                    table,
                    block: job.block,
                    result,
                })
                .await;
        }
        IoRequest::Combine {
            schema,
            table,
            job,
            reply,
        } => {
            let result = file::combine_blocks(store, &schema, config, &job)
                .await
                .map_err(|e| e.to_string())
                .and_then(|f| sync_object(lake, &job.target).map(|()| f));
            let _ = reply
                .send_async(ShardMsg::Combined { table, job, result })
                .await;
        }
        IoRequest::Rewrite {
            schema,
            table,
            job,
            reply,
        } => {
            // A rewrite that keeps no row writes no object: nothing to sync.
            let result = file::rewrite_file(store, &schema, config, &job)
                .await
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    if f.groups.is_empty() {
                        Ok(f)
                    } else {
                        sync_object(lake, &job.target).map(|()| f)
                    }
                });
            let _ = reply
                .send_async(ShardMsg::Rewritten { table, job, result })
                .await;
        }
        IoRequest::Delete { paths } => {
            for p in paths {
                if let Err(e) = store.delete(&p).await {
                    tracing::warn!("deleting retired object {p}: {e}");
                }
            }
        }
    }
}
