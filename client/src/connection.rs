//! A connection to a node that any thread and any async runtime can use: the Cap'n Proto RPC
//! system runs on a glommio executor on a thread of its own, and each call is a message to it
//! with its answer in owned Rust types. Query engines on tokio (the DataFusion connector) use
//! it; a query it begins has its lease renewed by that thread until the query ends, so a
//! client that dies leaves a lease that runs out, and LWM moves on.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use retina_protocol::retina_capnp::{coordinator, scan_service};

use crate::calls;
use crate::error::ClientError;
use crate::types::{BufferPart, QueryInfo, RowGroupBitmap, ScanPlan, TableInfo};

/// The io_uring memory of the connection's executor: it does little I/O.
const CLIENT_IO_MEMORY: usize = 256 << 10;
/// Calls that may wait for the connection's thread; callers wait for room beyond that.
const CALL_QUEUE: usize = 1024;
/// How long a closing connection waits for calls still in flight (an `end` above all).
const CLOSE_GRACE: Duration = Duration::from_secs(2);

type Reply<T> = flume::Sender<Result<T, ClientError>>;

/// A query begun, with the plans asked for at its snapshot.
type BegunWithPlans = (QueryInfo, Vec<Result<ScanPlan, ClientError>>);

enum Call {
    Begin(Reply<QueryInfo>),
    BeginAndPlan(Vec<String>, Reply<BegunWithPlans>),
    End(u64, Reply<()>),
    Renew(u64, Reply<QueryInfo>),
    Tables(Reply<Vec<TableInfo>>),
    Plan {
        query: u64,
        table: String,
        reply: Reply<ScanPlan>,
    },
    Bitmaps {
        service: SocketAddr,
        query: QueryInfo,
        file: u64,
        row_groups: Vec<u32>,
        reply: Reply<Vec<RowGroupBitmap>>,
    },
    FileBitmaps {
        service: SocketAddr,
        query: QueryInfo,
        files: Vec<(u64, Vec<u32>)>,
        reply: Reply<Vec<Vec<RowGroupBitmap>>>,
    },
    Buffer {
        service: SocketAddr,
        query: QueryInfo,
        table: u32,
        known: Vec<u64>,
        columns: Vec<u16>,
        reply: Reply<Vec<BufferPart>>,
    },
}

/// A connection to a node's coordinator (and, on demand, its scan services). Cheap to clone;
/// the connection closes when the last clone is dropped.
#[derive(Clone)]
pub struct Connection {
    inner: Arc<Inner>,
}

struct Inner {
    calls: Option<flume::Sender<Call>>,
    /// Queries `end_detached` could not queue an end for: their leases are no longer renewed.
    abandoned: Arc<Mutex<Vec<u64>>>,
    thread: Mutex<Option<glommio::ExecutorJoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.calls.take();
        if let Some(t) = self.thread.lock().map(|mut t| t.take()).ok().flatten() {
            let _ = t.join();
        }
    }
}

