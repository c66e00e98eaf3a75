//! The entry point of parsing a line ([`parse_line_with`]), and the common change event
//! without a DOM: a bare payload (`schemas.enable=false`) with `op`
//! `c`, `r`, `u`, `d` or `t`, read in one pass into the fields the parse needs, borrowing its
//! names and its column strings without escapes from the line. It answers only when the event is well formed and every value
//! converts; anything else (an envelope, a transaction marker, a key written with escapes, a
//! field of an unexpected type, any error) is left to the full parse in `message.rs`, which
//! gives the same result for the events this one reads (a test checks both agree) and the
//! errors with their exact texts.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use retina_storage::TableSchema;
use serde::Deserialize;
use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value as Json;

use super::error::{DebeziumError, SourcePosition};
use super::message::{ChangeEvent, ChangeOp, Message, TxnRef, parse_full, transaction_from};
use super::value::{Cell, Image, ParseOptions, Rows, key_only};

/// A row image: its columns as written (a repeated name: the last one counts, as in a map).
struct Columns<'a>(Vec<(&'a str, Cell<'a>)>);

impl<'a> Columns<'a> {
    /// The column's value, taken out (each column is read once).
    fn take(&mut self, name: &str) -> Option<Cell<'a>> {
        self.0
            .iter_mut()
            .rev()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| std::mem::replace(v, Cell::Json(Cow::Owned(Json::Null))))
    }
}

/// `source`: the names the parse reads.
#[derive(Default)]
struct Source<'a> {
    table: Option<&'a str>,
    schema: Option<&'a str>,
    db: Option<&'a str>,
    connector: Option<&'a str>,
}

/// A bare change event's payload: what the parse reads of it.
#[derive(Default)]
struct Payload<'a> {
    op: Option<&'a str>,
    before: Option<Columns<'a>>,
    after: Option<Columns<'a>>,
    source: Option<Source<'a>>,
    /// `None`: absent or null; `Some(None)`: a block without its three fields.
    transaction: Option<Option<TxnRef>>,
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
    match parse_change(line, pos, catalog, options) {
        Some(m) => Ok(m),
        None => parse_full(line, pos, catalog, options),
    }
}

/// Reads `line` as a bare change event on a catalog table; `None` where the full parse must
/// decide.
pub(super) fn parse_change(
    line: &str,
    pos: &SourcePosition,
    catalog: &dyn Fn(&str) -> Option<Arc<TableSchema>>,
    options: &ParseOptions,
) -> Option<Message> {
    let mut de = serde_json::Deserializer::from_str(line);
    let mut payload = de.deserialize_map(PayloadVisitor).ok()?;
    de.end().ok()?;
    let op = payload.op?;
    if !matches!(op, "c" | "r" | "u" | "d" | "t") {
        return None;
    }
    let txn = match payload.transaction {
        None => None,
        Some(t) => Some(t?),
    };
    let source = payload.source?;
    let table_name = source.table?;
    let namespace = source.schema.or(source.db);
    // `namespace.table` first, then the bare name; the data collection is the first of them.
    let qualified = namespace.map(|ns| format!("{ns}.{table_name}"));
    let table = qualified
        .as_deref()
        .and_then(catalog)
        .or_else(|| catalog(table_name))?;
    let data_collection = qualified.unwrap_or_else(|| table_name.to_owned());
    let fields = Default::default();
    let rows = Rows {
        table: &table,
        fields: &fields,
        pos,
        options,
    };
    let convert = |columns: &mut Option<Columns<'_>>, image: Image| {
        let columns = columns.as_mut()?;
        rows.convert_from(|name| columns.take(name), image).ok()
    };
    let change = match op {
        "c" => ChangeOp::Insert(convert(&mut payload.after, Image::After)?),
        "r" => ChangeOp::Upsert(convert(&mut payload.after, Image::After)?),
        "d" => ChangeOp::Delete(convert(&mut payload.before, Image::Before)?),
        "t" => ChangeOp::Truncate,
        _ => {
            let after = convert(&mut payload.after, Image::After)?;
            let before = match payload.before {
                Some(_) => convert(&mut payload.before, Image::Before)?,
                None => key_only(&table, &after),
            };
            ChangeOp::Update { before, after }
        }
    };
    Some(Message::Change(ChangeEvent {
        table,
        data_collection,
        op: change,
        snapshot: op == "r",
        txn,
        connector: source.connector.map(str::to_owned),
        pos: pos.clone(),
    }))
}

