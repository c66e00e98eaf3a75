//! The plan of a transaction being applied: every key it touched so far and the state it
//! left each one in, ahead of the primary index, so that
//! [`Shard::apply`](super::Shard::apply) can check the whole transaction before changing
//! anything.

use std::collections::HashMap;

use crate::op::TableId;

/// The key state a transaction has produced so far, ahead of the index.
#[derive(Copy, Clone, PartialEq, Eq)]
pub(super) enum Planned {
    Present,
    Absent,
}

/// Scratch space of [`Shard::apply`](super::Shard::apply), kept between transactions so that
/// planning allocates nothing in the steady state.
#[derive(Default)]
pub(super) struct Plan {
    /// Every encoded key of the transaction, back to back.
    pub(super) arena: Vec<u8>,
    /// Each operation's keys in `arena`, in order (an update has two).
    pub(super) keys: Vec<std::ops::Range<usize>>,
    /// Keys the transaction touched so far and their state: (table, key, state, previous
    /// entry with the same hash).
    touched: Vec<(TableId, std::ops::Range<usize>, Planned, Option<usize>)>,
    /// Hash of (table, key) -> newest entry in `touched` with that hash.
    heads: HashMap<u64, usize, rustc_hash::FxBuildHasher>,
    /// Tables the transaction truncated so far, each with the length of `touched` at its last
    /// truncate: every key of the table not touched since is absent.
    truncated: Vec<(TableId, usize)>,
}

impl Plan {
    pub(super) fn clear(&mut self) {
        self.arena.clear();
        self.keys.clear();
        self.touched.clear();
        self.heads.clear();
        self.truncated.clear();
    }

    pub(super) fn truncate(&mut self, table: TableId) {
        let mark = self.touched.len();
        match self.truncated.iter_mut().find(|(t, _)| *t == table) {
            Some(entry) => entry.1 = mark,
            None => self.truncated.push((table, mark)),
        }
    }

    fn hash(table: TableId, key: &[u8]) -> u64 {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = rustc_hash::FxBuildHasher.build_hasher();
        table.hash(&mut h);
        key.hash(&mut h);
        h.finish()
    }

    /// The state this transaction left `key` in, if it touched it (or truncated its table).
    pub(super) fn touched(&self, table: TableId, key: std::ops::Range<usize>) -> Option<Planned> {
        let truncated_at = self
            .truncated
            .iter()
            .find(|(t, _)| *t == table)
            .map(|&(_, mark)| mark);
        let bytes = &self.arena[key];
        let mut at = self.heads.get(&Self::hash(table, bytes)).copied();
        while let Some(i) = at {
            let (t, range, state, prev) = &self.touched[i];
            if *t == table && &self.arena[range.clone()] == bytes {
                return match truncated_at {
                    Some(mark) if i < mark => Some(Planned::Absent),
                    _ => Some(*state),
                };
            }
            at = *prev;
        }
        truncated_at.map(|_| Planned::Absent)
    }

    pub(super) fn set(&mut self, table: TableId, key: std::ops::Range<usize>, state: Planned) {
        let h = Self::hash(table, &self.arena[key.clone()]);
        let i = self.touched.len();
        let prev = self.heads.insert(h, i);
        self.touched.push((table, key, state, prev));
    }
}
