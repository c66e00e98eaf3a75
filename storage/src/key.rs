//! Primary-key bytes: an unambiguous, order-preserving encoding of the key columns, so that
//! comparing two encodings bytewise orders the keys as their values (column by column), and
//! each encoding decodes back to exactly one key.
//!
//! Fixed-width types are big-endian with the sign bit flipped (floats use the IEEE total-order
//! trick); strings escape 0x00 as 0x00 0xFF and end with 0x00 0x01, so a prefix sorts first.

use crate::error::{Result, StorageError};
use crate::schema::{ColumnType, TableSchema};
use crate::value::{RowRef, Value, ValueRef};

const SIGN64: u64 = 1 << 63;
const SIGN32: u32 = 1 << 31;
const SIGN128: u128 = 1 << 127;

/// Appends the encoded primary key of `row` to `out`. The key values must have been checked
/// with [`TableSchema::check_key`].
pub fn encode_key<R: RowRef + ?Sized>(schema: &TableSchema, row: &R, out: &mut Vec<u8>) {
    for &col in schema.primary_key() {
        encode_value(schema.columns()[col].ty, row.value(col), out);
    }
}

fn encode_value(ty: ColumnType, v: ValueRef<'_>, out: &mut Vec<u8>) {
    match (ty, v) {
        (ColumnType::Boolean, ValueRef::Boolean(b)) => out.push(u8::from(b)),
        (ColumnType::Int32, ValueRef::Int(i)) => {
            out.extend_from_slice(&((i as i32 as u32) ^ SIGN32).to_be_bytes())
        }
        (ColumnType::Date, ValueRef::Date(i)) => {
            out.extend_from_slice(&((i as u32) ^ SIGN32).to_be_bytes())
        }
        (ColumnType::Int64, ValueRef::Int(i))
        | (ColumnType::Timestamp | ColumnType::TimestampTz, ValueRef::Timestamp(i))
        | (ColumnType::Time, ValueRef::Time(i)) => {
            out.extend_from_slice(&((i as u64) ^ SIGN64).to_be_bytes())
        }
        (ColumnType::Float32, ValueRef::Float(f)) => {
            let bits = (f as f32).to_bits();
            let ordered = if bits & SIGN32 != 0 {
                !bits
            } else {
                bits | SIGN32
            };
            out.extend_from_slice(&ordered.to_be_bytes())
        }
        (ColumnType::Float64, ValueRef::Float(f)) => {
            let bits = f.to_bits();
            let ordered = if bits & SIGN64 != 0 {
                !bits
            } else {
                bits | SIGN64
            };
            out.extend_from_slice(&ordered.to_be_bytes())
        }
        (ColumnType::Decimal { .. }, ValueRef::Decimal(d)) => {
            out.extend_from_slice(&((d as u128) ^ SIGN128).to_be_bytes())
        }
        (ColumnType::Utf8, ValueRef::Utf8(s)) => {
            for &b in s.as_bytes() {
                out.push(b);
                if b == 0 {
                    out.push(0xFF);
                }
            }
            out.extend_from_slice(&[0x00, 0x01]);
        }
        (ty, v) => panic!(
            "key value {} was not checked against its {} column",
            v.kind(),
            ty.name()
        ),
    }
}

/// Decodes key bytes back into the primary-key values, in primary-key order.
pub fn decode_key(schema: &TableSchema, mut bytes: &[u8]) -> Result<Vec<Value>> {
    let corrupt = |reason: &str| StorageError::Corrupt {
        what: format!("a key of table `{}`", schema.name()),
        reason: reason.into(),
    };
    let mut values = Vec::with_capacity(schema.primary_key().len());
    for &col in schema.primary_key() {
        let ty = schema.columns()[col].ty;
        let width = match ty {
            ColumnType::Boolean => 1,
            ColumnType::Int32 | ColumnType::Date | ColumnType::Float32 => 4,
            ColumnType::Int64
            | ColumnType::Timestamp
            | ColumnType::TimestampTz
            | ColumnType::Time
            | ColumnType::Float64 => 8,
            ColumnType::Decimal { .. } => 16,
            ColumnType::Utf8 => 0,
        };
        if ty == ColumnType::Utf8 {
            let mut s = Vec::new();
            loop {
                match bytes {
                    [0x00, 0x01, rest @ ..] => {
                        bytes = rest;
                        break;
                    }
                    [0x00, 0xFF, rest @ ..] => {
                        s.push(0);
                        bytes = rest;
                    }
                    [0x00, ..] | [] => return Err(corrupt("unterminated string")),
                    [b, rest @ ..] => {
                        s.push(*b);
                        bytes = rest;
                    }
                }
            }
            let s = String::from_utf8(s).map_err(|_| corrupt("string is not UTF-8"))?;
            values.push(Value::Utf8(s));
            continue;
        }
        if bytes.len() < width {
            return Err(corrupt("truncated"));
        }
        let (head, rest) = bytes.split_at(width);
        bytes = rest;
        let value = match ty {
            ColumnType::Boolean => match head[0] {
                0 => Value::Boolean(false),
                1 => Value::Boolean(true),
                _ => return Err(corrupt("boolean is not 0 or 1")),
            },
            ColumnType::Int32 => Value::Int(i64::from((be32(head) ^ SIGN32) as i32)),
            ColumnType::Date => Value::Date((be32(head) ^ SIGN32) as i32),
            ColumnType::Int64 => Value::Int((be64(head) ^ SIGN64) as i64),
            ColumnType::Timestamp | ColumnType::TimestampTz => {
                Value::Timestamp((be64(head) ^ SIGN64) as i64)
            }
            ColumnType::Time => Value::Time((be64(head) ^ SIGN64) as i64),
            ColumnType::Float32 => {
                let o = be32(head);
                let bits = if o & SIGN32 != 0 { o & !SIGN32 } else { !o };
                Value::Float(f64::from(f32::from_bits(bits)))
            }
            ColumnType::Float64 => {
                let o = be64(head);
                let bits = if o & SIGN64 != 0 { o & !SIGN64 } else { !o };
                Value::Float(f64::from_bits(bits))
            }
            ColumnType::Decimal { .. } => Value::Decimal(
                (u128::from_be_bytes(head.try_into().expect("16 bytes")) ^ SIGN128) as i128,
            ),
            ColumnType::Utf8 => unreachable!("strings were decoded above"),
        };
        values.push(value);
    }
    if !bytes.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    Ok(values)
}

/// A key for people: `(col=value, ...)`, from a row's primary-key values.
pub fn display_key<R: RowRef + ?Sized>(schema: &TableSchema, row: &R) -> String {
    let parts: Vec<String> = schema
        .primary_key()
        .iter()
        .map(|&c| format!("{}={}", schema.columns()[c].name, row.value(c)))
        .collect();
    format!("({})", parts.join(", "))
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().expect("4 bytes"))
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}
