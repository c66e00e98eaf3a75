//! What the coordinator receives, and from whom. One message, one handler
//! ([`super::actor`]).

use retina_storage::{FileId, TableId, Timestamp};

use super::error::BeginRefused;
use super::persist::{CheckpointRecord, SourceMark};
use super::plan::PlanFile;
use super::query::{Owner, QueryId, QueryTicket};

/// Messages to the coordinator.
pub enum CoordMsg {
    /// From a shard: it applied every transaction through `ts` (group commit).
    Applied { shard: u16, ts: Timestamp },
    /// From a shard: it cannot go on (an unreadable batch, a checkpoint it could not write, a
    /// rewritten file it could not switch to); the node fails with `error`.
    Failed { error: String },
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
        old: FileId,
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
    /// From a remote shard's proxy: the member that ran `shard` was lost, and the shard starts
    /// again from the newest complete checkpoint on a new run of it, which replays what came
    /// after. Comes before any report of the new run.
    ShardRestarted { shard: u16 },
    /// From the coordinator's timer: expire leases, persist HWM.
    Tick,
    /// From the node: persist and stop.
    Stop { reply: flume::Sender<()> },
}
