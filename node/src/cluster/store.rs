//! Where the coordinator's durable state lives: [`MetaStore`], with two implementations.
//!
//! - [`StateFile`]: `DATA_DIR/coordinator.state`, for a node on its own (the default).
//! - [`ClusterState`]: the same file, then the cluster's `P/state` in etcd, written only while
//!   this node leads (a new checkpoint at once, a new HWM alone every [`CLUSTER_HWM_EVERY`]).
//!   The cluster's copy is the commit point: a checkpoint is complete once it is there, and a
//!   node that takes the lead starts from what it says.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Member;
use crate::coordinator::{CheckpointRecord, Persisted, StateFile};

/// Why the state could not be saved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaveError {
    /// The store did not answer (etcd unreachable): the next write tries again; a checkpoint
    /// that was to complete does not.
    #[error("the metadata store is unavailable: {0}")]
    Unavailable(String),
    /// Another node leads now: this one must stop replaying.
    #[error("{0}")]
    Fenced(String),
    /// The local state file could not be written: the node stops rather than lose state.
    #[error("{0}")]
    Fatal(String),
}

/// The future of a save, run on the coordinator's executor.
pub type SaveFuture<'a> = Pin<Box<dyn Future<Output = Result<(), SaveError>> + 'a>>;

/// Keeps the coordinator's [`Persisted`] state durable.
pub trait MetaStore: Send {
    /// Makes `p` durable. Must run on a glommio executor (the local file is written with
    /// direct I/O from the coordinator's core).
    fn save<'a>(&'a self, p: &'a Persisted) -> SaveFuture<'a>;
}

impl MetaStore for StateFile {
    fn save<'a>(&'a self, p: &'a Persisted) -> SaveFuture<'a> {
        Box::pin(async move {
            self.write(p)
                .await
                .map_err(|e| SaveError::Fatal(e.to_string()))
        })
    }
}

/// How often the cluster's copy takes a new HWM alone (a new checkpoint goes at once): etcd
/// keeps every revision until it is compacted, and the coordinator persists HWM every
/// `persist_interval_ms` (100 ms) while replay goes on.
pub const CLUSTER_HWM_EVERY: Duration = Duration::from_secs(5);

/// The data directory's state file, then the cluster's copy (fenced by leadership).
pub struct ClusterState {
    file: StateFile,
    member: Arc<Member>,
    /// What the cluster's copy last took, and when.
    written: Mutex<Option<(Option<CheckpointRecord>, Instant)>>,
}

impl ClusterState {
    pub fn new(file: StateFile, member: Arc<Member>) -> Self {
        ClusterState {
            file,
            member,
            written: Mutex::new(None),
        }
    }
}

impl MetaStore for ClusterState {
    fn save<'a>(&'a self, p: &'a Persisted) -> SaveFuture<'a> {
        Box::pin(async move {
            self.file.save(p).await?;
            let due = match *self.written.lock().expect("written lock") {
                Some((checkpoint, at)) => {
                    checkpoint != p.checkpoint || at.elapsed() >= CLUSTER_HWM_EVERY
                }
                None => true,
            };
            if !due {
                return Ok(());
            }
            self.member.save_state(p).await?;
            *self.written.lock().expect("written lock") = Some((p.checkpoint, Instant::now()));
            Ok(())
        })
    }
}
