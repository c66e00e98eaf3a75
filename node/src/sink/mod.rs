//! The sink: reads a Debezium JSON source, rebuilds its transactions, and hands them to the
//! node in groups. A bad transaction either stops replay (HWM stays before it; everything
//! earlier stays committed and queryable) or, with `--on-error skip`, goes whole to a
//! dead-letter file with the reason, and replay goes on. Never a partial transaction.
//!
//! The sink is an actor on a plain thread of its own, since reading a file or stdin blocks:
//! [`spawn`] starts it and gives a [`SinkHandle`], which sends it [`SinkMsg`]s through a
//! bounded inbox and joins it for its [`SinkReport`]. [`run_sink`] is the same run on the
//! caller's thread.
//!
//! Which shard owns a row is `retina_storage::route`: `NodeHandle::submit` routes each group
//! with it on the sink's thread, and each shard's storage refuses a key that is not its own.
//!
//! The parts, each depending only on those listed before it (and on `debezium` and the
//! node's handle):
//! - `source.rs`: [`SourceSpec`], opening the source at the checkpoint's offset, the source
//!   state a checkpoint records, re-reading a span of the source;
//! - `dead_letter.rs`: dead-letter records, and where those already written end;
//! - `barrier.rs`: checkpoint barriers, when and where the sink puts them;
//! - `options.rs`: [`SinkOptions`] and [`OnError`];
//! - `msg.rs`: [`SinkMsg`] (the inbox) and [`SinkReport`] (how a run ended);
//! - `decode.rs`: decode lanes, which read a file or stdin source and parse its lines on
//!   several threads, handing them to the run in source order;
//! - `actor.rs`: the run itself (read, assemble, submit, checkpoint, bad transactions);
//! - `kafka/`: the run on a Kafka source (Debezium's topic layout, transactions rebuilt across
//!   partitions, resume offsets per partition), and writing a file's events into that layout;
//! - `postgres/`: the run on a Postgres publication through a logical replication slot (the
//!   first run's consistent copy, then the stream, confirmed to Postgres once checkpointed);
//! - `handle.rs`: [`spawn`], [`SinkHandle`] and [`run_sink`].

mod actor;
mod barrier;
mod dead_letter;
mod decode;
mod handle;
pub mod kafka;
mod msg;
mod options;
pub mod postgres;
mod source;

pub use handle::{SinkHandle, run_sink, spawn, spawn_with};
pub use msg::{SinkMsg, SinkReport};
pub use options::{OnError, SinkOptions};
pub use source::SourceSpec;

/// Parses source lines with the node's catalog and decimal setting, on any thread (it holds
/// the catalog, not the node).
fn line_parser(
    node: &crate::node::NodeHandle,
) -> impl Fn(
    &str,
    &crate::debezium::SourcePosition,
) -> Result<crate::debezium::Message, crate::debezium::DebeziumError>
+ Send
+ Sync
+ 'static {
    let catalog = node.catalog().clone();
    let options = crate::debezium::ParseOptions {
        decimal_handling: node.decimal_handling(),
        // The shards find the row a delete or an update removes by its key alone.
        before_keys_only: true,
    };
    move |line, pos| {
        let lookup = |name: &str| {
            catalog
                .resolve(name)
                .and_then(|id| catalog.get(id).cloned())
        };
        crate::debezium::parse_line_with(line, pos, &lookup, &options)
    }
}
