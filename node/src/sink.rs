//! The sink: reads a Debezium JSON source, rebuilds its transactions, and hands them to the
//! node in groups. A bad transaction either stops replay (HWM stays before it; everything
//! earlier stays committed and queryable) or, with `--on-error skip`, goes whole to a
//! dead-letter file with the reason, and replay goes on. Never a partial transaction.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use retina_storage::{RowOp, TableOp, Timestamp, Value};

use crate::coordinator::SourceMark;
use crate::debezium::{
    DebeziumError, Message, ParseOptions, Skipped, SourcePosition, TxnAssembler, TxnMode,
    parse_line_with,
};
use crate::node::NodeHandle;

/// Where change events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceSpec {
    File(PathBuf),
    Stdin,
}

impl FromStr for SourceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "stdin" | "-" => Ok(SourceSpec::Stdin),
            _ => match s.strip_prefix("file:") {
                Some(p) if !p.is_empty() => Ok(SourceSpec::File(p.into())),
                _ => Err(format!("source `{s}`: expected `file:PATH` or `stdin`")),
            },
        }
    }
}

/// What to do with a transaction that cannot be replayed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OnError {
    /// Stop replay before it; keep serving what was replayed.
    Stop,
    /// Write it to the dead-letter file and go on.
    Skip,
}

pub struct SinkOptions {
    pub source: SourceSpec,
    /// Keep reading at the end of a file, like `tail -f`.
    pub follow: bool,
    pub mode: TxnMode,
    pub on_error: OnError,
    pub dead_letter: PathBuf,
    pub max_group_txns: usize,
    /// A group closes once open this long.
    pub group_commit_interval: Duration,
    /// How often to put a checkpoint barrier after the group just sent (`None`: never).
    pub checkpoint_interval: Option<Duration>,
    /// Most bytes of source text an open transaction may hold (`max_txn_bytes`).
    pub max_txn_bytes: u64,
}

/// How a sink run ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SinkReport {
    pub lines: u64,
    pub transactions: u64,
    pub dead_lettered: u64,
    pub duplicates_skipped: u64,
    /// The timestamp of the last transaction handed to the node.
    pub last_ts: Option<u64>,
    /// The error that stopped replay, if one did.
    pub stopped_by: Option<String>,
    /// Checkpoint barriers put into the shards' streams.
    pub checkpoints: u64,
    /// With `--on-error skip`, a shard refused a transaction (a duplicate key, a missing row):
    /// it is in the dead-letter file, and the node must restart from its checkpoint and run
    /// the sink again, which then skips it (the shards applied other transactions after it
    /// that may have read what it half wrote). Says which one.
    pub restart: Option<String>,
}

/// How long a follower waits at the end of its file before looking again.
const FOLLOW_POLL: Duration = Duration::from_millis(5);
/// How long the sink's last checkpoint waits for an earlier one to finish.
const FINAL_CHECKPOINT_WAIT: Duration = Duration::from_secs(10);
/// How long a stopping sink waits for what it handed the node to become visible.
const STOP_VISIBLE_WAIT: Duration = Duration::from_secs(10);
/// Read buffer of the source.
const READ_BUFFER_BYTES: usize = 1 << 20;
/// A group also closes once its transactions span this many bytes of source, which bounds a
/// shard's op batch (rkyv's offsets are 32-bit) with [`SinkOptions::max_txn_bytes`].
const MAX_GROUP_SOURCE_BYTES: u64 = 64 << 20;
/// Ids of the most recently applied transactions recorded with each checkpoint: a source
/// that redelivers (Kafka after a consumer restart, Debezium after a connector restart)
/// starts again at most this many transactions back.
const CHECKPOINT_IDS: usize = 8192;

type Ops = Vec<TableOp<Vec<Value>>>;

/// A source opened at its resume position: its name, its reader, and its size then (files).
type OpenedSource = (Arc<str>, Box<dyn Read + Send>, Option<u64>);

