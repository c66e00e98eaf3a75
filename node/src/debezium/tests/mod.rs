//! Tests of the Debezium parser and transaction assembler, with the fixtures they share: a
//! small catalog (`public.orders`, `items`) and builders of its events.

use std::sync::Arc;

use retina_storage::{ColumnDef, ColumnType, TableSchema, Value};
use serde_json::{Value as Json, json};

use super::value::{CONNECT_DECIMAL, DATE, TIMESTAMP_US};
use super::*;

mod message;
mod properties;
mod txn;
mod value;

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
