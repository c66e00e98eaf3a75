//! Column values: a JSON value to the storage [`Value`] of its column's type (booleans,
//! integers, floats, decimals in every encoding Debezium writes, dates, timestamps, times of
//! day), and an event's row images to rows ([`Rows`]).

use std::borrow::Cow;
use std::collections::HashMap;

use base64::Engine as _;
use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Timelike};
use retina_storage::{ColumnDef, ColumnType, StorageError, TableSchema, Value};
use serde::Deserialize;
use serde_json::{Map, Value as Json};

use super::error::{DebeziumError, SourcePosition};

// Semantic type names (the `name` of a field in the envelope schema).
pub(super) const CONNECT_DECIMAL: &str = "org.apache.kafka.connect.data.Decimal";
pub(super) const DATE: &str = "io.debezium.time.Date";
pub(super) const CONNECT_DATE: &str = "org.apache.kafka.connect.data.Date";
pub(super) const TIMESTAMP_MS: &str = "io.debezium.time.Timestamp";
pub(super) const CONNECT_TIMESTAMP_MS: &str = "org.apache.kafka.connect.data.Timestamp";
pub(super) const TIMESTAMP_US: &str = "io.debezium.time.MicroTimestamp";
pub(super) const TIMESTAMP_NS: &str = "io.debezium.time.NanoTimestamp";
pub(super) const TIME_MS: &str = "io.debezium.time.Time";
pub(super) const CONNECT_TIME_MS: &str = "org.apache.kafka.connect.data.Time";
pub(super) const TIME_US: &str = "io.debezium.time.MicroTime";
pub(super) const TIME_NS: &str = "io.debezium.time.NanoTime";

pub(super) const MICROS_PER_DAY: i64 = 86_400_000_000;

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
    /// Read only the primary key of a before image (a delete's row, an update's old row),
    /// every other column null, as without a before image: replay needs nothing else of it
    /// (a key finds the row it removes), and converting an old row's strings would copy and
    /// free them for nothing. Its other columns are then not checked either. Off by default:
    /// the parse gives the image as written.
    pub before_keys_only: bool,
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

/// What the envelope schema says about one column.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct FieldType<'a> {
    /// The Connect type: `int32`, `int64`, `string`, `bytes`, ...
    pub(super) connect: Option<&'a str>,
    /// The semantic type name, e.g. `io.debezium.time.MicroTimestamp`.
    pub(super) name: Option<&'a str>,
    /// `parameters.scale` of a Connect decimal.
    pub(super) scale: Option<&'a Json>,
}

