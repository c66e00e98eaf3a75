//! A PostgreSQL source: a publication read through a logical replication slot (pgoutput,
//! protocol version 1), without Debezium or Kafka. Every Postgres transaction becomes one
//! mirror transaction.
//!
//! - `spec.rs`: [`PostgresSpec`], the `postgres://` URL and the password's sources;
//! - `pgoutput.rs`: the replication messages, decoded from their bytes;
//! - `rows.rs`: which catalog table a relation feeds, and values from their text;
//! - `session.rs`: SQL on the replication connection before it streams (the slot, the
//!   publication's tables, the catalog read from Postgres);
//! - `run.rs`: the sink's run: the first run's consistent copy, then the stream.
//!
//! Exactly once across restarts: a checkpoint records the end of the last transaction handed
//! over; Postgres is told a position only once a checkpoint holding it is durable, so the
//! slot keeps every change after it; a restart streams from there, and drops a transaction
//! ending at or before it.

mod pgoutput;
mod rows;
mod run;
mod session;
mod spec;

pub(super) use run::run;
pub use spec::{PostgresSpec, SslMode};

/// The `CREATE TABLE` statements of the publication's tables as Postgres defines them (for a
/// catalog when no `--schema` is given), or why one cannot be held.
pub fn read_catalog_ddl(spec: &PostgresSpec) -> Result<String, String> {
    let zero = pgwire_replication::Lsn::from_u64(0);
    let mut session = session::Session::connect(spec, zero, zero)?;
    session.check_version()?;
    session.check_publication()?;
    session::catalog_ddl(&mut session)
}
