//! Values and rows as the engine receives them. [`RowRef`] lets the engine read a row in place,
//! whether it is a `Vec<Value>` or an archived wire buffer.

use std::fmt;

/// An owned value. Decimals are unscaled integers at their column's scale; dates are days and
/// timestamps microseconds since the Unix epoch.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Null,
    Boolean(bool),
    Int(i64),
    Float(f64),
    Decimal(i128),
    Utf8(String),
    Date(i32),
    Timestamp(i64),
    /// A time of day: microseconds since midnight.
    Time(i64),
}

/// A borrowed value; see [`Value`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    Null,
    Boolean(bool),
    Int(i64),
    Float(f64),
    Decimal(i128),
    Utf8(&'a str),
    Date(i32),
    Timestamp(i64),
    Time(i64),
}

impl Value {
    pub fn as_ref(&self) -> ValueRef<'_> {
        match self {
            Value::Null => ValueRef::Null,
            Value::Boolean(v) => ValueRef::Boolean(*v),
            Value::Int(v) => ValueRef::Int(*v),
            Value::Float(v) => ValueRef::Float(*v),
            Value::Decimal(v) => ValueRef::Decimal(*v),
            Value::Utf8(v) => ValueRef::Utf8(v),
            Value::Date(v) => ValueRef::Date(*v),
            Value::Timestamp(v) => ValueRef::Timestamp(*v),
            Value::Time(v) => ValueRef::Time(*v),
        }
    }
}

impl ValueRef<'_> {
    pub fn to_owned(self) -> Value {
        match self {
            ValueRef::Null => Value::Null,
            ValueRef::Boolean(v) => Value::Boolean(v),
            ValueRef::Int(v) => Value::Int(v),
            ValueRef::Float(v) => Value::Float(v),
            ValueRef::Decimal(v) => Value::Decimal(v),
            ValueRef::Utf8(v) => Value::Utf8(v.to_owned()),
            ValueRef::Date(v) => Value::Date(v),
            ValueRef::Timestamp(v) => Value::Timestamp(v),
            ValueRef::Time(v) => Value::Time(v),
        }
    }

    /// The kind of value, for error messages.
    pub fn kind(self) -> &'static str {
        match self {
            ValueRef::Null => "null",
            ValueRef::Boolean(_) => "boolean",
            ValueRef::Int(_) => "integer",
            ValueRef::Float(_) => "float",
            ValueRef::Decimal(_) => "decimal",
            ValueRef::Utf8(_) => "string",
            ValueRef::Date(_) => "date",
            ValueRef::Timestamp(_) => "timestamp",
            ValueRef::Time(_) => "time",
        }
    }
}

impl fmt::Display for ValueRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ValueRef::Null => f.write_str("NULL"),
            ValueRef::Boolean(v) => write!(f, "{v}"),
            ValueRef::Int(v) => write!(f, "{v}"),
            ValueRef::Float(v) => write!(f, "{v}"),
            ValueRef::Decimal(v) => write!(f, "{v}"),
            ValueRef::Utf8(v) => write!(f, "{v:?}"),
            ValueRef::Date(v) => write!(f, "date {v}"),
            ValueRef::Timestamp(v) => write!(f, "timestamp {v}"),
            ValueRef::Time(v) => write!(f, "time {v}"),
        }
    }
}

/// A row the engine can read in place.
pub trait RowRef {
    fn arity(&self) -> usize;
    fn value(&self, column: usize) -> ValueRef<'_>;
}

impl RowRef for [Value] {
    fn arity(&self) -> usize {
        self.len()
    }
    fn value(&self, column: usize) -> ValueRef<'_> {
        self[column].as_ref()
    }
}

impl RowRef for Vec<Value> {
    fn arity(&self) -> usize {
        self.len()
    }
    fn value(&self, column: usize) -> ValueRef<'_> {
        self[column].as_ref()
    }
}

impl<const N: usize> RowRef for [Value; N] {
    fn arity(&self) -> usize {
        N
    }
    fn value(&self, column: usize) -> ValueRef<'_> {
        self[column].as_ref()
    }
}

/// The rows of a batch as owned values, column `i` of the batch read as `types[i]` (a
/// projection of a table's stored columns; `_create_ts` reads as `Int64`).
pub fn batch_rows(
    batch: &arrow::record_batch::RecordBatch,
    types: &[crate::schema::ColumnType],
) -> Vec<Vec<Value>> {
    use crate::schema::ColumnType as T;
    use arrow::array::{
        Array, AsArray,
        types::{
            Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type,
            Time64MicrosecondType, TimestampMicrosecondType,
        },
    };
    assert_eq!(batch.num_columns(), types.len(), "one type per column");
    let mut rows = vec![Vec::with_capacity(types.len()); batch.num_rows()];
    for (col, ty) in batch.columns().iter().zip(types) {
        for (r, row) in rows.iter_mut().enumerate() {
            let v = if col.is_null(r) {
                Value::Null
            } else {
                match ty {
                    T::Boolean => Value::Boolean(col.as_boolean().value(r)),
                    T::Int32 => Value::Int(col.as_primitive::<Int32Type>().value(r).into()),
                    T::Int64 => Value::Int(col.as_primitive::<Int64Type>().value(r)),
                    T::Float32 => Value::Float(col.as_primitive::<Float32Type>().value(r).into()),
                    T::Float64 => Value::Float(col.as_primitive::<Float64Type>().value(r)),
                    T::Decimal { .. } => {
                        Value::Decimal(col.as_primitive::<Decimal128Type>().value(r))
                    }
                    T::Utf8 => Value::Utf8(col.as_string::<i32>().value(r).to_owned()),
                    T::Date => Value::Date(col.as_primitive::<Date32Type>().value(r)),
                    T::Timestamp | T::TimestampTz => {
                        Value::Timestamp(col.as_primitive::<TimestampMicrosecondType>().value(r))
                    }
                    T::Time => Value::Time(col.as_primitive::<Time64MicrosecondType>().value(r)),
                }
            };
            row.push(v);
        }
    }
    rows
}
