//! Retina's DataFusion connector.
//!
//! A query begins at a node's coordinator, which fixes its snapshot; every table read in the
//! query is read at that snapshot, so a join or a union across tables sees each source
//! transaction whole or not at all. [`RetinaTable`] is a DataFusion `TableProvider` that reads
//! a table with VFoR (visibility filter on read): the plan's Parquet files through DataFusion's
//! own Parquet scan (projection and filter pushdown, statistics pruning, parallel partitions),
//! with row groups created after the snapshot skipped, `_create_ts <= snapshot` applied where a
//! row group straddles the snapshot, and each row group's deleted rows masked out as the
//! Parquet reader decodes it, by the owner shard's bitmap; then the shards' write buffers.
//!
//! The query ends when the last thing that can read it is dropped: the [`QuerySession`] and
//! every stream it returned. Until then the connection renews its lease; a client that dies
//! leaves a lease that runs out.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use futures::TryStreamExt;
//! let retina = retina_query::Retina::connect("127.0.0.1:7400".parse()?, "")?;
//! let (snapshot, stream) = retina.sql("SELECT count(*) FROM orderline").await?;
//! let batches: Vec<_> = stream.try_collect().await?;
//! # Ok(()) }
//! ```

mod live;
mod masked;
mod output;
mod parts;
mod table;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::{
    CatalogProvider, CatalogProviderList, MemoryCatalogProvider, MemoryCatalogProviderList,
    MemorySchemaProvider,
};
use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement;
use datafusion::sql::sqlparser::ast::{Expr, Select, SelectItem};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, Stream};
use object_store::ObjectStore;
use retina_client::{ClientError, Connection, QueryInfo, Refusal, ScanPlan, TableInfo};
use retina_protocol::query::MAX_PLANS_PER_BEGIN;
use retina_storage::Timestamp;

pub use output::{Format, write_batches};
use table::ScanInputs;
pub use table::{RetinaTable, Visibility, user_schema};

/// An S3 client of `bucket` as a reader of a node's lake builds it: the standard AWS
/// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT` or
/// `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, ...), then `options` (`object_store`'s
/// `AmazonS3ConfigKey` names, e.g. `aws_endpoint`), retrying throttling, 5xx and connection
/// errors with backoff. A scan registers one from the environment alone for a lake on S3
/// unless the session's runtime already has a store for that bucket; register this one there
/// (`SessionContext::register_object_store`) to read with other settings.
pub fn s3_store(
    bucket: &str,
    options: &[(String, String)],
) -> Result<object_store::aws::AmazonS3, String> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
    use std::time::Duration;
    let retry = object_store::RetryConfig {
        backoff: object_store::BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: Duration::from_secs(120),
    };
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(retry);
    for (k, v) in options {
        let key: AmazonS3ConfigKey = k.parse().map_err(|_| format!("unknown S3 setting `{k}`"))?;
        builder = builder.with_config(key, v);
    }
    builder
        .build()
        .map_err(|e| format!("the S3 client of bucket `{bucket}`: {e}"))
}

/// A query begun at the coordinator and not yet ended: its id, snapshot and secret. The
/// connection renews its lease while it runs; dropping it ends the query.
pub struct RunningQuery {
    conn: Connection,
    info: QueryInfo,
    /// Scan plans taken before the tables were scanned (with the begin, or while a statement
    /// was planned), by table name. A table's plan serves every scan of it in the query: all
    /// are at the query's snapshot, and a file combined after the plan was made comes back
    /// from the write buffers.
    plans: Mutex<HashMap<String, Planned>>,
    /// Whether a plan taken early has the shards asked for the scan's inputs at once (when
    /// the visibility is checked).
    prefetch: bool,
}

/// A table's scan plan taken early, and the scan's inputs asked for with it.
struct Planned {
    plan: Arc<ScanPlan>,
    inputs: Option<Early>,
}

/// A scan's inputs asked of the shards before DataFusion knew which columns the scan reads:
/// the columns asked for (every column the statement may read from the table), and the
/// answer, from a task of its own: none where a call failed (the scan asks again, and reports
/// the error).
#[derive(Clone)]
pub(crate) struct Early {
    pub columns: Arc<[usize]>,
    pub inputs: Shared<BoxFuture<'static, Option<Arc<ScanInputs>>>>,
}

/// A query being begun while DataFusion plans a statement.
type Beginning = Shared<BoxFuture<'static, Result<Arc<RunningQuery>, Arc<DataFusionError>>>>;

