//! Retina's workloads and measurement helpers: CH-benCHmark-shaped rows for the storage
//! microbenchmarks (`ch`), the CH-benCHmark and HyBench generators (`chgen`, `hybench`: load,
//! change stream), what they share (`workload`: self-check, Debezium JSON, the `fresh_ts`
//! clock), a JSON-lines results writer, a Kafka broker on loopback (`kafka`), a PostgreSQL
//! server on loopback (`postgres`) and the ports such servers listen on (`ports`).

pub mod ch;
pub mod chgen;
pub mod etcd;
pub mod hybench;
pub mod kafka;
pub mod moto;
pub mod ports;
pub mod postgres;
pub mod report;
pub mod results;
pub mod workload;
