//! What a call can fail with: [`ClientError`], and the contract's typed `Error` owned as a
//! [`Refusal`].

use std::net::SocketAddr;

use retina_protocol::query::catching_up;
use retina_protocol::retina_capnp::error;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("RPC: {0}")]
    Rpc(#[from] capnp::Error),
    /// The node answered with a typed error.
    #[error("{0}")]
    Refused(Refusal),
    #[error("a bad scan plan: {0}")]
    BadPlan(String),
    #[error(transparent)]
    Storage(#[from] retina_storage::StorageError),
    #[error("arrow: {0}")]
    Arrow(#[from] arrow::error::ArrowError),
    #[error("the client's connection thread stopped")]
    Closed,
}

impl ClientError {
    /// Whether the connection to the service ended (its process stopped, or it was started
    /// again): a new connection may succeed.
    pub fn is_disconnected(&self) -> bool {
        matches!(self, ClientError::Rpc(e) if e.kind == capnp::ErrorKind::Disconnected)
    }
}

impl From<std::str::Utf8Error> for ClientError {
    fn from(e: std::str::Utf8Error) -> Self {
        ClientError::Rpc(e.into())
    }
}

impl From<capnp::NotInSchema> for ClientError {
    fn from(e: capnp::NotInSchema) -> Self {
        ClientError::Rpc(e.into())
    }
}

/// The contract's typed `Error`, owned.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("unknown table {0}")]
    UnknownTable(String),
    #[error(
        "snapshot {requested} is too old: visibility was folded up to {oldest}; begin a new query"
    )]
    SnapshotTooOld { requested: u64, oldest: u64 },
    #[error("snapshot {requested} is in the future: applied through {applied_through}")]
    SnapshotInFuture {
        requested: u64,
        applied_through: u64,
    },
    #[error("the lease of query {0} expired")]
    LeaseExpired(u64),
    #[error("file {0:016x} is gone: ask for a new plan")]
    UnknownFile(u64),
    #[error("unauthorized: wrong or missing auth token")]
    Unauthorized,
    #[error("wrong service: {0}")]
    WrongService(String),
    #[error("node error: {0}")]
    Internal(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("too many queries: {0} run, the limit; end one first")]
    TooManyQueries(u32),
    #[error("{}", catching_up(*snapshot, *target))]
    CatchingUp { snapshot: u64, target: u64 },
    #[error("an error this client does not know ({0})")]
    Unknown(String),
}

impl Refusal {
    pub fn read(e: error::Reader<'_>) -> Refusal {
        let text = |t: capnp::Result<capnp::text::Reader<'_>>| {
            t.ok()
                .and_then(|t| t.to_str().ok().map(str::to_owned))
                .unwrap_or_default()
        };
        match e.which() {
            Ok(error::Which::UnknownTable(t)) => Refusal::UnknownTable(text(t)),
            Ok(error::Which::SnapshotTooOld(g)) => Refusal::SnapshotTooOld {
                requested: g.get_requested(),
                oldest: g.get_oldest(),
            },
            Ok(error::Which::SnapshotInFuture(g)) => Refusal::SnapshotInFuture {
                requested: g.get_requested(),
                applied_through: g.get_applied_through(),
            },
            Ok(error::Which::LeaseExpired(id)) => Refusal::LeaseExpired(id),
            Ok(error::Which::UnknownFile(id)) => Refusal::UnknownFile(id),
            Ok(error::Which::Unauthorized(())) => Refusal::Unauthorized,
            Ok(error::Which::WrongService(t)) => Refusal::WrongService(text(t)),
            Ok(error::Which::Internal(t)) => Refusal::Internal(text(t)),
            Ok(error::Which::InvalidArgument(t)) => Refusal::InvalidArgument(text(t)),
            Ok(error::Which::TooManyQueries(n)) => Refusal::TooManyQueries(n),
            Ok(error::Which::CatchingUp(g)) => Refusal::CatchingUp {
                snapshot: g.get_snapshot(),
                target: g.get_target(),
            },
            Err(e) => Refusal::Unknown(e.to_string()),
        }
    }
}

/// A result union's error branch as a [`ClientError`].
pub(crate) fn refused(e: capnp::Result<error::Reader<'_>>) -> ClientError {
    match e {
        Ok(e) => ClientError::Refused(Refusal::read(e)),
        Err(e) => ClientError::Rpc(e),
    }
}

/// The typed error as a sentence.
pub fn describe(e: error::Reader<'_>) -> String {
    Refusal::read(e).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_read_back_from_the_wire_and_say_what_the_node_says() {
        let mut message = capnp::message::Builder::new_default();
        let mut e = message.init_root::<error::Builder>().init_catching_up();
        e.set_snapshot(7);
        e.set_target(0);
        let r = message.get_root_as_reader::<error::Reader>().unwrap();
        let refusal = Refusal::read(r);
        assert_eq!(
            refusal,
            Refusal::CatchingUp {
                snapshot: 7,
                target: 0
            }
        );
        assert_eq!(refusal.to_string(), catching_up(7, 0));
        assert_eq!(describe(r), catching_up(7, 0));
    }
}
