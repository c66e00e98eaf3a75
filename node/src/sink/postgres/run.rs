//! The sink's run on a Postgres source: on the first run, create the slot and copy the
//! publication's tables at its snapshot; then stream its transactions, hand them to the node
//! in groups, and confirm a position to Postgres only once a checkpoint holding it is durable.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use flume::Receiver;
use pgwire_replication::{Lsn, ReplicationEvent};
use retina_storage::{RowOp, TableOp, Timestamp};

use super::pgoutput::{self, Datum, PgMessage};
use super::rows::{Image, Mapping};
use super::session::{Session, Streaming, column_text, ident};
use super::spec::PostgresSpec;
use crate::coordinator::SourceMark;
use crate::debezium::key_only;
use crate::node::NodeHandle;
use crate::sink::actor::Ops;
use crate::sink::barrier::{Barriers, LAST_CHECKPOINT_WAIT};
use crate::sink::dead_letter::{DeadLetter, dead_letter_offsets, write_once};
use crate::sink::msg::{Inbox, SinkMsg, SinkReport};
use crate::sink::options::{OnError, SinkOptions};
use crate::sink::source::{PostgresState, SourceState};

/// How long the sink waits for an event before it looks at its inbox and its group again.
const POLL: Duration = Duration::from_millis(5);
/// Rows of a table copied per mirror transaction on the first run.
const COPY_ROWS: usize = 10_000;
/// The longest wait between two tries to connect again after the connection broke.
const RECONNECT_MAX: Duration = Duration::from_secs(30);
/// How long a stopping sink waits for what it handed the node to become visible.
const STOP_VISIBLE_WAIT: Duration = Duration::from_secs(10);
/// How long the first run waits for the checkpoint after the copy.
const COPY_CHECKPOINT_WAIT: Duration = Duration::from_secs(120);
/// Postgres's SQLSTATE for an object in use: a slot another session holds.
const OBJECT_IN_USE: &str = "55006";
/// The file in the data directory naming the slot this node created and has not yet
/// checkpointed from: a restart during the copy drops it and copies again.
const SLOT_MARKER: &str = "postgres-slot-created";

/// Runs the sink on a Postgres source until a [`SinkMsg::Stop`] (or, without `follow`, until
/// it has read what the server had written when it connected), or an error stops it.
pub(in crate::sink) fn run(
    node: &NodeHandle,
    options: &SinkOptions,
    spec: &PostgresSpec,
    inbox: &Receiver<SinkMsg>,
) -> SinkReport {
    let mut sink = PgSink::new(node, options, spec, inbox);
    match sink.open() {
        Ok(Some(stream)) => sink.stream(stream),
        Ok(None) => {}
        Err(e) => sink.fail(e),
    }
    sink.finish()
}

/// A transaction being read.
struct OpenTxn {
    xid: u32,
    ops: Ops,
    /// Bytes of values read, against `max_txn_bytes`.
    bytes: u64,
    /// Why it cannot be replayed, with the first change that showed it.
    error: Option<String>,
    /// What it does, for the dead-letter file (while within `max_txn_bytes`).
    described: DeadLetter,
}

/// A transaction handed to the node and not yet known visible.
struct InFlight {
    ts: u64,
    end_lsn: u64,
    xid: u32,
}

struct PgSink<'a> {
    node: &'a NodeHandle,
    options: &'a SinkOptions,
    spec: &'a PostgresSpec,
    inbox: Inbox<'a>,
    /// Every transaction ending at or before this was applied before (the checkpoint's).
    resume_lsn: u64,
    /// Relations by oid, as the stream described them last.
    relations: HashMap<u32, Result<Mapping, String>>,
    open: Option<OpenTxn>,
    group: Vec<Ops>,
    group_ids: Vec<(u64, u32)>,
    group_opened: Instant,
    /// End of the last transaction read whole (handed over, skipped or dead-lettered).
    read_lsn: u64,
    /// End of the last transaction handed to the node (what a checkpoint now records).
    handed_lsn: u64,
    in_flight: VecDeque<InFlight>,
    /// Checkpoints put, with the position each records, oldest first: once one is complete
    /// its position is confirmed to Postgres.
    pending_acks: VecDeque<(u64, u64)>,
    /// The position of the newest complete checkpoint (with checkpoints off: of what is
    /// visible).
    durable_lsn: u64,
    /// How far the server has sent, as its last keepalive said.
    sent_lsn: u64,
    /// The position last confirmed to Postgres.
    confirmed_lsn: u64,
    /// End of the last transaction handed to the node with operations (one that a restart
    /// before its checkpoint would need again).
    needed_lsn: u64,
    /// The first run's copy is under way: nothing of it may be checkpointed before it ends.
    copying: bool,
    submitted: SourceMark,
    barriers: Barriers,
    /// Dead-letter records a run before a restart wrote, by where they end.
    dead_lettered_before: BTreeSet<u64>,
    /// Where the server's WAL was when this run connected; once read so far, the sink has
    /// caught up.
    catch_up_at: Option<u64>,
    report: SinkReport,
}

