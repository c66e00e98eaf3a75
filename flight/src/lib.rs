//! Arrow Flight and Flight SQL on a Retina node: engines and tools without a Cap'n Proto
//! client (pyarrow, DuckDB, ADBC and JDBC drivers, Spark) read Retina's tables fresh and at
//! one consistent snapshot.
//!
//! The service is a client of the node's own query contract: it runs on a tokio runtime of its
//! own, begins queries at the coordinator, and reads tables with VFoR through the DataFusion
//! connector ([`retina_query`]), so what it streams is exactly what `retina sql` would read.
//!
//! **Plain Flight.**
//! - `ListFlights` describes every table: a path descriptor of its name, its columns (without
//!   `_create_ts`) and an estimate of its rows (the rows stored at the snapshot, deleted ones
//!   included).
//! - `GetFlightInfo` of a path descriptor begins a query and plans a read of every table the
//!   path names (the rule is in `names.rs`: `["accounts"]`, `["bank", "accounts"]`,
//!   `["bank.accounts", "bank.transfers"]`). Every endpoint's ticket belongs to that one
//!   query, so all the tables are read at one snapshot. A table has one endpoint per
//!   partition of its scan, to be read in parallel. The `FlightInfo`'s schema is the tables'
//!   when they share one, else empty (each stream carries its own).
//! - `GetFlightInfo` of a command descriptor whose bytes are SQL text runs that statement
//!   (`SELECT` only) at one snapshot: one endpoint.
//! - `app_metadata` is JSON (`query` is the Flight query's number, the one errors name):
//!   `{"query": Q, "snapshot": TS, "tables": [...]}` on the
//!   `FlightInfo`, `{"query": Q, "snapshot": TS, "table": NAME, "partition": P}` on each
//!   endpoint (`table` is null for SQL).
//! - `GetSchema` of a path descriptor of one table, or of SQL text.
//! - `DoGet` streams an endpoint's rows. An endpoint is read once; the query ends when every
//!   endpoint was read and the last stream closed, or when no stream was open for the node's
//!   query lease (an abandoned `FlightInfo`). While a stream is open its lease is renewed.
//!
//! **Flight SQL**, on the same port: `CommandStatementQuery` and prepared statements without
//! parameters (`SELECT` only; anything else is refused, as are updates, ingestion and
//! transactions), and the metadata calls ADBC and JDBC drivers make when they connect:
//! `GetSqlInfo`, `GetCatalogs` (one catalog, `retina`), `GetDbSchemas`, `GetTables` and
//! `GetTableTypes`. SQL names tables as `retina sql` does: `bank.accounts`, or
//! `retina.bank.accounts`.
//!
//! **Authentication.** With a token every call must carry the header `authorization: Bearer
//! TOKEN`; without one the service binds only to a loopback address.

mod names;
mod queries;
mod service;
mod sql;
mod ticket;

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use arrow_flight::flight_service_server::FlightServiceServer;
use datafusion::error::DataFusionError;
use datafusion::prelude::SessionConfig;
use retina_client::{ClientError, Refusal, TableInfo};
use retina_query::{QuerySession, Retina};
use tonic::{Request, Status};

use crate::queries::Queries;

/// The catalog Flight SQL and the sessions' SQL name.
pub const CATALOG: &str = "retina";
/// How often queries nobody reads are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(1);
/// How often an idle connection is checked, and how long it has to answer.
const KEEPALIVE: Duration = Duration::from_secs(20);
/// How long calls in progress may go on after the service is told to stop.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long a query waits for a stream where the node gives its queries no lease.
const DEFAULT_IDLE: Duration = Duration::from_secs(60);

