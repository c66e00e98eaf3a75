//! The Retina node: sources, the catalog, and (next) the coordinator, sink and replayer shards
//! as actors on glommio.

pub mod catalog;
