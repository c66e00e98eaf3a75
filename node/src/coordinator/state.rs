//! The coordinator's state: the timestamp allocator, HWM, LWM, running queries, checkpoint
//! records and the scan plans' file lists. Only state changes live here, deterministic and
//! synchronous; the actor ([`super::actor`]) decides when to make them, and checks
//! [`CoordinatorState::check_invariants`] after every message in debug builds.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use retina_storage::{FileId, Hwm, Lwm, TableId, Timestamp};

use super::error::{BeginRefused, CoordinatorError};
use super::persist::{CheckpointRecord, Persisted, SourceMark};
use super::plan::{PlanFile, PlanFiles};
use super::query::{LOCAL, MAX_QUERIES_PER_CONNECTION, MAX_RUNNING_QUERIES, Owner, QueryId};

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Query {
    owner: Owner,
    snapshot: Timestamp,
    lease_until_ms: u64,
    began_ms: u64,
    vis: VisCheckpoint,
}

/// Where a long query's visibility checkpoint stands.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum VisCheckpoint {
    None,
    /// Asked of every shard; this many have written theirs.
    Pending(u16),
    /// Every shard has it: the query no longer holds LWM back.
    Done,
    /// A shard could not write it: the query holds LWM as any other.
    Failed,
}

/// A checkpoint whose barrier is on its way through the shards.
struct PendingCheckpoint {
    record: CheckpointRecord,
    confirmed: Vec<bool>,
}

/// The coordinator's timestamps: handed out in consecutive ranges, the next one kept where the
/// sink draws from it without a message. A round trip to the coordinator's thread for every
/// group waited for that thread to be scheduled, often milliseconds on busy cores, while the
/// sink held its group (`retina bench replay`: a quarter of the sink's time on 2 cores).
/// Timestamps are drawn under the node handle's submit lock, so groups still reach every shard
/// in timestamp order; the coordinator reads how far they went when a shard reports
/// ([`CoordinatorState::issued_through`]), after the batches that carried them.
#[derive(Debug)]
pub struct Sequencer {
    next: AtomicU64,
}

impl Sequencer {
    fn starting_at(next: u64) -> Arc<Self> {
        Arc::new(Sequencer {
            next: AtomicU64::new(next),
        })
    }

    /// Hands out `n` consecutive timestamps (group begin).
    pub fn allocate(&self, n: u64) -> Result<RangeInclusive<u64>, CoordinatorError> {
        assert!(n > 0, "allocate at least one timestamp");
        let mut first = self.next.load(Ordering::Acquire);
        loop {
            let last = first + n - 1;
            Timestamp::new(last)?;
            match self.next.compare_exchange_weak(
                first,
                last + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(first..=last),
                Err(now) => first = now,
            }
        }
    }

    /// The next timestamp to hand out.
    fn next(&self) -> u64 {
        self.next.load(Ordering::Acquire)
    }
}

pub struct CoordinatorState {
    /// The first timestamp this run hands out.
    first_ts: u64,
    sequencer: Arc<Sequencer>,
    applied: Vec<Timestamp>,
    hwm: Hwm,
    /// The newest HWM persisted: a query may have seen up to it before a restart.
    shown_hwm: Hwm,
    queries: BTreeMap<QueryId, Query>,
    /// Running queries per owner other than [`LOCAL`] (no entry: none).
    per_owner: std::collections::HashMap<Owner, u32>,
    next_query: QueryId,
    checkpoint: Option<CheckpointRecord>,
    pending_checkpoint: Option<PendingCheckpoint>,
    /// The id of the newest checkpoint begun, complete or not: a checkpoint that failed
    /// leaves its id behind, so that a late confirmation of it (or an upload of its image)
    /// can never be taken for the next one's.
    last_begun: u64,
    /// Ended queries whose visibility checkpoints the shards may hold: to be dropped.
    vis_to_drop: Vec<QueryId>,
    /// Queries begin once HWM passes this; `None` while the sink has not said how far the
    /// source reached before the restart.
    ready_at: Option<Timestamp>,
    /// A shard stopped replay: HWM will not move, so no query waits for it.
    replay_stopped: bool,
    /// Every table's regular files, for scan plans.
    files: PlanFiles,
    /// Shards started again from a checkpoint ([`Self::shard_restarted`]) that have not yet
    /// applied as far as their lost run had.
    restarted: std::collections::BTreeSet<u16>,
}

