//! The node's in-process API: what the sink calls to replay (allocate timestamps, route and
//! send batches, checkpoint) and what local readers call to query. It talks to the actors only
//! by message.

use std::ops::RangeInclusive;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use retina_protocol::ops::{
    ArchivedOpBatch, ArchivedWireTableOp, ArchivedWireTxn, ArchivedWireValue,
};
use retina_protocol::{OpBatchRef, WireOpRef, WireRowRef, WireTableOpRef, WireTxnRef};
use retina_storage::route::shard_of;
use retina_storage::{RowOp, RowRef, TableId, TableOp, Timestamp, Value};
use rkyv::util::AlignedVec;

use crate::catalog::Catalog;
use crate::coordinator::{CoordMsg, LOCAL, QueryId, Sequencer, SourceMark};
use crate::debezium::DecimalHandling;
use crate::error::NodeError;
use crate::shard::ShardMsg;
use crate::status::NodeStatus;

/// An op batch's archived bytes besides its transactions (its root and alignment).
const BATCH_BYTES_BASE: usize = std::mem::size_of::<ArchivedOpBatch>() + 64;
/// A transaction's archived bytes in a batch besides its operations.
const TXN_BYTES: usize = std::mem::size_of::<ArchivedWireTxn>();
/// An operation's archived bytes besides its rows' values.
const OP_BYTES: usize = std::mem::size_of::<ArchivedWireTableOp>() + 16;

/// A row's archived bytes: its values, and its strings out of line (an upper bound).
fn archived_row_bytes(row: &[Value]) -> usize {
    let strings: usize = row
        .iter()
        .map(|v| match v {
            Value::Utf8(s) => s.len(),
            _ => 0,
        })
        .sum();
    // Up to one alignment's padding before the values.
    row.len() * std::mem::size_of::<ArchivedWireValue>() + strings + 16
}

/// A cheap handle to a running node: submit transactions, read tables, watch status.
#[derive(Clone)]
pub struct NodeHandle {
    /// Held from timestamp allocation to the last send of a group: groups reach every shard
    /// in timestamp order even when several threads submit.
    pub(crate) submit_order: Arc<Mutex<()>>,
    pub(crate) shards: Vec<flume::Sender<ShardMsg>>,
    pub(crate) coord: flume::Sender<CoordMsg>,
    /// The coordinator's timestamps, drawn from at group begin.
    pub(crate) sequencer: Arc<Sequencer>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) status: Arc<NodeStatus>,
    pub(crate) store: Arc<dyn ObjectStore>,
    /// The I/O thread's runtime, on which reads of the store run (an S3 client needs one).
    pub(crate) io_rt: tokio::runtime::Handle,
    /// Where the source resumes: the position of the checkpoint this run started from.
    pub(crate) resume: Option<SourceMark>,
    /// The sink's state recorded with that checkpoint (empty: none).
    pub(crate) resume_state: Arc<[u8]>,
    /// How the sink reads decimals of a stream without the envelope schema.
    pub(crate) decimal_handling: DecimalHandling,
    /// The node's data directory (absolute).
    pub(crate) data_dir: Arc<std::path::Path>,
    /// A cluster leader's lease: timestamps are handed out only while it stands (`None`: a
    /// node on its own).
    pub(crate) lease: Option<Arc<crate::cluster::LeaseClock>>,
    /// Buffers of batches the local shards applied, to encode the next batches into.
    pub(crate) batch_buffers: BatchBuffers,
}

/// Op batch buffers the local shards are done with, for the sink to encode the next batches
/// into. A buffer keeps its memory: the sink writes into pages it touched before instead of
/// having the kernel fault in (and zero) fresh ones for every batch, which took about a third
/// of the sink thread's time in `retina bench replay`. At most [`Self::new`]'s count are kept,
/// none larger than [`KEPT_BUFFER_BYTES`].
#[derive(Clone)]
pub(crate) struct BatchBuffers {
    tx: flume::Sender<AlignedVec>,
    rx: flume::Receiver<AlignedVec>,
}

