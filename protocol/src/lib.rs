//! Retina's wire contract. `ops`: batches of row operations, rkyv-archived so that a shard reads
//! them in place. The Cap'n Proto schema for query engines arrives with the query path.

pub mod ops;

pub use ops::{OpBatch, ProtocolError, WireOp, WireRow, WireTableOp, WireTxn, WireValue};
