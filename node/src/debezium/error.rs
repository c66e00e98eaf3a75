//! Where a message came from, and why one could not be parsed or assembled.

use std::fmt;
use std::sync::Arc;

/// Where a message came from: a file path (or `stdin`) and a 1-based line number.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourcePosition {
    pub source: Arc<str>,
    pub line: u64,
}

impl SourcePosition {
    pub fn new(source: impl Into<Arc<str>>, line: u64) -> Self {
        SourcePosition {
            source: source.into(),
            line,
        }
    }
}

impl fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.source, self.line)
    }
}

/// Why a line could not be parsed or a transaction not assembled. Every error names the input
/// position first; all of them are permanent (the same input fails the same way).
#[derive(Debug, thiserror::Error)]
pub enum DebeziumError {
    #[error("{pos}: malformed Debezium message: {reason}")]
    Malformed { pos: SourcePosition, reason: String },

    #[error(
        "{pos}: unknown table (tried {}); declare it in the catalog DDL or drop it from the \
         connector's table.include.list",
        quoted(.tried)
    )]
    UnknownTable {
        pos: SourcePosition,
        tried: Vec<String>,
    },

    #[error(
        "{pos}: table `{table}`: the {image} image has no column `{column}`; it must carry the \
         primary key and, for inserts and updates, every NOT NULL column (check the connector's \
         column filters and the table's REPLICA IDENTITY)"
    )]
    MissingColumn {
        pos: SourcePosition,
        table: String,
        column: String,
        /// `before` or `after`.
        image: &'static str,
    },

    #[error("{pos}: table `{table}`, column `{column}`: {reason}")]
    Value {
        pos: SourcePosition,
        table: String,
        column: String,
        reason: String,
    },

    #[error("{pos}: {what} is not supported")]
    Unsupported { pos: SourcePosition, what: String },

    #[error("{pos}: transaction `{id}`: {reason}")]
    Transaction {
        pos: SourcePosition,
        id: String,
        reason: String,
    },

    #[error(
        "{pos}: change event without a `transaction` block; enable provide.transaction.metadata \
         on the connector, or replay with --no-txn-metadata"
    )]
    MissingTxnMetadata { pos: SourcePosition },

    #[error(
        "{pos}: transaction `{id}`: END announces {expected} events{}, but {got} arrived; the \
         stream lost or repeated events",
        for_collection(.collection)
    )]
    CountMismatch {
        pos: SourcePosition,
        id: String,
        /// The data collection whose count differs, or `None` for the transaction's total.
        collection: Option<String>,
        expected: u64,
        got: u64,
    },
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn for_collection(collection: &Option<String>) -> String {
    collection
        .as_ref()
        .map(|c| format!(" for `{c}`"))
        .unwrap_or_default()
}

impl DebeziumError {
    /// The input position the error is about.
    pub fn position(&self) -> &SourcePosition {
        match self {
            DebeziumError::Malformed { pos, .. }
            | DebeziumError::UnknownTable { pos, .. }
            | DebeziumError::MissingColumn { pos, .. }
            | DebeziumError::Value { pos, .. }
            | DebeziumError::Unsupported { pos, .. }
            | DebeziumError::Transaction { pos, .. }
            | DebeziumError::MissingTxnMetadata { pos }
            | DebeziumError::CountMismatch { pos, .. } => pos,
        }
    }
}

pub(super) fn malformed(pos: &SourcePosition, reason: impl Into<String>) -> DebeziumError {
    DebeziumError::Malformed {
        pos: pos.clone(),
        reason: reason.into(),
    }
}
