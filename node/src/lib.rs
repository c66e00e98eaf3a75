//! The Retina node: sources, the catalog, and (next) the coordinator, sink and replayer shards
//! as actors on glommio.

pub mod catalog;
pub mod coordinator;
pub mod debezium;
pub mod durable;
pub mod metrics;
pub mod node;
pub mod router;
pub mod rpc;
pub mod settings;
pub mod sink;
pub mod vis_checkpoint;
