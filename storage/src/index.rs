//! The primary index of one table on one shard: versioned key -> row id, and row-id ranges ->
//! row locations. Row ids never change; storage GC moves rows by remapping their range.

use std::collections::{BTreeMap, HashMap};

use rustc_hash::FxBuildHasher;
use smallvec::SmallVec;

use crate::error::{Result, StorageError};
use crate::ts::Timestamp;

/// A row's identity in its table on its shard; allocated in contiguous ranges per file.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowId(pub u64);

/// A file: the shard's id in the top 16 bits, a per-shard sequence below, so shards allocate
/// file ids without asking anyone.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FileId(pub u64);

impl FileId {
    pub fn new(shard: u16, seq: u64) -> Self {
        assert!(seq < 1 << 48, "file sequence {seq} overflows 48 bits");
        FileId(u64::from(shard) << 48 | seq)
    }

    pub fn shard(self) -> u16 {
        (self.0 >> 48) as u16
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Where a row lives: a file and its offset there.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct RowLocation {
    pub file: FileId,
    pub offset: u64,
}

/// One version of a key: from `ts` on, the key maps to `row`, or is deleted.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Version {
    ts: Timestamp,
    row: u64,
}

/// `Version::row` of a tombstone. Row ids stay far below it.
const TOMBSTONE: u64 = u64::MAX;

impl Version {
    fn row(self) -> Option<RowId> {
        (self.row != TOMBSTONE).then_some(RowId(self.row))
    }
}

/// A key's versions, oldest first. Almost every key has one version, kept inline.
type Versions = SmallVec<[Version; 1]>;

/// Key bytes; keys up to 24 bytes (most composite integer keys) stay inline.
type Key = SmallVec<[u8; 24]>;

/// Versioned key -> row id.
#[derive(Default)]
pub struct PrimaryIndex {
    map: HashMap<Key, Versions, FxBuildHasher>,
    versions: usize,
    spilled_key_bytes: usize,
}

impl PrimaryIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// The row id that `key` maps to as of `ts`: the newest version at or before `ts`, `None` if
    /// that is a tombstone or there is none.
    pub fn lookup(&self, key: &[u8], ts: Timestamp) -> Option<RowId> {
        let versions = self.map.get(key)?;
        versions
            .iter()
            .rev()
            .find(|v| v.ts <= ts)
            .and_then(|v| v.row())
    }

    /// The row id of the newest version of `key`.
    pub fn latest(&self, key: &[u8]) -> Option<RowId> {
        self.map
            .get(key)
            .and_then(|v| v.last())
            .and_then(|v| v.row())
    }

    /// Maps `key` to `row` from `ts` on.
    pub fn put(&mut self, key: &[u8], ts: Timestamp, row: RowId) -> Result<()> {
        assert!(row.0 != TOMBSTONE, "row id {} is reserved", row.0);
        self.write(key, ts, row.0).map(|_| ())
    }

    /// Records that `key` is deleted from `ts` on.
    pub fn tombstone(&mut self, key: &[u8], ts: Timestamp) -> Result<()> {
        self.write(key, ts, TOMBSTONE).map(|_| ())
    }

    /// Deletes `key` from `ts` on and returns the row it mapped to until then, in one lookup.
    pub fn delete_latest(&mut self, key: &[u8], ts: Timestamp) -> Result<Option<RowId>> {
        self.write(key, ts, TOMBSTONE)
    }

    /// Writes a version and returns the row the key mapped to before it. A second write at the
    /// same timestamp (a delete and insert in one transaction) replaces the first: the
    /// transaction's final state of the key is its only version at `ts`.
    fn write(&mut self, key: &[u8], ts: Timestamp, row: u64) -> Result<Option<RowId>> {
        if let Some(versions) = self.map.get_mut(key) {
            let last = versions.last_mut().expect("a key has at least one version");
            if ts < last.ts {
                return Err(StorageError::TimestampBackwards {
                    last: last.ts,
                    got: ts,
                });
            }
            let previous = last.row();
            if ts == last.ts {
                last.row = row;
            } else {
                versions.push(Version { ts, row });
                self.versions += 1;
            }
            return Ok(previous);
        }
        if row == TOMBSTONE {
            // Nothing to hide: the key had no version at all.
            return Ok(None);
        }
        let key = Key::from_slice(key);
        if key.spilled() {
            self.spilled_key_bytes += key.capacity();
        }
        self.map
            .insert(key, smallvec::smallvec![Version { ts, row }]);
        self.versions += 1;
        Ok(None)
    }

    /// Drops the versions no snapshot at or after `watermark` can see: for each key, every
    /// version older than the newest one at or before the watermark, and that one too if it is
    /// a tombstone. Returns the number of versions dropped.
    pub fn purge(&mut self, watermark: Timestamp) -> usize {
        let before = self.versions;
        let mut spilled_key_bytes = 0;
        let mut versions = 0;
        self.map.retain(|key, v| {
            if let Some(i) = v.iter().rposition(|x| x.ts <= watermark) {
                let drop = if v[i].row == TOMBSTONE { i + 1 } else { i };
                v.drain(..drop);
            }
            if v.is_empty() {
                return false;
            }
            if v.spilled() && v.len() == 1 {
                v.shrink_to_fit();
            }
            versions += v.len();
            if key.spilled() {
                spilled_key_bytes += key.capacity();
            }
            true
        });
        self.versions = versions;
        self.spilled_key_bytes = spilled_key_bytes;
        before - versions
    }

