//! A Debezium stream writer for tests: transactions of row changes written as Debezium JSON
//! lines (BEGIN, events with transaction blocks, END with counts), in the bare form or with the
//! schema/payload envelope, plus a naive model of the tables they produce.

use std::collections::BTreeMap;
use std::io::Write;

use base64::Engine;
use serde_json::{Value as J, json};

/// One column of a test table: name, Debezium field type, semantic name, and how to write a
/// value of it in the bare and envelope forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Int,
    BigInt,
    Text,
    /// decimal(p, 2): bare as a string, enveloped as base64 unscaled bytes.
    Money,
    /// Days: bare as "YYYY-MM-DD", enveloped as io.debezium.time.Date.
    Date,
    /// Microseconds: bare as an ISO string, enveloped as io.debezium.time.MicroTimestamp.
    Time,
}

/// A model value: integers for Int, BigInt, Money (cents), Date (days), Time (micros).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum V {
    Null,
    I(i64),
    S(String),
}

pub struct Table {
    pub schema: &'static str,
    pub name: &'static str,
    pub columns: Vec<(&'static str, Kind)>,
    /// Number of leading key columns.
    pub key: usize,
}

pub type Row = Vec<V>;

#[derive(Clone, Debug)]
pub enum Change {
    Insert(usize, Row),
    Delete(usize, Row),
    Update(usize, Row, Row),
}

/// The tables' rows by key, as a naive database applying whole transactions.
#[derive(Clone, Default, Debug, PartialEq)]
pub struct Model {
    pub tables: Vec<BTreeMap<Row, Row>>,
}

impl Model {
    pub fn new(tables: usize) -> Self {
        Model {
            tables: vec![BTreeMap::new(); tables],
        }
    }

    pub fn apply(&mut self, txn: &[Change], tables: &[Table]) {
        for c in txn {
            match c {
                Change::Insert(t, r) => {
                    assert!(
                        self.tables[*t]
                            .insert(r[..tables[*t].key].to_vec(), r.clone())
                            .is_none()
                    );
                }
                Change::Delete(t, r) => {
                    assert!(self.tables[*t].remove(&r[..tables[*t].key]).is_some());
                }
                Change::Update(t, b, a) => {
                    let k = tables[*t].key;
                    assert!(self.tables[*t].remove(&b[..k]).is_some());
                    assert!(self.tables[*t].insert(a[..k].to_vec(), a.clone()).is_none());
                }
            }
        }
    }
}

fn date_string(days: i64) -> String {
    // Civil-from-days (Howard Hinnant), enough for test dates.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    format!("{:04}-{:02}-{:02}", if m <= 2 { y + 1 } else { y }, m, d)
}

fn time_string(micros: i64) -> String {
    let days = micros.div_euclid(86_400_000_000);
    let rest = micros.rem_euclid(86_400_000_000);
    let (h, m, s, us) = (
        rest / 3_600_000_000,
        rest / 60_000_000 % 60,
        rest / 1_000_000 % 60,
        rest % 1_000_000,
    );
    format!("{}T{h:02}:{m:02}:{s:02}.{us:06}Z", date_string(days))
}

fn money_bytes(cents: i64) -> String {
    let bytes = cents.to_be_bytes();
    // Minimal two's complement, as Kafka Connect writes it.
    let mut start = 0;
    while start < 7 {
        let (b, next) = (bytes[start], bytes[start + 1]);
        if (b == 0 && next & 0x80 == 0) || (b == 0xFF && next & 0x80 != 0) {
            start += 1;
        } else {
            break;
        }
    }
    base64::engine::general_purpose::STANDARD.encode(&bytes[start..])
}

fn value_json(kind: Kind, v: &V, envelope: bool) -> J {
    match (kind, v) {
        (_, V::Null) => J::Null,
        (Kind::Int | Kind::BigInt, V::I(i)) => json!(i),
        (Kind::Text, V::S(s)) => json!(s),
        (Kind::Money, V::I(c)) if envelope => json!(money_bytes(*c)),
        (Kind::Money, V::I(c)) => {
            json!(format!(
                "{}{}.{:02}",
                if *c < 0 { "-" } else { "" },
                c.abs() / 100,
                c.abs() % 100
            ))
        }
        (Kind::Date, V::I(d)) if envelope => json!(d),
        (Kind::Date, V::I(d)) => json!(date_string(*d)),
        (Kind::Time, V::I(t)) if envelope => json!(t),
        (Kind::Time, V::I(t)) => json!(time_string(*t)),
        (k, v) => panic!("{v:?} is not a {k:?}"),
    }
}

fn field_schema(name: &str, kind: Kind) -> J {
    match kind {
        Kind::Int => json!({"type": "int32", "optional": true, "field": name}),
        Kind::BigInt => json!({"type": "int64", "optional": true, "field": name}),
        Kind::Text => json!({"type": "string", "optional": true, "field": name}),
        Kind::Money => json!({"type": "bytes", "optional": true, "field": name,
            "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
            "parameters": {"scale": "2", "connect.decimal.precision": "12"}}),
        Kind::Date => json!({"type": "int32", "optional": true, "field": name,
            "name": "io.debezium.time.Date", "version": 1}),
        Kind::Time => json!({"type": "int64", "optional": true, "field": name,
            "name": "io.debezium.time.MicroTimestamp", "version": 1}),
    }
}

/// Writes transactions as Debezium JSON lines.
pub struct Writer<'a, W: Write> {
    pub out: W,
    pub tables: &'a [Table],
}

