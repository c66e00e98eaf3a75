//! The Cap'n Proto services (`protocol/schema/retina.capnp`). The coordinator service runs on
//! the coordinator's executor: a client bootstraps with the auth token, then begins, renews and
//! ends queries, lists tables and asks for scan plans. Each shard's scan service runs beside
//! the shard on its core and answers bitmaps and write buffers. Each call is a message to the
//! actor, so no service holds state of its own.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use capnp_rpc::{RpcSystem, twoparty};
use futures::AsyncReadExt;
use retina_protocol::query::write_table;
use retina_protocol::retina_capnp::{bootstrap, coordinator, scan_service};

use crate::catalog::Catalog;
use crate::node::CoordMsg;

/// Largest message a client may send, in 8-byte words (Cap'n Proto's traversal limit).
const TRAVERSAL_LIMIT_WORDS: usize = 8 << 20;
/// Deepest nesting a message may have.
const NESTING_LIMIT: i32 = 64;

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
    let coordinator: coordinator::Client = capnp_rpc::new_client(CoordinatorService {
        coord,
        catalog,
        lease_ms,
        shards,
        store_url,
    });
    let bootstrap: bootstrap::Client = capnp_rpc::new_client(Bootstrap {
        service: Service::Coordinator(coordinator),
        auth_token,
    });
    accept_loop(listener, bootstrap, "coordinator service").await;
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

struct CoordinatorService {
    coord: flume::Sender<CoordMsg>,
    catalog: Arc<Catalog>,
    lease_ms: u64,
    /// Each shard's scan-service address, by shard.
    shards: Vec<SocketAddr>,
    /// Where the plan's paths are.
    store_url: String,
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
            .send_async(CoordMsg::BeginQuery { reply: tx })
            .await
            .map_err(|_| stopped())?;
        let (id, snapshot) = match rx.recv_async().await.map_err(|_| stopped())? {
            Ok(q) => q,
            Err(refused) => {
                results
                    .get()
                    .init_result()
                    .init_error()
                    .set_internal(refused.to_string());
                return Ok(());
            }
        };
        let mut q = results.get().init_result().init_ok();
        q.set_id(id);
        q.set_snapshot(snapshot.get());
        q.set_lease_ms(self.lease_ms);
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
            .send_async(CoordMsg::RenewQuery { id, reply: tx })
            .await
            .map_err(|_| stopped())?;
        let r = results.get().init_result();
        match rx.recv_async().await.map_err(|_| stopped())? {
            Some(snapshot) => {
                let mut q = r.init_ok();
                q.set_id(id);
                q.set_snapshot(snapshot.get());
                q.set_lease_ms(self.lease_ms);
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
        let name = p.get_table()?.to_str()?.to_owned();
        let result = results.get().init_result();
        let Some(table) = self.catalog.resolve(&name) else {
            result.init_error().set_unknown_table(&name);
            return Ok(());
        };
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send_async(CoordMsg::Plan {
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
/// a message to the shard, answered from its own state.
pub async fn serve_scan(
    listener: glommio::net::TcpListener,
    shard: flume::Sender<crate::node::ShardMsg>,
    auth_token: Option<String>,
) {
    let scan: scan_service::Client = capnp_rpc::new_client(ScanService { shard });
    let bootstrap: bootstrap::Client = capnp_rpc::new_client(Bootstrap {
        service: Service::Scan(scan),
        auth_token,
    });
    accept_loop(listener, bootstrap, "scan service").await;
}

async fn accept_loop(
    listener: glommio::net::TcpListener,
    bootstrap: bootstrap::Client,
    what: &'static str,
) {
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{what}: accept: {e}");
                continue;
            }
        };
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
        let system = RpcSystem::new(Box::new(network), Some(bootstrap.clone().client));
        glommio::spawn_local(async move {
            if let Err(e) = system.await {
                tracing::debug!("{what}: a connection ended: {e}");
            }
        })
        .detach();
    }
}

struct ScanService {
    shard: flume::Sender<crate::node::ShardMsg>,
}

impl ScanService {
    async fn snapshot(
        &self,
        table: u32,
        ts: u64,
        except: Vec<retina_storage::FileId>,
    ) -> Result<retina_storage::Result<retina_storage::TableSnapshot>, capnp::Error> {
        let ts =
            retina_storage::Timestamp::new(ts).map_err(|e| capnp::Error::failed(e.to_string()))?;
        let (tx, rx) = flume::bounded(1);
        self.shard
            .send_async(crate::node::ShardMsg::Snapshot {
                table,
                ts,
                except,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        rx.recv_async().await.map_err(|_| stopped())
    }
}

fn words(bitmap: &[u64]) -> Vec<u8> {
    bitmap.iter().flat_map(|w| w.to_le_bytes()).collect()
}

impl scan_service::Server for ScanService {
    async fn bitmaps(
        self: Rc<Self>,
        params: scan_service::BitmapsParams,
        mut results: scan_service::BitmapsResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let ts = retina_storage::Timestamp::new(p.get_snapshot())
            .map_err(|e| capnp::Error::failed(e.to_string()))?;
        let (tx, rx) = flume::bounded(1);
        self.shard
            .send_async(crate::node::ShardMsg::Bitmaps {
                file: retina_storage::FileId(p.get_file_id()),
                ts,
                row_groups: p.get_row_groups()?.iter().collect(),
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
                    b.set_deleted(&words(&g.deleted));
                }
            }
            Err(retina_storage::StorageError::UnknownFile(id)) => {
                result.init_error().set_unknown_file(id)
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
        let known = p
            .get_known_files()?
            .iter()
            .map(retina_storage::FileId)
            .collect();
        let snapshot = self
            .snapshot(p.get_table(), p.get_snapshot(), known)
            .await?;
        let result = results.get().init_result();
        let snap = match snapshot {
            Ok(s) => s,
            Err(e) => {
                retina_protocol::query::write_error(result.init_error(), &e);
                return Ok(());
            }
        };
        let mut list = result.init_ok(snap.parts.len() as u32);
        for (i, part) in snap.parts.iter().enumerate() {
            let mut b = list.reborrow().get(i as u32);
            b.set_file_id(part.file.0);
            b.set_offset(part.offset);
            b.set_rows(part.rows);
            b.set_deleted(&words(&part.deleted));
            match &part.data {
                retina_storage::BlockData::Memory(batch) => b.set_memory(&ipc_bytes(batch)?),
                retina_storage::BlockData::Object(path) => b.set_path(path.as_ref()),
            }
        }
        Ok(())
    }
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
