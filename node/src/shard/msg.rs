//! What a shard receives, and from whom. One message, one handler ([`super::actor`]).

use retina_storage::buffer::CombineJob;
use retina_storage::file::CombinedFile;
use retina_storage::{
    BlockId, FileId, Hwm, Result as StorageResult, RewriteJob, RowGroupBitmap, TableId,
    TableSnapshot, Timestamp,
};
use rkyv::util::AlignedVec;

use crate::coordinator::QueryId;

/// Messages to a shard's executor. Delivered in the order sent by each sender. The
/// coordinator's come on a queue of their own, which the shard serves first.
pub enum ShardMsg {
    /// From the sink: a batch of transactions (an archived [`OpBatch`]), in timestamp order
    /// after every earlier batch. The shard applies them and reports "applied through".
    Apply(AlignedVec),
    /// From a reader: what `table` looks like at `ts`, without the regular files in `except`
    /// (the reader has them from its scan plan).
    Snapshot {
        table: TableId,
        ts: Timestamp,
        except: Vec<FileId>,
        reply: flume::Sender<StorageResult<TableSnapshot>>,
    },
    /// From the scan service: bitmaps of a regular file's row groups at `ts`.
    Bitmaps {
        file: FileId,
        ts: Timestamp,
        row_groups: Vec<u32>,
        reply: flume::Sender<StorageResult<Vec<RowGroupBitmap>>>,
    },
    /// From the shard's own timer: time to hand full blocks and files to the I/O thread.
    Tick,
    /// From the shard's own GC timer: time for memory GC.
    GcTick,
    /// From the coordinator, on its timer and when a checkpoint completes: the watermarks as
    /// they are now. Memory GC, and the deletion of objects no query or checkpoint reads,
    /// go no further than the last ones received (they only grow, so older ones are safe).
    Watermarks(Watermarks),
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
    /// `query` (presented with `secret`) at `snapshot`. The begin does not wait for the shard
    /// to take it: a client's call that comes first waits for it in the scan service.
    QueryBegun {
        query: QueryId,
        snapshot: Timestamp,
        secret: u64,
    },
    /// From the coordinator: `query` ended (or its lease ran out, or its connection closed);
    /// the scan service refuses it from now on. May overtake its `QueryBegun`.
    QueryEnded { query: QueryId },
    /// From the I/O thread: a block flush finished (the object's size).
    Flushed {
        table: TableId,
        block: BlockId,
        result: Result<u64, String>,
    },
    /// From the I/O thread: a file combination finished.
    Combined {
        table: TableId,
        job: CombineJob,
        result: Result<CombinedFile, String>,
    },
    /// From the I/O thread: a storage-GC rewrite finished.
    Rewritten {
        table: TableId,
        job: RewriteJob,
        result: Result<CombinedFile, String>,
    },
    /// From the node: stop after the messages before this one.
    Stop,
}

/// The coordinator's watermarks, as a shard last heard them.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Watermarks {
    /// Every transaction below it is applied on every shard.
    pub hwm: Hwm,
    /// The oldest snapshot a running query reads from memory: memory GC folds no further.
    pub lwm: Timestamp,
    /// The oldest snapshot any running query reads, checkpointed long queries included:
    /// objects stay until it passes them.
    pub retain_lwm: Timestamp,
    /// The newest complete checkpoint (0: none): an object leaves only once a complete
    /// checkpoint does not read it.
    pub checkpoint_id: u64,
}

impl Watermarks {
    /// A node that starts from the checkpoint `checkpoint_id` taken at `ts` (0 and genesis:
    /// none).
    pub fn resumed(checkpoint_id: u64, ts: Timestamp) -> Self {
        Watermarks {
            hwm: Hwm::after(ts).expect("a checkpoint timestamp is below the maximum"),
            lwm: ts,
            retain_lwm: ts,
            checkpoint_id,
        }
    }
}
