//! A Rust client of the query contract: reads a table at a snapshot the way any query engine
//! would. It begins a query at the coordinator, takes the scan plan, asks each shard's scan
//! service for its files and write buffer with their bitmaps, reads Parquet from the object
//! store itself and applies VFoR, then ends the query. Runs on a glommio executor (the
//! streams are glommio's); the DataFusion connector builds on the same steps.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{RpcSystem, twoparty};
use futures::AsyncReadExt;
use object_store::ObjectStore;
use object_store::path::Path;
use retina_protocol::query::read_table;
use retina_protocol::retina_capnp::{
    bootstrap, buffer_part, buffer_result, coordinator, coordinator_result, done, error,
    query_result, scan_plan_result, scan_service, scan_service_result,
};
use retina_storage::file::{Projection, filter_visible, get, read_visible};
use retina_storage::{TableSchema, Timestamp};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("RPC: {0}")]
    Rpc(#[from] capnp::Error),
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Storage(#[from] retina_storage::StorageError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

impl From<std::str::Utf8Error> for ClientError {
    fn from(e: std::str::Utf8Error) -> Self {
        ClientError::Rpc(e.into())
    }
}

impl From<capnp::NotInSchema> for ClientError {
    fn from(e: capnp::NotInSchema) -> Self {
        ClientError::Rpc(e.into())
    }
}

/// The typed error as a sentence.
pub fn describe(e: error::Reader<'_>) -> String {
    let text = |t: capnp::Result<capnp::text::Reader<'_>>| {
        t.ok()
            .and_then(|t| t.to_str().ok().map(str::to_owned))
            .unwrap_or_default()
    };
    match e.which() {
        Ok(error::Which::UnknownTable(t)) => format!("unknown table {}", text(t)),
        Ok(error::Which::SnapshotTooOld(g)) => format!(
            "snapshot {} is too old: visibility was folded up to {}; begin a new query",
            g.get_requested(),
            g.get_oldest()
        ),
        Ok(error::Which::SnapshotInFuture(g)) => format!(
            "snapshot {} is in the future: applied through {}",
            g.get_requested(),
            g.get_applied_through()
        ),
        Ok(error::Which::LeaseExpired(id)) => format!("the lease of query {id} expired"),
        Ok(error::Which::UnknownFile(id)) => format!("file {id:016x} is gone: ask for a new plan"),
        Ok(error::Which::Unauthorized(())) => "unauthorized: wrong or missing auth token".into(),
        Ok(error::Which::WrongService(t)) => format!("wrong service: {}", text(t)),
        Ok(error::Which::Internal(t)) => format!("node error: {}", text(t)),
        Err(e) => format!("an error this client does not know ({e})"),
    }
}

/// Bootstraps on `addr` and returns its bootstrap capability.
pub async fn bootstrap(addr: SocketAddr) -> Result<bootstrap::Client, ClientError> {
    let stream =
        glommio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| ClientError::Connect {
                addr,
                reason: e.to_string(),
            })?;
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.split();
    let network = twoparty::VatNetwork::new(r, w, Side::Client, Default::default());
    let mut rpc = RpcSystem::new(Box::new(network), None);
    let boot: bootstrap::Client = rpc.bootstrap(Side::Server);
    glommio::spawn_local(async move {
        let _ = rpc.await;
    })
    .detach();
    Ok(boot)
}

/// The coordinator at `addr`.
pub async fn coordinator(
    addr: SocketAddr,
    token: &str,
) -> Result<coordinator::Client, ClientError> {
    let boot = bootstrap(addr).await?;
    let mut req = boot.coordinator_request();
    req.get().set_auth_token(token);
    let resp = req.send().promise.await?;
    match resp.get()?.get_result()?.which()? {
        coordinator_result::Which::Ok(c) => Ok(c?),
        coordinator_result::Which::Error(e) => Err(ClientError::Refused(describe(e?))),
    }
}

/// A shard's scan service at `addr`.
pub async fn scan_service(
    addr: SocketAddr,
    token: &str,
) -> Result<scan_service::Client, ClientError> {
    let boot = bootstrap(addr).await?;
    let mut req = boot.scan_service_request();
    req.get().set_auth_token(token);
    let resp = req.send().promise.await?;
    match resp.get()?.get_result()?.which()? {
        scan_service_result::Which::Ok(c) => Ok(c?),
        scan_service_result::Which::Error(e) => Err(ClientError::Refused(describe(e?))),
    }
}