impl CoordinatorState {
    /// The state of a node with `shards` shards, resuming after the persisted checkpoint (or
    /// from the start without one). With `await_source`, queries wait for
    /// [`Self::caught_up`]; else until HWM is back where it was persisted.
    pub fn new(shards: u16, persisted: Persisted, await_source: bool) -> Self {
        let resumed = persisted.checkpoint.map_or(Timestamp::GENESIS, |c| c.ts);
        let hwm = Hwm::after(resumed).expect("a checkpoint timestamp is below the maximum");
        CoordinatorState {
            first_ts: resumed.get() + 1,
            sequencer: Sequencer::starting_at(resumed.get() + 1),
            applied: vec![resumed; shards.into()],
            hwm,
            shown_hwm: persisted.hwm.max(hwm),
            queries: BTreeMap::new(),
            per_owner: std::collections::HashMap::new(),
            next_query: 1,
            checkpoint: persisted.checkpoint,
            pending_checkpoint: None,
            last_begun: persisted.checkpoint.map_or(0, |c| c.id),
            vis_to_drop: Vec::new(),
            ready_at: (!await_source).then(|| persisted.hwm.snapshot()),
            replay_stopped: false,
            files: PlanFiles::default(),
            restarted: Default::default(),
        }
    }

    pub fn hwm(&self) -> Hwm {
        self.hwm
    }

    /// The oldest snapshot a running query reads from memory (not from a visibility
    /// checkpoint), else the newest snapshot: memory GC folds no further.
    pub fn lwm(&self) -> Lwm {
        let oldest = self
            .queries
            .values()
            .filter(|q| q.vis != VisCheckpoint::Done)
            .map(|q| q.snapshot)
            .min();
        Lwm::new(
            oldest
                .unwrap_or(self.hwm.snapshot())
                .min(self.hwm.snapshot()),
        )
    }

    /// The oldest snapshot any running query reads, else the newest snapshot: objects a query
    /// may still read (retired blocks, files storage GC replaced) stay until this passes them.
    pub fn retain_lwm(&self) -> Lwm {
        let oldest = self.queries.values().map(|q| q.snapshot).min();
        Lwm::new(
            oldest
                .unwrap_or(self.hwm.snapshot())
                .min(self.hwm.snapshot()),
        )
    }

    /// Queries running `after_ms` or longer without a visibility checkpoint: each is now
    /// pending, and every shard should write one at its snapshot.
    pub fn start_vis_checkpoints(
        &mut self,
        now_ms: u64,
        after_ms: u64,
    ) -> Vec<(QueryId, Timestamp)> {
        let mut out = Vec::new();
        for (&id, q) in self.queries.iter_mut() {
            if q.vis == VisCheckpoint::None && now_ms.saturating_sub(q.began_ms) >= after_ms {
                q.vis = VisCheckpoint::Pending(0);
                out.push((id, q.snapshot));
            }
        }
        out
    }

    /// A shard wrote query `id`'s visibility checkpoint (`ok`) or could not. True once every
    /// shard has: LWM may pass the query. A query that ended meanwhile is queued to drop again
    /// (the shard's copy may have come after the drop).
    pub fn vis_checkpoint_done(&mut self, id: QueryId, ok: bool) -> bool {
        let shards = self.applied.len() as u16;
        let Some(q) = self.queries.get_mut(&id) else {
            self.vis_to_drop.push(id);
            return false;
        };
        match (q.vis, ok) {
            (VisCheckpoint::Pending(_), false) => q.vis = VisCheckpoint::Failed,
            (VisCheckpoint::Pending(n), true) if n + 1 == shards => {
                q.vis = VisCheckpoint::Done;
                return true;
            }
            (VisCheckpoint::Pending(n), true) => q.vis = VisCheckpoint::Pending(n + 1),
            _ => {}
        }
        false
    }

