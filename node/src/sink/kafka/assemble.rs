//! Rebuilds source transactions from Debezium's Kafka layout: BEGIN and END on the
//! transaction topic, each change event on its table's topic, partitioned by key. The
//! partitions are read at different speeds, so a transaction's events arrive in any order and
//! before or after its BEGIN; it is complete when its END has arrived and every count it
//! announces is met, and complete transactions leave in the order of the transaction topic.
//!
//! Everything still needed is remembered with where it was read (partition and offset), so
//! that [`KafkaAssembler::resume_offsets`] can tell a checkpoint the oldest offset of each
//! partition that a restart must read again, and [`KafkaAssembler::replayable`] which
//! transactions already handed over have events at or after those offsets (a restart
//! recognises and drops them).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use crate::debezium::{ChangeEvent, DebeziumError, Message, RecentIds, SourcePosition, TxnMode};

/// A transaction handed over: its key ([`txn_key`]) and, for each partition it was read from,
/// the last offset there.
pub type Handed = (String, Offsets);

/// For each partition (by index) something was read from, the last offset read there.
pub type Offsets = Vec<(u32, i64)>;

/// A complete transaction, its events in `total_order`.
#[derive(Debug)]
pub struct KafkaTxn {
    pub id: String,
    pub events: Vec<ChangeEvent>,
    pub begin: SourcePosition,
    /// Each partition it was read from, with the last offset there.
    pub offsets: Vec<(u32, i64)>,
}

/// What identifies a transaction across BEGIN, END and its events: Debezium's Postgres
/// connector writes `txId:LSN` with the LSN current when each was written, so only the `txId`
/// part identifies it there; every other id (MySQL GTIDs `uuid:n`, SQL Server's hex triples)
/// is taken whole.
pub fn txn_key(id: &str) -> &str {
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split_once(':') {
        Some((txid, lsn)) if numeric(txid) && numeric(lsn) => txid,
        _ => id,
    }
}

/// A message read from `part` at `offset`: a change event, or `None` for a transactional
/// message that counts toward its transaction but changes nothing.
#[derive(Debug)]
struct Located {
    part: u32,
    offset: i64,
    event: Option<ChangeEvent>,
    total_order: u64,
}

/// The events held for one transaction, with what drops a repeat of one and the count of each
/// data collection's, kept as they arrive.
#[derive(Debug, Default)]
struct Held {
    events: Vec<Located>,
    positions: HashSet<(u32, i64)>,
    orders: HashSet<u64>,
    counts: HashMap<Arc<str>, u64>,
}

impl Held {
    /// Holds `e`, unless it repeats one held (Kafka delivers at least once): false then.
    fn add(&mut self, e: Located) -> bool {
        if !self.positions.insert((e.part, e.offset))
            || (e.total_order > 0 && !self.orders.insert(e.total_order))
        {
            return false;
        }
        if let Some(ev) = &e.event {
            *self.counts.entry(ev.data_collection.clone()).or_default() += 1;
        }
        self.events.push(e);
        true
    }

    fn count(&self, collection: &str) -> u64 {
        self.counts.get(collection).copied().unwrap_or(0)
    }
}

#[derive(Debug)]
struct End {
    event_count: u64,
    data_collections: Vec<(String, u64)>,
    pos: SourcePosition,
}

#[derive(Debug)]
struct Pending {
    id: String,
    begin: SourcePosition,
    /// Where its BEGIN is on the transaction topic.
    begin_at: (u32, i64),
    held: Held,
    end: Option<End>,
    /// Delivered again after it was handed over: dropped once its END arrives.
    duplicate: bool,
}

