//! The storage engine's errors. Each one names what failed and where; [`StorageError::is_retryable`]
//! separates I/O that may succeed on a retry from input that never will.

use crate::ts::Timestamp;

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("invalid timestamp {raw}: timestamps are 1 ..= 2^52-1")]
    InvalidTimestamp { raw: u64 },

    #[error("{kind} cannot move backwards from {from} to {to}")]
    WatermarkBackwards {
        kind: &'static str,
        from: Timestamp,
        to: Timestamp,
    },

    #[error("timestamp {got} is not after the last applied timestamp {last}")]
    TimestampBackwards { last: Timestamp, got: Timestamp },

    #[error("row offset {offset} is out of range: the {what} holds {rows} rows")]
    OffsetOutOfRange {
        what: &'static str,
        offset: u64,
        rows: u64,
    },

    #[error("row offset {offset} is already deleted")]
    AlreadyDeleted { offset: u64 },

    #[error(
        "snapshot {requested} is too old: visibility was folded up to {oldest}; start a new query"
    )]
    SnapshotTooOld {
        requested: Timestamp,
        oldest: Timestamp,
    },

    #[error("snapshot {requested} is in the future: applied through {applied_through}")]
    SnapshotInFuture {
        requested: Timestamp,
        applied_through: Timestamp,
    },

    #[error("invalid configuration: {0}")]
    Config(String),

    #[error("table `{table}`: {reason}")]
    Schema { table: String, reason: String },

    #[error("unknown table id {0}")]
    UnknownTable(u32),

    #[error("file {0:016x} is not a regular file of this shard (it may have been rewritten)")]
    UnknownFile(u64),

    #[error("table `{table}`, column `{column}`: {reason}")]
    Value {
        table: String,
        column: String,
        reason: String,
    },

    #[error("table `{table}`: key {key} does not exist")]
    KeyNotFound { table: String, key: String },

    #[error("table `{table}`: key {key} already exists")]
    DuplicateKey { table: String, key: String },

    /// A key the shard does not own (see [`crate::Shard::set_owner`]): a routing bug, which
    /// applying would hide by splitting the key's rows across shards.
    #[error("a key of table `{table}` routed to the wrong shard")]
    WrongShard { table: String },

    #[error("operation {index} of the transaction at ts {ts}: {source}")]
    Op {
        index: usize,
        ts: Timestamp,
        #[source]
        source: Box<StorageError>,
    },

    #[error("corrupt data in {what}: {reason}")]
    Corrupt { what: String, reason: String },

    #[error("object store: {0}")]
    ObjectStore(#[from] object_store::Error),

    #[error("parquet: {0}")]
    Parquet(#[from] parquet::errors::ParquetError),

    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
}

impl StorageError {
    /// Whether the same call may succeed later (I/O), as opposed to bad input or state that a
    /// retry cannot fix.
    pub fn is_retryable(&self) -> bool {
        match self {
            StorageError::ObjectStore(_) => true,
            StorageError::Op { source, .. } => source.is_retryable(),
            _ => false,
        }
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;