/// A batch buffer larger than this is freed rather than kept (a large transaction's batch).
const KEPT_BUFFER_BYTES: usize = 16 << 20;
/// Any kept buffer up to this size may take any batch.
const SMALL_BUFFER_BYTES: usize = 64 << 10;

impl BatchBuffers {
    /// A pool that keeps at most `count` buffers.
    pub(crate) fn new(count: usize) -> Self {
        let (tx, rx) = flume::bounded(count.max(1));
        BatchBuffers { tx, rx }
    }

    /// An empty buffer with room for `bytes`: a kept one where there is one not much larger
    /// (a small batch, such as an idle shard's "applied through", never holds a large one).
    fn take(&self, bytes: usize) -> AlignedVec {
        match self.rx.try_recv() {
            Ok(mut b) if b.capacity() <= bytes.saturating_mul(4).max(SMALL_BUFFER_BYTES) => {
                b.clear();
                b.reserve(bytes);
                b
            }
            Ok(large) => {
                self.give_back(large);
                AlignedVec::with_capacity(bytes)
            }
            Err(_) => AlignedVec::with_capacity(bytes),
        }
    }

    /// Keeps `buffer` for a later batch (or frees it: the pool is full, or it is large).
    pub(crate) fn give_back(&self, buffer: AlignedVec) {
        if buffer.capacity() <= KEPT_BUFFER_BYTES {
            let _ = self.tx.try_send(buffer);
        }
    }
}

impl NodeHandle {
    pub fn status(&self) -> &Arc<NodeStatus> {
        &self.status
    }

