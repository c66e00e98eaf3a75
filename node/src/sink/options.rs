//! How a sink run is set up: its source, its transaction mode, what it does with a bad
//! transaction, and its group and checkpoint limits.

use std::path::PathBuf;
use std::time::Duration;

use super::source::SourceSpec;
use crate::debezium::TxnMode;

/// What to do with a transaction that cannot be replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnError {
    /// Stop replay before it; keep serving what was replayed.
    Stop,
    /// Write it to the dead-letter file and go on.
    Skip,
}

#[derive(Clone, Debug)]
pub struct SinkOptions {
    pub source: SourceSpec,
    /// Keep reading at the end of a file, like `tail -f`.
    pub follow: bool,
    pub mode: TxnMode,
    pub on_error: OnError,
    pub dead_letter: PathBuf,
    pub max_group_txns: usize,
    /// A group closes once open this long.
    pub group_commit_interval: Duration,
    /// How often to put a checkpoint barrier after the group just sent (`None`: never).
    pub checkpoint_interval: Option<Duration>,
    /// Most bytes of source text an open transaction may hold (`max_txn_bytes`).
    pub max_txn_bytes: u64,
    /// Threads that parse a file or stdin source's lines at once (at least one); the sink
    /// takes their results in source order.
    /// (`Settings::decode_lanes`).
    pub decode_lanes: usize,
}
