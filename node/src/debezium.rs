//! Debezium JSON change events: parsing one JSON line into a [`Message`], converting column
//! values to storage [`Value`]s by the target table's schema, and reassembling complete source
//! transactions from BEGIN/END metadata ([`TxnAssembler`]).
//!
//! Both forms Kafka Connect's JSON converter writes are accepted: the `{"schema", "payload"}`
//! envelope (the schema's semantic type names decide how integers and byte strings are read)
//! and the bare payload (`schemas.enable=false`, where the column's declared type and
//! precision and the `decimal_handling` setting decide; never the value's content).
//!
//! Lines that carry no row change are recognised and skipped: heartbeats, logical decoding
//! messages (`op: "m"`) and schema change events ([`Message::Skipped`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use retina_storage::{ColumnDef, ColumnType, RowOp, StorageError, TableSchema, Value};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

/// How many applied transaction ids the assembler remembers to drop replayed duplicates. A
/// source replays from a checkpoint at most a few thousand transactions back, so 65,536 covers
/// any realistic overlap while bounding memory to a few MiB.
pub const APPLIED_IDS_REMEMBERED: usize = 65_536;

// Semantic type names (the `name` of a field in the envelope schema).
const CONNECT_DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";
const DATE: &str = "io.debezium.time.Date";
const CONNECT_DATE: &str = "org.apache.kafka.connect.data.Date";
const TIMESTAMP_MS: &str = "io.debezium.time.Timestamp";
const CONNECT_TIMESTAMP_MS: &str = "org.apache.kafka.connect.data.Timestamp";
const TIMESTAMP_US: &str = "io.debezium.time.MicroTimestamp";
const TIMESTAMP_NS: &str = "io.debezium.time.NanoTimestamp";
const TIME_MS: &str = "io.debezium.time.Time";
const CONNECT_TIME_MS: &str = "org.apache.kafka.connect.data.Time";
const TIME_US: &str = "io.debezium.time.MicroTime";
const TIME_NS: &str = "io.debezium.time.NanoTime";

const MICROS_PER_DAY: i64 = 86_400_000_000;

/// How a stream without the envelope schema encodes decimals: Debezium's
/// `decimal.handling.mode`, which the schema would otherwise tell.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecimalHandling {
    /// Base64 big-endian two's-complement bytes of the unscaled value (Connect `Decimal`), at
    /// the column's scale.
    Precise,
    /// A decimal literal, `"123.45"`.
    #[default]
    String,
    /// A JSON number.
    Double,
}

/// What a line alone does not say about how to read it.
#[derive(Clone, Copy, Debug, Default)]
pub struct ParseOptions {
    pub decimal_handling: DecimalHandling,
}

/// The connector name Debezium's Postgres connector writes in `source.connector`.
pub const POSTGRES_CONNECTOR: &str = "postgresql";

/// Whether two transaction ids name the same source transaction, as `connector` defines
/// them. Debezium's Postgres connector (since 2.1) writes `txId:LSN`, the LSN being the
/// last one seen when the BEGIN, each change event or the END was written, so only the
/// `txId` part identifies the transaction; every other connector's id is compared whole
/// (MySQL's GTID `server-uuid:n`, for one, needs both parts).
pub fn same_transaction(a: &str, b: &str, connector: Option<&str>) -> bool {
    a == b || (connector == Some(POSTGRES_CONNECTOR) && postgres_txid(a) == postgres_txid(b))
}

/// The `txId` part of a Postgres `txId:LSN` transaction id (the whole id when it has no
/// LSN part, as before Debezium 2.1).
fn postgres_txid(id: &str) -> &str {
    id.split_once(':').map_or(id, |(txid, _)| txid)
}

/// Where a message came from: a file path (or `stdin`) and a 1-based line number.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourcePosition {
    pub source: Arc<str>,
    pub line: u64,
}

impl SourcePosition {
    pub fn new(source: impl Into<Arc<str>>, line: u64) -> Self {
        SourcePosition {
            source: source.into(),
            line,
        }
    }
}

impl fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.line)
    }
}

/// Why a line could not be parsed or a transaction not assembled. Every error names the input
/// position first; all of them are permanent (the same input fails the same way).
#[derive(Debug, thiserror::Error)]
pub enum DebeziumError {
    #[error("{pos}: malformed Debezium message: {reason}")]
    Malformed { pos: SourcePosition, reason: String },

    #[error(
        "{pos}: unknown table (tried {}); declare it in the catalog DDL or drop it from the \
         connector's table.include.list",
        quoted(.tried)
    )]
    UnknownTable {
        pos: SourcePosition,
        tried: Vec<String>,
    },

    #[error(
        "{pos}: table `{table}`: the {image} image has no column `{column}`; it must carry the \
         primary key and, for inserts and updates, every NOT NULL column (check the connector's \
         column filters and the table's REPLICA IDENTITY)"
    )]
    MissingColumn {
        pos: SourcePosition,
        table: String,
        column: String,
        /// `before` or `after`.
        image: &'static str,
    },

    #[error("{pos}: table `{table}`, column `{column}`: {reason}")]
    Value {
        pos: SourcePosition,
        table: String,
        column: String,
        reason: String,
    },

    #[error("{pos}: {what} is not supported")]
    Unsupported { pos: SourcePosition, what: String },

    #[error("{pos}: transaction `{id}`: {reason}")]
    Transaction {
        pos: SourcePosition,
        id: String,
        reason: String,
    },

    #[error(
        "{pos}: change event without a `transaction` block; enable provide.transaction.metadata \
         on the connector, or replay with --no-txn-metadata"
    )]
    MissingTxnMetadata { pos: SourcePosition },

    #[error(
        "{pos}: transaction `{id}`: END announces {expected} events{}, but {got} arrived; the \
         stream lost or repeated events",
        for_collection(.collection)
    )]
    CountMismatch {
        pos: SourcePosition,
        id: String,
        /// The data collection whose count differs, or `None` for the transaction's total.
        collection: Option<String>,
        expected: u64,
        got: u64,
    },
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn for_collection(collection: &Option<String>) -> String {
    collection
        .as_ref()
        .map(|c| format!(" for `{c}`"))
        .unwrap_or_default()
}

impl DebeziumError {
    /// The input position the error is about.
    pub fn position(&self) -> &SourcePosition {
        match self {
            DebeziumError::Malformed { pos, .. }
            | DebeziumError::UnknownTable { pos, .. }
            | DebeziumError::MissingColumn { pos, .. }
            | DebeziumError::Value { pos, .. }
            | DebeziumError::Unsupported { pos, .. }
            | DebeziumError::Transaction { pos, .. }
            | DebeziumError::MissingTxnMetadata { pos }
            | DebeziumError::CountMismatch { pos, .. } => pos,
        }
    }
}

fn malformed(pos: &SourcePosition, reason: impl Into<String>) -> DebeziumError {
    DebeziumError::Malformed {
        pos: pos.clone(),
        reason: reason.into(),
    }
}

/// One parsed line.
#[derive(Clone, Debug)]
pub enum Message {
    /// A transaction's BEGIN marker.
    Begin { id: String, pos: SourcePosition },
    /// A transaction's END marker with the number of events it announces, in total and per data
    /// collection (`schema.table` or `db.table`, as the connector names it).
    End {
        id: String,
        event_count: u64,
        data_collections: Vec<(String, u64)>,
        pos: SourcePosition,
    },
    /// A row change.
    Change(ChangeEvent),
    /// A Kafka tombstone (`null`, or the empty line kcat prints for one) that follows a delete
    /// for log compaction; it carries no change and is skipped.
    Tombstone { pos: SourcePosition },
    /// A message that carries no row change and is skipped (counted by the sink).
    Skipped {
        what: Skipped,
        /// A transactional logical decoding message's `transaction` block: Debezium counts
        /// the message among its transaction's events.
        txn: Option<TxnRef>,
        pos: SourcePosition,
    },
}

/// Kinds of [`Message::Skipped`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Skipped {
    /// A heartbeat (`__debezium-heartbeat` topic): `{"ts_ms": ...}`.
    Heartbeat,
    /// A logical decoding message (`op: "m"`, Postgres `pg_logical_emit_message`).
    LogicalMessage,
    /// A schema change event (`ddl`, `tableChanges`): the catalog DDL decides the tables.
    SchemaChange,
}

impl Message {
    pub fn position(&self) -> &SourcePosition {
        match self {
            Message::Begin { pos, .. }
            | Message::End { pos, .. }
            | Message::Tombstone { pos }
            | Message::Skipped { pos, .. } => pos,
            Message::Change(ev) => &ev.pos,
        }
    }
}

/// A row change on a catalog table. Rows hold one value per schema column, in schema order.
#[derive(Clone, Debug)]
pub struct ChangeEvent {
    pub table: Arc<TableSchema>,
    /// The table as Debezium names it in END's `data_collections`: `schema.table`, or `db.table`
    /// where the source has no schema (MySQL), or the bare table name where it has neither.
    pub data_collection: String,
    pub op: ChangeOp,
    /// `op` was `r`: a snapshot read. Snapshot events carry no transaction block.
    pub snapshot: bool,
    pub txn: Option<TxnRef>,
    /// `source.connector` (`postgresql`, `mysql`, ...): how its transaction ids compare.
    pub connector: Option<String>,
    pub pos: SourcePosition,
}

/// What a change does. A delete's row and an update's before row are only guaranteed to hold
/// the primary key; their other columns may be null whatever the column's nullability.
#[derive(Clone, Debug, PartialEq)]
pub enum ChangeOp {
    Insert(Vec<Value>),
    Delete(Vec<Value>),
    Update {
        before: Vec<Value>,
        after: Vec<Value>,
    },
    /// A snapshot read (`op: "r"`): the row's image whether or not the key exists, since
    /// Debezium re-sends reads (incremental snapshots, a re-snapshot after a reset).
    Upsert(Vec<Value>),
    /// `op: "t"`: every row of the table is deleted.
    Truncate,
}

impl From<ChangeOp> for RowOp<Vec<Value>> {
    fn from(op: ChangeOp) -> Self {
        match op {
            ChangeOp::Insert(row) => RowOp::Insert(row),
            ChangeOp::Delete(row) => RowOp::Delete(row),
            ChangeOp::Update { before, after } => RowOp::Update { before, after },
            ChangeOp::Upsert(row) => RowOp::Upsert(row),
            ChangeOp::Truncate => RowOp::Truncate,
        }
    }
}

/// A change event's `transaction` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnRef {
    pub id: String,
    /// The event's position among all events of the transaction, from 1.
    pub total_order: u64,
    /// The event's position among the transaction's events on the same table, from 1.
    pub data_collection_order: u64,
}

/// Parses one line of a Debezium JSON stream with the default [`ParseOptions`]; see
/// [`parse_line_with`].
pub fn parse_line(
    line: &str,
    pos: &SourcePosition,
    catalog: &dyn Fn(&str) -> Option<Arc<TableSchema>>,
) -> Result<Message, DebeziumError> {
    parse_line_with(line, pos, catalog, &ParseOptions::default())
}

/// Parses one line of a Debezium JSON stream. `catalog` resolves a table name to its schema; it
/// is asked for `schema.table` (or `db.table`) first and then for the bare table name.
pub fn parse_line_with(
    line: &str,
    pos: &SourcePosition,
    catalog: &dyn Fn(&str) -> Option<Arc<TableSchema>>,
    options: &ParseOptions,
) -> Result<Message, DebeziumError> {
    if line.trim().is_empty() {
        return Ok(Message::Tombstone { pos: pos.clone() });
    }
    // serde_json refuses nesting deeper than 128 levels with an error, so no line can overflow
    // the stack here.
    let json: Json =
        serde_json::from_str(line).map_err(|e| malformed(pos, format!("not JSON: {e}")))?;
    // The envelope is recognised by its `payload` key beside at most a `schema` (a heartbeat
    // may come as `{"payload": {...}}`); a bare payload has no `payload` key.
    let (schema, payload) = match &json {
        Json::Object(m)
            if m.contains_key("payload") && m.keys().all(|k| k == "schema" || k == "payload") =>
        {
            (m.get("schema"), &m["payload"])
        }
        _ => (None, &json),
    };
    let payload = match payload {
        Json::Null => return Ok(Message::Tombstone { pos: pos.clone() }),
        Json::Object(m) => m,
        other => {
            return Err(malformed(
                pos,
                format!("expected a JSON object, got {}", describe(other)),
            ));
        }
    };
    if payload.contains_key("status") {
        return parse_txn_marker(payload, pos);
    }
    if payload.contains_key("op") {
        let fields = schema.map(field_types).unwrap_or_default();
        return parse_change(payload, &fields, pos, catalog, options);
    }
    if payload.contains_key("ddl") || payload.contains_key("tableChanges") {
        return Ok(Message::Skipped {
            what: Skipped::SchemaChange,
            txn: None,
            pos: pos.clone(),
        });
    }
    // A heartbeat's value is exactly `{"ts_ms": <integer>}`.
    if payload.len() == 1
        && payload
            .get("ts_ms")
            .is_some_and(|t| t.is_i64() || t.is_u64())
    {
        return Ok(Message::Skipped {
            what: Skipped::Heartbeat,
            txn: None,
            pos: pos.clone(),
        });
    }
    Err(malformed(
        pos,
        "neither a change event (no `op`), transaction metadata (no `status`), a heartbeat \
         (only `ts_ms`) nor a schema change (no `ddl`)",
    ))
}

