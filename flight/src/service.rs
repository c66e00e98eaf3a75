//! The Flight service: path descriptors and SQL text read at one snapshot, Retina's own
//! tickets; Flight SQL's commands go to [`SqlService`].

use std::pin::Pin;
use std::sync::Arc;

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::flight_descriptor::DescriptorType;
use arrow_flight::flight_service_server::FlightService;
use arrow_flight::sql::{Any, ProstMessageExt, TicketStatementQuery};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo,
    HandshakeRequest, HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::common::TableReference;
use datafusion::execution::SendableRecordBatchStream;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use futures::future::try_join_all;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use prost::Message;
use retina_client::{ClientError, TableInfo};
use retina_query::{QuerySession, Retina, user_schema};
use serde_json::json;
use tonic::{Request, Response, Status, Streaming};

use crate::queries::Endpoint;
use crate::sql::SqlService;
use crate::ticket::QueryTicket;
use crate::{Shared, idle_limit, names, status};

pub(crate) type DataStream =
    Pin<Box<dyn futures::Stream<Item = Result<FlightData, Status>> + Send>>;

/// The type URLs of Flight SQL's messages start so.
const FLIGHT_SQL_TYPE: &str = "type.googleapis.com/arrow.flight.protocol.sql.";

pub(crate) struct Service {
    shared: Arc<Shared>,
    sql: SqlService,
}

impl Service {
    pub fn new(shared: Arc<Shared>) -> Service {
        Service {
            sql: SqlService::new(shared.clone()),
            shared,
        }
    }
}

/// A Flight SQL message, if `bytes` is one.
fn flight_sql_message(bytes: &[u8]) -> bool {
    Any::decode(bytes).is_ok_and(|any| any.type_url.starts_with(FLIGHT_SQL_TYPE))
}

/// A schema that could not be encoded.
pub(crate) fn schema_status(e: datafusion::arrow::error::ArrowError) -> Status {
    Status::internal(format!("encoding the schema: {e}"))
}

/// SQL text from a command descriptor.
fn sql_text(cmd: &[u8]) -> Result<&str, Status> {
    std::str::from_utf8(cmd).map_err(|_| {
        Status::invalid_argument(
            "a command descriptor carries SQL text (UTF-8) or a Flight SQL command",
        )
    })
}

impl Shared {
    /// The tables a path descriptor names, in its order (see `names`).
    async fn path_tables(&self, path: &[String]) -> Result<Vec<TableInfo>, Status> {
        let tables = self.tables().await?;
        let all: Vec<String> = tables.iter().map(|t| t.schema.name().to_owned()).collect();
        let wanted = names::resolve(path, &all)?;
        Ok(wanted
            .iter()
            .map(|name| tables[all.iter().position(|t| t == name).expect("resolved")].clone())
            .collect())
    }

    /// Begins a query and plans a read of every table `path` names: one endpoint per
    /// partition of each table's scan, every ticket of the one query.
    pub(crate) async fn tables_info(
        &self,
        descriptor: FlightDescriptor,
    ) -> Result<FlightInfo, Status> {
        let wanted = self.path_tables(&descriptor.path).await?;
        let (retina, session) = self.begin().await?;
        let mut endpoints = Vec::new();
        let mut schemas: Vec<SchemaRef> = Vec::new();
        let mut rows = 0i64;
        for table in &wanted {
            let name = table.schema.name();
            let plan = scan(&session, name).await?;
            for partition in 0..plan.properties().output_partitioning().partition_count() {
                endpoints.push(Endpoint {
                    table: Some(name.to_owned()),
                    plan: plan.clone(),
                    partition,
                });
            }
            schemas.push(user_schema(table));
            rows += estimate_rows(&retina, &session, table)
                .await
                .map_err(crate::client_status)? as i64;
        }
        let schema = match schemas.as_slice() {
            [first, rest @ ..] if rest.iter().all(|s| s == first) => first.clone(),
            _ => Arc::new(Schema::empty()),
        };
        self.info(session, endpoints, &schema, descriptor, rows, false)
    }

    /// Begins a query and plans `sql` in it: one endpoint. `flight_sql`: the ticket is Flight
    /// SQL's `TicketStatementQuery`.
    pub(crate) async fn sql_info(
        &self,
        sql: &str,
        descriptor: FlightDescriptor,
        flight_sql: bool,
    ) -> Result<FlightInfo, Status> {
        let (_, session) = self.begin().await?;
        let plan = plan_sql(&session, sql).await?;
        let schema = plan.schema();
        let endpoints = vec![Endpoint {
            table: None,
            plan,
            partition: 0,
        }];
        self.info(session, endpoints, &schema, descriptor, -1, flight_sql)
    }