/// A query as its tables see it: begun, or beginning.
#[derive(Clone)]
pub(crate) enum QueryRef {
    Begun(Arc<RunningQuery>),
    Beginning(Beginning),
}

impl QueryRef {
    /// The query, once begun.
    pub(crate) async fn get(&self) -> Result<Arc<RunningQuery>, DataFusionError> {
        match self {
            QueryRef::Begun(q) => Ok(q.clone()),
            QueryRef::Beginning(b) => b.clone().await.map_err(DataFusionError::Shared),
        }
    }
}

impl std::fmt::Debug for QueryRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QueryRef::Begun(q) => q.fmt(f),
            QueryRef::Beginning(_) => f.write_str("a query beginning"),
        }
    }
}

impl RunningQuery {
    fn new(conn: Connection, info: QueryInfo, visibility: Visibility) -> RunningQuery {
        RunningQuery {
            conn,
            info,
            plans: Mutex::default(),
            prefetch: visibility == Visibility::Check,
        }
    }

    /// `table`'s scan plan at the query's snapshot (the one taken already, or a new one), and
    /// the scan's inputs if they were asked for with it.
    pub(crate) async fn plan(
        &self,
        table: &str,
    ) -> Result<(Arc<ScanPlan>, Option<Early>), ClientError> {
        if let Some(p) = self.plans().get(table) {
            return Ok((p.plan.clone(), p.inputs.clone()));
        }
        let plan = Arc::new(self.conn.plan(self.info.id, table).await?);
        let planned = Planned {
            plan: plan.clone(),
            inputs: None,
        };
        self.plans().insert(table.to_owned(), planned);
        Ok((plan, None))
    }

    fn plans(&self) -> std::sync::MutexGuard<'_, HashMap<String, Planned>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the plans of `tables` (each name with its plan or refusal, as asked), and asks
    /// the shards for each scan's inputs in the columns `named` says the statement may read,
    /// while DataFusion plans it. A refusal is not kept: the scan asks again and reports it.
    fn keep_plans(
        &self,
        tables: Vec<String>,
        plans: Vec<Result<ScanPlan, ClientError>>,
        named: Option<&Named>,
    ) {
        let planned: Vec<(String, Planned)> = tables
            .into_iter()
            .zip(plans)
            .filter_map(|(table, plan)| {
                let plan = Arc::new(plan.ok()?);
                let inputs = named.and_then(|n| self.fetch_inputs(&plan, n));
                Some((table, Planned { plan, inputs }))
            })
            .collect();
        self.plans().extend(planned);
    }

    /// Asks the shards for the inputs of a scan of `plan` in the columns `named` says the
    /// statement may read, in a task on this tokio runtime (none outside one).
    fn fetch_inputs(&self, plan: &Arc<ScanPlan>, named: &Named) -> Option<Early> {
        if !self.prefetch {
            return None;
        }
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let columns: Arc<[usize]> = named.columns(&plan.table).into();
        let asked: Vec<u16> = columns.iter().map(|&c| c as u16).collect();
        let (conn, info, plan) = (self.conn.clone(), self.info, plan.clone());
        let task = runtime.spawn(async move {
            let inputs = table::scan_inputs(&conn, info, &plan, true, asked).await;
            inputs.ok().map(Arc::new)
        });
        let inputs = async move { task.await.ok().flatten() }.boxed().shared();
        Some(Early { columns, inputs })
    }

    /// Takes the plans of those of `tables` not planned yet, all at once.
    async fn take_plans(&self, mut tables: Vec<String>, named: Option<&Named>) {
        tables.retain(|t| !self.plans().contains_key(t));
        let plans =
            futures::future::join_all(tables.iter().map(|t| self.conn.plan(self.info.id, t))).await;
        self.keep_plans(tables, plans, named);
    }

    /// The snapshot every table of the query is read at.
    pub fn snapshot(&self) -> Timestamp {
        self.info.snapshot
    }

    pub fn id(&self) -> u64 {
        self.info.id
    }

    /// The query as the scan services are shown it.
    pub fn info(&self) -> QueryInfo {
        self.info
    }
}

impl std::fmt::Debug for RunningQuery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningQuery")
            .field("query", &self.info.id)
            .field("snapshot", &self.info.snapshot)
            .finish()
    }
}

impl Drop for RunningQuery {
    fn drop(&mut self) {
        self.conn.end_detached(self.info.id);
    }
}

