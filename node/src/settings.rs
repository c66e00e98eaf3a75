//! Every knob of a node, in one place: defaults here, a TOML file (`--config FILE`) over them,
//! command-line flags over that. `ops/retina.toml` shows them all with their defaults.

use std::path::Path;

use retina_storage::StorageConfig;

use crate::debezium::DecimalHandling;
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Replayer shards, one glommio executor each, pinned to cores 0, 1, ... (wrapping around
    /// the cores this process may use). 0 means one per available core.
    pub shards: u16,
    /// Rows per visibility tile (multiple of 64, at most 4096).
    pub tile_rows: u32,
    /// Rows per write-buffer block (multiple of 64).
    pub block_rows: u32,
    /// Rows per Parquet row group (multiple of `tile_rows`).
    pub row_group_rows: u32,
    /// Rows per file: a virtual file is combined into a Parquet file once this full
    /// (multiple of `row_group_rows` and `block_rows`).
    pub file_rows: u64,
    /// zstd level of Parquet data pages (0 = uncompressed).
    pub zstd_level: i32,
    /// How often a shard hands its full write-buffer blocks to the flusher and full virtual
    /// files to the combiner.
    pub flush_interval_ms: u64,
    /// Largest group of source transactions that share one timestamp allocation and one
    /// batch per shard (group begin); a group closes early when the source has nothing more.
    pub max_group_txns: usize,
    /// Group commit: a group also closes once it has been open this long, so a source that
    /// never pauses still makes its transactions visible at this pace.
    pub group_commit_interval_ms: u64,
    /// Batches that may wait in each shard's queue before the sink blocks (backpressure).
    pub shard_queue_batches: usize,
    /// How often the coordinator persists HWM.
    pub persist_interval_ms: u64,
    /// A query's lease: a client that neither renews nor ends its query within it loses it.
    pub query_lease_ms: u64,
    /// How often each shard runs memory GC: folds deletes at or below `min(LWM, HWM - 1)` into
    /// base bitmaps and drops index versions no query can see.
    pub gc_interval_ms: u64,
    /// Storage GC, after each memory GC: a regular file with more than this fraction of its
    /// rows deleted below the GC point is rewritten without them (1 = never).
    pub storage_gc_dead_fraction: f64,
    /// A query running this long gets a visibility checkpoint: its bitmaps go to a file, and
    /// LWM (so memory GC) no longer waits for it (0 = never).
    pub long_query_ms: u64,
    /// How often the sink puts a checkpoint barrier into the shards' streams (0: never; a
    /// restart then replays the source from its start).
    pub checkpoint_interval_ms: u64,
    /// A cluster's leader keeps, for each shard another member runs, the batches it sent since
    /// the newest complete checkpoint, up to this many bytes: when that member is lost, the
    /// shard starts again alone from the checkpoint with them. Past it (checkpoints too far
    /// apart for the rate), or at 0, a lost member makes the leader start every shard again.
    pub remote_redo_bytes: u64,
    /// How long a query's begin may wait after a restart for HWM to be back where queries
    /// saw it before; past it the query is refused with a typed error (catching up).
    pub query_wait_ms: u64,
    /// Most bytes of source text one open transaction may hold while the sink waits for its
    /// END; a larger one is refused (stopped, or dead-lettered with `--on-error skip`).
    pub max_txn_bytes: u64,
    /// Threads that parse a file or stdin source's lines at once, ahead of the sink, which takes
    /// their results in source order. 0 means one per available core, at most four.
    pub decode_lanes: usize,
    /// How a stream without the envelope schema (`schemas.enable=false`) encodes decimals: the
    /// connector's `decimal.handling.mode`. `precise`: base64 big-endian two's-complement
    /// bytes of the unscaled value at the column's scale; `string`: a decimal literal
    /// (`"123.45"`); `double`: a JSON number. A JSON number and Debezium's variable-scale
    /// `{"scale", "value"}` are read in every mode; a string never by guessing: `"9999"` is a
    /// literal under `string` and bytes under `precise`. With the envelope, its schema decides.
    pub decimal_handling: DecimalHandling,
}

impl Default for Settings {
    fn default() -> Self {
        let s = StorageConfig::default();
        Settings {
            shards: 0,
            tile_rows: s.tile_rows,
            block_rows: s.block_rows,
            row_group_rows: s.row_group_rows,
            file_rows: s.file_rows,
            zstd_level: s.zstd_level,
            flush_interval_ms: 200,
            max_group_txns: 1024,
            group_commit_interval_ms: 2,
            shard_queue_batches: 64,
            persist_interval_ms: 100,
            query_lease_ms: 30_000,
            gc_interval_ms: 60_000,
            storage_gc_dead_fraction: 0.5,
            long_query_ms: 30_000,
            checkpoint_interval_ms: 10_000,
            remote_redo_bytes: 256 << 20,
            query_wait_ms: 10_000,
            max_txn_bytes: 256 << 20,
            decode_lanes: 0,
            decimal_handling: DecimalHandling::String,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("invalid setting: {0}")]
    Invalid(String),
}

impl Settings {
    /// The defaults with `path`'s settings over them.
    pub fn from_file(path: &Path) -> Result<Self, SettingsError> {
        Self::load(Some(path), &[])
    }