    fn info(
        &self,
        session: QuerySession,
        endpoints: Vec<Endpoint>,
        schema: &Schema,
        descriptor: FlightDescriptor,
        rows: i64,
        flight_sql: bool,
    ) -> Result<FlightInfo, Status> {
        let snapshot = session.snapshot().get();
        let idle = idle_limit(&session);
        let mut tables: Vec<String> = Vec::new();
        for e in &endpoints {
            if let Some(t) = &e.table
                && !tables.contains(t)
            {
                tables.push(t.clone());
            }
        }
        let described: Vec<(Option<String>, usize)> = endpoints
            .iter()
            .map(|e| (e.table.clone(), e.partition))
            .collect();
        let ordered = endpoints.len() == 1;
        let query = self.queries.add(session, endpoints, idle)?;
        let meta = json!({"query": query.id, "snapshot": snapshot, "tables": tables});
        let mut info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(schema_status)?
            .with_descriptor(descriptor)
            .with_total_records(rows)
            .with_ordered(ordered)
            .with_app_metadata(meta.to_string().into_bytes());
        for (n, (table, partition)) in described.into_iter().enumerate() {
            let ticket = query.ticket(n).encode();
            let ticket = if flight_sql {
                TicketStatementQuery {
                    statement_handle: ticket,
                }
                .as_any()
                .encode_to_vec()
                .into()
            } else {
                ticket
            };
            let meta = json!({
                "query": query.id,
                "snapshot": snapshot,
                "table": table,
                "partition": partition,
            });
            info = info.with_endpoint(
                FlightEndpoint::new()
                    .with_ticket(Ticket::new(ticket))
                    .with_app_metadata(meta.to_string().into_bytes()),
            );
        }
        Ok(info)
    }

    /// Streams the endpoint `ticket` names.
    pub(crate) fn read(&self, ticket: &QueryTicket) -> Result<DataStream, Status> {
        let (_query, stream, open) = self.queries.open(ticket)?;
        Ok(encode(stream, open))
    }

    /// `ListFlights`: every table, described at one snapshot.
    async fn list(&self) -> Result<Vec<FlightInfo>, Status> {
        let tables = self.tables().await?;
        let (retina, session) = self.begin().await?;
        let rows = try_join_all(tables.iter().map(|t| estimate_rows(&retina, &session, t)))
            .await
            .map_err(crate::client_status)?;
        tables
            .iter()
            .zip(rows)
            .map(|(t, rows)| {
                let name = t.schema.name().to_owned();
                Ok(FlightInfo::new()
                    .try_with_schema(&user_schema(t))
                    .map_err(schema_status)?
                    .with_descriptor(FlightDescriptor::new_path(vec![name]))
                    .with_total_records(rows as i64)
                    .with_app_metadata(
                        json!({"snapshot": session.snapshot().get()})
                            .to_string()
                            .into_bytes(),
                    ))
            })
            .collect()
    }

    /// The schema a descriptor reads: one table's, or a statement's.
    async fn schema_of(&self, descriptor: &FlightDescriptor) -> Result<SchemaRef, Status> {
        if descriptor.r#type() == DescriptorType::Path {
            let wanted = self.path_tables(&descriptor.path).await?;
            let [one] = wanted.as_slice() else {
                return Err(Status::invalid_argument(format!(
                    "GetSchema describes one table; the path names {}",
                    wanted.len()
                )));
            };
            return Ok(user_schema(one));
        }
        self.sql_schema(sql_text(&descriptor.cmd)?).await
    }

    /// The columns `sql` returns, planned at the current snapshot.
    pub(crate) async fn sql_schema(&self, sql: &str) -> Result<SchemaRef, Status> {
        let (_, session) = self.begin().await?;
        let df = session
            .context()
            .sql_with_options(sql, select_only())
            .await
            .map_err(|e| statement_status(sql, e))?;
        Ok(Arc::new(df.schema().as_arrow().clone()))
    }
}

/// The scan of one table in `session`, every partition of it.
async fn scan(session: &QuerySession, name: &str) -> Result<Arc<dyn ExecutionPlan>, Status> {
    let (schema, table) = names::split(name);
    let provider = session
        .context()
        .table_provider(TableReference::partial(schema, table))
        .await
        .map_err(status)?;
    let state = session.context().state();
    provider.scan(&state, None, &[], None).await.map_err(status)
}

/// What SQL a Flight client may run: queries only.
pub(crate) fn select_only() -> datafusion::execution::context::SQLOptions {
    datafusion::execution::context::SQLOptions::new()
        .with_allow_ddl(false)
        .with_allow_dml(false)
        .with_allow_statements(false)
}

/// A statement's planning error, with what it means for a read-only service.
pub(crate) fn statement_status(sql: &str, e: datafusion::error::DataFusionError) -> Status {
    let message = e.to_string();
    if [
        "DDL not supported",
        "DML not supported",
        "Statement not supported",
    ]
    .iter()
    .any(|m| message.contains(m))
    {
        return Status::invalid_argument(format!(
            "Retina serves SELECT only: its tables change through the source alone \
             (`{}`: {message})",
            sql.chars().take(80).collect::<String>()
        ));
    }
    status(e)
}

/// `sql`'s physical plan in `session`, as one partition.
pub(crate) async fn plan_sql(
    session: &QuerySession,
    sql: &str,
) -> Result<Arc<dyn ExecutionPlan>, Status> {
    let df = session
        .context()
        .sql_with_options(sql, select_only())
        .await
        .map_err(|e| statement_status(sql, e))?;
    let plan = df.create_physical_plan().await.map_err(status)?;
    Ok(
        if plan.properties().output_partitioning().partition_count() > 1 {
            Arc::new(CoalescePartitionsExec::new(plan))
        } else {
            plan
        },
    )
}

