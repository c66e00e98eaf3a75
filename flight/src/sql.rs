//! Flight SQL: statements and prepared statements (`SELECT` only, no parameters) at one
//! snapshot each, and the metadata calls drivers make when they connect.

use std::sync::{Arc, LazyLock};

use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::sql::metadata::{SqlInfoData, SqlInfoDataBuilder};
use arrow_flight::sql::server::{FlightSqlService, PeekableFlightDataStream};
use arrow_flight::sql::{
    ActionBeginTransactionRequest, ActionBeginTransactionResult,
    ActionClosePreparedStatementRequest, ActionCreatePreparedStatementRequest,
    ActionCreatePreparedStatementResult, Any, Command, CommandGetCatalogs, CommandGetDbSchemas,
    CommandGetSqlInfo, CommandGetTableTypes, CommandGetTables, CommandPreparedStatementQuery,
    CommandPreparedStatementUpdate, CommandStatementIngest, CommandStatementQuery,
    CommandStatementUpdate, ProstMessageExt, SqlInfo, SqlSupportedTransaction,
    TicketStatementQuery,
};
use arrow_flight::{
    FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest, HandshakeResponse, IpcMessage,
    SchemaAsIpc, Ticket,
};
use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::ipc::writer::IpcWriteOptions;
use datafusion::arrow::record_batch::RecordBatch;
use futures::{Stream, StreamExt, TryStreamExt};
use prost::Message;
use retina_query::user_schema;
use tonic::{Request, Response, Status, Streaming};

use crate::service::{DataStream, schema_status};
use crate::ticket::QueryTicket;
use crate::{CATALOG, Shared, names};

/// What `GetSqlInfo` answers.
static INFO: LazyLock<SqlInfoData> = LazyLock::new(|| {
    let mut b = SqlInfoDataBuilder::new();
    b.append(SqlInfo::FlightSqlServerName, "Retina");
    b.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    // The Arrow columnar format version of the IPC streams.
    b.append(SqlInfo::FlightSqlServerArrowVersion, "1.5");
    b.append(SqlInfo::FlightSqlServerReadOnly, true);
    b.append(SqlInfo::FlightSqlServerSql, true);
    b.append(SqlInfo::FlightSqlServerSubstrait, false);
    b.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::None as i32,
    );
    b.append(SqlInfo::FlightSqlServerCancel, false);
    b.append(SqlInfo::FlightSqlServerBulkIngestion, false);
    b.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    b.append(SqlInfo::SqlDdlCatalog, false);
    b.append(SqlInfo::SqlDdlSchema, false);
    b.append(SqlInfo::SqlDdlTable, false);
    b.build().expect("static SQL info")
});

/// What Retina refuses over Flight: its tables change through the source alone.
pub(crate) fn read_only(what: &str) -> Status {
    Status::unimplemented(format!(
        "{what}: Retina's tables change through its source alone; Flight and Flight SQL read"
    ))
}

pub(crate) struct SqlService {
    shared: Arc<Shared>,
}

impl SqlService {
    pub fn new(shared: Arc<Shared>) -> SqlService {
        SqlService { shared }
    }

    /// A metadata command's `FlightInfo`: its ticket is the command itself.
    fn metadata_info(
        &self,
        command: impl ProstMessageExt,
        schema: &Schema,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let ticket = Ticket::new(command.as_any().encode_to_vec());
        let info = FlightInfo::new()
            .try_with_schema(schema)
            .map_err(schema_status)?
            .with_endpoint(FlightEndpoint::new().with_ticket(ticket))
            .with_descriptor(request.into_inner());
        Ok(Response::new(info))
    }

