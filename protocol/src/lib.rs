//! Retina's wire contract. It will hold the rkyv messages between actors (row-operation
//! batches, watermarks) and the Cap'n Proto schema for query engines; both arrive with the
//! node and query-path work. Today it only re-exports the storage types the contract speaks of.

pub use retina_storage::{RowOp, TableId, TableOp, Timestamp, Value};