/// Where and how to serve.
#[derive(Clone, Debug)]
pub struct FlightOptions {
    /// The address to serve on (port 0: any free port).
    pub listen: SocketAddr,
    /// The node's coordinator (its Cap'n Proto `--listen` address).
    pub node: SocketAddr,
    /// The token clients present as `authorization: Bearer TOKEN`, and the service presents
    /// to the node.
    pub token: Option<String>,
    /// Threads that answer calls and run the reads.
    pub threads: usize,
    /// The memory the reads' operators (sorts, joins, aggregates of SQL) take together;
    /// beyond it they spill to temporary files or fail.
    pub memory_limit: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum FlightStartError {
    #[error(
        "the Flight address {0} is beyond loopback: serving it needs an auth token (--auth-token)"
    )]
    NotLoopback(SocketAddr),
    #[error("binding the Flight service to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("connecting the Flight service to the node: {0}")]
    Connect(#[from] ClientError),
    #[error("starting the Flight service's threads: {0}")]
    Runtime(std::io::Error),
    #[error("the Flight service's memory pool: {0}")]
    Memory(DataFusionError),
}

/// A running Flight service; stops when dropped.
pub struct FlightServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    token: Option<String>,
    memory_limit: usize,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FlightServer {
    /// Binds, connects to the node and serves on a thread of its own.
    pub fn start(options: FlightOptions) -> Result<FlightServer, FlightStartError> {
        if !options.listen.ip().is_loopback() && options.token.is_none() {
            return Err(FlightStartError::NotLoopback(options.listen));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(options.threads.max(1))
            .thread_name("retina-flight")
            .enable_all()
            .build()
            .map_err(FlightStartError::Runtime)?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(options.listen))
            .map_err(|source| FlightStartError::Bind {
                addr: options.listen,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| FlightStartError::Bind {
                addr: options.listen,
                source,
            })?;
        let shared = Arc::new(Shared {
            retina: RwLock::new(connect(
                options.node,
                options.token.as_deref(),
                options.memory_limit,
            )?),
            queries: Arc::default(),
        });
        let service = service::Service::new(shared.clone());
        let token: Option<Arc<str>> = options.token.as_deref().map(Arc::from);
        let server = FlightServiceServer::with_interceptor(service, move |r| authorize(&token, r));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let sweeping = shared.clone();
        let thread = std::thread::Builder::new()
            .name("retina-flight".into())
            .spawn(move || {
                runtime.spawn(async move {
                    let mut every = tokio::time::interval(SWEEP_EVERY);
                    loop {
                        every.tick().await;
                        sweeping.queries.sweep();
                    }
                });
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
                let (draining, drained) = tokio::sync::oneshot::channel::<()>();
                let served = runtime.block_on(async {
                    // Keepalives find clients that vanished without closing: their streams,
                    // and the snapshots those hold, end.
                    let serve = tonic::transport::Server::builder()
                        .http2_keepalive_interval(Some(KEEPALIVE))
                        .http2_keepalive_timeout(Some(KEEPALIVE))
                        .tcp_keepalive(Some(KEEPALIVE))
                        .add_service(server)
                        .serve_with_incoming_shutdown(incoming, async {
                            let _ = stopped.await;
                            let _ = draining.send(());
                        });
                    // Calls in progress get a moment to finish; a client holding a stream open
                    // does not hold the node's stop.
                    let grace = async {
                        if drained.await.is_ok() {
                            tokio::time::sleep(STOP_GRACE).await;
                        } else {
                            std::future::pending::<()>().await;
                        }
                    };
                    tokio::select! {
                        served = serve => served,
                        () = grace => Ok(()),
                    }
                });
                if let Err(e) = served {
                    tracing::error!("the Flight service stopped: {e}");
                }
                runtime.shutdown_timeout(Duration::from_millis(200));
            })
            .map_err(FlightStartError::Runtime)?;
        Ok(FlightServer {
            addr,
            shared,
            token: options.token,
            memory_limit: options.memory_limit,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Reads from the node at `node` from now on (a node restarted on another port); queries
    /// in progress fail.
    pub fn reconnect(&self, node: SocketAddr) -> Result<(), FlightStartError> {
        let retina = connect(node, self.token.as_deref(), self.memory_limit)?;
        *self
            .shared
            .retina
            .write()
            .unwrap_or_else(|e| e.into_inner()) = retina;
        Ok(())
    }

    /// Flight queries in progress.
    pub fn queries(&self) -> usize {
        self.shared.queries.len()
    }

    /// Stops serving: calls in progress end.
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for FlightServer {
    fn drop(&mut self) {
        self.shut();
    }
}

fn connect(
    node: SocketAddr,
    token: Option<&str>,
    memory_limit: usize,
) -> Result<Retina, FlightStartError> {
    let mut config = SessionConfig::new()
        .with_information_schema(true)
        .with_default_catalog_and_schema(CATALOG, "public");
    // Each endpoint is one partition of a scan, read by a stream of its own, maybe by another
    // client: a partition reads its own files, never those of a sibling that went idle.
    config
        .options_mut()
        .execution
        .enable_file_stream_work_stealing = false;
    Retina::connect(node, token.unwrap_or(""))?
        .with_config(config)
        .with_memory_limit(memory_limit)
        .map_err(FlightStartError::Memory)
}

/// Every call must carry the token, when there is one.
fn authorize(token: &Option<Arc<str>>, request: Request<()>) -> Result<Request<()>, Status> {
    let Some(token) = token else {
        return Ok(request);
    };
    let given = request
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            // The scheme's name is case-insensitive (RFC 9110).
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match given {
        Some(g) if same(g.as_bytes(), token.as_bytes()) => Ok(request),
        Some(_) => Err(Status::unauthenticated("wrong token")),
        None => Err(Status::unauthenticated(
            "this Retina node needs a token: send the header `authorization: Bearer TOKEN`",
        )),
    }
}

/// Equality in time that does not depend on where the bytes differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// What every call shares: the connection to the node and the queries in progress.
pub(crate) struct Shared {
    retina: RwLock<Retina>,
    queries: Arc<Queries>,
}

impl Shared {
    fn retina(&self) -> Retina {
        self.retina
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A query at the node's current snapshot, with every table registered.
    async fn begin(&self) -> Result<(Retina, QuerySession), Status> {
        let retina = self.retina();
        let session = retina.begin().await.map_err(status)?;
        Ok((retina, session))
    }

    async fn tables(&self) -> Result<Vec<TableInfo>, Status> {
        self.retina()
            .connection()
            .tables()
            .await
            .map_err(client_status)
    }
}

/// How long a query with this session waits for a stream.
fn idle_limit(session: &QuerySession) -> Duration {
    match session.info().lease_ms {
        0 => DEFAULT_IDLE,
        ms => Duration::from_millis(ms),
    }
}

/// A DataFusion error as the status a Flight client sees: the node's refusals by kind, bad
/// statements as invalid arguments.
fn status(e: DataFusionError) -> Status {
    if let Some(r) = retina_query::refusal(&e) {
        return refusal_status(r);
    }
    match e.find_root() {
        DataFusionError::Plan(_)
        | DataFusionError::SQL(..)
        | DataFusionError::SchemaError(..)
        | DataFusionError::NotImplemented(_) => Status::invalid_argument(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

fn client_status(e: ClientError) -> Status {
    match &e {
        ClientError::Refused(r) => refusal_status(r),
        ClientError::Connect { .. } | ClientError::Closed => Status::unavailable(e.to_string()),
        _ => Status::internal(e.to_string()),
    }
}

fn refusal_status(r: &Refusal) -> Status {
    let message = r.to_string();
    match r {
        Refusal::UnknownTable(_) => Status::not_found(message),
        Refusal::Unauthorized => Status::unauthenticated(message),
        Refusal::LeaseExpired(_) | Refusal::SnapshotTooOld { .. } => {
            Status::failed_precondition(message)
        }
        Refusal::InvalidArgument(_) => Status::invalid_argument(message),
        Refusal::TooManyQueries(_) => Status::resource_exhausted(message),
        Refusal::Internal(_) | Refusal::Unknown(_) => Status::internal(message),
        _ => Status::unavailable(message),
    }
}