/// See the module documentation.
#[derive(Debug)]
pub struct KafkaAssembler {
    mode: TxnMode,
    /// The next offset to read of each partition (indexed by the caller).
    next: Vec<i64>,
    /// Open transactions by key, and their keys in BEGIN order.
    pending: HashMap<Arc<str>, Pending>,
    order: VecDeque<Arc<str>>,
    /// Events whose BEGIN has not been read yet, by transaction key.
    early: HashMap<Arc<str>, Held>,
    /// Events held in `pending` and `early`.
    buffered: usize,
    /// Stand-alone transactions (snapshot reads; every event without metadata), ready.
    ready: VecDeque<KafkaTxn>,
    /// Keys of transactions handed over: by a run before a restart whose events a restart reads
    /// again, and the most recent of this run.
    replayable: HashSet<Arc<str>>,
    recent: RecentIds,
    /// Transactions handed over, with the last offset of each partition they were read from.
    handed: VecDeque<(Arc<str>, Offsets)>,
    duplicates_skipped: u64,
}

impl KafkaAssembler {
    /// An assembler reading partition `i` from `next[i]` on, that drops the transactions in
    /// `replayable` (handed over before a restart, as [`KafkaAssembler::replayable`] gave them).
    pub fn new(mode: TxnMode, next: Vec<i64>, replayable: Vec<Handed>) -> Self {
        KafkaAssembler {
            mode,
            next,
            pending: HashMap::new(),
            order: VecDeque::new(),
            early: HashMap::new(),
            buffered: 0,
            ready: VecDeque::new(),
            replayable: replayable.iter().map(|(k, _)| txn_key(k).into()).collect(),
            recent: RecentIds::default(),
            handed: replayable
                .into_iter()
                .map(|(k, offsets)| (txn_key(&k).into(), offsets))
                .collect(),
            duplicates_skipped: 0,
        }
    }

    /// Remembers `ids` (oldest first, as [`KafkaAssembler::recent`] gave them) as handed over
    /// before a restart: a redelivery of one of them is dropped.
    pub fn remember(&mut self, ids: &[String]) {
        for id in ids {
            self.recent.insert(txn_key(id));
        }
    }

    /// The keys of the `n` transactions handed over last, oldest first.
    pub fn recent(&self, n: usize) -> Vec<String> {
        self.recent.newest(n)
    }

    /// A partition discovered after the start, read from `offset`; its index is the next one.
    pub fn add_partition(&mut self, offset: i64) -> u32 {
        self.next.push(offset);
        (self.next.len() - 1) as u32
    }

    fn handed_over(&self, key: &str) -> bool {
        self.replayable.contains(key) || self.recent.contains(key)
    }

    /// Takes `msg`, read from partition `part` at `offset`.
    pub fn push(&mut self, part: u32, offset: i64, msg: Message) -> Result<(), DebeziumError> {
        let next = &mut self.next[part as usize];
        *next = (*next).max(offset + 1);
        match (self.mode, msg) {
            (_, Message::Tombstone { .. }) | (TxnMode::NoMetadata, Message::Skipped { .. }) => {
                Ok(())
            }
            (TxnMode::Metadata, Message::Skipped { txn, .. }) => {
                if let Some(t) = txn {
                    self.add(&t.id, part, offset, None, t.total_order);
                }
                Ok(())
            }
            (TxnMode::NoMetadata, Message::Begin { id, pos } | Message::End { id, pos, .. }) => {
                Err(DebeziumError::Transaction {
                    pos,
                    id,
                    reason: "transaction metadata in a source replayed with --no-txn-metadata; \
                             replay without that flag"
                        .into(),
                })
            }
            (TxnMode::NoMetadata, Message::Change(ev)) => {
                self.single(part, offset, ev);
                Ok(())
            }
            (TxnMode::Metadata, Message::Change(ev)) => match ev.txn.clone() {
                Some(t) => {
                    self.add(&t.id, part, offset, Some(ev), t.total_order);
                    Ok(())
                }
                None if ev.snapshot => {
                    self.single(part, offset, ev);
                    Ok(())
                }
                None => Err(DebeziumError::MissingTxnMetadata { pos: ev.pos }),
            },
            (TxnMode::Metadata, Message::Begin { id, pos }) => {
                let key: Arc<str> = txn_key(&id).into();
                if let Some(p) = self.pending.get(&key) {
                    // The connector delivered it again: the events already held stay, and a
                    // repeat of one is dropped. After its END, that is a whole redelivery.
                    if p.end.is_some() {
                        self.duplicates_skipped += 1;
                    }
                    return Ok(());
                }
                let duplicate = self.handed_over(&key);
                let held = self.early.remove(&key).unwrap_or_default();
                if duplicate {
                    self.buffered -= held.events.len();
                }
                self.order.push_back(key.clone());
                self.pending.insert(
                    key,
                    Pending {
                        id,
                        begin: pos,
                        begin_at: (part, offset),
                        held: if duplicate { Held::default() } else { held },
                        end: None,
                        duplicate,
                    },
                );
                Ok(())
            }
            (
                TxnMode::Metadata,
                Message::End {
                    id,
                    event_count,
                    data_collections,
                    pos,
                },
            ) => {
                let key = txn_key(&id);
                let handed = self.handed_over(key);
                match self.pending.get_mut(key) {
                    Some(p) if p.end.is_none() => {
                        p.end = Some(End {
                            event_count,
                            data_collections,
                            pos,
                        });
                        Ok(())
                    }
                    // A repeated END, or the END of one handed over before.
                    Some(_) => Ok(()),
                    None if handed => Ok(()),
                    None => Err(DebeziumError::Transaction {
                        pos,
                        id,
                        reason: "END without its BEGIN on the transaction topic (was the topic \
                                 read from a later offset, or its BEGIN deleted by retention?)"
                            .into(),
                    }),
                }
            }
        }
    }