/// A transaction id: a string, or a number some connectors write unquoted.
fn txn_id(v: Option<&Json>) -> Option<String> {
    match v? {
        Json::String(s) => Some(s.clone()),
        Json::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// A count or order: a JSON number, or a numeric string (Debezium's own examples quote them).
fn json_u64(v: Option<&Json>) -> Option<u64> {
    match v? {
        Json::Number(n) => n.as_u64(),
        Json::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A decimal scale: a JSON integer or a numeric string (Connect writes parameters as strings).
/// Scales may be negative (Oracle's NUMBER(p, -s)).
fn json_i64(v: Option<&Json>) -> Option<i64> {
    match v? {
        Json::Number(n) => n.as_i64(),
        Json::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn parse_txn_marker(
    payload: &Map<String, Json>,
    pos: &SourcePosition,
) -> Result<Message, DebeziumError> {
    let id = txn_id(payload.get("id"))
        .ok_or_else(|| malformed(pos, "transaction metadata without a string `id`"))?;
    match payload.get("status").and_then(Json::as_str) {
        Some("BEGIN") => Ok(Message::Begin {
            id,
            pos: pos.clone(),
        }),
        Some("END") => {
            let event_count = json_u64(payload.get("event_count")).ok_or_else(|| {
                malformed(
                    pos,
                    format!("END of transaction `{id}` without an `event_count`"),
                )
            })?;
            let mut data_collections = Vec::new();
            match payload.get("data_collections") {
                None | Some(Json::Null) => {}
                Some(Json::Array(items)) => {
                    for item in items {
                        let name = item.get("data_collection").and_then(Json::as_str);
                        let count = json_u64(item.get("event_count"));
                        let (Some(name), Some(count)) = (name, count) else {
                            return Err(malformed(
                                pos,
                                format!(
                                    "END of transaction `{id}`: a `data_collections` entry needs \
                                     `data_collection` and `event_count`, got {}",
                                    describe(item)
                                ),
                            ));
                        };
                        data_collections.push((name.to_owned(), count));
                    }
                }
                Some(other) => {
                    return Err(malformed(
                        pos,
                        format!(
                            "END of transaction `{id}`: `data_collections` must be an array, got {}",
                            describe(other)
                        ),
                    ));
                }
            }
            Ok(Message::End {
                id,
                event_count,
                data_collections,
                pos: pos.clone(),
            })
        }
        _ => Err(malformed(
            pos,
            format!(
                "transaction metadata with status {}, expected \"BEGIN\" or \"END\"",
                describe(payload.get("status").unwrap_or(&Json::Null))
            ),
        )),
    }
}

/// What the envelope schema says about one column.
#[derive(Clone, Copy, Debug, Default)]
struct FieldType<'a> {
    /// The Connect type: `int32`, `int64`, `string`, `bytes`, ...
    connect: Option<&'a str>,
    /// The semantic type name, e.g. `io.debezium.time.MicroTimestamp`.
    name: Option<&'a str>,
    /// `parameters.scale` of a Connect decimal.
    scale: Option<&'a Json>,
}

/// The column types of the envelope schema's row struct, by column name. An envelope schema of
/// an unexpected shape yields no types: values are then read by the column type alone.
fn field_types(schema: &Json) -> HashMap<&str, FieldType<'_>> {
    let mut types = HashMap::new();
    let Some(top) = schema.get("fields").and_then(Json::as_array) else {
        return types;
    };
    // `after` and `before` share one struct schema; either describes the columns.
    let row = ["after", "before"].iter().find_map(|image| {
        top.iter()
            .find(|f| f.get("field").and_then(Json::as_str) == Some(image))
            .and_then(|f| f.get("fields"))
            .and_then(Json::as_array)
    });
    for f in row.into_iter().flatten() {
        if let Some(column) = f.get("field").and_then(Json::as_str) {
            types.insert(
                column,
                FieldType {
                    connect: f.get("type").and_then(Json::as_str),
                    name: f.get("name").and_then(Json::as_str),
                    scale: f.get("parameters").and_then(|p| p.get("scale")),
                },
            );
        }
    }
    types
}

fn parse_change(
    payload: &Map<String, Json>,
    fields: &HashMap<&str, FieldType<'_>>,
    pos: &SourcePosition,
    catalog: &dyn Fn(&str) -> Option<Arc<TableSchema>>,
    options: &ParseOptions,
) -> Result<Message, DebeziumError> {
    let op = payload
        .get("op")
        .and_then(Json::as_str)
        .ok_or_else(|| malformed(pos, "`op` must be a string"))?;
    match op {
        "c" | "r" | "u" | "d" | "t" | "m" => {}
        other => {
            return Err(malformed(
                pos,
                format!("unknown op {other:?}, expected one of c, u, d, r, t, m"),
            ));
        }
    }
    let txn = match payload.get("transaction") {
        None | Some(Json::Null) => None,
        Some(t) => {
            let id = txn_id(t.get("id"));
            let total_order = json_u64(t.get("total_order"));
            let dc_order = json_u64(t.get("data_collection_order"));
            let (Some(id), Some(total_order), Some(data_collection_order)) =
                (id, total_order, dc_order)
            else {
                return Err(malformed(
                    pos,
                    format!(
                        "`transaction` needs `id`, `total_order` and `data_collection_order`, got {}",
                        describe(t)
                    ),
                ));
            };
            Some(TxnRef {
                id,
                total_order,
                data_collection_order,
            })
        }
    };
    // A logical decoding message belongs to no table.
    if op == "m" {
        return Ok(Message::Skipped {
            what: Skipped::LogicalMessage,
            txn,
            pos: pos.clone(),
        });
    }
    let source = payload
        .get("source")
        .and_then(Json::as_object)
        .ok_or_else(|| malformed(pos, "change event without a `source` object"))?;
    let table_name = source
        .get("table")
        .and_then(Json::as_str)
        .ok_or_else(|| malformed(pos, "change event without `source.table`"))?;
    let namespace = source
        .get("schema")
        .and_then(Json::as_str)
        .or_else(|| source.get("db").and_then(Json::as_str));
    let connector = source
        .get("connector")
        .and_then(Json::as_str)
        .map(str::to_owned);
    let mut tried = Vec::with_capacity(2);
    if let Some(ns) = namespace {
        tried.push(format!("{ns}.{table_name}"));
    }
    tried.push(table_name.to_owned());
    let table =
        tried
            .iter()
            .find_map(|name| catalog(name))
            .ok_or_else(|| DebeziumError::UnknownTable {
                pos: pos.clone(),
                tried: tried.clone(),
            })?;
    let data_collection = tried.swap_remove(0);

    let rows = Rows {
        table: &table,
        fields,
        pos,
        options,
    };
    let image = |key: &'static str| -> Result<Option<&Map<String, Json>>, DebeziumError> {
        match payload.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::Object(m)) => Ok(Some(m)),
            Some(other) => Err(malformed(
                pos,
                format!("`{key}` must be an object or null, got {}", describe(other)),
            )),
        }
    };
    let required = |key: &'static str| {
        image(key)?.ok_or_else(|| malformed(pos, format!("op {op:?} without the `{key}` image")))
    };
    let change = match op {
        "c" => ChangeOp::Insert(rows.convert(required("after")?, Image::After)?),
        "r" => ChangeOp::Upsert(rows.convert(required("after")?, Image::After)?),
        "d" => ChangeOp::Delete(rows.convert(required("before")?, Image::Before)?),
        "t" => ChangeOp::Truncate,
        _ => {
            let after = rows.convert(required("after")?, Image::After)?;
            // With REPLICA IDENTITY DEFAULT, Postgres sends no before image for an update that
            // keeps the key, so the after image's key is the before key.
            let before = match image("before")? {
                Some(m) => rows.convert(m, Image::Before)?,
                None => key_only(&table, &after),
            };
            ChangeOp::Update { before, after }
        }
    };
    Ok(Message::Change(ChangeEvent {
        table,
        data_collection,
        op: change,
        snapshot: op == "r",
        txn,
        connector,
        pos: pos.clone(),
    }))
}

/// `row`'s primary-key values, every other column null.
fn key_only(table: &TableSchema, row: &[Value]) -> Vec<Value> {
    let pk = table.primary_key();
    row.iter()
        .enumerate()
        .map(|(i, v)| {
            if pk.contains(&i) {
                v.clone()
            } else {
                Value::Null
            }
        })
        .collect()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Image {
    /// A full row: the key and every NOT NULL column must be present.
    After,
    /// A row whose key is all that is needed (a delete's, an update's before image): other
    /// columns may be missing or null.
    Before,
}

/// Converts row images of one event.
struct Rows<'a> {
    table: &'a TableSchema,
    fields: &'a HashMap<&'a str, FieldType<'a>>,
    pos: &'a SourcePosition,
    options: &'a ParseOptions,
}

impl Rows<'_> {
    fn convert(&self, obj: &Map<String, Json>, image: Image) -> Result<Vec<Value>, DebeziumError> {
        let pk = self.table.primary_key();
        let mut row = Vec::with_capacity(self.table.columns().len());
        for (i, col) in self.table.columns().iter().enumerate() {
            let is_key = pk.contains(&i);
            let Some(json) = obj.get(&col.name) else {
                if is_key || (image == Image::After && !col.nullable) {
                    return Err(DebeziumError::MissingColumn {
                        pos: self.pos.clone(),
                        table: self.table.name().to_owned(),
                        column: col.name.clone(),
                        image: match image {
                            Image::After => "after",
                            Image::Before => "before",
                        },
                    });
                }
                row.push(Value::Null);
                continue;
            };
            let value_error = |reason: String| DebeziumError::Value {
                pos: self.pos.clone(),
                table: self.table.name().to_owned(),
                column: col.name.clone(),
                reason,
            };
            let field = self
                .fields
                .get(col.name.as_str())
                .copied()
                .unwrap_or_default();
            let value = convert(col, json, field, self.options).map_err(value_error)?;
            // A before image's non-key columns may be null even where the column is NOT NULL
            // (Postgres sends only the key under REPLICA IDENTITY DEFAULT).
            let unchecked = image == Image::Before && !is_key && value == Value::Null;
            if !unchecked {
                self.table
                    .check_value(i, value.as_ref())
                    .map_err(|e| value_error(storage_reason(e)))?;
            }
            row.push(value);
        }
        Ok(row)
    }
}

/// The reason of a storage value error without its `table, column` prefix, which
/// [`DebeziumError::Value`] repeats with the position.
fn storage_reason(e: StorageError) -> String {
    match e {
        StorageError::Value { reason, .. } => reason,
        other => other.to_string(),
    }
}

/// A JSON value for error messages: its kind and a bounded excerpt.
fn describe(v: &Json) -> String {
    const MAX_CHARS: usize = 40;
    let text = v.to_string();
    let excerpt: String = text.chars().take(MAX_CHARS).collect();
    let ellipsis = if excerpt.len() < text.len() {
        "..."
    } else {
        ""
    };
    let kind = match v {
        Json::Null => return "null".into(),
        Json::Bool(_) => "boolean",
        Json::Number(_) => "number",
        Json::String(_) => "string",
        Json::Array(_) => "array",
        Json::Object(_) => "object",
    };
    format!("{kind} {excerpt}{ellipsis}")
}

/// Converts a non-key-checked JSON value into a value for column `col`; `field` is what the
/// envelope schema says about the column (default where there is no envelope), `options` what
/// the stream's settings say where there is none.
fn convert(
    col: &ColumnDef,
    v: &Json,
    field: FieldType<'_>,
    options: &ParseOptions,
) -> Result<Value, String> {
    if v.is_null() {
        return Ok(Value::Null);
    }
    match col.ty {
        ColumnType::Boolean => to_bool(v).map(Value::Boolean),
        ColumnType::Int32 | ColumnType::Int64 => to_int(v).map(Value::Int),
        ColumnType::Float32 | ColumnType::Float64 => to_float(v).map(Value::Float),
        ColumnType::Decimal { scale, .. } => {
            to_decimal(v, scale, field, options.decimal_handling).map(Value::Decimal)
        }
        ColumnType::Utf8 => match v {
            Json::String(s) => Ok(Value::Utf8(s.clone())),
            other => Err(format!("expected a string, got {}", describe(other))),
        },
        ColumnType::Date => to_date(v, field.name).map(Value::Date),
        ColumnType::Timestamp | ColumnType::TimestampTz => {
            to_timestamp(v, field.name, col.time_precision).map(Value::Timestamp)
        }
        ColumnType::Time => to_time(v, field.name, col.time_precision).map(Value::Time),
    }
}

/// A boolean; also 0 or 1, which is how MySQL's `tinyint(1)` arrives without a converter.
fn to_bool(v: &Json) -> Result<bool, String> {
    match v {
        Json::Bool(b) => Ok(*b),
        Json::Number(n) if n.as_u64() == Some(0) => Ok(false),
        Json::Number(n) if n.as_u64() == Some(1) => Ok(true),
        other => Err(format!("expected a boolean, got {}", describe(other))),
    }
}

/// An integer; the column's range is checked by the schema afterwards.
fn to_int(v: &Json) -> Result<i64, String> {
    match v {
        Json::Number(n) => n.as_i64().ok_or_else(|| {
            if n.is_u64() {
                format!("{n} does not fit in bigint")
            } else {
                format!("expected an integer, got {n}")
            }
        }),
        other => Err(format!("expected an integer, got {}", describe(other))),
    }
}

/// A floating-point number; also the strings `NaN`, `Infinity` and `-Infinity`, which is how
/// non-finite doubles are written where JSON has no literal for them.
fn to_float(v: &Json) -> Result<f64, String> {
    match v {
        Json::Number(n) => n
            .as_f64()
            .ok_or_else(|| format!("{n} is not representable as a double")),
        Json::String(s) if s == "NaN" => Ok(f64::NAN),
        Json::String(s) if s == "Infinity" => Ok(f64::INFINITY),
        Json::String(s) if s == "-Infinity" => Ok(f64::NEG_INFINITY),
        other => Err(format!("expected a number, got {}", describe(other))),
    }
}

/// A decimal as its unscaled integer at `scale`. Reads a decimal literal (`"123.45"`,
/// decimal.handling.mode=string), base64 big-endian two's-complement bytes (Kafka Connect
/// `Decimal`, at the envelope's `parameters.scale`), `{"scale", "value"}` (Debezium's
/// `VariableScaleDecimal`) or a JSON number (decimal.handling.mode=double, read through its
/// shortest decimal text, so a double that came from a decimal of up to 15 digits is exact).
/// Which a string is comes from the envelope's schema, or without one from `mode` (the
/// `decimal_handling` setting), never from its content: `"9999"` is both a literal and the
/// base64 of -5326.11 at scale 2.
fn to_decimal(
    v: &Json,
    scale: i8,
    field: FieldType<'_>,
    mode: DecimalHandling,
) -> Result<i128, String> {
    match v {
        Json::Number(n) => parse_decimal(&n.to_string(), scale),
        Json::Object(m) => {
            let from = json_i64(m.get("scale")).ok_or_else(|| {
                format!(
                    "a variable-scale decimal needs a `scale`, got {}",
                    describe(v)
                )
            })?;
            let bytes = m.get("value").and_then(Json::as_str).ok_or_else(|| {
                format!(
                    "a variable-scale decimal needs a base64 `value`, got {}",
                    describe(v)
                )
            })?;
            rescale(decode_unscaled(bytes)?, from, scale)
        }
        Json::String(s) => {
            if field.name == Some(CONNECT_DECIMAL) {
                let from = match field.scale {
                    None => i64::from(scale),
                    Some(p) => json_i64(Some(p)).ok_or_else(|| {
                        format!("the envelope schema gives decimal scale {p}, not an integer")
                    })?,
                };
                return rescale(decode_unscaled(s)?, from, scale);
            }
            match (field.connect, mode) {
                (Some("bytes"), _) | (None, DecimalHandling::Precise) => decode_unscaled(s),
                (Some("string"), _) | (None, DecimalHandling::String) => parse_decimal(s, scale),
                (None, DecimalHandling::Double) => Err(format!(
                    "decimal_handling = \"double\" expects a JSON number, got string {s:?}; \
                     set decimal_handling to the connector's decimal.handling.mode"
                )),
                (Some(other), _) => Err(format!(
                    "the envelope schema gives type `{other}` for a decimal string {s:?}"
                )),
            }
        }
        other => Err(format!(
            "expected a decimal string, base64 bytes or a number, got {}",
            describe(other)
        )),
    }
}

