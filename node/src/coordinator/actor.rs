//! The coordinator actor: one glommio task on core 0 that owns [`CoordinatorState`] and
//! answers every [`CoordMsg`] in arrival order. Each arm of [`CoordinatorActor::on_message`]
//! is one call; the state's invariants are checked after every message in debug builds.
//!
//! It never waits on a shard: what it tells the shards goes on each shard's control queue
//! with `try_send` (bounded; a shard that stopped taking them fails the node), so the shards,
//! which report to it, can never deadlock with it.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use retina_storage::{TableId, Timestamp};

use super::error::BeginRefused;
use super::msg::CoordMsg;
use super::persist::{Persisted, SOURCE_STATE_FILE, SourceMark, StateFile, checkpoint_dir};
use super::plan::PlanFile;
use super::query::{
    LOCAL, MAX_QUERIES_PER_CONNECTION, MAX_RUNNING_QUERIES, Owner, QueryId, QueryTicket,
};
use super::state::CoordinatorState;
use crate::cluster::{MetaStore, SaveError};
use crate::lake::{CATALOG_OBJECT, LakeCheckpoints, RECORD_OBJECT};
use crate::settings::Settings;
use crate::shard::{ShardMsg, Watermarks};
use crate::status::NodeStatus;

/// Messages from the coordinator that may wait for one shard (query begins and ends and
/// visibility checkpoints, four at most per running query, and watermarks). The shard serves
/// them before its data queue, so in practice the queue is nearly empty; it fills only when a
/// shard stopped.
pub const CONTROL_QUEUE: usize = 4 * MAX_RUNNING_QUERIES as usize + 64;

type BeginReply = flume::Sender<Result<QueryTicket, BeginRefused>>;

pub struct CoordinatorActor {
    state: CoordinatorState,
    /// Where the state is kept durable: the state file, or the cluster's metadata store.
    store: Box<dyn MetaStore>,
    /// The store did not answer the last write (logged once until it does).
    store_down: bool,
    data_dir: PathBuf,
    /// A remote lake, which receives a copy of every checkpoint (`None`: a local lake).
    lake: Option<LakeCheckpoints>,
    /// Checkpoints that failed: their folders (and objects in a remote lake) go once a later
    /// one completes, when no shard can still be writing into them.
    abandoned: Vec<u64>,
    status: Arc<NodeStatus>,
    /// Every shard's control queue.
    shards: Vec<flume::Sender<ShardMsg>>,
    lease_ms: u64,
    /// A query running this long gets a visibility checkpoint (0: never).
    long_query_ms: u64,
    /// How long a begin waits for HWM to catch up after a restart.
    query_wait: Duration,
    /// The key of query secrets (random per run): a secret is a keyed hash of the query id,
    /// which no client can compute.
    secrets: std::hash::RandomState,
    /// Begins that came before HWM was back where a query saw it before the restart. Each
    /// waits at most `query_wait`, then is refused with a typed error.
    waiting: Vec<(Owner, BeginReply, Instant)>,
    /// HWM moved since it was last persisted.
    dirty: bool,
    /// The watermarks the shards were last sent.
    sent: Watermarks,
}

impl CoordinatorActor {
    pub fn new(
        state: CoordinatorState,
        store: Box<dyn MetaStore>,
        data_dir: PathBuf,
        lake: Option<LakeCheckpoints>,
        status: Arc<NodeStatus>,
        shards: Vec<flume::Sender<ShardMsg>>,
        settings: &Settings,
    ) -> Self {
        let sent = Watermarks {
            hwm: state.hwm(),
            lwm: state.lwm().get(),
            retain_lwm: state.retain_lwm().get(),
            checkpoint_id: state.checkpoint().map_or(0, |c| c.id),
        };
        CoordinatorActor {
            state,
            store,
            store_down: false,
            data_dir,
            lake,
            abandoned: Vec::new(),
            status,
            shards,
            lease_ms: settings.query_lease_ms,
            long_query_ms: settings.long_query_ms,
            query_wait: Duration::from_millis(settings.query_wait_ms),
            secrets: std::hash::RandomState::new(),
            waiting: Vec::new(),
            dirty: false,
            sent,
        }
    }