/// Runs the sink until the source ends (or, following, until `stop`), or an error stops it.
/// After a restart it resumes where the node's checkpoint was taken (a file is read from that
/// byte; stdin is read from its start and that many bytes are skipped: it must be the same
/// stream), and says once it replayed as far as the source reached before.
pub fn run_sink(node: &NodeHandle, options: &SinkOptions, stop: &AtomicBool) -> SinkReport {
    let resume = node.resume().unwrap_or_default();
    let opened: std::io::Result<OpenedSource> = match &options.source {
        SourceSpec::Stdin => {
            let mut input = std::io::stdin();
            std::io::copy(&mut (&mut input).take(resume.offset), &mut std::io::sink()).map(
                |skipped| {
                    if skipped < resume.offset {
                        tracing::warn!(
                            "stdin ended after {skipped} bytes, before the checkpoint's {}",
                            resume.offset
                        );
                    }
                    (
                        "stdin".into(),
                        Box::new(input) as Box<dyn Read + Send>,
                        None,
                    )
                },
            )
        }
        SourceSpec::File(p) => File::open(p).and_then(|mut f| {
            let size = f.metadata()?.len();
            f.seek(SeekFrom::Start(resume.offset))?;
            Ok((
                p.display().to_string().into(),
                Box::new(f) as Box<dyn Read + Send>,
                Some(size),
            ))
        }),
    };
    let (name, input, size_at_start) = match opened {
        Ok(o) => o,
        Err(e) => {
            let msg = format!("source {}: {e}", source_name(&options.source));
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
        name,
        assembler,
        dead_lettered_before,
        raw_bytes: 0,
        line_start: resume.offset,
        txn_begin: resume.offset,
        spans: Vec::new(),
        in_flight: std::collections::VecDeque::new(),
        group: Vec::new(),
        group_opened: Instant::now(),
        sources: Vec::new(),
        raw: Vec::new(),
        skipping: None,
        report: SinkReport::default(),
        read: resume,
        group_end: resume,
        submitted: resume,
        checkpointed: resume,
        last_checkpoint: Instant::now(),
        catch_up_at: size_at_start,
    };
    sink.report.lines = resume.line;
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, input);
    // Bytes, not a String: a writer may flush in the middle of a UTF-8 character, and only a
    // whole line is decoded.
    let mut line: Vec<u8> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        // Close the group when the source has nothing more buffered (a transaction never waits
        // for the next read to become visible), when it is full, or when it has been open for
        // the group-commit interval.
        if !sink.group.is_empty()
            && (sink.group.len() >= options.max_group_txns
                || sink.group_end.offset - sink.submitted.offset >= MAX_GROUP_SOURCE_BYTES
                || reader.buffer().is_empty()
                || sink.group_opened.elapsed() >= options.group_commit_interval)
            && !sink.submit()
        {
            break;
        }
        let n = match reader.read_until(b'\n', &mut line) {
            Ok(n) => n,
            Err(e) => {
                sink.fail(format!("{}: reading the source: {e}", sink.name));
                break;
            }
        };
        if n == 0 || line.last() != Some(&b'\n') {
            // The end, or a line still being written: keep what was read and look again.
            if !sink.group.is_empty() && !sink.submit() {
                break;
            }
            sink.check_caught_up(true);
            if options.follow {
                if sink.skip_refused() {
                    break;
                }
                std::thread::sleep(FOLLOW_POLL);
                continue;
            }
            if line.is_empty() {
                break;
            }
        }
        sink.report.lines += 1;
        sink.line_start = sink.read.offset;
        sink.read.offset += line.len() as u64;
        sink.read.line = sink.report.lines;
        let ok = match std::str::from_utf8(&line) {
            Ok(text) => sink.on_line(text.trim_end_matches(['\n', '\r'])),
            Err(e) => {
                let pos = SourcePosition::new(sink.name.clone(), sink.report.lines);
                let lossy = String::from_utf8_lossy(&line).trim_end().to_owned();
                let open = sink.assembler.open_transaction().map(str::to_owned);
                let error = DebeziumError::Malformed {
                    pos,
                    reason: format!("not UTF-8: {e}"),
                };
                sink.on_error(error, open, &lossy)
            }
        };
        line.clear();
        if !ok {
            break;
        }
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
            sink.final_checkpoint();
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

fn source_name(source: &SourceSpec) -> String {
    match source {
        SourceSpec::File(p) => p.display().to_string(),
        SourceSpec::Stdin => "stdin".into(),
    }
}

struct Sink<'a> {
    node: &'a NodeHandle,
    options: &'a SinkOptions,
    name: Arc<str>,
    assembler: TxnAssembler,
    group: Vec<Ops>,
    /// When the first transaction of the group arrived.
    group_opened: Instant,
    /// Where each transaction of the group came from, for errors.
    sources: Vec<String>,
    /// The raw lines of the open transaction, for the dead-letter file, and their bytes.
    raw: Vec<String>,
    raw_bytes: u64,
    /// Where the line being read starts in the source, and where the open transaction began.
    line_start: u64,
    txn_begin: u64,
    /// Where each transaction of the group begins and ends in the source.
    spans: Vec<(u64, u64, String)>,
    /// Transactions handed to the node and not yet known to be below HWM.
    in_flight: std::collections::VecDeque<InFlight>,
    /// Where dead-letter records already in the file end in the source, past the resume
    /// position: the same bad transactions met again after a restart are not written twice.
    dead_lettered_before: std::collections::BTreeSet<u64>,
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
    checkpointed: SourceMark,
    last_checkpoint: Instant,
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
    source: String,
}

