//! Retina's DataFusion connector.
//!
//! A query begins at a node's coordinator, which fixes its snapshot; every table read in the
//! query is read at that snapshot, so a join or a union across tables sees each source
//! transaction whole or not at all. [`RetinaTable`] is a DataFusion `TableProvider` that reads
//! a table with VFoR (visibility filter on read): the plan's Parquet files through DataFusion's
//! own Parquet scan (projection and filter pushdown, statistics pruning, parallel partitions),
//! with row groups created after the snapshot skipped, `_create_ts <= snapshot` applied where a
//! row group straddles the snapshot, and each row group's deleted rows removed by a row
//! selection built from the owner shard's bitmap; then the shards' write buffers.
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
mod output;
mod table;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::MemorySchemaProvider;
use datafusion::error::DataFusionError;
use datafusion::execution::SessionState;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion::sql::parser::Statement;
use futures::Stream;
use object_store::ObjectStore;
use retina_client::{ClientError, Connection, QueryInfo, Refusal, ScanPlan, TableInfo};
use retina_protocol::query::MAX_PLANS_PER_BEGIN;
use retina_storage::Timestamp;

pub use output::{Format, write_batches};
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
    plans: Mutex<HashMap<String, Arc<ScanPlan>>>,
}

impl RunningQuery {
    fn new(conn: Connection, info: QueryInfo) -> RunningQuery {
        RunningQuery {
            conn,
            info,
            plans: Mutex::default(),
        }
    }

    /// `table`'s scan plan at the query's snapshot: the one taken already, or a new one.
    pub(crate) async fn plan(&self, table: &str) -> Result<Arc<ScanPlan>, ClientError> {
        if let Some(plan) = self.plans().get(table) {
            return Ok(plan.clone());
        }
        let plan = Arc::new(self.conn.plan(self.info.id, table).await?);
        self.plans().insert(table.to_owned(), plan.clone());
        Ok(plan)
    }

    fn plans(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<ScanPlan>>> {
        self.plans.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps the plans of `tables` (each name with its plan or refusal, as asked). A refusal
    /// is not kept: the scan asks again and reports it.
    fn keep_plans(&self, tables: Vec<String>, plans: Vec<Result<ScanPlan, ClientError>>) {
        let mut kept = self.plans();
        for (table, plan) in tables.into_iter().zip(plans) {
            if let Ok(plan) = plan {
                kept.insert(table, Arc::new(plan));
            }
        }
    }

    /// Takes the plans of those of `tables` not planned yet, all at once.
    async fn take_plans(&self, mut tables: Vec<String>) {
        tables.retain(|t| !self.plans().contains_key(t));
        let plans =
            futures::future::join_all(tables.iter().map(|t| self.conn.plan(self.info.id, t))).await;
        self.keep_plans(tables, plans);
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
}

impl Retina {
    /// Connects to the coordinator at `addr`, presenting `token` (empty for none).
    pub fn connect(addr: SocketAddr, token: &str) -> Result<Retina, ClientError> {
        Ok(Retina {
            conn: Connection::connect(addr, token)?,
            config: SessionConfig::new().with_information_schema(true),
            runtime: Arc::new(RuntimeEnv::default()),
            tables: Arc::default(),
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
        self.runtime = RuntimeEnvBuilder::new()
            .with_memory_pool(Arc::new(FairSpillPool::new(bytes)))
            .build_arc()?;
        Ok(self)
    }

    /// The DataFusion configuration of the sessions [`Self::begin`] makes.
    pub fn with_config(mut self, config: SessionConfig) -> Retina {
        self.config = config;
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
        self.start(self.context(), visibility, Vec::new()).await
    }

    /// A new session's DataFusion context, its tables not registered yet.
    fn context(&self) -> SessionContext {
        SessionContext::new_with_config_rt(self.config.clone(), self.runtime.clone())
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
    ) -> Result<QuerySession, DataFusionError> {
        let begin = async {
            if plan.is_empty() {
                Ok((self.conn.begin().await?, Vec::new()))
            } else {
                self.conn.begin_and_plan(plan.clone()).await
            }
        };
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
        let (info, plans) = begun.map_err(external)?;
        let query = Arc::new(RunningQuery::new(self.conn.clone(), info));
        query.keep_plans(plan, plans);
        let tables = tables.map_err(external)?;
        for t in tables.iter().cloned() {
            let name = t.schema.name().to_owned();
            // `bank.accounts` is table `accounts` in schema `bank`, as SQL reads it.
            if let Some((schema, _)) = name.split_once('.') {
                let catalog_name = ctx.state().config_options().catalog.default_catalog.clone();
                let catalog = ctx
                    .catalog(&catalog_name)
                    .ok_or_else(|| DataFusionError::Plan(format!("no catalog {catalog_name}")))?;
                if catalog.schema(schema).is_none() {
                    catalog.register_schema(schema, Arc::new(MemorySchemaProvider::new()))?;
                }
            }
            ctx.register_table(
                name.as_str(),
                Arc::new(RetinaTable::new(query.clone(), t, visibility)),
            )?;
        }
        Ok(QuerySession { ctx, query, tables })
    }

    /// Runs one statement in a query of its own; the query ends when the stream is dropped.
    /// The plans of the tables it names come with the begin.
    pub async fn sql(
        &self,
        sql: &str,
    ) -> Result<(Timestamp, SendableRecordBatchStream), DataFusionError> {
        let ctx = self.context();
        let state = ctx.state();
        let statement = parse(&state, sql)?;
        let plan = tables_read(&state, &statement, self.known_tables().as_deref())?;
        let session = self.start(ctx, Visibility::Check, plan).await?;
        let stream = session.run(state, statement).await?;
        Ok((session.snapshot(), stream))
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
        let (_, plan) = futures::join!(
            self.query.take_plans(tables),
            state.statement_to_plan(statement)
        );
        let df = self.ctx.execute_logical_plan(plan?).await?;
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
