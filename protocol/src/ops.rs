//! Row-operation batches from the sink to a shard: the shard's slice of a run of transactions,
//! in timestamp order, ending in "applied through". Archived with rkyv; the shard validates the
//! buffer once and then reads rows in place through [`RowRef`] and [`TableOpRef`], without
//! deserializing.

use retina_storage::{RowOp, RowRef, TableId, TableOp, TableOpRef, Value, ValueRef};
use rkyv::rancor;
use rkyv::util::AlignedVec;

/// A value on the wire; the same variants as [`Value`]. `WireValueRef` writes the same archived
/// bytes: keep its variants, in this order, in step with these (the byte-identity test checks).
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub enum WireValue {
    Null,
    Boolean(bool),
    Int(i64),
    Float(f64),
    Decimal(i128),
    Utf8(String),
    Date(i32),
    Timestamp(i64),
    Time(i64),
}

#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub struct WireRow {
    pub values: Vec<WireValue>,
}

/// `WireOpRef` writes the same archived bytes: keep its variants, in this order, in step.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub enum WireOp {
    Insert(WireRow),
    Delete(WireRow),
    Update {
        before: WireRow,
        after: WireRow,
    },
    /// Insert or replace the row of its key (a re-sent snapshot read).
    Upsert(WireRow),
    /// Delete every live row of the table on the receiving shard.
    Truncate,
}

#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub struct WireTableOp {
    pub table: u32,
    pub op: WireOp,
}

/// One mirror transaction's operations for one shard. Where it came from in the source stays
/// with the sink, which looks it up by `ts` when a shard refuses the transaction.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub struct WireTxn {
    pub ts: u64,
    pub ops: Vec<WireTableOp>,
}

/// A shard's slice of a run of transactions: `txns` in timestamp order (a transaction with no
/// operation on this shard is left out), then "applied through `applied_through`", which
/// covers every timestamp up to it, listed or not.
#[derive(rkyv::Archive, rkyv::Serialize, rkyv::Deserialize, Clone, Debug, PartialEq)]
pub struct OpBatch {
    pub txns: Vec<WireTxn>,
    pub applied_through: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("an op batch failed validation: {0}")]
    Invalid(String),
    #[error("encoding an op batch: {0}")]
    Encode(String),
}

impl OpBatch {
    /// The batch as an rkyv buffer.
    pub fn encode(&self) -> Result<AlignedVec, ProtocolError> {
        rkyv::to_bytes::<rancor::Error>(self).map_err(|e| ProtocolError::Encode(e.to_string()))
    }

    /// The archived batch in `bytes`, validated, to read in place.
    pub fn access(bytes: &[u8]) -> Result<&ArchivedOpBatch, ProtocolError> {
        rkyv::access::<ArchivedOpBatch, rancor::Error>(bytes)
            .map_err(|e| ProtocolError::Invalid(e.to_string()))
    }
}

/// A shard's slice of a run of transactions encoded from rows the sink still holds: the same
/// bytes as [`OpBatch`] (it archives as [`ArchivedOpBatch`]), without copying a value first.
#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(
    as = ArchivedOpBatch,
    archive_bounds(Vec<WireTxnRef<'a>>: rkyv::Archive<Archived = rkyv::vec::ArchivedVec<ArchivedWireTxn>>)
)]
pub struct OpBatchRef<'a> {
    pub txns: Vec<WireTxnRef<'a>>,
    pub applied_through: u64,
}

/// [`WireTxn`], its rows borrowed.
#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(
    as = ArchivedWireTxn,
    archive_bounds(Vec<WireTableOpRef<'a>>: rkyv::Archive<Archived = rkyv::vec::ArchivedVec<ArchivedWireTableOp>>)
)]
pub struct WireTxnRef<'a> {
    pub ts: u64,
    pub ops: Vec<WireTableOpRef<'a>>,
}

/// [`WireTableOp`], its rows borrowed.
#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(
    as = ArchivedWireTableOp,
    archive_bounds(WireOpRef<'a>: rkyv::Archive<Archived = ArchivedWireOp>)
)]
pub struct WireTableOpRef<'a> {
    pub table: u32,
    pub op: WireOpRef<'a>,
}

/// [`WireOp`], its rows borrowed.
#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(as = ArchivedWireOp)]
pub enum WireOpRef<'a> {
    Insert(WireRowRef<'a>),
    Delete(WireRowRef<'a>),
    Update {
        before: WireRowRef<'a>,
        after: WireRowRef<'a>,
    },
    Upsert(WireRowRef<'a>),
    Truncate,
}

/// [`WireRow`], borrowed.
#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(
    as = ArchivedWireRow,
    archive_bounds(RowAsWire: rkyv::with::ArchiveWith<&'a [Value], Archived = rkyv::vec::ArchivedVec<ArchivedWireValue>>)
)]
pub struct WireRowRef<'a> {
    #[rkyv(with = RowAsWire)]
    pub values: &'a [Value],
}

