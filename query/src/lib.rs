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

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::catalog::MemorySchemaProvider;
use datafusion::error::DataFusionError;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream};
use datafusion::prelude::{SessionConfig, SessionContext};
use futures::Stream;
use object_store::ObjectStore;
use retina_client::{ClientError, Connection, QueryInfo, Refusal, TableInfo};
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
}

impl RunningQuery {
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
        // The first query lists the tables too, in parallel with the begin. The query is held
        // before the tables are looked at: where listing them failed, dropping it ends the
        // query.
        let known = self
            .tables
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (tables, info) = match known {
            Some(tables) => (Ok(tables), self.conn.begin().await),
            None => {
                let (tables, info) = futures::join!(self.conn.tables(), self.conn.begin());
                let tables = tables.map(Arc::<[TableInfo]>::from);
                if let Ok(t) = &tables {
                    *self.tables.lock().unwrap_or_else(|e| e.into_inner()) = Some(t.clone());
                }
                (tables, info)
            }
        };
        let info = info.map_err(external)?;
        let query = Arc::new(RunningQuery {
            conn: self.conn.clone(),
            info,
        });
        let tables = tables.map_err(external)?;
        let ctx = SessionContext::new_with_config_rt(self.config.clone(), self.runtime.clone());
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
        Ok(QuerySession { ctx, query })
    }

    /// Runs one statement in a query of its own; the query ends when the stream is dropped.
    pub async fn sql(
        &self,
        sql: &str,
    ) -> Result<(Timestamp, SendableRecordBatchStream), DataFusionError> {
        let session = self.begin().await?;
        let stream = session.sql(sql).await?;
        Ok((session.snapshot(), stream))
    }
}

/// A DataFusion session whose tables are read at one snapshot.
pub struct QuerySession {
    ctx: SessionContext,
    query: Arc<RunningQuery>,
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
        let df = self.ctx.sql(sql).await?;
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
