//! What the calls return, in owned Rust types.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use retina_storage::file::RowGroupInfo;
use retina_storage::{TableSchema, Timestamp};

/// A running query: its id, its snapshot, and how often its lease must be renewed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueryInfo {
    pub id: u64,
    pub snapshot: Timestamp,
    pub lease_ms: u64,
    /// Presented with the id to the scan services.
    pub secret: u64,
}

/// A table as the node describes it.
#[derive(Clone, Debug)]
pub struct TableInfo {
    pub id: u32,
    pub schema: Arc<TableSchema>,
}

/// A regular file of a scan plan.
#[derive(Clone, Debug)]
pub struct PlanFile {
    pub file: u64,
    /// The object's path under the plan's store URL.
    pub path: String,
    pub bytes: u64,
    /// The scan service that answers the file's bitmaps.
    pub owner: SocketAddr,
    pub row_groups: Vec<RowGroupInfo>,
}

/// What a query reads of one table.
#[derive(Clone, Debug)]
pub struct ScanPlan {
    pub table: TableInfo,
    pub snapshot: Timestamp,
    pub store_url: String,
    pub files: Vec<PlanFile>,
    /// The scan services whose write buffers to read.
    pub buffers: Vec<SocketAddr>,
}

/// Deleted rows of one row group, bit i = the group's row i.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowGroupBitmap {
    pub row_group: u32,
    pub rows: u64,
    pub deleted: Vec<u64>,
}

/// Where a write-buffer part's rows are.
#[derive(Clone, Debug)]
pub enum PartData {
    /// The rows, with `_create_ts`.
    Memory(Vec<RecordBatch>),
    /// A Parquet object under the store URL.
    Path(String),
}

/// A piece of a shard's write buffer at a snapshot.
#[derive(Clone, Debug)]
pub struct BufferPart {
    pub file: u64,
    pub offset: u64,
    pub rows: u64,
    /// Bit i = row `offset + i` of the file, 1 = deleted at the snapshot.
    pub deleted: Vec<u64>,
    pub data: PartData,
    /// A [`PartData::Path`] object's size, where the node knows it.
    pub bytes: Option<u64>,
    /// The newest `_create_ts` of a [`PartData::Path`] object's rows, where the node knows
    /// it: a snapshot at or after it needs no look at `_create_ts`.
    pub max_create_ts: Option<u64>,
}

/// A table read at one snapshot.
pub struct TableRead {
    pub snapshot: Timestamp,
    pub schema: Arc<TableSchema>,
    pub batches: Vec<RecordBatch>,
}