/// `row`'s primary-key values, every other column null.
pub(crate) fn key_only(table: &TableSchema, row: &[Value]) -> Vec<Value> {
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
pub(super) enum Image {
    /// A full row: the key and every NOT NULL column must be present.
    After,
    /// A row whose key is all that is needed (a delete's, an update's before image): other
    /// columns may be missing or null.
    Before,
}

/// A column's value as the parse read it.
pub(super) enum Cell<'j> {
    /// A JSON value, borrowed from a DOM or owned.
    Json(Cow<'j, Json>),
    /// A JSON string without escapes, borrowed from the line: a text column copies it once,
    /// a decimal column parses it in place.
    Str(&'j str),
}

/// Converts row images of one event.
pub(super) struct Rows<'a> {
    pub(super) table: &'a TableSchema,
    pub(super) fields: &'a HashMap<&'a str, FieldType<'a>>,
    pub(super) pos: &'a SourcePosition,
    pub(super) options: &'a ParseOptions,
}

impl Rows<'_> {
    pub(super) fn convert(
        &self,
        obj: &Map<String, Json>,
        image: Image,
    ) -> Result<Vec<Value>, DebeziumError> {
        self.convert_from(
            |column| obj.get(column).map(|v| Cell::Json(Cow::Borrowed(v))),
            image,
        )
    }

    /// [`Self::convert`] of an image whose column values `get` looks up by name (an owned
    /// string value becomes the column's value without a copy).
    pub(super) fn convert_from<'j>(
        &self,
        mut get: impl FnMut(&str) -> Option<Cell<'j>>,
        image: Image,
    ) -> Result<Vec<Value>, DebeziumError> {
        let pk = self.table.primary_key();
        let mut row = Vec::with_capacity(self.table.columns().len());
        let keys_only = image == Image::Before && self.options.before_keys_only;
        for (i, col) in self.table.columns().iter().enumerate() {
            let is_key = pk.contains(&i);
            if keys_only && !is_key {
                row.push(Value::Null);
                continue;
            }
            let Some(json) = get(&col.name) else {
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
            let field = if self.fields.is_empty() {
                FieldType::default()
            } else {
                self.fields
                    .get(col.name.as_str())
                    .copied()
                    .unwrap_or_default()
            };
            let value = match json {
                Cell::Str(s) => convert_str(col, s, field, self.options),
                Cell::Json(Cow::Owned(Json::String(s))) if col.ty == ColumnType::Utf8 => {
                    Ok(Value::Utf8(s))
                }
                Cell::Json(json) => convert(col, &json, field, self.options),
            }
            .map_err(value_error)?;
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
pub(super) fn describe(v: &Json) -> String {
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
pub(super) fn convert(
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

/// [`convert`] of a JSON string, read in place where the column's type allows.
fn convert_str(
    col: &ColumnDef,
    s: &str,
    field: FieldType<'_>,
    options: &ParseOptions,
) -> Result<Value, String> {
    match col.ty {
        ColumnType::Utf8 => Ok(Value::Utf8(s.to_owned())),
        ColumnType::Decimal { scale, .. } => {
            decimal_from_str(s, scale, field, options.decimal_handling).map(Value::Decimal)
        }
        _ => convert(col, &Json::String(s.to_owned()), field, options),
    }
}

/// A boolean; also 0 or 1, which is how MySQL's `tinyint(1)` arrives without a converter.
pub(super) fn to_bool(v: &Json) -> Result<bool, String> {
    match v {
        Json::Bool(b) => Ok(*b),
        Json::Number(n) if n.as_u64() == Some(0) => Ok(false),
        Json::Number(n) if n.as_u64() == Some(1) => Ok(true),
        other => Err(format!("expected a boolean, got {}", describe(other))),
    }
}

/// An integer; the column's range is checked by the schema afterwards.
pub(super) fn to_int(v: &Json) -> Result<i64, String> {
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
pub(super) fn to_float(v: &Json) -> Result<f64, String> {
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
pub(super) fn to_decimal(
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
        Json::String(s) => decimal_from_str(s, scale, field, mode),
        other => Err(format!(
            "expected a decimal string, base64 bytes or a number, got {}",
            describe(other)
        )),
    }
}

/// [`to_decimal`] of a JSON string: base64 bytes or a literal, as the schema or `mode` says.
fn decimal_from_str(
    s: &str,
    scale: i8,
    field: FieldType<'_>,
    mode: DecimalHandling,
) -> Result<i128, String> {
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

/// 10^n, or `None` where it does not fit in an i128.
fn pow10(n: u64) -> Option<i128> {
    u32::try_from(n).ok().and_then(|n| 10i128.checked_pow(n))
}

/// `unscaled` at scale `from`, rescaled exactly to `to`.
pub(super) fn rescale(unscaled: i128, from: i64, to: i8) -> Result<i128, String> {
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
pub(crate) fn parse_decimal(s: &str, scale: i8) -> Result<i128, String> {
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
    // value = digits * 10^-frac_digits, the digits being the integer part's and then the
    // fraction's. Leading and trailing zeros are dropped first, so that a long run of them
    // (`1.000...0`) does not overflow before the rescale.
    let digits = int_part.bytes().chain(frac_part.bytes());
    let total = int_part.len() + frac_part.len();
    let zero = |b: &u8| *b == b'0';
    let leading_zeros = digits.clone().take_while(zero).count();
    if leading_zeros == total {
        return Ok(0);
    }
    let trailing_zeros = digits.clone().rev().take_while(zero).count();
    let significant = digits
        .skip(leading_zeros)
        .take(total - leading_zeros - trailing_zeros);
    let frac_digits = frac_part.len() as i64 - trailing_zeros as i64 - i64::from(exponent);
    let mut unscaled: i128 = 0;
    for b in significant {
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
pub(super) fn decode_unscaled(b64: &str) -> Result<i128, String> {
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
pub(super) enum TimeUnit {
    Days,
    Millis,
    Micros,
    Nanos,
}

/// The unit of an integer time without a semantic type (no envelope), from its column's
/// declared fractional-second precision, as Debezium chooses the semantic type: 0-3 digits
/// are milliseconds (`Timestamp`, `Time`), 4-6 microseconds (`MicroTimestamp`, `MicroTime`),
/// 7-9 nanoseconds (`NanoTimestamp`, `NanoTime`). Undeclared (`TIMESTAMP`, `TIME`) is 6.
pub(super) fn precision_unit(precision: Option<u8>) -> Result<TimeUnit, String> {
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
pub(super) fn to_date(v: &Json, name: Option<&str>) -> Result<i32, String> {
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
        Json::String(s) => parse_date(s),
        other => Err(format!(
            "expected a date (days or YYYY-MM-DD), got {}",
            describe(other)
        )),
    }
}

/// A `YYYY-MM-DD` date as days since 1970-01-01.
pub(crate) fn parse_date(s: &str) -> Result<i32, String> {
    let d = NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .map_err(|e| format!("{s:?} is not a YYYY-MM-DD date: {e}"))?;
    days_since_epoch(d)
}

/// A timestamp as microseconds since the epoch, UTC: an integer in the unit its semantic type
/// names (without one, the unit of the column's declared `precision`; a time of day is taken
/// on 1970-01-01) or a string.
pub(super) fn to_timestamp(
    v: &Json,
    name: Option<&str>,
    precision: Option<u8>,
) -> Result<i64, String> {
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
        Json::String(s) => parse_time_of_day(s)?,
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

/// `HH:MM:SS[.f]` text (a trailing `Z` allowed) as microseconds since midnight; `24:00:00` is
/// the end of the day.
pub(crate) fn parse_time_of_day(s: &str) -> Result<i64, String> {
    let text = s.strip_suffix('Z').unwrap_or(s);
    let end_of_day = text == "24:00:00"
        || (text.starts_with("24:00:00.") && text[9..].bytes().all(|b| b == b'0'));
    if end_of_day {
        return Ok(MICROS_PER_DAY);
    }
    let t = NaiveTime::parse_from_str(text, "%H:%M:%S%.f")
        .map_err(|e| format!("{s:?} is not a HH:MM:SS[.f] time of day: {e}"))?;
    Ok(i64::from(t.num_seconds_from_midnight()) * 1_000_000 + i64::from(t.nanosecond() / 1000))
}

/// Parses `io.debezium.time.ZonedTimestamp` text (RFC 3339, `Z` or an offset) and plain
/// `YYYY-MM-DD[ T]HH:MM:SS[.f]` or `YYYY-MM-DD`, which are taken as UTC. Sub-microsecond digits
/// are truncated toward negative infinity.
pub(crate) fn parse_timestamp(s: &str) -> Result<i64, String> {
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
