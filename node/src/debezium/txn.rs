//! Source transactions: [`TxnAssembler`] rebuilds them from parsed messages by their
//! BEGIN/END metadata, checks END's counts, and drops those already applied.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use super::error::{DebeziumError, SourcePosition};
use super::message::{ChangeEvent, Message};

/// How many applied transaction ids the assembler remembers to drop replayed duplicates. A
/// source replays from a checkpoint at most a few thousand transactions back, so 65,536 covers
/// any realistic overlap while bounding memory to a few MiB.
pub const APPLIED_IDS_REMEMBERED: usize = 65_536;

/// The connector name Debezium's Postgres connector writes in `source.connector`.
pub const POSTGRES_CONNECTOR: &str = "postgresql";

/// Whether two transaction ids name the same source transaction, as `connector` defines
/// them. Debezium's Postgres connector (since 2.1) writes `txId:LSN`, the LSN being the
/// last one seen when the BEGIN, each change event or the END was written, so only the
/// `txId` part identifies the transaction; every other connector's id is compared whole
/// (MySQL's GTID `server-uuid:n`, for one, needs both parts).
pub fn same_transaction(a: &str, b: &str, connector: Option<&str>) -> bool {
    a == b || (connector == Some(POSTGRES_CONNECTOR) && postgres_txid(a) == postgres_txid(b))
}

/// The `txId` part of a Postgres `txId:LSN` transaction id (the whole id when it has no
/// LSN part, as before Debezium 2.1).
fn postgres_txid(id: &str) -> &str {
    id.split_once(':').map_or(id, |(txid, _)| txid)
}

/// The ids of the most recently applied transactions, at most [`APPLIED_IDS_REMEMBERED`]: a
/// set to look them up in, and their order to forget the oldest.
#[derive(Debug, Default)]
pub struct RecentIds {
    set: HashSet<Arc<str>>,
    order: VecDeque<Arc<str>>,
}

impl RecentIds {
    /// Remembers `id` (once), forgetting the oldest beyond the bound.
    pub fn insert(&mut self, id: &str) {
        if self.set.contains(id) {
            return;
        }
        if self.order.len() == APPLIED_IDS_REMEMBERED
            && let Some(oldest) = self.order.pop_front()
        {
            self.set.remove(&oldest);
        }
        let id: Arc<str> = id.into();
        self.set.insert(id.clone());
        self.order.push_back(id);
    }

    pub fn contains(&self, id: &str) -> bool {
        self.set.contains(id)
    }

    /// The `n` newest, oldest first.
    pub fn newest(&self, n: usize) -> Vec<String> {
        let skip = self.order.len().saturating_sub(n);
        self.order
            .iter()
            .skip(skip)
            .map(|id| id.to_string())
            .collect()
    }

    /// How many are remembered (as a set, and in order: always the same).
    #[cfg(test)]
    fn len(&self) -> (usize, usize) {
        (self.set.len(), self.order.len())
    }
}

/// A complete source transaction, its events in `total_order`.
#[derive(Clone, Debug)]
pub struct Transaction {
    pub id: String,
    pub events: Vec<ChangeEvent>,
    pub begin: SourcePosition,
    pub end: SourcePosition,
}

/// Whether the stream carries BEGIN/END transaction metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnMode {
    /// Events are grouped by BEGIN/END (`provide.transaction.metadata=true`).
    Metadata,
    /// Every change event is its own transaction (`--no-txn-metadata`).
    NoMetadata,
}

#[derive(Debug)]
struct OpenTxn {
    /// The id as its BEGIN wrote it (with Postgres, `txId:LSN` at the BEGIN); shared, so the
    /// sink notes it before each line without copying it.
    id: Arc<str>,
    begin: SourcePosition,
    events: Vec<ChangeEvent>,
    /// Transactional logical decoding messages skipped inside it; Debezium counts them among
    /// the transaction's events.
    messages: u64,
}

