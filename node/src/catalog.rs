//! Tables from SQL DDL, and the catalog that names them. `CREATE TABLE t (...) PRIMARY KEY (...)`
//! or a column-level `PRIMARY KEY`; integer, float, decimal(p,s), varchar/text, boolean, date,
//! time, timestamp and timestamptz columns. Parsed with sqlparser (the dialect-neutral grammar).
//!
//! A time column's declared fractional-second precision (`TIMESTAMP(3)`, `DATETIME(6)`,
//! `TIME(9)`; 6 when undeclared) is kept: a stream without the envelope schema sends integer
//! times in the unit it implies (0-3 milliseconds, 4-6 microseconds, 7-9 nanoseconds), as
//! Debezium picks `Timestamp`, `MicroTimestamp` or `NanoTimestamp`.

use std::sync::Arc;

use retina_storage::{ColumnDef, ColumnType, TableId, TableSchema};
use sqlparser::ast::{
    ColumnOption, CreateTable, DataType, ExactNumberInfo, Expr, Statement, TableConstraint,
};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("{source_name}: {reason}")]
    Sql { source_name: String, reason: String },
    #[error("{source_name}: statement {index}: only CREATE TABLE is accepted, got: {statement}")]
    NotCreateTable {
        source_name: String,
        index: usize,
        statement: String,
    },
    #[error("{source_name}: table `{table}`: {reason}")]
    Table {
        source_name: String,
        table: String,
        reason: String,
    },
}

/// The tables a node replays into, in id order.
#[derive(Default, Debug)]
pub struct Catalog {
    tables: Vec<Arc<TableSchema>>,
    by_name: rustc_hash::FxHashMap<String, TableId>,
    /// Each schema's id by its address (see [`Catalog::id_of`]); the catalog holds every
    /// schema, so no address is reused while it lives.
    by_address: rustc_hash::FxHashMap<usize, TableId>,
}

impl Catalog {
    /// A catalog of every `CREATE TABLE` in `sql`; `source_name` (a file name) prefixes errors.
    pub fn from_ddl(sql: &str, source_name: &str) -> Result<Self, CatalogError> {
        let mut catalog = Catalog::default();
        for schema in parse_ddl(sql, source_name)? {
            catalog.add(schema).map_err(|reason| CatalogError::Table {
                source_name: source_name.into(),
                table: reason.0,
                reason: reason.1,
            })?;
        }
        Ok(catalog)
    }

    fn add(&mut self, schema: Arc<TableSchema>) -> Result<TableId, (String, String)> {
        let name = schema.name().to_owned();
        if self.by_name.contains_key(&name) {
            return Err((name, "is defined twice".into()));
        }
        let id = self.tables.len() as TableId;
        self.by_address.insert(Arc::as_ptr(&schema) as usize, id);
        self.tables.push(schema);
        self.by_name.insert(name, id);
        Ok(id)
    }

    pub fn tables(&self) -> &[Arc<TableSchema>] {
        &self.tables
    }

    pub fn get(&self, id: TableId) -> Option<&Arc<TableSchema>> {
        self.tables.get(id as usize)
    }

    /// One line per table, in catalog order: its name, columns (type, nullability) and
    /// primary key. Two catalogs lay rows out alike exactly when their descriptions are equal.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            let columns: Vec<String> = t
                .columns()
                .iter()
                .map(|c| {
                    let null = if c.nullable { "" } else { " not null" };
                    format!("{} {}{null}", c.name, c.ty.name())
                })
                .collect();
            let key: Vec<&str> = t
                .primary_key()
                .iter()
                .map(|&i| t.columns()[i].name.as_str())
                .collect();
            out += &format!(
                "{} ({}, primary key ({}))\n",
                t.name(),
                columns.join(", "),
                key.join(", ")
            );
        }
        out
    }

    /// The table called `name`: exactly as the DDL names it (`schema.table` or `table`), or, for
    /// a qualified `name`, the unqualified table of the same name.
    pub fn resolve(&self, name: &str) -> Option<TableId> {
        if let Some(&id) = self.by_name.get(name) {
            return Some(id);
        }
        let (_, bare) = name.rsplit_once('.')?;
        self.by_name.get(bare).copied()
    }

    /// The id of `schema`: found by identity where it is this catalog's own (as the schemas
    /// the sink's parse resolves are, which spares hashing the name of every event), else by
    /// its name.
    pub fn id_of(&self, schema: &Arc<TableSchema>) -> Option<TableId> {
        match self.by_address.get(&(Arc::as_ptr(schema) as usize)) {
            Some(&id) => Some(id),
            None => self.resolve(schema.name()),
        }
    }
}