/// `lsn` as Postgres writes it (`0/16B3748`).
fn lsn(l: u64) -> String {
    Lsn::from_u64(l).to_string()
}

impl<'a> PgSink<'a> {
    fn new(
        node: &'a NodeHandle,
        options: &'a SinkOptions,
        spec: &'a PostgresSpec,
        inbox: &'a Receiver<SinkMsg>,
    ) -> Self {
        let resume = node.resume().unwrap_or_default();
        let report = SinkReport {
            lines: resume.line,
            ..Default::default()
        };
        PgSink {
            node,
            options,
            spec,
            inbox: Inbox::new(inbox),
            resume_lsn: 0,
            relations: HashMap::new(),
            open: None,
            group: Vec::new(),
            group_ids: Vec::new(),
            group_opened: Instant::now(),
            read_lsn: 0,
            handed_lsn: 0,
            in_flight: VecDeque::new(),
            pending_acks: VecDeque::new(),
            durable_lsn: 0,
            sent_lsn: 0,
            confirmed_lsn: 0,
            needed_lsn: 0,
            copying: false,
            submitted: resume,
            barriers: Barriers::new(resume),
            dead_lettered_before: BTreeSet::new(),
            catch_up_at: None,
            report,
        }
    }

    /// What a checkpoint taken now records.
    fn state(&self) -> impl FnMut() -> SourceState + use<> {
        let (slot, lsn) = (self.spec.slot.clone(), self.handed_lsn);
        move || SourceState {
            postgres: Some(PostgresState {
                slot: slot.clone(),
                lsn,
            }),
            ..Default::default()
        }
    }

    /// Connects where the checkpoint left off, or, on the first run, creates the slot and
    /// copies the tables. `None`: stopped before streaming.
    fn open(&mut self) -> Result<Option<Streaming>, String> {
        let state = SourceState::decode(self.node.resume_state())
            .map_err(|e| format!("the checkpoint's source state: {e}"))?;
        let marker = self.node.data_dir().join(SLOT_MARKER);
        let session = match state.postgres {
            Some(pg) => {
                if pg.slot != self.spec.slot {
                    return Err(format!(
                        "{}: the checkpoint was taken reading slot `{}`, not `{}`; a node's \
                         data directory follows one slot",
                        self.spec, pg.slot, self.spec.slot
                    ));
                }
                self.resume_lsn = pg.lsn;
                self.read_lsn = pg.lsn;
                self.handed_lsn = pg.lsn;
                self.durable_lsn = pg.lsn;
                self.confirmed_lsn = pg.lsn;
                self.needed_lsn = pg.lsn;
                self.dead_lettered_before = dead_letter_offsets(&self.options.dead_letter, pg.lsn)?;
                let at = Lsn::from_u64(pg.lsn);
                let mut session = Session::connect(self.spec, at, at)?;
                if session.slot_plugin()?.is_none() {
                    return Err(format!(
                        "{}: slot `{}` is gone, and with it the changes after the checkpoint \
                         (at {}); start over with an empty data directory to copy the tables \
                         again",
                        self.spec,
                        self.spec.slot,
                        lsn(pg.lsn)
                    ));
                }
                // A restart after the copy's checkpoint: the slot is this node's for good.
                let _ = std::fs::remove_file(&marker);
                session
            }
            None if self.node.resume().is_some() => {
                return Err(format!(
                    "{}: the data directory holds a checkpoint taken from another source; \
                     start a Postgres source with an empty data directory",
                    self.spec
                ));
            }
            None => match self.copy(&marker)? {
                Some(session) => session,
                None => return Ok(None),
            },
        };
        let mut session = session;
        self.catch_up_at = Some(session.wal_position()?.as_u64());
        tracing::info!(
            "{}: streaming from {} (the server is at {})",
            self.spec,
            lsn(self.resume_lsn),
            lsn(self.catch_up_at.unwrap_or(0))
        );
        match session.start() {
            Ok(stream) => Ok(Some(stream)),
            // The slot is still held by the session of a run that ended without closing it (a
            // crash, a machine gone), until the server notices: wait for it as after a broken
            // connection.
            Err(e) if e.contains(&format!("SQLSTATE {OBJECT_IN_USE}")) => {
                Ok(self.connect_again(&e))
            }
            Err(e) => Err(e),
        }
    }

