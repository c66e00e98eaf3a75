//! One line of a Debezium JSON stream into a [`Message`]: a row change on a catalog table,
//! a transaction's BEGIN or END, a tombstone, or a line that carries no row change.

use std::collections::HashMap;
use std::sync::Arc;

use retina_storage::{RowOp, TableSchema, Value};
use serde_json::{Map, Value as Json};

use super::error::{DebeziumError, SourcePosition, malformed};
use super::value::{FieldType, Image, ParseOptions, Rows, describe, key_only};

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
    pub data_collection: Arc<str>,
    pub op: ChangeOp,
    /// `op` was `r`: a snapshot read. Snapshot events carry no transaction block.
    pub snapshot: bool,
    pub txn: Option<TxnRef>,
    /// `source.connector` (`postgresql`, `mysql`, ...): how its transaction ids compare.
    pub connector: Option<Arc<str>>,
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

/// The name made of `parts` (a table's `schema.table`, a connector's name), shared: a stream
/// names the same few over and over, and each thread keeps the last [`SHARED_NAMES`] it made,
/// so an event carries its names without allocating them (and without the sink freeing them).
pub(super) fn shared_name(parts: &[&str]) -> Arc<str> {
    thread_local! {
        static NAMES: std::cell::RefCell<Vec<Arc<str>>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let len: usize = parts.iter().map(|p| p.len()).sum();
    // Compared by length first: most names a thread keeps differ in it.
    let is = |name: &str| {
        if name.len() != len {
            return false;
        }
        let mut rest = name;
        parts.iter().all(|p| match rest.strip_prefix(p) {
            Some(r) => {
                rest = r;
                true
            }
            None => false,
        }) && rest.is_empty()
    };
    NAMES.with_borrow_mut(|names| {
        if let Some(name) = names.iter().find(|n| is(n)) {
            return name.clone();
        }
        let name: Arc<str> = Arc::from(parts.concat());
        if names.len() == SHARED_NAMES {
            names.remove(0);
        }
        names.push(name.clone());
        name
    })
}

/// Names each thread keeps for [`shared_name`]: a stream of more tables than this, each
/// changed in turn, makes its names anew, as before names were shared.
const SHARED_NAMES: usize = 32;

/// Parses one line of a Debezium JSON stream (see `parse_line_with`) through its DOM: every
/// shape, and every error with its text.
pub(super) fn parse_full(
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

/// [`txn_id`] of a value the caller owns (a string is not copied).
pub(super) fn txn_id_owned(v: Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s),
        other => txn_id(Some(&other)),
    }
}

/// A count or order: a JSON number, or a numeric string (Debezium's own examples quote them).
pub(super) fn json_u64(v: Option<&Json>) -> Option<u64> {
    match v? {
        Json::Number(n) => n.as_u64(),
        Json::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A change event's `transaction` block, if it has all three fields.
pub(super) fn transaction_ref(t: &Json) -> Option<TxnRef> {
    transaction_from(
        t.get("id").cloned(),
        t.get("total_order"),
        t.get("data_collection_order"),
    )
}

/// A `transaction` block from its three fields, if they are all there and of their types.
pub(super) fn transaction_from(
    id: Option<Json>,
    total_order: Option<&Json>,
    data_collection_order: Option<&Json>,
) -> Option<TxnRef> {
    Some(TxnRef {
        id: txn_id_owned(id?)?,
        total_order: json_u64(total_order)?,
        data_collection_order: json_u64(data_collection_order)?,
    })
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
        Some(t) => Some(transaction_ref(t).ok_or_else(|| {
            malformed(
                pos,
                format!(
                    "`transaction` needs `id`, `total_order` and `data_collection_order`, got {}",
                    describe(t)
                ),
            )
        })?),
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
        .map(|c| shared_name(&[c]));
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
    let data_collection = shared_name(&[&tried[0]]);

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