    /// The columns a Flight SQL command returns (`GetSchema`).
    pub async fn command_schema(&self, cmd: &[u8]) -> Result<SchemaRef, Status> {
        let any = Any::decode(cmd).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let command =
            Command::try_from(any).map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(match command {
            Command::CommandStatementQuery(q) => self.shared.sql_schema(&q.query).await?,
            Command::CommandPreparedStatementQuery(q) => {
                let sql = Self::handle_sql(&q.prepared_statement_handle)?;
                self.shared.sql_schema(&sql).await?
            }
            Command::CommandGetCatalogs(q) => q.into_builder().schema(),
            Command::CommandGetDbSchemas(q) => q.into_builder().schema(),
            Command::CommandGetTables(q) => q.into_builder().schema(),
            Command::CommandGetTableTypes(q) => q.into_builder().schema(),
            Command::CommandGetSqlInfo(q) => q.into_builder(&INFO).schema(),
            other => {
                return Err(Status::unimplemented(format!(
                    "GetSchema of {}",
                    other.type_url()
                )));
            }
        })
    }

    /// The handle of a prepared statement is its SQL text.
    fn handle_sql(handle: &[u8]) -> Result<String, Status> {
        String::from_utf8(handle.to_vec())
            .map_err(|_| Status::invalid_argument("not a prepared statement of this service"))
    }
}

/// A schema as an IPC message.
fn ipc_schema(schema: &Schema) -> Result<IpcMessage, Status> {
    SchemaAsIpc::new(schema, &IpcWriteOptions::default())
        .try_into()
        .map_err(schema_status)
}

/// One batch as a `DoGet` stream.
fn one_batch<E: std::fmt::Display>(
    batch: Result<RecordBatch, E>,
) -> Result<Response<DataStream>, Status> {
    let batch = batch.map_err(|e| Status::internal(e.to_string()))?;
    let stream = FlightDataEncoderBuilder::new()
        .with_schema(batch.schema())
        .build(futures::stream::iter([Ok(batch)]))
        .map_err(Status::from);
    Ok(Response::new(Box::pin(stream)))
}

#[tonic::async_trait]
impl FlightSqlService for SqlService {
    type FlightService = SqlService;

    async fn do_handshake(
        &self,
        _request: Request<Streaming<HandshakeRequest>>,
    ) -> Result<
        Response<std::pin::Pin<Box<dyn Stream<Item = Result<HandshakeResponse, Status>> + Send>>>,
        Status,
    > {
        let reply = HandshakeResponse {
            protocol_version: 0,
            payload: Default::default(),
        };
        Ok(Response::new(futures::stream::iter([Ok(reply)]).boxed()))
    }

    async fn get_flight_info_statement(
        &self,
        query: CommandStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let descriptor = request.into_inner();
        Ok(Response::new(
            self.shared.sql_info(&query.query, descriptor, true).await?,
        ))
    }

    async fn get_flight_info_prepared_statement(
        &self,
        query: CommandPreparedStatementQuery,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let sql = Self::handle_sql(&query.prepared_statement_handle)?;
        let descriptor = request.into_inner();
        Ok(Response::new(
            self.shared.sql_info(&sql, descriptor, true).await?,
        ))
    }

    async fn do_get_statement(
        &self,
        ticket: TicketStatementQuery,
        _request: Request<Ticket>,
    ) -> Result<Response<DataStream>, Status> {
        let ticket = QueryTicket::decode(&ticket.statement_handle)
            .ok_or_else(|| Status::invalid_argument("not a statement ticket of this service"))?
            .map_err(Status::invalid_argument)?;
        Ok(Response::new(self.shared.read(&ticket)?))
    }

