//! A shard's Cap'n Proto scan service, beside the shard on its core: bitmaps of a regular
//! file's row groups and the write buffer, at a running query's snapshot. Each call is checked
//! against the running queries the coordinator told the shard of ([`RunningQueries`]),
//! presented with their secret, then a message to the shard, answered from its state.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::channel::oneshot;

use retina_protocol::retina_capnp::{bootstrap, scan_service};
use retina_storage::{RowGroupBitmap, StorageError, Timestamp};

use super::msg::ShardMsg;
use crate::catalog::Catalog;
use crate::coordinator::QueryId;
use crate::rpc::{
    Bootstrap, MAX_KNOWN_FILES, MAX_PART_BYTES, MAX_ROW_GROUPS_PER_CALL, Service, accept_loop,
    stopped,
};

/// Serves one shard's scan service on `listener`, beside the shard on its core: each call is
/// checked against the running queries, then a message to the shard, answered from its state.
pub async fn serve_scan(
    listener: glommio::net::TcpListener,
    shard: flume::Sender<ShardMsg>,
    catalog: Arc<Catalog>,
    queries: Rc<RefCell<RunningQueries>>,
    auth_token: Option<String>,
) {
    let scan: scan_service::Client = capnp_rpc::new_client(ScanService {
        shard,
        catalog,
        queries,
    });
    let bootstrap: bootstrap::Client = capnp_rpc::new_client(Bootstrap {
        service: Service::Scan(scan),
        auth_token,
    });
    let make = move || (bootstrap.clone(), None);
    accept_loop(listener, make, "scan service").await;
}

/// The queries a shard's scan service serves, as the coordinator told the shard: each with
/// its snapshot and secret. Lives on the shard's core; bounded by the coordinator's limits on
/// running queries (and [`MAX_WAITING_CALLS`], [`RECENT_ENDS`]).
///
/// The coordinator answers a begin as soon as it has sent every shard the query's
/// `QueryBegun`, without waiting for them to take it: a scan call that overtakes it (a remote
/// shard's message still on the wire, a shard between two batches) waits for it here
/// ([`admit_when_known`]), up to [`UNKNOWN_QUERY_WAIT`] for a query the shard has not heard of
/// at all, and for as long as it runs for one the shard holds back until it has applied
/// through the query's snapshot.
#[derive(Default)]
pub struct RunningQueries {
    running: HashMap<QueryId, (Timestamp, u64)>,
    /// Queries begun at a snapshot this shard has not applied through yet (a shard started
    /// again from a checkpoint while the others went on): served once it has
    /// ([`Self::applied_through`]).
    held: HashMap<QueryId, (Timestamp, u64)>,
    /// Ended queries whose `QueryBegun` has not come yet (an end may overtake it): it is then
    /// dropped. An entry leaves when that message comes.
    ended_early: HashSet<QueryId>,
    /// The last [`RECENT_ENDS`] queries that ended, oldest first: a call for one is refused at
    /// once instead of waiting for a `QueryBegun` that will not come.
    recent_ends: VecDeque<QueryId>,
    recently_ended: HashSet<QueryId>,
    /// Calls waiting for their query's `QueryBegun` (or its end).
    waiting: Vec<(QueryId, oneshot::Sender<()>)>,
}

/// How long a scan call for a query this shard has not heard of waits for its `QueryBegun`
/// before it is refused (leaseExpired): the coordinator sends it before it answers the begin,
/// so a real query's comes within moments.
pub const UNKNOWN_QUERY_WAIT: Duration = Duration::from_secs(1);
/// Scan calls that may wait for their query at once on a shard; more are refused at once.
pub const MAX_WAITING_CALLS: usize = 1024;
/// Ended queries a shard remembers, so that a late call for one is refused at once.
const RECENT_ENDS: usize = 4096;

/// What a shard knows of a query a scan call names.
enum Known {
    /// Running at this snapshot, and the call presented its secret.
    Running(Timestamp),
    /// Ended, or presented with a wrong secret.
    Refused,
    /// Begun, and held until this shard reaches its snapshot.
    Held,
    /// Not heard of (yet).
    Unknown,
}

