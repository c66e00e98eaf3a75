//! The sink's run on a Kafka source: open every partition where the checkpoint left it, take
//! records from the partitions the assembler can use, hand complete transactions to the node
//! in groups, and checkpoint each partition's resume offset with the transactions a restart
//! must drop.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use flume::Receiver;
use retina_storage::Timestamp;

use super::assemble::{Handed, KafkaAssembler, KafkaTxn};
use super::fetch::{Fetched, Kafka, Partition};
use super::spec::KafkaSpec;
use crate::coordinator::SourceMark;
use crate::debezium::{SourcePosition, TxnMode};
use crate::node::NodeHandle;
use crate::sink::actor::{CHECKPOINT_IDS, Ops, txn_ops};
use crate::sink::barrier::{Barriers, LAST_CHECKPOINT_WAIT};
use crate::sink::msg::{Inbox, SinkMsg, SinkReport};
use crate::sink::options::{OnError, SinkOptions};
use crate::sink::source::{KafkaState, SourceState};

/// How long the sink waits for a record before it looks at its inbox again.
const POLL: Duration = Duration::from_millis(5);
/// How often topics are listed again for new ones (a table captured later).
const DISCOVER_EVERY: Duration = Duration::from_secs(5);
/// How long the other partitions have nothing more to give before an unreadable record
/// stops replay.
const POISON_GRACE: Duration = Duration::from_millis(200);
/// How long a stopping sink waits for what it handed the node to become visible.
const STOP_VISIBLE_WAIT: Duration = Duration::from_secs(10);

/// Runs the sink on a Kafka source until a [`SinkMsg::Stop`] (or, without `follow`, until it
/// has read what the topics held when it opened them), or an error stops it.
pub(in crate::sink) fn run(
    node: &NodeHandle,
    options: &SinkOptions,
    spec: &KafkaSpec,
    inbox: &Receiver<SinkMsg>,
) -> SinkReport {
    let mut report = SinkReport::default();
    let stop = |report: &mut SinkReport, msg: String| {
        node.stop_replay(msg.clone());
        node.caught_up(None);
        report.stopped_by = Some(msg);
    };
    if options.on_error == OnError::Skip {
        stop(
            &mut report,
            format!(
                "{spec}: --on-error skip is not available with a Kafka source (a skipped \
                 transaction is replayed from the checkpoint, and its events are spread over \
                 partitions); use --on-error stop"
            ),
        );
        return report;
    }
    let resume = node.resume().unwrap_or_default();
    let (state, recent) = match SourceState::decode(node.resume_state()) {
        Ok(s) => (s.kafka.unwrap_or_default(), s.applied),
        Err(e) => {
            stop(&mut report, format!("the checkpoint's source state: {e}"));
            return report;
        }
    };
    let kafka = match Kafka::connect(spec) {
        Ok(k) => k,
        Err(e) => {
            stop(&mut report, e);
            return report;
        }
    };
    let mut sink = KafkaSink {
        node,
        parse: Arc::new(super::super::line_parser(node)),
        options,
        spec,
        inbox: Inbox::new(inbox),
        regex: spec.regex(),
        parts: Vec::new(),
        txn_part: None,
        assembler: KafkaAssembler::new(options.mode, Vec::new(), Vec::new()),
        group: Vec::new(),
        group_ids: Vec::new(),
        group_opened: Instant::now(),
        in_flight: VecDeque::new(),
        submitted: resume,
        barriers: Barriers::new(resume),
        last_discovery: Instant::now(),
        caught_up: false,
        poisoned: None,
        last_took: Instant::now(),
        report,
        kafka,
    };
    sink.report.lines = resume.line;
    if let Err(e) = sink.open(&state, &recent) {
        sink.fail(e);
        return sink.finish();
    }
    let mut turn = 0usize;
    while !sink.stop_asked() {
        let took = match sink.take(&mut turn) {
            Ok(took) => took,
            Err(e) => {
                // Every transaction complete before the error is handed over first.
                if sink.collect().is_ok() && !sink.group.is_empty() && !sink.submit() {
                    break;
                }
                sink.fail(e);
                break;
            }
        };
        if !sink.group.is_empty()
            && (!took
                || sink.group.len() >= options.max_group_txns
                || sink.group_opened.elapsed() >= options.group_commit_interval)
            && !sink.submit()
        {
            break;
        }
        if took {
            continue;
        }
        if sink.last_took.elapsed() >= POISON_GRACE
            && let Some((_, e)) = sink.poisoned.take()
        {
            sink.fail(e);
            break;
        }
        sink.barrier_if_due();
        sink.check_caught_up();
        if sink.caught_up && !options.follow {
            break;
        }
        if sink.last_discovery.elapsed() >= DISCOVER_EVERY
            && let Err(e) = sink.discover(&BTreeMap::new())
        {
            sink.fail(e);
            break;
        }
        sink.wait();
    }
    sink.finish()
}