    /// An event (or a transactional message) of transaction `id`.
    fn add(&mut self, id: &str, part: u32, offset: i64, event: Option<ChangeEvent>, order: u64) {
        let key = txn_key(id);
        if self.handed_over(key) {
            return;
        }
        let located = Located {
            part,
            offset,
            event,
            total_order: order,
        };
        let held = match self.pending.get_mut(key) {
            Some(p) if p.duplicate => return,
            Some(p) => &mut p.held,
            None => self.early.entry(key.into()).or_default(),
        };
        if held.add(located) {
            self.buffered += 1;
        }
    }

    fn single(&mut self, part: u32, offset: i64, ev: ChangeEvent) {
        let id = ev.pos.to_string();
        if self.handed_over(txn_key(&id)) {
            return;
        }
        self.ready.push_back(KafkaTxn {
            id,
            begin: ev.pos.clone(),
            events: vec![ev],
            offsets: vec![(part, offset)],
        });
    }

    /// The next complete transaction, in the transaction topic's order (stand-alone events
    /// first), if there is one.
    pub fn pop(&mut self) -> Result<Option<KafkaTxn>, DebeziumError> {
        if let Some(t) = self.ready.pop_front() {
            self.hand_over(&t);
            return Ok(Some(t));
        }
        loop {
            let Some(key) = self.order.front() else {
                return Ok(None);
            };
            let p = &self.pending[key];
            let Some(end) = &p.end else {
                return Ok(None);
            };
            if p.duplicate {
                let key = self.order.pop_front().expect("a front");
                self.pending.remove(&key);
                self.duplicates_skipped += 1;
                continue;
            }
            if !check_counts(p, end)? {
                return Ok(None);
            }
            let key = self.order.pop_front().expect("a front");
            let p = self.pending.remove(&key).expect("pending");
            self.buffered -= p.held.events.len();
            let mut offsets: Vec<(u32, i64)> = vec![p.begin_at];
            let mut events = p.held.events;
            events.sort_by_key(|e| e.total_order);
            for e in &events {
                match offsets.iter_mut().find(|(part, _)| *part == e.part) {
                    Some((_, o)) => *o = (*o).max(e.offset),
                    None => offsets.push((e.part, e.offset)),
                }
            }
            let txn = KafkaTxn {
                id: p.id,
                begin: p.begin,
                events: events.into_iter().filter_map(|e| e.event).collect(),
                offsets,
            };
            self.hand_over(&txn);
            return Ok(Some(txn));
        }
    }