    /// Keys with at least one version (live or tombstone).
    pub fn keys(&self) -> usize {
        self.map.len()
    }

    pub fn versions(&self) -> usize {
        self.versions
    }

    /// An estimate of the heap this index holds: table slots, long keys, spilled versions.
    pub fn memory_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(Key, Versions)>() + 1;
        let spilled = self.versions.saturating_sub(self.map.len()) * std::mem::size_of::<Version>();
        self.map.capacity() * slot + self.spilled_key_bytes + spilled
    }

    /// Every key's newest version, for consistency checks.
    pub fn iter_latest(&self) -> impl Iterator<Item = (&[u8], Option<RowId>)> {
        self.map
            .iter()
            .map(|(k, v)| (&k[..], v.last().expect("a key has a version").row()))
    }
}

/// A range of row ids laid out contiguously in one file.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub file: FileId,
    pub offset: u64,
    pub rows: u64,
}

/// Row-id ranges -> (file, row offset range).
#[derive(Default)]
pub struct RowIdMap {
    extents: BTreeMap<u64, Extent>,
}

impl RowIdMap {
    pub fn new() -> Self {
        Self::default()
    }

    /// Maps row ids `first .. first + extent.rows` to `extent`, replacing what mapped there.
    pub fn map(&mut self, first: RowId, extent: Extent) {
        let end = first.0 + extent.rows;
        // Cut any extent overlapping the new range.
        let overlapping: Vec<u64> = self
            .extents
            .range(..end)
            .rev()
            .take_while(|(s, e)| *s + e.rows > first.0)
            .map(|(s, _)| *s)
            .collect();
        for start in overlapping {
            let old = self.extents.remove(&start).expect("listed above");
            if start < first.0 {
                let rows = first.0 - start;
                self.extents.insert(start, Extent { rows, ..old });
            }
            let old_end = start + old.rows;
            if old_end > end {
                let skip = end - start;
                self.extents.insert(
                    end,
                    Extent {
                        file: old.file,
                        offset: old.offset + skip,
                        rows: old_end - end,
                    },
                );
            }
        }
        self.extents.insert(first.0, extent);
    }

    pub fn locate(&self, row: RowId) -> Option<RowLocation> {
        let (start, e) = self.extents.range(..=row.0).next_back()?;
        (row.0 < start + e.rows).then(|| RowLocation {
            file: e.file,
            offset: e.offset + (row.0 - start),
        })
    }

    /// Every extent with the first row id it maps, in row-id order.
    pub fn iter(&self) -> impl Iterator<Item = (RowId, Extent)> + '_ {
        self.extents.iter().map(|(&first, &e)| (RowId(first), e))
    }

    pub fn extents(&self) -> usize {
        self.extents.len()
    }

    pub fn memory_bytes(&self) -> usize {
        self.extents.len() * (std::mem::size_of::<(u64, Extent)>() + 16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(v: u64) -> Timestamp {
        Timestamp::new(v).unwrap()
    }

    #[test]
    fn versions_and_purge() {
        let mut ix = PrimaryIndex::new();
        ix.put(b"k", ts(2), RowId(1)).unwrap();
        ix.tombstone(b"k", ts(4)).unwrap();
        ix.put(b"k", ts(6), RowId(2)).unwrap();
        assert_eq!(ix.lookup(b"k", ts(1)), None);
        assert_eq!(ix.lookup(b"k", ts(3)), Some(RowId(1)));
        assert_eq!(ix.lookup(b"k", ts(5)), None);
        assert_eq!(ix.lookup(b"k", ts(9)), Some(RowId(2)));
        assert!(ix.put(b"k", ts(5), RowId(3)).is_err());
        assert_eq!(ix.purge(ts(4)), 2);
        assert_eq!(ix.lookup(b"k", ts(5)), None);
        assert_eq!(ix.lookup(b"k", ts(6)), Some(RowId(2)));
        ix.tombstone(b"k", ts(8)).unwrap();
        assert_eq!(ix.purge(ts(8)), 2);
        assert_eq!(ix.keys(), 0);
    }

    #[test]
    fn same_timestamp_writes_keep_the_last() {
        let mut ix = PrimaryIndex::new();
        ix.put(b"k", ts(2), RowId(1)).unwrap();
        ix.tombstone(b"k", ts(3)).unwrap();
        ix.put(b"k", ts(3), RowId(2)).unwrap();
        assert_eq!(ix.versions(), 2);
        assert_eq!(ix.lookup(b"k", ts(3)), Some(RowId(2)));
    }

    #[test]
    fn row_id_extents_split() {
        let f = |n| FileId::new(0, n);
        let mut m = RowIdMap::new();
        m.map(
            RowId(0),
            Extent {
                file: f(1),
                offset: 0,
                rows: 100,
            },
        );
        m.map(
            RowId(40),
            Extent {
                file: f(2),
                offset: 0,
                rows: 20,
            },
        );
        assert_eq!(
            m.locate(RowId(39)),
            Some(RowLocation {
                file: f(1),
                offset: 39
            })
        );
        assert_eq!(
            m.locate(RowId(45)),
            Some(RowLocation {
                file: f(2),
                offset: 5
            })
        );
        assert_eq!(
            m.locate(RowId(60)),
            Some(RowLocation {
                file: f(1),
                offset: 60
            })
        );
        assert_eq!(m.locate(RowId(100)), None);
        assert_eq!(m.extents(), 3);
    }
}
