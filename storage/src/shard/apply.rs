//! Applying a mirror transaction: [`Shard::apply`] plans every operation first (checks each
//! row, encodes each key and follows the state the transaction leaves each key in) and only
//! then changes the shard, so an operation that fails leaves it exactly as it was.

use super::plan::{Plan, Planned};
use super::{FileEntry, Shard};
use crate::error::{Result, StorageError};
use crate::index::{Extent, FileId};
use crate::key::{display_key, encode_key};
use crate::op::{RowOp, TableOpRef};
use crate::route::shard_for_table_key;
use crate::ts::Timestamp;
use crate::value::RowRef;
use crate::visibility::FileVisibility;

/// What one applied transaction did.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ApplyStats {
    /// Row operations applied (an update counts once).
    pub ops: u64,
    pub inserted: u64,
    pub deleted: u64,
}

impl Shard {
    /// Applies one mirror transaction's operations (those that belong to this shard) at `ts`,
    /// in order. Either every operation applies or, on an error naming the operation, none
    /// does and the shard is exactly as before. A shard with an owner
    /// ([`Self::set_owner`]) refuses a key that routes to another shard.
    pub fn apply<O: TableOpRef>(&mut self, ts: Timestamp, ops: &[O]) -> Result<ApplyStats> {
        if ts <= self.applied_through {
            return Err(StorageError::TimestampBackwards {
                last: self.applied_through,
                got: ts,
            });
        }
        let mut plan = std::mem::take(&mut self.plan);
        let planned = self.plan(ts, ops, &mut plan);
        if let Err(e) = planned {
            self.plan = plan;
            return Err(e);
        }
        let mut stats = ApplyStats::default();
        let mut keys = plan.keys.iter().map(|r| &plan.arena[r.clone()]);
        stats.ops = ops.len() as u64;
        for op in ops {
            let t = op.table() as usize;
            match op.op() {
                RowOp::Insert(row) => {
                    self.insert(t, keys.next().expect("planned"), row, ts);
                    stats.inserted += 1;
                }
                RowOp::Delete(_) => {
                    self.delete(t, keys.next().expect("planned"), ts);
                    stats.deleted += 1;
                }
                RowOp::Update { after, .. } => {
                    self.delete(t, keys.next().expect("planned"), ts);
                    self.insert(t, keys.next().expect("planned"), after, ts);
                    stats.deleted += 1;
                    stats.inserted += 1;
                }
                RowOp::Upsert(row) => {
                    let key = keys.next().expect("planned");
                    // The index is up to date with the earlier operations of this transaction.
                    if self.tables[t].index.latest(key).is_some() {
                        self.delete(t, key, ts);
                        stats.deleted += 1;
                    }
                    self.insert(t, key, row, ts);
                    stats.inserted += 1;
                }
                RowOp::Truncate => stats.deleted += self.truncate(t, ts),
            }
        }
        self.plan = plan;
        self.applied_through = ts;
        Ok(stats)
    }

    /// Marks every timestamp up to `ts` as applied on this shard (it had no operations there).
    pub fn advance(&mut self, ts: Timestamp) -> Result<()> {
        if ts < self.applied_through {
            return Err(StorageError::TimestampBackwards {
                last: self.applied_through,
                got: ts,
            });
        }
        self.applied_through = ts;
        Ok(())
    }