    fn hand_over(&mut self, txn: &KafkaTxn) {
        let key: Arc<str> = txn_key(&txn.id).into();
        self.recent.insert(&key);
        self.handed.push_back((key, txn.offsets.clone()));
    }

    /// Events held for transactions other than the oldest open one: what `max_buffered`
    /// bounds.
    pub fn waiting(&self) -> usize {
        let head = self
            .order
            .front()
            .map_or(0, |k| self.pending[k].held.events.len());
        self.buffered - head
    }

    /// The oldest open transaction's id, and which data collections it still lacks events of
    /// (all of them while its END has not arrived: `None`).
    pub fn head_needs(&self) -> Option<(&str, Option<Vec<&str>>)> {
        let p = &self.pending[self.order.front()?];
        let lacking = p.end.as_ref().map(|end| {
            end.data_collections
                .iter()
                .filter(|(c, n)| p.held.count(c) != *n)
                .map(|(c, _)| c.as_str())
                .collect()
        });
        Some((&p.id, lacking))
    }

    /// The offset each partition must be read from again after a restart: the oldest one still
    /// needed by a transaction not handed over, else the next one to read.
    pub fn resume_offsets(&self) -> Vec<i64> {
        let mut at = self.next.clone();
        let mut need = |part: u32, offset: i64| {
            let o = &mut at[part as usize];
            *o = (*o).min(offset);
        };
        for p in self.pending.values() {
            need(p.begin_at.0, p.begin_at.1);
            p.held.events.iter().for_each(|e| need(e.part, e.offset));
        }
        for e in self.early.values().flat_map(|h| &h.events) {
            need(e.part, e.offset);
        }
        for t in &self.ready {
            t.offsets.iter().for_each(|&(p, o)| need(p, o));
        }
        at
    }

    /// The transactions handed over that have events at or after `resume` (as
    /// [`KafkaAssembler::resume_offsets`] gave it), with where they were read: what a restart
    /// from there must drop. Those with none are forgotten.
    pub fn replayable(&mut self, resume: &[i64]) -> Vec<Handed> {
        self.handed.retain(|(_, offsets)| {
            offsets
                .iter()
                .any(|&(p, o)| resume.get(p as usize).is_some_and(|r| o >= *r))
        });
        let kept: HashSet<&str> = self.handed.iter().map(|(k, _)| &**k).collect();
        self.replayable.retain(|k| kept.contains(&**k));
        self.handed
            .iter()
            .map(|(k, offsets)| (k.to_string(), offsets.clone()))
            .collect()
    }

    pub fn duplicates_skipped(&self) -> u64 {
        self.duplicates_skipped
    }

    /// Whether nothing is held: no open transaction, no early event, nothing ready.
    pub fn is_idle(&self) -> bool {
        self.order.is_empty() && self.early.is_empty() && self.ready.is_empty()
    }

    /// The next offset to read of each partition.
    pub fn next_offsets(&self) -> &[i64] {
        &self.next
    }
}

/// Whether `p`'s events meet every count its END announced (false: some are still to come);
/// an error when one is exceeded.
fn check_counts(p: &Pending, end: &End) -> Result<bool, DebeziumError> {
    let mismatch =
        |collection: Option<String>, expected: u64, got: u64| DebeziumError::CountMismatch {
            pos: end.pos.clone(),
            id: p.id.clone(),
            collection,
            expected,
            got,
        };
    let total = p.held.events.len() as u64;
    if total > end.event_count {
        return Err(mismatch(None, end.event_count, total));
    }
    let mut complete = total == end.event_count;
    for (c, n) in &end.data_collections {
        let got = p.held.count(c);
        if got > *n {
            return Err(mismatch(Some(c.clone()), *n, got));
        }
        complete &= got == *n;
    }
    Ok(complete)
}

#[cfg(test)]
#[path = "assemble_tests.rs"]
mod tests;