struct DeadLetter {
    position: String,
    transaction: Option<String>,
    reason: String,
    lines: Vec<String>,
    /// Bytes of `lines`; past `max_txn_bytes` lines are no longer kept.
    bytes: u64,
    /// Lines were left out (the transaction was too large to keep whole).
    truncated: bool,
}

impl DeadLetter {
    fn push(&mut self, line: &str, max_bytes: u64) {
        self.bytes = self.bytes.saturating_add(line.len() as u64);
        if self.bytes <= max_bytes {
            self.lines.push(line.to_owned());
        } else {
            self.truncated = true;
        }
    }
}

/// What the sink records with a checkpoint: the ids of the transactions applied last, so that
/// after a restart a redelivered one is recognised, whatever the source's position says.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
struct SourceState {
    /// Oldest first.
    applied: Vec<String>,
}

impl SourceState {
    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain strings serialize")
    }

    /// The state in `bytes` (empty: none recorded).
    fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            return Ok(SourceState::default());
        }
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

/// The dead-letter file as a restart finds it: where each record in `path` ends in the source, for those past `from` (records of
/// older versions, without an offset, are left alone).
fn dead_letter_offsets(
    path: &std::path::Path,
    from: u64,
) -> Result<std::collections::BTreeSet<u64>, String> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(format!("dead-letter file {}: {e}", path.display())),
    };
    let mut out = std::collections::BTreeSet::new();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|e| format!("dead-letter file {}: {e}", path.display()))?;
        // A record torn by a crash is written again.
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if let Some(offset) = v.get("offset").and_then(serde_json::Value::as_u64)
            && offset > from
        {
            out.insert(offset);
        }
    }
    Ok(out)
}

