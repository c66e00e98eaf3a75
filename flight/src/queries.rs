//! The Flight queries in progress: each is a Retina query (one snapshot, its lease renewed by
//! the connection while it lives) with the physical plans of its endpoints. A query ends when
//! every endpoint has been read and the last stream is closed, or when no stream has been open
//! for the node's lease length (a client that took a `FlightInfo` and never came back).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use retina_query::QuerySession;
use tonic::Status;

use crate::ticket::QueryTicket;

/// Flight queries at once. They share the service's one connection to the node, which runs at
/// most 256 queries (`ListFlights`, `GetSchema` and prepared statements each take one briefly).
pub(crate) const MAX_QUERIES: usize = 192;

/// What one endpoint reads: one partition of a physical plan of the query's session.
pub(crate) struct Endpoint {
    /// The table it reads (none for a SQL statement).
    pub table: Option<String>,
    pub plan: Arc<dyn ExecutionPlan>,
    pub partition: usize,
}

pub(crate) struct FlightQuery {
    pub id: u64,
    secret: u64,
    pub session: QuerySession,
    pub endpoints: Vec<Endpoint>,
    /// How long the query waits for a stream when none is open.
    idle_limit: Duration,
    progress: Mutex<Progress>,
}

struct Progress {
    read: Vec<bool>,
    open: usize,
    idle_since: Instant,
}

impl FlightQuery {
    pub fn ticket(&self, endpoint: usize) -> QueryTicket {
        QueryTicket {
            query: self.id,
            secret: self.secret,
            endpoint: endpoint as u32,
        }
    }
}

#[derive(Default)]
pub(crate) struct Queries {
    running: Mutex<HashMap<u64, Arc<FlightQuery>>>,
    next: AtomicU64,
}

impl Queries {
    /// Registers a query with its endpoints; it waits `idle_limit` for its first stream.
    pub fn add(
        &self,
        session: QuerySession,
        endpoints: Vec<Endpoint>,
        idle_limit: Duration,
    ) -> Result<Arc<FlightQuery>, Status> {
        let running = self.len();
        if running >= MAX_QUERIES {
            return Err(Status::resource_exhausted(format!(
                "{running} Flight queries are being read or waiting to be (the most this node \
                 serves at once): read the endpoints of a FlightInfo, or wait for one that \
                 nobody reads to end after the query lease"
            )));
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let query = Arc::new(FlightQuery {
            id,
            secret: rand::random(),
            session,
            progress: Mutex::new(Progress {
                read: vec![false; endpoints.len()],
                open: 0,
                idle_since: Instant::now(),
            }),
            endpoints,
            idle_limit,
        });
        if !query.endpoints.is_empty() {
            self.lock().insert(id, query.clone());
        }
        Ok(query)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<FlightQuery>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts reading the endpoint `ticket` names: its stream, which keeps the query running
    /// until it is dropped. An endpoint is read once.
    pub fn open(
        self: &Arc<Self>,
        ticket: &QueryTicket,
    ) -> Result<(Arc<FlightQuery>, SendableRecordBatchStream, OpenStream), Status> {
        // The map's lock is held while the endpoint is claimed, as `sweep` holds it while it
        // looks at a query's streams: a query being opened is never swept.
        let running = self.lock();
        let query = running
            .get(&ticket.query)
            .filter(|q| q.secret == ticket.secret)
            .cloned()
            .ok_or_else(|| {
                Status::not_found(format!(
                    "Flight query {} has ended (every endpoint was read, or no stream was open \
                     for its lease length): call GetFlightInfo again",
                    ticket.query
                ))
            })?;
        let n = ticket.endpoint as usize;
        let endpoint = query.endpoints.get(n).ok_or_else(|| {
            Status::invalid_argument(format!(
                "Flight query {} has {} endpoints, not {}",
                query.id,
                query.endpoints.len(),
                n + 1
            ))
        })?;
        {
            let mut p = query.progress.lock().unwrap_or_else(|e| e.into_inner());
            if p.read[n] {
                return Err(Status::failed_precondition(format!(
                    "endpoint {n} of Flight query {} was read already: call GetFlightInfo again",
                    query.id
                )));
            }
            p.read[n] = true;
            p.open += 1;
        }
        drop(running);
        let guard = OpenStream {
            queries: self.clone(),
            query: query.clone(),
        };
        let stream = endpoint
            .plan
            .execute(endpoint.partition, query.session.context().task_ctx())
            .map_err(|e| Status::internal(format!("reading endpoint {n}: {e}")))?;
        Ok((query, stream, guard))
    }

    /// Ends the queries that waited too long for a stream.
    pub fn sweep(&self) {
        let now = Instant::now();
        self.lock().retain(|_, q| {
            let p = q.progress.lock().unwrap_or_else(|e| e.into_inner());
            p.open > 0 || now.duration_since(p.idle_since) < q.idle_limit
        });
    }

    /// Queries in progress.
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

/// An open `DoGet` stream of a query.
pub(crate) struct OpenStream {
    queries: Arc<Queries>,
    query: Arc<FlightQuery>,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        let done = {
            let mut p = self
                .query
                .progress
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            p.open -= 1;
            p.idle_since = Instant::now();
            p.open == 0 && p.read.iter().all(|&r| r)
        };
        if done {
            self.queries.lock().remove(&self.query.id);
        }
    }
}
