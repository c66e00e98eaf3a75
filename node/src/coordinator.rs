//! The coordinator's state: the timestamp allocator, HWM, LWM and running queries. Only state
//! changes live here, deterministic and synchronous (build, check, apply); the actor that
//! decides when to make them lives with the runtime.
//!
//! Timestamps are handed out in batches (group begin) and reserved ahead durably: the state
//! file records the highest timestamp that may have been handed out, so after a restart the
//! allocator starts above it and no timestamp is ever issued twice.

use std::collections::BTreeMap;
use std::io::Write;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use retina_storage::{Hwm, Lwm, StorageError, Timestamp};

/// Timestamps reserved per durable write of the allocator.
pub const TS_RESERVATION: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CoordinatorError {
    #[error("shard {shard} reported applied through {got} after {last}: watermarks never go back")]
    AppliedBackwards {
        shard: u16,
        last: Timestamp,
        got: Timestamp,
    },
    #[error("shard {shard} reported applied through {got}, but only up to {issued} was issued")]
    AppliedUnissued {
        shard: u16,
        got: Timestamp,
        issued: u64,
    },
    #[error("unknown shard {0}")]
    UnknownShard(u16),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("coordinator state file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "coordinator state file {path} is damaged: {reason}; restore it or start from an empty data directory"
    )]
    Corrupt { path: PathBuf, reason: String },
}

pub type QueryId = u64;

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Query {
    snapshot: Timestamp,
    lease_until_ms: u64,
}

/// What the coordinator persists: enough that timestamps never repeat and HWM never goes back.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Persisted {
    /// Every timestamp up to here may have been handed out.
    pub reserved_through: u64,
    pub hwm: Hwm,
    /// How many times a node started on this data directory; each run allocates file ids in
    /// a range of its own.
    pub runs: u64,
}

impl Default for Persisted {
    fn default() -> Self {
        Persisted {
            reserved_through: Timestamp::GENESIS.get(),
            hwm: Hwm::INITIAL,
            runs: 0,
        }
    }
}

pub struct CoordinatorState {
    runs: u64,
    /// The first timestamp this run hands out.
    first_ts: u64,
    next_ts: u64,
    reserved_through: u64,
    applied: Vec<Timestamp>,
    hwm: Hwm,
    queries: BTreeMap<QueryId, Query>,
    next_query: QueryId,
}

impl CoordinatorState {
    /// The state of a node with `shards` shards, resuming from what was persisted.
    pub fn new(shards: u16, persisted: Persisted) -> Self {
        let resumed = persisted.hwm.snapshot();
        CoordinatorState {
            runs: persisted.runs,
            first_ts: persisted.reserved_through + 1,
            next_ts: persisted.reserved_through + 1,
            reserved_through: persisted.reserved_through,
            applied: vec![resumed; shards.into()],
            hwm: persisted.hwm,
            queries: BTreeMap::new(),
            next_query: 1,
        }
    }

    pub fn hwm(&self) -> Hwm {
        self.hwm
    }

    /// The oldest snapshot a running query reads, else the newest snapshot.
    pub fn lwm(&self) -> Lwm {
        let oldest = self.queries.values().map(|q| q.snapshot).min();
        Lwm::new(
            oldest
                .unwrap_or(self.hwm.snapshot())
                .min(self.hwm.snapshot()),
        )
    }

    /// Transactions of this run below HWM: each got one timestamp, handed out consecutively.
    pub fn applied_this_run(&self) -> u64 {
        self.hwm.get().get().saturating_sub(self.first_ts)
    }

    /// The highest timestamp handed out so far.
    pub fn issued_through(&self) -> u64 {
        self.next_ts - 1
    }

    /// Hands out `n` consecutive timestamps (group begin). When the batch crosses the durable
    /// reservation, returns the new state to persist *before* the timestamps are used.
    pub fn allocate(
        &mut self,
        n: u64,
    ) -> Result<(RangeInclusive<u64>, Option<Persisted>), CoordinatorError> {
        assert!(n > 0, "allocate at least one timestamp");
        let first = self.next_ts;
        let last = first + n - 1;
        Timestamp::new(last)?;
        self.next_ts = last + 1;
        let persist = (last > self.reserved_through).then(|| {
            self.reserved_through = (last + TS_RESERVATION).min(Timestamp::MAX_RAW);
            self.persisted()
        });
        Ok((first..=last, persist))
    }

    pub fn persisted(&self) -> Persisted {
        Persisted {
            reserved_through: self.reserved_through,
            hwm: self.hwm,
            runs: self.runs,
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

    /// Begins a query at `snapshot = HWM - 1` with a lease until `now_ms + lease_ms`.
    pub fn begin_query(&mut self, now_ms: u64, lease_ms: u64) -> (QueryId, Timestamp) {
        let id = self.next_query;
        self.next_query += 1;
        let snapshot = self.hwm.snapshot();
        self.queries.insert(
            id,
            Query {
                snapshot,
                lease_until_ms: now_ms + lease_ms,
            },
        );
        (id, snapshot)
    }

    /// Ends a query; false if it was unknown (ended, or its lease expired).
    pub fn end_query(&mut self, id: QueryId) -> bool {
        self.queries.remove(&id).is_some()
    }

    /// Extends a running query's lease and returns its snapshot; `None` if it was unknown.
    pub fn renew_query(&mut self, id: QueryId, now_ms: u64, lease_ms: u64) -> Option<Timestamp> {
        let q = self.queries.get_mut(&id)?;
        q.lease_until_ms = now_ms + lease_ms;
        Some(q.snapshot)
    }

    /// Ends every query whose lease ran out, so a client that died cannot hold LWM back.
    pub fn expire_queries(&mut self, now_ms: u64) -> Vec<QueryId> {
        let expired: Vec<QueryId> = self
            .queries
            .iter()
            .filter(|(_, q)| q.lease_until_ms <= now_ms)
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            self.queries.remove(id);
        }
        expired
    }

    pub fn running_queries(&self) -> usize {
        self.queries.len()
    }
}

/// The coordinator's state file in the data directory, replaced atomically and fsynced.
pub struct StateFile {
    path: PathBuf,
}

impl StateFile {
    pub fn new(data_dir: &Path) -> Self {
        StateFile {
            path: data_dir.join("coordinator.state"),
        }
    }

