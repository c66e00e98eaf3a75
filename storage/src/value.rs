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
