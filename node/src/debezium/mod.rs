//! Debezium JSON change events: parsing one JSON line into a [`Message`], converting column
//! values to storage [`Value`](retina_storage::Value)s by the target table's schema, and reassembling complete source
//! transactions from BEGIN/END metadata ([`TxnAssembler`]).
//!
//! Both forms Kafka Connect's JSON converter writes are accepted: the `{"schema", "payload"}`
//! envelope (the schema's semantic type names decide how integers and byte strings are read)
//! and the bare payload (`schemas.enable=false`, where the column's declared type and
//! precision and the `decimal_handling` setting decide; never the value's content).
//!
//! Lines that carry no row change are recognised and skipped: heartbeats, logical decoding
//! messages (`op: "m"`) and schema change events ([`Message::Skipped`]).
//!
//! The parts, each depending only on those listed before it:
//! - `error.rs`: [`SourcePosition`] and [`DebeziumError`];
//! - `value.rs`: JSON values to storage values by column type (decimals, dates, times) and the
//!   row images of an event ([`DecimalHandling`], [`ParseOptions`]);
//! - `message.rs`: one line into a [`Message`] (change events, transaction markers, skipped
//!   lines);
//! - `fast.rs`: [`parse_line`]: the common change event (a bare payload) read in one pass
//!   without a DOM, everything else (and every error) left to `message.rs`;
//! - `txn.rs`: [`TxnAssembler`], which rebuilds [`Transaction`]s from messages.
//!
//! Their tests are under `tests/`, one file per part, with the fixtures they share in
//! `tests/mod.rs`.

mod error;
mod fast;
mod message;
mod txn;
mod value;

pub use error::{DebeziumError, SourcePosition};
pub use fast::{parse_line, parse_line_with};
pub use message::{ChangeEvent, ChangeOp, Message, Skipped, TxnRef};
pub use txn::{
    APPLIED_IDS_REMEMBERED, POSTGRES_CONNECTOR, RecentIds, Transaction, TxnAssembler, TxnMode,
    same_transaction,
};
pub use value::{DecimalHandling, ParseOptions};
pub(crate) use value::{key_only, parse_date, parse_decimal, parse_time_of_day, parse_timestamp};

#[cfg(test)]
mod tests;