impl Sink<'_> {
    /// Handles one line; false to stop.
    fn on_line(&mut self, line: &str) -> bool {
        let pos = SourcePosition::new(self.name.clone(), self.report.lines);
        if let Some((id, record)) = &mut self.skipping {
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
        let open = self.assembler.open_transaction().map(str::to_owned);
        if open.is_none() {
            self.txn_begin = self.line_start;
        }
        let catalog = self.node.catalog().clone();
        let lookup = |name: &str| {
            catalog
                .resolve(name)
                .and_then(|id| catalog.get(id).cloned())
        };
        let options = ParseOptions {
            decimal_handling: self.node.decimal_handling(),
        };
        let status = self.node.status();
        let result = parse_line_with(line, &pos, &lookup, &options).and_then(|m| {
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
                let mut ops = Vec::with_capacity(txn.events.len());
                for ev in txn.events {
                    let table = catalog
                        .resolve(ev.table.name())
                        .expect("events name catalog tables");
                    ops.push(TableOp {
                        table,
                        op: RowOp::from(ev.op),
                    });
                }
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
                self.sources
                    .push(format!("{} (transaction {})", txn.begin, txn.id));
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
                self.raw_bytes += line.len() as u64;
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
                    let ok = self.on_error(e, open, line);
                    if let Some((_, record)) = &mut self.skipping {
                        // Too large to keep: the record says where it was, not what it held.
                        record.lines.clear();
                        record.bytes = u64::MAX;
                        record.truncated = true;
                    }
                    return ok;
                }
                self.raw.push(line.to_owned());
                true
            }
            Err(e) => self.on_error(e, open, line),
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
        if self.dead_lettered_before.remove(&offset) {
            // Written by the run before a restart; the transaction is skipped again.
            return true;
        }
        let json = serde_json::json!({
            "position": record.position,
            "offset": offset,
            "transaction": record.transaction,
            "reason": record.reason,
            "lines": record.lines,
            "lines_left_out": record.truncated,
        });
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.options.dead_letter)
            .and_then(|mut f| {
                writeln!(f, "{json}")?;
                f.sync_data()
            });
        match written {
            Ok(()) => {
                self.report.dead_lettered += 1;
                self.node
                    .status()
                    .dead_lettered
                    .fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(e) => {
                self.fail(format!(
                    "dead-letter file {}: {e}; replay stopped",
                    self.options.dead_letter.display()
                ));
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
        let (lines, truncated) = match &self.options.source {
            SourceSpec::File(p) => match read_span(p, txn.begin, txn.end) {
                Ok(lines) => (lines, false),
                Err(e) => {
                    tracing::warn!("re-reading {} for the dead-letter file: {e}", p.display());
                    (Vec::new(), true)
                }
            },
            // Skipping means replaying from the checkpoint, and stdin cannot be read again.
            SourceSpec::Stdin => {
                self.report.stopped_by = Some(format!(
                    "{reason}. With --on-error skip a transaction a shard refused is skipped by \
                     replaying from the checkpoint, which stdin cannot do: replay from a file"
                ));
                return true;
            }
        };
        let record = DeadLetter {
            position: txn.source.clone(),
            transaction: Some(txn.id.clone()),
            reason: reason.clone(),
            bytes: txn.end - txn.begin,
            truncated,
            lines,
        };
        let (end, source) = (txn.end, txn.source.clone());
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
        if let Some(e) = self.node.status().error() {
            self.report.stopped_by = Some(e);
            return false;
        }
        match self.node.submit(&self.group, &self.sources) {
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
                if self
                    .options
                    .checkpoint_interval
                    .is_some_and(|every| self.last_checkpoint.elapsed() >= every)
                {
                    self.checkpoint();
                }
                true
            }
            Err(e) => {
                self.fail(format!("{}: {e}", self.name));
                false
            }
        }
    }

    /// Puts a checkpoint barrier after everything submitted, taken where the source stands
    /// after the last submitted transaction.
    fn checkpoint(&mut self) {
        self.last_checkpoint = Instant::now();
        if self.checkpointed == self.submitted {
            return;
        }
        let state = SourceState {
            applied: self.assembler.recent_applied(CHECKPOINT_IDS),
        };
        match self.node.checkpoint(self.submitted, state.encode()) {
            Ok(Some(_)) => {
                self.checkpointed = self.submitted;
                self.report.checkpoints += 1;
            }
            // One is still on its way; the next group tries again.
            Ok(None) => {}
            Err(e) => tracing::warn!("checkpoint barrier: {e}"),
        }
    }

    /// A checkpoint of everything submitted, waiting for one still on its way to finish first.
    fn final_checkpoint(&mut self) {
        let start = Instant::now();
        while self.checkpointed != self.submitted
            && self.node.status().error().is_none()
            && start.elapsed() < FINAL_CHECKPOINT_WAIT
        {
            self.checkpoint();
            if self.checkpointed != self.submitted {
                std::thread::sleep(FOLLOW_POLL);
            }
        }
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

/// The lines of `path` between byte `begin` and byte `end`.
fn read_span(path: &std::path::Path, begin: u64, end: u64) -> std::io::Result<Vec<String>> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(begin))?;
    let mut bytes = Vec::new();
    f.take(end - begin).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// The transaction marker `line` is, if any: `("BEGIN" | "END", id)`, bare or in an envelope.
fn marker(line: &str) -> Option<(&'static str, String)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let v = v.get("payload").filter(|p| p.is_object()).unwrap_or(&v);
    let status = match v.get("status")?.as_str()? {
        "BEGIN" => "BEGIN",
        "END" => "END",
        _ => return None,
    };
    let id = match v.get("id")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        _ => return None,
    };
    Some((status, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse() {
        assert_eq!("stdin".parse::<SourceSpec>(), Ok(SourceSpec::Stdin));
        assert_eq!(
            "file:/a/b.json".parse::<SourceSpec>(),
            Ok(SourceSpec::File("/a/b.json".into()))
        );
        assert!("kafka:x".parse::<SourceSpec>().is_err());
        assert!("file:".parse::<SourceSpec>().is_err());
    }

    #[test]
    fn markers_are_recognised() {
        let end = |id: &str| Some(("END", id.to_owned()));
        assert_eq!(
            marker(r#"{"status":"END","id":"7","event_count":1}"#),
            end("7")
        );
        assert_eq!(
            marker(r#"{"schema":{},"payload":{"status":"END","id":7}}"#),
            end("7")
        );
        assert_eq!(
            marker(r#"{"status":"BEGIN","id":"7"}"#),
            Some(("BEGIN", "7".into()))
        );
        assert_eq!(marker(r#"{"op":"c"}"#), None);
        assert_eq!(marker("not json"), None);
    }
}
