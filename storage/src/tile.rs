//! Tile visibility: which rows of one tile (up to 4096 rows) are deleted, as of any snapshot
//! newer than the last fold.
//!
//! A tile keeps a base bitmap (1 = deleted) valid at `base_ts` and an append-only chain of
//! 64-byte blocks, each holding eight entries `offset << 52 | delete_ts`. Delete timestamps in a
//! tile never decrease, so the chain is sorted by timestamp. Memory GC folds the entries at or
//! below a safe timestamp into the base and frees their blocks, so a tile costs about one bit per
//! row once folded, and nothing at all while none of its rows was ever deleted.

use crate::error::{Result, StorageError};
use crate::ts::Timestamp;

/// Entries per chain block: eight `u64` make one 64-byte cache line.
pub const ENTRIES_PER_BLOCK: usize = 8;
/// Row offsets in an entry take the 12 bits above the 52-bit timestamp.
pub const MAX_TILE_ROWS: u32 = 1 << 12;
const TS_BITS: u32 = 52;
const TS_MASK: u64 = (1 << TS_BITS) - 1;

#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct EntryBlock([u64; ENTRIES_PER_BLOCK]);

#[inline(always)]
fn entry(offset: u32, ts: Timestamp) -> u64 {
    (u64::from(offset) << TS_BITS) | ts.get()
}

#[inline(always)]
fn entry_ts(e: u64) -> u64 {
    e & TS_MASK
}

/// The visibility of one tile of rows.
#[derive(Clone)]
pub struct TileVisibility {
    rows: u32,
    /// Rows deleted at or before `base_ts`; `None` while none is.
    base: Option<Box<[u64]>>,
    /// 0 until the first fold: the base then holds every delete at or before it.
    base_ts: u64,
    chain: Vec<EntryBlock>,
    entries: usize,
    /// `base | every chain entry`: the newest state, so a delete checks for a second delete of
    /// the same row in O(1) and a fresh snapshot copies one bitmap. Present iff `entries > 0`.
    latest: Option<Box<[u64]>>,
    last_delete_ts: u64,
}

impl TileVisibility {
    /// A tile of `rows` rows, a multiple of 64 no larger than [`MAX_TILE_ROWS`].
    pub fn new(rows: u32) -> Result<Self> {
        check_tile_rows(rows)?;
        Ok(TileVisibility {
            rows,
            base: None,
            base_ts: 0,
            chain: Vec::new(),
            entries: 0,
            latest: None,
            last_delete_ts: 0,
        })
    }

    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// Bitmap words per tile.
    pub fn words(&self) -> usize {
        self.rows as usize / 64
    }

    /// Entries not yet folded into the base.
    pub fn pending_entries(&self) -> usize {
        self.entries
    }

    /// The oldest snapshot this tile can still answer for.
    pub fn oldest_readable(&self) -> Option<Timestamp> {
        Timestamp::new(self.base_ts).ok()
    }

    /// Records that row `offset` was deleted by the transaction at `ts`. Rejected, leaving the
    /// tile unchanged: an offset out of range, a timestamp older than the tile's last delete or
    /// than its last fold, and a row that is already deleted.
    pub fn delete(&mut self, offset: u32, ts: Timestamp) -> Result<()> {
        if offset >= self.rows {
            return Err(StorageError::OffsetOutOfRange {
                what: "tile",
                offset: offset.into(),
                rows: self.rows.into(),
            });
        }
        let last = self.last_delete_ts.max(self.base_ts);
        if ts.get() < last || ts.get() <= self.base_ts {
            return Err(StorageError::TimestampBackwards {
                last: Timestamp::new(last).expect("a recorded timestamp is valid"),
                got: ts,
            });
        }
        let (word, bit) = ((offset / 64) as usize, 1u64 << (offset % 64));
        let newest = self.latest.as_deref().or(self.base.as_deref());
        if newest.is_some_and(|w| w[word] & bit != 0) {
            return Err(StorageError::AlreadyDeleted {
                offset: offset.into(),
            });
        }
        let words = self.words();
        let latest = self.latest.get_or_insert_with(|| match &self.base {
            Some(base) => base.clone(),
            None => vec![0; words].into_boxed_slice(),
        });
        latest[word] |= bit;
        let slot = self.entries % ENTRIES_PER_BLOCK;
        if slot == 0 {
            self.chain.push(EntryBlock::default());
        }
        self.chain.last_mut().expect("a block was pushed").0[slot] = entry(offset, ts);
        self.entries += 1;
        self.last_delete_ts = ts.get();
        Ok(())
    }

