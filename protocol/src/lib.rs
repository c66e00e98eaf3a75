//! Retina's wire contract.
//! - `ops`: batches of row operations, rkyv-archived so that a shard reads them in place.
//! - `retina_capnp` (generated from `schema/retina.capnp`, committed) and `query`: the Cap'n
//!   Proto contract for query engines, and conversions to the storage engine's types.

pub mod ops;
pub mod query;

#[allow(clippy::all, clippy::pedantic, unused_qualifications, missing_docs)]
#[rustfmt::skip]
pub mod retina_capnp {
    include!("generated/retina_capnp.rs");
}

pub use ops::{
    OpBatch, OpBatchRef, ProtocolError, WireOp, WireOpRef, WireRow, WireRowRef, WireTableOp,
    WireTableOpRef, WireTxn, WireTxnRef, WireValue,
};
/// The buffer an op batch is encoded into (rkyv's, aligned for reading in place).
pub use rkyv::util::AlignedVec;
