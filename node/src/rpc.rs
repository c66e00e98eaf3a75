//! The Cap'n Proto services (`protocol/schema/retina.capnp`). The coordinator service runs on
//! the coordinator's executor: a client bootstraps with the auth token, then begins, renews and
//! ends queries, lists tables and asks for scan plans. Each shard's scan service runs beside
//! the shard on its core and answers bitmaps and write buffers. Each call is a message to the
//! actor. A coordinator connection is the owner of the queries it begins; a scan service
//! serves only running queries, which the coordinator tells each shard of
//! ([`RunningQueries`]), presented with their secret.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use capnp_rpc::{RpcSystem, twoparty};
use futures::AsyncReadExt;
use retina_protocol::query::write_table;
use retina_protocol::retina_capnp::{bootstrap, coordinator, scan_service};

use crate::catalog::Catalog;
use crate::coordinator::{BeginRefused, Owner, QueryId};
use crate::node::CoordMsg;
use retina_storage::{StorageError, Timestamp};

/// Largest message a client may send, in 8-byte words (Cap'n Proto's traversal limit): every
/// request fits in far less (the largest, 65,536 known files, is 512 KiB); a connection that
/// sends more is closed.
const TRAVERSAL_LIMIT_WORDS: usize = 1 << 20;
/// Deepest nesting a message may have.
const NESTING_LIMIT: i32 = 64;
/// Connections one port serves at once; further ones are closed as they come.
pub const MAX_CONNECTIONS: usize = 1024;
/// Row groups one `bitmaps` call may name (duplicates are answered once).
pub const MAX_ROW_GROUPS_PER_CALL: u32 = 65_536;
/// Known files one `writeBuffer` call may list.
pub const MAX_KNOWN_FILES: u32 = 65_536;
/// Bytes of a table name `scanPlan` accepts.
pub const MAX_TABLE_NAME_BYTES: usize = 1024;
/// Bytes of Arrow data in one memory part: a larger block goes out as several parts (each far
/// below Cap'n Proto's 512 MiB limit on one `Data`).
pub const MAX_PART_BYTES: usize = 16 << 20;

/// Serves the coordinator on an already bound listener until the executor stops.
pub async fn serve(
    listener: glommio::net::TcpListener,
    coord: flume::Sender<CoordMsg>,
    catalog: Arc<Catalog>,
    auth_token: Option<String>,
    lease_ms: u64,
    shards: Vec<SocketAddr>,
    store_url: String,
) {
    let shared = Rc::new(CoordinatorShared {
        coord: coord.clone(),
        catalog,
        lease_ms,
        shards,
        store_url,
    });
    // Owner 0 is the node's own API: connections count from 1.
    let next_owner = Cell::new(crate::coordinator::LOCAL + 1);
    let make = move || {
        let owner = next_owner.get();
        next_owner.set(owner + 1);
        let coordinator: coordinator::Client = capnp_rpc::new_client(CoordinatorService {
            shared: shared.clone(),
            owner,
        });
        let bootstrap: bootstrap::Client = capnp_rpc::new_client(Bootstrap {
            service: Service::Coordinator(coordinator),
            auth_token: auth_token.clone(),
        });
        let coord = coord.clone();
        // Its queries end with the connection (waiting for room in the coordinator's queue:
        // a close is never lost).
        let closed = move || {
            glommio::spawn_local(async move {
                let _ = coord.send_async(CoordMsg::ConnectionClosed { owner }).await;
            })
            .detach();
        };
        (bootstrap, Some(Box::new(closed) as Box<dyn FnOnce()>))
    };
    accept_loop(listener, make, "coordinator service").await;
}

/// Whether a node may listen on `addr` without a token: only on loopback.
pub fn check_listen(addr: SocketAddr, auth_token: Option<&str>) -> Result<(), String> {
    if addr.ip().is_loopback() || auth_token.is_some_and(|t| !t.is_empty()) {
        Ok(())
    } else {
        Err(format!(
            "listening on {addr}, beyond loopback, needs --auth-token: clients then present it"
        ))
    }
}

/// What a port serves: the coordinator, or one shard's scan service.
enum Service {
    Coordinator(coordinator::Client),
    Scan(scan_service::Client),
}

/// Every port's bootstrap: checks the token, hands out the port's service, and answers a
/// request for the other service with a typed `wrongService`.
struct Bootstrap {
    service: Service,
    auth_token: Option<String>,
}