/// 10^n, or `None` where it does not fit in an i128.
fn pow10(n: u64) -> Option<i128> {
    u32::try_from(n).ok().and_then(|n| 10i128.checked_pow(n))
}

/// `unscaled` at scale `from`, rescaled exactly to `to`.
fn rescale(unscaled: i128, from: i64, to: i8) -> Result<i128, String> {
    // Saturating: `from` comes from the input and may be absurd; 10^huge then does not fit.
    let shift = i64::from(to).saturating_sub(from);
    if shift >= 0 {
        pow10(shift.unsigned_abs())
            .and_then(|p| unscaled.checked_mul(p))
            .ok_or_else(|| format!("{unscaled} at scale {from} overflows at scale {to}"))
    } else {
        match pow10(shift.unsigned_abs()) {
            Some(p) if unscaled % p == 0 => Ok(unscaled / p),
            // 10^n beyond i128 divides only zero.
            None if unscaled == 0 => Ok(0),
            _ => Err(format!(
                "{unscaled} at scale {from} has more fractional digits than scale {to}"
            )),
        }
    }
}

/// Parses a decimal literal (`-12.50`, `+3`, `.5`, `1.5e-3`) into its unscaled value at
/// `scale`, exactly: fractional digits beyond the scale are an error unless they are zeros.
fn parse_decimal(s: &str, scale: i8) -> Result<i128, String> {
    let bad = || format!("{s:?} is not a decimal number");
    let (negative, rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (&rest[..i], rest[i + 1..].parse::<i32>().map_err(|_| bad())?),
        None => (rest, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let all_digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if int_part.len() + frac_part.len() == 0 || !all_digits(int_part) || !all_digits(frac_part) {
        return Err(bad());
    }
    // value = digits * 10^-frac_digits. Trailing zeros are dropped first so that a long run of
    // them (`1.000...0`) does not overflow before the rescale.
    let digits = format!("{int_part}{frac_part}");
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    if significant.is_empty() {
        return Ok(0);
    }
    let trailing_zeros = digits.len() - digits.trim_end_matches('0').len();
    let frac_digits = frac_part.len() as i64 - trailing_zeros as i64 - i64::from(exponent);
    let mut unscaled: i128 = 0;
    for b in significant.bytes() {
        unscaled = unscaled
            .checked_mul(10)
            .and_then(|u| u.checked_add(i128::from(b - b'0')))
            .ok_or_else(|| format!("{s:?} has more than 38 significant digits"))?;
    }
    if negative {
        unscaled = -unscaled;
    }
    rescale(unscaled, frac_digits, scale).map_err(|_| {
        format!("{s:?} does not fit at scale {scale} (too many fractional digits or too large)")
    })
}

/// Decodes base64 big-endian two's-complement bytes (Java's `BigInteger.toByteArray`).
fn decode_unscaled(b64: &str) -> Result<i128, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("{b64:?} is not base64 decimal bytes: {e}"))?;
    let Some(&first) = bytes.first() else {
        return Err("empty decimal bytes".into());
    };
    let negative = first & 0x80 != 0;
    let fill = if negative { 0xff } else { 0 };
    // More than 16 bytes fit only if the extra leading bytes are sign extension.
    let excess = bytes.len().saturating_sub(16);
    let fits = bytes[..excess].iter().all(|&b| b == fill)
        && (excess == 0 || (bytes[excess] & 0x80 != 0) == negative);
    if !fits {
        return Err(format!("decimal bytes {b64:?} do not fit in 128 bits"));
    }
    let start: i128 = if negative { -1 } else { 0 };
    Ok(bytes[excess..]
        .iter()
        .fold(start, |acc, &b| (acc << 8) | i128::from(b)))
}

/// The unit of an integer time value, from its semantic type name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimeUnit {
    Days,
    Millis,
    Micros,
    Nanos,
}

/// The unit of an integer time without a semantic type (no envelope), from its column's
/// declared fractional-second precision, as Debezium chooses the semantic type: 0-3 digits
/// are milliseconds (`Timestamp`, `Time`), 4-6 microseconds (`MicroTimestamp`, `MicroTime`),
/// 7-9 nanoseconds (`NanoTimestamp`, `NanoTime`). Undeclared (`TIMESTAMP`, `TIME`) is 6.
fn precision_unit(precision: Option<u8>) -> Result<TimeUnit, String> {
    match precision.unwrap_or(6) {
        0..=3 => Ok(TimeUnit::Millis),
        4..=6 => Ok(TimeUnit::Micros),
        7..=9 => Ok(TimeUnit::Nanos),
        p => Err(format!(
            "the column's declared precision {p} is beyond nanoseconds, so an integer time \
             without the envelope schema has no unit"
        )),
    }
}

/// The unit of an integer date/time with semantic type `name`, and whether it is a time of day
/// (microseconds since midnight and the like) rather than a point in time. Without a semantic
/// type (no envelope) the column's declared `precision` gives the unit ([`precision_unit`]).
fn int_time_unit(name: Option<&str>, precision: Option<u8>) -> Result<(TimeUnit, bool), String> {
    Ok(match name {
        None => (precision_unit(precision)?, false),
        Some(TIMESTAMP_US) => (TimeUnit::Micros, false),
        Some(TIMESTAMP_MS | CONNECT_TIMESTAMP_MS) => (TimeUnit::Millis, false),
        Some(TIMESTAMP_NS) => (TimeUnit::Nanos, false),
        Some(DATE | CONNECT_DATE) => (TimeUnit::Days, false),
        Some(TIME_US) => (TimeUnit::Micros, true),
        Some(TIME_MS | CONNECT_TIME_MS) => (TimeUnit::Millis, true),
        Some(TIME_NS) => (TimeUnit::Nanos, true),
        Some(other) => {
            return Err(format!(
                "an integer of semantic type `{other}` is not a date or time"
            ));
        }
    })
}

/// Microseconds from an integer in `unit`; nanoseconds round toward negative infinity, so a
/// time before the epoch stays before it.
fn to_micros(n: i64, unit: TimeUnit) -> Result<i64, String> {
    let overflow = || format!("{n} {unit:?} overflows a microsecond timestamp");
    match unit {
        TimeUnit::Days => n.checked_mul(MICROS_PER_DAY).ok_or_else(overflow),
        TimeUnit::Millis => n.checked_mul(1000).ok_or_else(overflow),
        TimeUnit::Micros => Ok(n),
        TimeUnit::Nanos => Ok(n.div_euclid(1000)),
    }
}

fn epoch_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(1970, 1, 1).expect("1970-01-01 is a date")
}

fn days_since_epoch(d: NaiveDate) -> Result<i32, String> {
    let days = d.signed_duration_since(epoch_day()).num_days();
    i32::try_from(days).map_err(|_| format!("{d} is out of the date range"))
}

/// A date as days since 1970-01-01: an integer (`io.debezium.time.Date`, or a timestamp that
/// falls exactly on midnight UTC, as Oracle's DATE arrives) or a `YYYY-MM-DD` string.
fn to_date(v: &Json, name: Option<&str>) -> Result<i32, String> {
    match v {
        Json::Number(n) => {
            let n = n
                .as_i64()
                .ok_or_else(|| format!("expected an integer date, got {n}"))?;
            // Without a semantic type, an integer date is days, as io.debezium.time.Date.
            let (unit, time_of_day) = int_time_unit(Some(name.unwrap_or(DATE)), None)?;
            if time_of_day {
                return Err(format!(
                    "a time of day ({}) is not a date",
                    name.unwrap_or("")
                ));
            }
            if unit == TimeUnit::Days {
                return i32::try_from(n).map_err(|_| format!("{n} days is out of the date range"));
            }
            let micros = to_micros(n, unit)?;
            if micros.rem_euclid(MICROS_PER_DAY) != 0 {
                return Err(format!(
                    "timestamp {n} ({unit:?}) is not at midnight, so not a date"
                ));
            }
            i32::try_from(micros.div_euclid(MICROS_PER_DAY))
                .map_err(|_| format!("{n} ({unit:?}) is out of the date range"))
        }
        Json::String(s) => {
            let d = NaiveDate::parse_from_str(s, "%Y-%m-%d")
                .map_err(|e| format!("{s:?} is not a YYYY-MM-DD date: {e}"))?;
            days_since_epoch(d)
        }
        other => Err(format!(
            "expected a date (days or YYYY-MM-DD), got {}",
            describe(other)
        )),
    }
}

/// A timestamp as microseconds since the epoch, UTC: an integer in the unit its semantic type
/// names (without one, the unit of the column's declared `precision`; a time of day is taken
/// on 1970-01-01) or a string.
fn to_timestamp(v: &Json, name: Option<&str>, precision: Option<u8>) -> Result<i64, String> {
    match v {
        Json::Number(n) => {
            let n = n
                .as_i64()
                .ok_or_else(|| format!("expected an integer timestamp, got {n}"))?;
            let (unit, _) = int_time_unit(name, precision)?;
            to_micros(n, unit)
        }
        Json::String(s) => parse_timestamp(s),
        other => Err(format!(
            "expected a timestamp (integer or string), got {}",
            describe(other)
        )),
    }
}

/// A time of day as microseconds since midnight: an integer in the unit its semantic type
/// names (`Time`, `MicroTime`, `NanoTime`; without one, the unit of the column's declared
/// `precision`) or `HH:MM:SS[.f]` text (`io.debezium.time.ZonedTime` with its `Z`). Postgres'
/// `24:00:00` is the end of the day; anything outside [0, 24:00:00] is an error (MySQL TIME
/// holds durations beyond a day: declare such a column `bigint`).
fn to_time(v: &Json, name: Option<&str>, precision: Option<u8>) -> Result<i64, String> {
    let micros = match v {
        Json::Number(n) => {
            let n = n
                .as_i64()
                .ok_or_else(|| format!("expected an integer time of day, got {n}"))?;
            let (unit, time_of_day) = int_time_unit(name, precision)?;
            if name.is_some() && !time_of_day {
                return Err(format!(
                    "a value of semantic type `{}` is not a time of day",
                    name.unwrap_or_default()
                ));
            }
            to_micros(n, unit)?
        }
        Json::String(s) => {
            let text = s.strip_suffix('Z').unwrap_or(s);
            let end_of_day = text == "24:00:00"
                || (text.starts_with("24:00:00.") && text[9..].bytes().all(|b| b == b'0'));
            if end_of_day {
                MICROS_PER_DAY
            } else {
                let t = NaiveTime::parse_from_str(text, "%H:%M:%S%.f")
                    .map_err(|e| format!("{s:?} is not a HH:MM:SS[.f] time of day: {e}"))?;
                i64::from(t.num_seconds_from_midnight()) * 1_000_000
                    + i64::from(t.nanosecond() / 1000)
            }
        }
        other => {
            return Err(format!(
                "expected a time of day (integer or HH:MM:SS), got {}",
                describe(other)
            ));
        }
    };
    if !(0..=MICROS_PER_DAY).contains(&micros) {
        return Err(format!("{micros} microseconds is not a time of day"));
    }
    Ok(micros)
}

/// Parses `io.debezium.time.ZonedTimestamp` text (RFC 3339, `Z` or an offset) and plain
/// `YYYY-MM-DD[ T]HH:MM:SS[.f]` or `YYYY-MM-DD`, which are taken as UTC. Sub-microsecond digits
/// are truncated toward negative infinity.
fn parse_timestamp(s: &str) -> Result<i64, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        return Ok(t.timestamp_micros());
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f%#z", "%Y-%m-%dT%H:%M:%S%.f%#z"] {
        if let Ok(t) = DateTime::parse_from_str(s, format) {
            return Ok(t.timestamp_micros());
        }
    }
    for format in ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(s, format) {
            return Ok(t.and_utc().timestamp_micros());
        }
    }
    if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return i64::from(days_since_epoch(d)?)
            .checked_mul(MICROS_PER_DAY)
            .ok_or_else(|| format!("{s:?} is out of the timestamp range"));
    }
    Err(format!(
        "{s:?} is not a timestamp (expected e.g. 2024-03-01T12:34:56.789Z, \
         2024-03-01T12:34:56+02:00 or 2024-03-01 12:34:56.123456)"
    ))
}

/// A complete source transaction, its events in `total_order`.
#[derive(Clone, Debug)]
pub struct Transaction {
    pub id: String,
    pub events: Vec<ChangeEvent>,
    pub begin: SourcePosition,
    pub end: SourcePosition,
}

/// Whether the stream carries BEGIN/END transaction metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnMode {
    /// Events are grouped by BEGIN/END (`provide.transaction.metadata=true`).
    Metadata,
    /// Every change event is its own transaction (`--no-txn-metadata`).
    NoMetadata,
}

#[derive(Debug)]
struct OpenTxn {
    /// The id as its BEGIN wrote it (with Postgres, `txId:LSN` at the BEGIN).
    id: String,
    begin: SourcePosition,
    events: Vec<ChangeEvent>,
    /// Transactional logical decoding messages skipped inside it; Debezium counts them among
    /// the transaction's events.
    messages: u64,
}

/// Reassembles source transactions from parsed messages, checks them against END's counts, and
/// drops transactions that were already applied (a source replaying from an older offset).
///
/// Snapshot reads (`op` `r`) carry no transaction block even with metadata on; outside a
/// transaction each one is a transaction of its own, identified by its position, as in
/// [`TxnMode::NoMetadata`].
///
/// Transaction ids are matched as the connector defines them ([`same_transaction`]): BEGIN
/// and END carry no `source`, so the connector is the one the last change event named.
#[derive(Debug)]
pub struct TxnAssembler {
    mode: TxnMode,
    open: Option<OpenTxn>,
    /// `source.connector` of the last change event.
    connector: Option<String>,
    /// Open transactions restarted by a repeated BEGIN.
    restarts: u64,
    /// Ids of the most recently applied transactions, as a set and in applied order (to evict
    /// the oldest beyond [`APPLIED_IDS_REMEMBERED`]).
    applied: HashSet<Arc<str>>,
    applied_order: VecDeque<Arc<str>>,
    last_applied: Option<(String, SourcePosition)>,
    duplicates_skipped: u64,
}

impl TxnAssembler {
    pub fn new(mode: TxnMode) -> Self {
        TxnAssembler {
            mode,
            open: None,
            connector: None,
            restarts: 0,
            applied: HashSet::new(),
            applied_order: VecDeque::new(),
            last_applied: None,
            duplicates_skipped: 0,
        }
    }

    pub fn mode(&self) -> TxnMode {
        self.mode
    }