    /// The node's data directory (absolute).
    pub fn data_dir(&self) -> &std::path::Path {
        &self.data_dir
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
    /// while a shard's queue is full. Returns the timestamps the transactions got. A shard
    /// that refuses one names only its timestamp ([`NodeStatus::failed_ts`]): where it came
    /// from in the source is the caller's to say.
    pub fn submit<R: AsRef<[Value]> + RowRef>(
        &self,
        txns: &[Vec<TableOp<R>>],
    ) -> Result<RangeInclusive<u64>, NodeError> {
        let _order = self.submit_order.lock().expect("submit lock");
        let range = self.allocate(txns.len() as u64)?;
        let batches = self.encode_group(txns, range.clone())?;
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

    /// `n` consecutive timestamps from the coordinator's [`Sequencer`] (group begin).
    ///
    /// In a cluster, waits while the leader's lease is not renewed (etcd unreachable): a
    /// leader that cannot tell whether it still leads makes nothing new visible. A lease lost
    /// for good is an error, and the node stops replaying.
    pub fn allocate(&self, n: u64) -> Result<RangeInclusive<u64>, NodeError> {
        if let Some(lease) = &self.lease {
            lease.wait_valid().map_err(|lost| {
                let e = lost.to_string();
                self.status.fail(e.clone());
                NodeError::Cluster(lost.into())
            })?;
        }
        if self.coord.is_disconnected() {
            return Err(NodeError::Stopped);
        }
        Ok(self.sequencer.allocate(n)?)
    }

    /// Routes a group of transactions that got the timestamps `range` and encodes every
    /// shard's slice as an op batch (one per shard, in shard order).
    pub fn encode_group<'t, R: AsRef<[Value]> + RowRef>(
        &self,
        txns: &'t [Vec<TableOp<R>>],
        range: RangeInclusive<u64>,
    ) -> Result<Vec<AlignedVec>, NodeError> {
        assert_eq!(
            txns.len() as u64,
            range.end() - range.start() + 1,
            "a timestamp per transaction"
        );
        let shards = self.shard_count();
        let mut slices: Vec<Vec<WireTxnRef<'t>>> = (0..shards).map(|_| Vec::new()).collect();
        // Each batch's archived size, estimated as it is routed: its buffer is allocated once.
        let mut sizes = vec![BATCH_BYTES_BASE; shards.into()];
        let mut scratch = Vec::new();
        for (txn, ts) in txns.iter().zip(range.clone()) {
            let mut per_shard: Vec<Vec<WireTableOpRef<'t>>> =
                (0..shards).map(|_| Vec::new()).collect();
            let mut put = |s: u16, op: WireTableOpRef<'t>, rows: &[&[Value]]| {
                let s = usize::from(s);
                if per_shard[s].is_empty() {
                    sizes[s] += TXN_BYTES;
                }
                sizes[s] += OP_BYTES + rows.iter().map(|r| archived_row_bytes(r)).sum::<usize>();
                per_shard[s].push(op);
            };
            for op in txn {
                let schema = self.catalog.get(op.table).expect("ops name catalog tables");
                match &op.op {
                    RowOp::Insert(r) | RowOp::Delete(r) | RowOp::Upsert(r) => {
                        let s = shard_of(schema, r, shards, &mut scratch);
                        put(s, WireTableOpRef::from(op), &[r.as_ref()]);
                    }
                    // The table's rows are spread over every shard by key hash.
                    RowOp::Truncate => {
                        for s in 0..shards {
                            put(s, WireTableOpRef::from(op), &[]);
                        }
                    }
                    RowOp::Update { before, after } => {
                        let from = shard_of(schema, before, shards, &mut scratch);
                        let to = shard_of(schema, after, shards, &mut scratch);
                        let (before, after) = (before.as_ref(), after.as_ref());
                        if from == to {
                            put(from, WireTableOpRef::from(op), &[before, after]);
                        } else {
                            // A key-changing update across shards: a delete on one, an insert
                            // on the other, in the same mirror transaction.
                            let row = |values| WireRowRef { values };
                            let delete = WireOpRef::Delete(row(before));
                            let insert = WireOpRef::Insert(row(after));
                            let table = op.table;
                            put(from, WireTableOpRef { table, op: delete }, &[before]);
                            put(to, WireTableOpRef { table, op: insert }, &[after]);
                        }
                    }
                }
            }
            for (s, ops) in per_shard.into_iter().enumerate() {
                if !ops.is_empty() {
                    slices[s].push(WireTxnRef { ts, ops });
                }
            }
        }
        slices
            .into_iter()
            .zip(sizes)
            .map(|(txns, size)| {
                OpBatchRef {
                    txns,
                    applied_through: *range.end(),
                }
                .encode_into(self.batch_buffers.take(size))
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
            let store = self.store.clone();
            let projection = projection.clone();
            let read = self
                .io_rt
                .spawn(async move { snap.read(store.as_ref(), Some(&projection)).await });
            out.extend(futures::executor::block_on(read).map_err(|_| NodeError::Stopped)??);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_buffers_are_reused_empty_and_only_small_ones_are_kept() {
        let pool = BatchBuffers::new(2);
        let mut first = pool.take(100);
        assert!(first.capacity() >= 100);
        first.extend_from_slice(&[7; 100]);
        let kept = first.as_ptr();
        pool.give_back(first);
        let again = pool.take(50);
        assert_eq!(again.as_ptr(), kept, "the same memory");
        assert!(again.is_empty(), "cleared");
        // Grown where a batch needs more room.
        pool.give_back(again);
        let grown = pool.take(1 << 20);
        assert!(grown.capacity() >= 1 << 20);
        // A small batch does not take a large buffer: it stays kept for a large one.
        let large = grown.as_ptr();
        pool.give_back(grown);
        assert_ne!(pool.take(100).as_ptr(), large);
        assert_eq!(pool.take(1 << 19).as_ptr(), large);
        // A large buffer is freed, and at most two are kept.
        pool.give_back(AlignedVec::with_capacity(KEPT_BUFFER_BYTES + 1));
        assert!(pool.rx.is_empty());
        for _ in 0..3 {
            pool.give_back(AlignedVec::with_capacity(16));
        }
        assert_eq!(pool.rx.len(), 2);
    }
}
