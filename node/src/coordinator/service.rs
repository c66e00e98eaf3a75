//! The coordinator's Cap'n Proto service, on the coordinator's executor: a client bootstraps
//! with the auth token, then begins, renews and ends queries, lists tables and asks for scan
//! plans. Each call is a message to the actor. A connection is the owner of the queries it
//! begins, which end when it closes.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use retina_protocol::query::{MAX_PLANS_PER_BEGIN, write_table};
use retina_protocol::retina_capnp::{bootstrap, coordinator, query_result, scan_plan_result};
use retina_storage::Timestamp;

use super::error::BeginRefused;
use super::msg::CoordMsg;
use super::plan::PlanFile;
use super::query::{LOCAL, Owner, QueryTicket};
use crate::catalog::Catalog;
use crate::rpc::{Bootstrap, MAX_TABLE_NAME_BYTES, ScanAddrs, Service, accept_loop, stopped};

/// Serves the coordinator on an already bound listener until the executor stops.
pub async fn serve(
    listener: glommio::net::TcpListener,
    coord: flume::Sender<CoordMsg>,
    catalog: Arc<Catalog>,
    auth_token: Option<String>,
    lease_ms: u64,
    shards: ScanAddrs,
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
    let next_owner = Cell::new(LOCAL + 1);
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

/// What every connection's coordinator service shares.
struct CoordinatorShared {
    coord: flume::Sender<CoordMsg>,
    catalog: Arc<Catalog>,
    lease_ms: u64,
    /// Each shard's scan-service address, by shard.
    shards: ScanAddrs,
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

/// Why a scan plan is not given.
enum PlanRefused {
    InvalidArgument(String),
    UnknownTable(String),
    LeaseExpired(u64),
}

/// A table's scan plan at a running query's snapshot: its id, the snapshot and the files.
type Plan = (u32, Timestamp, Vec<PlanFile>);

impl CoordinatorService {
    /// Begins a query for this connection.
    async fn begin(&self) -> Result<Result<QueryTicket, BeginRefused>, capnp::Error> {
        let (tx, rx) = flume::bounded(1);
        self.coord
            .send_async(CoordMsg::BeginQuery {
                owner: self.owner,
                reply: tx,
            })
            .await
            .map_err(|_| stopped())?;
        rx.recv_async().await.map_err(|_| stopped())
    }

    fn write_begin(
        &self,
        result: query_result::Builder<'_>,
        begun: &Result<QueryTicket, BeginRefused>,
    ) {
        match begun {
            Ok(t) => {
                let mut q = result.init_ok();
                q.set_id(t.id);
                q.set_snapshot(t.snapshot.get());
                q.set_lease_ms(self.lease_ms);
                q.set_secret(t.secret);
            }
            Err(BeginRefused::ConnectionLimit { limit } | BeginRefused::NodeLimit { limit }) => {
                result.init_error().set_too_many_queries(*limit)
            }
            Err(BeginRefused::CatchingUp { snapshot, target }) => {
                let mut e = result.init_error().init_catching_up();
                e.set_snapshot(*snapshot);
                e.set_target(*target);
            }
        }
    }

    /// The scan plan of the table named `name` at the snapshot of this connection's query
    /// `id`.
    async fn plan(
        &self,
        id: u64,
        name: capnp::text::Reader<'_>,
    ) -> Result<Result<Plan, PlanRefused>, capnp::Error> {
        if name.len() > MAX_TABLE_NAME_BYTES {
            return Ok(Err(PlanRefused::InvalidArgument(format!(
                "a table name of {} bytes: at most {MAX_TABLE_NAME_BYTES}",
                name.len()
            ))));
        }
        let Ok(name) = name.to_str() else {
            return Ok(Err(PlanRefused::InvalidArgument(
                "the table name is not UTF-8".into(),
            )));
        };
        let Some(table) = self.catalog.resolve(name) else {
            return Ok(Err(PlanRefused::UnknownTable(name.to_owned())));
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
        Ok(match rx.recv_async().await.map_err(|_| stopped())? {
            Some((snapshot, files)) => Ok((table, snapshot, files)),
            None => Err(PlanRefused::LeaseExpired(id)),
        })
    }

    /// The plan lists the regular files the shards have reported, with their row groups,
    /// and names every shard's scan service for the write buffers. A file combined after the
    /// plan was made comes back from `writeBuffer` (it is not among the plan's known files),
    /// so no row is hidden or read twice.
    fn write_plan(&self, result: scan_plan_result::Builder<'_>, plan: &Result<Plan, PlanRefused>) {
        let (table, snapshot, files) = match plan {
            Ok(plan) => plan,
            Err(PlanRefused::InvalidArgument(why)) => {
                return result.init_error().set_invalid_argument(why.as_str());
            }
            Err(PlanRefused::UnknownTable(name)) => {
                return result.init_error().set_unknown_table(name.as_str());
            }
            Err(PlanRefused::LeaseExpired(id)) => {
                return result.init_error().set_lease_expired(*id);
            }
        };
        let shards = self.shards.read().expect("scan addresses").clone();
        let mut plan = result.init_ok();
        plan.set_snapshot(snapshot.get());
        plan.set_store_url(&self.store_url);
        write_table(
            plan.reborrow().init_table(),
            *table,
            &self.catalog.tables()[*table as usize],
        );
        let mut list = plan.reborrow().init_files(files.len() as u32);
        for (i, f) in files.iter().enumerate() {
            let mut e = list.reborrow().get(i as u32);
            e.set_file_id(f.file.0);
            e.set_path(f.path.as_ref());
            e.set_bytes(f.bytes);
            let mut owner = e.reborrow().init_owner();
            owner.set_shard(f.shard);
            owner.set_address(shards[f.shard as usize].to_string());
            let mut groups = e.init_row_groups(f.row_groups.len() as u32);
            for (j, g) in f.row_groups.iter().enumerate() {
                let mut rg = groups.reborrow().get(j as u32);
                rg.set_offset(g.offset);
                rg.set_rows(g.rows);
                rg.set_min_create_ts(g.min_create_ts);
                rg.set_max_create_ts(g.max_create_ts);
            }
        }
        let mut buffers = plan.init_buffers(shards.len() as u32);
        for (i, addr) in shards.iter().enumerate() {
            let mut e = buffers.reborrow().get(i as u32);
            e.set_shard(i as u16);
            e.set_address(addr.to_string());
        }
    }
}

impl coordinator::Server for CoordinatorService {
    async fn begin_query(
        self: Rc<Self>,
        _: coordinator::BeginQueryParams,
        mut results: coordinator::BeginQueryResults,
    ) -> Result<(), capnp::Error> {
        let begun = self.begin().await?;
        self.write_begin(results.get().init_result(), &begun);
        Ok(())
    }

    async fn begin_query_and_plan(
        self: Rc<Self>,
        params: coordinator::BeginQueryAndPlanParams,
        mut results: coordinator::BeginQueryAndPlanResults,
    ) -> Result<(), capnp::Error> {
        let tables = params.get()?.get_tables()?;
        if tables.len() > MAX_PLANS_PER_BEGIN {
            results
                .get()
                .init_result()
                .init_error()
                .set_invalid_argument(format!(
                    "plans of {} tables asked with a begin: at most {MAX_PLANS_PER_BEGIN}",
                    tables.len()
                ));
            return Ok(());
        }
        let begun = self.begin().await?;
        let plans = match &begun {
            Ok(t) => {
                let mut plans = Vec::with_capacity(tables.len() as usize);
                for name in tables.iter() {
                    plans.push(self.plan(t.id, name?).await?);
                }
                plans
            }
            Err(_) => Vec::new(),
        };
        let mut r = results.get();
        self.write_begin(r.reborrow().init_result(), &begun);
        let mut list = r.init_plans(plans.len() as u32);
        for (i, plan) in plans.iter().enumerate() {
            self.write_plan(list.reborrow().get(i as u32), plan);
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

    async fn scan_plan(
        self: Rc<Self>,
        params: coordinator::ScanPlanParams,
        mut results: coordinator::ScanPlanResults,
    ) -> Result<(), capnp::Error> {
        let p = params.get()?;
        let plan = self.plan(p.get_query_id(), p.get_table()?).await?;
        self.write_plan(results.get().init_result(), &plan);
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
