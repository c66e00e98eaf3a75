//! Why a node cannot start or go on.

use std::path::PathBuf;

use crate::coordinator::{BeginRefused, CoordinatorError};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("invalid setting: {0}")]
    Settings(#[from] crate::settings::SettingsError),
    #[error(transparent)]
    Coordinator(#[from] CoordinatorError),
    #[error(transparent)]
    Storage(#[from] retina_storage::StorageError),
    #[error("starting executor for {what}: {reason}")]
    Executor { what: String, reason: String },
    #[error("the node has stopped")]
    Stopped,
    #[error(transparent)]
    Refused(#[from] BeginRefused),
    #[error("encoding a batch of transactions for the shards: {0}")]
    Batch(String),
    #[error("data directory {path}: {source}")]
    DataDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("checkpoint {path}: {reason}")]
    Checkpoint { path: PathBuf, reason: String },
    #[error(
        "data directory {path} is in use by another node ({owner}); stop it first, or give \
         this node its own --data-dir"
    )]
    Locked { path: PathBuf, owner: String },
    #[error(
        "data directory {path} was written with another schema ({changes}); start with the \
         schema it was written with, or from an empty data directory"
    )]
    CatalogChanged { path: PathBuf, changes: String },
    #[error("the lake {lake}: {reason}")]
    Lake { lake: String, reason: String },
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
}
