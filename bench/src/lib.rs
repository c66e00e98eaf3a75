//! Retina's workloads and measurement helpers. Today: CH-benCHmark-shaped rows for the storage
//! microbenchmarks and a JSON-lines results writer; the full generators and `retina bench`
//! build on these.

pub mod ch;
pub mod results;