/// `null` or an object of columns.
fn image<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<Columns<'de>>, A::Error> {
    map.next_value::<Option<ColumnsSeed>>()
        .map(|c| c.map(|c| c.0))
}

struct PayloadVisitor;

impl<'de> Visitor<'de> for PayloadVisitor {
    type Value = Payload<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a change event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Payload<'de>, A::Error> {
        let mut p = Payload::default();
        while let Some(key) = map.next_key::<&'de str>()? {
            match key {
                "op" => p.op = Some(map.next_value()?),
                "before" => p.before = image(&mut map)?,
                "after" => p.after = image(&mut map)?,
                "source" => p.source = Some(map.next_value::<SourceSeed>()?.0),
                "transaction" => {
                    p.transaction = map
                        .next_value::<Option<TxnSeed>>()?
                        .map(|t| transaction_from(t.id, t.total_order.as_ref(), t.order.as_ref()))
                }
                // An envelope, a transaction marker or a schema change: the full parse.
                "payload" | "schema" | "status" | "ddl" | "tableChanges" => {
                    return Err(de::Error::custom("not a bare change event"));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(p)
    }
}

struct ColumnsSeed<'a>(Columns<'a>);

impl<'de> de::Deserialize<'de> for ColumnsSeed<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ColumnsSeed<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a row image")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut columns = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some((name, cell)) = map.next_entry::<&'de str, CellSeed>()? {
                    columns.push((name, cell.0));
                }
                Ok(ColumnsSeed(Columns(columns)))
            }
        }
        d.deserialize_map(V)
    }
}

struct SourceSeed<'a>(Source<'a>);

impl<'de> de::Deserialize<'de> for SourceSeed<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = SourceSeed<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a source block")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut s = Source::default();
                while let Some(key) = map.next_key::<&'de str>()? {
                    let slot = match key {
                        "table" => &mut s.table,
                        "schema" => &mut s.schema,
                        "db" => &mut s.db,
                        "connector" => &mut s.connector,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    // A name that is not a plain string (null, a number, escapes): the full
                    // parse decides what it means.
                    *slot = Some(map.next_value::<&'de str>()?);
                }
                Ok(SourceSeed(s))
            }
        }
        d.deserialize_map(V)
    }
}

/// A column value: a string without escapes borrowed from the line, anything else as JSON.
struct CellSeed<'a>(Cell<'a>);

impl<'de> de::Deserialize<'de> for CellSeed<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        fn json<'de>(v: Json) -> CellSeed<'de> {
            CellSeed(Cell::Json(Cow::Owned(v)))
        }
        impl<'de> Visitor<'de> for V {
            type Value = CellSeed<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a column value")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(CellSeed(Cell::Str(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(json(Json::String(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Self::Value, E> {
                Ok(json(Json::String(s)))
            }
            fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
                Ok(json(Json::Bool(b)))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
                Ok(json(Json::from(n)))
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
                Ok(json(Json::from(n)))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
                Ok(json(Json::from(n)))
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(json(Json::Null))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                Json::deserialize(SeqAccessDeserializer::new(seq)).map(json)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                Json::deserialize(MapAccessDeserializer::new(map)).map(json)
            }
        }
        d.deserialize_any(V)
    }
}

/// A `transaction` block's three fields, as JSON (their types are checked after).
#[derive(Default)]
struct TxnSeed {
    id: Option<Json>,
    total_order: Option<Json>,
    order: Option<Json>,
}

impl<'de> de::Deserialize<'de> for TxnSeed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = TxnSeed;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a transaction block")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut t = TxnSeed::default();
                while let Some(key) = map.next_key::<&'de str>()? {
                    let slot = match key {
                        "id" => &mut t.id,
                        "total_order" => &mut t.total_order,
                        "data_collection_order" => &mut t.order,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                            continue;
                        }
                    };
                    *slot = Some(map.next_value()?);
                }
                Ok(t)
            }
        }
        d.deserialize_map(V)
    }
}
