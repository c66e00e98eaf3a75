//! From Postgres's text values to the catalog's rows: which catalog table and columns a
//! replicated relation feeds, and each value's conversion.

use std::sync::Arc;

use retina_storage::{ColumnDef, ColumnType, StorageError, TableId, TableSchema, Value};

use super::pgoutput::{Datum, Relation};
use crate::catalog::Catalog;
use crate::debezium::{parse_date, parse_decimal, parse_time_of_day, parse_timestamp};

/// A column's value from its text form (as Postgres writes it with `DateStyle=ISO`,
/// `TimeZone=UTC` and `extra_float_digits=3`), not yet checked against the column.
pub(crate) fn from_text(col: &ColumnDef, s: &str) -> Result<Value, String> {
    Ok(match col.ty {
        ColumnType::Boolean => match s {
            "t" | "true" => Value::Boolean(true),
            "f" | "false" => Value::Boolean(false),
            _ => return Err(format!("{s:?} is not a boolean")),
        },
        ColumnType::Int32 | ColumnType::Int64 => Value::Int(
            s.parse::<i64>()
                .map_err(|_| format!("{s:?} is not an integer that fits in bigint"))?,
        ),
        // A `real`'s text is the shortest that reads back as that single: read it so (through
        // a double it could round twice).
        ColumnType::Float32 => Value::Float(f64::from(
            s.parse::<f32>()
                .map_err(|_| format!("{s:?} is not a number"))?,
        )),
        ColumnType::Float64 => Value::Float(
            s.parse::<f64>()
                .map_err(|_| format!("{s:?} is not a number"))?,
        ),
        ColumnType::Decimal { scale, .. } => Value::Decimal(parse_decimal(s, scale)?),
        ColumnType::Utf8 => Value::Utf8(s.to_owned()),
        ColumnType::Date => Value::Date(parse_date(s).map_err(|e| infinite(s, e))?),
        ColumnType::Timestamp | ColumnType::TimestampTz => {
            Value::Timestamp(parse_timestamp(s).map_err(|e| infinite(s, e))?)
        }
        ColumnType::Time => Value::Time(parse_time_of_day(s)?),
    })
}

/// Postgres's `infinity`, `-infinity` and BC dates have no value in the lake.
fn infinite(s: &str, e: String) -> String {
    if s.ends_with("infinity") || s.ends_with(" BC") {
        format!("{s:?} has no value in the lake (infinite or before year 1)")
    } else {
        e
    }
}

/// Which row image a tuple is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Image {
    /// A whole row (an insert's, an update's new one, a copied row).
    New,
    /// A key image (`K`) or a whole old row (`O`): only the key must be there.
    Old,
}

/// How a replicated relation's columns feed a catalog table.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) table: TableId,
    pub(crate) schema: Arc<TableSchema>,
    /// For each catalog column, its position in the relation's tuples.
    positions: Vec<usize>,
    /// The relation's name, `schema.table`.
    pub(crate) name: String,
}

