//! The primary index of one table on one shard: versioned key -> row id, and row-id ranges ->
//! row locations. Row ids never change; storage GC moves rows by remapping their range.

use std::collections::hash_map::Entry;
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
type Key = SmallVec<[u8; INLINE_KEY_BYTES]>;
/// Key bytes kept inline in the table.
const INLINE_KEY_BYTES: usize = 24;

/// Adds a version at `ts` to a key's `versions` (replacing one at the same timestamp) and
/// returns the row the key mapped to before it; `count` is the index's count of versions.
fn add_version(
    versions: &mut Versions,
    ts: Timestamp,
    row: u64,
    count: &mut usize,
) -> Result<Option<RowId>> {
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
        *count += 1;
    }
    Ok(previous)
}

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
        // A key that fits inline is looked up by entry: one probe whether it is there or not,
        // and building it allocates nothing. A longer one is looked up by slice first, so a
        // key already there costs no allocation.
        if key.len() > INLINE_KEY_BYTES
            && let Some(versions) = self.map.get_mut(key)
        {
            return add_version(versions, ts, row, &mut self.versions);
        }
        match self.map.entry(Key::from_slice(key)) {
            Entry::Occupied(mut entry) => add_version(entry.get_mut(), ts, row, &mut self.versions),
            // Nothing to hide: the key had no version at all.
            Entry::Vacant(_) if row == TOMBSTONE => Ok(None),
            Entry::Vacant(entry) => {
                if entry.key().spilled() {
                    self.spilled_key_bytes += entry.key().capacity();
                }
                entry.insert(smallvec::smallvec![Version { ts, row }]);
                self.versions += 1;
                Ok(None)
            }
        }
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

/// A range of row ids laid out in one file: contiguously from `offset`, or, after storage GC
/// rewrote the file, only the rows `kept` marks, each at its rank among them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub file: FileId,
    pub offset: u64,
    /// Row ids in the range (kept or not).
    pub rows: u64,
    pub kept: Option<std::sync::Arc<KeptRows>>,
}

impl Extent {
    /// `rows` row ids at `file`'s rows `offset ..`.
    pub fn dense(file: FileId, offset: u64, rows: u64) -> Self {
        Extent {
            file,
            offset,
            rows,
            kept: None,
        }
    }

    /// The file offset of the range's `i`-th row id; `None` for a row storage GC dropped.
    fn offset_of(&self, i: u64) -> Option<u64> {
        match &self.kept {
            None => Some(self.offset + i),
            Some(k) => k.rank(i).map(|r| self.offset + r),
        }
    }
}

/// Which rows of a range survived a file rewrite (bit i = row i kept), with the kept rows
/// counted before every word so a row's new offset (its rank) takes one popcount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptRows {
    bits: Vec<u64>,
    before: Vec<u32>,
    rows: u64,
}

impl KeptRows {
    /// `bits` over `rows` rows (bits past `rows` must be 0).
    pub fn new(rows: u64, bits: Vec<u64>) -> Result<Self> {
        if bits.len() != rows.div_ceil(64) as usize
            || (!rows.is_multiple_of(64) && bits.last().is_some_and(|w| w >> (rows % 64) != 0))
        {
            return Err(StorageError::Corrupt {
                what: "a kept-rows bitmap".into(),
                reason: format!("{} words for {rows} rows", bits.len()),
            });
        }
        let mut before = Vec::with_capacity(bits.len());
        let mut n = 0u32;
        for w in &bits {
            before.push(n);
            n += w.count_ones();
        }
        Ok(KeptRows { bits, before, rows })
    }

    /// The rows not marked in `deleted` (bit i = row i deleted) among the first `rows`.
    pub fn complement(rows: u64, deleted: &[u64]) -> Result<Self> {
        let mut bits: Vec<u64> = deleted.iter().map(|w| !w).collect();
        bits.resize(rows.div_ceil(64) as usize, u64::MAX);
        if !rows.is_multiple_of(64)
            && let Some(last) = bits.last_mut()
        {
            *last &= (1u64 << (rows % 64)) - 1;
        }
        Self::new(rows, bits)
    }

    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn bits(&self) -> &[u64] {
        &self.bits
    }

    /// Rows kept.
    pub fn kept(&self) -> u64 {
        self.before.last().map_or(0, |&n| {
            u64::from(n) + u64::from(self.bits.last().expect("same length").count_ones())
        })
    }

    /// Row `i`'s rank among the kept rows, `None` if it was dropped.
    pub fn rank(&self, i: u64) -> Option<u64> {
        if i >= self.rows {
            return None;
        }
        let (w, b) = ((i / 64) as usize, i % 64);
        let word = self.bits[w];
        (word >> b & 1 != 0)
            .then(|| u64::from(self.before[w]) + u64::from((word & ((1u64 << b) - 1)).count_ones()))
    }

