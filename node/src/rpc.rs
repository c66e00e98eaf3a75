//! The coordinator's Cap'n Proto service (`protocol/schema/retina.capnp`), served on the
//! coordinator's executor: a client bootstraps with the auth token, then begins, renews and
//! ends queries and lists tables. Each call is a message to the coordinator actor, so the
//! service holds no state of its own.
//!
//! Scan plans and the shards' scan services are part of the contract but not served yet: the
//! generated default answers those calls with an "unimplemented" RPC error.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;

use capnp_rpc::{RpcSystem, twoparty};
use futures::AsyncReadExt;
use retina_protocol::query::write_table;
use retina_protocol::retina_capnp::{bootstrap, coordinator};

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
) {
    let coordinator: coordinator::Client = capnp_rpc::new_client(CoordinatorService {
        coord,
        catalog,
        lease_ms,
    });
    let bootstrap: bootstrap::Client = capnp_rpc::new_client(Bootstrap {
        coordinator,
        auth_token,
    });
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("coordinator service: accept: {e}");
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
                tracing::debug!("coordinator service: a connection ended: {e}");
            }
        })
        .detach();
    }
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

struct Bootstrap {
    coordinator: coordinator::Client,
    auth_token: Option<String>,
}

impl Bootstrap {
    fn authorized(&self, presented: &str) -> bool {
        match &self.auth_token {
            None => true,
            // Compared in full, whatever the first difference, so timing says nothing.
            Some(t) => {
                t.len() == presented.len()
                    && t.bytes()
                        .zip(presented.bytes())
                        .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                        == 0
            }
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
            if self.authorized(token) {
                result.set_ok(self.coordinator.clone());
            } else {
                result.init_error().set_unauthorized(());
            }
            Ok(())
        })();
        std::future::ready(outcome)
    }

    fn scan_service(
        self: Rc<Self>,
        _: bootstrap::ScanServiceParams,
        mut results: bootstrap::ScanServiceResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        results.get().init_result().init_error().set_wrong_service(
            "this is the coordinator's port; scan services listen on each shard's",
        );
        std::future::ready(Ok(()))
    }
}

struct CoordinatorService {
    coord: flume::Sender<CoordMsg>,
    catalog: Arc<Catalog>,
    lease_ms: u64,
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
        let (id, snapshot) = rx.recv_async().await.map_err(|_| stopped())?;
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
