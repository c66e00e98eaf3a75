//! What the node publishes: counters and gauges the actors write and the metrics endpoint
//! reads, HWM for in-process waiters, and the first error that stopped replay. No actor reads
//! it to decide anything: watermarks reach the shards by message.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use retina_storage::{Hwm, Timestamp};

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
    /// What each shard reported it applied through (wherever it runs), as the coordinator heard.
    pub shard_applied: Vec<AtomicU64>,
    pub source_done: AtomicBool,
    /// Records the source holds that the sink has not read yet (Kafka: over every partition,
    /// its high watermark less the next offset to read; 0 for a file).
    pub source_lag: AtomicU64,
    /// A Postgres source: bytes of WAL the server has written past the change the sink read
    /// last (the end of WAL an XLogData message carries, less where that message starts).
    pub source_lag_wal_bytes: AtomicU64,
    /// The timestamp of the transaction a shard refused (0: none); replay stopped before it.
    pub failed_ts: AtomicU64,
    /// Lake writes the I/O thread has in hand, by kind (see [`IoKind`]).
    pub io_in_flight: [AtomicU64; IoKind::ALL.len()],
    /// Whether a checkpoint is on its way through the shards (begun, not yet recorded).
    pub checkpoint_in_progress: AtomicBool,
    /// The id of the newest checkpoint that failed (0: none), e.g. an image the lake refused:
    /// a sink puts its barrier again.
    pub checkpoint_failed_id: AtomicU64,
    /// Checkpoints that failed since the start.
    pub checkpoints_failed: AtomicU64,
    /// Replay stopped for a reason of this node's own (its state file could not be written,
    /// or another node leads), not of the source's: in a cluster, another member should take
    /// over.
    pub failed_here: AtomicBool,
    /// A cluster's leader lost the connection to a member running one of its shards (see
    /// [`crate::remote`]): it starts again from the newest checkpoint.
    pub host_lost: AtomicBool,
    /// Bytes of batches sent to shards other members run (frames' bodies), sent again to a
    /// shard started again included.
    pub remote_batch_bytes: AtomicU64,
    /// Times a cluster's leader started a shard again on a live member after the one running
    /// it was lost, while the other shards went on ([`crate::remote::proxy`]).
    pub shard_restarts: AtomicU64,
    /// Every actor queue's depth, set once when the node starts.
    pub queues: OnceLock<Vec<QueueProbe>>,
    /// A cluster's leader: the epoch of its leadership (0: a node on its own).
    pub cluster_epoch: AtomicU64,
    /// A cluster's leader: its lease, as it last heard from etcd.
    pub lease: OnceLock<std::sync::Arc<crate::cluster::LeaseClock>>,
    /// Set with `error`, so that the sink's check after every group takes no lock.
    failed: AtomicBool,
    error: Mutex<Option<String>>,
}

impl NodeStatus {
    pub(crate) fn new(shards: u16) -> Self {
        NodeStatus {
            hwm: AtomicU64::new(Hwm::INITIAL.get().get()),
            lwm: AtomicU64::new(Timestamp::GENESIS.get()),
            retain_lwm: AtomicU64::new(Timestamp::GENESIS.get()),
            shard_memory: (0..shards).map(|_| ShardMemory::default()).collect(),
            shard_applied: (0..shards).map(|_| AtomicU64::new(0)).collect(),
            ..Default::default()
        }
    }

    /// The first error that stopped replay, if any.
    pub fn error(&self) -> Option<String> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        self.error.lock().expect("status lock").clone()
    }

    /// Records the error that stops replay; the first one wins.
    pub fn fail(&self, error: String) {
        let mut e = self.error.lock().expect("status lock");
        if e.is_none() {
            tracing::error!("{error}");
            *e = Some(error);
            self.failed.store(true, Ordering::Release);
        }
    }

    pub fn hwm(&self) -> Hwm {
        let ts = Timestamp::new(self.hwm.load(Ordering::Acquire)).expect("HWM is a timestamp");
        Hwm::after(ts.prev_or_genesis()).expect("HWM - 1 is a timestamp")
    }
}

/// One actor's queue, as metrics see it: how many messages wait in it, and how many may.
pub struct QueueProbe {
    /// `coordinator`, `shard-<n>-data`, `shard-<n>-control` or `io`.
    pub queue: String,
    pub capacity: usize,
    depth: Box<dyn Fn() -> usize + Send + Sync>,
}

impl QueueProbe {
    /// A probe of the queue `tx` sends to. It holds no sender, so it never keeps the queue
    /// open after its actor's senders are gone.
    pub fn of<T: Send + 'static>(queue: String, tx: &flume::Sender<T>) -> Self {
        let weak = tx.downgrade();
        QueueProbe {
            queue,
            capacity: tx.capacity().unwrap_or(usize::MAX),
            depth: Box::new(move || weak.upgrade().map_or(0, |tx| tx.len())),
        }
    }

    /// Messages waiting now.
    pub fn depth(&self) -> usize {
        (self.depth)()
    }
}
