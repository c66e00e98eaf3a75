//! The Retina node: sources, the catalog, and (next) the coordinator, sink and replayer shards
//! as actors on glommio.

pub mod catalog;
pub mod client;
pub mod connection;
pub mod coordinator;
pub mod debezium;
pub mod durable;
pub mod metrics;
pub mod node;
pub mod rpc;
pub mod settings;
pub mod sink;
pub mod vis_checkpoint;

/// Routing is the sink's (`sink::route`); this older path stays until `node.rs` imports that.
pub use sink::route as router;