/// A connection to a Retina node for DataFusion queries.
#[derive(Clone)]
pub struct Retina {
    conn: Connection,
    config: SessionConfig,
    /// The runtime every session shares: its object stores (the lake's S3 client, once a
    /// scan registered it) live as long as the connection.
    runtime: Arc<RuntimeEnv>,
    /// The node's tables, asked for with the first query: a node's tables are its DDL's, fixed
    /// while it runs, and a connection talks to one node (or cluster, whose members share the
    /// DDL) for as long as it lives.
    tables: Arc<Mutex<Option<Arc<[TableInfo]>>>>,
    /// The state every session's context starts from, built once for this configuration and
    /// runtime (see [`Self::context`]).
    template: Arc<std::sync::OnceLock<SessionState>>,
}

impl Retina {
    /// Connects to the coordinator at `addr`, presenting `token` (empty for none).
    pub fn connect(addr: SocketAddr, token: &str) -> Result<Retina, ClientError> {
        Ok(Retina {
            conn: Connection::connect(addr, token)?,
            config: SessionConfig::new().with_information_schema(true),
            runtime: Arc::new(RuntimeEnv::default()),
            tables: Arc::default(),
            template: Arc::default(),
        })
    }

    /// Reads the lake at `url` (`s3://BUCKET`) through `store` rather than an S3 client built
    /// from this process's environment (see [`s3_store`]).
    pub fn with_object_store(self, url: &url::Url, store: Arc<dyn ObjectStore>) -> Retina {
        self.runtime.register_object_store(url, store);
        self
    }