impl Connection {
    /// Connects to the coordinator at `addr`, presenting `token` (empty for none).
    pub fn connect(addr: SocketAddr, token: &str) -> Result<Connection, ClientError> {
        let (calls, rx) = flume::bounded(CALL_QUEUE);
        let (ready_tx, ready_rx) = flume::bounded(1);
        let token = token.to_owned();
        let abandoned: Arc<Mutex<Vec<u64>>> = Arc::default();
        let worker_abandoned = abandoned.clone();
        let thread = LocalExecutorBuilder::new(Placement::Unbound)
            .name("retina-client")
            .io_memory(CLIENT_IO_MEMORY)
            .spawn(move || async move {
                let coordinator = match calls::coordinator(addr, &token).await {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                serve_calls(
                    Rc::new(Worker {
                        coordinator,
                        token,
                        scans: RefCell::default(),
                        live: RefCell::default(),
                        abandoned: worker_abandoned,
                    }),
                    rx,
                )
                .await;
            })
            .map_err(|e| ClientError::Connect {
                addr,
                reason: format!("starting the client thread: {e}"),
            })?;
        ready_rx.recv().map_err(|_| ClientError::Closed)??;
        Ok(Connection {
            inner: Arc::new(Inner {
                calls: Some(calls),
                abandoned,
                thread: Mutex::new(Some(thread)),
            }),
        })
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Call) -> Result<T, ClientError> {
        let (tx, rx) = flume::bounded(1);
        self.inner
            .calls
            .as_ref()
            .expect("open until dropped")
            .send_async(make(tx))
            .await
            .map_err(|_| ClientError::Closed)?;
        rx.recv_async().await.map_err(|_| ClientError::Closed)?
    }

    /// Begins a query at the node's current snapshot. Its lease is renewed until
    /// [`Self::end`] (or until this connection closes).
    pub async fn begin(&self) -> Result<QueryInfo, ClientError> {
        self.call(Call::Begin).await
    }

    /// Begins a query as [`Self::begin`] does and takes the scan plan of each of `tables` at
    /// its snapshot in the same round trip: each table's plan or refusal, in the order asked
    /// (none from a node that does not serve the combined call).
    pub async fn begin_and_plan(&self, tables: Vec<String>) -> Result<BegunWithPlans, ClientError> {
        self.call(|reply| Call::BeginAndPlan(tables, reply)).await
    }

    /// Ends a query; an error if its lease had already run out.
    pub async fn end(&self, query: u64) -> Result<(), ClientError> {
        self.call(|r| Call::End(query, r)).await
    }

    /// Ends a query without waiting for the answer (for `Drop`). Never blocks: with the call
    /// queue full, the query ends when its lease runs out instead.
    pub fn end_detached(&self, query: u64) {
        let (tx, _) = flume::bounded(1);
        if let Some(calls) = &self.inner.calls
            && calls.try_send(Call::End(query, tx)).is_err()
        {
            self.inner
                .abandoned
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(query);
        }
    }

    /// Renews a query's lease now.
    pub async fn renew(&self, query: u64) -> Result<QueryInfo, ClientError> {
        self.call(|r| Call::Renew(query, r)).await
    }

    /// The node's tables.
    pub async fn tables(&self) -> Result<Vec<TableInfo>, ClientError> {
        self.call(Call::Tables).await
    }

    /// The scan plan of `table` at the snapshot of `query`.
    pub async fn plan(&self, query: u64, table: &str) -> Result<ScanPlan, ClientError> {
        let table = table.to_owned();
        self.call(|reply| Call::Plan {
            query,
            table,
            reply,
        })
        .await
    }

    /// The bitmaps of `row_groups` of `file` at `snapshot`, from the scan service `service`.
    pub async fn bitmaps(
        &self,
        service: SocketAddr,
        query: QueryInfo,
        file: u64,
        row_groups: Vec<u32>,
    ) -> Result<Vec<RowGroupBitmap>, ClientError> {
        self.call(|reply| Call::Bitmaps {
            service,
            query,
            file,
            row_groups,
            reply,
        })
        .await
    }

    /// The bitmaps of several files' row groups (`files`: each file and its row groups) at the
    /// query's snapshot, from the scan service `service` in one call; each file's answer in the
    /// order asked.
    pub async fn file_bitmaps(
        &self,
        service: SocketAddr,
        query: QueryInfo,
        files: Vec<(u64, Vec<u32>)>,
    ) -> Result<Vec<Vec<RowGroupBitmap>>, ClientError> {
        self.call(|reply| Call::FileBitmaps {
            service,
            query,
            files,
            reply,
        })
        .await
    }

    /// The write buffer of `table` at `snapshot` from the scan service `service`, with the
    /// regular files it holds that are not in `known`.
    pub async fn write_buffer(
        &self,
        service: SocketAddr,
        query: QueryInfo,
        table: u32,
        known: Vec<u64>,
        columns: Vec<u16>,
    ) -> Result<Vec<BufferPart>, ClientError> {
        self.call(|reply| Call::Buffer {
            service,
            query,
            table,
            known,
            columns,
            reply,
        })
        .await
    }
}

/// The connection thread's state.
struct Worker {
    coordinator: coordinator::Client,
    token: String,
    scans: RefCell<HashMap<SocketAddr, scan_service::Client>>,
    /// Queries whose leases this thread renews.
    live: RefCell<HashSet<u64>>,
    abandoned: Arc<Mutex<Vec<u64>>>,
}

async fn serve_calls(worker: Rc<Worker>, rx: flume::Receiver<Call>) {
    let in_flight = Rc::new(Cell::new(0usize));
    while let Ok(call) = rx.recv_async().await {
        let worker = worker.clone();
        let in_flight = in_flight.clone();
        in_flight.set(in_flight.get() + 1);
        glommio::spawn_local(async move {
            worker.answer(call).await;
            in_flight.set(in_flight.get() - 1);
        })
        .detach();
    }
    // Closed: let calls already sent (a query's end above all) reach the node.
    let start = std::time::Instant::now();
    while in_flight.get() > 0 && start.elapsed() < CLOSE_GRACE {
        glommio::timer::sleep(Duration::from_millis(1)).await;
    }
}

impl Worker {
    async fn answer(self: &Rc<Self>, call: Call) {
        match call {
            Call::Begin(reply) => {
                let result = self.begin().await;
                if let Ok(q) = &result {
                    self.keep_alive(*q);
                }
                let _ = reply.send(result);
            }
            Call::BeginAndPlan(tables, reply) => {
                let result = calls::begin_and_plan(&self.coordinator, &tables).await;
                if let Ok((q, _)) = &result {
                    self.keep_alive(*q);
                }
                let _ = reply.send(result);
            }
            Call::End(id, reply) => {
                self.live.borrow_mut().remove(&id);
                let _ = reply.send(calls::end(&self.coordinator, id).await);
            }
            Call::Renew(id, reply) => {
                let _ = reply.send(self.renew(id).await);
            }
            Call::Tables(reply) => {
                let _ = reply.send(self.tables().await);
            }
            Call::Plan {
                query,
                table,
                reply,
            } => {
                let _ = reply.send(self.plan(query, &table).await);
            }
            Call::Bitmaps {
                service,
                query,
                file,
                row_groups,
                reply,
            } => {
                let r = self
                    .on_scan(service, |s| {
                        let (query, row_groups) = (&query, &row_groups);
                        async move { calls::bitmaps(&s, query, file, row_groups).await }
                    })
                    .await;
                let _ = reply.send(r);
            }
            Call::FileBitmaps {
                service,
                query,
                files,
                reply,
            } => {
                let r = self
                    .on_scan(service, |s| {
                        let (query, files) = (&query, &files);
                        async move { calls::file_bitmaps(&s, query, files).await }
                    })
                    .await;
                let _ = reply.send(r);
            }
            Call::Buffer {
                service,
                query,
                table,
                known,
                columns,
                reply,
            } => {
                let r = self
                    .on_scan(service, |s| {
                        let (query, known, columns) = (&query, &known, &columns);
                        async move { calls::write_buffer(&s, query, table, known, columns).await }
                    })
                    .await;
                let _ = reply.send(r);
            }
        }
    }