    async fn do_action_create_prepared_statement(
        &self,
        query: ActionCreatePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<ActionCreatePreparedStatementResult, Status> {
        // Plans the statement once to check it and to describe its result.
        let schema = self.shared.sql_schema(&query.query).await?;
        let IpcMessage(dataset_schema) = ipc_schema(&schema)?;
        let IpcMessage(parameter_schema) = ipc_schema(&Schema::empty())?;
        Ok(ActionCreatePreparedStatementResult {
            prepared_statement_handle: query.query.into_bytes().into(),
            dataset_schema,
            parameter_schema,
        })
    }

    async fn do_action_close_prepared_statement(
        &self,
        _query: ActionClosePreparedStatementRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<(), Status> {
        Ok(())
    }

    async fn get_flight_info_catalogs(
        &self,
        query: CommandGetCatalogs,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.metadata_info(query, &schema, request)
    }

    async fn do_get_catalogs(
        &self,
        query: CommandGetCatalogs,
        _request: Request<Ticket>,
    ) -> Result<Response<DataStream>, Status> {
        let mut b = query.into_builder();
        b.append(CATALOG);
        one_batch(b.build())
    }

    async fn get_flight_info_schemas(
        &self,
        query: CommandGetDbSchemas,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.metadata_info(query, &schema, request)
    }

    async fn do_get_schemas(
        &self,
        query: CommandGetDbSchemas,
        _request: Request<Ticket>,
    ) -> Result<Response<DataStream>, Status> {
        let tables = self.shared.tables().await?;
        let mut schemas: Vec<&str> = vec!["public"];
        for t in &tables {
            let (schema, _) = names::split(t.schema.name());
            if !schemas.contains(&schema) {
                schemas.push(schema);
            }
        }
        let mut b = query.into_builder();
        for s in schemas {
            b.append(CATALOG, s);
        }
        one_batch(b.build())
    }

    async fn get_flight_info_tables(
        &self,
        query: CommandGetTables,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder().schema();
        self.metadata_info(query, &schema, request)
    }

    async fn do_get_tables(
        &self,
        query: CommandGetTables,
        _request: Request<Ticket>,
    ) -> Result<Response<DataStream>, Status> {
        let tables = self.shared.tables().await?;
        let mut b = query.into_builder();
        for t in &tables {
            let (schema, name) = names::split(t.schema.name());
            b.append(CATALOG, schema, name, "TABLE", &user_schema(t))
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        one_batch(b.build())
    }

    async fn get_flight_info_table_types(
        &self,
        query: CommandGetTableTypes,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.into_builder().schema();
        self.metadata_info(query, &schema, request)
    }

    async fn do_get_table_types(
        &self,
        query: CommandGetTableTypes,
        _request: Request<Ticket>,
    ) -> Result<Response<DataStream>, Status> {
        let mut b = query.into_builder();
        b.append("TABLE");
        one_batch(b.build())
    }

    async fn get_flight_info_sql_info(
        &self,
        query: CommandGetSqlInfo,
        request: Request<FlightDescriptor>,
    ) -> Result<Response<FlightInfo>, Status> {
        let schema = query.clone().into_builder(&INFO).schema();
        self.metadata_info(query, &schema, request)
    }

    async fn do_get_sql_info(
        &self,
        query: CommandGetSqlInfo,
        _request: Request<Ticket>,
    ) -> Result<Response<DataStream>, Status> {
        one_batch(query.into_builder(&INFO).build())
    }

    async fn do_put_statement_update(
        &self,
        _ticket: CommandStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(read_only("an update statement"))
    }

    async fn do_put_statement_ingest(
        &self,
        _ticket: CommandStatementIngest,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(read_only("bulk ingestion"))
    }

    async fn do_put_prepared_statement_update(
        &self,
        _query: CommandPreparedStatementUpdate,
        _request: Request<PeekableFlightDataStream>,
    ) -> Result<i64, Status> {
        Err(read_only("an update statement"))
    }

    async fn do_action_begin_transaction(
        &self,
        _query: ActionBeginTransactionRequest,
        _request: Request<arrow_flight::Action>,
    ) -> Result<ActionBeginTransactionResult, Status> {
        Err(Status::unimplemented(
            "Retina has no client transactions: every statement reads one consistent snapshot",
        ))
    }

    async fn register_sql_info(&self, _id: i32, _result: &SqlInfo) {}
}