    /// The defaults, then the file's settings, then each `KEY=VALUE` override (a TOML value:
    /// `shards=4`, `zstd_level=0`).
    pub fn load(path: Option<&Path>, overrides: &[String]) -> Result<Self, SettingsError> {
        let mut table = match path {
            Some(path) => {
                let err = |reason: String| SettingsError::File {
                    path: path.display().to_string(),
                    reason,
                };
                let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
                toml::from_str::<toml::Table>(&text).map_err(|e| err(e.to_string()))?
            }
            None => toml::Table::new(),
        };
        for o in overrides {
            let bad = |reason: String| SettingsError::Invalid(format!("--set {o}: {reason}"));
            let (key, value) = o
                .split_once('=')
                .ok_or_else(|| bad("expected KEY=VALUE".into()))?;
            let parsed: toml::Table = toml::from_str(&format!("{} = {}", key.trim(), value.trim()))
                .map_err(|e| bad(e.to_string()))?;
            table.extend(parsed);
        }
        Settings::deserialize(toml::Value::Table(table))
            .map_err(|e| SettingsError::Invalid(e.to_string()))
    }

    pub fn storage(&self) -> StorageConfig {
        StorageConfig {
            tile_rows: self.tile_rows,
            block_rows: self.block_rows,
            row_group_rows: self.row_group_rows,
            file_rows: self.file_rows,
            zstd_level: self.zstd_level,
        }
    }

    /// The shard count to run: `shards`, or one per core this process may use.
    pub fn shard_count(&self) -> u16 {
        if self.shards > 0 {
            return self.shards;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get().min(u16::MAX as usize) as u16)
    }

    /// The decode lanes a sink runs: `decode_lanes`, or for 0 one per available core, at most
    /// four.
    pub fn decode_lanes(&self) -> usize {
        if self.decode_lanes > 0 {
            return self.decode_lanes;
        }
        std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
    }

    pub fn validate(&self) -> Result<(), SettingsError> {
        self.storage()
            .validate()
            .map_err(|e| SettingsError::Invalid(e.to_string()))?;
        let positive = [
            ("flush_interval_ms", self.flush_interval_ms),
            ("max_group_txns", self.max_group_txns as u64),
            ("group_commit_interval_ms", self.group_commit_interval_ms),
            ("shard_queue_batches", self.shard_queue_batches as u64),
            ("persist_interval_ms", self.persist_interval_ms),
            ("query_lease_ms", self.query_lease_ms),
            ("gc_interval_ms", self.gc_interval_ms),
            ("query_wait_ms", self.query_wait_ms),
            ("max_txn_bytes", self.max_txn_bytes),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(SettingsError::Invalid(format!("{name} must be positive")));
            }
        }
        let f = self.storage_gc_dead_fraction;
        if !(f > 0.0 && f <= 1.0) {
            return Err(SettingsError::Invalid(format!(
                "storage_gc_dead_fraction must be in (0, 1], got {f}"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_override_defaults_and_typos_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        std::fs::write(&p, "shards = 3\nblock_rows = 4096\n").unwrap();
        let s = Settings::from_file(&p).unwrap();
        assert_eq!((s.shards, s.block_rows, s.tile_rows), (3, 4096, 4096));
        s.validate().unwrap();
        std::fs::write(&p, "shard = 3\n").unwrap();
        let e = Settings::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("unknown field `shard`"), "{e}");
        let bad = Settings {
            tile_rows: 100,
            ..Settings::default()
        };
        assert!(bad.validate().is_err());
    }

    #[test]
    fn overrides_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("r.toml");
        std::fs::write(&p, "shards = 3\nzstd_level = 5\n").unwrap();
        let s = Settings::load(
            Some(&p),
            &["zstd_level=0".into(), "flush_interval_ms = 7".into()],
        )
        .unwrap();
        assert_eq!((s.shards, s.zstd_level, s.flush_interval_ms), (3, 0, 7));
        let e = Settings::load(None, &["nope=1".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `nope`"), "{e}");
        assert!(Settings::load(None, &["shards".into()]).is_err());
        let s = Settings::load(None, &["decimal_handling=\"precise\"".into()]).unwrap();
        assert_eq!(s.decimal_handling, DecimalHandling::Precise);
        let e = Settings::load(None, &["decimal_handling=\"guess\"".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown variant `guess`"), "{e}");
    }

    #[test]
    fn the_example_config_is_the_defaults() {
        let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../ops/retina.toml");
        let mut s = Settings::from_file(Path::new(example)).unwrap();
        s.shards = 0;
        assert_eq!(
            s,
            Settings::default(),
            "ops/retina.toml documents the defaults"
        );
    }
}