    /// Checks every operation without changing anything, leaving their encoded keys in
    /// `plan` in order (an update's before-key, then its after-key).
    fn plan<O: TableOpRef>(&self, ts: Timestamp, ops: &[O], plan: &mut Plan) -> Result<()> {
        plan.clear();
        for (index, op) in ops.iter().enumerate() {
            let fail = |source| StorageError::Op {
                index,
                ts,
                source: Box::new(source),
            };
            let table = op.table();
            let t = self.table(table).map_err(fail)?;
            let schema = &t.schema;
            // Encodes a checked row's key into the arena, refusing a key another shard owns;
            // its state now: as this transaction left it, else as the index has it.
            let key_of = |row: &O::Row, full: bool, plan: &mut Plan| -> Result<_> {
                if full {
                    schema.check_row(row)?;
                } else {
                    schema.check_key(row)?;
                }
                let start = plan.arena.len();
                encode_key(schema, row, &mut plan.arena);
                let range = start..plan.arena.len();
                if let Some(shards) = self.owner
                    && shard_for_table_key(schema, &plan.arena[range.clone()], shards) != self.id
                {
                    return Err(StorageError::WrongShard {
                        table: schema.name().into(),
                    });
                }
                let state = plan.touched(table, range.clone()).unwrap_or_else(|| {
                    if t.index.latest(&plan.arena[range.clone()]).is_some() {
                        Planned::Present
                    } else {
                        Planned::Absent
                    }
                });
                plan.keys.push(range.clone());
                Ok((range, state))
            };
            let not_found = |row: &O::Row| StorageError::KeyNotFound {
                table: schema.name().into(),
                key: display_key(schema, row),
            };
            let duplicate = |row: &O::Row| StorageError::DuplicateKey {
                table: schema.name().into(),
                key: display_key(schema, row),
            };
            match op.op() {
                RowOp::Insert(row) => {
                    let (key, state) = key_of(row, true, plan).map_err(fail)?;
                    if state == Planned::Present {
                        return Err(fail(duplicate(row)));
                    }
                    plan.set(table, key, Planned::Present);
                }
                RowOp::Delete(row) => {
                    let (key, state) = key_of(row, false, plan).map_err(fail)?;
                    if state == Planned::Absent {
                        return Err(fail(not_found(row)));
                    }
                    plan.set(table, key, Planned::Absent);
                }
                RowOp::Update { before, after } => {
                    let (old, state) = key_of(before, false, plan).map_err(fail)?;
                    if state == Planned::Absent {
                        return Err(fail(not_found(before)));
                    }
                    plan.set(table, old, Planned::Absent);
                    let (new, state) = key_of(after, true, plan).map_err(fail)?;
                    if state == Planned::Present {
                        return Err(fail(duplicate(after)));
                    }
                    plan.set(table, new, Planned::Present);
                }
                RowOp::Upsert(row) => {
                    let (key, _) = key_of(row, true, plan).map_err(fail)?;
                    plan.set(table, key, Planned::Present);
                }
                RowOp::Truncate => plan.truncate(table),
            }
        }
        Ok(())
    }

    fn insert<R: RowRef + ?Sized>(&mut self, t: usize, key: &[u8], row: &R, ts: Timestamp) {
        if self.tables[t].buffer.needs_file() {
            let id = FileId::new(self.id, self.next_file_seq);
            self.next_file_seq += 1;
            let table = &mut self.tables[t];
            let new = table.buffer.start_file(id);
            table
                .row_ids
                .map(new.first_row, Extent::dense(id, 0, new.capacity));
            table.files.insert(
                id,
                FileEntry::new(
                    FileVisibility::new(self.config.tile_rows).expect("tile rows were validated"),
                    None,
                ),
            );
        }
        let table = &mut self.tables[t];
        let (row_id, at) = table.buffer.append(row, ts);
        table
            .files
            .get_mut(&at.file)
            .expect("the appending file is tracked")
            .visibility
            .extend_to(at.offset + 1);
        table
            .index
            .put(key, ts, row_id)
            .expect("transactions apply in timestamp order");
    }

    /// Deletes every live row of table `t` at `ts`; returns how many.
    fn truncate(&mut self, t: usize, ts: Timestamp) -> u64 {
        let live: Vec<Vec<u8>> = self.tables[t]
            .index
            .iter_latest()
            .filter(|(_, row)| row.is_some())
            .map(|(key, _)| key.to_vec())
            .collect();
        for key in &live {
            self.delete(t, key, ts);
        }
        live.len() as u64
    }

    fn delete(&mut self, t: usize, key: &[u8], ts: Timestamp) {
        let table = &mut self.tables[t];
        let row_id = table
            .index
            .delete_latest(key, ts)
            .expect("transactions apply in timestamp order")
            .expect("planned deletes hit live keys");
        let at = table
            .row_ids
            .locate(row_id)
            .expect("every row id is mapped");
        table
            .files
            .get_mut(&at.file)
            .expect("every mapped file is tracked")
            .visibility
            .delete(at.offset, ts)
            .expect("a live key's row is not deleted");
    }
}
