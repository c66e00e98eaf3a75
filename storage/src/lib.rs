//! Retina's storage engine for one shard: tile visibility, the write buffer as a virtual file,
//! the primary index, Parquet files with a hidden `_create_ts`, and the state machine that
//! applies mirror transactions to them. Deterministic and free of any async runtime: I/O is
//! async functions over `object_store` that the caller drives.

pub mod buffer;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod fault;
pub mod file;
pub mod index;
pub mod key;
pub mod op;
pub mod route;
pub mod schema;
pub mod shard;
pub mod tile;
pub mod ts;
pub mod value;
pub mod visibility;

pub use buffer::{BlockData, BlockId, ObjectFacts, WriteBuffer, user_columns};
pub use checkpoint::{ShardImage, VisibilityImage};
pub use config::StorageConfig;
pub use error::{Result, StorageError};
pub use file::RewriteJob;
pub use index::{Extent, FileId, KeptRows, PrimaryIndex, RowId, RowIdMap, RowLocation};
pub use op::{RowOp, TableId, TableOp, TableOpRef};
pub use schema::{CREATE_TS_COLUMN, ColumnDef, ColumnType, TableSchema, batch_rows};
pub use shard::{
    ApplyStats, BufferPart, MAX_REWRITES_PER_GC, MemoryUsage, Replacement, RowGroupBitmap, Shard,
    TableSnapshot,
};
pub use tile::TileVisibility;
pub use ts::{Hwm, Lwm, Timestamp};
pub use value::{RowRef, Value, ValueRef};
pub use visibility::FileVisibility;
