//! A Kafka source in Debezium's topic layout: one topic per captured table
//! (`PREFIX.SCHEMA.TABLE`, or `PREFIX.DATABASE.TABLE` for MySQL), keyed by primary key and
//! partitioned by it, and the transaction metadata topic (`PREFIX.transaction`) with each
//! transaction's BEGIN and END.
//!
//! - `spec.rs`: [`KafkaSpec`], the `kafka://` URL;
//! - `assemble.rs`: [`KafkaAssembler`], transactions rebuilt across topics and partitions,
//!   in the transaction topic's order, with the offsets a checkpoint records;
//! - `fetch.rs`: the connection and one read-ahead task per partition;
//! - `run.rs`: the sink's run on the source;
//! - `produce.rs`: [`produce_lines`], a Debezium JSON file written into that layout (tests,
//!   benchmarks, and loading a captured stream into a broker).
//!
//! Exactly once across restarts: a checkpoint records every partition's resume offset (the
//! oldest still needed by a transaction not handed over) and the transactions handed over
//! whose events lie at or after those offsets; a restart reads from the offsets and drops
//! those. Without transaction metadata (`--no-txn-metadata`) every event is a transaction of
//! its own, in its partition's order: a source transaction over several rows or tables is then
//! not atomic.

mod assemble;
mod fetch;
mod produce;
mod run;
mod spec;

pub use assemble::{KafkaAssembler, KafkaTxn, txn_key};
pub use produce::{ProduceReport, Producer, produce_lines};
pub(super) use run::run;
pub use spec::{DEFAULT_MAX_BUFFERED, KafkaSpec, TopicFilter};