/// [`WireValue`], borrowed from a [`Value`].
#[derive(rkyv::Archive, rkyv::Serialize)]
#[rkyv(as = ArchivedWireValue)]
enum WireValueRef<'a> {
    Null,
    Boolean(bool),
    Int(i64),
    Float(f64),
    Decimal(i128),
    Utf8(#[rkyv(with = StrAsString)] &'a str),
    Date(i32),
    Timestamp(i64),
    Time(i64),
}

impl<'a> From<&'a Value> for WireValueRef<'a> {
    #[inline]
    fn from(v: &'a Value) -> Self {
        match v {
            Value::Null => WireValueRef::Null,
            Value::Boolean(b) => WireValueRef::Boolean(*b),
            Value::Int(i) => WireValueRef::Int(*i),
            Value::Float(f) => WireValueRef::Float(*f),
            Value::Decimal(d) => WireValueRef::Decimal(*d),
            Value::Utf8(s) => WireValueRef::Utf8(s),
            Value::Date(d) => WireValueRef::Date(*d),
            Value::Timestamp(t) => WireValueRef::Timestamp(*t),
            Value::Time(t) => WireValueRef::Time(*t),
        }
    }
}

/// Archives a borrowed `&str` as an [`ArchivedString`](rkyv::string::ArchivedString) (what a
/// `String` archives as).
struct StrAsString;

impl rkyv::with::ArchiveWith<&str> for StrAsString {
    type Archived = rkyv::string::ArchivedString;
    type Resolver = rkyv::string::StringResolver;

    fn resolve_with(field: &&str, resolver: Self::Resolver, out: rkyv::Place<Self::Archived>) {
        rkyv::string::ArchivedString::resolve_from_str(field, resolver, out);
    }
}

impl<S> rkyv::with::SerializeWith<&str, S> for StrAsString
where
    S: rancor::Fallible + rkyv::ser::Writer + ?Sized,
    S::Error: rancor::Source,
{
    fn serialize_with(field: &&str, s: &mut S) -> Result<Self::Resolver, S::Error> {
        rkyv::string::ArchivedString::serialize_from_str(field, s)
    }
}

/// Archives a borrowed row as the archived `Vec<WireValue>` of a [`WireRow`].
struct RowAsWire;

impl rkyv::with::ArchiveWith<&[Value]> for RowAsWire {
    type Archived = rkyv::vec::ArchivedVec<ArchivedWireValue>;
    type Resolver = rkyv::vec::VecResolver;

    fn resolve_with(field: &&[Value], resolver: Self::Resolver, out: rkyv::Place<Self::Archived>) {
        rkyv::vec::ArchivedVec::resolve_from_len(field.len(), resolver, out);
    }
}

impl<S> rkyv::with::SerializeWith<&[Value], S> for RowAsWire
where
    S: rancor::Fallible + rkyv::ser::Allocator + rkyv::ser::Writer + ?Sized,
    S::Error: rancor::Source,
{
    fn serialize_with(field: &&[Value], s: &mut S) -> Result<Self::Resolver, S::Error> {
        rkyv::vec::ArchivedVec::serialize_from_iter::<WireValueRef<'_>, _, _>(
            field.iter().map(WireValueRef::from),
            s,
        )
    }
}

impl<'a, R: AsRef<[Value]>> From<&'a TableOp<R>> for WireTableOpRef<'a> {
    fn from(op: &'a TableOp<R>) -> Self {
        let row = |r: &'a R| WireRowRef { values: r.as_ref() };
        WireTableOpRef {
            table: op.table,
            op: match &op.op {
                RowOp::Insert(r) => WireOpRef::Insert(row(r)),
                RowOp::Delete(r) => WireOpRef::Delete(row(r)),
                RowOp::Update { before, after } => WireOpRef::Update {
                    before: row(before),
                    after: row(after),
                },
                RowOp::Upsert(r) => WireOpRef::Upsert(row(r)),
                RowOp::Truncate => WireOpRef::Truncate,
            },
        }
    }
}

impl OpBatchRef<'_> {
    /// The batch as an rkyv buffer, written into `buffer` (cleared first; give it room for
    /// the whole batch and it is never reallocated).
    pub fn encode_into(&self, mut buffer: AlignedVec) -> Result<AlignedVec, ProtocolError> {
        buffer.clear();
        rkyv::api::high::to_bytes_in::<_, rancor::Error>(self, buffer)
            .map_err(|e| ProtocolError::Encode(e.to_string()))
    }
}

