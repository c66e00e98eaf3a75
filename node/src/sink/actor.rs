//! The sink actor's run: read the source line by line, assemble transactions, hand them to
//! the node in groups (the node routes their rows to the shards), put checkpoint barriers
//! after them, and deal with bad transactions (stop, or dead-letter and go on). Between lines
//! it reads its inbox ([`SinkMsg`]).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use flume::Receiver;
use retina_storage::{RowOp, TableOp, Timestamp, Value};

use super::barrier::{Barriers, LAST_CHECKPOINT_WAIT};
use super::dead_letter::{DeadLetter, dead_letter_offsets, marker, write_once};
use super::decode::{CHUNK_BYTES, Decoded, Lanes, LineText, Parsed};
use super::msg::{SinkMsg, SinkReport};
use super::options::{OnError, SinkOptions};
use super::source::{self, SourceSpec, SourceState, read_span};
use crate::catalog::Catalog;
use crate::coordinator::SourceMark;
use crate::debezium::{ChangeEvent, DebeziumError, Message, Skipped, SourcePosition, TxnAssembler};
use crate::node::NodeHandle;

/// How long a follower waits at the end of its file before looking again (and how long the
/// sink waits for decoded lines before it reads its inbox again).
pub(super) const FOLLOW_POLL: Duration = Duration::from_millis(5);
/// How long the sink's last checkpoint waits for an earlier one to finish.
const FINAL_CHECKPOINT_WAIT: Duration = Duration::from_secs(10);
/// How long a stopping sink waits for what it handed the node to become visible.
const STOP_VISIBLE_WAIT: Duration = Duration::from_secs(10);
/// A group also closes once its transactions span this many bytes of source, which bounds a
/// shard's op batch (rkyv's offsets are 32-bit) with [`SinkOptions::max_txn_bytes`].
const MAX_GROUP_SOURCE_BYTES: u64 = 64 << 20;
/// Ids of the most recently applied transactions recorded with each checkpoint: a source
/// that redelivers (Kafka after a consumer restart, Debezium after a connector restart)
/// starts again at most this many transactions back.
pub(super) const CHECKPOINT_IDS: usize = 8192;

/// What the sink records with a checkpoint: the transactions it handed over last.
fn source_state(assembler: &TxnAssembler) -> SourceState {
    SourceState {
        applied: assembler.recent_applied(CHECKPOINT_IDS),
        ..Default::default()
    }
}

/// A transaction's operations, as the node takes them.
pub(super) type Ops = Vec<TableOp<Vec<Value>>>;

/// `events` as operations on the catalog's tables.
pub(super) fn txn_ops(catalog: &Catalog, events: Vec<ChangeEvent>) -> Ops {
    events
        .into_iter()
        .map(|ev| TableOp {
            table: catalog
                .id_of(&ev.table)
                .expect("events name catalog tables"),
            op: RowOp::from(ev.op),
        })
        .collect()
}