    /// Queries whose visibility checkpoints the shards should delete now.
    pub fn take_vis_to_drop(&mut self) -> Vec<QueryId> {
        std::mem::take(&mut self.vis_to_drop)
    }

    /// Running queries that read from a visibility checkpoint.
    pub fn vis_checkpointed(&self) -> usize {
        self.queries
            .values()
            .filter(|q| q.vis == VisCheckpoint::Done)
            .count()
    }

    fn forget(&mut self, id: QueryId) -> bool {
        match self.queries.remove(&id) {
            Some(q) => {
                if let std::collections::hash_map::Entry::Occupied(mut n) =
                    self.per_owner.entry(q.owner)
                {
                    *n.get_mut() -= 1;
                    if *n.get() == 0 {
                        n.remove();
                    }
                }
                if q.vis != VisCheckpoint::None {
                    self.vis_to_drop.push(id);
                }
                true
            }
            None => false,
        }
    }

    /// Transactions of this run below HWM: each got one timestamp, handed out consecutively.
    pub fn applied_this_run(&self) -> u64 {
        self.hwm.get().get().saturating_sub(self.first_ts)
    }

    /// The highest timestamp handed out so far.
    pub fn issued_through(&self) -> u64 {
        self.sequencer.next() - 1
    }

    /// Where the sink draws timestamps from.
    pub fn sequencer(&self) -> Arc<Sequencer> {
        self.sequencer.clone()
    }

    /// Hands out `n` consecutive timestamps (group begin): [`Sequencer::allocate`], which the
    /// sink calls itself.
    pub fn allocate(&self, n: u64) -> Result<RangeInclusive<u64>, CoordinatorError> {
        self.sequencer.allocate(n)
    }

    /// What to persist now; it covers the current HWM, so queries may be shown it once it is
    /// durable ([`Self::persisted_hwm`]).
    pub fn persisted(&self) -> Persisted {
        Persisted {
            hwm: self.hwm,
            checkpoint: self.checkpoint,
        }
    }

    /// `p` (from [`Self::persisted`]) is durable.
    pub fn persisted_hwm(&mut self, p: Persisted) {
        self.shown_hwm = self.shown_hwm.max(p.hwm);
    }

    /// Whether a query may begin now: HWM is back at least where it was before a restart.
    pub fn ready(&self) -> bool {
        self.replay_stopped || self.ready_at.is_some_and(|r| self.hwm.snapshot() >= r)
    }

    /// The refusal for a query that waited too long for [`Self::ready`].
    pub fn catching_up(&self) -> BeginRefused {
        let snapshot = self.hwm.snapshot();
        let target = match self.ready_at {
            Some(r) => r.get(),
            // The sink has not said where the source ended: at least what queries saw before.
            None if self.shown_hwm.snapshot() > snapshot => self.shown_hwm.snapshot().get(),
            None => 0,
        };
        BeginRefused::CatchingUp {
            snapshot: snapshot.get(),
            target,
        }
    }

    /// The sink replayed the source as far as it reached before the restart, through `ts`;
    /// `None` when it cannot tell (stdin): then queries wait for the persisted HWM.
    pub fn caught_up(&mut self, ts: Option<Timestamp>) {
        self.ready_at = Some(ts.unwrap_or(self.shown_hwm.snapshot()));
    }

    /// Replay stopped (a shard failed): what is visible is all there will be, so queries
    /// stop waiting.
    pub fn replay_stopped(&mut self) {
        self.replay_stopped = true;
    }

