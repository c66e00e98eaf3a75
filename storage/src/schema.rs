//! Table schemas: the user's columns and primary key, their Arrow types, and the hidden
//! `_create_ts` column every stored row carries; [`batch_rows`] reads Arrow rows back as values.

use std::collections::HashSet;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};

use crate::error::{Result, StorageError};
use crate::value::{RowRef, Value, ValueRef};

/// The hidden column holding each row's create timestamp. User tables may not use the name.
pub const CREATE_TS_COLUMN: &str = "_create_ts";

/// A column's type. Values of each type are [`ValueRef`] variants: integers for `Int32` and
/// `Int64`, the unscaled integer at the column's scale for `Decimal`, days since 1970-01-01 for
/// `Date`, microseconds since 1970-01-01 00:00:00 UTC for `Timestamp` and `TimestampTz` (the
/// instant; `TimestampTz` is UTC-adjusted in Arrow, `Timestamp` a wall-clock time), and
/// microseconds since midnight for `Time`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ColumnType {
    Boolean,
    Int32,
    Int64,
    Float32,
    Float64,
    Decimal {
        precision: u8,
        scale: i8,
    },
    Utf8,
    Date,
    Timestamp,
    /// A time of day (`TIME`).
    Time,
    /// An instant (`TIMESTAMP WITH TIME ZONE`, `TIMESTAMPTZ`).
    TimestampTz,
}

impl ColumnType {
    pub fn arrow(self) -> DataType {
        match self {
            ColumnType::Boolean => DataType::Boolean,
            ColumnType::Int32 => DataType::Int32,
            ColumnType::Int64 => DataType::Int64,
            ColumnType::Float32 => DataType::Float32,
            ColumnType::Float64 => DataType::Float64,
            ColumnType::Decimal { precision, scale } => DataType::Decimal128(precision, scale),
            ColumnType::Utf8 => DataType::Utf8,
            ColumnType::Date => DataType::Date32,
            ColumnType::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            ColumnType::Time => DataType::Time64(TimeUnit::Microsecond),
            ColumnType::TimestampTz => {
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
            }
        }
    }