    /// Writes the bitmap of rows deleted as of `snapshot` into `out` (one bit per row, 1 =
    /// deleted; `out.len()` must be [`Self::words`]). A snapshot older than the last fold is
    /// [`StorageError::SnapshotTooOld`]: the tile no longer knows that past.
    pub fn bitmap_at(&self, snapshot: Timestamp, out: &mut [u64]) -> Result<()> {
        assert_eq!(out.len(), self.words(), "bitmap buffer size");
        let ts = snapshot.get();
        if ts < self.base_ts {
            return Err(StorageError::SnapshotTooOld {
                requested: snapshot,
                oldest: Timestamp::new(self.base_ts).expect("a folded timestamp is valid"),
            });
        }
        if ts >= self.last_delete_ts
            && let Some(latest) = &self.latest
        {
            out.copy_from_slice(latest);
            return Ok(());
        }
        match &self.base {
            Some(base) => out.copy_from_slice(base),
            None => out.fill(0),
        }
        let blocks = self.blocks_reaching(ts);
        or_entries_at(out, &self.chain[..blocks], ts);
        Ok(())
    }

    /// Folds every delete at or before `safe_ts` into the base bitmap and frees their chain
    /// blocks. The caller guarantees no query will read below `safe_ts` again.
    pub fn fold(&mut self, safe_ts: Timestamp) {
        let ts = safe_ts.get();
        if ts <= self.base_ts {
            return;
        }
        let folded = self.entries_at_or_below(ts);
        if folded > 0 {
            let words = self.words();
            let base = self
                .base
                .get_or_insert_with(|| vec![0; words].into_boxed_slice());
            or_entries_at(base, &self.chain[..folded.div_ceil(ENTRIES_PER_BLOCK)], ts);
            let rest: Vec<u64> = self
                .chain
                .iter()
                .flat_map(|b| b.0)
                .take(self.entries)
                .skip(folded)
                .collect();
            self.chain = rest
                .chunks(ENTRIES_PER_BLOCK)
                .map(|c| {
                    let mut b = EntryBlock::default();
                    b.0[..c.len()].copy_from_slice(c);
                    b
                })
                .collect();
            self.entries = rest.len();
            if self.entries == 0 {
                self.latest = None;
            }
        }
        self.base_ts = ts;
    }

    /// Bytes of heap and struct this tile holds.
    pub fn memory_bytes(&self) -> usize {
        let words = self.words() * 8;
        std::mem::size_of::<Self>()
            + self.base.as_ref().map_or(0, |_| words)
            + self.latest.as_ref().map_or(0, |_| words)
            + self.chain.capacity() * std::mem::size_of::<EntryBlock>()
    }

    /// Rows deleted as of the newest state.
    pub fn deleted_rows(&self) -> u32 {
        self.latest
            .as_deref()
            .or(self.base.as_deref())
            .map_or(0, |w| w.iter().map(|x| x.count_ones()).sum())
    }

    /// Whether the row is deleted in the newest state.
    pub fn is_deleted_now(&self, offset: u32) -> bool {
        self.latest
            .as_deref()
            .or(self.base.as_deref())
            .is_some_and(|w| w[(offset / 64) as usize] & (1 << (offset % 64)) != 0)
    }

    /// The number of chain blocks holding an entry at or below `ts` (entries are sorted).
    fn blocks_reaching(&self, ts: u64) -> usize {
        self.chain.partition_point(|b| entry_ts(b.0[0]) <= ts)
    }

    /// The number of entries at or below `ts` (entries are sorted).
    fn entries_at_or_below(&self, ts: u64) -> usize {
        let blocks = self.blocks_reaching(ts);
        if blocks == 0 {
            return 0;
        }
        let last = &self.chain[blocks - 1].0;
        let in_last = last
            .iter()
            .filter(|&&e| e != 0 && entry_ts(e) <= ts)
            .count();
        (blocks - 1) * ENTRIES_PER_BLOCK + in_last
    }
}