    /// Takes the next message; returns a transaction when one is complete. After an error the
    /// transaction it broke is discarded and the assembler takes the next message.
    pub fn push(&mut self, msg: Message) -> Result<Option<Transaction>, DebeziumError> {
        match (self.mode, msg) {
            (_, Message::Tombstone { .. }) => Ok(None),
            (TxnMode::NoMetadata, Message::Skipped { .. }) => Ok(None),
            (TxnMode::Metadata, Message::Skipped { txn, .. }) => {
                // Counted toward the open transaction's END when it belongs to it; a message
                // outside any transaction stands alone.
                if let (Some(open), Some(t)) = (self.open.as_mut(), txn)
                    && same_transaction(&open.id, &t.id, self.connector.as_deref())
                {
                    open.messages += 1;
                }
                Ok(None)
            }
            (TxnMode::NoMetadata, Message::Begin { id, pos } | Message::End { id, pos, .. }) => {
                Err(DebeziumError::Transaction {
                    pos,
                    id,
                    reason: "transaction metadata in a stream replayed with --no-txn-metadata; \
                             replay without that flag"
                        .into(),
                })
            }
            (TxnMode::NoMetadata, Message::Change(ev)) => Ok(self.single(ev)),
            (TxnMode::Metadata, Message::Begin { id, pos }) => self.on_begin(id, pos),
            (TxnMode::Metadata, Message::Change(ev)) => self.on_change(ev),
            (
                TxnMode::Metadata,
                Message::End {
                    id,
                    event_count,
                    data_collections,
                    pos,
                },
            ) => self.on_end(id, event_count, &data_collections, pos),
        }
    }

    /// Discards the open transaction, if any (after the caller skipped input, say).
    pub fn reset(&mut self) {
        self.open = None;
    }

    /// The id of the transaction between its BEGIN and END, if any.
    pub fn open_transaction(&self) -> Option<&str> {
        self.open.as_ref().map(|t| t.id.as_str())
    }

    /// Where the open transaction's (latest) BEGIN is, if one is open.
    pub fn open_begin(&self) -> Option<&SourcePosition> {
        self.open.as_ref().map(|t| &t.begin)
    }

    /// Whether ids `a` and `b` name the same transaction, for the connector of the stream so
    /// far ([`same_transaction`]).
    pub fn same_transaction(&self, a: &str, b: &str) -> bool {
        same_transaction(a, b, self.connector.as_deref())
    }

    /// How many open transactions a repeated BEGIN restarted.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Records that transaction `id`, ending at `end`, is durably applied: a later transaction
    /// with the same id is dropped as a duplicate. The assembler never calls this itself.
    pub fn mark_applied(&mut self, id: &str, end: &SourcePosition) {
        let key = self.applied_key(id).to_owned();
        self.remember(&key);
        self.last_applied = Some((id.to_owned(), end.clone()));
    }

    /// The ids of the `n` most recently applied transactions, oldest first: what a
    /// checkpoint records so that a restart still recognises them.
    pub fn recent_applied(&self, n: usize) -> Vec<String> {
        let skip = self.applied_order.len().saturating_sub(n);
        self.applied_order
            .iter()
            .skip(skip)
            .map(|id| id.to_string())
            .collect()
    }

    /// Remembers `ids` (oldest first; as [`TxnAssembler::recent_applied`] gave them) as
    /// applied, as after a restart from a checkpoint that recorded them: a later transaction
    /// with one of these ids is a duplicate.
    pub fn remember_applied<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>) {
        for id in ids {
            self.remember(id);
        }
    }

    /// What identifies transaction `id` among applied ones: the id as the connector compares
    /// it ([`same_transaction`]), so Postgres's `txId` part alone; its LSN part may differ
    /// when the connector redelivers after its own restart.
    /// A stand-alone event's id (its position) is kept whole.
    fn applied_key<'a>(&self, id: &'a str) -> &'a str {
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        match id.split_once(':') {
            Some((txid, lsn))
                if self.connector.as_deref() == Some(POSTGRES_CONNECTOR)
                    && numeric(txid)
                    && numeric(lsn) =>
            {
                txid
            }
            _ => id,
        }
    }

    fn remember(&mut self, id: &str) {
        if self.applied.contains(id) {
            return;
        }
        if self.applied_order.len() == APPLIED_IDS_REMEMBERED
            && let Some(oldest) = self.applied_order.pop_front()
        {
            self.applied.remove(&oldest);
        }
        let id: Arc<str> = id.into();
        self.applied.insert(id.clone());
        self.applied_order.push_back(id);
    }

    /// The last transaction passed to [`TxnAssembler::mark_applied`] and where it ended.
    pub fn last_applied(&self) -> Option<(&str, &SourcePosition)> {
        self.last_applied
            .as_ref()
            .map(|(id, pos)| (id.as_str(), pos))
    }

    /// How many complete transactions were dropped as already applied.
    pub fn duplicates_skipped(&self) -> u64 {
        self.duplicates_skipped
    }

    /// `txn`, unless it was already applied.
    fn emit(&mut self, txn: Transaction) -> Option<Transaction> {
        if self.applied.contains(self.applied_key(&txn.id)) {
            self.duplicates_skipped += 1;
            return None;
        }
        Some(txn)
    }

    /// A transaction of one event, identified by its position.
    fn single(&mut self, ev: ChangeEvent) -> Option<Transaction> {
        self.emit(Transaction {
            id: ev.pos.to_string(),
            begin: ev.pos.clone(),
            end: ev.pos.clone(),
            events: vec![ev],
        })
    }

    fn on_begin(
        &mut self,
        id: String,
        pos: SourcePosition,
    ) -> Result<Option<Transaction>, DebeziumError> {
        let previous = self.open.replace(OpenTxn {
            id: id.clone(),
            begin: pos.clone(),
            events: Vec::new(),
            messages: 0,
        });
        match previous {
            None => Ok(None),
            // The source delivers the open transaction again from its BEGIN (a redelivery after
            // a partial one): the events so far are dropped and the transaction starts over.
            Some(old) if self.same_transaction(&old.id, &id) => {
                self.restarts += 1;
                tracing::warn!(
                    "{pos}: transaction `{id}` begins again while open since {} with {} events; \
                     restarting it from this BEGIN",
                    old.begin,
                    old.events.len()
                );
                Ok(None)
            }
            // The new transaction stays open: only the one whose END went missing is broken.
            Some(old) => Err(DebeziumError::Transaction {
                pos,
                id,
                reason: format!(
                    "BEGIN while transaction `{}` (begun at {}) is open; its END is missing, so \
                     it was discarded",
                    old.id, old.begin
                ),
            }),
        }
    }

    fn on_change(&mut self, ev: ChangeEvent) -> Result<Option<Transaction>, DebeziumError> {
        if ev.connector.is_some() {
            self.connector.clone_from(&ev.connector);
        }
        let Some(open) = self.open.as_mut() else {
            return match &ev.txn {
                Some(t) => Err(DebeziumError::Transaction {
                    pos: ev.pos.clone(),
                    id: t.id.clone(),
                    reason: "change event outside BEGIN/END: its BEGIN is missing; start the \
                             replay at a BEGIN"
                        .into(),
                }),
                None if ev.snapshot => Ok(self.single(ev)),
                None => Err(DebeziumError::MissingTxnMetadata {
                    pos: ev.pos.clone(),
                }),
            };
        };
        match &ev.txn {
            Some(t) if same_transaction(&t.id, &open.id, ev.connector.as_deref()) => {
                open.events.push(ev);
                Ok(None)
            }
            Some(t) => {
                let err = DebeziumError::Transaction {
                    pos: ev.pos.clone(),
                    id: t.id.clone(),
                    reason: format!(
                        "change event inside transaction `{}` (begun at {}); that transaction \
                         was discarded",
                        open.id, open.begin
                    ),
                };
                self.open = None;
                Err(err)
            }
            None => {
                let err = DebeziumError::Transaction {
                    pos: ev.pos.clone(),
                    id: open.id.clone(),
                    reason: "change event without a `transaction` block between BEGIN and END; \
                             the transaction was discarded"
                        .into(),
                };
                self.open = None;
                Err(err)
            }
        }
    }

    fn on_end(
        &mut self,
        id: String,
        event_count: u64,
        data_collections: &[(String, u64)],
        pos: SourcePosition,
    ) -> Result<Option<Transaction>, DebeziumError> {
        let Some(open) = self.open.take() else {
            return Err(DebeziumError::Transaction {
                pos,
                id,
                reason: "END without a BEGIN; start the replay at a BEGIN".into(),
            });
        };
        if !self.same_transaction(&open.id, &id) {
            return Err(DebeziumError::Transaction {
                pos,
                id,
                reason: format!(
                    "END while transaction `{}` (begun at {}) is open; both were discarded",
                    open.id, open.begin
                ),
            });
        }
        let mismatch =
            |collection: Option<&str>, expected: u64, got: usize| DebeziumError::CountMismatch {
                pos: pos.clone(),
                id: id.clone(),
                collection: collection.map(str::to_owned),
                expected,
                got: got as u64,
            };
        let got = open.events.len() + open.messages as usize;
        if got as u64 != event_count {
            return Err(mismatch(None, event_count, got));
        }
        // Logical decoding messages are on a collection of their own that no table event
        // matches: the counts of such collections add up to the messages.
        let mut message_counts = 0;
        for (name, expected) in data_collections {
            let got = open
                .events
                .iter()
                .filter(|e| collection_matches(name, &e.data_collection))
                .count();
            if got == 0 && open.messages > 0 {
                message_counts += *expected;
            } else if got as u64 != *expected {
                return Err(mismatch(Some(name), *expected, got));
            }
        }
        if open.messages > 0 && !data_collections.is_empty() && message_counts != open.messages {
            return Err(mismatch(None, message_counts, open.messages as usize));
        }
        if !data_collections.is_empty()
            && let Some(stray) = open.events.iter().find(|e| {
                !data_collections
                    .iter()
                    .any(|(name, _)| collection_matches(name, &e.data_collection))
            })
        {
            return Err(DebeziumError::Transaction {
                pos,
                id,
                reason: format!(
                    "the event at {} on `{}` is on no data collection END lists",
                    stray.pos, stray.data_collection
                ),
            });
        }
        let mut events = open.events;
        events.sort_by_key(|e| e.txn.as_ref().map_or(0, |t| t.total_order));
        Ok(self.emit(Transaction {
            id,
            events,
            begin: open.begin,
            end: pos,
        }))
    }
}

