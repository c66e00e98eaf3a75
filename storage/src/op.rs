//! The operations a shard applies: row operations of a source transaction, each on a table,
//! owned ([`TableOp`]) or read in place ([`TableOpRef`]).

use crate::value::RowRef;

/// A table's position in the shard's (and the catalog's) table list.
pub type TableId = u32;

/// One row operation of a source transaction. A delete's row needs only its key columns; an
/// update's `before` likewise. An update may change the key.
#[derive(Clone, Debug, PartialEq)]
pub enum RowOp<R> {
    Insert(R),
    Delete(R),
    Update {
        before: R,
        after: R,
    },
    /// The row image of its key, whether or not the key exists: the live version, if any, is
    /// deleted and the row inserted (a source re-sending a snapshot read of a row it already
    /// sent).
    Upsert(R),
    /// Every live row of the table is deleted (on this shard: a truncate goes to every shard).
    Truncate,
}

/// A row operation on a table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableOp<R> {
    pub table: TableId,
    pub op: RowOp<R>,
}

/// A row operation the shard can read in place: an owned [`TableOp`] or an archived wire op.
pub trait TableOpRef {
    type Row: RowRef + ?Sized;
    fn table(&self) -> TableId;
    fn op(&self) -> RowOp<&Self::Row>;
}

impl<R: RowRef> TableOpRef for TableOp<R> {
    type Row = R;

    fn table(&self) -> TableId {
        self.table
    }

    fn op(&self) -> RowOp<&R> {
        match &self.op {
            RowOp::Insert(r) => RowOp::Insert(r),
            RowOp::Delete(r) => RowOp::Delete(r),
            RowOp::Update { before, after } => RowOp::Update { before, after },
            RowOp::Upsert(r) => RowOp::Upsert(r),
            RowOp::Truncate => RowOp::Truncate,
        }
    }
}