    /// Starts checkpoint of everything handed out so far, taken at `source`: its id and
    /// timestamp, which the barrier carries to every shard. `None` while another is on its
    /// way.
    pub fn begin_checkpoint(&mut self, source: SourceMark) -> Option<CheckpointRecord> {
        if self.pending_checkpoint.is_some() {
            return None;
        }
        let ts = Timestamp::new(self.issued_through()).expect("issued timestamps are valid");
        if self.checkpoint.is_some_and(|c| c.ts >= ts) {
            // Nothing new since the last one.
            return None;
        }
        self.last_begun += 1;
        let record = CheckpointRecord {
            id: self.last_begun,
            ts,
            shards: self.applied.len() as u16,
            source,
        };
        self.pending_checkpoint = Some(PendingCheckpoint {
            record,
            confirmed: vec![false; self.applied.len()],
        });
        Some(record)
    }

    /// Shard `shard` wrote its image of checkpoint `id` durably (`ok`) or could not. Returns
    /// the record once every shard has: persist it, then call [`Self::checkpoint_recorded`].
    pub fn checkpoint_done(&mut self, id: u64, shard: u16, ok: bool) -> Option<CheckpointRecord> {
        let p = self
            .pending_checkpoint
            .as_mut()
            .filter(|p| p.record.id == id)?;
        if !ok {
            self.pending_checkpoint = None;
            return None;
        }
        *p.confirmed.get_mut(usize::from(shard))? = true;
        if p.confirmed.iter().all(|&c| c) {
            return Some(p.record);
        }
        None
    }

    /// The newest complete checkpoint, if any.
    pub fn checkpoint(&self) -> Option<CheckpointRecord> {
        self.checkpoint
    }

    /// Whether a checkpoint is on its way through the shards (begun, not yet recorded).
    pub fn checkpoint_pending(&self) -> bool {
        self.pending_checkpoint.is_some()
    }

    /// The checkpoint is durable: a restart starts from it. Returns the one it replaced.
    pub fn checkpoint_recorded(&mut self, record: CheckpointRecord) -> Option<CheckpointRecord> {
        self.pending_checkpoint = None;
        self.checkpoint.replace(record)
    }

    /// The persisted state with `record` as its checkpoint.
    pub fn persisted_with(&self, record: CheckpointRecord) -> Persisted {
        Persisted {
            hwm: self.hwm,
            checkpoint: Some(record),
        }
    }

    /// Shard `shard` applied every transaction through `ts` (group commit). Returns the new HWM
    /// when it moved: `min over shards (applied through) + 1`.
    pub fn applied(&mut self, shard: u16, ts: Timestamp) -> Result<Option<Hwm>, CoordinatorError> {
        let issued = self.issued_through();
        let slot = self
            .applied
            .get_mut(usize::from(shard))
            .ok_or(CoordinatorError::UnknownShard(shard))?;
        if ts < *slot && self.restarted.contains(&shard) {
            // Catching up: HWM stays where the lost run left it.
            return Ok(None);
        }
        self.restarted.remove(&shard);
        if ts < *slot {
            return Err(CoordinatorError::AppliedBackwards {
                shard,
                last: *slot,
                got: ts,
            });
        }
        if ts.get() > issued {
            return Err(CoordinatorError::AppliedUnissued {
                shard,
                got: ts,
                issued,
            });
        }
        *slot = ts;
        let min = *self.applied.iter().min().expect("at least one shard");
        let hwm = Hwm::after(min)?;
        if hwm > self.hwm {
            self.hwm.advance(hwm)?;
            return Ok(Some(hwm));
        }
        Ok(None)
    }