    pub fn name(self) -> String {
        match self {
            ColumnType::Boolean => "boolean".into(),
            ColumnType::Int32 => "int".into(),
            ColumnType::Int64 => "bigint".into(),
            ColumnType::Float32 => "real".into(),
            ColumnType::Float64 => "double".into(),
            ColumnType::Decimal { precision, scale } => format!("decimal({precision},{scale})"),
            ColumnType::Utf8 => "varchar".into(),
            ColumnType::Date => "date".into(),
            ColumnType::Timestamp => "timestamp".into(),
            ColumnType::Time => "time".into(),
            ColumnType::TimestampTz => "timestamptz".into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnDef {
    pub name: String,
    pub ty: ColumnType,
    pub nullable: bool,
    /// The fractional-second digits the DDL declared for a time column (`TIMESTAMP(3)`: 3),
    /// if any. Stored values are microseconds whatever it is; a source that sends integer times
    /// without their unit is read in the unit this precision implies.
    pub time_precision: Option<u8>,
}

impl ColumnDef {
    pub fn new(name: impl Into<String>, ty: ColumnType, nullable: bool) -> Self {
        ColumnDef {
            name: name.into(),
            ty,
            nullable,
            time_precision: None,
        }
    }

    /// The column with a declared fractional-second precision.
    pub fn with_time_precision(mut self, digits: u8) -> Self {
        self.time_precision = Some(digits);
        self
    }
}

/// A table's columns and primary key. Primary-key columns are never null.
#[derive(Debug)]
pub struct TableSchema {
    name: String,
    columns: Vec<ColumnDef>,
    primary_key: Vec<usize>,
    arrow: SchemaRef,
    /// [`crate::route::table_seed`] of the name.
    route_seed: u64,
}

impl TableSchema {
    pub fn new(
        name: impl Into<String>,
        mut columns: Vec<ColumnDef>,
        primary_key: &[&str],
    ) -> Result<Arc<Self>> {
        let name = name.into();
        let err = |reason: String| StorageError::Schema {
            table: name.clone(),
            reason,
        };
        if columns.is_empty() {
            return Err(err("a table needs at least one column".into()));
        }
        let mut seen = HashSet::new();
        for c in &columns {
            if c.name == CREATE_TS_COLUMN {
                return Err(err(format!(
                    "`{CREATE_TS_COLUMN}` is a reserved column name"
                )));
            }
            if !seen.insert(c.name.as_str()) {
                return Err(err(format!("column `{}` is defined twice", c.name)));
            }
            if let ColumnType::Decimal { precision, scale } = c.ty
                && (precision == 0 || precision > 38 || scale < 0 || scale as u8 > precision)
            {
                return Err(err(format!(
                    "column `{}`: decimal({precision},{scale}) needs 1 <= precision <= 38 and 0 <= scale <= precision",
                    c.name
                )));
            }
        }
        if primary_key.is_empty() {
            return Err(err("a table needs a primary key".into()));
        }
        let mut pk = Vec::with_capacity(primary_key.len());
        for k in primary_key {
            let i = columns
                .iter()
                .position(|c| c.name == *k)
                .ok_or_else(|| err(format!("primary-key column `{k}` is not a column")))?;
            if pk.contains(&i) {
                return Err(err(format!("primary-key column `{k}` is listed twice")));
            }
            columns[i].nullable = false;
            pk.push(i);
        }
        let mut fields: Vec<Field> = columns
            .iter()
            .map(|c| Field::new(&c.name, c.ty.arrow(), c.nullable))
            .collect();
        fields.push(Field::new(CREATE_TS_COLUMN, DataType::Int64, false));
        Ok(Arc::new(TableSchema {
            route_seed: crate::route::table_seed(&name),
            name,
            columns,
            primary_key: pk,
            arrow: Arc::new(Schema::new(fields)),
        }))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The routing hash's state after the table's name ([`crate::route::table_seed`]).
    pub fn route_seed(&self) -> u64 {
        self.route_seed
    }

    pub fn columns(&self) -> &[ColumnDef] {
        &self.columns
    }

    pub fn primary_key(&self) -> &[usize] {
        &self.primary_key
    }

    /// The stored schema: the user's columns, then `_create_ts`.
    pub fn arrow_schema(&self) -> &SchemaRef {
        &self.arrow
    }

    /// Index of `_create_ts` in the stored schema.
    pub fn create_ts_index(&self) -> usize {
        self.columns.len()
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    fn value_error(&self, column: usize, reason: String) -> StorageError {
        StorageError::Value {
            table: self.name.clone(),
            column: self.columns[column].name.clone(),
            reason,
        }
    }

    /// Checks that `value` fits column `column`.
    pub fn check_value(&self, column: usize, value: ValueRef<'_>) -> Result<()> {
        let def = &self.columns[column];
        let ok = match (def.ty, value) {
            (_, ValueRef::Null) => {
                if def.nullable {
                    return Ok(());
                }
                return Err(self.value_error(column, "null in a column that is NOT NULL".into()));
            }
            (ColumnType::Boolean, ValueRef::Boolean(_)) => true,
            (ColumnType::Int32, ValueRef::Int(v)) => {
                if i32::try_from(v).is_err() {
                    return Err(self.value_error(column, format!("{v} does not fit in int")));
                }
                true
            }
            (ColumnType::Int64, ValueRef::Int(_)) => true,
            (ColumnType::Float32 | ColumnType::Float64, ValueRef::Float(_)) => true,
            (ColumnType::Decimal { precision, scale }, ValueRef::Decimal(v)) => {
                if v.unsigned_abs() >= 10u128.pow(u32::from(precision)) {
                    return Err(self.value_error(
                        column,
                        format!("unscaled {v} does not fit in decimal({precision},{scale})"),
                    ));
                }
                true
            }
            (ColumnType::Utf8, ValueRef::Utf8(_)) => true,
            (ColumnType::Date, ValueRef::Date(_)) => true,
            (ColumnType::Timestamp | ColumnType::TimestampTz, ValueRef::Timestamp(_)) => true,
            (ColumnType::Time, ValueRef::Time(_)) => true,
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(self.value_error(
                column,
                format!("{} value for a {} column", value.kind(), def.ty.name()),
            ))
        }
    }

    /// Checks a full row: its arity and every value.
    pub fn check_row<R: RowRef + ?Sized>(&self, row: &R) -> Result<()> {
        self.check_arity(row)?;
        (0..self.columns.len()).try_for_each(|i| self.check_value(i, row.value(i)))
    }

    /// Checks the arity and the primary-key values of a row; other values are ignored (a
    /// delete's before-image may carry only its key).
    pub fn check_key<R: RowRef + ?Sized>(&self, row: &R) -> Result<()> {
        self.check_arity(row)?;
        self.primary_key
            .iter()
            .try_for_each(|&i| self.check_value(i, row.value(i)))
    }

    fn check_arity<R: RowRef + ?Sized>(&self, row: &R) -> Result<()> {
        if row.arity() != self.columns.len() {
            return Err(StorageError::Schema {
                table: self.name.clone(),
                reason: format!(
                    "a row has {} values, the table {} columns",
                    row.arity(),
                    self.columns.len()
                ),
            });
        }
        Ok(())
    }
}

/// The rows of a batch as owned values, column `i` of the batch read as `types[i]` (a
/// projection of a table's stored columns; `_create_ts` reads as `Int64`).
pub fn batch_rows(
    batch: &arrow::record_batch::RecordBatch,
    types: &[ColumnType],
) -> Vec<Vec<Value>> {
    use ColumnType as T;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    fn t() -> Arc<TableSchema> {
        TableSchema::new(
            "t",
            vec![
                ColumnDef::new("id", ColumnType::Int32, true),
                ColumnDef::new(
                    "amount",
                    ColumnType::Decimal {
                        precision: 4,
                        scale: 2,
                    },
                    true,
                ),
            ],
            &["id"],
        )
        .unwrap()
    }

    #[test]
    fn schema_errors() {
        let c = |n: &str| ColumnDef::new(n, ColumnType::Int64, false);
        assert!(TableSchema::new("t", vec![c("a")], &[]).is_err());
        assert!(TableSchema::new("t", vec![c("a")], &["b"]).is_err());
        assert!(TableSchema::new("t", vec![c("a"), c("a")], &["a"]).is_err());
        assert!(TableSchema::new("t", vec![c(CREATE_TS_COLUMN)], &[CREATE_TS_COLUMN]).is_err());
        let s = t();
        assert!(!s.columns()[0].nullable, "primary-key columns are NOT NULL");
        assert_eq!(s.arrow_schema().fields().len(), 3);
        assert_eq!(s.arrow_schema().field(2).name(), CREATE_TS_COLUMN);
    }

    #[test]
    fn value_errors() {
        let s = t();
        assert!(s.check_row(&[Value::Int(1), Value::Decimal(9999)]).is_ok());
        assert!(
            s.check_row(&[Value::Int(1), Value::Decimal(10000)])
                .is_err()
        );
        assert!(s.check_row(&[Value::Int(1 << 40), Value::Null]).is_err());
        assert!(s.check_row(&[Value::Null, Value::Null]).is_err());
        assert!(
            s.check_row(&[Value::Utf8("1".into()), Value::Null])
                .is_err()
        );
        assert!(s.check_row(&[Value::Int(1)]).is_err());
        assert!(
            s.check_key(&[Value::Int(1), Value::Utf8("x".into())])
                .is_ok()
        );
        let e = s.check_row(&[Value::Float(1.0), Value::Null]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "table `t`, column `id`: float value for a int column"
        );
        assert!(s.check_row(&[Value::Int(1), Value::Decimal(-9999)]).is_ok());
        assert!(
            s.check_row(&[Value::Int(1), Value::Decimal(-10000)])
                .is_err()
        );
    }

    #[test]
    fn a_decimal_fits_up_to_its_precision_at_every_precision() {
        for precision in 1..=38u8 {
            let s = TableSchema::new(
                "t",
                vec![ColumnDef::new(
                    "d",
                    ColumnType::Decimal {
                        precision,
                        scale: 0,
                    },
                    false,
                )],
                &["d"],
            )
            .unwrap();
            let limit = 10i128.pow(u32::from(precision));
            for (v, fits) in [
                (limit - 1, true),
                (limit, false),
                (1 - limit, true),
                (-limit, false),
            ] {
                assert_eq!(
                    s.check_value(0, Value::Decimal(v).as_ref()).is_ok(),
                    fits,
                    "{v} in decimal({precision},0)"
                );
            }
        }
    }
}