/// Whether `presented` is the node's token (any token when the node has none). Compared in
/// full, whatever the first difference, so timing says nothing.
fn token_matches(expected: Option<&str>, presented: &str) -> bool {
    match expected {
        None => true,
        Some(t) => {
            t.len() == presented.len()
                && t.bytes()
                    .zip(presented.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        }
    }
}

impl bootstrap::Server for Bootstrap {
    fn coordinator(
        self: Rc<Self>,
        params: bootstrap::CoordinatorParams,
        mut results: bootstrap::CoordinatorResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let outcome = (|| {
            let token = params.get()?.get_auth_token()?.to_str()?;
            let mut result = results.get().init_result();
            match &self.service {
                _ if !token_matches(self.auth_token.as_deref(), token) => {
                    result.init_error().set_unauthorized(())
                }
                Service::Coordinator(c) => result.set_ok(c.clone()),
                Service::Scan(_) => result.init_error().set_wrong_service(
                    "this is a shard's scan-service port; the coordinator has its own",
                ),
            }
            Ok(())
        })();
        std::future::ready(outcome)
    }

    fn scan_service(
        self: Rc<Self>,
        params: bootstrap::ScanServiceParams,
        mut results: bootstrap::ScanServiceResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let outcome = (|| {
            let token = params.get()?.get_auth_token()?.to_str()?;
            let mut result = results.get().init_result();
            match &self.service {
                _ if !token_matches(self.auth_token.as_deref(), token) => {
                    result.init_error().set_unauthorized(())
                }
                Service::Scan(s) => result.set_ok(s.clone()),
                Service::Coordinator(_) => result.init_error().set_wrong_service(
                    "this is the coordinator's port; scan services listen on each shard's",
                ),
            }
            Ok(())
        })();
        std::future::ready(outcome)
    }
}

/// What every connection's coordinator service shares.
struct CoordinatorShared {
    coord: flume::Sender<CoordMsg>,
    catalog: Arc<Catalog>,
    lease_ms: u64,
    /// Each shard's scan-service address, by shard.
    shards: Vec<SocketAddr>,
    /// Where the plan's paths are.
    store_url: String,
}

/// One connection's coordinator service: the owner of the queries begun on it.
struct CoordinatorService {
    shared: Rc<CoordinatorShared>,
    owner: Owner,
}

impl std::ops::Deref for CoordinatorService {
    type Target = CoordinatorShared;
    fn deref(&self) -> &CoordinatorShared {
        &self.shared
    }
}

fn stopped() -> capnp::Error {
    capnp::Error::disconnected("the node is stopping".into())
}

impl coordinator::Server for CoordinatorService {
    async fn begin_query(
        self: Rc<Self>,
        _: coordinator::BeginQueryParams,
        mut results: coordinator::BeginQueryResults,
    ) -> Result<(), capnp::Error> {
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send_async(CoordMsg::BeginQuery {
                owner: self.owner,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        let result = results.get().init_result();
        match rx.recv_async().await.map_err(|_| stopped())? {
            Ok(t) => {
                let mut q = result.init_ok();
                q.set_id(t.id);
                q.set_snapshot(t.snapshot.get());
                q.set_lease_ms(self.lease_ms);
                q.set_secret(t.secret);
            }
            Err(BeginRefused::ConnectionLimit { limit } | BeginRefused::NodeLimit { limit }) => {
                result.init_error().set_too_many_queries(limit)
            }
            Err(BeginRefused::CatchingUp { snapshot, target }) => {
                let mut e = result.init_error().init_catching_up();
                e.set_snapshot(snapshot);
                e.set_target(target);
            }
        }
        Ok(())
    }

    async fn end_query(
        self: Rc<Self>,
        params: coordinator::EndQueryParams,
        mut results: coordinator::EndQueryResults,
    ) -> Result<(), capnp::Error> {
        let id = params.get()?.get_query_id();
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send_async(CoordMsg::EndQuery {
                owner: self.owner,
                id,
                reply: Some(tx),
            })
            .await
            .map_err(|_| stopped())?;
        let running = rx.recv_async().await.map_err(|_| stopped())?;
        let mut r = results.get().init_result();
        if running {
            r.set_ok(());
        } else {
            r.init_error().set_lease_expired(id);
        }
        Ok(())
    }

    async fn renew_lease(
        self: Rc<Self>,
        params: coordinator::RenewLeaseParams,
        mut results: coordinator::RenewLeaseResults,
    ) -> Result<(), capnp::Error> {
        let id = params.get()?.get_query_id();
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send_async(CoordMsg::RenewQuery {
                owner: self.owner,
                id,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        let r = results.get().init_result();
        match rx.recv_async().await.map_err(|_| stopped())? {
            Some(t) => {
                let mut q = r.init_ok();
                q.set_id(id);
                q.set_snapshot(t.snapshot.get());
                q.set_lease_ms(self.lease_ms);
                q.set_secret(t.secret);
            }
            None => r.init_error().set_lease_expired(id),
        }
        Ok(())
    }

    /// The plan lists the regular files the shards have reported, with their row groups,
    /// and names every shard's scan service for the write buffers. A file combined after the
    /// plan was made comes back from `writeBuffer` (it is not among the plan's known files),
    /// so no row is hidden or read twice.
    async fn scan_plan(
        self: Rc<Self>,
        params: coordinator::ScanPlanParams,
        mut results: coordinator::ScanPlanResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let id = p.get_query_id();
        let name = p.get_table()?;
        let result = results.get().init_result();
        if name.len() > MAX_TABLE_NAME_BYTES {
            result.init_error().set_invalid_argument(format!(
                "a table name of {} bytes: at most {MAX_TABLE_NAME_BYTES}",
                name.len()
            ));
            return Ok(());
        }
        let name = match name.to_str() {
            Ok(n) => n.to_owned(),
            Err(_) => {
                result
                    .init_error()
                    .set_invalid_argument("the table name is not UTF-8");
                return Ok(());
            }
        };
        let Some(table) = self.catalog.resolve(&name) else {
            result.init_error().set_unknown_table(&name);
            return Ok(());
        };
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send_async(CoordMsg::Plan {
                owner: self.owner,
                id,
                table,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        let Some((snapshot, files)) = rx.recv_async().await.map_err(|_| stopped())? else {
            result.init_error().set_lease_expired(id);
            return Ok(());
        };
        let mut plan = result.init_ok();
        plan.set_snapshot(snapshot.get());
        plan.set_store_url(&self.store_url);
        write_table(
            plan.reborrow().init_table(),
            table,
            &self.catalog.tables()[table as usize],
        );
        let mut list = plan.reborrow().init_files(files.len() as u32);
        for (i, f) in files.iter().enumerate() {
            let mut e = list.reborrow().get(i as u32);
            e.set_file_id(f.file.0);
            e.set_path(f.path.as_ref());
            e.set_bytes(f.bytes);
            let mut owner = e.reborrow().init_owner();
            owner.set_shard(f.shard);
            owner.set_address(self.shards[f.shard as usize].to_string());
            let mut groups = e.init_row_groups(f.row_groups.len() as u32);
            for (j, g) in f.row_groups.iter().enumerate() {
                let mut rg = groups.reborrow().get(j as u32);
                rg.set_offset(g.offset);
                rg.set_rows(g.rows);
                rg.set_min_create_ts(g.min_create_ts);
                rg.set_max_create_ts(g.max_create_ts);
            }
        }
        let mut buffers = plan.init_buffers(self.shards.len() as u32);
        for (i, addr) in self.shards.iter().enumerate() {
            let mut e = buffers.reborrow().get(i as u32);
            e.set_shard(i as u16);
            e.set_address(addr.to_string());
        }
        Ok(())
    }

    fn list_tables(
        self: Rc<Self>,
        _: coordinator::ListTablesParams,
        mut results: coordinator::ListTablesResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let tables = self.catalog.tables();
        let mut list = results.get().init_tables(tables.len() as u32);
        for (i, t) in tables.iter().enumerate() {
            write_table(list.reborrow().get(i as u32), i as u32, t);
        }
        std::future::ready(Ok(()))
    }
}

/// Serves one shard's scan service on `listener`, beside the shard on its core: each call is
/// checked against the running queries, then a message to the shard, answered from its state.
pub async fn serve_scan(
    listener: glommio::net::TcpListener,
    shard: flume::Sender<crate::node::ShardMsg>,
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

/// Called once when a connection ends.
type OnClose = Option<Box<dyn FnOnce()>>;

/// Serves each accepted connection with the bootstrap `make` returns for it (and calls its
/// `OnClose` when it ends), at most [`MAX_CONNECTIONS`] at once.
async fn accept_loop(
    listener: glommio::net::TcpListener,
    mut make: impl FnMut() -> (bootstrap::Client, OnClose),
    what: &'static str,
) {
    let open = Rc::new(Cell::new(0usize));
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{what}: accept: {e}");
                continue;
            }
        };
        if open.get() >= MAX_CONNECTIONS {
            tracing::warn!("{what}: {MAX_CONNECTIONS} connections are open: closing a new one");
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let (reader, writer) = stream.split();
        let mut options = capnp::message::ReaderOptions::new();
        options.traversal_limit_in_words(Some(TRAVERSAL_LIMIT_WORDS));
        options.nesting_limit(NESTING_LIMIT);
        let network = twoparty::VatNetwork::new(
            reader,
            writer,
            capnp_rpc::rpc_twoparty_capnp::Side::Server,
            options,
        );
        let (bootstrap, on_close) = make();
        let system = RpcSystem::new(Box::new(network), Some(bootstrap.client));
        open.set(open.get() + 1);
        let open = open.clone();
        glommio::spawn_local(async move {
            if let Err(e) = system.await {
                tracing::debug!("{what}: a connection ended: {e}");
            }
            open.set(open.get() - 1);
            if let Some(f) = on_close {
                f();
            }
        })
        .detach();
    }
}

/// The queries a shard's scan service serves, as the coordinator told the shard: each with
/// its snapshot and secret. Lives on the shard's core; bounded by the coordinator's limits on
/// running queries.
#[derive(Default)]
pub struct RunningQueries {
    running: HashMap<QueryId, (Timestamp, u64)>,
    /// Ended queries whose `QueryBegun` has not come yet (an end may overtake it): it is then
    /// dropped. An entry leaves when that message comes.
    ended_early: HashSet<QueryId>,
}

impl RunningQueries {
    pub fn begun(&mut self, query: QueryId, snapshot: Timestamp, secret: u64) {
        if !self.ended_early.remove(&query) {
            self.running.insert(query, (snapshot, secret));
        }
    }

    pub fn ended(&mut self, query: QueryId) {
        if self.running.remove(&query).is_none() {
            self.ended_early.insert(query);
        }
    }

    /// The snapshot of running query `query` if `secret` is its secret.
    pub fn snapshot(&self, query: QueryId, secret: u64) -> Option<Timestamp> {
        self.running
            .get(&query)
            .filter(|(_, s)| *s == secret)
            .map(|(ts, _)| *ts)
    }
}

struct ScanService {
    shard: flume::Sender<crate::node::ShardMsg>,
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
    fn admit(&self, query: u64, secret: u64, snapshot: u64) -> Result<Timestamp, Refused> {
        let ts = Timestamp::new(snapshot)
            .map_err(|e| Refused::Invalid(format!("snapshot {snapshot}: {e}")))?;
        let theirs = self
            .queries
            .borrow()
            .snapshot(query, secret)
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

/// Bits `start..start + len` of `bitmap` as a bitmap of their own.
fn bits(bitmap: &[u64], start: u64, len: u64) -> Vec<u64> {
    let mut out = vec![0u64; len.div_ceil(64) as usize];
    for i in 0..len {
        let at = start + i;
        let set = bitmap
            .get((at / 64) as usize)
            .is_some_and(|w| w >> (at % 64) & 1 == 1);
        if set {
            out[(i / 64) as usize] |= 1 << (i % 64);
        }
    }
    out
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
            .admit(p.get_query_id(), p.get_secret(), p.get_snapshot())
            .and_then(|ts| {
                if list.len() > MAX_ROW_GROUPS_PER_CALL {
                    return Err(Refused::Invalid(format!(
                        "{} row groups: at most {MAX_ROW_GROUPS_PER_CALL} per call",
                        list.len()
                    )));
                }
                Ok(ts)
            });
        let ts = match admitted {
            Ok(ts) => ts,
            Err(r) => {
                r.write(results.get().init_result().init_error());
                return Ok(());
            }
        };
        let mut row_groups: Vec<u32> = list.iter().collect();
        row_groups.sort_unstable();
        row_groups.dedup();
        let (tx, rx) = flume::bounded(1);
        self.shard
            .send_async(crate::node::ShardMsg::Bitmaps {
                file: retina_storage::FileId(p.get_file_id()),
                ts,
                row_groups,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        let result = results.get().init_result();
        match rx.recv_async().await.map_err(|_| stopped())? {
            Ok(groups) => {
                let mut list = result.init_ok(groups.len() as u32);
                for (i, g) in groups.iter().enumerate() {
                    let mut b = list.reborrow().get(i as u32);
                    b.set_row_group(g.row_group);
                    b.set_rows(g.rows);
                    b.set_deleted(&bitmap_bytes(&g.deleted));
                }
            }
            Err(StorageError::UnknownFile(id)) => result.init_error().set_unknown_file(id),
            Err(e @ StorageError::OffsetOutOfRange { .. }) => {
                result.init_error().set_invalid_argument(e.to_string())
            }
            Err(e) => retina_protocol::query::write_error(result.init_error(), &e),
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
            .send_async(crate::node::ShardMsg::Snapshot {
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
                retina_storage::BlockData::Object(path) => parts.push((
                    part.file,
                    part.offset,
                    part.rows,
                    part.deleted.clone(),
                    Err(path.as_ref().to_owned()),
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
                Err(path) => b.set_path(path),
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
    }
}
