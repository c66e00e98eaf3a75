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
}

/// How long a follower waits at the end of its file before looking again.
const FOLLOW_POLL: Duration = Duration::from_millis(5);
/// How long the sink's last checkpoint waits for an earlier one to finish.
const FINAL_CHECKPOINT_WAIT: Duration = Duration::from_secs(10);
/// Read buffer of the source.
const READ_BUFFER_BYTES: usize = 1 << 20;

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
            node.status().fail(msg.clone());
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
    let mut sink = Sink {
        node,
        options,
        name,
        assembler: TxnAssembler::new(options.mode),
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
                std::thread::sleep(FOLLOW_POLL);
                continue;
            }
            if line.is_empty() {
                break;
            }
        }
        sink.report.lines += 1;
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
    if sink.report.stopped_by.is_none() {
        // A bad transaction whose END never came still goes to the dead-letter file.
        if let Some((_, mut record)) = sink.skipping.take() {
            record.reason += "; the source ended before its END";
            sink.dead_letter(record);
        }
        if !sink.group.is_empty() {
            sink.submit();
        }
        // A restart after this one starts here.
        if sink.report.stopped_by.is_none() && sink.options.checkpoint_interval.is_some() {
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
    /// The raw lines of the open transaction, for the dead-letter file.
    raw: Vec<String>,
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

struct DeadLetter {
    position: String,
    transaction: Option<String>,
    reason: String,
    lines: Vec<String>,
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
                    record.lines.push(line.to_owned());
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
                    record.lines.push(line.to_owned());
                    return true;
                }
            }
        }
        let open = self.assembler.open_transaction().map(str::to_owned);
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
                }
                if self.assembler.open_transaction().is_some() {
                    self.raw.push(line.to_owned());
                } else {
                    self.raw.clear();
                }
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
            lines,
        };
        // What to do depends on where the error left the assembler.
        let now_open = self.assembler.open_transaction().map(str::to_owned);
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
        let json = serde_json::json!({
            "position": record.position,
            "transaction": record.transaction,
            "reason": record.reason,
            "lines": record.lines,
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

    /// Hands the group to the node; false if the node has stopped, or a shard stopped replay.
    fn submit(&mut self) -> bool {
        if let Some(e) = self.node.status().error() {
            self.report.stopped_by = Some(e);
            return false;
        }
        match self.node.submit(&self.group, &self.sources) {
            Ok(range) => {
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
        match self.node.checkpoint(self.submitted) {
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
        self.node.status().fail(msg.clone());
        self.report.stopped_by = Some(msg);
    }
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