impl Mapping {
    /// The catalog table `rel` feeds, or why it cannot: the table is not in the catalog, a
    /// catalog column is missing from it, or its replica identity does not carry the catalog's
    /// key (unless it is `FULL`).
    pub(crate) fn new(catalog: &Catalog, rel: &Relation) -> Result<Mapping, String> {
        let name = format!("{}.{}", rel.namespace, rel.name);
        let table = catalog.resolve(&name).ok_or_else(|| {
            format!(
                "table {name} is in the publication but not in the catalog (--schema); add it, \
                 or take it out of the publication"
            )
        })?;
        let schema = catalog.get(table).expect("resolved").clone();
        let mut positions = Vec::with_capacity(schema.columns().len());
        for col in schema.columns() {
            let at = rel
                .columns
                .iter()
                .position(|c| c.name == col.name)
                .ok_or_else(|| {
                    format!(
                        "table {name}: the catalog's column `{}` is not among the columns \
                         Postgres replicates",
                        col.name
                    )
                })?;
            positions.push(at);
        }
        if rel.replica_identity != b'f' {
            let key: Vec<&str> = schema
                .primary_key()
                .iter()
                .map(|&i| schema.columns()[i].name.as_str())
                .collect();
            let identity: Vec<&str> = (rel.columns.iter())
                .filter(|c| c.key)
                .map(|c| c.name.as_str())
                .collect();
            let covered = key.iter().all(|k| identity.contains(k)) && identity.len() == key.len();
            if !covered {
                return Err(format!(
                    "table {name}: its replica identity ({}) is not the catalog's primary key \
                     ({}), so updates and deletes cannot be matched to rows; give it that \
                     primary key, or `ALTER TABLE {name} REPLICA IDENTITY FULL`",
                    if identity.is_empty() {
                        "none".to_owned()
                    } else {
                        identity.join(", ")
                    },
                    key.join(", ")
                ));
            }
        }
        Ok(Mapping {
            table,
            schema,
            positions,
            name,
        })
    }

    /// A mapping for rows whose columns are the catalog's, in its order (a copy's `SELECT`).
    pub(crate) fn identity(catalog: &Catalog, table: TableId) -> Mapping {
        let schema = catalog.get(table).expect("a catalog table").clone();
        Mapping {
            table,
            positions: (0..schema.columns().len()).collect(),
            name: schema.name().to_owned(),
            schema,
        }
    }

