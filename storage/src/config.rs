//! The engine's knobs. Every size is in rows; the relations between them keep row groups,
//! blocks and tiles aligned so that a row group's visibility is the concatenation of its tiles.

use crate::error::{Result, StorageError};
use crate::tile::check_tile_rows;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StorageConfig {
    /// Rows per visibility tile: a multiple of 64, at most 4096.
    pub tile_rows: u32,
    /// Rows per write-buffer block: a multiple of 64.
    pub block_rows: u32,
    /// Rows per Parquet row group of a combined file: a multiple of `tile_rows`.
    pub row_group_rows: u32,
    /// Rows per file (virtual, then regular): a multiple of `row_group_rows` and `block_rows`.
    pub file_rows: u64,
    /// zstd level for combined files (0 = uncompressed, write-buffer blocks too; blocks are
    /// otherwise LZ4).
    pub zstd_level: i32,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            tile_rows: 4096,
            block_rows: 8192,
            row_group_rows: 65_536,
            file_rows: 1 << 20,
            zstd_level: 1,
        }
    }
}

impl StorageConfig {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(StorageError::Config(m));
        check_tile_rows(self.tile_rows)?;
        if self.block_rows == 0 || !self.block_rows.is_multiple_of(64) {
            return bad(format!(
                "block rows must be a positive multiple of 64, got {}",
                self.block_rows
            ));
        }
        if self.row_group_rows == 0 || !self.row_group_rows.is_multiple_of(self.tile_rows) {
            return bad(format!(
                "row-group rows ({}) must be a positive multiple of tile rows ({})",
                self.row_group_rows, self.tile_rows
            ));
        }
        if self.file_rows == 0
            || !self
                .file_rows
                .is_multiple_of(u64::from(self.row_group_rows))
            || !self.file_rows.is_multiple_of(u64::from(self.block_rows))
        {
            return bad(format!(
                "file rows ({}) must be a positive multiple of row-group rows ({}) and block rows ({})",
                self.file_rows, self.row_group_rows, self.block_rows
            ));
        }
        if !(0..=22).contains(&self.zstd_level) {
            return bad(format!(
                "zstd level must be 0..=22, got {}",
                self.zstd_level
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_relations_checked() {
        StorageConfig::default().validate().unwrap();
        let bad = [
            StorageConfig {
                tile_rows: 100,
                ..Default::default()
            },
            StorageConfig {
                block_rows: 100,
                ..Default::default()
            },
            StorageConfig {
                row_group_rows: 6000,
                ..Default::default()
            },
            StorageConfig {
                file_rows: 65_536 * 3 + 8192,
                ..Default::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
    }
}