/// The rows a table holds at the session's snapshot, deleted ones included: its files' row
/// groups created by then, and its write buffers' parts.
async fn estimate_rows(
    retina: &Retina,
    session: &QuerySession,
    table: &TableInfo,
) -> Result<u64, ClientError> {
    let conn = retina.connection();
    let plan = conn.plan(session.query_id(), table.schema.name()).await?;
    let snapshot = plan.snapshot.get();
    let stored: u64 = plan
        .files
        .iter()
        .flat_map(|f| &f.row_groups)
        .filter(|g| g.min_create_ts <= snapshot)
        .map(|g| g.rows)
        .sum();
    let known: Vec<u64> = plan.files.iter().map(|f| f.file).collect();
    // One column is enough to count the rows of the memory parts.
    let parts = try_join_all(plan.buffers.iter().map(|&service| {
        conn.write_buffer(service, session.info(), table.id, known.clone(), vec![0])
    }))
    .await?;
    Ok(stored + parts.iter().flatten().map(|p| p.rows).sum::<u64>())
}

/// Record batches as Flight data; `hold` lives as long as the stream.
pub(crate) fn encode<H: Send + 'static>(stream: SendableRecordBatchStream, hold: H) -> DataStream {
    let schema = stream.schema();
    let batches = stream.map_err(|e| FlightError::Tonic(Box::new(status(e))));
    let data = FlightDataEncoderBuilder::new()
        .with_schema(schema)
        .build(batches)
        .map(move |d| {
            let _ = &hold;
            d.map_err(Status::from)
        });
    Box::pin(data)
}

#[tonic::async_trait]
impl FlightService for Service {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = DataStream;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoActionStream = BoxStream<'static, Result<arrow_flight::Result, Status>>;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;
    type DoExchangeStream = DataStream;

    /// The token travels in a header on every call; a handshake has nothing to add.
    async fn handshake(
        &self,
        request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        self.sql.handshake(request).await
    }

    async fn list_flights(
        &self,
        _request: Request<Criteria>,
    ) -> Result<Response<Self::ListFlightsStream>, Status> {
        let infos = self.shared.list().await?;
        Ok(Response::new(
            futures::stream::iter(infos.into_iter().map(Ok)).boxed(),
        ))
    }

    async fn get_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let descriptor = request.get_ref().clone();
        match descriptor.r#type() {
            DescriptorType::Path => Ok(Response::new(self.shared.tables_info(descriptor).await?)),
            DescriptorType::Cmd if flight_sql_message(&descriptor.cmd) => {
                self.sql.get_flight_info(request).await
            }
            DescriptorType::Cmd => {
                let sql = sql_text(&descriptor.cmd)?.to_owned();
                Ok(Response::new(
                    self.shared.sql_info(&sql, descriptor, false).await?,
                ))
            }
            DescriptorType::Unknown => Err(Status::invalid_argument(
                "a descriptor of unknown type: give a path (tables) or a command (SQL)",
            )),
        }
    }

    async fn poll_flight_info(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<PollInfo>, Status> {
        // Planning is quick: the answer is complete at once.
        let info = self.get_flight_info(request).await?.into_inner();
        Ok(Response::new(PollInfo::new().with_info(info)))
    }

    async fn get_schema(
        &self,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<SchemaResult>, Status> {
        let descriptor = request.get_ref();
        let schema =
            if descriptor.r#type() == DescriptorType::Cmd && flight_sql_message(&descriptor.cmd) {
                self.sql.command_schema(&descriptor.cmd).await?
            } else {
                self.shared.schema_of(descriptor).await?
            };
        let result: SchemaResult = SchemaAsIpc::new(&schema, &IpcWriteOptions::default())
            .try_into()
            .map_err(schema_status)?;
        Ok(Response::new(result))
    }

    async fn do_get(
        &self,
        request: Request<Ticket>,
    ) -> Result<Response<Self::DoGetStream>, Status> {
        match QueryTicket::decode(&request.get_ref().ticket) {
            Some(ticket) => {
                let ticket = ticket.map_err(Status::invalid_argument)?;
                Ok(Response::new(self.shared.read(&ticket)?))
            }
            None => self.sql.do_get(request).await,
        }
    }

    async fn do_put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoPutStream>, Status> {
        self.sql.do_put(request).await
    }

    async fn do_exchange(
        &self,
        _request: Request<Streaming<FlightData>>,
    ) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(crate::sql::read_only("DoExchange"))
    }

    async fn do_action(
        &self,
        request: Request<Action>,
    ) -> Result<Response<Self::DoActionStream>, Status> {
        self.sql.do_action(request).await
    }

    async fn list_actions(
        &self,
        request: Request<Empty>,
    ) -> Result<Response<Self::ListActionsStream>, Status> {
        self.sql.list_actions(request).await
    }
}