impl RunningQueries {
    pub fn begun(&mut self, query: QueryId, snapshot: Timestamp, secret: u64) {
        self.held.remove(&query);
        if !self.ended_early.remove(&query) {
            self.running.insert(query, (snapshot, secret));
        }
        self.wake(query);
    }

    /// `query` (presented with `secret`) is begun, at a `snapshot` this shard has not reached:
    /// calls for it wait until [`Self::applied_through`] reaches it (or it ends).
    pub fn hold(&mut self, query: QueryId, snapshot: Timestamp, secret: u64) {
        self.held.insert(query, (snapshot, secret));
    }

    /// The shard has applied through `ts`: the queries held for it are served.
    pub fn applied_through(&mut self, ts: Timestamp) {
        if self.held.is_empty() {
            return;
        }
        let reached: Vec<_> = self
            .held
            .iter()
            .filter(|(_, (snapshot, _))| *snapshot <= ts)
            .map(|(q, (snapshot, secret))| (*q, *snapshot, *secret))
            .collect();
        for (query, snapshot, secret) in reached {
            self.begun(query, snapshot, secret);
        }
    }

    pub fn ended(&mut self, query: QueryId) {
        let held = self.held.remove(&query).is_some();
        if self.running.remove(&query).is_none() && !held {
            self.ended_early.insert(query);
        }
        if self.recently_ended.insert(query) {
            self.recent_ends.push_back(query);
            if self.recent_ends.len() > RECENT_ENDS
                && let Some(oldest) = self.recent_ends.pop_front()
            {
                self.recently_ended.remove(&oldest);
            }
        }
        self.wake(query);
    }

    fn known(&self, query: QueryId, secret: u64) -> Known {
        if let Some((ts, s)) = self.running.get(&query) {
            return if *s == secret {
                Known::Running(*ts)
            } else {
                Known::Refused
            };
        }
        match self.held.get(&query) {
            Some((_, s)) if *s == secret => Known::Held,
            Some(_) => Known::Refused,
            None if self.recently_ended.contains(&query) || self.ended_early.contains(&query) => {
                Known::Refused
            }
            None => Known::Unknown,
        }
    }