impl<W: Write> Writer<'_, W> {
    fn row_json(&self, t: usize, row: &Row, envelope: bool) -> J {
        let cols = &self.tables[t].columns;
        J::Object(
            cols.iter()
                .zip(row)
                .map(|((n, k), v)| (n.to_string(), value_json(*k, v, envelope)))
                .collect(),
        )
    }

    fn wrap(&self, t: usize, payload: J, envelope: bool) -> J {
        if !envelope {
            return payload;
        }
        let fields: Vec<J> = self.tables[t]
            .columns
            .iter()
            .map(|(n, k)| field_schema(n, *k))
            .collect();
        json!({
            "schema": {"type": "struct", "fields": [
                {"type": "struct", "optional": true, "field": "before", "fields": fields.clone()},
                {"type": "struct", "optional": true, "field": "after", "fields": fields},
                {"type": "struct", "field": "source", "fields": []},
                {"type": "string", "field": "op"},
            ]},
            "payload": payload,
        })
    }

    /// Writes one transaction. `order` permutes the events on the wire (their `total_order`
    /// still says the source order); `envelope` picks the message form.
    pub fn txn(&mut self, id: &str, changes: &[Change], envelope: bool, order: &[usize]) {
        let meta = |p: J| {
            if envelope {
                json!({"schema": {"type": "struct"}, "payload": p})
            } else {
                p
            }
        };
        writeln!(
            self.out,
            "{}",
            meta(
                json!({"status": "BEGIN", "id": id, "event_count": null, "data_collections": null})
            )
        )
        .unwrap();
        let mut per_table: BTreeMap<usize, u64> = BTreeMap::new();
        let mut events = Vec::new();
        for (i, c) in changes.iter().enumerate() {
            let (t, op, before, after) = match c {
                Change::Insert(t, r) => (*t, "c", J::Null, self.row_json(*t, r, envelope)),
                Change::Delete(t, r) => (*t, "d", self.row_json(*t, r, envelope), J::Null),
                Change::Update(t, b, a) => (
                    *t,
                    "u",
                    self.row_json(*t, b, envelope),
                    self.row_json(*t, a, envelope),
                ),
            };
            let n = per_table.entry(t).or_default();
            *n += 1;
            let table = &self.tables[t];
            let payload = json!({
                "before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000u64,
                "source": {"connector": "postgresql", "db": "bankdb", "schema": table.schema, "table": table.name},
                "transaction": {"id": id, "total_order": i + 1, "data_collection_order": *n},
            });
            events.push(self.wrap(t, payload, envelope));
        }
        for &i in order {
            writeln!(self.out, "{}", events[i]).unwrap();
        }
        let collections: Vec<J> = per_table
            .iter()
            .map(|(t, n)| json!({"data_collection": format!("{}.{}", self.tables[*t].schema, self.tables[*t].name), "event_count": n}))
            .collect();
        writeln!(self.out, "{}", meta(json!({"status": "END", "id": id, "event_count": changes.len(), "data_collections": collections}))).unwrap();
    }
}
