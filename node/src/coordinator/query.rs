//! Queries as the coordinator hands them out: ids, owners, the caps, and the ticket a beginner
//! gets.

use retina_storage::Timestamp;

pub type QueryId = u64;

/// Who began a query: a connection to the coordinator service, or [`LOCAL`].
pub type Owner = u64;
/// The node's own in-process API (`NodeHandle::begin_query`): trusted, not capped.
pub const LOCAL: Owner = 0;
/// Queries one connection may run at once; a client that keeps beginning queries is refused
/// rather than growing the coordinator's state.
pub const MAX_QUERIES_PER_CONNECTION: u32 = 256;
/// Queries all connections together may run at once.
pub const MAX_RUNNING_QUERIES: u32 = 16_384;

/// A running query as its beginner gets it: the scan services serve `id` at `snapshot` to
/// whoever presents `secret`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct QueryTicket {
    pub id: QueryId,
    pub snapshot: Timestamp,
    pub secret: u64,
}