/// Reassembles source transactions from parsed messages, checks them against END's counts, and
/// drops transactions that were already applied (a source replaying from an older offset).
///
/// Snapshot reads (`op` `r`) carry no transaction block even with metadata on; outside a
/// transaction each one is a transaction of its own, identified by its position, as in
/// [`TxnMode::NoMetadata`].
///
/// Transaction ids are matched as the connector defines them ([`same_transaction`]): BEGIN
/// and END carry no `source`, so the connector is the one the last change event named.
#[derive(Debug)]
pub struct TxnAssembler {
    mode: TxnMode,
    open: Option<OpenTxn>,
    /// `source.connector` of the last change event.
    connector: Option<Arc<str>>,
    /// Open transactions restarted by a repeated BEGIN.
    restarts: u64,
    /// Ids of the most recently applied transactions, as a set and in applied order (to evict
    /// the oldest beyond [`APPLIED_IDS_REMEMBERED`]).
    applied: RecentIds,
    last_applied: Option<(String, SourcePosition)>,
    duplicates_skipped: u64,
    /// Events of the last transaction ended (at most [`MAX_EVENTS_RESERVED`]): the room the
    /// next one starts with.
    last_events: usize,
}

/// The most events room is made for before a transaction's events arrive.
const MAX_EVENTS_RESERVED: usize = 1024;

impl TxnAssembler {
    pub fn new(mode: TxnMode) -> Self {
        TxnAssembler {
            mode,
            open: None,
            connector: None,
            restarts: 0,
            applied: RecentIds::default(),
            last_applied: None,
            duplicates_skipped: 0,
            last_events: 0,
        }
    }

    pub fn mode(&self) -> TxnMode {
        self.mode
    }

    /// Takes the next message; returns a transaction when one is complete. After an error the
    /// transaction it broke is discarded and the assembler takes the next message.
    pub fn push(&mut self, msg: Message) -> Result<Option<Transaction>, DebeziumError> {
        match (self.mode, msg) {
            (_, Message::Tombstone { .. }) => Ok(None),
            (TxnMode::NoMetadata, Message::Skipped { .. }) => Ok(None),
            (TxnMode::Metadata, Message::Skipped { txn, .. }) => {
                // Counted toward the open transaction's END when it belongs to it; a message
                // outside any transaction stands alone.
                if let (Some(open), Some(t)) = (self.open.as_mut(), txn)
                    && same_transaction(&open.id, &t.id, self.connector.as_deref())
                {
                    open.messages += 1;
                }
                Ok(None)
            }
            (TxnMode::NoMetadata, Message::Begin { id, pos } | Message::End { id, pos, .. }) => {
                Err(DebeziumError::Transaction {
                    pos,
                    id,
                    reason: "transaction metadata in a stream replayed with --no-txn-metadata; \
                             replay without that flag"
                        .into(),
                })
            }
            (TxnMode::NoMetadata, Message::Change(ev)) => Ok(self.single(ev)),
            (TxnMode::Metadata, Message::Begin { id, pos }) => self.on_begin(id, pos),
            (TxnMode::Metadata, Message::Change(ev)) => self.on_change(ev),
            (
                TxnMode::Metadata,
                Message::End {
                    id,
                    event_count,
                    data_collections,
                    pos,
                },
            ) => self.on_end(id, event_count, &data_collections, pos),
        }
    }

    /// Discards the open transaction, if any (after the caller skipped input, say).
    pub fn reset(&mut self) {
        self.open = None;
    }

    /// The id of the transaction between its BEGIN and END, if any.
    pub fn open_transaction(&self) -> Option<&str> {
        self.open.as_ref().map(|t| &*t.id)
    }

    /// [`Self::open_transaction`], shared.
    pub fn open_id(&self) -> Option<Arc<str>> {
        self.open.as_ref().map(|t| t.id.clone())
    }

    /// Where the open transaction's (latest) BEGIN is, if one is open.
    pub fn open_begin(&self) -> Option<&SourcePosition> {
        self.open.as_ref().map(|t| &t.begin)
    }

    /// Whether ids `a` and `b` name the same transaction, for the connector of the stream so
    /// far ([`same_transaction`]).
    pub fn same_transaction(&self, a: &str, b: &str) -> bool {
        same_transaction(a, b, self.connector.as_deref())
    }

    /// How many open transactions a repeated BEGIN restarted.
    pub fn restarts(&self) -> u64 {
        self.restarts
    }

    /// Records that transaction `id`, ending at `end`, is durably applied: a later transaction
    /// with the same id is dropped as a duplicate. The assembler never calls this itself.
    pub fn mark_applied(&mut self, id: &str, end: &SourcePosition) {
        let key = self.applied_key(id).to_owned();
        self.remember(&key);
        self.last_applied = Some((id.to_owned(), end.clone()));
    }