    fn io(&self, source: std::io::Error) -> CoordinatorError {
        CoordinatorError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// What was persisted, or the initial state for a new data directory.
    pub fn load(&self) -> Result<Persisted, CoordinatorError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Persisted::default()),
            Err(e) => return Err(self.io(e)),
        };
        let corrupt = |reason: String| CoordinatorError::Corrupt {
            path: self.path.clone(),
            reason,
        };
        let mut reserved = None;
        let mut hwm = None;
        let mut runs = 0;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| corrupt(format!("line `{line}` is not key=value")))?;
            let v: u64 = v
                .trim()
                .parse()
                .map_err(|_| corrupt(format!("`{k}` is not a number")))?;
            match k.trim() {
                "reserved_through" => reserved = Some(v),
                "hwm" => hwm = Some(v),
                "runs" => runs = v,
                other => return Err(corrupt(format!("unknown key `{other}`"))),
            }
        }
        let (Some(reserved_through), Some(hwm)) = (reserved, hwm) else {
            return Err(corrupt("missing reserved_through or hwm".into()));
        };
        let hwm = Timestamp::new(hwm).map_err(|e| corrupt(e.to_string()))?;
        if hwm.get() > reserved_through + 1 || hwm < Hwm::INITIAL.get() {
            return Err(corrupt(format!(
                "hwm {hwm} is outside 2..={}",
                reserved_through + 1
            )));
        }
        Ok(Persisted {
            reserved_through,
            hwm: Hwm::after(hwm.prev_or_genesis())?,
            runs,
        })
    }

    /// Writes `p` durably: a temporary file, fsync, rename over the old one, fsync the folder.
    pub fn store(&self, p: Persisted) -> Result<(), CoordinatorError> {
        let tmp = self.path.with_extension("state.tmp");
        let mut f = std::fs::File::create(&tmp).map_err(|e| self.io(e))?;
        write!(
            f,
            "reserved_through={}\nhwm={}\nruns={}\n",
            p.reserved_through,
            p.hwm.get(),
            p.runs
        )
        .map_err(|e| self.io(e))?;
        f.sync_all().map_err(|e| self.io(e))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| self.io(e))?;
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| self.io(e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(v: u64) -> Timestamp {
        Timestamp::new(v).unwrap()
    }

    #[test]
    fn hwm_is_the_slowest_shard_plus_one() {
        let mut c = CoordinatorState::new(2, Persisted::default());
        let (range, persist) = c.allocate(10).unwrap();
        assert_eq!(range, 2..=11);
        assert!(persist.is_some(), "the first batch reserves durably");
        assert_eq!(c.applied(0, ts(5)).unwrap(), None);
        assert_eq!(
            c.applied(1, ts(3)).unwrap(),
            Some(Hwm::after(ts(3)).unwrap())
        );
        assert_eq!(c.hwm().snapshot(), ts(3));
        assert!(c.applied(1, ts(2)).is_err(), "applied never goes back");
        assert!(
            c.applied(1, ts(12)).is_err(),
            "nothing past what was issued"
        );
        assert!(c.applied(2, ts(3)).is_err());
        assert_eq!(
            c.applied(1, ts(11)).unwrap(),
            Some(Hwm::after(ts(5)).unwrap())
        );
    }

    #[test]
    fn lwm_follows_the_oldest_query_and_leases_expire() {
        let mut c = CoordinatorState::new(1, Persisted::default());
        c.allocate(100).unwrap();
        c.applied(0, ts(10)).unwrap();
        let (q1, s1) = c.begin_query(0, 1000);
        assert_eq!(s1, ts(10));
        c.applied(0, ts(20)).unwrap();
        let (q2, _) = c.begin_query(500, 1000);
        assert_eq!(c.lwm().get(), ts(10));
        assert!(c.renew_query(q2, 900, 1000).is_some());
        assert_eq!(c.expire_queries(1000), vec![q1]);
        assert_eq!(c.lwm().get(), ts(20));
        assert!(!c.end_query(q1), "an expired query is gone");
        assert!(c.end_query(q2));
        c.applied(0, ts(30)).unwrap();
        assert_eq!(c.lwm().get(), ts(30));
    }

    #[test]
    fn timestamps_never_repeat_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let file = StateFile::new(dir.path());
        assert_eq!(file.load().unwrap(), Persisted::default());
        let mut c = CoordinatorState::new(1, file.load().unwrap());
        let (first, persist) = c.allocate(5).unwrap();
        file.store(persist.unwrap()).unwrap();
        c.applied(0, ts(6)).unwrap();
        file.store(c.persisted()).unwrap();
        // Crash: whatever was handed out after the last store is below the reservation.
        let mut again = CoordinatorState::new(1, file.load().unwrap());
        let (next, _) = again.allocate(1).unwrap();
        assert!(*next.start() > *first.end());
        assert_eq!(again.hwm().snapshot(), ts(6), "HWM resumes where it was");

        std::fs::write(dir.path().join("coordinator.state"), "reserved_through=x\n").unwrap();
        let err = file.load().unwrap_err().to_string();
        assert!(err.contains("damaged"), "{err}");
    }
}