    /// Serves `rx` until [`CoordMsg::Stop`]; `own` feeds the timer's ticks back in.
    pub async fn run(
        mut self,
        rx: flume::Receiver<CoordMsg>,
        own: flume::Sender<CoordMsg>,
        tick_every: Duration,
    ) {
        // Timers never act: they send a tick into the actor.
        glommio::spawn_local(async move {
            loop {
                glommio::timer::sleep(tick_every).await;
                if own.send_async(CoordMsg::Tick).await.is_err() {
                    break;
                }
            }
        })
        .detach();
        while let Ok(msg) = rx.recv_async().await {
            if !self.on_message(msg).await {
                break;
            }
            if cfg!(debug_assertions) {
                self.state.check_invariants();
            }
        }
    }

    /// Handles one message; false once the actor stops.
    async fn on_message(&mut self, msg: CoordMsg) -> bool {
        match msg {
            CoordMsg::Applied { shard, ts } => self.on_applied(shard, ts),
            CoordMsg::Failed { error } => self.status.fail(error),
            CoordMsg::ShardFailed { shard, ts, error } => self.on_shard_failed(shard, ts, error),
            CoordMsg::CaughtUp { ts } => self.state.caught_up(ts),
            CoordMsg::ReplayStopped => self.state.replay_stopped(),
            CoordMsg::BeginCheckpoint {
                source,
                source_state,
                reply,
            } => self.on_begin_checkpoint(source, source_state, reply).await,
            CoordMsg::CheckpointDone { id, shard, ok } => {
                self.on_checkpoint_done(id, shard, ok).await
            }
            CoordMsg::BeginQuery { owner, reply } => self.on_begin_query(owner, reply),
            CoordMsg::RenewQuery { owner, id, reply } => self.on_renew_query(owner, id, reply),
            CoordMsg::EndQuery { owner, id, reply } => self.on_end_query(owner, id, reply),
            CoordMsg::ConnectionClosed { owner } => self.on_connection_closed(owner),
            CoordMsg::FileAdded { table, file } => self.state.file_added(table, file),
            CoordMsg::FileReplaced {
                table,
                old,
                new,
                from,
            } => self.state.file_replaced(table, old, new, from),
            CoordMsg::VisCheckpointDone { query, shard, ok } => {
                self.on_vis_checkpoint_done(query, shard, ok)
            }
            CoordMsg::Plan {
                owner,
                id,
                table,
                reply,
            } => self.on_plan(owner, id, table, reply),
            CoordMsg::ShardRestarted { shard } => {
                tracing::info!(
                    "shard {shard} starts again from the newest checkpoint; HWM stays at {} \
                     until it catches up",
                    self.state.hwm().get()
                );
                match self.state.shard_restarted(shard) {
                    Ok(ended) => {
                        if !ended.is_empty() {
                            tracing::warn!(
                                "{} running queries end: shard {shard} starts again",
                                ended.len()
                            );
                        }
                        self.queries_ended(ended);
                    }
                    Err(e) => self.status.fail(format!("coordinator: {e}")),
                }
            }
            CoordMsg::Tick => self.on_tick().await,
            CoordMsg::Stop { reply } => return self.on_stop(reply).await,
        }
        self.after_message();
        true
    }

    fn on_applied(&mut self, shard: u16, ts: Timestamp) {
        if let Some(a) = self.status.shard_applied.get(usize::from(shard)) {
            a.fetch_max(ts.get(), Ordering::Relaxed);
        }
        match self.state.applied(shard, ts) {
            Ok(Some(hwm)) => {
                self.status.hwm.store(hwm.get().get(), Ordering::Release);
                self.status
                    .txns_applied
                    .store(self.state.applied_this_run(), Ordering::Relaxed);
                self.publish();
                self.dirty = true;
            }
            Ok(None) => {}
            Err(e) => self.status.fail(format!("coordinator: {e}")),
        }
    }

