//! What the coordinator keeps durable: the newest complete checkpoint's record and the newest
//! HWM a query may have seen, in `DATA_DIR/coordinator.state`; and where checkpoints live.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use retina_storage::{Hwm, Timestamp};

use super::error::CoordinatorError;

/// Where in the source a checkpoint was taken: every transaction before it has a timestamp at
/// or below the checkpoint's, every one after it a later one.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceMark {
    /// Bytes of the source before the position.
    pub offset: u64,
    /// Lines before it (so errors after a restart name the right line).
    pub line: u64,
}

/// A complete checkpoint: every shard's image as of `ts` is durable under
/// [`checkpoint_dir`]`(data_dir, id)`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointRecord {
    pub id: u64,
    pub ts: Timestamp,
    pub shards: u16,
    pub source: SourceMark,
}

/// Where checkpoint `id`'s shard images are.
pub fn checkpoint_dir(data_dir: &Path, id: u64) -> PathBuf {
    data_dir.join("checkpoints").join(format!("{id:016}"))
}

/// The file in a checkpoint's folder holding the sink's state.
pub const SOURCE_STATE_FILE: &str = "source.state";

/// What the coordinator persists: the newest complete checkpoint, and the newest HWM it may have
/// shown a query (so that after a restart no query sees less than one did before).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Persisted {
    pub hwm: Hwm,
    pub checkpoint: Option<CheckpointRecord>,
}

impl Default for Persisted {
    fn default() -> Self {
        Persisted {
            hwm: Hwm::INITIAL,
            checkpoint: None,
        }
    }
}

/// The coordinator's state file in the data directory, replaced atomically and fsynced.
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn new(data_dir: &Path) -> Self {
        StateFile {
            path: data_dir.join("coordinator.state"),
        }
    }

    fn io(&self, source: std::io::Error) -> CoordinatorError {
        CoordinatorError::Io {
            path: self.path.clone(),
            source,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What was persisted, or the initial state for a new data directory.
    pub fn load(&self) -> Result<Persisted, CoordinatorError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Persisted::default()),
            Err(e) => return Err(self.io(e)),
        };
        Self::decode(&text, &self.path)
    }

    /// Reads [`Self::encode`]'s text; `path` names where it came from in errors (the state
    /// file, or a checkpoint's record object in the lake).
    pub fn decode(text: &str, path: &Path) -> Result<Persisted, CoordinatorError> {
        let corrupt = |reason: String| CoordinatorError::Corrupt {
            path: path.to_owned(),
            reason,
        };
        let mut values = BTreeMap::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| corrupt(format!("line `{line}` is not key=value")))?;
            let v: u64 = v
                .trim()
                .parse()
                .map_err(|_| corrupt(format!("`{k}` is not a number")))?;
            match k.trim() {
                // Written by nodes before checkpoints; nothing to resume from them.
                "reserved_through" | "runs" => {}
                k @ ("hwm" | "checkpoint_id" | "checkpoint_ts" | "checkpoint_shards"
                | "source_offset" | "source_line") => {
                    values.insert(k.to_owned(), v);
                }
                other => return Err(corrupt(format!("unknown key `{other}`"))),
            }
        }
        let hwm = values
            .get("hwm")
            .ok_or_else(|| corrupt("missing hwm".into()))?;
        let hwm = Timestamp::new(*hwm).map_err(|e| corrupt(e.to_string()))?;
        if hwm < Hwm::INITIAL.get() {
            return Err(corrupt(format!("hwm {hwm} is below the first")));
        }
        let hwm = Hwm::after(hwm.prev_or_genesis())?;
        let checkpoint = match values.get("checkpoint_id") {
            None => None,
            Some(&id) => {
                let get = |k: &str| {
                    values
                        .get(k)
                        .copied()
                        .ok_or_else(|| corrupt(format!("checkpoint {id} without {k}")))
                };
                let ts =
                    Timestamp::new(get("checkpoint_ts")?).map_err(|e| corrupt(e.to_string()))?;
                if ts >= hwm.get() {
                    return Err(corrupt(format!(
                        "checkpoint at {ts} is not below hwm {hwm:?}"
                    )));
                }
                let shards = u16::try_from(get("checkpoint_shards")?)
                    .map_err(|_| corrupt("checkpoint_shards is out of range".into()))?;
                Some(CheckpointRecord {
                    id,
                    ts,
                    shards,
                    source: SourceMark {
                        offset: get("source_offset")?,
                        line: get("source_line")?,
                    },
                })
            }
        };
        Ok(Persisted { hwm, checkpoint })
    }

    /// The file's bytes for `p`.
    pub fn encode(p: &Persisted) -> Vec<u8> {
        let mut out = format!("hwm={}\n", p.hwm.get());
        if let Some(c) = p.checkpoint {
            out += &format!(
                "checkpoint_id={}\ncheckpoint_ts={}\ncheckpoint_shards={}\nsource_offset={}\nsource_line={}\n",
                c.id, c.ts, c.shards, c.source.offset, c.source.line
            );
        }
        out.into_bytes()
    }

    /// Writes `p` durably (direct I/O from the coordinator's core; see [`crate::durable`]).
    /// Must run on a glommio executor.
    pub async fn write(&self, p: &Persisted) -> Result<(), CoordinatorError> {
        crate::durable::write_file(&self.path, &Self::encode(p))
            .await
            .map_err(|e| self.io(e))
    }
}
