//! The Retina node: the coordinator, the replayer shards and the sink as actors on glommio,
//! the I/O thread, the Cap'n Proto services, and the sources and catalog they replay.

pub mod catalog;
pub mod cluster;
pub mod coordinator;
pub mod datadir;
pub mod debezium;
pub mod durable;
pub mod error;
pub mod handle;
pub mod io;
pub mod lake;
pub mod metrics;
pub mod node;
pub mod recovery;
pub mod remote;
pub mod rpc;
pub mod settings;
pub mod shard;
pub mod sink;
pub mod status;