    /// Caps the memory the operators of every session of this connection take together:
    /// sorts, joins and aggregates spill to temporary files beyond it, or fail. Call it
    /// before [`Self::with_object_store`].
    pub fn with_memory_limit(mut self, bytes: usize) -> Result<Retina, DataFusionError> {
        use datafusion::execution::memory_pool::FairSpillPool;
        use datafusion::execution::runtime_env::RuntimeEnvBuilder;
        self.template = Arc::default();
        self.runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(bytes)))
            .build_arc()?;
        Ok(self)
    }

    /// The DataFusion configuration of the sessions [`Self::begin`] makes.
    pub fn with_config(mut self, config: SessionConfig) -> Retina {
        self.config = config;
        self.template = Arc::default();
        self
    }

    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Begins a query: a DataFusion session with every table of the node registered, all at
    /// one snapshot.
    pub async fn begin(&self) -> Result<QuerySession, DataFusionError> {
        self.begin_with(Visibility::Check).await
    }

    /// [`Self::begin`] with the visibility check as given (turning it off is only for
    /// measuring what it costs).
    pub async fn begin_with(
        &self,
        visibility: Visibility,
    ) -> Result<QuerySession, DataFusionError> {
        self.start(self.context(), visibility, Vec::new(), None)
            .await
    }

    /// A new session's DataFusion context, its tables not registered yet: a copy of a state
    /// built once (building one registers every built-in function again, about 130 µs of each
    /// query in `retina bench overhead`), with catalogs of its own, so that no session sees
    /// another's tables, which are bound to that session's snapshot.
    fn context(&self) -> SessionContext {
        let mut state = self
            .template
            .get_or_init(|| {
                SessionContext::new_with_config_rt(self.config.clone(), self.runtime.clone())
                    .state()
            })
            .clone();
        let catalogs = Arc::new(MemoryCatalogProviderList::new());
        let options = &state.config().options().catalog;
        if options.create_default_catalog_and_schema {
            let catalog = MemoryCatalogProvider::new();
            catalog
                .register_schema(
                    &options.default_schema,
                    Arc::new(MemorySchemaProvider::new()),
                )
                .expect("a new catalog takes a schema");
            catalogs.register_catalog(options.default_catalog.clone(), Arc::new(catalog));
        }
        state.register_catalog_list(catalogs);
        SessionContext::new_with_state(state)
    }

    /// The node's tables, if a query listed them already.
    fn known_tables(&self) -> Option<Arc<[TableInfo]>> {
        self.tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Begins a query, with the scan plans of `plan` taken in the same round trip, and
    /// registers every table of the node in `ctx` at its snapshot.
    async fn start(
        &self,
        ctx: SessionContext,
        visibility: Visibility,
        plan: Vec<String>,
        named: Option<&Named>,
    ) -> Result<QuerySession, DataFusionError> {
        let begin = begin_query(self.conn.clone(), plan, named, visibility);
        // The first query lists the tables too, in parallel with the begin. The query is held
        // before the tables are looked at: where listing them failed, dropping it ends the
        // query.
        let (tables, begun) = match self.known_tables() {
            Some(tables) => (Ok(tables), begin.await),
            None => {
                let (tables, begun) = futures::join!(self.conn.tables(), begin);
                let tables = tables.map(Arc::<[TableInfo]>::from);
                if let Ok(t) = &tables {
                    *self.tables.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.clone());
                }
                (tables, begun)
            }
        };
        let query = begun.map_err(external)?;
        let tables = tables.map_err(external)?;
        register_tables(&ctx, &tables, &QueryRef::Begun(query.clone()), visibility)?;
        Ok(QuerySession { ctx, query, tables })
    }

    /// Begins a query with the scan plans of `plan`, in a task on this tokio runtime (none
    /// outside one), so that DataFusion plans the statement meanwhile; the scans' inputs are
    /// asked for as soon as the plans come.
    fn begin_in_task(&self, plan: Vec<String>, named: Option<Named>) -> Option<Beginning> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let conn = self.conn.clone();
        let task = runtime
            .spawn(async move { begin_query(conn, plan, named.as_ref(), Visibility::Check).await });
        let begun = async move {
            match task.await {
                Ok(begun) => begun.map_err(|e| Arc::new(external(e))),
                Err(e) => Err(Arc::new(DataFusionError::External(Box::new(e)))),
            }
        };
        Some(begun.boxed().shared())
    }

    /// Runs one statement in a query of its own; the query ends when the stream is dropped.
    /// The plans of the tables it names come with the begin. Once the node's tables are known
    /// (from this connection's first query on), the begin goes out while DataFusion plans
    /// the statement.
    pub async fn sql(
        &self,
        sql: &str,
    ) -> Result<(Timestamp, SendableRecordBatchStream), DataFusionError> {
        let ctx = self.context();
        let (statement, plan) = {
            let state = ctx.state();
            let statement = parse(&state, sql)?;
            let plan = tables_read(&state, &statement, self.known_tables().as_deref())?;
            (statement, plan)
        };
        let named = Named::of(&statement);
        // Where the node's tables are known, the query begins while DataFusion plans the
        // statement: the scans wait for the begin (and their inputs) only once planned.
        if let Some(tables) = self.known_tables()
            && let Some(beginning) = self.begin_in_task(plan.clone(), named.clone())
        {
            let query = QueryRef::Beginning(beginning.clone());
            register_tables(&ctx, &tables, &query, Visibility::Check)?;
            let stream = async {
                let logical = ctx.state().statement_to_plan(statement).await?;
                ctx.execute_logical_plan(logical)
                    .await?
                    .execute_stream()
                    .await
            }
            .await;
            // Begun by now, unless no scan was planned (an empty relation). A begin the node
            // refused is the error as the node gave it, rather than as a scan saw it, once the
            // tables that shared it are gone.
            drop((ctx, query));
            let query = match beginning.await {
                Ok(q) => q,
                Err(e) => {
                    drop(stream);
                    return Err(Arc::try_unwrap(e).unwrap_or_else(DataFusionError::Shared));
                }
            };
            let stream = Box::pin(HoldingStream {
                inner: stream?,
                _query: query.clone(),
            });
            return Ok((query.snapshot(), stream));
        }
        let session = self
            .start(ctx, Visibility::Check, plan, named.as_ref())
            .await?;
        // Every table it names was planned with the begin; planned with the tables registered.
        let plan = session.ctx.state().statement_to_plan(statement).await?;
        let stream = session.execute(plan).await?;
        Ok((session.snapshot(), stream))
    }
}

/// Begins a query on `conn`, with the scan plans of `plan` taken in the same round trip and
/// kept (the scans' inputs asked for at once, in the columns `named` says).
async fn begin_query(
    conn: Connection,
    plan: Vec<String>,
    named: Option<&Named>,
    visibility: Visibility,
) -> Result<Arc<RunningQuery>, ClientError> {
    let (info, plans) = if plan.is_empty() {
        (conn.begin().await?, Vec::new())
    } else {
        conn.begin_and_plan(plan.clone()).await?
    };
    let query = Arc::new(RunningQuery::new(conn, info, visibility));
    query.keep_plans(plan, plans, named);
    Ok(query)
}