    /// A receiver that hears when `query` is begun or ends; `None` when too many calls wait.
    fn wait_for(&mut self, query: QueryId) -> Option<oneshot::Receiver<()>> {
        if self.waiting.len() >= MAX_WAITING_CALLS {
            // Calls that stopped waiting (refused at their deadline) leave their place here.
            self.waiting.retain(|(_, tx)| !tx.is_canceled());
            if self.waiting.len() >= MAX_WAITING_CALLS {
                return None;
            }
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.push((query, tx));
        Some(rx)
    }

    fn wake(&mut self, query: QueryId) {
        if self.waiting.iter().any(|(q, _)| *q == query) {
            let (wake, keep) = std::mem::take(&mut self.waiting)
                .into_iter()
                .partition(|(q, _)| *q == query);
            self.waiting = keep;
            for (_, tx) in wake {
                let _ = tx.send(());
            }
        }
    }
}

/// The snapshot of running query `query` presented with `secret`, once this shard knows it:
/// a call that overtook the query's `QueryBegun` waits for it (see [`RunningQueries`]).
/// `None`: the query ended, the secret is wrong, or the shard did not hear of it in time.
pub async fn admit_when_known(
    queries: &RefCell<RunningQueries>,
    query: QueryId,
    secret: u64,
    unknown_wait: Duration,
) -> Option<Timestamp> {
    // Set at the first look that finds nothing: most calls find their query at once.
    let mut deadline = None;
    loop {
        let bounded = match queries.borrow().known(query, secret) {
            Known::Running(ts) => return Some(ts),
            Known::Refused => return None,
            Known::Held => false,
            Known::Unknown => true,
        };
        let deadline = *deadline.get_or_insert_with(|| Instant::now() + unknown_wait);
        let left = deadline.saturating_duration_since(Instant::now());
        if bounded && left.is_zero() {
            return None;
        }
        let heard = queries.borrow_mut().wait_for(query)?;
        if bounded {
            let timer = std::pin::pin!(glommio::timer::sleep(left));
            // Either way, look again: at the deadline an unknown query is refused.
            let _ = futures::future::select(heard, timer).await;
        } else {
            let _ = heard.await;
        }
    }
}

struct ScanService {
    shard: flume::Sender<ShardMsg>,
    catalog: Arc<Catalog>,
    queries: Rc<RefCell<RunningQueries>>,
}

/// Why a scan call is refused before it reaches the shard.
enum Refused {
    Invalid(String),
    /// The query id: not running, or presented with a wrong secret.
    NotRunning(u64),
}

impl Refused {
    fn write(self, mut b: retina_protocol::retina_capnp::error::Builder<'_>) {
        match self {
            Refused::Invalid(text) => b.set_invalid_argument(text),
            Refused::NotRunning(id) => b.set_lease_expired(id),
        }
    }
}

impl ScanService {
    /// The snapshot a call may read: a timestamp, and the snapshot of the running query it
    /// names.
    async fn admit(&self, query: u64, secret: u64, snapshot: u64) -> Result<Timestamp, Refused> {
        let ts = Timestamp::new(snapshot)
            .map_err(|e| Refused::Invalid(format!("snapshot {snapshot}: {e}")))?;
        let theirs = admit_when_known(&self.queries, query, secret, UNKNOWN_QUERY_WAIT)
            .await
            .ok_or(Refused::NotRunning(query))?;
        if theirs != ts {
            return Err(Refused::Invalid(format!(
                "snapshot {snapshot} is not query {query}'s snapshot {theirs}"
            )));
        }
        Ok(ts)
    }
}

fn bitmap_bytes(bitmap: &[u64]) -> Vec<u8> {
    bitmap.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// Bits `start..start + len` of `bitmap` as a bitmap of their own (bits past the end of
/// `bitmap` are clear), a word at a time.
fn bits(bitmap: &[u64], start: u64, len: u64) -> Vec<u64> {
    let (first, shift) = ((start / 64) as usize, (start % 64) as u32);
    let word = |i: usize| bitmap.get(i).copied().unwrap_or(0);
    let mut out: Vec<u64> = (0..len.div_ceil(64) as usize)
        .map(|k| {
            let high = match shift {
                0 => 0,
                s => word(first + k + 1) << (64 - s),
            };
            word(first + k) >> shift | high
        })
        .collect();
    if let (Some(last), tail @ 1..) = (out.last_mut(), len % 64) {
        *last &= (1 << tail) - 1;
    }
    out
}

impl ScanService {
    /// [`Self::admit`] for a bitmaps call naming `row_groups` row groups in all, within the
    /// bound.
    async fn admit_bitmaps(
        &self,
        query: u64,
        secret: u64,
        snapshot: u64,
        row_groups: u64,
    ) -> Result<Timestamp, Refused> {
        let ts = self.admit(query, secret, snapshot).await?;
        if row_groups > u64::from(MAX_ROW_GROUPS_PER_CALL) {
            return Err(Refused::Invalid(format!(
                "{row_groups} row groups: at most {MAX_ROW_GROUPS_PER_CALL} per call"
            )));
        }
        Ok(ts)
    }

    /// The bitmaps of `row_groups` (duplicates answered once) of regular file `file` at `ts`,
    /// from the shard.
    async fn bitmaps_of(
        &self,
        file: u64,
        ts: Timestamp,
        row_groups: impl Iterator<Item = u32>,
    ) -> Result<Result<Vec<RowGroupBitmap>, StorageError>, capnp::Error> {
        let mut row_groups: Vec<u32> = row_groups.collect();
        row_groups.sort_unstable();
        row_groups.dedup();
        let (tx, rx) = flume::bounded(1);
        self.shard
            .send_async(ShardMsg::Bitmaps {
                file: retina_storage::FileId(file),
                ts,
                row_groups,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        rx.recv_async().await.map_err(|_| stopped())
    }
}

/// Row groups' bitmaps into the contract's list.
fn write_bitmaps(
    mut list: capnp::struct_list::Builder<
        '_,
        retina_protocol::retina_capnp::row_group_bitmap::Owned,
    >,
    groups: &[RowGroupBitmap],
) {
    for (i, g) in groups.iter().enumerate() {
        let mut b = list.reborrow().get(i as u32);
        b.set_row_group(g.row_group);
        b.set_rows(g.rows);
        b.set_deleted(&bitmap_bytes(&g.deleted));
    }
}

/// Why a file's bitmaps could not be answered, as the contract's error.
fn write_bitmap_error(
    mut error: retina_protocol::retina_capnp::error::Builder<'_>,
    e: &StorageError,
) {
    match e {
        StorageError::UnknownFile(id) => error.set_unknown_file(*id),
        e @ StorageError::OffsetOutOfRange { .. } => error.set_invalid_argument(e.to_string()),
        e => retina_protocol::query::write_error(error, e),
    }
}

impl scan_service::Server for ScanService {
    async fn bitmaps(
        self: Rc<Self>,
        params: scan_service::BitmapsParams,
        mut results: scan_service::BitmapsResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let list = p.get_row_groups()?;
        let admitted = self
            .admit_bitmaps(
                p.get_query_id(),
                p.get_secret(),
                p.get_snapshot(),
                u64::from(list.len()),
            )
            .await;
        let ts = match admitted {
            Ok(ts) => ts,
            Err(r) => {
                r.write(results.get().init_result().init_error());
                return Ok(());
            }
        };
        let result = results.get().init_result();
        match self.bitmaps_of(p.get_file_id(), ts, list.iter()).await? {
            Ok(groups) => write_bitmaps(result.init_ok(groups.len() as u32), &groups),
            Err(e) => write_bitmap_error(result.init_error(), &e),
        }
        Ok(())
    }

    async fn file_bitmaps(
        self: Rc<Self>,
        params: scan_service::FileBitmapsParams,
        mut results: scan_service::FileBitmapsResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let files = p.get_files()?;
        let mut row_groups = 0u64;
        for f in files.iter() {
            row_groups += u64::from(f.get_row_groups()?.len());
        }
        let admitted = self
            .admit_bitmaps(
                p.get_query_id(),
                p.get_secret(),
                p.get_snapshot(),
                row_groups,
            )
            .await;
        let ts = match admitted {
            Ok(ts) => ts,
            Err(r) => {
                r.write(results.get().init_result().init_error());
                return Ok(());
            }
        };
        // Every file's answer first: the first error answers the whole call.
        let mut answers = Vec::with_capacity(files.len() as usize);
        for f in files.iter() {
            let file = f.get_file_id();
            match self
                .bitmaps_of(file, ts, f.get_row_groups()?.iter())
                .await?
            {
                Ok(groups) => answers.push((file, groups)),
                Err(e) => {
                    write_bitmap_error(results.get().init_result().init_error(), &e);
                    return Ok(());
                }
            }
        }
        let mut list = results.get().init_result().init_ok(answers.len() as u32);
        for (i, (file, groups)) in answers.iter().enumerate() {
            let mut entry = list.reborrow().get(i as u32);
            entry.set_file_id(*file);
            write_bitmaps(entry.init_bitmaps(groups.len() as u32), groups);
        }
        Ok(())
    }

    async fn write_buffer(
        self: Rc<Self>,
        params: scan_service::WriteBufferParams,
        mut results: scan_service::WriteBufferResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let known_list = p.get_known_files()?;
        let column_list = p.get_columns()?;
        let table = p.get_table();
        let admitted = self
            .admit(p.get_query_id(), p.get_secret(), p.get_snapshot())
            .await
            .and_then(|ts| {
                if known_list.len() > MAX_KNOWN_FILES {
                    return Err(Refused::Invalid(format!(
                        "{} known files: at most {MAX_KNOWN_FILES}",
                        known_list.len()
                    )));
                }
                let Some(schema) = self.catalog.get(table) else {
                    // The shard answers unknownTable.
                    return Ok((ts, None));
                };
                let columns = schema.columns().len();
                let mut seen = vec![false; columns];
                let mut projection = Vec::with_capacity(column_list.len() as usize);
                for c in column_list.iter() {
                    let c = usize::from(c);
                    if c >= columns || std::mem::replace(&mut seen[c], true) {
                        return Err(Refused::Invalid(format!(
                            "column {c} of {}: not a column, or named twice",
                            schema.name()
                        )));
                    }
                    projection.push(c);
                }
                if projection.is_empty() {
                    return Ok((ts, None));
                }
                projection.push(schema.create_ts_index());
                Ok((ts, Some(projection)))
            });
        let (ts, projection) = match admitted {
            Ok(a) => a,
            Err(r) => {
                r.write(results.get().init_result().init_error());
                return Ok(());
            }
        };
        let mut known: Vec<_> = known_list.iter().map(retina_storage::FileId).collect();
        // Sorted, so the shard finds each file by binary search.
        known.sort_unstable();
        known.dedup();
        let (tx, rx) = flume::bounded(1);
        self.shard
            .send_async(ShardMsg::Snapshot {
                table,
                ts,
                except: known,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        let snapshot = rx.recv_async().await.map_err(|_| stopped())?;
        let result = results.get().init_result();
        let snap = match snapshot {
            Ok(s) => s,
            Err(e) => {
                retina_protocol::query::write_error(result.init_error(), &e);
                return Ok(());
            }
        };
        // Memory blocks as Arrow IPC in pieces of at most MAX_PART_BYTES.
        let mut parts = Vec::with_capacity(snap.parts.len());
        for part in &snap.parts {
            match &part.data {
                retina_storage::BlockData::Memory(batch) => {
                    let batch = match &projection {
                        Some(p) => batch
                            .project(p)
                            .map_err(|e| capnp::Error::failed(e.to_string()))?,
                        None => batch.clone(),
                    };
                    for (start, len, ipc) in ipc_pieces(&batch, MAX_PART_BYTES)? {
                        let deleted = bits(&part.deleted, start, len);
                        parts.push((part.file, part.offset + start, len, deleted, Ok(ipc)));
                    }
                }
                retina_storage::BlockData::Object(path, facts) => parts.push((
                    part.file,
                    part.offset,
                    part.rows,
                    part.deleted.clone(),
                    Err((path.as_ref().to_owned(), *facts)),
                )),
            }
        }
        let mut list = result.init_ok(parts.len() as u32);
        for (i, (file, offset, rows, deleted, data)) in parts.iter().enumerate() {
            let mut b = list.reborrow().get(i as u32);
            b.set_file_id(file.0);
            b.set_offset(*offset);
            b.set_rows(*rows);
            b.set_deleted(&bitmap_bytes(deleted));
            match data {
                Ok(ipc) => b.set_memory(ipc),
                Err((path, facts)) => {
                    b.set_path(path);
                    if let Some(bytes) = facts.bytes {
                        b.set_bytes(bytes);
                    }
                    if let Some(ts) = facts.max_create_ts {
                        b.set_max_create_ts(ts.get());
                    }
                }
            }
        }
        Ok(())
    }
}

/// `batch` as Arrow IPC streams of at most `max_bytes` each where a row allows: `(first row,
/// rows, bytes)`, halving a piece until it fits.
fn ipc_pieces(
    batch: &arrow::record_batch::RecordBatch,
    max_bytes: usize,
) -> Result<Vec<(u64, u64, Vec<u8>)>, capnp::Error> {
    // A first cut from the in-memory size, so a huge block is not encoded whole first.
    let rows = batch.num_rows();
    let estimate = batch.get_array_memory_size();
    let pieces = estimate.div_ceil(max_bytes).clamp(1, rows.max(1));
    let step = rows.div_ceil(pieces).max(1);
    let mut todo: Vec<(usize, usize)> = (0..rows)
        .step_by(step)
        .map(|s| (s, step.min(rows - s)))
        .rev()
        .collect();
    if rows == 0 {
        todo.push((0, 0));
    }
    let mut out = Vec::new();
    while let Some((start, len)) = todo.pop() {
        let bytes = ipc_bytes(&batch.slice(start, len))?;
        if bytes.len() > max_bytes && len > 1 {
            let half = len / 2;
            todo.push((start + half, len - half));
            todo.push((start, half));
            continue;
        }
        if bytes.len() >= (1 << 29) {
            return Err(capnp::Error::failed(format!(
                "a row of {} bytes is over Cap'n Proto's limit on one Data",
                bytes.len()
            )));
        }
        out.push((start as u64, len as u64, bytes));
    }
    Ok(out)
}
/// A batch as an Arrow IPC stream.
fn ipc_bytes(batch: &arrow::record_batch::RecordBatch) -> Result<Vec<u8>, capnp::Error> {
    let mut out = Vec::new();
    let mut w = arrow::ipc::writer::StreamWriter::try_new(&mut out, &batch.schema())
        .map_err(|e| capnp::Error::failed(e.to_string()))?;
    w.write(batch)
        .map_err(|e| capnp::Error::failed(e.to_string()))?;
    w.finish()
        .map_err(|e| capnp::Error::failed(e.to_string()))?;
    drop(w);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, StringArray};
    use arrow::record_batch::RecordBatch;

    /// Runs `f` on a glommio executor of its own, as the scan service runs on a shard's core.
    fn on_core<T: Send + 'static, F: std::future::Future<Output = T> + 'static>(
        f: impl FnOnce() -> F + Send + 'static,
    ) -> T {
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move { f().await })
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn a_scan_call_that_overtakes_its_query_waits_for_it() {
        fn ts(v: u64) -> Timestamp {
            Timestamp::new(v).unwrap()
        }
        let long = Duration::from_secs(60);
        on_core(move || async move {
            let q = Rc::new(RefCell::new(RunningQueries::default()));
            let later = |f: Box<dyn FnOnce(&mut RunningQueries)>, after_ms| {
                let q = q.clone();
                glommio::spawn_local(async move {
                    glommio::timer::sleep(Duration::from_millis(after_ms)).await;
                    f(&mut q.borrow_mut());
                })
                .detach();
            };
            // Begun after the call came: the call is served.
            later(Box::new(|r| r.begun(1, ts(5), 11)), 20);
            assert_eq!(admit_when_known(&q, 1, 11, long).await, Some(ts(5)));
            // Running: at once, and only with its secret.
            let at = Instant::now();
            assert_eq!(admit_when_known(&q, 1, 11, long).await, Some(ts(5)));
            assert_eq!(admit_when_known(&q, 1, 12, long).await, None);
            assert!(at.elapsed() < Duration::from_secs(5));
            // Never heard of: refused once the wait is over, not before.
            let at = Instant::now();
            let wait = Duration::from_millis(50);
            assert_eq!(admit_when_known(&q, 2, 11, wait).await, None);
            assert!(at.elapsed() >= wait);
            // Held until the shard reaches its snapshot: waits past the bound for unknown
            // queries, and is served once begun; with a wrong secret, refused at once.
            q.borrow_mut().hold(3, ts(9), 33);
            assert_eq!(admit_when_known(&q, 3, 34, long).await, None);
            later(Box::new(|r| r.applied_through(ts(9))), 100);
            let at = Instant::now();
            assert_eq!(
                admit_when_known(&q, 3, 33, Duration::from_millis(10)).await,
                Some(ts(9))
            );
            assert!(at.elapsed() >= Duration::from_millis(100));
            // Ended while a call waits for it, held or not heard of: refused then.
            q.borrow_mut().hold(4, ts(12), 44);
            later(Box::new(|r| r.ended(4)), 20);
            later(Box::new(|r| r.ended(5)), 20);
            let at = Instant::now();
            assert_eq!(admit_when_known(&q, 4, 44, long).await, None);
            assert_eq!(admit_when_known(&q, 5, 55, long).await, None);
            assert!(at.elapsed() < Duration::from_secs(5));
            // Ended before its call (or before its QueryBegun, which then is dropped), or
            // ended after running: refused at once.
            q.borrow_mut().ended(6);
            q.borrow_mut().begun(6, ts(9), 66);
            q.borrow_mut().ended(1);
            let at = Instant::now();
            assert_eq!(admit_when_known(&q, 6, 66, long).await, None);
            assert_eq!(admit_when_known(&q, 1, 11, long).await, None);
            assert!(at.elapsed() < Duration::from_secs(5));
            assert!(q.borrow().waiting.iter().all(|(_, tx)| tx.is_canceled()));
        });
    }

    #[test]
    fn waiting_scan_calls_are_bounded() {
        on_core(|| async {
            let q = Rc::new(RefCell::new(RunningQueries::default()));
            let waiters: Vec<_> = (0..MAX_WAITING_CALLS as u64)
                .map(|i| {
                    let q = q.clone();
                    glommio::spawn_local(async move {
                        admit_when_known(&q, 100 + i, 1, Duration::from_secs(60)).await
                    })
                })
                .collect();
            glommio::yield_if_needed().await;
            glommio::timer::sleep(Duration::from_millis(10)).await;
            assert_eq!(q.borrow().waiting.len(), MAX_WAITING_CALLS);
            // One more is refused at once.
            let at = Instant::now();
            assert_eq!(
                admit_when_known(&q, 7, 1, Duration::from_secs(60)).await,
                None
            );
            assert!(at.elapsed() < Duration::from_secs(5));
            // Every waiter is let go when its query begins.
            for i in 0..MAX_WAITING_CALLS as u64 {
                q.borrow_mut().begun(100 + i, Timestamp::new(2).unwrap(), 1);
            }
            for w in waiters {
                assert_eq!(w.await, Some(Timestamp::new(2).unwrap()));
            }
            assert!(q.borrow().waiting.is_empty());
        });
    }

    #[test]
    fn a_large_block_goes_out_in_bounded_pieces_that_cover_it_once() {
        let rows = 300;
        let text: Vec<String> = (0..rows).map(|i| format!("{i:0>1000}")).collect();
        let batch = RecordBatch::try_from_iter([
            (
                "v",
                Arc::new(StringArray::from(text)) as arrow::array::ArrayRef,
            ),
            (
                "_create_ts",
                Arc::new(Int64Array::from_iter_values(0..rows as i64)) as _,
            ),
        ])
        .unwrap();
        let max = 64 << 10;
        let pieces = ipc_pieces(&batch, max).unwrap();
        assert!(pieces.len() >= 4, "{} pieces", pieces.len());
        let mut next = 0;
        for (start, len, bytes) in &pieces {
            assert_eq!(*start, next, "pieces are contiguous");
            assert!(bytes.len() <= max, "{} bytes", bytes.len());
            let back: Vec<RecordBatch> =
                arrow::ipc::reader::StreamReader::try_new(&bytes[..], None)
                    .unwrap()
                    .collect::<Result<_, _>>()
                    .unwrap();
            let back = arrow::compute::concat_batches(&batch.schema(), &back).unwrap();
            assert_eq!(back, batch.slice(*start as usize, *len as usize));
            next += len;
        }
        assert_eq!(next, rows as u64);
    }

    #[test]
    fn a_piece_s_bitmap_is_its_rows_bits() {
        let bitmap = [0b1010u64 | 1 << 63, 0b1];
        assert_eq!(bits(&bitmap, 1, 3), vec![0b101]);
        assert_eq!(bits(&bitmap, 63, 2), vec![0b11]);
        assert_eq!(bits(&bitmap, 64, 70), vec![1, 0]);
        // Against bit-by-bit, at every offset and length over 3 words (and past their end).
        let bitmap = [
            0x9e37_79b9_7f4a_7c15u64,
            0xbf58_476d_1ce4_e5b9,
            0x94d0_49bb_1331_11eb,
        ];
        let bit = |i: u64| {
            bitmap
                .get((i / 64) as usize)
                .is_some_and(|w| w >> (i % 64) & 1 == 1)
        };
        for start in 0..200 {
            for len in 0..200u64 {
                let mut want = vec![0u64; len.div_ceil(64) as usize];
                for i in (0..len).filter(|&i| bit(start + i)) {
                    want[(i / 64) as usize] |= 1 << (i % 64);
                }
                assert_eq!(bits(&bitmap, start, len), want, "{start} {len}");
            }
        }
    }
}