/// Runs the sink on this thread until the source ends (or, following, until a
/// [`SinkMsg::Stop`] arrives in `inbox`) or an error stops it. `inbox` is read before each
/// line and while waiting for more of a followed source; once no sender is left it is not read
/// again, and the run goes on to the end of its source.
///
/// After a restart it resumes where the node's checkpoint was taken (a file is read from that
/// byte; stdin is read from its start and that many bytes are skipped: it must be the same
/// stream), and says once it replayed as far as the source reached before.
pub(super) fn run(
    node: &NodeHandle,
    options: &SinkOptions,
    inbox: &Receiver<SinkMsg>,
) -> SinkReport {
    match &options.source {
        SourceSpec::Kafka(spec) => return super::kafka::run(node, options, spec, inbox),
        SourceSpec::Postgres(spec) => return super::postgres::run(node, options, spec, inbox),
        SourceSpec::File(_) | SourceSpec::Stdin => {}
    }
    let resume = node.resume().unwrap_or_default();
    let opened = source::open(&options.source, resume.offset);
    let (name, input, size_at_start) = match opened {
        Ok(o) => o,
        Err(e) => {
            let msg = format!("source {}: {e}", options.source);
            node.stop_replay(msg.clone());
            node.caught_up(None);
            return SinkReport {
                stopped_by: Some(msg),
                ..Default::default()
            };
        }
    };
    if size_at_start.is_none() {
        // The sink cannot tell how far the source reached before: queries wait for the HWM
        // the node persisted.
        node.caught_up(None);
    }
    let mut assembler = TxnAssembler::new(options.mode);
    let restored = SourceState::decode(node.resume_state())
        .map_err(|reason| format!("the checkpoint's source state: {reason}"))
        .and_then(|state| {
            assembler.remember_applied(state.applied.iter().map(String::as_str));
            dead_letter_offsets(&options.dead_letter, resume.offset)
        });
    let dead_lettered_before = match restored {
        Ok(d) => d,
        Err(msg) => {
            node.stop_replay(msg.clone());
            node.caught_up(None);
            return SinkReport {
                stopped_by: Some(msg),
                ..Default::default()
            };
        }
    };
    let mut sink = Sink {
        node,
        options,
        inbox,
        inbox_open: true,
        name,
        assembler,
        dead_lettered_before,
        raw_bytes: 0,
        line_start: resume.offset,
        txn_begin: resume.offset,
        spans: Vec::new(),
        in_flight: VecDeque::new(),
        group: Vec::new(),
        group_opened: Instant::now(),
        sources: Vec::new(),
        raw: Vec::new(),
        skipping: None,
        report: SinkReport::default(),
        read: resume,
        group_end: resume,
        submitted: resume,
        barriers: Barriers::new(resume),
        catch_up_at: size_at_start,
    };
    sink.report.lines = resume.line;
    let mut lanes = Lanes::start(
        Arc::new(super::line_parser(node)),
        sink.name.clone(),
        input,
        resume.line,
        options.follow,
        options.decode_lanes,
        CHUNK_BYTES,
    );
    // Whether the reader has read everything there is for now (a followed source).
    let mut at_end = false;
    'read: while !sink.stop_asked() {
        // Close the group when nothing more is decoded yet (a transaction never waits for the
        // next read to become visible).
        let wait = if sink.group.is_empty() {
            FOLLOW_POLL
        } else {
            Duration::ZERO
        };
        let chunk = match lanes.next(wait) {
            Some(Decoded::Lines(chunk)) => chunk,
            Some(Decoded::End(error)) => {
                if let Some(e) = error {
                    sink.fail(format!("{}: {e}", sink.name));
                }
                break;
            }
            Some(Decoded::Idle) => {
                at_end = true;
                if !sink.group.is_empty() && !sink.submit() {
                    break;
                }
                sink.barrier_if_due();
                sink.check_caught_up(true);
                if sink.skip_refused() {
                    break;
                }
                continue;
            }
            None => {
                if !sink.group.is_empty() {
                    if !sink.submit() {
                        break;
                    }
                } else if at_end {
                    sink.barrier_if_due();
                    sink.check_caught_up(true);
                    if sink.skip_refused() {
                        break;
                    }
                }
                continue;
            }
        };
        at_end = false;
        let (bytes, lines) = chunk.into_parts();
        for line in lines {
            // Close the group when it is full, or has been open for the group-commit interval.
            if !sink.group.is_empty()
                && (sink.group.len() >= options.max_group_txns
                    || sink.group_end.offset - sink.submitted.offset >= MAX_GROUP_SOURCE_BYTES
                    || sink.group_opened.elapsed() >= options.group_commit_interval)
                && !sink.submit()
            {
                break 'read;
            }
            sink.report.lines += 1;
            sink.line_start = sink.read.offset;
            sink.read.offset += line.bytes.len() as u64;
            sink.read.line = sink.report.lines;
            let text = line.text(&bytes);
            let ok = match line.parsed {
                Parsed::Message(parsed) => sink.on_line(text, parsed),
                Parsed::NotUtf8(e) => {
                    let pos = SourcePosition::new(sink.name.clone(), sink.report.lines);
                    let lossy = String::from_utf8_lossy(&bytes.bytes()[line.bytes.clone()])
                        .trim_end()
                        .to_owned();
                    let open = sink.assembler.open_transaction().map(str::to_owned);
                    let error = DebeziumError::Malformed {
                        pos,
                        reason: format!("not UTF-8: {e}"),
                    };
                    sink.on_error(error, open, &lossy)
                }
            };
            if !ok {
                break 'read;
            }
        }
        lanes.give_back(bytes);
    }
    if sink.report.stopped_by.is_none() && sink.report.restart.is_none() {
        // A bad transaction whose END never came still goes to the dead-letter file.
        if let Some((_, mut record)) = sink.skipping.take() {
            record.reason += "; the source ended before its END";
            sink.dead_letter(record);
        }
        if !sink.group.is_empty() {
            sink.submit();
        }
        // A refusal of the last transactions is known once the shards applied them.
        if options.on_error == OnError::Skip
            && let Some(ts) = sink.report.last_ts
        {
            node.wait_visible(ts, FINAL_CHECKPOINT_WAIT);
            sink.skip_refused();
        }
        // A restart after this one starts here.
        if sink.report.stopped_by.is_none()
            && sink.report.restart.is_none()
            && sink.options.checkpoint_interval.is_some()
        {
            let assembler = &sink.assembler;
            sink.barriers.last(
                node,
                sink.submitted,
                || source_state(assembler),
                &mut sink.report,
                LAST_CHECKPOINT_WAIT,
            );
        }
    }
    // Whatever stopped the sink, queries waiting for it need not wait longer.
    sink.check_caught_up(true);
    if sink.catch_up_at.is_some() {
        node.caught_up(Some(
            sink.report.last_ts.unwrap_or(Timestamp::GENESIS.get()),
        ));
    }
    sink.report.duplicates_skipped = sink.assembler.duplicates_skipped();
    node.status().source_done.store(true, Ordering::Release);
    sink.report
}