    /// The first run: creates the slot and copies every table of the publication at the
    /// slot's snapshot, in transactions of [`COPY_ROWS`] rows, then checkpoints at the slot's
    /// start. `None`: stopped during the copy (a restart copies again).
    fn copy(&mut self, marker: &std::path::Path) -> Result<Option<Session>, String> {
        let zero = Lsn::from_u64(0);
        let mut session = Session::connect(self.spec, zero, zero)?;
        session.check_version()?;
        session.check_publication()?;
        let tables = session.publication_tables()?;
        let catalog = self.node.catalog().clone();
        let mut mappings = Vec::with_capacity(tables.len());
        for (schema, table, filter) in &tables {
            let id = catalog
                .resolve(&format!("{schema}.{table}"))
                .ok_or_else(|| {
                    format!(
                        "{}: table {schema}.{table} is in the publication but not in the catalog \
                     (--schema); add it, or take it out of the publication",
                        self.spec
                    )
                })?;
            // A row filter copies only the rows the stream would carry.
            let filter = if filter.is_empty() {
                String::new()
            } else {
                format!(" WHERE {filter}")
            };
            mappings.push((Mapping::identity(&catalog, id), schema, table, filter));
        }
        if let Some(plugin) = session.slot_plugin()? {
            let ours = std::fs::read_to_string(marker).is_ok_and(|s| s.trim() == self.spec.slot);
            if !ours {
                return Err(format!(
                    "{}: slot `{}` exists ({plugin}) but this node did not create it; the first \
                     run creates its slot to copy the tables consistently with it. Choose \
                     another slot name, or drop it: SELECT pg_drop_replication_slot('{}')",
                    self.spec, self.spec.slot, self.spec.slot
                ));
            }
            tracing::warn!(
                "{}: a copy into this data directory was cut short; dropping slot `{}` and \
                 copying again",
                self.spec,
                self.spec.slot
            );
            session.query(&format!(
                "DROP_REPLICATION_SLOT {} WAIT",
                ident(&self.spec.slot)
            ))?;
        }
        write_marker(marker, &self.spec.slot).map_err(|e| format!("{}: {e}", marker.display()))?;
        self.copying = true;
        session.query("BEGIN READ ONLY ISOLATION LEVEL REPEATABLE READ")?;
        let created = session.query(&format!(
            "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput (SNAPSHOT 'use')",
            ident(&self.spec.slot)
        ))?;
        let start = created
            .first()
            .and_then(|r| column_text(r, 1))
            .and_then(|text| Lsn::parse(&text).ok())
            .ok_or_else(|| format!("{}: CREATE_REPLICATION_SLOT gave no position", self.spec))?;
        tracing::info!(
            "{}: created slot `{}` at {start}; copying {} tables",
            self.spec,
            self.spec.slot,
            mappings.len()
        );
        for (mapping, schema, table, filter) in &mappings {
            let columns: Vec<String> = mapping
                .schema
                .columns()
                .iter()
                .map(|c| ident(&c.name))
                .collect();
            session.query(&format!(
                "DECLARE retina_copy NO SCROLL CURSOR FOR SELECT {} FROM {}.{}{filter}",
                columns.join(", "),
                ident(schema),
                ident(table)
            ))?;
            loop {
                if self.stop_asked() {
                    return Ok(None);
                }
                let rows = session.query(&format!("FETCH FORWARD {COPY_ROWS} FROM retina_copy"))?;
                if rows.is_empty() {
                    break;
                }
                let mut ops = Vec::with_capacity(rows.len());
                for row in &rows {
                    let tuple: Vec<Datum> = row
                        .iter()
                        .map(|v| v.as_deref().map_or(Datum::Null, Datum::Text))
                        .collect();
                    let values = mapping.row(&tuple, Image::New, None).map_err(|e| {
                        format!(
                            "{}: copying {schema}.{table} at the slot's snapshot ({start}): {e}",
                            self.spec
                        )
                    })?;
                    ops.push(TableOp {
                        table: mapping.table,
                        op: RowOp::Insert(values),
                    });
                }
                self.report.lines += rows.len() as u64;
                if self.group.is_empty() {
                    self.group_opened = Instant::now();
                }
                self.group.push(ops);
                self.group_ids.push((start.as_u64(), 0));
                if self.group.len() >= self.options.max_group_txns.min(8) && !self.submit(false) {
                    return Ok(None);
                }
            }
            session.query("CLOSE retina_copy")?;
        }
        session.query("COMMIT")?;
        // Every table empty: one empty transaction marks the copy, so that a checkpoint can
        // record it (without one a restart would copy again).
        if self.submitted == SourceMark::default() && self.group.is_empty() {
            self.group.push(Vec::new());
            self.group_ids.push((start.as_u64(), 0));
        }
        if !self.group.is_empty() && !self.submit(false) {
            return Ok(None);
        }
        // The copy is durable before anything streams: a restart never copies again.
        self.copying = false;
        self.read_lsn = start.as_u64();
        self.handed_lsn = start.as_u64();
        self.resume_lsn = start.as_u64();
        // The slot starts there: confirmed already.
        self.confirmed_lsn = start.as_u64();
        // Checkpoints off: a restart copies again (the marker stays).
        if self.options.checkpoint_interval.is_some() {
            let (submitted, state) = (self.submitted, self.state());
            let complete = self.barriers.last(
                self.node,
                submitted,
                state,
                &mut self.report,
                COPY_CHECKPOINT_WAIT,
            );
            if !complete {
                return Err(self.node_error().unwrap_or_else(|| {
                    format!(
                        "{}: the checkpoint after the copy did not complete in {:?}",
                        self.spec, COPY_CHECKPOINT_WAIT
                    )
                }));
            }
            let _ = std::fs::remove_file(marker);
            self.durable_lsn = start.as_u64();
        }
        tracing::info!(
            "{}: copied {} rows in {} transactions",
            self.spec,
            self.report.lines,
            self.report.transactions
        );
        Ok(Some(session))
    }

