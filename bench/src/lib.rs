//! Retina's workloads and measurement helpers: CH-benCHmark-shaped rows for the storage
//! microbenchmarks (`ch`), the CH-benCHmark generator (`chgen`: load, change stream, self-check,
//! Debezium JSON) and a JSON-lines results writer.

pub mod ch;
pub mod chgen;
pub mod results;