/// What the sink records with a checkpoint: each partition's resume offset, the transactions
/// a restart from there must drop, and those handed over last.
fn source_state(
    assembler: &mut KafkaAssembler,
    parts: &[(Partition, Arc<str>, Option<String>)],
) -> SourceState {
    let resume = assembler.resume_offsets();
    let name = |i: u32| parts[i as usize].0.name.to_string();
    let handed = assembler.replayable(&resume);
    SourceState {
        applied: assembler.recent(CHECKPOINT_IDS),
        kafka: Some(KafkaState {
            offsets: resume
                .iter()
                .enumerate()
                .map(|(i, o)| (name(i as u32), *o))
                .collect(),
            handed: handed
                .into_iter()
                .map(|(id, at)| (id, at.into_iter().map(|(i, o)| (name(i), o)).collect()))
                .collect(),
        }),
        postgres: None,
    }
}

struct KafkaSink<'a> {
    node: &'a NodeHandle,
    /// Parses a record's text with the node's catalog.
    parse: super::super::decode::Parse,
    options: &'a SinkOptions,
    spec: &'a KafkaSpec,
    inbox: Inbox<'a>,
    regex: Option<regex::Regex>,
    kafka: Kafka,
    /// Every partition read, indexed as the assembler indexes them, with the name positions
    /// give it and the data collection its topic carries (`None`: the transaction topic).
    parts: Vec<(Partition, Arc<str>, Option<String>)>,
    txn_part: Option<usize>,
    assembler: KafkaAssembler,
    group: Vec<Ops>,
    /// Where each transaction of the group began, and its id (for errors).
    group_ids: Vec<(SourcePosition, String)>,
    group_opened: Instant,
    /// Timestamps handed to the node not yet known visible, with their transaction.
    in_flight: VecDeque<(u64, SourcePosition, String)>,
    /// `offset`: transactions handed over since the source's start; `line`: records read.
    submitted: SourceMark,
    barriers: Barriers,
    last_discovery: Instant,
    caught_up: bool,
    /// A record that cannot be read, and its partition: that partition is read no further,
    /// and replay stops once every other has nothing more to give (the transactions that
    /// complete without it are handed over first).
    poisoned: Option<(usize, String)>,
    last_took: Instant,
    report: SinkReport,
}

