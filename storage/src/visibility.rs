//! The visibility of one file (virtual or regular): its rows cut into tiles. A row group's
//! visibility is the concatenation of its tiles' bitmaps, since row groups, blocks and tiles all
//! start at multiples of 64 rows.

use crate::error::{Result, StorageError};
use crate::tile::{TileVisibility, check_tile_rows};
use crate::ts::Timestamp;

#[derive(Clone)]
pub struct FileVisibility {
    tile_rows: u32,
    rows: u64,
    tiles: Vec<TileVisibility>,
}

impl FileVisibility {
    pub fn new(tile_rows: u32) -> Result<Self> {
        check_tile_rows(tile_rows)?;
        Ok(FileVisibility {
            tile_rows,
            rows: 0,
            tiles: Vec::new(),
        })
    }

    /// A file of `rows` rows whose deletes at or before `base_ts` are `deleted` (bit i = row
    /// i, as from [`Self::bitmap_range`]), folded: what a checkpoint restores.
    pub fn from_bitmap(
        tile_rows: u32,
        rows: u64,
        deleted: &[u64],
        base_ts: Timestamp,
    ) -> Result<Self> {
        check_tile_rows(tile_rows)?;
        if deleted.len() != rows.div_ceil(64) as usize {
            return Err(StorageError::Corrupt {
                what: "a visibility bitmap".into(),
                reason: format!("{} words for {rows} rows", deleted.len()),
            });
        }
        let words = tile_rows as usize / 64;
        let tiles = deleted
            .chunks(words)
            .map(|chunk| {
                let mut base = chunk.to_vec();
                base.resize(words, 0);
                TileVisibility::from_base(tile_rows, &base, base_ts)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(FileVisibility {
            tile_rows,
            rows,
            tiles,
        })
    }

    /// Rows the file holds (deleted or not).
    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn tile_rows(&self) -> u32 {
        self.tile_rows
    }

    /// Grows the file to `rows` rows, adding tiles as needed.
    pub fn extend_to(&mut self, rows: u64) {
        if rows <= self.rows {
            return;
        }
        self.rows = rows;
        let tiles = rows.div_ceil(u64::from(self.tile_rows)) as usize;
        while self.tiles.len() < tiles {
            self.tiles
                .push(TileVisibility::new(self.tile_rows).expect("tile rows were checked"));
        }
    }

    /// Deletes row `offset` at `ts`; see [`TileVisibility::delete`].
    pub fn delete(&mut self, offset: u64, ts: Timestamp) -> Result<()> {
        if offset >= self.rows {
            return Err(StorageError::OffsetOutOfRange {
                what: "file",
                offset,
                rows: self.rows,
            });
        }
        let (tile, in_tile) = self.split(offset);
        self.tiles[tile].delete(in_tile, ts).map_err(|e| match e {
            StorageError::AlreadyDeleted { .. } => StorageError::AlreadyDeleted { offset },
            other => other,
        })
    }

    pub fn is_deleted_now(&self, offset: u64) -> bool {
        let (tile, in_tile) = self.split(offset);
        self.tiles
            .get(tile)
            .is_some_and(|t| t.is_deleted_now(in_tile))
    }

    /// The deleted-rows bitmap of rows `start .. start + len` at `snapshot`, into `out` (cleared
    /// first; `len.div_ceil(64)` words; bits past `len` are 0). `start` is a multiple of 64.
    pub fn bitmap_range(
        &self,
        start: u64,
        len: u64,
        snapshot: Timestamp,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        assert_eq!(start % 64, 0, "bitmap ranges start at a word boundary");
        if start + len > self.rows {
            return Err(StorageError::OffsetOutOfRange {
                what: "file",
                offset: start + len,
                rows: self.rows,
            });
        }
        out.clear();
        out.resize(len.div_ceil(64) as usize, 0);
        if len == 0 {
            return Ok(());
        }
        let tile_rows = u64::from(self.tile_rows);
        let mut scratch = vec![0u64; self.tile_rows as usize / 64];
        let mut row = start;
        let end = start + len;
        while row < end {
            let tile = (row / tile_rows) as usize;
            let tile_start = tile as u64 * tile_rows;
            self.tiles[tile].bitmap_at(snapshot, &mut scratch)?;
            let from = ((row - tile_start) / 64) as usize;
            let upto = (end.min(tile_start + tile_rows) - tile_start).div_ceil(64) as usize;
            let at = ((row - start) / 64) as usize;
            out[at..at + upto - from].copy_from_slice(&scratch[from..upto]);
            row = tile_start + tile_rows;
        }
        if !len.is_multiple_of(64) {
            *out.last_mut().expect("len > 0") &= (1u64 << (len % 64)) - 1;
        }
        Ok(())
    }

    /// Every delete not yet folded, as (row offset, delete timestamp), tile by tile (each
    /// tile's in timestamp order).
    pub fn pending(&self) -> impl Iterator<Item = (u64, Timestamp)> + '_ {
        let tile_rows = u64::from(self.tile_rows);
        self.tiles.iter().enumerate().flat_map(move |(i, t)| {
            t.pending()
                .map(move |(o, ts)| (i as u64 * tile_rows + u64::from(o), ts))
        })
    }

    /// Folds every tile; see [`TileVisibility::fold`].
    pub fn fold(&mut self, safe_ts: Timestamp) {
        for tile in &mut self.tiles {
            tile.fold(safe_ts);
        }
    }

    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.tiles.iter().map(|t| t.memory_bytes()).sum::<usize>()
    }

    /// Rows deleted in the newest state.
    pub fn deleted_rows(&self) -> u64 {
        self.tiles.iter().map(|t| u64::from(t.deleted_rows())).sum()
    }

    /// Delete entries not yet folded.
    pub fn pending_entries(&self) -> usize {
        self.tiles.iter().map(|t| t.pending_entries()).sum()
    }

    /// The oldest snapshot every tile can still answer for.
    pub fn oldest_readable(&self) -> Option<Timestamp> {
        self.tiles.iter().filter_map(|t| t.oldest_readable()).max()
    }

    fn split(&self, offset: u64) -> (usize, u32) {
        let tile_rows = u64::from(self.tile_rows);
        ((offset / tile_rows) as usize, (offset % tile_rows) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_span_tiles() {
        let mut v = FileVisibility::new(64).unwrap();
        v.extend_to(200);
        let t = Timestamp::new(3).unwrap();
        for off in [0, 63, 64, 130, 199] {
            v.delete(off, t).unwrap();
        }
        let mut out = Vec::new();
        v.bitmap_range(64, 136, t, &mut out).unwrap();
        assert_eq!(out, vec![1, 1 << 2, 1 << 7]);
        v.bitmap_range(0, 64, Timestamp::GENESIS, &mut out).unwrap();
        assert_eq!(out, vec![0]);
        assert!(v.delete(200, t).is_err());
        assert!(v.bitmap_range(128, 100, t, &mut out).is_err());
    }
}