impl From<&Value> for WireValue {
    fn from(v: &Value) -> Self {
        match v {
            Value::Null => WireValue::Null,
            Value::Boolean(b) => WireValue::Boolean(*b),
            Value::Int(i) => WireValue::Int(*i),
            Value::Float(f) => WireValue::Float(*f),
            Value::Decimal(d) => WireValue::Decimal(*d),
            Value::Utf8(s) => WireValue::Utf8(s.clone()),
            Value::Date(d) => WireValue::Date(*d),
            Value::Timestamp(t) => WireValue::Timestamp(*t),
            Value::Time(t) => WireValue::Time(*t),
        }
    }
}

impl From<&[Value]> for WireRow {
    fn from(r: &[Value]) -> Self {
        WireRow {
            values: r.iter().map(WireValue::from).collect(),
        }
    }
}

impl<R: AsRef<[Value]>> From<&TableOp<R>> for WireTableOp {
    fn from(op: &TableOp<R>) -> Self {
        let row = |r: &R| WireRow::from(r.as_ref());
        WireTableOp {
            table: op.table,
            op: match &op.op {
                RowOp::Insert(r) => WireOp::Insert(row(r)),
                RowOp::Delete(r) => WireOp::Delete(row(r)),
                RowOp::Update { before, after } => WireOp::Update {
                    before: row(before),
                    after: row(after),
                },
                RowOp::Upsert(r) => WireOp::Upsert(row(r)),
                RowOp::Truncate => WireOp::Truncate,
            },
        }
    }
}

impl RowRef for ArchivedWireRow {
    fn arity(&self) -> usize {
        self.values.len()
    }

    #[inline]
    fn value(&self, column: usize) -> ValueRef<'_> {
        match &self.values[column] {
            ArchivedWireValue::Null => ValueRef::Null,
            ArchivedWireValue::Boolean(b) => ValueRef::Boolean(*b),
            ArchivedWireValue::Int(i) => ValueRef::Int(i.to_native()),
            ArchivedWireValue::Float(f) => ValueRef::Float(f.to_native()),
            ArchivedWireValue::Decimal(d) => ValueRef::Decimal(d.to_native()),
            ArchivedWireValue::Utf8(s) => ValueRef::Utf8(s.as_str()),
            ArchivedWireValue::Date(d) => ValueRef::Date(d.to_native()),
            ArchivedWireValue::Timestamp(t) => ValueRef::Timestamp(t.to_native()),
            ArchivedWireValue::Time(t) => ValueRef::Time(t.to_native()),
        }
    }
}

impl TableOpRef for ArchivedWireTableOp {
    type Row = ArchivedWireRow;

    fn table(&self) -> TableId {
        self.table.to_native()
    }