    /// The catalog row of `tuple`. An unchanged TOASTed value of a new image is taken from
    /// `old` (a whole old row, sent under `REPLICA IDENTITY FULL`).
    pub(crate) fn row(
        &self,
        tuple: &[Datum<'_>],
        image: Image,
        old: Option<&[Datum<'_>]>,
    ) -> Result<Vec<Value>, String> {
        let pk = self.schema.primary_key();
        let mut row = Vec::with_capacity(self.positions.len());
        for (i, (col, &at)) in self
            .schema
            .columns()
            .iter()
            .zip(&self.positions)
            .enumerate()
        {
            let column_error = |why: String| format!("column `{}`: {why}", col.name);
            let mut datum = *tuple.get(at).ok_or_else(|| {
                column_error(format!(
                    "the tuple has {} values, fewer than the relation's columns",
                    tuple.len()
                ))
            })?;
            if datum == Datum::Unchanged {
                datum = match old.and_then(|o| o.get(at)) {
                    Some(d) if !matches!(d, Datum::Unchanged) => *d,
                    _ if image == Image::Old && !pk.contains(&i) => Datum::Null,
                    _ => {
                        return Err(column_error(format!(
                            "an unchanged TOASTed value, which Postgres does not send again; \
                             `ALTER TABLE {} REPLICA IDENTITY FULL` makes it send the old row",
                            self.name
                        )));
                    }
                };
            }
            let value = match datum {
                Datum::Null | Datum::Unchanged => Value::Null,
                Datum::Text(bytes) => {
                    let text = std::str::from_utf8(bytes)
                        .map_err(|_| column_error("the value is not UTF-8".into()))?;
                    from_text(col, text).map_err(column_error)?
                }
                Datum::Binary(_) => {
                    return Err(column_error("a binary value (never requested)".into()));
                }
            };
            // An old image's other columns may be null whatever the column says.
            let unchecked = image == Image::Old && !pk.contains(&i) && value == Value::Null;
            if !unchecked {
                self.schema
                    .check_value(i, value.as_ref())
                    .map_err(|e| match e {
                        StorageError::Value { reason, .. } => column_error(reason),
                        other => column_error(other.to_string()),
                    })?;
            }
            row.push(value);
        }
        Ok(row)
    }
}

#[cfg(test)]
mod tests {
    use super::super::pgoutput::RelColumn;
    use super::*;

    fn catalog() -> Catalog {
        Catalog::from_ddl(
            "CREATE TABLE public.t (id INT PRIMARY KEY, name VARCHAR(20), amount DECIMAL(10,2),
                d DATE, ts TIMESTAMP, tz TIMESTAMPTZ, b BOOLEAN NOT NULL, f DOUBLE PRECISION,
                big BIGINT, tm TIME);",
            "t.sql",
        )
        .unwrap()
    }

    fn relation(identity: u8, key: &[&str]) -> Relation {
        let names = [
            "extra", "tm", "big", "f", "b", "tz", "ts", "d", "amount", "name", "id",
        ];
        Relation {
            oid: 7,
            namespace: "public".into(),
            name: "t".into(),
            replica_identity: identity,
            columns: names
                .iter()
                .map(|n| RelColumn {
                    key: key.contains(n),
                    name: (*n).into(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    #[test]
    fn text_values_convert() {
        let c = catalog();
        let m = Mapping::new(&c, &relation(b'd', &["id"])).unwrap();
        let t = |s: &'static str| Datum::Text(s.as_bytes());
        // In the relation's (reversed, with an extra column) order.
        let tuple = [
            t("ignored"),
            t("12:34:56.5"),
            t("9000000000"),
            t("-Infinity"),
            t("t"),
            t("2024-01-02 01:04:05.25+00"),
            t("2024-01-02 03:04:05.123456"),
            t("2024-02-29"),
            t("-12.5"),
            t("a'b"),
            t("1"),
        ];
        let row = m.row(&tuple, Image::New, None).unwrap();
        assert_eq!(
            row,
            vec![
                Value::Int(1),
                Value::Utf8("a'b".into()),
                Value::Decimal(-1250),
                Value::Date(19_782),
                Value::Timestamp(1_704_164_645_123_456),
                Value::Timestamp(1_704_157_445_250_000),
                Value::Boolean(true),
                Value::Float(f64::NEG_INFINITY),
                Value::Int(9_000_000_000),
                Value::Time(45_296_500_000),
            ]
        );
        let error = |tuple: &[Datum], image| m.row(tuple, image, None).unwrap_err();
        let mut bad = tuple;
        bad[7] = t("infinity");
        assert!(error(&bad, Image::New).contains("column `d`: \"infinity\" has no value"));
        bad = tuple;
        bad[8] = t("1.234");
        assert!(error(&bad, Image::New).starts_with("column `amount`"));
        bad = tuple;
        bad[4] = Datum::Null;
        assert!(error(&bad, Image::New).starts_with("column `b`"));
        // A key image may leave NOT NULL columns out; never the key.
        let mut key = [Datum::Null; 11];
        key[10] = t("4");
        assert_eq!(m.row(&key, Image::Old, None).unwrap()[0], Value::Int(4));
        key[10] = Datum::Null;
        assert!(error(&key, Image::Old).starts_with("column `id`"));
        // An unchanged TOASTed value: taken from a whole old row, else an error.
        bad = tuple;
        bad[9] = Datum::Unchanged;
        assert!(error(&bad, Image::New).contains("REPLICA IDENTITY FULL"));
        let row = m.row(&bad, Image::New, Some(&tuple)).unwrap();
        assert_eq!(row[1], Value::Utf8("a'b".into()));
    }

    #[test]
    fn relations_must_match_the_catalog() {
        let c = catalog();
        let e = |rel: &Relation| Mapping::new(&c, rel).unwrap_err();
        assert!(e(&relation(b'd', &[])).contains("replica identity (none)"));
        assert!(e(&relation(b'i', &["id", "d"])).contains("replica identity (d, id)"));
        assert!(Mapping::new(&c, &relation(b'f', &[])).is_ok());
        let mut other = relation(b'd', &["id"]);
        other.name = "other".into();
        assert!(e(&other).contains("public.other is in the publication but not in the catalog"));
        let mut fewer = relation(b'd', &["id"]);
        fewer.columns.retain(|c| c.name != "ts");
        assert!(e(&fewer).contains("column `ts` is not among"));
    }
}