    /// Shard `shard` starts again from the newest complete checkpoint on a new run of it (its
    /// member was lost, or it moved): plans list the files the new run reports, and its
    /// applied timestamps are news only once they pass where the lost run was (HWM never goes
    /// back). Every running query ends (returned): its plans may list files of the lost run
    /// that the new run holds as write buffer again, and the lost run held its visibility
    /// checkpoints; a client begins again.
    pub fn shard_restarted(&mut self, shard: u16) -> Result<Vec<QueryId>, CoordinatorError> {
        if usize::from(shard) >= self.applied.len() {
            return Err(CoordinatorError::UnknownShard(shard));
        }
        self.files.drop_shard(shard);
        self.restarted.insert(shard);
        let running: Vec<QueryId> = self.queries.keys().copied().collect();
        for &id in &running {
            self.forget(id);
        }
        Ok(running)
    }

    /// Begins a query of `owner` at `snapshot = HWM - 1` with a lease until `now_ms +
    /// lease_ms`, unless `owner` (other than [`LOCAL`]) or the node runs its limit of queries.
    pub fn begin_query(
        &mut self,
        owner: Owner,
        now_ms: u64,
        lease_ms: u64,
    ) -> Result<(QueryId, Timestamp), BeginRefused> {
        if owner != LOCAL {
            let running = self.per_owner.get(&owner).copied().unwrap_or(0);
            if running >= MAX_QUERIES_PER_CONNECTION {
                return Err(BeginRefused::ConnectionLimit {
                    limit: MAX_QUERIES_PER_CONNECTION,
                });
            }
            let remote: u32 = self.per_owner.values().sum();
            if remote >= MAX_RUNNING_QUERIES {
                return Err(BeginRefused::NodeLimit {
                    limit: MAX_RUNNING_QUERIES,
                });
            }
            *self.per_owner.entry(owner).or_default() += 1;
        }
        let id = self.next_query;
        self.next_query += 1;
        let snapshot = self.hwm.snapshot();
        self.queries.insert(
            id,
            Query {
                owner,
                snapshot,
                lease_until_ms: now_ms + lease_ms,
                began_ms: now_ms,
                vis: VisCheckpoint::None,
            },
        );
        Ok((id, snapshot))
    }

    /// Ends `owner`'s query; false if it was unknown (ended, its lease expired, or another
    /// owner's).
    pub fn end_query(&mut self, owner: Owner, id: QueryId) -> bool {
        self.queries.get(&id).is_some_and(|q| q.owner == owner) && self.forget(id)
    }

    /// Extends `owner`'s running query's lease and returns its snapshot; `None` if it was
    /// unknown (or another owner's).
    pub fn renew_query(
        &mut self,
        owner: Owner,
        id: QueryId,
        now_ms: u64,
        lease_ms: u64,
    ) -> Option<Timestamp> {
        let q = self.queries.get_mut(&id).filter(|q| q.owner == owner)?;
        q.lease_until_ms = now_ms + lease_ms;
        Some(q.snapshot)
    }

    /// `owner`'s connection closed: ends every query it began.
    pub fn end_owner(&mut self, owner: Owner) -> Vec<QueryId> {
        if owner == LOCAL || !self.per_owner.contains_key(&owner) {
            return Vec::new();
        }
        let ended: Vec<QueryId> = self
            .queries
            .iter()
            .filter(|(_, q)| q.owner == owner)
            .map(|(id, _)| *id)
            .collect();
        for &id in &ended {
            self.forget(id);
        }
        ended
    }

    /// Ends every query whose lease ran out, so a client that died cannot hold LWM back.
    pub fn expire_queries(&mut self, now_ms: u64) -> Vec<QueryId> {
        let expired: Vec<QueryId> = self
            .queries
            .iter()
            .filter(|(_, q)| q.lease_until_ms <= now_ms)
            .map(|(id, _)| *id)
            .collect();
        for &id in &expired {
            self.forget(id);
        }
        expired
    }

    pub fn running_queries(&self) -> usize {
        self.queries.len()
    }

    /// The regular files a restart found (the newest checkpoint's), listed in plans from the
    /// start.
    pub fn with_files(mut self, files: PlanFiles) -> Self {
        self.files = files;
        self
    }