    fn on_shard_failed(&mut self, shard: u16, ts: Timestamp, error: String) {
        let _ = self.status.failed_ts.compare_exchange(
            0,
            ts.get(),
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        self.status.fail(format!(
            "shard {shard} stopped at the transaction with timestamp {ts}: {error}; HWM stays \
             below it and every earlier transaction stays visible"
        ));
        self.state.replay_stopped();
    }

    /// Begins a checkpoint and writes the sink's state into its folder, durably before any
    /// shard confirms (so before the record that makes the checkpoint complete).
    async fn on_begin_checkpoint(
        &mut self,
        source: SourceMark,
        source_state: Vec<u8>,
        reply: flume::Sender<Option<super::persist::CheckpointRecord>>,
    ) {
        let record = self.state.begin_checkpoint(source);
        if let Some(r) = record {
            let dir = checkpoint_dir(&self.data_dir, r.id);
            // The folder's entry in checkpoints/ is made durable too.
            let made = std::fs::create_dir_all(&dir)
                .and_then(|()| crate::durable::sync_dir(dir.parent().expect("checkpoints/<id>")));
            let written = match made {
                Ok(()) => {
                    crate::durable::write_file(&dir.join(SOURCE_STATE_FILE), &source_state).await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = written {
                self.status.fail(format!(
                    "coordinator: writing checkpoint {}: {e}",
                    dir.display()
                ));
                self.state.checkpoint_done(r.id, 0, false);
                let _ = reply.send(None);
                return;
            }
        }
        let _ = reply.send(record);
    }

    async fn on_checkpoint_done(&mut self, id: u64, shard: u16, ok: bool) {
        let Some(record) = self.state.checkpoint_done(id, shard, ok) else {
            // Other shards may still be writing their images of it: its folder goes once a
            // later checkpoint completes.
            if !ok {
                self.abandon(id);
            }
            return;
        };
        let p = self.state.persisted_with(record);
        // A remote lake gets the checkpoint's record last, after every image (the shards
        // uploaded theirs before confirming): from then on a node on any machine may start
        // from it, so it is complete before the local record, and only a complete checkpoint
        // lets the shards delete what older ones read.
        if let Some(lake) = &self.lake
            && let Err(e) = self.upload_checkpoint(lake, &p).await
        {
            tracing::warn!(
                "checkpoint {} not uploaded to the lake, so it does not complete (the next \
                 one tries again): {e}",
                record.id
            );
            self.state.checkpoint_done(record.id, 0, false);
            self.abandon(record.id);
            return;
        }
        // The commit point: from here on a restart starts from this checkpoint.
        if !self.persist(p).await {
            self.state.checkpoint_done(record.id, 0, false);
            self.abandon(record.id);
            return;
        }
        let replaced = self.state.checkpoint_recorded(record);
        // The checkpoint it replaced (and any that failed since) goes before the new one is
        // published, so that a published checkpoint is the only one on disk (and in a remote
        // lake). Every shard confirmed this one, so none is still writing an older one.
        let old = replaced.map(|c| c.id).into_iter();
        for id in old.chain(std::mem::take(&mut self.abandoned)) {
            let dir = checkpoint_dir(&self.data_dir, id);
            if let Err(e) = std::fs::remove_dir_all(&dir)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("removing {}: {e}", dir.display());
            }
            if let Some(lake) = &self.lake
                && let Err(e) = lake.delete(id).await
            {
                // Harmless: a newer complete checkpoint is there, and the next start
                // deletes every other one.
                tracing::warn!("deleting checkpoint {id} from the lake: {e}");
            }
        }
        self.status
            .checkpoint_id
            .store(record.id, Ordering::Release);
        self.status
            .checkpoint_ts
            .store(record.ts.get(), Ordering::Release);
        // Objects only the replaced checkpoint read may go now.
        self.send_watermarks();
        tracing::debug!("checkpoint {} at {} is complete", record.id, record.ts);
    }

    /// Checkpoint `id` failed: its folder goes once a later one completes, and the sink,
    /// seeing it in the status, puts its barrier again.
    fn abandon(&mut self, id: u64) {
        if self.abandoned.contains(&id) {
            return;
        }
        self.abandoned.push(id);
        self.status
            .checkpoint_failed_id
            .fetch_max(id, Ordering::AcqRel);
        self.status
            .checkpoints_failed
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Puts checkpoint `p`'s source state and catalog in the lake, then its record.
    async fn upload_checkpoint(&self, lake: &LakeCheckpoints, p: &Persisted) -> Result<(), String> {
        let record = p.checkpoint.expect("a checkpoint to upload");
        let dir = checkpoint_dir(&self.data_dir, record.id);
        let read = |path: PathBuf| {
            std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))
        };
        let source_state = read(dir.join(SOURCE_STATE_FILE))?;
        let catalog = read(self.data_dir.join("catalog.txt"))?;
        lake.put(record.id, SOURCE_STATE_FILE, source_state.into())
            .await?;
        lake.put(record.id, CATALOG_OBJECT, catalog.into()).await?;
        lake.put(record.id, RECORD_OBJECT, StateFile::encode(p).into())
            .await
    }

    fn on_begin_query(&mut self, owner: Owner, reply: BeginReply) {
        if self.state.ready() {
            self.begin_query(owner, reply);
        } else if let Some(refused) = waiting_refused(&self.waiting, owner) {
            let _ = reply.send(Err(refused));
        } else {
            self.waiting
                .push((owner, reply, Instant::now() + self.query_wait));
        }
    }

    /// Begins `owner`'s query, tells every shard's scan service and answers at once: shards
    /// learn of a query and of its end in the order the coordinator sends them, on one queue,
    /// and a scan call that comes before the shard took the query waits for it there.
    fn begin_query(&mut self, owner: Owner, reply: BeginReply) {
        let (id, snapshot) = match self.state.begin_query(owner, now_ms(), self.lease_ms) {
            Ok(q) => q,
            Err(refused) => {
                let _ = reply.send(Err(refused));
                return;
            }
        };
        self.publish();
        let secret = self.secret(id);
        self.to_shards(|| ShardMsg::QueryBegun {
            query: id,
            snapshot,
            secret,
        });
        let _ = reply.send(Ok(QueryTicket {
            id,
            snapshot,
            secret,
        }));
    }

    fn on_renew_query(
        &mut self,
        owner: Owner,
        id: QueryId,
        reply: flume::Sender<Option<QueryTicket>>,
    ) {
        let ticket = self
            .state
            .renew_query(owner, id, now_ms(), self.lease_ms)
            .map(|snapshot| QueryTicket {
                id,
                snapshot,
                secret: self.secret(id),
            });
        let _ = reply.send(ticket);
    }

    fn on_end_query(&mut self, owner: Owner, id: QueryId, reply: Option<flume::Sender<bool>>) {
        let running = self.state.end_query(owner, id);
        if let Some(reply) = reply {
            let _ = reply.send(running);
        }
        self.queries_ended(if running { vec![id] } else { Vec::new() });
    }

    fn on_connection_closed(&mut self, owner: Owner) {
        self.waiting.retain(|(o, _, _)| *o != owner);
        let ended = self.state.end_owner(owner);
        self.queries_ended(ended);
    }

    fn on_vis_checkpoint_done(&mut self, query: QueryId, shard: u16, ok: bool) {
        if !ok {
            tracing::warn!(
                "shard {shard} could not write the visibility checkpoint of query {query}: it \
                 keeps holding LWM"
            );
        }
        if self.state.vis_checkpoint_done(query, ok) {
            tracing::info!("query {query} reads from its visibility checkpoint");
        }
        self.long_queries();
        self.publish();
    }

    fn on_plan(
        &mut self,
        owner: Owner,
        id: QueryId,
        table: TableId,
        reply: flume::Sender<Option<(Timestamp, Vec<PlanFile>)>>,
    ) {
        let _ = reply.send(self.state.plan(owner, id, table, now_ms(), self.lease_ms));
    }

    /// Refuses begins that waited too long, expires leases, retires replaced files, sends the
    /// shards the watermarks, and persists HWM if it moved.
    async fn on_tick(&mut self) {
        let now = Instant::now();
        let state = &self.state;
        self.waiting.retain(|(_, reply, deadline)| {
            if now < *deadline {
                return true;
            }
            let _ = reply.send(Err(state.catching_up()));
            false
        });
        let expired = self.state.expire_queries(now_ms());
        self.queries_ended(expired);
        self.state.retire_files();
        self.publish();
        self.send_watermarks();
        if self.dirty && self.persist(self.state.persisted()).await {
            self.dirty = false;
        }
    }

    async fn on_stop(&mut self, reply: flume::Sender<()>) -> bool {
        self.persist(self.state.persisted()).await;
        let _ = reply.send(());
        false
    }

    /// After every message: the checkpoint gauge, and the begins that waited for HWM once it
    /// is back.
    fn after_message(&mut self) {
        self.status
            .checkpoint_in_progress
            .store(self.state.checkpoint_pending(), Ordering::Relaxed);
        if !self.waiting.is_empty() && self.state.ready() {
            for (owner, reply, _) in std::mem::take(&mut self.waiting) {
                self.begin_query(owner, reply);
            }
        }
    }

    /// Persists `p` durably (direct I/O on this core, then the cluster's store, if any). A
    /// store that does not answer is tried again at the next tick; any other failure (the
    /// local file, or another node leading) poisons the node.
    async fn persist(&mut self, p: Persisted) -> bool {
        match self.store.save(&p).await {
            Ok(()) => {
                if std::mem::take(&mut self.store_down) {
                    tracing::info!("coordinator: the metadata store answers again");
                }
                self.state.persisted_hwm(p);
                true
            }
            Err(SaveError::Unavailable(e)) => {
                if !std::mem::replace(&mut self.store_down, true) {
                    tracing::warn!(
                        "coordinator: {e}; checkpoints do not complete until it answers"
                    );
                }
                false
            }
            Err(SaveError::Fenced(e) | SaveError::Fatal(e)) => {
                self.status.failed_here.store(true, Ordering::Release);
                self.status.fail(format!(
                    "coordinator: {e}; the node stops rather than lose state"
                ));
                false
            }
        }
    }

    /// The gauges the coordinator owns.
    fn publish(&self) {
        let s = &self.status;
        s.running_queries
            .store(self.state.running_queries() as u64, Ordering::Relaxed);
        s.vis_checkpoints
            .store(self.state.vis_checkpointed() as u64, Ordering::Relaxed);
        s.lwm.store(self.state.lwm().get().get(), Ordering::Release);
        s.retain_lwm
            .store(self.state.retain_lwm().get().get(), Ordering::Release);
    }

    /// Sends every shard the watermarks, if they moved since they were last sent.
    fn send_watermarks(&mut self) {
        let now = Watermarks {
            hwm: self.state.hwm(),
            lwm: self.state.lwm().get(),
            retain_lwm: self.state.retain_lwm().get(),
            checkpoint_id: self.state.checkpoint().map_or(0, |c| c.id),
        };
        if now != self.sent {
            self.sent = now;
            self.to_shards(|| ShardMsg::Watermarks(now));
        }
    }

    /// Puts `msg()` on every shard's control queue; returns how many shards got it (a shard
    /// that stopped gets nothing). A full queue means a shard stopped serving it: the node
    /// fails rather than buffer without bound or wait on a shard that reports to it.
    fn to_shards(&self, msg: impl Fn() -> ShardMsg) -> usize {
        let mut told = 0;
        for (id, s) in self.shards.iter().enumerate() {
            match s.try_send(msg()) {
                Ok(()) => told += 1,
                Err(flume::TrySendError::Full(_)) => self.status.fail(format!(
                    "shard {id} stopped taking the coordinator's messages ({CONTROL_QUEUE} \
                     waiting); the node stops"
                )),
                Err(flume::TrySendError::Disconnected(_)) => {}
            }
        }
        told
    }

    /// Asks the shards for visibility checkpoints of queries that ran long, and to drop those
    /// of queries that ended.
    fn long_queries(&mut self) {
        if self.long_query_ms > 0 {
            for (query, snapshot) in self
                .state
                .start_vis_checkpoints(now_ms(), self.long_query_ms)
            {
                tracing::info!(
                    "query {query} at snapshot {snapshot} ran {} ms or longer: taking its \
                     visibility checkpoint",
                    self.long_query_ms
                );
                self.to_shards(|| ShardMsg::VisCheckpoint { query, snapshot });
            }
        }
        for query in self.state.take_vis_to_drop() {
            self.to_shards(|| ShardMsg::DropVisCheckpoint { query });
        }
    }

    /// Tells every shard's scan service that `ended` queries ended.
    fn queries_ended(&mut self, ended: Vec<QueryId>) {
        for query in ended {
            self.to_shards(|| ShardMsg::QueryEnded { query });
        }
        self.long_queries();
        self.publish();
    }

    /// Query `id`'s secret.
    fn secret(&self, id: QueryId) -> u64 {
        std::hash::BuildHasher::hash_one(&self.secrets, id)
    }
}

/// Begins waiting for the node to catch up count toward the caps on running queries: a
/// connection may not queue more than it may run.
fn waiting_refused<T>(waiting: &[(Owner, T, Instant)], owner: Owner) -> Option<BeginRefused> {
    if owner == LOCAL {
        return None;
    }
    let mine = waiting.iter().filter(|(o, _, _)| *o == owner).count();
    if mine >= MAX_QUERIES_PER_CONNECTION as usize {
        return Some(BeginRefused::ConnectionLimit {
            limit: MAX_QUERIES_PER_CONNECTION,
        });
    }
    (waiting.len() >= MAX_RUNNING_QUERIES as usize).then_some(BeginRefused::NodeLimit {
        limit: MAX_RUNNING_QUERIES,
    })
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
