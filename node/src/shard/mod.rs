//! A replayer shard: the actor that owns one storage shard on its core, its messages, its scan
//! service's queries and its visibility checkpoints.
//!
//! - [`msg`]: what it receives ([`ShardMsg`]) and the [`Watermarks`] the coordinator sends.
//! - [`actor`]: the actor, one handler per message.
//! - [`scan_service`]: its Cap'n Proto scan service, on its core.
//! - [`vis_checkpoint`]: long queries' bitmaps written to files, so memory GC may pass them.

pub mod actor;
pub mod msg;
pub mod scan_service;
pub mod vis_checkpoint;

pub use actor::{ShardActor, ShardSetup};
pub use msg::{ShardMsg, Watermarks};