    /// These rows after a second rewrite kept `next` of them (bit j = the j-th kept row).
    pub fn then(&self, next: &KeptRows) -> Result<KeptRows> {
        assert_eq!(
            next.rows,
            self.kept(),
            "a rewrite keeps a subset of the kept rows"
        );
        let mut bits = vec![0u64; self.bits.len()];
        let mut j = 0;
        for (w, &word) in self.bits.iter().enumerate() {
            let mut rest = word;
            while rest != 0 {
                let b = rest.trailing_zeros();
                rest &= rest - 1;
                if next.bits[(j / 64) as usize] >> (j % 64) & 1 != 0 {
                    bits[w] |= 1 << b;
                }
                j += 1;
            }
        }
        KeptRows::new(self.rows, bits)
    }

    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.bits.len() * 8 + self.before.len() * 4
    }
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

    /// Maps row ids `first .. first + extent.rows` to `extent`, replacing what mapped there. An
    /// extent with kept rows is only ever replaced whole.
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
            let old_end = start + old.rows;
            assert!(
                old.kept.is_none() || (start >= first.0 && old_end <= end),
                "a rewritten file's row ids are remapped whole"
            );
            if start < first.0 {
                let rows = first.0 - start;
                self.extents.insert(
                    start,
                    Extent {
                        rows,
                        ..old.clone()
                    },
                );
            }
            if old_end > end {
                let skip = end - start;
                self.extents.insert(
                    end,
                    Extent::dense(old.file, old.offset + skip, old_end - end),
                );
            }
        }
        self.extents.insert(first.0, extent);
    }

    /// Forgets the range that starts at `first` (storage GC dropped every row of it).
    pub fn unmap(&mut self, first: RowId) {
        self.extents.remove(&first.0);
    }

    pub fn locate(&self, row: RowId) -> Option<RowLocation> {
        let (start, e) = self.extents.range(..=row.0).next_back()?;
        if row.0 >= start + e.rows {
            return None;
        }
        e.offset_of(row.0 - start).map(|offset| RowLocation {
            file: e.file,
            offset,
        })
    }

    /// The one range of row ids that maps to `file`, with its first row id.
    pub fn extent_of(&self, file: FileId) -> Option<(RowId, &Extent)> {
        self.extents
            .iter()
            .find(|(_, e)| e.file == file)
            .map(|(&first, e)| (RowId(first), e))
    }

    /// Every extent with the first row id it maps, in row-id order.
    pub fn iter(&self) -> impl Iterator<Item = (RowId, &Extent)> + '_ {
        self.extents.iter().map(|(&first, e)| (RowId(first), e))
    }

    pub fn extents(&self) -> usize {
        self.extents.len()
    }

    pub fn memory_bytes(&self) -> usize {
        self.extents.len() * (std::mem::size_of::<(u64, Extent)>() + 16)
            + self
                .extents
                .values()
                .filter_map(|e| e.kept.as_ref().map(|k| k.memory_bytes()))
                .sum::<usize>()
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
        m.map(RowId(0), Extent::dense(f(1), 0, 100));
        m.map(RowId(40), Extent::dense(f(2), 0, 20));
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

    #[test]
    fn kept_rows_rank_and_compose() {
        // 130 rows; every third dropped.
        let deleted: Vec<u64> = {
            let mut d = vec![0u64; 3];
            for i in (0..130).step_by(3) {
                d[i / 64] |= 1 << (i % 64);
            }
            d
        };
        let k = KeptRows::complement(130, &deleted).unwrap();
        assert_eq!(k.kept(), 130 - 44);
        assert_eq!(k.rank(0), None);
        assert_eq!(k.rank(1), Some(0));
        assert_eq!(k.rank(2), Some(1));
        assert_eq!(k.rank(4), Some(2));
        assert_eq!(k.rank(129), None);
        assert_eq!(k.rank(128), Some(85));
        assert_eq!(k.rank(130), None);
        // A second rewrite keeps every other surviving row.
        let mut next = vec![0u64; 2];
        for j in (0..86).step_by(2) {
            next[j / 64] |= 1 << (j % 64);
        }
        let both = k.then(&KeptRows::new(86, next).unwrap()).unwrap();
        assert_eq!(both.kept(), 43);
        assert_eq!(both.rank(1), Some(0));
        assert_eq!(both.rank(2), None);
        assert_eq!(both.rank(4), Some(1));

        let f = FileId::new(0, 9);
        let mut m = RowIdMap::new();
        m.map(RowId(1000), Extent::dense(f, 0, 130));
        m.map(
            RowId(1000),
            Extent {
                file: FileId::new(0, 10),
                offset: 0,
                rows: 130,
                kept: Some(std::sync::Arc::new(k)),
            },
        );
        assert_eq!(m.locate(RowId(1000)), None, "a dropped row has no location");
        assert_eq!(
            m.locate(RowId(1004)),
            Some(RowLocation {
                file: FileId::new(0, 10),
                offset: 2
            })
        );
        assert_eq!(m.extent_of(FileId::new(0, 10)).unwrap().0, RowId(1000));
        assert!(m.extent_of(f).is_none());
    }
}