/// Whether END's data collection `listed` names an event's `data_collection`. Connectors whose
/// tables have three-part names (SQL Server, Db2, Oracle: `db.schema.table`) list the database
/// too, which the event's `schema.table` lacks, so a `.`-separated suffix matches.
fn collection_matches(listed: &str, data_collection: &str) -> bool {
    listed == data_collection
        || listed
            .strip_suffix(data_collection)
            .is_some_and(|prefix| prefix.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use retina_storage::ColumnDef;
    use serde_json::json;

    fn at(line: u64) -> SourcePosition {
        SourcePosition::new("events.json", line)
    }

    fn orders() -> Arc<TableSchema> {
        TableSchema::new(
            "public.orders",
            vec![
                ColumnDef::new("id", ColumnType::Int64, false),
                ColumnDef::new("qty", ColumnType::Int32, false),
                ColumnDef::new(
                    "price",
                    ColumnType::Decimal {
                        precision: 10,
                        scale: 2,
                    },
                    true,
                ),
                ColumnDef::new("note", ColumnType::Utf8, true),
                ColumnDef::new("created", ColumnType::Timestamp, true),
                ColumnDef::new("day", ColumnType::Date, true),
            ],
            &["id"],
        )
        .unwrap()
    }

    fn items() -> Arc<TableSchema> {
        TableSchema::new(
            "items",
            vec![
                ColumnDef::new("a", ColumnType::Int32, false),
                ColumnDef::new("b", ColumnType::Utf8, false),
                ColumnDef::new("ok", ColumnType::Boolean, true),
                ColumnDef::new("ratio", ColumnType::Float64, true),
            ],
            &["a", "b"],
        )
        .unwrap()
    }

    fn catalog(name: &str) -> Option<Arc<TableSchema>> {
        match name {
            "public.orders" => Some(orders()),
            "items" => Some(items()),
            _ => None,
        }
    }

    fn parse(line: &str, n: u64) -> Result<Message, DebeziumError> {
        parse_line(line, &at(n), &catalog)
    }

    fn change(line: &str) -> ChangeEvent {
        match parse(line, 1).unwrap() {
            Message::Change(ev) => ev,
            other => panic!("expected a change, got {other:?}"),
        }
    }

    fn order_row(id: i64, qty: i64, price: Option<i128>) -> Vec<Value> {
        vec![
            Value::Int(id),
            Value::Int(qty),
            price.map_or(Value::Null, Value::Decimal),
            Value::Null,
            Value::Null,
            Value::Null,
        ]
    }

    fn key_row(id: i64) -> Vec<Value> {
        let mut row = vec![Value::Null; 6];
        row[0] = Value::Int(id);
        row
    }

    /// A bare payload on `public.orders`.
    fn event(op: &str, before: Json, after: Json, txn: Option<(&str, u64)>) -> Json {
        json!({
            "before": before,
            "after": after,
            "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": "orders"},
            "op": op,
            "ts_ms": 1_700_000_000_000u64,
            "transaction": txn.map(|(id, order)| json!({
                "id": id, "total_order": order, "data_collection_order": order
            })),
        })
    }

    /// The envelope schema of `public.orders` as the Postgres connector writes it with
    /// decimal.handling.mode=precise and time.precision.mode=adaptive_time_microseconds.
    fn orders_fields() -> Json {
        json!([
            {"type": "int64", "optional": false, "field": "id"},
            {"type": "int32", "optional": false, "field": "qty"},
            {"type": "bytes", "optional": true, "name": CONNECT_DECIMAL, "version": 1,
             "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
            {"type": "string", "optional": true, "field": "note"},
            {"type": "int64", "optional": true, "name": TIMESTAMP_US, "version": 1, "field": "created"},
            {"type": "int32", "optional": true, "name": DATE, "version": 1, "field": "day"}
        ])
    }

    fn envelope(payload: Json, fields: Json) -> String {
        json!({
            "schema": {
                "type": "struct",
                "name": "shop.public.orders.Envelope",
                "fields": [
                    {"type": "struct", "optional": true, "field": "before", "fields": fields},
                    {"type": "struct", "optional": true, "field": "after", "fields": fields},
                    {"type": "struct", "optional": false, "field": "source", "fields": []},
                    {"type": "string", "optional": false, "field": "op"}
                ]
            },
            "payload": payload,
        })
        .to_string()
    }

    #[test]
    fn position_display() {
        assert_eq!(at(17).to_string(), "events.json:17");
        assert_eq!(SourcePosition::new("stdin", 1).to_string(), "stdin:1");
    }

    #[test]
    fn every_op_in_the_bare_form() {
        let row = json!({"id": 1, "qty": 2, "price": "3.5", "extra": "ignored"});
        let ev = change(&event("c", Json::Null, row.clone(), Some(("t1", 1))).to_string());
        assert_eq!(ev.op, ChangeOp::Insert(order_row(1, 2, Some(350))));
        assert_eq!(ev.table.name(), "public.orders");
        assert_eq!(ev.data_collection, "public.orders");
        assert!(!ev.snapshot);
        assert_eq!(
            ev.txn,
            Some(TxnRef {
                id: "t1".into(),
                total_order: 1,
                data_collection_order: 1
            })
        );
        assert_eq!(ev.pos, at(1));

        // A snapshot read is an upsert: Debezium re-sends reads of rows it already sent.
        let ev = change(&event("r", Json::Null, row.clone(), None).to_string());
        assert_eq!(ev.op, ChangeOp::Upsert(order_row(1, 2, Some(350))));
        assert!(ev.snapshot);
        assert_eq!(ev.txn, None);

        let after = json!({"id": 1, "qty": 5, "price": null});
        let ev = change(&event("u", row.clone(), after.clone(), None).to_string());
        assert_eq!(
            ev.op,
            ChangeOp::Update {
                before: order_row(1, 2, Some(350)),
                after: order_row(1, 5, None),
            }
        );

        // No before image (REPLICA IDENTITY DEFAULT): the after image's key stands in.
        let ev = change(&event("u", Json::Null, after, None).to_string());
        assert_eq!(
            ev.op,
            ChangeOp::Update {
                before: key_row(1),
                after: order_row(1, 5, None),
            }
        );

        // A delete's before image may hold only the key, or nulls in NOT NULL columns.
        let ev = change(&event("d", json!({"id": 7}), Json::Null, None).to_string());
        assert_eq!(ev.op, ChangeOp::Delete(key_row(7)));
        let ev = change(&event("d", json!({"id": 7, "qty": null}), Json::Null, None).to_string());
        assert_eq!(ev.op, ChangeOp::Delete(key_row(7)));
        let op: RowOp<Vec<Value>> = ev.op.into();
        assert_eq!(op, RowOp::Delete(key_row(7)));
    }

    #[test]
    fn every_op_in_the_envelope_form() {
        // 123.45 at scale 2 is 12345 = 0x3039; 2024-03-01T12:34:56Z; 2024-03-01 is day 19783.
        let created = 1_709_296_496_000_000i64;
        let row = json!({"id": 1, "qty": 2, "price": "MDk=", "created": created, "day": 19783});
        let expected = vec![
            Value::Int(1),
            Value::Int(2),
            Value::Decimal(12345),
            Value::Null,
            Value::Timestamp(created),
            Value::Date(19783),
        ];
        let fields = orders_fields();
        let line = envelope(event("c", Json::Null, row.clone(), None), fields.clone());
        assert_eq!(change(&line).op, ChangeOp::Insert(expected.clone()));
        let line = envelope(event("r", Json::Null, row.clone(), None), fields.clone());
        assert_eq!(change(&line).op, ChangeOp::Upsert(expected.clone()));
        let after = json!({"id": 1, "qty": 3, "price": "z8c=", "created": null, "day": -1});
        let line = envelope(event("u", row.clone(), after, None), fields.clone());
        let ChangeOp::Update { before, after } = change(&line).op else {
            panic!("an update")
        };
        assert_eq!(before, expected);
        assert_eq!(after[2], Value::Decimal(-12345));
        assert_eq!(after[5], Value::Date(-1));
        let line = envelope(event("d", row, Json::Null, None), fields.clone());
        assert_eq!(change(&line).op, ChangeOp::Delete(expected));
        let line = envelope(event("t", Json::Null, Json::Null, None), fields);
        assert_eq!(change(&line).op, ChangeOp::Truncate);
        let op: RowOp<Vec<Value>> = change(&line).op.into();
        assert_eq!(op, RowOp::Truncate);
    }

    #[test]
    fn envelope_scale_differs_from_the_column() {
        // 12345 at scale 3 is 12.345: exact at scale 2 only if the last digit is 0.
        let fields = |scale: &str| json!([{"type": "bytes", "name": CONNECT_DECIMAL, "parameters": {"scale": scale}, "field": "price"}]);
        let row = |b64: &str| json!({"id": 1, "qty": 1, "price": b64});
        let b64 = |v: i128| {
            let bytes = v.to_be_bytes();
            base64::engine::general_purpose::STANDARD.encode(&bytes[14..])
        };
        let line = envelope(event("c", Json::Null, row(&b64(12340)), None), fields("3"));
        assert_eq!(
            change(&line).op,
            ChangeOp::Insert(order_row(1, 1, Some(1234)))
        );
        let line = envelope(event("c", Json::Null, row(&b64(12345)), None), fields("3"));
        let e = parse(&line, 4).unwrap_err().to_string();
        assert!(
            e.starts_with("events.json:4: table `public.orders`, column `price`:"),
            "{e}"
        );
        let line = envelope(event("c", Json::Null, row(&b64(123)), None), fields("0"));
        assert_eq!(
            change(&line).op,
            ChangeOp::Insert(order_row(1, 1, Some(12300)))
        );
    }

    #[test]
    fn table_resolution() {
        // `items` is only in the catalog under its bare name; MySQL names the db, not a schema.
        let line = json!({
            "before": null,
            "after": {"a": 1, "b": "x", "ok": 1, "ratio": 2},
            "source": {"connector": "mysql", "db": "inventory", "table": "items"},
            "op": "c"
        });
        let ev = change(&line.to_string());
        assert_eq!(ev.table.name(), "items");
        assert_eq!(ev.data_collection, "inventory.items");
        assert_eq!(
            ev.op,
            ChangeOp::Insert(vec![
                Value::Int(1),
                Value::Utf8("x".into()),
                Value::Boolean(true),
                Value::Float(2.0)
            ])
        );

        let line = json!({
            "after": {"a": 1}, "source": {"schema": "sales", "table": "nope"}, "op": "c"
        });
        let e = parse(&line.to_string(), 9).unwrap_err();
        assert!(
            matches!(&e, DebeziumError::UnknownTable { tried, .. } if tried == &["sales.nope", "nope"])
        );
        assert_eq!(e.position(), &at(9));
        assert!(
            e.to_string()
                .starts_with("events.json:9: unknown table (tried `sales.nope`, `nope`)"),
            "{e}"
        );
    }

    #[test]
    fn missing_and_invalid_columns() {
        let e = parse(
            &event("c", Json::Null, json!({"qty": 1}), None).to_string(),
            5,
        )
        .unwrap_err();
        assert!(
            matches!(&e, DebeziumError::MissingColumn { table, column, image: "after", .. }
                if table == "public.orders" && column == "id")
        );
        assert!(
            e.to_string().starts_with(
                "events.json:5: table `public.orders`: the after image has no column `id`"
            ),
            "{e}"
        );
        // A NOT NULL non-key column must be in an after image, not in a before image.
        let e = parse(
            &event("c", Json::Null, json!({"id": 1}), None).to_string(),
            5,
        )
        .unwrap_err();
        assert!(matches!(&e, DebeziumError::MissingColumn { column, .. } if column == "qty"));
        let e = parse(
            &event("d", json!({"qty": 1}), Json::Null, None).to_string(),
            6,
        )
        .unwrap_err();
        assert!(
            matches!(&e, DebeziumError::MissingColumn { column, image: "before", .. } if column == "id")
        );

        let e = parse(
            &event("c", Json::Null, json!({"id": 1, "qty": 1_i64 << 40}), None).to_string(),
            8,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "events.json:8: table `public.orders`, column `qty`: 1099511627776 does not fit in int"
        );
        let e = parse(
            &event("c", Json::Null, json!({"id": 1, "qty": null}), None).to_string(),
            8,
        )
        .unwrap_err();
        assert!(
            e.to_string().ends_with("null in a column that is NOT NULL"),
            "{e}"
        );
        // A key column is checked in a before image too.
        let e = parse(
            &event("d", json!({"id": null}), Json::Null, None).to_string(),
            8,
        )
        .unwrap_err();
        assert!(matches!(&e, DebeziumError::Value { column, .. } if column == "id"));
        let e = parse(
            &event(
                "c",
                Json::Null,
                json!({"id": 1, "qty": 1, "price": "1234567890.5"}),
                None,
            )
            .to_string(),
            8,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("does not fit in decimal(10,2)"),
            "{e}"
        );
        let e = parse(
            &event("c", Json::Null, json!({"id": 1, "qty": 1, "note": 5}), None).to_string(),
            8,
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .ends_with("column `note`: expected a string, got number 5"),
            "{e}"
        );
    }

    #[test]
    fn malformed_lines() {
        let cases = [
            ("{not json", "not JSON"),
            ("[1, 2]", "expected a JSON object"),
            (r#"{"hello": 1}"#, "neither a change event"),
            (
                r#"{"op": "x", "source": {"table": "orders"}}"#,
                "unknown op \"x\"",
            ),
            (
                r#"{"op": "c", "after": {"id": 1}}"#,
                "without a `source` object",
            ),
            (
                r#"{"op": "c", "source": {"schema": "public", "table": "orders"}}"#,
                "without the `after` image",
            ),
            (
                r#"{"op": "c", "after": 3, "source": {"schema": "public", "table": "orders"}}"#,
                "`after` must be an object",
            ),
            (
                r#"{"status": "MIDDLE", "id": "1"}"#,
                "expected \"BEGIN\" or \"END\"",
            ),
            (
                r#"{"status": "END", "id": "1"}"#,
                "without an `event_count`",
            ),
            (r#"{"status": "BEGIN"}"#, "without a string `id`"),
            (
                r#"{"op": "c", "after": {"id": 1, "qty": 1}, "source": {"schema": "public", "table": "orders"}, "transaction": {"id": "1"}}"#,
                "`transaction` needs",
            ),
        ];
        for (line, reason) in cases {
            let e = parse(line, 3).unwrap_err();
            assert!(matches!(e, DebeziumError::Malformed { .. }), "{line}: {e}");
            let text = e.to_string();
            assert!(
                text.starts_with("events.json:3: malformed Debezium message: "),
                "{text}"
            );
            assert!(text.contains(reason), "{line}: {text}");
        }
        // A truncate names its table like any change.
        let e = parse(r#"{"op": "t", "source": {"table": "ghosts"}}"#, 17).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("events.json:17: unknown table (tried `ghosts`)"),
            "{e}"
        );
        // Tombstones carry nothing.
        for line in ["null", "", "  ", r#"{"schema": null, "payload": null}"#] {
            assert!(
                matches!(parse(line, 4), Ok(Message::Tombstone { .. })),
                "{line:?}"
            );
        }
    }

    #[test]
    fn transaction_markers() {
        let begin = r#"{"status":"BEGIN","id":"571:53195832","ts_ms":1,"event_count":null,"data_collections":null}"#;
        let Message::Begin { id, pos } = parse(begin, 1).unwrap() else {
            panic!("a BEGIN")
        };
        assert_eq!((id.as_str(), pos), ("571:53195832", at(1)));
        let end = json!({
            "status": "END", "id": "571:53195832", "event_count": 3,
            "data_collections": [
                {"data_collection": "public.orders", "event_count": 2},
                {"data_collection": "public.items", "event_count": "1"}
            ]
        });
        let expected = vec![
            ("public.orders".to_owned(), 2),
            ("public.items".to_owned(), 1),
        ];
        for line in [
            end.to_string(),
            json!({"schema": {"type": "struct"}, "payload": end}).to_string(),
        ] {
            let Message::End {
                id,
                event_count,
                data_collections,
                ..
            } = parse(&line, 2).unwrap()
            else {
                panic!("an END")
            };
            assert_eq!(id, "571:53195832");
            assert_eq!(event_count, 3);
            assert_eq!(data_collections, expected);
        }
    }

    // --- value conversions ---

    fn no_field() -> FieldType<'static> {
        FieldType::default()
    }

    fn named(name: &'static str) -> FieldType<'static> {
        FieldType {
            name: Some(name),
            ..FieldType::default()
        }
    }

    /// [`convert`] into a nullable column of type `ty` with no declared precision.
    fn conv(ty: ColumnType, v: &Json, field: FieldType<'_>) -> Result<Value, String> {
        convert(
            &ColumnDef::new("c", ty, true),
            v,
            field,
            &ParseOptions::default(),
        )
    }

    #[test]
    fn booleans_integers_floats() {
        assert_eq!(to_bool(&json!(true)), Ok(true));
        assert_eq!(to_bool(&json!(0)), Ok(false));
        assert!(to_bool(&json!(2)).is_err());
        assert!(to_bool(&json!("true")).is_err());
        assert_eq!(to_int(&json!(-42)), Ok(-42));
        assert_eq!(to_int(&json!(i64::MIN)), Ok(i64::MIN));
        assert!(
            to_int(&json!(u64::MAX))
                .unwrap_err()
                .contains("does not fit in bigint")
        );
        assert!(to_int(&json!(1.5)).is_err());
        assert!(to_int(&json!("1")).is_err());
        assert_eq!(to_float(&json!(-1.25)), Ok(-1.25));
        assert_eq!(to_float(&json!(3)), Ok(3.0));
        assert!(to_float(&json!("NaN")).unwrap().is_nan());
        assert_eq!(to_float(&json!("-Infinity")), Ok(f64::NEG_INFINITY));
        assert!(to_float(&json!("1.5")).is_err());
        assert_eq!(
            conv(ColumnType::Utf8, &json!("héllo"), no_field()),
            Ok(Value::Utf8("héllo".into()))
        );
        assert_eq!(
            conv(ColumnType::Int32, &Json::Null, no_field()),
            Ok(Value::Null)
        );
    }

    #[test]
    fn decimal_literals() {
        assert_eq!(parse_decimal("123.45", 2), Ok(12345));
        assert_eq!(parse_decimal("-0.5", 2), Ok(-50));
        assert_eq!(parse_decimal("+7", 3), Ok(7000));
        assert_eq!(parse_decimal(".5", 1), Ok(5));
        assert_eq!(parse_decimal("5.", 1), Ok(50));
        assert_eq!(parse_decimal("0", 0), Ok(0));
        assert_eq!(parse_decimal("-0.000", 2), Ok(0));
        // Extra fractional digits are fine when they are zeros, an error otherwise.
        assert_eq!(parse_decimal("1.2300", 2), Ok(123));
        assert!(
            parse_decimal("1.234", 2)
                .unwrap_err()
                .contains("does not fit at scale 2")
        );
        assert_eq!(parse_decimal("1.5e-3", 4), Ok(15));
        assert_eq!(parse_decimal("1E+3", 0), Ok(1000));
        assert_eq!(parse_decimal("1e21", 0), Ok(1_000_000_000_000_000_000_000));
        assert_eq!(parse_decimal(&format!("1.{}", "0".repeat(60)), 2), Ok(100));
        assert_eq!(
            parse_decimal("99999999999999999999999999999999999999", 0),
            Ok(10i128.pow(38) - 1)
        );
        assert!(parse_decimal("999999999999999999999999999999999999999", 0).is_err());
        assert!(parse_decimal("1e40", 0).is_err());
        assert!(parse_decimal("1e-99999", 2).is_err());
        for bad in [
            "", "-", ".", "1.2.3", "1,5", "abc", "1e", " 1", "--1", "1e5.5",
        ] {
            assert!(parse_decimal(bad, 2).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decimal_bytes_and_numbers() {
        let enc = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        assert_eq!(decode_unscaled("MDk="), Ok(12345));
        assert_eq!(decode_unscaled("z8c="), Ok(-12345));
        assert_eq!(decode_unscaled(&enc(&[0xff])), Ok(-1));
        assert_eq!(decode_unscaled(&enc(&[0x00, 0x80])), Ok(128));
        assert_eq!(
            decode_unscaled(&enc(&i128::MIN.to_be_bytes())),
            Ok(i128::MIN)
        );
        // 17 bytes: fine when the first is sign extension.
        let mut long = vec![0xff];
        long.extend_from_slice(&(-5i128).to_be_bytes());
        assert_eq!(decode_unscaled(&enc(&long)), Ok(-5));
        let mut too_long = vec![0x01];
        too_long.extend_from_slice(&[0; 16]);
        assert!(decode_unscaled(&enc(&too_long)).is_err());
        assert!(decode_unscaled("").is_err());
        assert!(decode_unscaled("!!").is_err());

        // Connect Decimal at the envelope's scale (a string or a number), rescaled exactly to
        // the column's.
        let (scale_1, scale_4) = (json!("1"), json!(4));
        let decimal = |scale: &Json| {
            let f = FieldType {
                connect: Some("bytes"),
                name: Some(CONNECT_DECIMAL),
                scale: Some(scale),
            };
            to_decimal(&json!("MDk="), 2, f, DecimalHandling::String)
        };
        assert_eq!(decimal(&scale_1), Ok(123450));
        assert!(
            decimal(&scale_4)
                .unwrap_err()
                .contains("more fractional digits")
        );
        assert!(decimal(&json!("x")).unwrap_err().contains("not an integer"));
        assert_eq!(decimal(&json!("-1")), Ok(12_345_000));
        assert!(decimal(&json!(i64::MIN)).is_err());

        // decimal.handling.mode=double: through the number's decimal text.
        assert_eq!(
            to_decimal(&json!(123.45), 2, no_field(), DecimalHandling::Double),
            Ok(12345)
        );
        assert_eq!(
            to_decimal(&json!(-0.1), 3, no_field(), DecimalHandling::Double),
            Ok(-100)
        );
        assert_eq!(
            to_decimal(&json!(42), 2, no_field(), DecimalHandling::Double),
            Ok(4200)
        );
        assert!(to_decimal(&json!(0.1 + 0.2), 2, no_field(), DecimalHandling::Double).is_err());
        // decimal.handling.mode=string.
        let string_mode = DecimalHandling::String;
        assert_eq!(
            to_decimal(&json!("-0.5"), 2, no_field(), string_mode),
            Ok(-50)
        );
        // decimal.handling.mode=precise: bytes at the column's scale.
        let precise = DecimalHandling::Precise;
        assert_eq!(
            to_decimal(&json!("z8c="), 2, no_field(), precise),
            Ok(-12345)
        );
        let e = to_decimal(&json!("1.2.3"), 2, no_field(), string_mode).unwrap_err();
        assert!(e.contains("is not a decimal number"), "{e}");
        assert!(to_decimal(&json!("1.2.3"), 2, no_field(), precise).is_err());
        // An envelope that says `string` never reads bytes; one that says `bytes` always does.
        let string = FieldType {
            connect: Some("string"),
            ..FieldType::default()
        };
        assert!(to_decimal(&json!("z8c="), 2, string, precise).is_err());
        let bytes = FieldType {
            connect: Some("bytes"),
            ..FieldType::default()
        };
        assert_eq!(
            to_decimal(&json!("MTI="), 2, bytes, string_mode),
            Ok(0x3132)
        );
        // io.debezium.data.VariableScaleDecimal.
        assert!(
            to_decimal(
                &json!({"scale": 3, "value": "MDk="}),
                2,
                no_field(),
                DecimalHandling::Double
            )
            .is_err()
        );
        assert_eq!(
            to_decimal(
                &json!({"scale": 1, "value": "MDk="}),
                2,
                no_field(),
                DecimalHandling::Double
            ),
            Ok(123450)
        );
        assert!(
            to_decimal(
                &json!({"value": "MDk="}),
                2,
                no_field(),
                DecimalHandling::Double
            )
            .is_err()
        );
        assert!(to_decimal(&json!(true), 2, no_field(), DecimalHandling::Double).is_err());
        assert_eq!(rescale(-1230, 3, 2), Ok(-123));
        assert!(rescale(i128::MAX, 0, 2).is_err());
        assert_eq!(rescale(0, 60, 2), Ok(0));
    }

    #[test]
    fn integer_times() {
        let ts = |v: i64, name: Option<&'static str>| to_timestamp(&json!(v), name, None);
        assert_eq!(
            ts(1_700_000_000_123, Some(TIMESTAMP_MS)),
            Ok(1_700_000_000_123_000)
        );
        assert_eq!(
            ts(1_700_000_000_123, Some(CONNECT_TIMESTAMP_MS)),
            Ok(1_700_000_000_123_000)
        );
        assert_eq!(
            ts(1_700_000_000_123_456, Some(TIMESTAMP_US)),
            Ok(1_700_000_000_123_456)
        );
        // A bare integer (no envelope) is microseconds.
        assert_eq!(ts(1_700_000_000_123_456, None), Ok(1_700_000_000_123_456));
        assert_eq!(
            ts(1_700_000_000_123_456_789, Some(TIMESTAMP_NS)),
            Ok(1_700_000_000_123_456)
        );
        // Nanoseconds round toward negative infinity.
        assert_eq!(ts(-1, Some(TIMESTAMP_NS)), Ok(-1));
        assert_eq!(ts(-1_001, Some(TIMESTAMP_NS)), Ok(-2));
        assert_eq!(ts(-1_000, Some(TIMESTAMP_NS)), Ok(-1));
        assert_eq!(ts(-86_400_000, Some(TIMESTAMP_MS)), Ok(-MICROS_PER_DAY));
        assert!(ts(i64::MAX, Some(TIMESTAMP_MS)).is_err());
        // Times of day into a timestamp column are on 1970-01-01.
        assert_eq!(ts(45_296_000_000, Some(TIME_US)), Ok(45_296_000_000));
        assert_eq!(ts(45_296_000, Some(TIME_MS)), Ok(45_296_000_000));
        assert_eq!(ts(45_296_000_000_123, Some(TIME_NS)), Ok(45_296_000_000));
        assert_eq!(ts(2, Some(DATE)), Ok(2 * MICROS_PER_DAY));
        assert!(ts(1, Some("io.debezium.time.Year")).is_err());
        assert!(to_timestamp(&json!(1.5), None, None).is_err());
        assert!(to_timestamp(&json!(true), None, None).is_err());
        // Into an integer column a time of day stays as is.
        assert_eq!(
            conv(ColumnType::Int64, &json!(45_296_000_000i64), named(TIME_US)),
            Ok(Value::Int(45_296_000_000))
        );
        assert_eq!(
            conv(
                ColumnType::Timestamp,
                &json!(45_296_000_000i64),
                named(TIME_US)
            ),
            Ok(Value::Timestamp(45_296_000_000))
        );
    }

    #[test]
    fn dates() {
        assert_eq!(to_date(&json!(19783), Some(DATE)), Ok(19783));
        assert_eq!(to_date(&json!(19783), None), Ok(19783));
        assert_eq!(to_date(&json!(-719_162), Some(CONNECT_DATE)), Ok(-719_162));
        assert_eq!(to_date(&json!("2024-03-01"), None), Ok(19783));
        assert_eq!(to_date(&json!("1969-12-31"), None), Ok(-1));
        assert_eq!(to_date(&json!("0001-01-01"), None), Ok(-719_162));
        // A timestamp at midnight is a date (Oracle DATE); elsewhere it is not.
        assert_eq!(to_date(&json!(-86_400_000), Some(TIMESTAMP_MS)), Ok(-1));
        assert!(to_date(&json!(1), Some(TIMESTAMP_MS)).is_err());
        assert!(to_date(&json!(0), Some(TIME_US)).is_err());
        assert!(to_date(&json!(1i64 << 40), None).is_err());
        assert!(to_date(&json!("2024-02-30"), None).is_err());
        assert!(to_date(&json!("01/03/2024"), None).is_err());
        assert!(to_date(&json!(true), None).is_err());
    }

    #[test]
    fn timestamp_strings() {
        let base = 1_709_296_496_000_000; // 2024-03-01T12:34:56Z
        let cases = [
            ("2024-03-01T12:34:56Z", base),
            ("2024-03-01T12:34:56.789Z", base + 789_000),
            ("2024-03-01T12:34:56.123456789Z", base + 123_456),
            ("2024-03-01T14:34:56+02:00", base),
            ("2024-03-01T07:04:56.5-05:30", base + 500_000),
            ("2024-03-01 14:34:56+02:00", base),
            ("2024-03-01T14:34:56+0200", base),
            ("2024-03-01T14:34:56+02", base),
            ("2024-03-01 12:34:56", base),
            ("2024-03-01 12:34:56.000001", base + 1),
            ("2024-03-01T12:34:56", base),
            ("2024-03-01", base - 45_296_000_000),
            ("1969-12-31T23:59:59.9999995Z", -1),
            ("1970-01-01T00:00:00Z", 0),
        ];
        for (text, micros) in cases {
            assert_eq!(parse_timestamp(text), Ok(micros), "{text}");
        }
        for bad in [
            "",
            "infinity",
            "2024-03-01T25:00:00Z",
            "12:34:56",
            "2024-03-01X12:34:56",
        ] {
            let e = parse_timestamp(bad).unwrap_err();
            assert!(e.contains("is not a timestamp"), "{bad}: {e}");
        }
        assert_eq!(
            conv(
                ColumnType::Timestamp,
                &json!("2024-03-01T12:34:56Z"),
                named("io.debezium.time.ZonedTimestamp")
            ),
            Ok(Value::Timestamp(base))
        );
    }

    // --- transactions ---

    fn begin(id: &str, line: u64) -> Message {
        Message::Begin {
            id: id.into(),
            pos: at(line),
        }
    }

    fn end(id: &str, count: u64, collections: &[(&str, u64)], line: u64) -> Message {
        Message::End {
            id: id.into(),
            event_count: count,
            data_collections: collections
                .iter()
                .map(|(n, c)| ((*n).to_owned(), *c))
                .collect(),
            pos: at(line),
        }
    }

    /// An insert of `id` in transaction `txn` at `total_order`, parsed from line `line`.
    fn insert(txn: Option<&str>, total_order: u64, id: i64, line: u64) -> Message {
        let row = json!({"id": id, "qty": 1});
        let line_text = event("c", Json::Null, row, txn.map(|t| (t, total_order))).to_string();
        parse(&line_text, line).unwrap()
    }

    fn ids(txn: &Transaction) -> Vec<i64> {
        txn.events
            .iter()
            .map(|e| match &e.op {
                ChangeOp::Insert(row) => match row[0] {
                    Value::Int(v) => v,
                    _ => unreachable!(),
                },
                _ => unreachable!(),
            })
            .collect()
    }

    fn feed(
        asm: &mut TxnAssembler,
        msgs: Vec<Message>,
    ) -> Vec<Result<Option<Transaction>, DebeziumError>> {
        msgs.into_iter().map(|m| asm.push(m)).collect()
    }

    #[test]
    fn assembles_in_total_order() {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        let out = feed(
            &mut asm,
            vec![
                begin("t1", 1),
                insert(Some("t1"), 3, 30, 2),
                insert(Some("t1"), 1, 10, 3),
                Message::Tombstone { pos: at(4) },
                insert(Some("t1"), 2, 20, 5),
            ],
        );
        assert!(out.iter().all(|r| matches!(r, Ok(None))));
        assert_eq!(asm.open_transaction(), Some("t1"));
        let txn = asm
            .push(end("t1", 3, &[("public.orders", 3)], 6))
            .unwrap()
            .unwrap();
        assert_eq!(txn.id, "t1");
        assert_eq!(ids(&txn), [10, 20, 30]);
        assert_eq!((txn.begin, txn.end), (at(1), at(6)));
        assert_eq!(asm.open_transaction(), None);
        // Empty transactions are transactions too.
        asm.push(begin("t2", 7)).unwrap();
        let txn = asm.push(end("t2", 0, &[], 8)).unwrap().unwrap();
        assert!(txn.events.is_empty());
    }

    #[test]
    fn three_part_collection_names_match() {
        assert!(collection_matches("testDB.dbo.orders", "dbo.orders"));
        assert!(collection_matches("dbo.orders", "dbo.orders"));
        assert!(!collection_matches("testDB.xdbo.orders", "dbo.orders"));
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        asm.push(begin("t", 1)).unwrap();
        asm.push(insert(Some("t"), 1, 1, 2)).unwrap();
        let txn = asm.push(end("t", 1, &[("shop.public.orders", 1)], 3));
        assert!(txn.unwrap().is_some());
    }

    #[test]
    fn count_mismatches() {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        asm.push(begin("t1", 1)).unwrap();
        asm.push(insert(Some("t1"), 1, 1, 2)).unwrap();
        let e = asm.push(end("t1", 2, &[], 3)).unwrap_err();
        assert!(
            matches!(&e, DebeziumError::CountMismatch { id, collection: None, expected: 2, got: 1, .. } if id == "t1")
        );
        assert_eq!(
            e.to_string(),
            "events.json:3: transaction `t1`: END announces 2 events, but 1 arrived; the stream \
             lost or repeated events"
        );
        assert_eq!(
            asm.open_transaction(),
            None,
            "the broken transaction is discarded"
        );

        asm.push(begin("t2", 4)).unwrap();
        asm.push(insert(Some("t2"), 1, 1, 5)).unwrap();
        asm.push(insert(Some("t2"), 2, 2, 6)).unwrap();
        let e = asm
            .push(end(
                "t2",
                2,
                &[("public.orders", 1), ("public.items", 1)],
                7,
            ))
            .unwrap_err();
        assert!(matches!(
            &e,
            DebeziumError::CountMismatch { collection: Some(c), expected: 1, got: 2, .. } if c == "public.orders"
        ));
        assert!(
            e.to_string()
                .contains("END announces 1 events for `public.orders`, but 2 arrived"),
            "{e}"
        );
        assert_eq!(e.position(), &at(7));

        // Counts agree, but an event is on a collection END does not list.
        asm.push(begin("t3", 8)).unwrap();
        asm.push(insert(Some("t3"), 1, 1, 9)).unwrap();
        let e = asm
            .push(end("t3", 1, &[("public.items", 0)], 10))
            .unwrap_err();
        assert!(
            e.to_string().contains("on no data collection END lists"),
            "{e}"
        );

        // The assembler is usable afterwards.
        asm.push(begin("t4", 11)).unwrap();
        asm.push(insert(Some("t4"), 1, 1, 12)).unwrap();
        assert!(
            asm.push(end("t4", 1, &[("public.orders", 1)], 13))
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn sequencing_errors() {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        // END without BEGIN.
        let e = asm.push(end("t0", 0, &[], 1)).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("events.json:1: transaction `t0`: END without a BEGIN"),
            "{e}"
        );
        // A change outside any transaction.
        let e = asm.push(insert(Some("t0"), 1, 1, 2)).unwrap_err();
        assert!(matches!(&e, DebeziumError::Transaction { id, .. } if id == "t0"));
        assert_eq!(e.position(), &at(2));
        // A non-snapshot change without a transaction block.
        let e = asm.push(insert(None, 0, 1, 3)).unwrap_err();
        assert!(matches!(e, DebeziumError::MissingTxnMetadata { .. }));
        assert!(
            e.to_string()
                .starts_with("events.json:3: change event without a `transaction` block")
        );
        // BEGIN while open names both ids; the new transaction stays open.
        asm.push(begin("t1", 4)).unwrap();
        asm.push(insert(Some("t1"), 1, 1, 5)).unwrap();
        let e = asm.push(begin("t2", 6)).unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("events.json:6: transaction `t2`: BEGIN while transaction `t1` (begun at events.json:4)"), "{text}");
        assert_eq!(asm.open_transaction(), Some("t2"));
        // A change of another transaction breaks the open one.
        let e = asm.push(insert(Some("t9"), 1, 1, 7)).unwrap_err();
        assert!(e.to_string().contains("inside transaction `t2`"), "{e}");
        assert_eq!(asm.open_transaction(), None);
        // A change without a transaction block inside BEGIN/END breaks it too.
        asm.push(begin("t3", 8)).unwrap();
        let e = asm.push(insert(None, 0, 1, 9)).unwrap_err();
        assert!(matches!(&e, DebeziumError::Transaction { id, .. } if id == "t3"));
        assert_eq!(asm.open_transaction(), None);
        // END of another id.
        asm.push(begin("t4", 10)).unwrap();
        let e = asm.push(end("t5", 0, &[], 11)).unwrap_err();
        assert!(e.to_string().contains("END while transaction `t4`"), "{e}");
        assert_eq!(asm.open_transaction(), None);
        // reset() discards an open transaction.
        asm.push(begin("t6", 12)).unwrap();
        asm.reset();
        assert_eq!(asm.open_transaction(), None);
        assert!(asm.push(end("t6", 0, &[], 13)).is_err());
    }

    #[test]
    fn snapshot_reads_stand_alone_with_metadata() {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        let line = event("r", Json::Null, json!({"id": 1, "qty": 1}), None).to_string();
        let msg = parse(&line, 5).unwrap();
        let txn = asm.push(msg).unwrap().unwrap();
        assert_eq!(txn.id, "events.json:5");
        assert_eq!(txn.events.len(), 1);
    }

    #[test]
    fn duplicates_are_skipped() {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        let run = |asm: &mut TxnAssembler, first_line: u64| {
            asm.push(begin("t1", first_line)).unwrap();
            asm.push(insert(Some("t1"), 1, 1, first_line + 1)).unwrap();
            asm.push(end("t1", 1, &[("public.orders", 1)], first_line + 2))
                .unwrap()
        };
        let txn = run(&mut asm, 1).unwrap();
        // Not applied yet: the assembler never marks on its own.
        assert!(run(&mut asm, 4).is_some());
        asm.mark_applied(&txn.id, &txn.end);
        assert_eq!(asm.last_applied(), Some(("t1", &at(3))));
        assert!(run(&mut asm, 7).is_none());
        assert_eq!(asm.duplicates_skipped(), 1);
        // A duplicate's counts are still checked.
        asm.push(begin("t1", 10)).unwrap();
        assert!(asm.push(end("t1", 1, &[], 11)).is_err());
        assert_eq!(asm.duplicates_skipped(), 1);
    }

    #[test]
    fn applied_ids_are_bounded() {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        for i in 0..=APPLIED_IDS_REMEMBERED {
            asm.mark_applied(&i.to_string(), &at(1));
        }
        asm.mark_applied("1", &at(2)); // already remembered: no second entry
        assert_eq!(asm.applied.len(), APPLIED_IDS_REMEMBERED);
        assert_eq!(asm.applied_order.len(), APPLIED_IDS_REMEMBERED);
        assert!(!asm.applied.contains("0"), "the oldest id is forgotten");
        assert!(asm.applied.contains("1"));
        assert_eq!(asm.last_applied(), Some(("1", &at(2))));
    }

    #[test]
    fn no_metadata_mode() {
        let mut asm = TxnAssembler::new(TxnMode::NoMetadata);
        assert_eq!(asm.mode(), TxnMode::NoMetadata);
        let txn = asm.push(insert(None, 0, 1, 4)).unwrap().unwrap();
        assert_eq!(txn.id, "events.json:4");
        assert_eq!((txn.begin.clone(), txn.end.clone()), (at(4), at(4)));
        assert_eq!(ids(&txn), [1]);
        // A transaction block is ignored.
        assert!(asm.push(insert(Some("t1"), 1, 2, 5)).unwrap().is_some());
        let e = asm.push(begin("t1", 6)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "events.json:6: transaction `t1`: transaction metadata in a stream replayed with \
             --no-txn-metadata; replay without that flag"
        );
        assert!(asm.push(end("t1", 0, &[], 7)).is_err());
        // Positions identify applied events.
        asm.mark_applied(&txn.id, &txn.end);
        assert!(asm.push(insert(None, 0, 1, 4)).unwrap().is_none());
        assert_eq!(asm.duplicates_skipped(), 1);
    }

    // --- hardening: redeliveries, Postgres ids, reads, times, decimals, skipped lines ---

    #[test]
    fn a_repeated_begin_restarts_the_open_transaction() {
        // BEGIN t1, e1, BEGIN t1, e1, e2, END t1: the partial delivery is replaced by the full
        // one instead of breaking the transaction.
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        asm.push(begin("t1", 1)).unwrap();
        asm.push(insert(Some("t1"), 1, 1, 2)).unwrap();
        assert!(asm.push(begin("t1", 3)).unwrap().is_none());
        assert_eq!(asm.restarts(), 1);
        assert_eq!(asm.open_begin(), Some(&at(3)));
        asm.push(insert(Some("t1"), 1, 1, 4)).unwrap();
        asm.push(insert(Some("t1"), 2, 2, 5)).unwrap();
        let txn = asm
            .push(end("t1", 2, &[("public.orders", 2)], 6))
            .unwrap()
            .unwrap();
        assert_eq!(ids(&txn), [1, 2]);
        assert_eq!((txn.begin, txn.end), (at(3), at(6)));
    }

    /// A Postgres change event as Debezium 2.x writes it: `txId:LSN` ids whose LSN part is the
    /// last LSN seen when the event was written.
    fn pg_insert(txn_id: &str, total_order: u64, id: i64, line: u64) -> Message {
        let text = json!({
            "before": null,
            "after": {"id": id, "qty": 1, "price": "1.00", "note": null, "created": null, "day": null},
            "source": {
                "version": "2.5.0.Final", "connector": "postgresql", "name": "shop",
                "ts_ms": 1_700_000_000_000u64, "snapshot": "false", "db": "shop",
                "sequence": "[\"53195776\",\"53195840\"]", "schema": "public", "table": "orders",
                "txId": 571, "lsn": 53195840, "xmin": null
            },
            "op": "c",
            "ts_ms": 1_700_000_000_123u64,
            "transaction": {"id": txn_id, "total_order": total_order, "data_collection_order": total_order}
        })
        .to_string();
        parse(&text, line).unwrap()
    }

    #[test]
    fn postgres_transaction_ids_match_by_their_txid() {
        let begin_line = r#"{"status":"BEGIN","id":"571:53195832","ts_ms":1700000000100,"event_count":null,"data_collections":null}"#;
        let end_line = r#"{"status":"END","id":"571:53196048","ts_ms":1700000000200,"event_count":2,"data_collections":[{"data_collection":"public.orders","event_count":2}]}"#;
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        asm.push(parse(begin_line, 1).unwrap()).unwrap();
        asm.push(pg_insert("571:53195840", 1, 1, 2)).unwrap();
        asm.push(pg_insert("571:53195992", 2, 2, 3)).unwrap();
        let txn = asm.push(parse(end_line, 4).unwrap()).unwrap().unwrap();
        assert_eq!(ids(&txn), [1, 2]);
        assert_eq!(txn.id, "571:53196048", "the full id stays available");
        assert_eq!(txn.events[0].txn.as_ref().unwrap().id, "571:53195840");

        // Another txId is another transaction, whatever the LSN.
        asm.push(parse(&begin_line.replace("571:", "572:"), 5).unwrap())
            .unwrap();
        let e = asm.push(pg_insert("573:53195840", 1, 3, 6)).unwrap_err();
        assert!(
            e.to_string().contains("inside transaction `572:53195832`"),
            "{e}"
        );
        assert_eq!(e.position(), &at(6));

        // Only Postgres ids compare by their first part: MySQL GTIDs share the server uuid.
        let gtid = |n: u32| format!("3e11fa47-71ca-11e1-9e33-c80aa9429562:{n}");
        assert!(!same_transaction(&gtid(23), &gtid(24), Some("mysql")));
        assert!(!same_transaction("571:1", "571:2", Some("mysql")));
        assert!(!same_transaction(
            "571:1",
            "572:1",
            Some(POSTGRES_CONNECTOR)
        ));
        assert!(same_transaction("571", "571:9", Some(POSTGRES_CONNECTOR)));
    }

    #[test]
    fn postgres_redelivery_restarts_by_txid() {
        // A redelivered BEGIN carries the same txId (its LSN may differ).
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        asm.push(parse(r#"{"status":"BEGIN","id":"571:100"}"#, 1).unwrap())
            .unwrap();
        asm.push(pg_insert("571:120", 1, 1, 2)).unwrap();
        assert!(
            asm.push(parse(r#"{"status":"BEGIN","id":"571:100"}"#, 3).unwrap())
                .unwrap()
                .is_none()
        );
        assert_eq!(asm.restarts(), 1);
        asm.push(pg_insert("571:120", 1, 1, 4)).unwrap();
        let end = r#"{"status":"END","id":"571:140","event_count":1}"#;
        assert!(asm.push(parse(end, 5).unwrap()).unwrap().is_some());
    }

    #[test]
    fn postgres_duplicates_are_recognised_by_txid_across_a_restart() {
        let deliver = |asm: &mut TxnAssembler, end_lsn: u64, line: u64| {
            asm.push(parse(r#"{"status":"BEGIN","id":"571:100"}"#, line).unwrap())
                .unwrap();
            asm.push(pg_insert("571:120", 1, 1, line + 1)).unwrap();
            let end = format!(r#"{{"status":"END","id":"571:{end_lsn}","event_count":1}}"#);
            asm.push(parse(&end, line + 2).unwrap()).unwrap()
        };
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        let txn = deliver(&mut asm, 140, 1).unwrap();
        asm.mark_applied(&txn.id, &txn.end);
        let recorded = asm.recent_applied(8);
        assert_eq!(recorded, ["571"], "what a checkpoint records");

        // After a restart, the connector redelivers the transaction with other LSN parts.
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        asm.remember_applied(recorded.iter().map(String::as_str));
        assert!(deliver(&mut asm, 160, 4).is_none());
        assert_eq!(asm.duplicates_skipped(), 1);
    }

    /// A table with every time column kind, with and without declared precisions.
    fn times() -> Arc<TableSchema> {
        TableSchema::new(
            "times",
            vec![
                ColumnDef::new("id", ColumnType::Int64, false),
                ColumnDef::new("plain", ColumnType::Timestamp, true),
                ColumnDef::new("ms", ColumnType::Timestamp, true).with_time_precision(3),
                ColumnDef::new("us", ColumnType::Timestamp, true).with_time_precision(6),
                ColumnDef::new("ns", ColumnType::Timestamp, true).with_time_precision(9),
                ColumnDef::new("tz", ColumnType::TimestampTz, true),
                ColumnDef::new("t_ms", ColumnType::Time, true).with_time_precision(3),
                ColumnDef::new("t", ColumnType::Time, true),
            ],
            &["id"],
        )
        .unwrap()
    }

    fn times_line(after: Json) -> String {
        json!({"op": "c", "after": after, "source": {"connector": "mysql", "db": "x", "table": "times"}})
            .to_string()
    }

    #[test]
    fn integer_times_without_a_schema_follow_the_declared_precision() {
        let catalog = |name: &str| (name == "times").then(times);
        let micros = 1_709_296_496_123_000i64; // 2024-03-01T12:34:56.123Z
        let line = times_line(json!({
            "id": 1,
            "plain": micros,
            "ms": micros / 1000,
            "us": micros,
            "ns": micros * 1000 + 999,
            "tz": "2024-03-01T14:34:56.123+02:00",
            "t_ms": 45_296_123,
            "t": "12:34:56.123456",
        }));
        let Message::Change(ev) = parse_line(&line, &at(3), &catalog).unwrap() else {
            panic!("a change")
        };
        assert_eq!(
            ev.op,
            ChangeOp::Insert(vec![
                Value::Int(1),
                Value::Timestamp(micros),
                Value::Timestamp(micros),
                Value::Timestamp(micros),
                Value::Timestamp(micros),
                Value::Timestamp(micros),
                Value::Time(45_296_123_000),
                Value::Time(45_296_123_456),
            ])
        );
        // With the envelope the semantic type decides, whatever the declared precision.
        let fields = json!([
            {"type": "int64", "field": "id"},
            {"type": "int64", "name": TIMESTAMP_NS, "field": "ms"},
            {"type": "int64", "name": TIME_US, "field": "t_ms"}
        ]);
        let payload = json!({
            "op": "c",
            "after": {"id": 1, "ms": micros * 1000, "t_ms": 45_296_000_001i64},
            "source": {"connector": "mysql", "db": "x", "table": "times"},
        });
        let line = envelope(payload, fields);
        let Message::Change(ev) = parse_line(&line, &at(4), &catalog).unwrap() else {
            panic!("a change")
        };
        let ChangeOp::Insert(row) = ev.op else {
            panic!("an insert")
        };
        assert_eq!(
            (&row[2], &row[6]),
            (&Value::Timestamp(micros), &Value::Time(45_296_000_001))
        );
        // What cannot be read unambiguously is an error naming the line and column.
        for (after, column) in [
            (json!({"id": 1, "t": 86_400_000_001i64}), "t"),
            (json!({"id": 1, "t": "25:00:00"}), "t"),
            (json!({"id": 1, "tz": 1.5}), "tz"),
        ] {
            let e = parse_line(&times_line(after), &at(9), &catalog).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with(&format!("events.json:9: table `times`, column `{column}`:")),
                "{e}"
            );
        }
        let fields = json!([{"type": "int64", "name": TIMESTAMP_MS, "field": "t"}]);
        let payload = json!({"op": "c", "after": {"id": 1, "t": 5}, "source": {"table": "times"}});
        let e = parse_line(&envelope(payload, fields), &at(10), &catalog).unwrap_err();
        assert!(e.to_string().contains("is not a time of day"), "{e}");
        assert!(precision_unit(Some(12)).is_err());
    }

    #[test]
    fn decimal_strings_follow_decimal_handling() {
        // "9999" is a literal and also base64 (0xf7df7d = -532611): the setting decides.
        let line = event(
            "c",
            Json::Null,
            json!({"id": 1, "qty": 1, "price": "9999"}),
            None,
        )
        .to_string();
        let price = |mode: DecimalHandling| {
            let options = ParseOptions {
                decimal_handling: mode,
            };
            parse_line_with(&line, &at(2), &catalog, &options).map(|m| match m {
                Message::Change(ChangeEvent {
                    op: ChangeOp::Insert(row),
                    ..
                }) => row[2].clone(),
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(
            price(DecimalHandling::Precise).unwrap(),
            Value::Decimal(-532_611)
        );
        assert_eq!(
            price(DecimalHandling::String).unwrap(),
            Value::Decimal(999_900)
        );
        let e = price(DecimalHandling::Double).unwrap_err().to_string();
        assert!(
            e.starts_with("events.json:2: table `public.orders`, column `price`:")
                && e.contains("decimal_handling"),
            "{e}"
        );
        // With the envelope the schema decides, whatever the setting.
        let fields = json!([{"type": "bytes", "name": CONNECT_DECIMAL, "parameters": {"scale": "2"}, "field": "price"}]);
        let row = json!({"id": 1, "qty": 1, "price": "9999"});
        let line = envelope(event("c", Json::Null, row, None), fields);
        let options = ParseOptions {
            decimal_handling: DecimalHandling::String,
        };
        let Message::Change(ev) = parse_line_with(&line, &at(3), &catalog, &options).unwrap()
        else {
            panic!("a change")
        };
        assert_eq!(ev.op, ChangeOp::Insert(order_row(1, 1, Some(-532_611))));
    }

    #[test]
    fn lines_without_a_row_change_are_skipped() {
        let skipped = |line: &str| match parse(line, 5) {
            Ok(Message::Skipped { what, pos, .. }) => {
                assert_eq!(pos, at(5));
                Some(what)
            }
            _ => None,
        };
        for heartbeat in [
            r#"{"ts_ms":1700000000000}"#,
            r#"{"payload":{"ts_ms":1700000000000}}"#,
            r#"{"schema":{"type":"struct","name":"io.debezium.connector.common.Heartbeat","fields":[{"type":"int64","field":"ts_ms"}]},"payload":{"ts_ms":1700000000000}}"#,
        ] {
            assert_eq!(skipped(heartbeat), Some(Skipped::Heartbeat), "{heartbeat}");
        }
        let ddl = json!({
            "source": {"connector": "mysql", "db": "shop", "table": "orders"},
            "databaseName": "shop", "ddl": "ALTER TABLE orders ADD COLUMN x INT",
            "tableChanges": [{"type": "ALTER", "id": "\"shop\".\"orders\""}]
        });
        assert_eq!(skipped(&ddl.to_string()), Some(Skipped::SchemaChange));
        let message = json!({
            "op": "m", "ts_ms": 1,
            "source": {"connector": "postgresql", "db": "shop", "schema": "", "table": ""},
            "message": {"prefix": "audit", "content": "aGk="}
        });
        assert_eq!(skipped(&message.to_string()), Some(Skipped::LogicalMessage));
        // Not Debezium: still errors with the position.
        for bad in [
            r#"{"ts_ms":"soon"}"#,
            r#"{"ts_ms":1,"other":2}"#,
            r#"{"payload":{"ts_ms":1},"extra":1}"#,
            r#"{"op":"m"}"#,
        ] {
            let e = parse(bad, 6);
            if bad == r#"{"op":"m"}"# {
                // A logical message needs nothing else.
                assert!(matches!(e, Ok(Message::Skipped { .. })), "{bad}");
                continue;
            }
            let e = e.unwrap_err();
            assert_eq!(e.position(), &at(6), "{bad}");
        }
    }

    #[test]
    fn truncates_and_logical_messages_inside_transactions() {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        asm.push(begin("t1", 1)).unwrap();
        let truncate = json!({
            "op": "t", "ts_ms": 1,
            "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": "orders"},
            "transaction": {"id": "t1", "total_order": 1, "data_collection_order": 1}
        });
        let msg = parse(&truncate.to_string(), 2).unwrap();
        assert!(matches!(&msg, Message::Change(ev) if ev.op == ChangeOp::Truncate));
        asm.push(msg).unwrap();
        let message = json!({
            "op": "m", "ts_ms": 1,
            "source": {"connector": "postgresql", "db": "shop", "schema": "", "table": ""},
            "message": {"prefix": "audit", "content": "aGk="},
            "transaction": {"id": "t1", "total_order": 2, "data_collection_order": 1}
        });
        asm.push(parse(&message.to_string(), 3).unwrap()).unwrap();
        asm.push(insert(Some("t1"), 3, 7, 4)).unwrap();
        // Debezium counts the message among the transaction's events, on a collection of its own.
        let txn = asm
            .push(end("t1", 3, &[("public.orders", 2), ("audit", 1)], 5))
            .unwrap()
            .unwrap();
        assert_eq!(txn.events.len(), 2);
        assert_eq!(txn.events[0].op, ChangeOp::Truncate);
        // Heartbeats between BEGIN and END change nothing.
        asm.push(begin("t2", 6)).unwrap();
        asm.push(parse(r#"{"ts_ms":5}"#, 7).unwrap()).unwrap();
        asm.push(insert(Some("t2"), 1, 8, 8)).unwrap();
        assert!(asm.push(end("t2", 1, &[], 9)).unwrap().is_some());
    }

    // --- property tests: random and mutated lines ---

    mod properties {
        use super::*;
        use proptest::prelude::*;

        /// Well-formed lines of a few transactions (some Postgres `txId:LSN`), in order.
        fn good_lines(txns: usize) -> Vec<String> {
            let mut out = Vec::new();
            for t in 0..txns {
                let id = format!("{}:{}", 500 + t, 1000 * t);
                out.push(json!({"status": "BEGIN", "id": id}).to_string());
                for k in 0..2u64 {
                    let mut ev = event(
                        "c",
                        Json::Null,
                        json!({"id": t as u64 * 10 + k, "qty": 1, "price": "1.25"}),
                        None,
                    );
                    ev["transaction"] = json!({
                        "id": format!("{}:{}", 500 + t, 1000 * t + 10 * (k + 1) as usize),
                        "total_order": k + 1, "data_collection_order": k + 1
                    });
                    out.push(ev.to_string());
                }
                out.push(
                    json!({"status": "END", "id": format!("{}:{}", 500 + t, 1000 * t + 99), "event_count": 2})
                        .to_string(),
                );
            }
            out
        }

        #[derive(Clone, Debug)]
        enum Mutation {
            Truncate(usize),
            /// A value replaced by one of the wrong type.
            WrongType(&'static str, Json),
            HugeNumber,
            DeepNesting(usize),
            Bytes(Vec<u8>),
            Drop,
            Duplicate,
        }

        fn mutation() -> impl Strategy<Value = Mutation> {
            prop_oneof![
                (0usize..400).prop_map(Mutation::Truncate),
                (
                    prop_oneof![
                        Just("id"),
                        Just("qty"),
                        Just("price"),
                        Just("op"),
                        Just("status"),
                        Just("transaction"),
                        Just("after")
                    ],
                    prop_oneof![
                        Just(Json::Null),
                        Just(json!(true)),
                        Just(json!([1])),
                        Just(json!({"a": 1})),
                        Just(json!("x")),
                        Just(json!(-1.5))
                    ],
                )
                    .prop_map(|(k, v)| Mutation::WrongType(k, v)),
                Just(Mutation::HugeNumber),
                (1usize..20_000).prop_map(Mutation::DeepNesting),
                proptest::collection::vec(any::<u8>(), 0..64).prop_map(Mutation::Bytes),
                Just(Mutation::Drop),
                Just(Mutation::Duplicate),
            ]
        }

        /// Replaces key `k` wherever it is in `v`.
        fn set_key(v: &mut Json, k: &str, to: &Json) {
            match v {
                Json::Object(m) => {
                    if let Some(slot) = m.get_mut(k) {
                        *slot = to.clone();
                    }
                    for (_, child) in m.iter_mut() {
                        set_key(child, k, to);
                    }
                }
                Json::Array(items) => items.iter_mut().for_each(|c| set_key(c, k, to)),
                _ => {}
            }
        }

        /// The mutated line (`None`: dropped), as bytes; the sink decodes UTF-8 itself.
        fn mutate(line: &str, m: &Mutation) -> Vec<Vec<u8>> {
            match m {
                Mutation::Truncate(n) => {
                    let cut = (*n).min(line.len());
                    vec![line.as_bytes()[..cut].to_vec()]
                }
                Mutation::WrongType(k, v) => {
                    let mut json: Json = serde_json::from_str(line).unwrap();
                    set_key(&mut json, k, v);
                    vec![json.to_string().into_bytes()]
                }
                Mutation::HugeNumber => vec![
                    line.replacen("\"qty\":1", "\"qty\":1e400", 1)
                        .replacen("\"id\":", "\"id\":123456789012345678901234567890", 1)
                        .into_bytes(),
                ],
                Mutation::DeepNesting(depth) => {
                    let mut s = String::from("{\"after\":");
                    s.push_str(&"[".repeat(*depth));
                    s.push_str(&"]".repeat(*depth));
                    s.push('}');
                    vec![s.into_bytes()]
                }
                Mutation::Bytes(b) => vec![b.clone()],
                Mutation::Drop => vec![],
                Mutation::Duplicate => vec![line.as_bytes().to_vec(), line.as_bytes().to_vec()],
            }
        }

        /// Feeds `lines` as the sink does (UTF-8 decoded per line); returns the transactions
        /// emitted, checking each error names its line.
        fn replay(lines: &[Vec<u8>], asm: &mut TxnAssembler) -> Result<Vec<String>, TestCaseError> {
            let mut emitted = Vec::new();
            for (i, bytes) in lines.iter().enumerate() {
                let pos = SourcePosition::new("events.json", i as u64 + 1);
                let result = match std::str::from_utf8(bytes) {
                    Ok(text) => parse_line(text, &pos, &catalog).and_then(|m| asm.push(m)),
                    Err(e) => Err(DebeziumError::Malformed {
                        pos: pos.clone(),
                        reason: format!("not UTF-8: {e}"),
                    }),
                };
                match result {
                    Ok(Some(txn)) => {
                        asm.mark_applied(&txn.id, &txn.end);
                        emitted.push(txn.id);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        prop_assert_eq!(e.position(), &pos);
                        let prefix = format!("events.json:{}: ", i + 1);
                        prop_assert!(e.to_string().starts_with(&prefix), "{}", e);
                    }
                }
            }
            Ok(emitted)
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn mutated_streams_never_panic_and_keep_what_came_before(
                txns in 1usize..5,
                at in any::<prop::sample::Index>(),
                m in mutation(),
            ) {
                let lines = good_lines(txns);
                let bad = at.index(lines.len());
                let mut fed: Vec<Vec<u8>> = lines[..bad].iter().map(|l| l.clone().into_bytes()).collect();
                // Transactions complete before the mutated line.
                let mut clean = TxnAssembler::new(TxnMode::Metadata);
                let before = replay(&fed, &mut clean)?;
                fed.extend(mutate(&lines[bad], &m));
                fed.extend(lines[bad + 1..].iter().map(|l| l.clone().into_bytes()));
                let mut asm = TxnAssembler::new(TxnMode::Metadata);
                let emitted = replay(&fed, &mut asm)?;
                prop_assert_eq!(&emitted[..before.len()], &before[..], "nothing accepted is lost");
                // Every transaction but the one with the bad line still arrives.
                prop_assert!(emitted.len() + 1 >= txns, "{:?} {:?}", m, emitted);
                prop_assert!(emitted.len() <= txns);
            }

            #[test]
            fn random_lines_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
                let mut asm = TxnAssembler::new(TxnMode::Metadata);
                replay(&[bytes], &mut asm)?;
            }

            #[test]
            fn random_json_never_panics(v in json_value()) {
                let mut asm = TxnAssembler::new(TxnMode::Metadata);
                for line in [v.to_string(), json!({"payload": v.clone()}).to_string(), json!({"op": "c", "after": v.clone(), "source": {"table": "items"}}).to_string()] {
                    replay(&[line.into_bytes()], &mut asm)?;
                }
            }

            #[test]
            fn interleaved_transactions_are_errors_not_mixtures(
                split in 1usize..3,
            ) {
                // A second transaction's events inside the first: the first is broken, the
                // second's END has no BEGIN; nothing half-applied comes out.
                let a = good_lines(1);
                let b: Vec<String> = good_lines(2)[4..].to_vec();
                let mut lines: Vec<Vec<u8>> = a[..split].iter().map(|l| l.clone().into_bytes()).collect();
                lines.extend(b[1..3].iter().map(|l| l.clone().into_bytes()));
                lines.extend(a[split..].iter().map(|l| l.clone().into_bytes()));
                let mut asm = TxnAssembler::new(TxnMode::Metadata);
                let emitted = replay(&lines, &mut asm)?;
                prop_assert!(emitted.is_empty(), "{:?}", emitted);
            }
        }

        fn json_value() -> impl Strategy<Value = Json> {
            let leaf = prop_oneof![
                Just(Json::Null),
                any::<bool>().prop_map(Json::Bool),
                any::<i64>().prop_map(|n| json!(n)),
                any::<u64>().prop_map(|n| json!(n)),
                any::<f64>()
                    .prop_filter("finite", |f| f.is_finite())
                    .prop_map(|f| json!(f)),
                "[a-z0-9:=+/ .-]{0,12}".prop_map(Json::String),
                prop_oneof![
                    Just("c"),
                    Just("r"),
                    Just("u"),
                    Just("d"),
                    Just("t"),
                    Just("m"),
                    Just("BEGIN"),
                    Just("END")
                ]
                .prop_map(|s| Json::String(s.into())),
            ];
            leaf.prop_recursive(4, 48, 6, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
                    proptest::collection::btree_map(
                        prop_oneof![
                            Just("op".to_owned()),
                            Just("status".to_owned()),
                            Just("id".to_owned()),
                            Just("after".to_owned()),
                            Just("before".to_owned()),
                            Just("source".to_owned()),
                            Just("table".to_owned()),
                            Just("transaction".to_owned()),
                            Just("ts_ms".to_owned()),
                            Just("event_count".to_owned()),
                            Just("data_collections".to_owned()),
                            Just("qty".to_owned()),
                            Just("a".to_owned()),
                            Just("b".to_owned()),
                        ],
                        inner,
                        0..6,
                    )
                    .prop_map(|m| Json::Object(m.into_iter().collect())),
                ]
            })
        }
    }
}