/// Registers each of `tables` in `ctx`, read in `query`.
fn register_tables(
    ctx: &SessionContext,
    tables: &[TableInfo],
    query: &QueryRef,
    visibility: Visibility,
) -> Result<(), DataFusionError> {
    let catalog_name = ctx
        .state_ref()
        .read()
        .config_options()
        .catalog
        .default_catalog
        .clone();
    for t in tables.iter().cloned() {
        let name = t.schema.name().to_owned();
        // `bank.accounts` is table `accounts` in schema `bank`, as SQL reads it.
        if let Some((schema, _)) = name.split_once('.') {
            let catalog = ctx
                .catalog(&catalog_name)
                .ok_or_else(|| DataFusionError::Plan(format!("no catalog {catalog_name}")))?;
            if catalog.schema(schema).is_none() {
                catalog.register_schema(schema, Arc::new(MemorySchemaProvider::new()))?;
            }
        }
        ctx.register_table(
            name.as_str(),
            Arc::new(RetinaTable::of(query.clone(), t, visibility)),
        )?;
    }
    Ok(())
}

/// The column names a statement may read: every identifier in its expressions (the last part
/// of a compound one), lowercased; or every column, where it selects a wildcard. A superset of
/// what the optimizer will find each scan reads, found before it runs (a scan checks that it
/// is one, and asks again where it is not: a `NATURAL JOIN` or `USING` names no column).
#[derive(Clone)]
pub(crate) struct Named {
    every: bool,
    names: std::collections::HashSet<String>,
}

impl Named {
    /// None for a statement that is not a query or DML of SQL's own (`EXPLAIN`, `COPY`).
    fn of(statement: &Statement) -> Option<Named> {
        use datafusion::sql::sqlparser::ast::Visit;
        let Statement::Statement(statement) = statement else {
            return None;
        };
        let mut named = Named {
            every: false,
            names: Default::default(),
        };
        let _ = statement.visit(&mut named);
        Some(named)
    }

    /// The columns of `table` the statement may read; at least one (a scan that reads no
    /// column still counts rows).
    fn columns(&self, table: &TableInfo) -> Vec<usize> {
        let columns = table.schema.columns();
        let named: Vec<usize> = (0..columns.len())
            .filter(|&i| self.every || self.names.contains(&columns[i].name.to_lowercase()))
            .collect();
        if named.is_empty() && !columns.is_empty() {
            return vec![0];
        }
        named
    }
}

/// Collects what [`Named`] holds while walking a statement.
impl datafusion::sql::sqlparser::ast::Visitor for Named {
    type Break = ();
    fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
        let ident = match expr {
            Expr::Identifier(i) => Some(i),
            Expr::CompoundIdentifier(parts) => parts.last(),
            _ => None,
        };
        if let Some(i) = ident {
            self.names.insert(i.value.to_lowercase());
        }
        ControlFlow::Continue(())
    }
    fn pre_visit_select(&mut self, select: &Select) -> ControlFlow<()> {
        self.every |= select.projection.iter().any(|item| {
            matches!(
                item,
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
            )
        });
        ControlFlow::Continue(())
    }
}

/// `sql` as one statement, in the session's dialect.
fn parse(state: &SessionState, sql: &str) -> Result<Statement, DataFusionError> {
    let dialect = state.config().options().sql_parser.dialect;
    state.sql_to_statement(sql, &dialect)
}

/// The names of the node's tables `statement` reads (of `known`, where the node's tables are
/// known), at most as many as one begin may plan.
fn tables_read(
    state: &SessionState,
    statement: &Statement,
    known: Option<&[TableInfo]>,
) -> Result<Vec<String>, DataFusionError> {
    let options = state.config().options();
    let (catalog, schema) = (
        options.catalog.default_catalog.as_str(),
        options.catalog.default_schema.as_str(),
    );
    let mut names: Vec<String> = Vec::new();
    for reference in state.resolve_table_references(statement)? {
        let r = reference.resolve(catalog, schema);
        if *r.catalog != *catalog {
            continue;
        }
        let name = if *r.schema == *schema {
            r.table.to_string()
        } else {
            format!("{}.{}", r.schema, r.table)
        };
        let is_table = known.is_none_or(|k| k.iter().any(|t| t.schema.name() == name));
        if is_table && !names.contains(&name) {
            names.push(name);
        }
    }
    names.truncate(MAX_PLANS_PER_BEGIN as usize);
    Ok(names)
}

/// A DataFusion session whose tables are read at one snapshot.
pub struct QuerySession {
    ctx: SessionContext,
    query: Arc<RunningQuery>,
    /// The node's tables.
    tables: Arc<[TableInfo]>,
}

impl QuerySession {
    pub fn context(&self) -> &SessionContext {
        &self.ctx
    }

