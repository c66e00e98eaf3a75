//! Source transactions collapsed per key, for the peers that apply changes set-based (DuckDB,
//! Delta Lake).

use std::sync::Arc;

use retina_bench::workload::Txn;
use retina_storage::{RowOp, Value};

/// One table's collapsed changes: encoded key to (deleted, newest row).
pub(super) type KeyChanges = std::collections::HashMap<Vec<u8>, (bool, Vec<Value>)>;

/// Source transactions collapsed, per table, to each changed key's newest row or its deletion:
/// what the batch-oriented peers apply as one set-based change.
pub(super) struct Collapsed {
    schemas: Vec<Arc<retina_storage::TableSchema>>,
    tables: Vec<KeyChanges>,
}

impl Collapsed {
    pub(super) fn new(schemas: &[Arc<retina_storage::TableSchema>]) -> Self {
        Collapsed {
            schemas: schemas.to_vec(),
            tables: schemas.iter().map(|_| Default::default()).collect(),
        }
    }

    fn key(&self, table: usize, row: &Vec<Value>) -> Vec<u8> {
        let mut key = Vec::new();
        retina_storage::key::encode_key(&self.schemas[table], row, &mut key);
        key
    }

    /// Folds `txns` in, in order.
    pub(super) fn add(&mut self, txns: Vec<Txn>) {
        for op in txns.into_iter().flatten() {
            let t = op.table as usize;
            let (deleted, row, moved_from) = match op.op {
                RowOp::Insert(row) | RowOp::Upsert(row) => (false, row, None),
                RowOp::Update { before, after } => (false, after, Some(before)),
                RowOp::Delete(row) => (true, row, None),
                // Changes collapse per key; a truncate has none.
                RowOp::Truncate => {
                    panic!("the peers replay CH-benCHmark changes, which never truncate a table")
                }
            };
            // An update that changes the key deletes the old one.
            if let Some(before) = moved_from {
                let old = self.key(t, &before);
                if old != self.key(t, &row) {
                    self.tables[t].insert(old, (true, before));
                }
            }
            let key = self.key(t, &row);
            self.tables[t].insert(key, (deleted, row));
        }
    }

    /// Table `table`'s changes, leaving none.
    pub(super) fn take(&mut self, table: usize) -> KeyChanges {
        std::mem::take(&mut self.tables[table])
    }
}
