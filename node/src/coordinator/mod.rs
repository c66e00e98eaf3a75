//! The coordinator: the actor that owns timestamps, HWM and LWM, running queries, checkpoint
//! records and the scan plans' file lists, and its Cap'n Proto service.
//!
//! - [`msg`]: what it receives ([`CoordMsg`]), from the sink, the shards and the service.
//! - [`actor`]: the actor, one handler per message.
//! - [`state`]: its deterministic state ([`CoordinatorState`]), with the plans' file lists
//!   ([`plan`]), checked after every message in debug builds.
//! - [`persist`]: what it keeps durable, and where checkpoints live.
//! - [`service`]: its Cap'n Proto service, a message to the actor per call.
//! - [`query`] and [`error`]: the vocabulary of queries and refusals.
//!
//! Timestamps restart after the newest complete checkpoint: a restarted node replays the
//! source from the checkpoint's position, so every redone transaction gets the timestamp it
//! had before the crash, and nothing with a later timestamp survived the restart.

pub mod actor;
pub mod error;
pub mod msg;
pub mod persist;
pub mod plan;
pub mod query;
pub mod service;
pub mod state;

pub use error::{BeginRefused, CoordinatorError};
pub use msg::CoordMsg;
pub use persist::{
    CheckpointRecord, Persisted, SOURCE_STATE_FILE, SourceMark, StateFile, checkpoint_dir,
};
pub use plan::{PlanFile, PlanFiles};
pub use query::{
    LOCAL, MAX_QUERIES_PER_CONNECTION, MAX_RUNNING_QUERIES, Owner, QueryId, QueryTicket,
};
pub use state::{CoordinatorState, Sequencer};