    /// The ids of the `n` most recently applied transactions, oldest first: what a
    /// checkpoint records so that a restart still recognises them.
    pub fn recent_applied(&self, n: usize) -> Vec<String> {
        self.applied.newest(n)
    }

    /// Remembers `ids` (oldest first; as [`TxnAssembler::recent_applied`] gave them) as
    /// applied, as after a restart from a checkpoint that recorded them: a later transaction
    /// with one of these ids is a duplicate.
    pub fn remember_applied<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>) {
        for id in ids {
            self.remember(id);
        }
    }

    /// What identifies transaction `id` among applied ones: the id as the connector compares
    /// it ([`same_transaction`]), so Postgres's `txId` part alone; its LSN part may differ
    /// when the connector redelivers after its own restart.
    /// A stand-alone event's id (its position) is kept whole.
    fn applied_key<'a>(&self, id: &'a str) -> &'a str {
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        match id.split_once(':') {
            Some((txid, lsn))
                if self.connector.as_deref() == Some(POSTGRES_CONNECTOR)
                    && numeric(txid)
                    && numeric(lsn) =>
            {
                txid
            }
            _ => id,
        }
    }

    fn remember(&mut self, id: &str) {
        self.applied.insert(id);
    }

    /// The last transaction passed to [`TxnAssembler::mark_applied`] and where it ended.
    pub fn last_applied(&self) -> Option<(&str, &SourcePosition)> {
        self.last_applied
            .as_ref()
            .map(|(id, pos)| (id.as_str(), pos))
    }

    /// How many complete transactions were dropped as already applied.
    pub fn duplicates_skipped(&self) -> u64 {
        self.duplicates_skipped
    }

    /// `txn`, unless it was already applied.
    fn emit(&mut self, txn: Transaction) -> Option<Transaction> {
        if self.applied.contains(self.applied_key(&txn.id)) {
            self.duplicates_skipped += 1;
            return None;
        }
        Some(txn)
    }

    /// A transaction of one event, identified by its position.
    fn single(&mut self, ev: ChangeEvent) -> Option<Transaction> {
        self.emit(Transaction {
            id: ev.pos.to_string(),
            begin: ev.pos.clone(),
            end: ev.pos.clone(),
            events: vec![ev],
        })
    }

    fn on_begin(
        &mut self,
        id: String,
        pos: SourcePosition,
    ) -> Result<Option<Transaction>, DebeziumError> {
        let previous = self.open.replace(OpenTxn {
            id: Arc::from(id.as_str()),
            begin: pos.clone(),
            // Room for as many events as the last transaction had: a stream's transactions
            // are mostly alike, and growing a vector of events copies them over and over.
            events: Vec::with_capacity(self.last_events),
            messages: 0,
        });
        match previous {
            None => Ok(None),
            // The source delivers the open transaction again from its BEGIN (a redelivery after
            // a partial one): the events so far are dropped and the transaction starts over.
            Some(old) if self.same_transaction(&old.id, &id) => {
                self.restarts += 1;
                tracing::warn!(
                    "{pos}: transaction `{id}` begins again while open since {} with {} events; \
                     restarting it from this BEGIN",
                    old.begin,
                    old.events.len()
                );
                Ok(None)
            }
            // The new transaction stays open: only the one whose END went missing is broken.
            Some(old) => Err(DebeziumError::Transaction {
                pos,
                id,
                reason: format!(
                    "BEGIN while transaction `{}` (begun at {}) is open; its END is missing, so \
                     it was discarded",
                    old.id, old.begin
                ),
            }),
        }
    }

    fn on_change(&mut self, ev: ChangeEvent) -> Result<Option<Transaction>, DebeziumError> {
        if ev.connector.is_some() {
            self.connector.clone_from(&ev.connector);
        }
        let Some(open) = self.open.as_mut() else {
            return match &ev.txn {
                Some(t) => Err(DebeziumError::Transaction {
                    pos: ev.pos.clone(),
                    id: t.id.clone(),
                    reason: "change event outside BEGIN/END: its BEGIN is missing; start the \
                             replay at a BEGIN"
                        .into(),
                }),
                None if ev.snapshot => Ok(self.single(ev)),
                None => Err(DebeziumError::MissingTxnMetadata {
                    pos: ev.pos.clone(),
                }),
            };
        };
        match &ev.txn {
            Some(t) if same_transaction(&t.id, &open.id, ev.connector.as_deref()) => {
                open.events.push(ev);
                Ok(None)
            }
            Some(t) => {
                let err = DebeziumError::Transaction {
                    pos: ev.pos.clone(),
                    id: t.id.clone(),
                    reason: format!(
                        "change event inside transaction `{}` (begun at {}); that transaction \
                         was discarded",
                        open.id, open.begin
                    ),
                };
                self.open = None;
                Err(err)
            }
            None => {
                let err = DebeziumError::Transaction {
                    pos: ev.pos.clone(),
                    id: open.id.to_string(),
                    reason: "change event without a `transaction` block between BEGIN and END; \
                             the transaction was discarded"
                        .into(),
                };
                self.open = None;
                Err(err)
            }
        }
    }

    fn on_end(
        &mut self,
        id: String,
        event_count: u64,
        data_collections: &[(String, u64)],
        pos: SourcePosition,
    ) -> Result<Option<Transaction>, DebeziumError> {
        let Some(open) = self.open.take() else {
            return Err(DebeziumError::Transaction {
                pos,
                id,
                reason: "END without a BEGIN; start the replay at a BEGIN".into(),
            });
        };
        if !self.same_transaction(&open.id, &id) {
            return Err(DebeziumError::Transaction {
                pos,
                id,
                reason: format!(
                    "END while transaction `{}` (begun at {}) is open; both were discarded",
                    open.id, open.begin
                ),
            });
        }
        let mismatch =
            |collection: Option<&str>, expected: u64, got: usize| DebeziumError::CountMismatch {
                pos: pos.clone(),
                id: id.clone(),
                collection: collection.map(str::to_owned),
                expected,
                got: got as u64,
            };
        let got = open.events.len() + open.messages as usize;
        if got as u64 != event_count {
            return Err(mismatch(None, event_count, got));
        }
        // Logical decoding messages are on a collection of their own that no table event
        // matches: the counts of such collections add up to the messages.
        let mut message_counts = 0;
        for (name, expected) in data_collections {
            let got = open
                .events
                .iter()
                .filter(|e| collection_matches(name, &e.data_collection))
                .count();
            if got == 0 && open.messages > 0 {
                message_counts += *expected;
            } else if got as u64 != *expected {
                return Err(mismatch(Some(name), *expected, got));
            }
        }
        if open.messages > 0 && !data_collections.is_empty() && message_counts != open.messages {
            return Err(mismatch(None, message_counts, open.messages as usize));
        }
        if !data_collections.is_empty()
            && let Some(stray) = open.events.iter().find(|e| {
                !data_collections
                    .iter()
                    .any(|(name, _)| collection_matches(name, &e.data_collection))
            })
        {
            return Err(DebeziumError::Transaction {
                pos,
                id,
                reason: format!(
                    "the event at {} on `{}` is on no data collection END lists",
                    stray.pos, stray.data_collection
                ),
            });
        }
        let mut events = open.events;
        self.last_events = events.len().min(MAX_EVENTS_RESERVED);
        events.sort_by_key(|e| e.txn.as_ref().map_or(0, |t| t.total_order));
        Ok(self.emit(Transaction {
            id,
            events,
            begin: open.begin,
            end: pos,
        }))
    }
}

/// Whether END's data collection `listed` names an event's `data_collection`. Connectors whose
/// tables have three-part names (SQL Server, Db2, Oracle: `db.schema.table`) list the database
/// too, which the event's `schema.table` lacks, so a `.`-separated suffix matches.
pub(super) fn collection_matches(listed: &str, data_collection: &str) -> bool {
    listed == data_collection
        || listed
            .strip_suffix(data_collection)
            .is_some_and(|prefix| prefix.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn applied_ids_are_bounded() {
        let at_2 = SourcePosition::new("events.json", 2);
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        for i in 0..=APPLIED_IDS_REMEMBERED {
            asm.mark_applied(&i.to_string(), &SourcePosition::new("events.json", 1));
        }
        asm.mark_applied("1", &at_2); // already remembered: no second entry
        assert_eq!(
            asm.applied.len(),
            (APPLIED_IDS_REMEMBERED, APPLIED_IDS_REMEMBERED)
        );
        assert!(!asm.applied.contains("0"), "the oldest id is forgotten");
        assert!(asm.applied.contains("1"));
        assert_eq!(asm.last_applied(), Some(("1", &at_2)));
    }
}