/// A table read at one snapshot.
pub struct TableRead {
    pub snapshot: Timestamp,
    pub schema: Arc<TableSchema>,
    pub batches: Vec<RecordBatch>,
}

/// Begins a query: its id and snapshot.
pub async fn begin(coordinator: &coordinator::Client) -> Result<(u64, Timestamp), ClientError> {
    let resp = coordinator.begin_query_request().send().promise.await?;
    match resp.get()?.get_result()?.which()? {
        query_result::Which::Ok(q) => {
            let q = q?;
            Ok((q.get_id(), Timestamp::new(q.get_snapshot())?))
        }
        query_result::Which::Error(e) => Err(ClientError::Refused(describe(e?))),
    }
}

/// Ends a query (an error if its lease had run out).
pub async fn end(coordinator: &coordinator::Client, query: u64) -> Result<(), ClientError> {
    let mut req = coordinator.end_query_request();
    req.get().set_query_id(query);
    let resp = req.send().promise.await?;
    if let done::Which::Error(e) = resp.get()?.get_result()?.which()? {
        return Err(ClientError::Refused(describe(e?)));
    }
    Ok(())
}

/// Reads every row of `table` visible at a new query's snapshot, through the contract.
pub async fn read(
    coordinator: &coordinator::Client,
    token: &str,
    store: &dyn ObjectStore,
    table: &str,
    projection: Projection<'_>,
) -> Result<TableRead, ClientError> {
    let (id, snapshot) = begin(coordinator).await?;
    let result = read_at(coordinator, token, store, table, id, projection).await;
    end(coordinator, id).await?;
    let (schema, batches) = result?;
    Ok(TableRead {
        snapshot,
        schema,
        batches,
    })
}

/// Reads every row of `table` visible at the snapshot of the running query `query`; several
/// tables read under one query are consistent with each other.
pub async fn read_at(
    coordinator: &coordinator::Client,
    token: &str,
    store: &dyn ObjectStore,
    table: &str,
    query: u64,
    projection: Projection<'_>,
) -> Result<(Arc<TableSchema>, Vec<RecordBatch>), ClientError> {
    let mut req = coordinator.scan_plan_request();
    req.get().set_query_id(query);
    req.get().set_table(table);
    let resp = req.send().promise.await?;
    let plan = match resp.get()?.get_result()?.which()? {
        scan_plan_result::Which::Ok(p) => p?,
        scan_plan_result::Which::Error(e) => return Err(ClientError::Refused(describe(e?))),
    };
    let snapshot = Timestamp::new(plan.get_snapshot())?;
    let (table_id, schema) = read_table(plan.get_table()?)?;
    let known: Vec<u64> = plan.get_files()?.iter().map(|f| f.get_file_id()).collect();
    let mut out = Vec::new();
    for endpoint in plan.get_buffers()? {
        let addr: SocketAddr = endpoint
            .get_address()?
            .to_str()?
            .parse()
            .map_err(|e| ClientError::Refused(format!("a bad endpoint in the plan: {e}")))?;
        let scan = scan_service(addr, token).await?;
        let mut req = scan.write_buffer_request();
        req.get().set_table(table_id);
        req.get().set_snapshot(snapshot.get());
        let mut k = req.get().init_known_files(known.len() as u32);
        for (i, f) in known.iter().enumerate() {
            k.set(i as u32, *f);
        }
        let resp = req.send().promise.await?;
        let parts = match resp.get()?.get_result()?.which()? {
            buffer_result::Which::Ok(p) => p?,
            buffer_result::Which::Error(e) => return Err(ClientError::Refused(describe(e?))),
        };
        for part in parts {
            let deleted: Vec<u64> = part
                .get_deleted()?
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                .collect();
            match part.which()? {
                buffer_part::Which::Memory(ipc) => {
                    let reader = arrow::ipc::reader::StreamReader::try_new(ipc?, None)?;
                    for batch in reader {
                        out.push(filter_visible(
                            &batch?, &schema, snapshot, &deleted, projection,
                        )?);
                    }
                }
                buffer_part::Which::Path(path) => {
                    let bytes = get(store, &Path::from(path?.to_str()?)).await?;
                    out.extend(read_visible(
                        bytes, &schema, snapshot, &deleted, projection,
                    )?);
                }
            }
        }
    }
    Ok((schema, out))
}