/// The state of one run.
struct Sink<'a> {
    node: &'a NodeHandle,
    options: &'a SinkOptions,
    inbox: &'a Receiver<SinkMsg>,
    /// A sender of the inbox is left (once none is, the inbox is not read again).
    inbox_open: bool,
    name: Arc<str>,
    assembler: TxnAssembler,
    group: Vec<Ops>,
    /// When the first transaction of the group arrived.
    group_opened: Instant,
    /// Where each transaction of the group began in the source (described only on error).
    sources: Vec<SourcePosition>,
    /// The raw lines of the open transaction, for the dead-letter file (kept only where bad
    /// transactions go there, `on_error = skip`), and their bytes.
    raw: Vec<String>,
    raw_bytes: u64,
    /// Where the line being read starts in the source, and where the open transaction began.
    line_start: u64,
    txn_begin: u64,
    /// Where each transaction of the group begins and ends in the source.
    spans: Vec<(u64, u64, String)>,
    /// Transactions handed to the node and not yet known to be below HWM.
    in_flight: VecDeque<InFlight>,
    /// Where dead-letter records already in the file end in the source, past the resume
    /// position: the same bad transactions met again after a restart are not written twice.
    dead_lettered_before: BTreeSet<u64>,
    /// Skipping the rest of a bad transaction: its id and the dead-letter record so far.
    skipping: Option<(String, DeadLetter)>,
    report: SinkReport,
    /// Where the source stands after the last line read.
    read: SourceMark,
    /// After the last transaction of the group.
    group_end: SourceMark,
    /// After the last transaction handed to the node.
    submitted: SourceMark,
    /// Where the last checkpoint barrier was taken.
    barriers: Barriers,
    /// The source's size when this run opened it; `None` once the sink has replayed that far
    /// and said so (or when it cannot tell).
    catch_up_at: Option<u64>,
}

/// A transaction handed to the node: its timestamp, where it lies in the source, and the
/// description errors use.
struct InFlight {
    ts: u64,
    begin: u64,
    end: u64,
    /// The source transaction's id.
    id: String,
    /// Where it began in the source.
    source: SourcePosition,
}

impl InFlight {
    /// Where it came from, for errors: `file:line (transaction id)`.
    fn describe(&self) -> String {
        format!("{} (transaction {})", self.source, self.id)
    }
}