/// Every `CREATE TABLE` of `sql` as a table schema.
pub fn parse_ddl(sql: &str, source_name: &str) -> Result<Vec<Arc<TableSchema>>, CatalogError> {
    let statements = Parser::parse_sql(&GenericDialect {}, sql).map_err(|e| CatalogError::Sql {
        source_name: source_name.into(),
        reason: e.to_string(),
    })?;
    statements
        .into_iter()
        .enumerate()
        .map(|(index, st)| match st {
            Statement::CreateTable(ct) => table(&ct).map_err(|reason| CatalogError::Table {
                source_name: source_name.into(),
                table: ct.name.to_string(),
                reason,
            }),
            other => Err(CatalogError::NotCreateTable {
                source_name: source_name.into(),
                index: index + 1,
                statement: other.to_string().chars().take(60).collect(),
            }),
        })
        .collect()
}

fn table(ct: &CreateTable) -> Result<Arc<TableSchema>, String> {
    let name = ct
        .name
        .0
        .iter()
        .map(|p| p.to_string().trim_matches('"').trim_matches('`').to_owned())
        .collect::<Vec<_>>()
        .join(".");
    let mut columns = Vec::with_capacity(ct.columns.len());
    let mut primary_key: Vec<String> = Vec::new();
    for c in &ct.columns {
        let (ty, time_precision) =
            column_type(&c.data_type).map_err(|r| format!("column `{}`: {r}", c.name.value))?;
        let mut nullable = true;
        for opt in &c.options {
            match &opt.option {
                ColumnOption::NotNull => nullable = false,
                ColumnOption::PrimaryKey(_) => {
                    nullable = false;
                    primary_key.push(c.name.value.clone());
                }
                _ => {}
            }
        }
        let mut column = ColumnDef::new(c.name.value.clone(), ty, nullable);
        column.time_precision = time_precision;
        columns.push(column);
    }
    for constraint in &ct.constraints {
        if let TableConstraint::PrimaryKey(pk) = constraint {
            if !primary_key.is_empty() {
                return Err("the primary key is declared twice".into());
            }
            for ic in &pk.columns {
                match &ic.column.expr {
                    Expr::Identifier(id) => primary_key.push(id.value.clone()),
                    other => return Err(format!("primary-key part `{other}` is not a column")),
                }
            }
        }
    }
    if primary_key.is_empty() {
        return Err("has no PRIMARY KEY; Retina replays by primary key".into());
    }
    let pk: Vec<&str> = primary_key.iter().map(String::as_str).collect();
    TableSchema::new(name, columns, &pk).map_err(|e| match e {
        retina_storage::StorageError::Schema { reason, .. } => reason,
        other => other.to_string(),
    })
}

