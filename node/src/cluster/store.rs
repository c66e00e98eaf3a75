//! Where the coordinator's durable state lives: [`MetaStore`], with two implementations.
//!
//! - [`StateFile`]: `DATA_DIR/coordinator.state`, for a node on its own (the default).
//! - [`ClusterState`]: the same file, then the cluster's `P/state` in etcd, written only while
//!   this node leads. The cluster's copy is the commit point: a checkpoint is complete once it
//!   is there, and a node that takes the lead starts from what it says.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::Member;
use crate::coordinator::{Persisted, StateFile};

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

/// The data directory's state file, then the cluster's copy (fenced by leadership).
pub struct ClusterState {
    pub file: StateFile,
    pub member: Arc<Member>,
}

impl MetaStore for ClusterState {
    fn save<'a>(&'a self, p: &'a Persisted) -> SaveFuture<'a> {
        Box::pin(async move {
            self.file.save(p).await?;
            self.member.save_state(p).await
        })
    }
}