impl Sink<'_> {
    /// Whether a [`SinkMsg::Stop`] is waiting in the inbox.
    fn stop_asked(&mut self) -> bool {
        if !self.inbox_open {
            return false;
        }
        match self.inbox.try_recv() {
            Ok(SinkMsg::Stop) => true,
            Err(flume::TryRecvError::Empty) => false,
            Err(flume::TryRecvError::Disconnected) => {
                self.inbox_open = false;
                false
            }
        }
    }

    /// Handles one line and its parse; false to stop.
    fn on_line(&mut self, text: LineText<'_>, parsed: Result<Message, DebeziumError>) -> bool {
        let pos = SourcePosition::new(self.name.clone(), self.report.lines);
        if let Some((id, record)) = &mut self.skipping {
            let line = text.get();
            match marker(line) {
                // Its END (with Postgres, an id whose LSN part differs): the whole bad
                // transaction goes to the dead-letter file.
                Some(("END", end)) if self.assembler.same_transaction(&end, id) => {
                    record.push(line, self.options.max_txn_bytes);
                    let (_, record) = self.skipping.take().expect("matched above");
                    return self.dead_letter(record);
                }
                // Another transaction begins, or this one again from its BEGIN (a redelivery):
                // the bad delivery never ended; this line is read as usual.
                Some(("BEGIN", begin)) => {
                    let again = self.assembler.same_transaction(&begin, id);
                    let (_, mut record) = self.skipping.take().expect("matched above");
                    record.reason += if again {
                        "; the source delivered the transaction again from its BEGIN"
                    } else {
                        "; its END never came"
                    };
                    if !self.dead_letter(record) {
                        return false;
                    }
                }
                _ => {
                    record.push(line, self.options.max_txn_bytes);
                    return true;
                }
            }
        }
        let open = self.assembler.open_id();
        if open.is_none() {
            self.txn_begin = self.line_start;
        }
        let status = self.node.status();
        let result = parsed.and_then(|m| {
            if let Message::Skipped { what, .. } = &m {
                let counter = match what {
                    Skipped::Heartbeat => &status.heartbeats_skipped,
                    Skipped::LogicalMessage => &status.messages_skipped,
                    Skipped::SchemaChange => {
                        tracing::warn!(
                            "{pos}: schema change event skipped; tables change only through the \
                             catalog DDL (a change of a replayed table's columns fails replay \
                             at its first event)"
                        );
                        &status.schema_changes_skipped
                    }
                };
                counter.fetch_add(1, Ordering::Relaxed);
            }
            self.assembler.push(m)
        });
        status
            .txn_restarts
            .store(self.assembler.restarts(), Ordering::Relaxed);
        match result {
            Ok(Some(txn)) => {
                self.raw.clear();
                self.raw_bytes = 0;
                if self.dead_lettered_before.remove(&self.read.offset) {
                    // A shard refused it before a restart; it is in the dead-letter file.
                    tracing::info!(
                        "{}: transaction {} was dead-lettered before the restart; skipped",
                        txn.begin,
                        txn.id
                    );
                    return true;
                }
                let ops = txn_ops(self.node.catalog(), txn.events);
                // Marked now, not when the group is sent: a repeat of a transaction still in the
                // group is a duplicate too.
                self.assembler.mark_applied(&txn.id, &txn.end);
                if self.group.is_empty() {
                    self.group_opened = Instant::now();
                }
                self.group.push(ops);
                self.spans
                    .push((self.txn_begin, self.read.offset, txn.id.clone()));
                self.group_end = self.read;
                self.sources.push(txn.begin.clone());
                true
            }
            Ok(None) => {
                if self.assembler.open_begin() == Some(&pos) {
                    // This line (re)started the open transaction: a restart drops the partial
                    // delivery's lines with its events.
                    self.raw.clear();
                    self.raw_bytes = 0;
                }
                let Some(open) = self.assembler.open_transaction() else {
                    self.raw.clear();
                    self.raw_bytes = 0;
                    return true;
                };
                self.raw_bytes += text.len() as u64;
                if self.raw_bytes > self.options.max_txn_bytes {
                    // Refused before it is kept whole: its lines are not kept either.
                    let e = DebeziumError::Transaction {
                        pos,
                        id: open.to_owned(),
                        reason: format!(
                            "the transaction holds more than {} bytes of source text \
                             (max_txn_bytes); raise the setting or split the transaction",
                            self.options.max_txn_bytes
                        ),
                    };
                    let open = Some(open.to_owned());
                    self.raw.clear();
                    let ok = self.on_error(e, open, text.get());
                    if let Some((_, record)) = &mut self.skipping {
                        // Too large to keep: the record says where it was, not what it held.
                        record.lines.clear();
                        record.bytes = u64::MAX;
                        record.truncated = true;
                    }
                    return ok;
                }
                if self.options.on_error == OnError::Skip {
                    self.raw.push(text.get().to_owned());
                }
                true
            }
            Err(e) => self.on_error(e, open.as_deref().map(str::to_owned), text.get()),
        }
    }

    fn on_error(&mut self, e: DebeziumError, open: Option<String>, line: &str) -> bool {
        // Everything before the bad transaction is replayed and stays.
        if !self.group.is_empty() && !self.submit() {
            return false;
        }
        let id = match &e {
            DebeziumError::Transaction { id, .. } | DebeziumError::CountMismatch { id, .. } => {
                Some(id.clone())
            }
            _ => open.clone(),
        };
        if self.options.on_error == OnError::Stop {
            let txn = id
                .map(|i| format!(" (transaction {i})"))
                .unwrap_or_default();
            self.fail(format!(
                "{e}{txn}; replay stopped before this transaction, every earlier one is visible. \
                 Fix the source or run with --on-error skip"
            ));
            return false;
        }
        let record = |transaction: Option<String>, lines: Vec<String>| DeadLetter {
            position: e.position().to_string(),
            transaction,
            reason: e.to_string(),
            bytes: lines.iter().map(|l| l.len() as u64).sum(),
            truncated: false,
            lines,
        };
        // What to do depends on where the error left the assembler.
        let now_open = self.assembler.open_transaction().map(str::to_owned);
        self.raw_bytes = 0;
        match (open, now_open) {
            // The bad transaction is still open (a change line failed): drop the rest of it, up
            // to its END.
            (Some(before), Some(after)) if before == after => {
                let mut lines = std::mem::take(&mut self.raw);
                lines.push(line.to_owned());
                self.assembler.reset();
                self.skipping = Some((before.clone(), record(Some(before), lines)));
                true
            }
            // The assembler dropped the bad transaction and opened the next one (a BEGIN
            // while the bad one was open): this line starts the new one.
            (dropped, Some(_)) => {
                let lines = std::mem::replace(&mut self.raw, vec![line.to_owned()]);
                self.raw_bytes = line.len() as u64;
                self.dead_letter(record(dropped.or(id), lines))
            }
            // Nothing is open any more (a bad END, or a bad line between transactions).
            (_, None) => {
                let mut lines = std::mem::take(&mut self.raw);
                lines.push(line.to_owned());
                self.dead_letter(record(id, lines))
            }
        }
    }

    fn dead_letter(&mut self, record: DeadLetter) -> bool {
        // Where the record ends in the source: the same on every replay of these lines.
        self.dead_letter_at(record, self.read.offset)
    }

    fn dead_letter_at(&mut self, record: DeadLetter, offset: u64) -> bool {
        let written = write_once(
            &record,
            offset,
            &self.options.dead_letter,
            &mut self.dead_lettered_before,
            self.node,
            &mut self.report,
        );
        match written {
            Ok(()) => true,
            Err(e) => {
                self.fail(format!("{e}; replay stopped"));
                false
            }
        }
    }

    /// With `--on-error skip`, whether a shard refused a transaction this run handed over:
    /// then it goes to the dead-letter file and the run ends asking for a restart (see
    /// [`SinkReport::restart`]).
    fn skip_refused(&mut self) -> bool {
        let failed = self.node.status().failed_ts.load(Ordering::Acquire);
        if self.options.on_error != OnError::Skip || failed == 0 {
            return false;
        }
        let Some(txn) = self.in_flight.iter().find(|t| t.ts == failed) else {
            return false;
        };
        let reason = self.node.status().error().unwrap_or_default();
        let described = format!("{}: {reason}", txn.describe());
        let (lines, truncated) = match &self.options.source {
            SourceSpec::File(p) => match read_span(p, txn.begin, txn.end) {
                Ok(lines) => (lines, false),
                Err(e) => {
                    tracing::warn!("re-reading {} for the dead-letter file: {e}", p.display());
                    (Vec::new(), true)
                }
            },
            // Skipping means replaying from the checkpoint, and stdin cannot be read again (a
            // Kafka source refuses skip at its start).
            SourceSpec::Stdin | SourceSpec::Kafka(_) | SourceSpec::Postgres(_) => {
                self.report.stopped_by = Some(format!(
                    "{described}. With --on-error skip a transaction a shard refused is skipped by \
                     replaying from the checkpoint, which stdin cannot do: replay from a file"
                ));
                return true;
            }
        };
        let record = DeadLetter {
            position: txn.describe(),
            transaction: Some(txn.id.clone()),
            reason: reason.clone(),
            bytes: txn.end - txn.begin,
            truncated,
            lines,
        };
        let (end, source) = (txn.end, txn.describe());
        if self.dead_letter_at(record, end) {
            self.report.restart = Some(format!(
                "{source} was refused ({reason}); it is in the dead-letter file"
            ));
        }
        true
    }

    /// Hands the group to the node; false if the node has stopped, or a shard stopped replay.
    fn submit(&mut self) -> bool {
        if self.skip_refused() {
            return false;
        }
        if let Some(e) = self.node_error() {
            self.report.stopped_by = Some(e);
            return false;
        }
        match self.node.submit(&self.group) {
            Ok(range) => {
                let hwm = self.node.status().hwm.load(Ordering::Acquire);
                while self.in_flight.front().is_some_and(|t| t.ts < hwm) {
                    self.in_flight.pop_front();
                }
                for ((ts, (begin, end, id)), source) in range
                    .clone()
                    .zip(self.spans.drain(..))
                    .zip(self.sources.iter())
                {
                    self.in_flight.push_back(InFlight {
                        ts,
                        begin,
                        end,
                        id,
                        source: source.clone(),
                    });
                }
                self.report.last_ts = Some(*range.end());
                self.report.transactions += self.group.len() as u64;
                self.group.clear();
                self.sources.clear();
                self.submitted = self.group_end;
                self.node
                    .status()
                    .duplicates_skipped
                    .store(self.assembler.duplicates_skipped(), Ordering::Relaxed);
                self.check_caught_up(false);
                self.barrier_if_due();
                true
            }
            Err(e) => {
                self.fail(format!("{}: {e}", self.name));
                false
            }
        }
    }

    /// Puts a checkpoint barrier after everything handed over if the checkpoint interval has
    /// passed since the last (after a group, and while a followed source is quiet, so that a
    /// checkpoint that failed is put again without waiting for more input).
    fn barrier_if_due(&mut self) {
        let assembler = &self.assembler;
        self.barriers.after_group(
            self.node,
            self.options,
            self.submitted,
            || source_state(assembler),
            &mut self.report,
        );
    }

    /// Once every transaction that was in the source when this run opened it has been
    /// handed over (`at_end`: the reader has nothing more now), queries waiting for what the
    /// node showed before a restart may begin once HWM passes the last of them.
    fn check_caught_up(&mut self, at_end: bool) {
        let Some(size) = self.catch_up_at else {
            return;
        };
        if self.group.is_empty()
            && (self.submitted.offset >= size || (at_end && self.read.offset >= size))
        {
            self.node.caught_up(Some(
                self.report.last_ts.unwrap_or(Timestamp::GENESIS.get()),
            ));
            self.catch_up_at = None;
        }
    }

    /// The node's error, if replay stopped there, with where in the source the transaction a
    /// shard refused came from (shards know only its timestamp).
    fn node_error(&self) -> Option<String> {
        let e = self.node.status().error()?;
        let failed = self.node.status().failed_ts.load(Ordering::Acquire);
        Some(
            match self
                .in_flight
                .iter()
                .find(|t| failed != 0 && t.ts == failed)
            {
                Some(t) => format!("{}: {e}", t.describe()),
                None => e,
            },
        )
    }

    fn fail(&mut self, msg: String) {
        // The message says every earlier transaction is visible: make it so before replay is
        // marked stopped (which ends waits for visibility).
        if let Some(ts) = self.report.last_ts {
            self.node.wait_visible(ts, STOP_VISIBLE_WAIT);
        }
        self.node.stop_replay(msg.clone());
        self.report.stopped_by = Some(msg);
    }
}