    /// Streams until stopped, caught up (without `follow`) or an error.
    fn stream(&mut self, mut stream: Streaming) {
        let mut wait = POLL;
        while !self.stop_asked() {
            self.confirm_durable(&stream);
            let event = {
                let Streaming { rt, client } = &mut stream;
                rt.block_on(async { tokio::time::timeout(wait, client.recv()).await })
            };
            wait = POLL;
            match event {
                // Nothing more now: the group goes.
                Err(_) => {
                    if !self.group.is_empty() && !self.submit(true) {
                        return;
                    }
                    if self.node_stopped() {
                        return;
                    }
                    self.barrier_if_due();
                    if self.caught_up_now(None) && !self.options.follow {
                        return;
                    }
                }
                // The connection broke (a server restart, a failover, the network): what is
                // complete is handed over, and the stream resumes after it on a new one.
                Ok(result @ (Err(_) | Ok(None))) => {
                    let why = match result {
                        Err(e) => e.to_string(),
                        _ => "the server ended replication".to_owned(),
                    };
                    if !self.group.is_empty() && !self.submit(true) {
                        return;
                    }
                    self.open = None;
                    match self.reconnect(stream, &why) {
                        Some(s) => stream = s,
                        None => return,
                    }
                }
                Ok(Ok(Some(event))) => match self.on_event(event) {
                    Ok(committed) => {
                        if !self.group.is_empty()
                            && (self.group.len() >= self.options.max_group_txns
                                || self.group_opened.elapsed()
                                    >= self.options.group_commit_interval)
                            && !self.submit(true)
                        {
                            return;
                        }
                        // After a commit, see at once whether more is there.
                        if committed {
                            wait = Duration::ZERO;
                        }
                    }
                    Err(e) => {
                        self.hand_over_then_fail(e);
                        return;
                    }
                },
            }
        }
    }

    /// Connects again after `why` ended the stream, starting after the last transaction read
    /// whole, and retrying with backoff (up to 30 s apart) until it works, a stop is asked, or
    /// the slot is gone. `None`: the run ends.
    fn reconnect(&mut self, old: Streaming, why: &str) -> Option<Streaming> {
        drop(old);
        self.connect_again(why)
    }