impl KafkaSink<'_> {
    /// Opens every partition of the source's topics where `state` says, or at its start.
    fn open(&mut self, state: &KafkaState, recent: &[String]) -> Result<(), String> {
        let resume: BTreeMap<&str, i64> = state
            .offsets
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        let mut said = false;
        loop {
            self.discover(&resume)?;
            let has_txn = self.txn_part.is_some() || self.options.mode == TxnMode::NoMetadata;
            if has_txn && self.parts.len() > usize::from(self.txn_part.is_some()) {
                break;
            }
            if !said {
                said = true;
                tracing::info!(
                    "{}: waiting for the connector's topics{}",
                    self.spec,
                    if has_txn {
                        String::new()
                    } else {
                        format!(
                            " (transaction metadata: {}; a connector without \
                             provide.transaction.metadata needs --no-txn-metadata)",
                            self.spec.transaction_topic
                        )
                    }
                );
            }
            for _ in 0..200 {
                if self.stop_asked() {
                    return Ok(());
                }
                std::thread::sleep(POLL);
            }
        }
        let names: BTreeMap<&str, u32> = self
            .parts
            .iter()
            .enumerate()
            .map(|(i, (p, _, _))| (&*p.name, i as u32))
            .collect();
        let handed: Vec<Handed> = state
            .handed
            .iter()
            .map(|(id, at)| {
                let at = at
                    .iter()
                    .filter_map(|(name, o)| names.get(name.as_str()).map(|&i| (i, *o)))
                    .collect();
                (id.clone(), at)
            })
            .collect();
        let next: Vec<i64> = self.assembler.next_offsets().to_vec();
        self.assembler = KafkaAssembler::new(self.options.mode, next, handed);
        self.assembler.remember(recent);
        Ok(())
    }

    /// Lists the topics and opens partitions not read yet (at `resume`'s offset, else at
    /// their start).
    fn discover(&mut self, resume: &BTreeMap<&str, i64>) -> Result<(), String> {
        self.last_discovery = Instant::now();
        let topics = self.kafka.topics()?;
        for (topic, partitions) in topics {
            let is_txn = topic == self.spec.transaction_topic;
            if !is_txn && !self.spec.is_data_topic(&topic, self.regex.as_ref()) {
                continue;
            }
            if is_txn && self.options.mode == TxnMode::NoMetadata {
                continue;
            }
            if is_txn && partitions.len() != 1 {
                return Err(format!(
                    "{}: the transaction topic {topic} has {} partitions; transactions are \
                     ordered only on one",
                    self.spec,
                    partitions.len()
                ));
            }
            for p in partitions {
                let name = format!("{topic}/{p}");
                if self.parts.iter().any(|(q, _, _)| *q.name == *name) {
                    continue;
                }
                let (part, start) =
                    self.kafka
                        .open(&topic, p, resume.get(name.as_str()).copied())?;
                tracing::info!("{}: reading {name} from offset {start}", self.spec);
                let index = self.assembler.add_partition(start) as usize;
                debug_assert_eq!(index, self.parts.len());
                if is_txn {
                    self.txn_part = Some(index);
                }
                let collection = (!is_txn).then(|| self.spec.collection_of(&topic).to_owned());
                self.parts
                    .push((part, format!("kafka:{name}").into(), collection));
                // A partition opened later must be read before the sink says it caught up.
                self.caught_up = false;
            }
        }
        Ok(())
    }

    /// Which partitions the sink takes records from now: all, unless the events held for
    /// later transactions reached `max_buffered`; then only what the oldest open one lacks.
    fn wanted(&self, i: usize) -> bool {
        if self.poisoned.as_ref().is_some_and(|(p, _)| *p == i) {
            return false;
        }
        if self.assembler.waiting() < self.spec.max_buffered {
            return true;
        }
        let carries = |j: usize, lacking: &[&str]| {
            self.parts[j]
                .2
                .as_deref()
                .is_some_and(|c| lacking.contains(&c))
        };
        match self.assembler.head_needs() {
            // A collection no topic is known to carry (a `topics=` name that does not say it):
            // every table topic may hold it.
            Some((_, Some(lacking))) if !(0..self.parts.len()).any(|j| carries(j, &lacking)) => {
                Some(i) != self.txn_part
            }
            Some((_, Some(lacking))) => carries(i, &lacking),
            _ => Some(i) == self.txn_part,
        }
    }

    /// Takes one fetched batch from each wanted partition that has one, starting after the
    /// last one served. True if any came.
    fn take(&mut self, turn: &mut usize) -> Result<bool, String> {
        let n = self.parts.len();
        let mut took = false;
        for k in 0..n {
            let i = (*turn + k) % n;
            if !self.wanted(i) {
                continue;
            }
            let full = self.assembler.waiting() >= self.spec.max_buffered;
            match self.parts[i].0.rx.try_recv() {
                Ok(Fetched::Records(records, high)) => {
                    took = true;
                    self.parts[i].0.high = high;
                    self.last_took = Instant::now();
                    for r in records {
                        match self.on_record(i, r.offset, r.record.value) {
                            Ok(()) => {}
                            Err(Ok(bad)) => {
                                self.poisoned = Some((i, bad));
                                break;
                            }
                            Err(Err(e)) => return Err(e),
                        }
                    }
                    self.collect()?;
                    if full {
                        self.check_buffer()?;
                    }
                }
                Ok(Fetched::Failed(e)) => return Err(e),
                Err(flume::TryRecvError::Empty) => {}
                Err(flume::TryRecvError::Disconnected) => {
                    return Err(format!("{}: its fetch task ended", self.parts[i].0.name));
                }
            }
        }
        *turn = turn.wrapping_add(1);
        if took {
            let next = self.assembler.next_offsets();
            let lag: i64 = (self.parts.iter().enumerate())
                .map(|(i, (p, _, _))| (p.high - next[i]).max(0))
                .sum();
            self.node
                .status()
                .source_lag
                .store(lag as u64, Ordering::Relaxed);
        }
        Ok(took)
    }

    /// Once the events held for later transactions reached `max_buffered`, the sink reads only
    /// what the oldest open transaction lacks; if that still brings more of later ones, the
    /// buffer is too small for the source's skew (an error).
    fn check_buffer(&self) -> Result<(), String> {
        let waiting = self.assembler.waiting();
        if waiting <= self.spec.max_buffered {
            return Ok(());
        }
        let head = match self.assembler.head_needs() {
            Some((id, Some(lacking))) => {
                format!(
                    "transaction {id} still lacks events of {}",
                    lacking.join(", ")
                )
            }
            Some((id, None)) => format!("transaction {id} waits for its END"),
            None => "the next transaction's BEGIN has not arrived".into(),
        };
        Err(format!(
            "{}: {waiting} events of later transactions are held while {head}, more than \
             max_buffered={}; raise it in the source URL (each held event costs memory), or \
             check that every partition is being written",
            self.spec, self.spec.max_buffered
        ))
    }

    /// Reads one record into the assembler. `Err(Ok(e))`: the record cannot be read;
    /// `Err(Err(e))`: the transactions it belongs to cannot be rebuilt.
    fn on_record(
        &mut self,
        i: usize,
        offset: i64,
        value: Option<Vec<u8>>,
    ) -> Result<(), Result<String, String>> {
        self.report.lines += 1;
        let pos = SourcePosition::new(self.parts[i].1.clone(), offset.max(0) as u64);
        let Some(value) = value else {
            // A tombstone (a null value after a delete, for log compaction).
            return self
                .assembler
                .push(
                    i as u32,
                    offset,
                    crate::debezium::Message::Tombstone { pos },
                )
                .map_err(|e| Err(e.to_string()));
        };
        let text = std::str::from_utf8(&value).map_err(|e| Ok(format!("{pos}: not UTF-8: {e}")))?;
        let msg = (self.parse)(text, &pos).map_err(|e| Ok(e.to_string()))?;
        self.assembler
            .push(i as u32, offset, msg)
            .map_err(|e| Err(e.to_string()))
    }

    /// Moves the complete transactions into the group.
    fn collect(&mut self) -> Result<(), String> {
        while let Some(txn) = self.assembler.pop().map_err(|e| e.to_string())? {
            let KafkaTxn {
                id, events, begin, ..
            } = txn;
            if self.group.is_empty() {
                self.group_opened = Instant::now();
            }
            self.group.push(txn_ops(self.node.catalog(), events));
            self.group_ids.push((begin, id));
        }
        Ok(())
    }

    /// Hands the group to the node; false if replay stopped.
    fn submit(&mut self) -> bool {
        if let Some(e) = self.node_error() {
            self.report.stopped_by = Some(e);
            return false;
        }
        match self.node.submit(&self.group) {
            Ok(range) => {
                let hwm = self.node.status().hwm.load(Ordering::Acquire);
                while self.in_flight.front().is_some_and(|t| t.0 < hwm) {
                    self.in_flight.pop_front();
                }
                for (ts, (pos, id)) in range.clone().zip(self.group_ids.drain(..)) {
                    self.in_flight.push_back((ts, pos, id));
                }
                self.report.last_ts = Some(*range.end());
                self.report.transactions += self.group.len() as u64;
                self.submitted.offset += self.group.len() as u64;
                self.submitted.line = self.report.lines;
                self.group.clear();
                self.node
                    .status()
                    .duplicates_skipped
                    .store(self.assembler.duplicates_skipped(), Ordering::Relaxed);
                self.barrier_if_due();
                true
            }
            Err(e) => {
                self.fail(format!("{}: {e}", self.spec));
                false
            }
        }
    }

    /// Once every partition was read as far as it reached when opened, queries waiting for
    /// what the node showed before a restart may begin.
    fn check_caught_up(&mut self) {
        if self.caught_up || !self.group.is_empty() {
            return;
        }
        let next = self.assembler.next_offsets();
        if self
            .parts
            .iter()
            .enumerate()
            .all(|(i, (p, _, _))| next[i] >= p.end_at_open)
        {
            self.caught_up = true;
            self.node.caught_up(Some(
                self.report.last_ts.unwrap_or(Timestamp::GENESIS.get()),
            ));
        }
    }

    /// Whether a [`SinkMsg::Stop`] arrived (now or before).
    fn stop_asked(&mut self) -> bool {
        self.inbox.stop_asked()
    }

    /// Puts a checkpoint barrier after everything handed over if the checkpoint interval has
    /// passed since the last (after a group, and while the topics are quiet, so that a
    /// checkpoint that failed is put again without waiting for more records).
    fn barrier_if_due(&mut self) {
        let (assembler, parts) = (&mut self.assembler, &self.parts);
        self.barriers.after_group(
            self.node,
            self.options,
            self.submitted,
            || source_state(assembler, parts),
            &mut self.report,
        );
    }

    /// Waits up to [`POLL`] for a fetched batch.
    fn wait(&self) {
        let _ = self.kafka.wake.recv_timeout(POLL);
    }

    /// The node's error, with the transaction a shard refused when it is one of these.
    fn node_error(&self) -> Option<String> {
        let e = self.node.status().error()?;
        let failed = self.node.status().failed_ts.load(Ordering::Acquire);
        Some(
            match self.in_flight.iter().find(|t| failed != 0 && t.0 == failed) {
                Some((_, pos, id)) => format!("{pos} (transaction {id}): {e}"),
                None => e,
            },
        )
    }

    fn fail(&mut self, msg: String) {
        if let Some(ts) = self.report.last_ts {
            self.node.wait_visible(ts, STOP_VISIBLE_WAIT);
        }
        let msg = format!("{msg}; replay stopped, every transaction before it is visible",);
        self.node.stop_replay(msg.clone());
        self.report.stopped_by = Some(msg);
    }

    /// Ends the run: hands over what is complete and checkpoints it (when checkpoints are on).
    fn finish(mut self) -> SinkReport {
        if self.report.stopped_by.is_none() {
            if !self.group.is_empty() {
                self.submit();
            }
            if self.report.stopped_by.is_none() && self.options.checkpoint_interval.is_some() {
                let (assembler, parts) = (&mut self.assembler, &self.parts);
                self.barriers.last(
                    self.node,
                    self.submitted,
                    || source_state(assembler, parts),
                    &mut self.report,
                    LAST_CHECKPOINT_WAIT,
                );
            }
        }
        if !self.caught_up {
            self.node.caught_up(Some(
                self.report.last_ts.unwrap_or(Timestamp::GENESIS.get()),
            ));
        }
        self.report.duplicates_skipped = self.assembler.duplicates_skipped();
        self.node
            .status()
            .source_done
            .store(true, Ordering::Release);
        self.report
    }
}