/// A column's type and, for a time column, its declared fractional-second precision.
fn column_type(dt: &DataType) -> Result<(ColumnType, Option<u8>), String> {
    use DataType as D;
    use sqlparser::ast::TimezoneInfo as Tz;
    let time = |ty: ColumnType, precision: &Option<u64>| match precision {
        None => Ok((ty, None)),
        Some(p @ 0..=9) => Ok((ty, Some(*p as u8))),
        Some(p) => Err(format!(
            "{dt}: fractional-second precision {p} is beyond nanoseconds (0..=9)"
        )),
    };
    match dt {
        D::Timestamp(p, Tz::None | Tz::WithoutTimeZone) | D::Datetime(p) | D::TimestampNtz(p) => {
            return time(ColumnType::Timestamp, p);
        }
        D::Timestamp(p, Tz::WithTimeZone | Tz::Tz) => return time(ColumnType::TimestampTz, p),
        D::Time(p, Tz::None | Tz::WithoutTimeZone) => return time(ColumnType::Time, p),
        D::Time(..) => {
            return Err(
                "time with time zone is not supported; declare it varchar (Debezium sends it \
                 as text)"
                    .into(),
            );
        }
        _ => {}
    }
    let ty = match dt {
        D::TinyInt(_)
        | D::SmallInt(_)
        | D::Int2(_)
        | D::MediumInt(_)
        | D::Int(_)
        | D::Int4(_)
        | D::Integer(_)
        | D::Int16
        | D::Int32 => ColumnType::Int32,
        D::BigInt(_) | D::Int8(_) | D::Int64 => ColumnType::Int64,
        D::Real | D::Float4 | D::Float32 => ColumnType::Float32,
        D::Float(ExactNumberInfo::Precision(p)) if *p <= 24 => ColumnType::Float32,
        D::Float(_) | D::Double(_) | D::DoublePrecision | D::Float8 | D::Float64 => {
            ColumnType::Float64
        }
        D::Decimal(info) | D::Numeric(info) | D::Dec(info) => {
            let (precision, scale) = match info {
                ExactNumberInfo::PrecisionAndScale(p, s) => (*p, *s),
                ExactNumberInfo::Precision(p) => (*p, 0),
                ExactNumberInfo::None => {
                    return Err(
                        "decimal without a precision: declare decimal(p,s), p at most 38".into(),
                    );
                }
            };
            if !(1..=38).contains(&precision) || scale < 0 || scale as u64 > precision {
                return Err(format!(
                    "decimal({precision},{scale}): precision 1..=38 and scale 0..=precision"
                ));
            }
            ColumnType::Decimal {
                precision: precision as u8,
                scale: scale as i8,
            }
        }
        D::Varchar(_)
        | D::Nvarchar(_)
        | D::Char(_)
        | D::Character(_)
        | D::CharacterVarying(_)
        | D::CharVarying(_)
        | D::Text
        | D::TinyText
        | D::MediumText
        | D::LongText
        | D::String(_)
        | D::Uuid => ColumnType::Utf8,
        D::Boolean | D::Bool => ColumnType::Boolean,
        D::Date => ColumnType::Date,
        other => return Err(format!("type {other} is not supported")),
    };
    Ok((ty, None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_is_known_by_identity_or_by_name() {
        let catalog = Catalog::from_ddl(
            "CREATE TABLE a (k INT PRIMARY KEY); CREATE TABLE s.b (k INT PRIMARY KEY);",
            "t",
        )
        .unwrap();
        for (id, schema) in catalog.tables().iter().enumerate() {
            assert_eq!(catalog.id_of(schema), Some(id as TableId));
            // The same table parsed again (another schema, another address): by its name.
            let copy = parse_ddl(
                &format!("CREATE TABLE {} (k INT PRIMARY KEY)", schema.name()),
                "t",
            )
            .unwrap()
            .remove(0);
            assert!(!Arc::ptr_eq(&copy, schema));
            assert_eq!(catalog.id_of(&copy), Some(id as TableId));
        }
        let other = Catalog::from_ddl("CREATE TABLE c (k INT PRIMARY KEY)", "t").unwrap();
        assert_eq!(catalog.id_of(&other.tables()[0]), None);
    }

    #[test]
    fn tables_from_ddl() {
        let sql = "
            CREATE TABLE warehouse (w_id INT PRIMARY KEY, w_name VARCHAR(10), w_ytd DECIMAL(12,2) NOT NULL);
            CREATE TABLE tpcc.orderline (
                ol_w_id int, ol_d_id smallint, ol_o_id integer, ol_number int,
                ol_delivery_d timestamp, ol_amount numeric(6,2), ol_dist_info char(24),
                ol_ok boolean, ol_day date, ol_f double precision, ol_r real, ol_big bigint,
                PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)
            );";
        let c = Catalog::from_ddl(sql, "ch.sql").unwrap();
        assert_eq!(c.tables().len(), 2);
        let w = c.get(c.resolve("warehouse").unwrap()).unwrap();
        assert_eq!(w.primary_key(), &[0]);
        assert!(!w.columns()[2].nullable);
        assert_eq!(
            w.columns()[2].ty,
            ColumnType::Decimal {
                precision: 12,
                scale: 2
            }
        );
        let ol = c.get(c.resolve("tpcc.orderline").unwrap()).unwrap();
        assert_eq!(ol.primary_key(), &[0, 1, 2, 3]);
        let types: Vec<_> = ol.columns().iter().map(|c| c.ty).collect();
        use ColumnType::*;
        assert_eq!(
            types,
            vec![
                Int32,
                Int32,
                Int32,
                Int32,
                Timestamp,
                Decimal {
                    precision: 6,
                    scale: 2
                },
                Utf8,
                Boolean,
                Date,
                Float64,
                Float32,
                Int64
            ]
        );
        assert_eq!(c.resolve("public.warehouse"), c.resolve("warehouse"));
        assert_eq!(
            c.resolve("other.orderline"),
            None,
            "a qualified table matches only its schema"
        );
    }

    #[test]
    fn bad_ddl_names_what_is_wrong() {
        let err = |sql: &str| Catalog::from_ddl(sql, "s.sql").unwrap_err().to_string();
        assert!(
            err("CREATE TABLE t (a INT").starts_with("s.sql: "),
            "{}",
            err("CREATE TABLE t (a INT")
        );
        assert_eq!(
            err("CREATE TABLE t (a INT)"),
            "s.sql: table `t`: has no PRIMARY KEY; Retina replays by primary key"
        );
        assert_eq!(
            err("CREATE TABLE t (a INT PRIMARY KEY, b JSON)"),
            "s.sql: table `t`: column `b`: type JSON is not supported"
        );
        assert!(
            err("CREATE TABLE t (a NUMERIC PRIMARY KEY)").contains("decimal without a precision")
        );
        assert!(err("CREATE TABLE t (a INT, PRIMARY KEY (b))").contains("`b` is not a column"));
        assert!(
            err("CREATE TABLE t (a INT PRIMARY KEY); CREATE TABLE t (a INT PRIMARY KEY)")
                .contains("defined twice")
        );
        assert!(err("DROP TABLE t").contains("only CREATE TABLE"));
        assert!(err("CREATE TABLE t (a INT PRIMARY KEY, b TIMESTAMP(12))").contains("0..=9"));
        assert!(
            err("CREATE TABLE t (a INT PRIMARY KEY, b TIME WITH TIME ZONE)").contains("varchar")
        );
    }

    #[test]
    fn time_columns_keep_their_precision() {
        let sql = "CREATE TABLE t (
            id INT PRIMARY KEY, a TIMESTAMP, b TIMESTAMP(3), c DATETIME(6), d TIMESTAMP(9),
            e TIMESTAMP WITH TIME ZONE, f TIMESTAMPTZ, g TIME, h TIME(3),
            i TIMESTAMP(0) WITHOUT TIME ZONE)";
        let c = Catalog::from_ddl(sql, "t.sql").unwrap();
        let t = c.get(0).unwrap();
        let cols: Vec<_> = t.columns()[1..]
            .iter()
            .map(|c| (c.ty, c.time_precision))
            .collect();
        use ColumnType::*;
        assert_eq!(
            cols,
            vec![
                (Timestamp, None),
                (Timestamp, Some(3)),
                (Timestamp, Some(6)),
                (Timestamp, Some(9)),
                (TimestampTz, None),
                (TimestampTz, None),
                (Time, None),
                (Time, Some(3)),
                (Timestamp, Some(0)),
            ]
        );
    }
}