    /// Connects and starts streaming after the last transaction read whole, retrying with
    /// backoff as [`Self::reconnect`] says.
    fn connect_again(&mut self, why: &str) -> Option<Streaming> {
        let (start, ack) = (
            Lsn::from_u64(self.read_lsn),
            Lsn::from_u64(self.confirmed_lsn),
        );
        let mut backoff = Duration::from_millis(250);
        loop {
            tracing::warn!(
                "{}: {why}; connecting again in {backoff:?} to stream from {start}",
                self.spec
            );
            let until = Instant::now() + backoff;
            while Instant::now() < until {
                if self.stop_asked() {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            backoff = (backoff * 2).min(RECONNECT_MAX);
            let attempt = Session::connect(self.spec, start, ack).and_then(|mut session| {
                match session.slot_plugin()? {
                    Some(_) => Ok(session),
                    None => Err(format!("slot `{}` is gone", self.spec.slot)),
                }
            });
            match attempt {
                Ok(session) => match session.start() {
                    Ok(streaming) => {
                        tracing::info!("{}: streaming again from {start}", self.spec);
                        return Some(streaming);
                    }
                    // E.g. the slot is still held by the session that broke, until the server
                    // notices it is gone.
                    Err(e) => tracing::warn!("{e}"),
                },
                Err(e) if e.contains("is gone") => {
                    self.fail(format!("{}: {e}", self.spec));
                    return None;
                }
                Err(e) => tracing::warn!("{e}"),
            }
        }
    }

    /// Reads one event. True after a commit.
    fn on_event(&mut self, event: ReplicationEvent) -> Result<bool, String> {
        match event {
            ReplicationEvent::Begin { final_lsn, xid, .. } => {
                if self.open.is_some() {
                    return Err(format!(
                        "{}: transaction {xid} began at {} inside another",
                        self.spec,
                        lsn(final_lsn.as_u64())
                    ));
                }
                self.open = Some(OpenTxn {
                    xid,
                    ops: Vec::new(),
                    bytes: 0,
                    error: None,
                    described: DeadLetter {
                        position: format!("{} at {}", self.spec, lsn(final_lsn.as_u64())),
                        transaction: Some(xid.to_string()),
                        reason: String::new(),
                        lines: Vec::new(),
                        bytes: 0,
                        truncated: false,
                    },
                });
                Ok(false)
            }
            ReplicationEvent::XLogData {
                wal_start,
                wal_end,
                data,
                ..
            } => {
                self.node.status().source_lag_wal_bytes.store(
                    wal_end.as_u64().saturating_sub(wal_start.as_u64()),
                    Ordering::Relaxed,
                );
                self.on_change(wal_start.as_u64(), &data)?;
                Ok(false)
            }
            ReplicationEvent::Commit { end_lsn, .. } => {
                self.on_commit(end_lsn.as_u64())?;
                Ok(true)
            }
            ReplicationEvent::KeepAlive { wal_end, .. } => {
                self.sent_lsn = self.sent_lsn.max(wal_end.as_u64());
                if self.open.is_none() {
                    self.node.status().source_lag_wal_bytes.store(
                        wal_end.as_u64().saturating_sub(self.read_lsn),
                        Ordering::Relaxed,
                    );
                }
                self.caught_up_now(Some(wal_end.as_u64()));
                Ok(false)
            }
            ReplicationEvent::Message { .. } | ReplicationEvent::StoppedAt { .. } => Ok(false),
        }
    }

    /// Reads one pgoutput message of the open transaction (or a relation between them).
    fn on_change(&mut self, at: u64, data: &[u8]) -> Result<(), String> {
        let msg = match pgoutput::decode(data) {
            Ok(m) => m,
            Err(e) => {
                let e = format!("{}: at {}: {e}", self.spec, lsn(at));
                return match self.open.as_mut() {
                    Some(txn) => {
                        txn.error.get_or_insert(e);
                        Ok(())
                    }
                    None => Err(e),
                };
            }
        };
        if let PgMessage::Relation(rel) = msg {
            let mapping = Mapping::new(self.node.catalog(), &rel);
            self.relations.insert(rel.oid, mapping);
            return Ok(());
        }
        if matches!(msg, PgMessage::Ignored(_)) {
            return Ok(());
        }
        let Some(mut txn) = self.open.take() else {
            return Err(format!(
                "{}: a change at {} outside a transaction",
                self.spec,
                lsn(at)
            ));
        };
        self.report.lines += 1;
        let bytes = data.len() as u64;
        txn.bytes += bytes;
        if txn.error.is_none() {
            if let Err(e) = self.change_ops(&msg, &mut txn.ops) {
                txn.error = Some(format!(
                    "{} at {} (transaction {}): {e}",
                    self.spec,
                    lsn(at),
                    txn.xid
                ));
            } else if txn.bytes > self.options.max_txn_bytes {
                txn.error = Some(format!(
                    "{} at {} (transaction {}): the transaction holds more than {} bytes of \
                     changes (max_txn_bytes); raise the setting or split the transaction",
                    self.spec,
                    lsn(at),
                    txn.xid,
                    self.options.max_txn_bytes
                ));
                txn.ops = Vec::new();
            }
        }
        if self.options.on_error == OnError::Skip {
            txn.described
                .push(&describe(&msg, &self.relations), self.options.max_txn_bytes);
        }
        self.open = Some(txn);
        Ok(())
    }

    /// The operations of one change.
    fn change_ops(&self, msg: &PgMessage<'_>, ops: &mut Ops) -> Result<(), String> {
        let mapping = |rel: &u32| -> Result<&Mapping, String> {
            match self.relations.get(rel) {
                Some(Ok(m)) => Ok(m),
                Some(Err(e)) => Err(e.clone()),
                None => Err(format!("relation {rel} was never described")),
            }
        };
        let in_table = |m: &Mapping, e: String| format!("table {}: {e}", m.name);
        match msg {
            PgMessage::Insert { rel, new } => {
                let m = mapping(rel)?;
                let row = m.row(new, Image::New, None).map_err(|e| in_table(m, e))?;
                ops.push(TableOp {
                    table: m.table,
                    op: RowOp::Insert(row),
                });
            }
            PgMessage::Update { rel, old, new } => {
                let m = mapping(rel)?;
                let full_old = old
                    .as_ref()
                    .filter(|(kind, _)| *kind == pgoutput::OldImage::Full)
                    .map(|(_, t)| t.as_slice());
                let after = m
                    .row(new, Image::New, full_old)
                    .map_err(|e| in_table(m, e))?;
                let before = match old {
                    Some((_, t)) => m.row(t, Image::Old, None).map_err(|e| in_table(m, e))?,
                    // The key did not change: the new row's key is the old one's.
                    None => key_only(&m.schema, &after),
                };
                ops.push(TableOp {
                    table: m.table,
                    op: RowOp::Update { before, after },
                });
            }
            PgMessage::Delete { rel, old } => {
                let m = mapping(rel)?;
                let row = m
                    .row(&old.1, Image::Old, None)
                    .map_err(|e| in_table(m, e))?;
                ops.push(TableOp {
                    table: m.table,
                    op: RowOp::Delete(row),
                });
            }
            PgMessage::Truncate { rels, .. } => {
                for rel in rels {
                    ops.push(TableOp {
                        table: mapping(rel)?.table,
                        op: RowOp::Truncate,
                    });
                }
            }
            PgMessage::Begin { .. }
            | PgMessage::Commit { .. }
            | PgMessage::Relation(_)
            | PgMessage::Ignored(_) => {}
        }
        Ok(())
    }

    /// Closes the open transaction: into the group, skipped as already applied, or, if it
    /// cannot be replayed, dead-lettered (`--on-error skip`) or the end of replay.
    fn on_commit(&mut self, end_lsn: u64) -> Result<(), String> {
        let Some(txn) = self.open.take() else {
            return Err(format!(
                "{}: a commit ending at {} without a BEGIN",
                self.spec,
                lsn(end_lsn)
            ));
        };
        if end_lsn <= self.resume_lsn {
            // Applied before the checkpoint this run started from.
            self.report.duplicates_skipped += 1;
            self.node
                .status()
                .duplicates_skipped
                .store(self.report.duplicates_skipped, Ordering::Relaxed);
            return Ok(());
        }
        self.read_lsn = end_lsn;
        if self.dead_lettered_before.remove(&end_lsn) {
            // A shard refused it before a restart; it is in the dead-letter file.
            tracing::warn!(
                "{}: transaction {} ending at {} was dead-lettered before the restart; skipped",
                self.spec,
                txn.xid,
                lsn(end_lsn)
            );
            return Ok(());
        }
        if let Some(reason) = txn.error {
            if self.options.on_error == OnError::Stop {
                return Err(reason);
            }
            let mut record = txn.described;
            record.reason = reason;
            return if self.dead_letter(record, end_lsn) {
                Ok(())
            } else {
                Err(self.report.stopped_by.take().unwrap_or_default())
            };
        }
        if txn.ops.is_empty() {
            return Ok(());
        }
        if self.group.is_empty() {
            self.group_opened = Instant::now();
        }
        self.group.push(txn.ops);
        self.group_ids.push((end_lsn, txn.xid));
        self.needed_lsn = end_lsn;
        Ok(())
    }

    /// Writes a dead-letter record ending at `end_lsn`, unless a run before a restart did.
    /// False if it could not be written (replay stops).
    fn dead_letter(&mut self, record: DeadLetter, end_lsn: u64) -> bool {
        let written = write_once(
            &record,
            end_lsn,
            &self.options.dead_letter,
            &mut self.dead_lettered_before,
            self.node,
            &mut self.report,
        );
        match written {
            Ok(()) => true,
            Err(e) => {
                self.report.stopped_by = Some(e);
                false
            }
        }
    }

    /// With `--on-error skip`, whether a shard refused a transaction this run handed over: it
    /// goes to the dead-letter file and the run ends asking for a restart, which skips it.
    fn skip_refused(&mut self) -> bool {
        let failed = self.node.status().failed_ts.load(Ordering::Acquire);
        if self.options.on_error != OnError::Skip || failed == 0 {
            return false;
        }
        // A copied batch (no transaction id) cannot be skipped: the copy is one whole.
        let Some(txn) = self.in_flight.iter().find(|t| t.ts == failed && t.xid != 0) else {
            return false;
        };
        let (end_lsn, xid) = (txn.end_lsn, txn.xid);
        // The shard records which transaction just before why.
        let asked = Instant::now();
        let reason = loop {
            match self.node.status().error() {
                Some(e) => break e,
                None if asked.elapsed() < Duration::from_secs(1) => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                None => break "refused by a shard".to_owned(),
            }
        };
        let position = format!("{} ending at {}", self.spec, lsn(end_lsn));
        let record = DeadLetter {
            position: position.clone(),
            transaction: Some(xid.to_string()),
            reason: reason.clone(),
            lines: Vec::new(),
            bytes: 0,
            truncated: true,
        };
        if self.dead_letter(record, end_lsn) {
            self.report.restart = Some(format!(
                "{position} (transaction {xid}) was refused ({reason}); it is in the \
                 dead-letter file"
            ));
        }
        true
    }

    /// Hands the group to the node, and puts a checkpoint barrier after it when one is due
    /// (`barrier`); false if replay stopped.
    fn submit(&mut self, barrier: bool) -> bool {
        if self.node_stopped() {
            return false;
        }
        match self.node.submit(&self.group) {
            Ok(range) => {
                let hwm = self.node.status().hwm.load(Ordering::Acquire);
                while self.in_flight.front().is_some_and(|t| t.ts < hwm) {
                    self.in_flight.pop_front();
                }
                for (ts, (end_lsn, xid)) in range.clone().zip(self.group_ids.drain(..)) {
                    self.in_flight.push_back(InFlight { ts, end_lsn, xid });
                }
                self.report.last_ts = Some(*range.end());
                self.report.transactions += self.group.len() as u64;
                self.submitted.offset += self.group.len() as u64;
                self.submitted.line = self.report.lines;
                self.group.clear();
                self.handed_lsn = self.read_lsn;
                if barrier {
                    self.barrier_if_due();
                }
                true
            }
            Err(e) => {
                self.fail(format!("{}: {e}", self.spec));
                false
            }
        }
    }

    /// Puts a checkpoint barrier after everything handed over if the checkpoint interval has
    /// passed since the last (after a group, and while the stream is quiet, so that the last
    /// transactions before a pause are checkpointed and confirmed too).
    fn barrier_if_due(&mut self) {
        if let Some(id) = self.barriers.after_group(
            self.node,
            self.options,
            self.submitted,
            self.state(),
            &mut self.report,
        ) {
            self.pending_acks.push_back((id, self.handed_lsn));
        }
    }

    /// Whether replay stopped in the node (a shard refused a transaction): with `--on-error
    /// skip` the run ends asking for a restart, otherwise with the error.
    fn node_stopped(&mut self) -> bool {
        if self.skip_refused() {
            return true;
        }
        if let Some(e) = self.node_error() {
            self.report.stopped_by = Some(e);
            return true;
        }
        false
    }

    /// Confirms to Postgres the position of every checkpoint now complete: the slot keeps
    /// everything after it, and a restart from that checkpoint finds it there. With
    /// checkpoints off a restart copies again, so what is visible is confirmed.
    fn confirm_durable(&mut self, stream: &Streaming) {
        let mut confirmed = None;
        if self.options.checkpoint_interval.is_none() {
            let hwm = self.node.status().hwm.load(Ordering::Acquire);
            while self.in_flight.front().is_some_and(|t| t.ts < hwm) {
                confirmed = self.in_flight.pop_front().map(|t| t.end_lsn);
            }
        }
        let complete = self.node.status().checkpoint_id.load(Ordering::Acquire);
        while self
            .pending_acks
            .front()
            .is_some_and(|(id, _)| *id <= complete)
        {
            confirmed = self.pending_acks.pop_front().map(|(_, l)| l);
        }
        if let Some(l) = confirmed {
            self.durable_lsn = self.durable_lsn.max(l);
        }
        // Idle, with everything read durable: what the server has sent since holds nothing for
        // this publication (other tables, other databases), and the slot need not keep it.
        let idle = self.open.is_none()
            && self.group.is_empty()
            && self.pending_acks.is_empty()
            && self.needed_lsn <= self.durable_lsn;
        let target = if idle {
            self.durable_lsn.max(self.sent_lsn)
        } else {
            self.durable_lsn
        };
        if target > self.confirmed_lsn {
            self.confirmed_lsn = target;
            stream.client.update_applied_lsn(Lsn::from_u64(target));
        }
    }

    /// Whether everything the server had when this run connected was read and handed over
    /// (telling the node so the first time). `wal_end`: how far a keepalive says the server
    /// has sent.
    fn caught_up_now(&mut self, wal_end: Option<u64>) -> bool {
        let Some(target) = self.catch_up_at else {
            return true;
        };
        let read = self.read_lsn.max(wal_end.unwrap_or(0));
        if self.open.is_none() && self.group.is_empty() && read >= target {
            self.catch_up_at = None;
            self.node.caught_up(Some(
                self.report.last_ts.unwrap_or(Timestamp::GENESIS.get()),
            ));
            return true;
        }
        false
    }

    /// Whether a [`SinkMsg::Stop`] arrived (now or before).
    fn stop_asked(&mut self) -> bool {
        self.inbox.stop_asked()
    }

    /// The node's error, with the transaction a shard refused when it is one of these.
    fn node_error(&self) -> Option<String> {
        let e = self.node.status().error()?;
        let failed = self.node.status().failed_ts.load(Ordering::Acquire);
        Some(
            match self
                .in_flight
                .iter()
                .find(|t| failed != 0 && t.ts == failed)
            {
                Some(t) => format!(
                    "{} ending at {} (transaction {}): {e}",
                    self.spec,
                    lsn(t.end_lsn),
                    t.xid
                ),
                None => e,
            },
        )
    }

    /// Hands over the transactions read whole before an error, then stops replay with it.
    fn hand_over_then_fail(&mut self, msg: String) {
        if !self.group.is_empty() && !self.submit(true) {
            return;
        }
        self.fail(msg);
    }

    fn fail(&mut self, msg: String) {
        if self.report.stopped_by.is_some() || self.report.restart.is_some() {
            return;
        }
        if let Some(ts) = self.report.last_ts {
            self.node.wait_visible(ts, STOP_VISIBLE_WAIT);
        }
        let msg = format!("{msg}; replay stopped, every transaction before it is visible");
        self.node.stop_replay(msg.clone());
        self.report.stopped_by = Some(msg);
    }

    /// Ends the run: hands over what is complete and checkpoints it (when checkpoints are
    /// on). Postgres learns of that last checkpoint on the next run.
    fn finish(mut self) -> SinkReport {
        // A copy cut short is never checkpointed: the next run drops the slot and copies again.
        if self.report.stopped_by.is_none() && self.report.restart.is_none() && !self.copying {
            if !self.group.is_empty() {
                self.submit(false);
            }
            if self.report.stopped_by.is_none() && self.options.checkpoint_interval.is_some() {
                self.handed_lsn = self.read_lsn;
                self.barriers.last(
                    self.node,
                    self.submitted,
                    self.state(),
                    &mut self.report,
                    LAST_CHECKPOINT_WAIT,
                );
            }
        }
        if self.catch_up_at.is_some() || self.report.stopped_by.is_some() {
            self.node.caught_up(Some(
                self.report.last_ts.unwrap_or(Timestamp::GENESIS.get()),
            ));
        }
        self.node
            .status()
            .source_done
            .store(true, Ordering::Release);
        self.report
    }
}

/// Writes the slot marker durably.
fn write_marker(path: &std::path::Path, slot: &str) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(slot.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    crate::durable::sync_dir(path.parent().unwrap_or(std::path::Path::new("/")))
}

/// One change as a dead-letter line: its kind, table and values as Postgres sent them.
fn describe(msg: &PgMessage<'_>, relations: &HashMap<u32, Result<Mapping, String>>) -> String {
    let name = |rel: &u32| match relations.get(rel) {
        Some(Ok(m)) => m.name.clone(),
        _ => format!("relation {rel}"),
    };
    let tuple = |t: &[Datum<'_>]| {
        let values: Vec<serde_json::Value> = t
            .iter()
            .map(|d| match d {
                Datum::Null => serde_json::Value::Null,
                Datum::Unchanged => "(unchanged TOAST)".into(),
                Datum::Text(b) => String::from_utf8_lossy(b).into_owned().into(),
                Datum::Binary(b) => format!("({} binary bytes)", b.len()).into(),
            })
            .collect();
        serde_json::Value::from(values)
    };
    let json = match msg {
        PgMessage::Insert { rel, new } => {
            serde_json::json!({"op": "insert", "table": name(rel), "new": tuple(new)})
        }
        PgMessage::Update { rel, old, new } => serde_json::json!({
            "op": "update", "table": name(rel),
            "old": old.as_ref().map(|(_, t)| tuple(t)), "new": tuple(new),
        }),
        PgMessage::Delete { rel, old } => {
            serde_json::json!({"op": "delete", "table": name(rel), "old": tuple(&old.1)})
        }
        PgMessage::Truncate { rels, .. } => serde_json::json!({
            "op": "truncate", "tables": rels.iter().map(name).collect::<Vec<_>>(),
        }),
        other => serde_json::json!({ "op": format!("{other:?}") }),
    };
    json.to_string()
}
