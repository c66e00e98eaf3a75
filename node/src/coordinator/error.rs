//! Why the coordinator refuses: its own failures, and a query it cannot begin.

use std::path::PathBuf;

use retina_protocol::query::catching_up;
use retina_storage::{StorageError, Timestamp};

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("shard {shard} reported applied through {got} after {last}: watermarks never go back")]
    AppliedBackwards {
        shard: u16,
        last: Timestamp,
        got: Timestamp,
    },
    #[error("shard {shard} reported applied through {got}, but only up to {issued} was issued")]
    AppliedUnissued {
        shard: u16,
        got: Timestamp,
        issued: u64,
    },
    #[error("unknown shard {0}")]
    UnknownShard(u16),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("coordinator state file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "coordinator state file {path} is damaged: {reason}; restore it or start from an empty data directory"
    )]
    Corrupt { path: PathBuf, reason: String },
}

/// Why a query could not begin.
#[derive(Copy, Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BeginRefused {
    #[error("the connection runs {limit} queries, its limit: end one first")]
    ConnectionLimit { limit: u32 },
    #[error("the node runs {limit} queries, its limit: end one first")]
    NodeLimit { limit: u32 },
    /// The node is still replaying what its source held when it started (after a restart:
    /// HWM is not yet back where queries saw it before), and the wait ran out. `target`: the
    /// snapshot it waits for, 0 while the sink has not yet said where the source ended.
    #[error("{}", catching_up(*snapshot, *target))]
    CatchingUp { snapshot: u64, target: u64 },
}