    fn op(&self) -> RowOp<&ArchivedWireRow> {
        match &self.op {
            ArchivedWireOp::Insert(r) => RowOp::Insert(r),
            ArchivedWireOp::Delete(r) => RowOp::Delete(r),
            ArchivedWireOp::Update { before, after } => RowOp::Update { before, after },
            ArchivedWireOp::Upsert(r) => RowOp::Upsert(r),
            ArchivedWireOp::Truncate => RowOp::Truncate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retina_storage::{ColumnDef, ColumnType, Shard, StorageConfig, TableSchema, Timestamp};

    #[test]
    fn a_shard_applies_archived_batches_in_place() {
        let schema = TableSchema::new(
            "t",
            vec![
                ColumnDef::new("id", ColumnType::Int64, false),
                ColumnDef::new("s", ColumnType::Utf8, true),
                ColumnDef::new(
                    "d",
                    ColumnType::Decimal {
                        precision: 20,
                        scale: 3,
                    },
                    true,
                ),
            ],
            &["id"],
        )
        .unwrap();
        let row = |id: i64, s: &str| {
            vec![
                Value::Int(id),
                Value::Utf8(s.into()),
                Value::Decimal(-12_345),
            ]
        };
        let ops = [
            TableOp {
                table: 0,
                op: RowOp::Insert(row(1, "a")),
            },
            TableOp {
                table: 0,
                op: RowOp::Insert(row(2, "b")),
            },
            TableOp {
                table: 0,
                op: RowOp::Update {
                    before: row(1, "a"),
                    after: row(3, "c"),
                },
            },
        ];
        // A re-sent snapshot read of a live key, then a truncate and a row after it.
        let later = [
            TableOp {
                table: 0,
                op: RowOp::Upsert(row(2, "b2")),
            },
            TableOp {
                table: 0,
                op: RowOp::Truncate,
            },
            TableOp {
                table: 0,
                op: RowOp::Upsert(row(7, "g")),
            },
        ];
        let batch = OpBatch {
            txns: vec![
                WireTxn {
                    ts: 2,
                    ops: ops.iter().map(WireTableOp::from).collect(),
                },
                WireTxn {
                    ts: 3,
                    ops: later.iter().map(WireTableOp::from).collect(),
                },
            ],
            applied_through: 4,
        };
        let bytes = batch.encode().unwrap();
        let archived = OpBatch::access(&bytes).unwrap();
        let mut shard = Shard::new(0, StorageConfig::default()).unwrap();
        shard.add_table(schema);
        for txn in archived.txns.iter() {
            let ts = Timestamp::new(txn.ts.to_native()).unwrap();
            shard.apply(ts, &txn.ops[..]).unwrap();
        }
        shard
            .advance(Timestamp::new(archived.applied_through.to_native()).unwrap())
            .unwrap();
        assert_eq!(
            shard.live_keys(0).unwrap(),
            1,
            "only the row after the truncate"
        );
        assert_eq!(shard.applied_through().get(), 4);
        assert_eq!(archived.txns[0].ops[2].op().clone_rows(), ops[2].op.clone());
        for (wire, op) in archived.txns[1].ops.iter().zip(&later) {
            assert_eq!(wire.op().clone_rows(), op.op.clone());
        }

        let mut corrupt = bytes.to_vec();
        let n = corrupt.len();
        // The root sits at the end: the txns vector (relative pointer, length), then applied_through.
        corrupt[n - 16..n - 8].fill(0xFF);
        assert!(
            OpBatch::access(&corrupt).is_err(),
            "a damaged buffer is refused"
        );
    }

    #[test]
    fn a_batch_of_borrowed_rows_encodes_to_the_same_bytes_as_one_of_owned_rows() {
        let row = |id: i64, s: &str| {
            vec![
                Value::Int(id),
                Value::Utf8(s.into()),
                Value::Null,
                Value::Boolean(id % 2 == 0),
                Value::Float(id as f64 / 3.0),
                Value::Decimal(-12_345_678_901_234_567_890_i128 * id as i128),
                Value::Date(19_000 + id as i32),
                Value::Timestamp(1_700_000_000_000_000 + id),
                Value::Time(86_399_999_999),
            ]
        };
        // Strings inline (8 bytes or fewer) and out of line, empty included.
        let ops = [
            TableOp {
                table: 3,
                op: RowOp::Insert(row(1, "")),
            },
            TableOp {
                table: 0,
                op: RowOp::Update {
                    before: row(2, "short"),
                    after: row(2, "a string longer than the inline size"),
                },
            },
            TableOp {
                table: 1,
                op: RowOp::Delete(row(3, "12345678")),
            },
            TableOp {
                table: 1,
                op: RowOp::Upsert(row(4, "123456789")),
            },
            TableOp {
                table: 2,
                op: RowOp::Truncate,
            },
        ];
        let txns = [(5, &ops[..]), (6, &ops[1..2]), (9, &ops[4..])];
        let owned = OpBatch {
            txns: txns
                .iter()
                .map(|(ts, ops)| WireTxn {
                    ts: *ts,
                    ops: ops.iter().map(WireTableOp::from).collect(),
                })
                .collect(),
            applied_through: 11,
        };
        let borrowed = OpBatchRef {
            txns: txns
                .iter()
                .map(|(ts, ops)| WireTxnRef {
                    ts: *ts,
                    ops: ops.iter().map(WireTableOpRef::from).collect(),
                })
                .collect(),
            applied_through: 11,
        };
        let want = owned.encode().unwrap();
        // A buffer too small to begin with grows; one that held something is cleared.
        for buffer in [AlignedVec::new(), AlignedVec::with_capacity(1 << 16), {
            let mut used = AlignedVec::new();
            used.extend_from_slice(b"left over");
            used
        }] {
            let got = borrowed.encode_into(buffer).unwrap();
            assert_eq!(got.as_slice(), want.as_slice());
        }
        let decoded: OpBatch =
            rkyv::deserialize::<OpBatch, rancor::Error>(OpBatch::access(&want).unwrap()).unwrap();
        assert_eq!(decoded, owned);
    }

    trait CloneRows {
        fn clone_rows(&self) -> RowOp<Vec<Value>>;
    }

    impl CloneRows for RowOp<&ArchivedWireRow> {
        fn clone_rows(&self) -> RowOp<Vec<Value>> {
            let own = |r: &ArchivedWireRow| (0..r.arity()).map(|i| r.value(i).to_owned()).collect();
            match self {
                RowOp::Insert(r) => RowOp::Insert(own(r)),
                RowOp::Delete(r) => RowOp::Delete(own(r)),
                RowOp::Update { before, after } => RowOp::Update {
                    before: own(before),
                    after: own(after),
                },
                RowOp::Upsert(r) => RowOp::Upsert(own(r)),
                RowOp::Truncate => RowOp::Truncate,
            }
        }
    }
}