    /// Checkpoint ids of this run start above `base` (a cluster leadership's epoch, see
    /// [`crate::cluster::epoch_base`]): no two leaders ever make checkpoints with one id.
    pub fn with_checkpoint_ids_after(mut self, base: u64) -> Self {
        self.last_begun = self.last_begun.max(base);
        self
    }

    /// A shard combined `file` of `table`: later scan plans list it.
    pub fn file_added(&mut self, table: TableId, file: PlanFile) {
        self.files.add(table, file);
    }

    /// Storage GC replaced regular file `old` of `table` with `new` (none when no row
    /// survived): plans at snapshots from `from` on list the new one instead.
    pub fn file_replaced(
        &mut self,
        table: TableId,
        old: FileId,
        new: Option<PlanFile>,
        from: Timestamp,
    ) {
        self.files.replace(table, old, new, from);
    }

    /// `owner`'s query `id`'s scan plan of `table`: its snapshot and the files it reads.
    /// Renews the query's lease like [`Self::renew_query`]; `None` if it was unknown.
    pub fn plan(
        &mut self,
        owner: Owner,
        id: QueryId,
        table: TableId,
        now_ms: u64,
        lease_ms: u64,
    ) -> Option<(Timestamp, Vec<PlanFile>)> {
        let snapshot = self.renew_query(owner, id, now_ms, lease_ms)?;
        Some((snapshot, self.files.plan(table, snapshot)))
    }

    /// Files storage GC replaced leave the plans once no running query may read them.
    pub fn retire_files(&mut self) {
        self.files.retire(self.retain_lwm().get());
    }

    /// Panics unless the state is consistent. The actor calls it after every message in
    /// debug builds; tests call it after every step.
    pub fn check_invariants(&self) {
        let min = *self.applied.iter().min().expect("at least one shard");
        assert_eq!(
            self.hwm,
            Hwm::after(min).expect("applied timestamps are below the maximum"),
            "HWM is the slowest shard's applied-through plus one"
        );
        let next_ts = self.sequencer.next();
        assert!(
            self.applied.iter().all(|a| a.get() < next_ts),
            "no shard applied what was not handed out: {:?} with {} next",
            self.applied,
            next_ts
        );
        assert!(self.first_ts <= next_ts, "timestamps only grow");
        assert!(
            self.retain_lwm().get() <= self.lwm().get() && self.lwm().get() <= self.hwm.snapshot(),
            "retain LWM <= LWM <= HWM - 1"
        );
        for (id, q) in &self.queries {
            assert!(*id < self.next_query, "query {id} was handed out");
            assert!(
                q.snapshot <= self.hwm.snapshot(),
                "query {id} reads below HWM"
            );
        }
        let mut owners: std::collections::HashMap<Owner, u32> = Default::default();
        for q in self.queries.values().filter(|q| q.owner != LOCAL) {
            *owners.entry(q.owner).or_default() += 1;
        }
        assert_eq!(
            owners, self.per_owner,
            "per-owner counts match the running queries"
        );
        assert!(
            self.per_owner
                .values()
                .all(|&n| n <= MAX_QUERIES_PER_CONNECTION)
                && self.per_owner.values().sum::<u32>() <= MAX_RUNNING_QUERIES,
            "the caps on running queries hold"
        );
        if let Some(c) = self.checkpoint {
            assert!(
                c.ts.get() < next_ts,
                "a checkpoint covers only what was issued"
            );
        }
        if let Some(p) = &self.pending_checkpoint {
            assert_eq!(
                p.confirmed.len(),
                self.applied.len(),
                "a confirmation per shard"
            );
            assert!(
                self.checkpoint
                    .is_none_or(|c| c.id < p.record.id && c.ts < p.record.ts),
                "a pending checkpoint is newer than the recorded one"
            );
        }
        self.files.check_invariants();
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