    async fn begin(&self) -> Result<QueryInfo, ClientError> {
        calls::begin(&self.coordinator).await
    }

    async fn renew(&self, id: u64) -> Result<QueryInfo, ClientError> {
        calls::renew(&self.coordinator, id).await
    }

    /// Renews `q`'s lease at a third of its length until the query ends or a renewal fails.
    fn keep_alive(self: &Rc<Self>, q: QueryInfo) {
        if q.lease_ms == 0 {
            return;
        }
        self.live.borrow_mut().insert(q.id);
        let worker = Rc::downgrade(self);
        glommio::spawn_local(async move {
            let every = Duration::from_millis((q.lease_ms / 3).max(1));
            loop {
                glommio::timer::sleep(every).await;
                let Some(w) = worker.upgrade() else { break };
                if w.take_abandoned(q.id) {
                    w.live.borrow_mut().remove(&q.id);
                }
                if !w.live.borrow().contains(&q.id) {
                    break;
                }
                if let Err(e) = w.renew(q.id).await {
                    tracing::warn!("renewing the lease of query {}: {e}", q.id);
                    w.live.borrow_mut().remove(&q.id);
                    break;
                }
            }
        })
        .detach();
    }

    async fn tables(&self) -> Result<Vec<TableInfo>, ClientError> {
        calls::tables(&self.coordinator).await
    }

    /// Whether `query` was dropped without an end queued (forgetting it if so).
    fn take_abandoned(&self, query: u64) -> bool {
        let mut a = self.abandoned.lock().unwrap_or_else(|e| e.into_inner());
        let found = a.iter().position(|&q| q == query);
        found.map(|i| a.swap_remove(i)).is_some()
    }

    async fn plan(&self, query: u64, table: &str) -> Result<ScanPlan, ClientError> {
        calls::plan(&self.coordinator, query, table).await
    }

    /// Calls the scan service at `addr`. A connection that ended (a cluster member that ran
    /// the shard was started again, or its shard moved to a run at the same address) is
    /// dropped, and the call made once more on a new one: the new run knows the running
    /// queries once it caught up with them.
    async fn on_scan<T, F>(
        &self,
        addr: SocketAddr,
        call: impl Fn(scan_service::Client) -> F,
    ) -> Result<T, ClientError>
    where
        F: std::future::Future<Output = Result<T, ClientError>>,
    {
        let r = call(self.scan(addr).await?).await;
        match r {
            Err(e) if e.is_disconnected() => {
                self.scans.borrow_mut().remove(&addr);
                call(self.scan(addr).await?).await
            }
            r => r,
        }
    }

    async fn scan(&self, addr: SocketAddr) -> Result<scan_service::Client, ClientError> {
        if let Some(s) = self.scans.borrow().get(&addr) {
            return Ok(s.clone());
        }
        let s = calls::scan_service(addr, &self.token).await?;
        self.scans.borrow_mut().insert(addr, s.clone());
        Ok(s)
    }
}