    pub fn snapshot(&self) -> Timestamp {
        self.query.snapshot()
    }

    pub fn query_id(&self) -> u64 {
        self.query.id()
    }

    /// The query as the scan services are shown it.
    pub fn info(&self) -> QueryInfo {
        self.query.info()
    }

    /// Plans and starts `sql`. The stream keeps the query running until it is dropped.
    pub async fn sql(&self, sql: &str) -> Result<SendableRecordBatchStream, DataFusionError> {
        let state = self.ctx.state();
        let statement = parse(&state, sql)?;
        self.run(state, statement).await
    }

    /// Plans and starts `statement`, taking the scan plans of the tables it reads while
    /// DataFusion plans it.
    async fn run(
        &self,
        state: SessionState,
        statement: Statement,
    ) -> Result<SendableRecordBatchStream, DataFusionError> {
        let tables = tables_read(&state, &statement, Some(&self.tables))?;
        let named = Named::of(&statement);
        let (_, plan) = futures::join!(
            self.query.take_plans(tables, named.as_ref()),
            state.statement_to_plan(statement)
        );
        self.execute(plan?).await
    }

    /// Starts a statement's logical plan (its tables' plans taken already, or by its scans).
    async fn execute(
        &self,
        plan: LogicalPlan,
    ) -> Result<SendableRecordBatchStream, DataFusionError> {
        let df = self.ctx.execute_logical_plan(plan).await?;
        let stream = df.execute_stream().await?;
        Ok(Box::pin(HoldingStream {
            inner: stream,
            _query: self.query.clone(),
        }))
    }

    /// Runs `sql` and collects its result.
    pub async fn collect(&self, sql: &str) -> Result<Vec<RecordBatch>, DataFusionError> {
        use futures::TryStreamExt;
        self.sql(sql).await?.try_collect().await
    }
}

/// A stream that keeps its query running.
struct HoldingStream {
    inner: SendableRecordBatchStream,
    _query: Arc<RunningQuery>,
}

impl Stream for HoldingStream {
    type Item = Result<RecordBatch, DataFusionError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl RecordBatchStream for HoldingStream {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

pub(crate) fn external(e: ClientError) -> DataFusionError {
    DataFusionError::External(Box::new(e))
}

/// The node's typed refusal behind a DataFusion error, if that is what it is.
pub fn refusal(e: &DataFusionError) -> Option<&Refusal> {
    let mut current: &(dyn std::error::Error + 'static) = e;
    loop {
        if let Some(ClientError::Refused(r)) = current.downcast_ref::<ClientError>() {
            return Some(r);
        }
        if let Some(DataFusionError::External(inner)) = current.downcast_ref::<DataFusionError>() {
            current = inner.as_ref();
            continue;
        }
        current = current.source()?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retina_storage::{ColumnDef, ColumnType, TableSchema};

    #[test]
    fn a_statement_names_the_columns_it_may_read() {
        let state = SessionContext::new().state();
        let column = |n: &str| ColumnDef::new(n, ColumnType::Int64, false);
        let table = TableInfo {
            id: 0,
            schema: TableSchema::new(
                "bank.ledger",
                vec![column("n"), column("src"), column("dst"), column("amount")],
                &["n"],
            )
            .unwrap(),
        };
        let columns = |sql: &str| {
            let statement = parse(&state, sql).unwrap();
            Named::of(&statement).map(|n| n.columns(&table))
        };
        assert_eq!(
            columns("SELECT sum(l.Amount) FROM bank.ledger l WHERE l.src > 3"),
            Some(vec![1, 3]),
            "compound names, any case"
        );
        assert_eq!(
            columns("SELECT n FROM bank.ledger WHERE n IN (SELECT dst FROM bank.ledger)"),
            Some(vec![0, 2]),
            "in subqueries too"
        );
        assert_eq!(
            columns("SELECT count(*) FROM bank.ledger"),
            Some(vec![0]),
            "a row count reads one column"
        );
        assert_eq!(
            columns("SELECT * FROM (SELECT n FROM bank.ledger) t, bank.ledger"),
            Some(vec![0, 1, 2, 3]),
            "a wildcard reads every column"
        );
        // Columns a join matches on without naming them are not found: the scan sees that
        // it reads a column not asked for, and asks again.
        assert_eq!(
            columns("SELECT a.n FROM bank.ledger a JOIN bank.ledger b USING (amount)"),
            Some(vec![0])
        );
        assert_eq!(columns("EXPLAIN SELECT n FROM bank.ledger"), None);
    }
}