pub(crate) fn check_tile_rows(rows: u32) -> Result<()> {
    if rows == 0 || rows % 64 != 0 || rows > MAX_TILE_ROWS {
        return Err(StorageError::Config(format!(
            "tile rows must be a positive multiple of 64 up to {MAX_TILE_ROWS}, got {rows}"
        )));
    }
    Ok(())
}

/// ORs into `out` every entry of `blocks` whose delete timestamp is at or below `ts`.
///
/// Branch-free per block: the eight entries are decoded and compared lane by lane (the loop the
/// compiler turns into vector shifts, masks and compares), then scattered. Unused slots are 0,
/// and `0 - 1` wraps to `u64::MAX`, so they never pass the compare.
#[inline]
fn or_entries_at(out: &mut [u64], blocks: &[EntryBlock], ts: u64) {
    for block in blocks {
        let mut word = [0usize; ENTRIES_PER_BLOCK];
        let mut bit = [0u64; ENTRIES_PER_BLOCK];
        for i in 0..ENTRIES_PER_BLOCK {
            let e = block.0[i];
            let offset = e >> TS_BITS;
            let applies = u64::from(entry_ts(e).wrapping_sub(1) < ts);
            word[i] = (offset >> 6) as usize;
            bit[i] = applies << (offset & 63);
        }
        for i in 0..ENTRIES_PER_BLOCK {
            out[word[i]] |= bit[i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(v: u64) -> Timestamp {
        Timestamp::new(v).unwrap()
    }

    fn bitmap(t: &TileVisibility, at: u64) -> Vec<u64> {
        let mut out = vec![0; t.words()];
        t.bitmap_at(ts(at), &mut out).unwrap();
        out
    }

    #[test]
    fn deletes_show_from_their_timestamp_on() {
        let mut t = TileVisibility::new(128).unwrap();
        t.delete(3, ts(5)).unwrap();
        t.delete(70, ts(7)).unwrap();
        assert_eq!(bitmap(&t, 4), vec![0, 0]);
        assert_eq!(bitmap(&t, 5), vec![1 << 3, 0]);
        assert_eq!(bitmap(&t, 9), vec![1 << 3, 1 << 6]);
    }

    #[test]
    fn bad_deletes_leave_the_tile_unchanged() {
        let mut t = TileVisibility::new(64).unwrap();
        t.delete(1, ts(5)).unwrap();
        assert!(matches!(
            t.delete(64, ts(6)),
            Err(StorageError::OffsetOutOfRange { .. })
        ));
        assert!(matches!(
            t.delete(2, ts(4)),
            Err(StorageError::TimestampBackwards { .. })
        ));
        assert!(matches!(
            t.delete(1, ts(6)),
            Err(StorageError::AlreadyDeleted { offset: 1 })
        ));
        assert_eq!(t.pending_entries(), 1);
        assert_eq!(bitmap(&t, 10), vec![1 << 1]);
    }

    #[test]
    fn fold_frees_entries_and_refuses_older_snapshots() {
        let mut t = TileVisibility::new(64).unwrap();
        for i in 0..20 {
            t.delete(i, ts(u64::from(i) + 2)).unwrap();
        }
        t.fold(ts(11));
        assert_eq!(t.pending_entries(), 10);
        assert!(matches!(
            t.bitmap_at(ts(10), &mut [0]),
            Err(StorageError::SnapshotTooOld { .. })
        ));
        assert_eq!(bitmap(&t, 11), vec![(1 << 10) - 1]);
        assert_eq!(bitmap(&t, 15), vec![(1 << 14) - 1]);
        assert!(t.delete(30, ts(11)).is_err(), "at or below the fold");
        t.fold(ts(100));
        assert_eq!(t.pending_entries(), 0);
        assert_eq!(bitmap(&t, 100), vec![(1 << 20) - 1]);
        assert_eq!(
            t.memory_bytes(),
            std::mem::size_of::<TileVisibility>() + 8,
            "one bit per row once folded"
        );
    }

    #[test]
    fn tile_rows_are_checked() {
        assert!(TileVisibility::new(0).is_err());
        assert!(TileVisibility::new(100).is_err());
        assert!(TileVisibility::new(8192).is_err());
        assert!(TileVisibility::new(4096).is_ok());
    }
}
