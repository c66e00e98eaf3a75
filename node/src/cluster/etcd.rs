//! A node's membership in an etcd cluster, through etcd's v3 API as its JSON gateway serves
//! it (`POST /v3/kv/txn`, `/v3/lease/keepalive`, ...; see [`super::gateway`]).
//!
//! Keys, under the cluster's prefix `P`:
//! - `P/nodes/<id>`: each live node's entry ([`NodeEntry`]), under its lease: it goes when the
//!   node stops or its lease expires.
//! - `P/leader`: the id of the node that replays, under its lease.
//! - `P/epoch`: how many leaderships there have been; taking the lead raises it in the same
//!   transaction.
//! - `P/state`: the coordinator's durable state (the newest complete checkpoint and the HWM
//!   queries may have seen), written only by the leader: every write compares `P/leader` with
//!   the writer's id and lease, so a deposed leader's writes fail.
//! - `P/placement`: which node runs each shard, as the leader placed them when it started
//!   ([`Placement`]), written under the same comparison.
//!
//! Requests block; the lease is kept alive, and the entry refreshed, on threads of the member's
//! own, and the coordinator's writes go through a worker thread, so that its executor never
//! blocks on the network.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::gateway::{Gateway, Kv, cmp_create, cmp_lease, cmp_mod, cmp_value, put, range};
use super::{ClusterSpec, LeaseClock, LeaseLost};
use crate::coordinator::{Persisted, StateFile};
use crate::status::NodeStatus;

/// How often a node's entry is refreshed with its status.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// How often a standby tries to take the lead.
const CAMPAIGN_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster {cluster}: {what}: {reason}")]
    Etcd {
        cluster: String,
        what: String,
        reason: String,
    },
    #[error("cluster {cluster}: key {key}: {reason}")]
    Corrupt {
        cluster: String,
        key: String,
        reason: String,
    },
    #[error("cluster {cluster}: placing the shards: {reason}")]
    Placement { cluster: String, reason: String },
    #[error(transparent)]
    LeaseLost(#[from] LeaseLost),
}

/// What a node says about itself in `P/nodes/<id>`: `key=value` lines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeEntry {
    /// Where its coordinator's Cap'n Proto service is reached.
    pub advertise: String,
    /// Where a leader reaches it to run shards on it (empty: it runs none but its own when it
    /// leads); see [`crate::remote`].
    pub peer: String,
    /// `leader` or `standby`.
    pub role: String,
    /// Its leadership's epoch (0 for a standby).
    pub epoch: u64,
    pub hwm: u64,
    pub checkpoint_id: u64,
    pub checkpoint_ts: u64,
    pub txns_applied: u64,
    /// A leader: what each shard applied through, by shard.
    pub applied: Vec<u64>,
    /// When the node joined, in milliseconds since the Unix epoch.
    pub joined_ms: u64,
}

impl NodeEntry {
    fn encode(&self) -> String {
        format!(
            "advertise={}\npeer={}\nrole={}\nepoch={}\nhwm={}\ncheckpoint_id={}\n\
             checkpoint_ts={}\ntxns_applied={}\napplied={}\njoined_ms={}\n",
            self.advertise,
            self.peer,
            self.role,
            self.epoch,
            self.hwm,
            self.checkpoint_id,
            self.checkpoint_ts,
            self.txns_applied,
            self.applied
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            self.joined_ms
        )
    }

    fn decode(text: &str) -> Result<Self, String> {
        let mut e = NodeEntry::default();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("line `{line}` is not key=value"))?;
            let num = || {
                v.parse::<u64>()
                    .map_err(|_| format!("`{k}` is not a number"))
            };
            match k {
                "advertise" => e.advertise = v.to_owned(),
                "peer" => e.peer = v.to_owned(),
                "role" => e.role = v.to_owned(),
                "epoch" => e.epoch = num()?,
                "hwm" => e.hwm = num()?,
                "checkpoint_id" => e.checkpoint_id = num()?,
                "checkpoint_ts" => e.checkpoint_ts = num()?,
                "txns_applied" => e.txns_applied = num()?,
                "applied" => {
                    e.applied = v
                        .split(',')
                        .filter(|t| !t.is_empty())
                        .map(|t| t.parse().map_err(|_| format!("`applied` has `{t}`")))
                        .collect::<Result<_, _>>()?
                }
                "joined_ms" => e.joined_ms = num()?,
                // Written by a newer version: ignored.
                _ => {}
            }
        }
        Ok(e)
    }
}

/// A cluster as `retina cluster status` shows it.
#[derive(Debug)]
pub struct Snapshot {
    pub leader: Option<String>,
    pub epoch: u64,
    pub state: Option<Persisted>,
    /// Every live node: its id, entry and the seconds left on its lease.
    pub nodes: Vec<(String, NodeEntry, i64)>,
    /// Where the leader placed the shards (`None`: no leader placed them yet).
    pub placement: Option<Placement>,
}

/// Which node runs each shard, as a leader placed them: shard `k` runs on `owners[k]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// The leadership that placed them.
    pub epoch: u64,
    pub owners: Vec<String>,
}

impl Placement {
    /// Shard `k` on `nodes[k % nodes.len()]`: the leader first, then the hosts.
    pub fn round_robin(epoch: u64, shards: u16, nodes: &[String]) -> Placement {
        Placement {
            epoch,
            owners: (0..usize::from(shards))
                .map(|k| nodes[k % nodes.len()].clone())
                .collect(),
        }
    }

    /// `epoch=E` then `K=NODE` per shard, a line each.
    pub fn encode(&self) -> String {
        let mut s = format!("epoch={}\n", self.epoch);
        for (k, owner) in self.owners.iter().enumerate() {
            s.push_str(&format!("{k}={owner}\n"));
        }
        s
    }

    pub fn decode(text: &str) -> Result<Placement, String> {
        let mut p = Placement::default();
        for line in text.lines().filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once('=')
                .ok_or_else(|| format!("line `{line}` is not key=value"))?;
            if k == "epoch" {
                p.epoch = v.parse().map_err(|_| format!("`{v}` is not an epoch"))?;
                continue;
            }
            let shard: usize = k.parse().map_err(|_| format!("`{k}` is not a shard"))?;
            if shard != p.owners.len() {
                return Err(format!("shard {shard} is out of order"));
            }
            p.owners.push(v.to_owned());
        }
        Ok(p)
    }
}

/// This node's membership: its lease, kept alive on a thread of its own, and its entry.
pub struct Member {
    spec: ClusterSpec,
    node_id: String,
    etcd: Arc<Gateway>,
    lease: i64,
    clock: Arc<LeaseClock>,
    entry: Arc<Mutex<NodeEntry>>,
    /// The node's status once it leads: its entry reports HWM and checkpoints.
    status: Arc<Mutex<Option<Arc<NodeStatus>>>>,
    epoch: AtomicU64,
    /// Woken when the lease is lost.
    lost: flume::Receiver<()>,
    /// The coordinator's writes, run on the writer thread.
    writes: flume::Sender<Box<dyn FnOnce() + Send>>,
    /// Stops the member's threads.
    stop: Arc<AtomicBool>,
    /// The nodes this leader last placed the shards over.
    placed_over: Mutex<Vec<String>>,
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Starts a thread of the member's (named `retina-cluster-<what>`).
fn spawn(
    spec: &ClusterSpec,
    what: &str,
    run: impl FnOnce() + Send + 'static,
) -> Result<(), ClusterError> {
    std::thread::Builder::new()
        .name(format!("retina-cluster-{what}"))
        .spawn(run)
        .map(drop)
        .map_err(|e| ClusterError::Etcd {
            cluster: spec.to_string(),
            what: format!("starting the {what} thread"),
            reason: e.to_string(),
        })
}

impl Member {
    fn key(&self, name: &str) -> String {
        key(&self.spec, name)
    }

    fn etcd_err(&self, what: &str, reason: String) -> ClusterError {
        ClusterError::Etcd {
            cluster: self.spec.to_string(),
            what: what.to_owned(),
            reason,
        }
    }

    /// Joins the cluster as `node_id`, reached at `advertise`: takes a lease of `ttl` (whole
    /// seconds, at least 2), keeps it alive, and puts the node's entry under it. A node with
    /// the same id that is still registered (say, this node before a crash) is waited for
    /// until its lease expires.
    pub fn join(
        spec: &ClusterSpec,
        node_id: &str,
        advertise: &str,
        peer: Option<&str>,
        ttl: Duration,
    ) -> Result<Arc<Member>, ClusterError> {
        let etcd = Arc::new(Gateway::new(&spec.endpoints));
        let ttl_s = i64::try_from(ttl.as_secs().max(2)).unwrap_or(i64::MAX);
        // The clock's base comes before the request: the first renewal counts from its send.
        let clock = Arc::new(LeaseClock::default());
        let sent = Instant::now();
        let lease = etcd.grant(ttl_s).map_err(|reason| ClusterError::Etcd {
            cluster: spec.to_string(),
            what: "granting a lease".into(),
            reason,
        })?;
        clock.renewed(sent, Duration::from_secs(ttl_s.unsigned_abs()));
        let (lost_tx, lost) = flume::bounded(1);
        let (writes, jobs) = flume::unbounded::<Box<dyn FnOnce() + Send>>();
        let stop = Arc::new(AtomicBool::new(false));
        let member = Member {
            spec: spec.clone(),
            node_id: node_id.to_owned(),
            etcd: etcd.clone(),
            lease,
            clock: clock.clone(),
            entry: Arc::new(Mutex::new(NodeEntry {
                advertise: advertise.to_owned(),
                peer: peer.unwrap_or_default().to_owned(),
                role: "standby".into(),
                joined_ms: now_unix_ms(),
                ..NodeEntry::default()
            })),
            status: Arc::new(Mutex::new(None)),
            epoch: AtomicU64::new(0),
            lost,
            writes,
            stop: stop.clone(),
            placed_over: Mutex::new(Vec::new()),
        };
        {
            let (etcd, stop) = (etcd.clone(), stop.clone());
            let ttl = Duration::from_secs(ttl_s.unsigned_abs());
            spawn(spec, "lease", move || {
                keep_alive(&etcd, lease, ttl, &clock, &lost_tx, &stop)
            })?;
        }
        // Ends when the member (the only sender) is dropped.
        spawn(spec, "writer", move || {
            while let Ok(job) = jobs.recv() {
                job();
            }
        })?;
        member.register()?;
        {
            let (etcd, stop) = (etcd, stop);
            let key = member.key(&format!("nodes/{node_id}"));
            let (entry, status) = (member.entry.clone(), member.status.clone());
            spawn(spec, "publish", move || {
                publish(&etcd, &key, lease, &entry, &status, &stop)
            })?;
        }
        tracing::info!("joined the cluster {spec} as node {node_id} (lease {lease:x}, {ttl_s} s)");
        Ok(Arc::new(member))
    }

    /// Puts this node's entry, once no live node holds its id. An entry whose lease counts
    /// down (a node that stopped without leaving: this one, before a crash) is waited for until
    /// it expires; one whose lease is renewed belongs to a live node, and is an error.
    fn register(&self) -> Result<(), ClusterError> {
        let key = self.key(&format!("nodes/{}", self.node_id));
        // The lease holding the id, since when this node has seen it, and the time it had left
        // when this node last looked.
        let mut holder: Option<(i64, Instant, i64)> = None;
        loop {
            let text = self.entry.lock().expect("entry lock").encode();
            let (done, answers) = self
                .etcd
                .txn(
                    vec![cmp_create(&key, 0)],
                    vec![put(&key, &text, Some(self.lease))],
                    vec![range(&key)],
                )
                .map_err(|e| self.etcd_err("registering the node", e))?;
            if done {
                return Ok(());
            }
            let held = answers
                .first()
                .map(super::gateway::range_response)
                .transpose()
                .map_err(|e| self.etcd_err("registering the node", e))?
                .and_then(|kvs| kvs.into_iter().next());
            let Some(held) = held else { continue };
            // A request whose answer was lost, then sent again, finds its own put.
            if held.lease == self.lease {
                return Ok(());
            }
            // A lease no one renews only counts down, to nothing once its term has passed (etcd
            // may take a while to revoke it then, longer when its disk is slow, so how long it
            // is held proves nothing by itself). Time left that went up, or that is still there
            // after a whole term, was renewed: by a live node.
            let Ok((ttl, granted)) = self.etcd.time_to_live(held.lease) else {
                // Not known this time: look again.
                std::thread::sleep(CAMPAIGN_EVERY);
                continue;
            };
            let since = match holder {
                Some((lease, since, left)) if lease == held.lease => {
                    let term = Duration::from_secs(granted.max(0).unsigned_abs());
                    if ttl > left || (ttl > 0 && since.elapsed() > term + Duration::from_secs(1)) {
                        let advertise = NodeEntry::decode(&held.value)
                            .map(|e| e.advertise)
                            .unwrap_or_default();
                        return Err(self.etcd_err(
                            &format!("registering node {}", self.node_id),
                            format!(
                                "a live node (at `{advertise}`) has this id: give each member \
                                 its own --node-id"
                            ),
                        ));
                    }
                    since
                }
                _ => {
                    tracing::warn!(
                        "node id {} is still registered in {} (a node that stopped without \
                         leaving has it until its lease expires, in {ttl} s): waiting",
                        self.node_id,
                        self.spec
                    );
                    Instant::now()
                }
            };
            holder = Some((held.lease, since, ttl));
            std::thread::sleep(CAMPAIGN_EVERY);
        }
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    pub fn clock(&self) -> &Arc<LeaseClock> {
        &self.clock
    }

    /// The epoch of this node's leadership (0 until it leads).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// A receiver that is woken when the lease is lost.
    pub fn lost(&self) -> flume::Receiver<()> {
        self.lost.clone()
    }

    /// One attempt to take the lead: the new epoch, or who leads now.
    fn campaign(&self) -> Result<Result<u64, Option<String>>, Campaign> {
        let leader_key = self.key("leader");
        let epoch_key = self.key("epoch");
        let node_key = self.key(&format!("nodes/{}", self.node_id));
        let got = self
            .etcd
            .call("/v3/kv/range", &json!({ "key": b64(&epoch_key) }))?;
        let rev = super::gateway::mod_revision(&got);
        let epoch = match super::gateway::kvs(&got)?.first() {
            Some(kv) => parse_epoch(&self.spec, &epoch_key, &kv.value).map_err(Campaign::Fatal)?,
            None => 0,
        };
        let next = epoch_after(&self.spec, &epoch_key, epoch).map_err(Campaign::Fatal)?;
        // The node's entry says it leads in the same transaction; held meanwhile, so that the
        // entry's refresh cannot put back the standby's.
        let mut held = self.entry.lock().expect("entry lock");
        let entry = {
            let mut e = held.clone();
            e.role = "leader".into();
            e.epoch = next;
            e
        };
        let (done, answers) = self.etcd.txn(
            vec![cmp_create(&leader_key, 0), cmp_mod(&epoch_key, rev)],
            vec![
                put(&leader_key, &self.node_id, Some(self.lease)),
                put(&epoch_key, &next.to_string(), None),
                put(&node_key, &entry.encode(), Some(self.lease)),
            ],
            vec![range(&leader_key), range(&epoch_key)],
        )?;
        if done {
            *held = entry;
            return Ok(Ok(next));
        }
        let first = |i: usize| -> Result<Option<Kv>, String> {
            Ok(answers
                .get(i)
                .map(super::gateway::range_response)
                .transpose()?
                .and_then(|kvs: Vec<Kv>| kvs.into_iter().next()))
        };
        let leader = first(0)?;
        // A request whose answer was lost, then sent again, finds this node leading already.
        if let Some(l) = &leader
            && l.value == self.node_id
            && l.lease == self.lease
        {
            let epoch = match first(1)? {
                Some(kv) => {
                    parse_epoch(&self.spec, &epoch_key, &kv.value).map_err(Campaign::Fatal)?
                }
                None => 0,
            };
            let mut entry = entry;
            entry.epoch = epoch;
            *held = entry;
            return Ok(Ok(epoch));
        }
        Ok(Err(leader.map(|kv| kv.value)))
    }

    /// Blocks until this node leads; returns its epoch. Who leads meanwhile is logged (once
    /// per leader). Errors only once the lease is lost; an etcd that does not answer is
    /// asked again.
    pub fn lead(&self) -> Result<u64, ClusterError> {
        let mut last_seen: Option<String> = None;
        let mut last_error: Option<String> = None;
        loop {
            if self.clock.is_lost() {
                return Err(LeaseLost.into());
            }
            match self.campaign() {
                Ok(Ok(epoch)) => {
                    self.epoch.store(epoch, Ordering::Release);
                    tracing::info!(
                        "node {} leads the cluster {} (epoch {epoch})",
                        self.node_id,
                        self.spec
                    );
                    return Ok(epoch);
                }
                Ok(Err(leader)) => {
                    if leader.is_some() && leader != last_seen {
                        tracing::info!(
                            "standby: node {} leads the cluster {}",
                            leader.as_deref().unwrap_or_default(),
                            self.spec
                        );
                        last_seen = leader;
                    }
                    last_error = None;
                }
                Err(Campaign::Fatal(e)) => return Err(e),
                Err(Campaign::Unavailable(e)) => {
                    if last_error.as_ref() != Some(&e) {
                        tracing::warn!("standby: asking {} who leads: {e}", self.spec);
                        last_error = Some(e);
                    }
                }
            }
            std::thread::sleep(CAMPAIGN_EVERY);
        }
    }

    /// From now on the node's entry reports `status` (its HWM and checkpoints).
    pub fn report(&self, status: Arc<NodeStatus>) {
        *self.status.lock().expect("status lock") = Some(status);
    }

    /// The coordinator's state as the cluster last recorded it, read only if this node still
    /// leads (`None`: never recorded): what a leader starts from.
    pub fn load_state_to_lead(&self) -> Result<Option<Persisted>, ClusterError> {
        let key = self.key("state");
        let (leads, answers) = self
            .etcd
            .txn(self.fenced(), vec![range(&key)], vec![])
            .map_err(|e| self.etcd_err("reading the coordinator's state", e))?;
        if !leads {
            return Err(LeaseLost.into());
        }
        let kvs = answers
            .first()
            .map(super::gateway::range_response)
            .transpose()
            .map_err(|e| self.etcd_err("reading the coordinator's state", e))?
            .unwrap_or_default();
        kvs.first()
            .map(|kv| decode_state(&self.spec, &key, &kv.value))
            .transpose()
    }

    /// The coordinator's state as the cluster last recorded it (`None`: never).
    pub fn load_state(&self) -> Result<Option<Persisted>, ClusterError> {
        let key = self.key("state");
        let kvs = self
            .etcd
            .range(&key, false)
            .map_err(|e| self.etcd_err("reading the coordinator's state", e))?;
        kvs.first()
            .map(|kv| decode_state(&self.spec, &key, &kv.value))
            .transpose()
    }

    /// Writes the coordinator's state if this node still leads, on the member's writer thread;
    /// the returned future may be awaited on any executor.
    pub fn save_state(
        &self,
        p: &Persisted,
    ) -> impl std::future::Future<Output = Result<(), super::SaveError>> + use<> {
        let etcd = self.etcd.clone();
        let fence = self.fenced();
        let state_key = self.key("state");
        let node_id = self.node_id.clone();
        let cluster = self.spec.to_string();
        let text = String::from_utf8(StateFile::encode(p)).expect("the state is text");
        let (tx, rx) = flume::bounded(1);
        let job = move || {
            let result = match etcd.txn(fence, vec![put(&state_key, &text, None)], vec![]) {
                Ok((true, _)) => Ok(()),
                Ok((false, _)) => Err(super::SaveError::Fenced(format!(
                    "node {node_id} no longer leads the cluster {cluster}"
                ))),
                Err(e) => Err(super::SaveError::Unavailable(e)),
            };
            let _ = tx.send(result);
        };
        let _ = self.writes.send(Box::new(job));
        async move {
            rx.recv_async().await.unwrap_or_else(|_| {
                Err(super::SaveError::Unavailable(
                    "the cluster client stopped".into(),
                ))
            })
        }
    }

    /// The comparisons that make a transaction this leader's only: `P/leader` holds its id
    /// under its lease.
    fn fenced(&self) -> Vec<serde_json::Value> {
        let leader_key = self.key("leader");
        vec![
            cmp_value(&leader_key, &self.node_id),
            cmp_lease(&leader_key, self.lease),
        ]
    }

    /// The other live members that run shards (their id and `peer` address), by id.
    pub fn hosts(&self) -> Result<Vec<(String, String)>, ClusterError> {
        let prefix = self.key("nodes/");
        let kvs = self
            .etcd
            .range(&prefix, true)
            .map_err(|e| self.etcd_err("listing the nodes", e))?;
        let mut hosts: Vec<(String, String)> = entries(&self.spec, &prefix, kvs)?
            .into_iter()
            .filter(|(id, entry, _)| *id != self.node_id && !entry.peer.is_empty())
            .map(|(id, entry, _)| (id, entry.peer))
            .collect();
        hosts.sort();
        Ok(hosts)
    }

    /// The nodes this leader last placed the shards over (itself first).
    pub fn placed_over(&self) -> Vec<String> {
        self.placed_over.lock().expect("placement lock").clone()
    }

    /// Records where this leader placed the shards over `nodes`, if it still leads.
    pub fn save_placement(
        &self,
        placement: &Placement,
        nodes: &[String],
    ) -> Result<(), ClusterError> {
        let (leads, _) = self
            .etcd
            .txn(
                self.fenced(),
                vec![put(&self.key("placement"), &placement.encode(), None)],
                vec![],
            )
            .map_err(|e| self.etcd_err("recording the placement", e))?;
        if !leads {
            return Err(LeaseLost.into());
        }
        *self.placed_over.lock().expect("placement lock") = nodes.to_vec();
        Ok(())
    }

    /// A leader that starts its node again (a shard host was lost) takes the next epoch, so
    /// that nothing it writes from now on has the name of something the run before wrote.
    pub fn next_epoch(&self) -> Result<u64, ClusterError> {
        let leader_key = self.key("leader");
        let epoch_key = self.key("epoch");
        loop {
            if self.clock.is_lost() {
                return Err(LeaseLost.into());
            }
            let kv = self
                .etcd
                .range(&epoch_key, false)
                .map_err(|e| self.etcd_err("reading the epoch", e))?;
            let Some(kv) = kv.into_iter().next() else {
                return Err(LeaseLost.into());
            };
            let epoch = parse_epoch(&self.spec, &epoch_key, &kv.value)?;
            let next = epoch_after(&self.spec, &epoch_key, epoch)?;
            let mut unchanged = self.fenced();
            unchanged.push(cmp_value(&epoch_key, &kv.value));
            let (done, answers) = self
                .etcd
                .txn(
                    unchanged,
                    vec![put(&epoch_key, &next.to_string(), None)],
                    vec![range(&leader_key)],
                )
                .map_err(|e| self.etcd_err("raising the epoch", e))?;
            if done {
                self.epoch.store(next, Ordering::Release);
                self.entry.lock().expect("entry lock").epoch = next;
                return Ok(next);
            }
            let leader = answers
                .first()
                .map(super::gateway::range_response)
                .transpose()
                .map_err(|e| self.etcd_err("raising the epoch", e))?
                .and_then(|kvs| kvs.into_iter().next());
            if !leader.is_some_and(|l| l.value == self.node_id && l.lease == self.lease) {
                return Err(LeaseLost.into());
            }
            // The epoch moved under this leader: only this leader raises it, so this request
            // committed before its answer was lost. Read it again; the next try raises it once
            // more, which only skips an epoch.
        }
    }

    /// Leaves the cluster: revokes the lease, which removes the node's entry and, if it
    /// leads, the leadership, so that a standby takes over at once.
    /// Once only; nothing to revoke once the lease is lost.
    pub fn leave(&self) {
        if self.stop.swap(true, Ordering::AcqRel) || self.clock.is_lost() {
            self.clock.lose();
            return;
        }
        match self.etcd.revoke(self.lease) {
            Ok(()) => tracing::info!("left the cluster {}", self.spec),
            Err(e) => tracing::warn!(
                "leaving the cluster {}: {e} (the lease expires by itself)",
                self.spec
            ),
        }
        self.clock.lose();
    }

    /// The address the leader of `spec` advertises (`None`: no member leads now).
    pub fn leader_address(spec: &ClusterSpec) -> Result<Option<String>, ClusterError> {
        let nodes_prefix = key(spec, "nodes/");
        let [leader, nodes] = read_together(
            spec,
            "finding the leader",
            [
                range(&key(spec, "leader")),
                super::gateway::range_prefix(&nodes_prefix),
            ],
        )?;
        let Some(leader) = leader.into_iter().next().map(|kv| kv.value) else {
            return Ok(None);
        };
        let entry_key = format!("{nodes_prefix}{leader}");
        let corrupt = |reason: String| ClusterError::Corrupt {
            cluster: spec.to_string(),
            key: entry_key.clone(),
            reason,
        };
        let entry = nodes
            .into_iter()
            .find(|kv| kv.key == entry_key)
            .ok_or_else(|| corrupt(format!("node {leader} leads, but has no entry")))?;
        let entry = NodeEntry::decode(&entry.value).map_err(corrupt)?;
        Ok(Some(entry.advertise))
    }

    /// The cluster as its keys describe it now (read in one transaction, so the leader, the
    /// epoch, the state and the entries belong together).
    pub fn snapshot(spec: &ClusterSpec) -> Result<Snapshot, ClusterError> {
        let corrupt = |key: &str, reason: String| ClusterError::Corrupt {
            cluster: spec.to_string(),
            key: key.to_owned(),
            reason,
        };
        let nodes_prefix = key(spec, "nodes/");
        let [leader, epoch, state, listed, placement] = read_together(
            spec,
            "reading the cluster's keys",
            [
                range(&key(spec, "leader")),
                range(&key(spec, "epoch")),
                range(&key(spec, "state")),
                super::gateway::range_prefix(&nodes_prefix),
                range(&key(spec, "placement")),
            ],
        )?;
        let one = |kvs: Vec<Kv>| kvs.into_iter().next().map(|kv| kv.value);
        let leader = one(leader);
        let epoch_key = key(spec, "epoch");
        let epoch = match one(epoch) {
            Some(t) => t
                .parse()
                .map_err(|_| corrupt(&epoch_key, format!("`{t}` is not a number")))?,
            None => 0,
        };
        let state = one(state)
            .map(|t| decode_state(spec, &key(spec, "state"), &t))
            .transpose()?;
        let placement_key = key(spec, "placement");
        let placement = one(placement)
            .map(|t| Placement::decode(&t).map_err(|r| corrupt(&placement_key, r)))
            .transpose()?;
        let etcd = Gateway::new(&spec.endpoints);
        let nodes = entries(spec, &nodes_prefix, listed)?
            .into_iter()
            .map(|(id, entry, lease)| {
                let ttl = etcd.time_to_live(lease).map_or(-1, |(ttl, _)| ttl);
                (id, entry, ttl)
            })
            .collect();
        Ok(Snapshot {
            leader,
            epoch,
            state,
            nodes,
            placement,
        })
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Why an attempt to lead failed.
enum Campaign {
    /// etcd did not answer: try again.
    Unavailable(String),
    /// The cluster's keys forbid it: stop.
    Fatal(ClusterError),
}

impl From<String> for Campaign {
    fn from(e: String) -> Self {
        Campaign::Unavailable(e)
    }
}

fn parse_epoch(spec: &ClusterSpec, key: &str, text: &str) -> Result<u64, ClusterError> {
    text.parse().map_err(|_| ClusterError::Corrupt {
        cluster: spec.to_string(),
        key: key.to_owned(),
        reason: format!("`{text}` is not an epoch number"),
    })
}

/// The epoch after `epoch`, unless the cluster used up the epochs file ids can hold.
fn epoch_after(spec: &ClusterSpec, key: &str, epoch: u64) -> Result<u64, ClusterError> {
    if epoch < super::MAX_EPOCH {
        return Ok(epoch + 1);
    }
    Err(ClusterError::Corrupt {
        cluster: spec.to_string(),
        key: key.to_owned(),
        reason: format!(
            "{epoch} leaderships used up the {} a cluster can have (file ids hold 16 bits of \
             epoch): start the cluster on a new prefix",
            super::MAX_EPOCH
        ),
    })
}

/// The node entries under `prefix`: each node's id, entry and lease.
fn entries(
    spec: &ClusterSpec,
    prefix: &str,
    kvs: Vec<Kv>,
) -> Result<Vec<(String, NodeEntry, i64)>, ClusterError> {
    kvs.into_iter()
        .map(|kv| {
            let entry = NodeEntry::decode(&kv.value).map_err(|reason| ClusterError::Corrupt {
                cluster: spec.to_string(),
                key: kv.key.clone(),
                reason,
            })?;
            let id = kv.key.strip_prefix(prefix).unwrap_or(&kv.key).to_owned();
            Ok((id, entry, kv.lease))
        })
        .collect()
}

/// Reads every range of `ops` in one transaction (so they belong together): the key-values of
/// each, in order.
fn read_together<const N: usize>(
    spec: &ClusterSpec,
    what: &str,
    ops: [serde_json::Value; N],
) -> Result<[Vec<Kv>; N], ClusterError> {
    let err = |reason: String| ClusterError::Etcd {
        cluster: spec.to_string(),
        what: what.to_owned(),
        reason,
    };
    let (_, answers) = Gateway::new(&spec.endpoints)
        .txn(vec![], ops.to_vec(), vec![])
        .map_err(err)?;
    let mut out = std::array::from_fn(|_| Vec::new());
    for (slot, answer) in out.iter_mut().zip(&answers) {
        *slot = super::gateway::range_response(answer).map_err(err)?;
    }
    Ok(out)
}

fn key(spec: &ClusterSpec, name: &str) -> String {
    format!("{}/{name}", spec.prefix)
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

fn decode_state(spec: &ClusterSpec, key: &str, text: &str) -> Result<Persisted, ClusterError> {
    let named = std::path::PathBuf::from(format!("{spec}/{key}"));
    StateFile::decode(text, &named).map_err(|e| ClusterError::Corrupt {
        cluster: spec.to_string(),
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// Keeps `lease` alive, every quarter of its TTL, and tells `clock` how long it stands. A
/// renewal etcd answers with no TTL means the lease expired: `clock` loses it and `lost` is
/// told.
fn keep_alive(
    etcd: &Gateway,
    lease: i64,
    ttl: Duration,
    clock: &LeaseClock,
    lost: &flume::Sender<()>,
    stop: &AtomicBool,
) {
    let every = (ttl / 4).max(Duration::from_millis(100));
    let mut last_error: Option<String> = None;
    while !stop.load(Ordering::Acquire) {
        let sent = Instant::now();
        match etcd.keep_alive(lease) {
            Ok(ttl) if ttl > 0 => {
                clock.renewed(sent, Duration::from_secs(ttl.unsigned_abs()));
                if last_error.take().is_some() {
                    tracing::info!("the cluster lease is renewed again");
                }
            }
            Ok(_) => {
                if !stop.load(Ordering::Acquire) {
                    tracing::error!("the cluster lease {lease:x} expired");
                    clock.lose();
                    let _ = lost.try_send(());
                }
                return;
            }
            Err(e) => {
                if last_error.as_ref() != Some(&e) {
                    tracing::warn!(
                        "renewing the cluster lease: {e} (it stands for {:?} more)",
                        clock.remaining()
                    );
                    last_error = Some(e);
                }
            }
        }
        let pause = if last_error.is_some() {
            Duration::from_millis(100)
        } else {
            every
        };
        std::thread::sleep(pause.saturating_sub(sent.elapsed()));
    }
}

/// Refreshes the node's entry every [`PUBLISH_EVERY`] with what its status says.
fn publish(
    etcd: &Gateway,
    key: &str,
    lease: i64,
    entry: &Mutex<NodeEntry>,
    status: &Mutex<Option<Arc<NodeStatus>>>,
    stop: &AtomicBool,
) {
    let mut last = String::new();
    loop {
        std::thread::sleep(PUBLISH_EVERY);
        if stop.load(Ordering::Acquire) {
            return;
        }
        let text = {
            let mut e = entry.lock().expect("entry lock");
            if let Some(s) = status.lock().expect("status lock").as_ref() {
                e.hwm = s.hwm.load(Ordering::Relaxed);
                e.checkpoint_id = s.checkpoint_id.load(Ordering::Relaxed);
                e.checkpoint_ts = s.checkpoint_ts.load(Ordering::Relaxed);
                e.txns_applied = s.txns_applied.load(Ordering::Relaxed);
                e.applied = (s.shard_applied.iter())
                    .map(|a| a.load(Ordering::Relaxed))
                    .collect();
            }
            e.encode()
        };
        if text == last {
            continue;
        }
        // Only while the entry is there: a node whose lease expired does not come back.
        if let Ok((true, _)) = etcd.txn(
            vec![cmp_lease(key, lease)],
            vec![put(key, &text, Some(lease))],
            vec![],
        ) {
            last = text;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_entry_reads_back() {
        let e = NodeEntry {
            advertise: "10.0.0.1:7400".into(),
            peer: "10.0.0.1:7500".into(),
            role: "leader".into(),
            epoch: 3,
            hwm: 1234,
            checkpoint_id: (3 << 32) + 2,
            checkpoint_ts: 1200,
            txns_applied: 99,
            applied: vec![1200, 1234],
            joined_ms: 1_700_000_000_000,
        };
        assert_eq!(NodeEntry::decode(&e.encode()).unwrap(), e);
        assert!(NodeEntry::decode("role").unwrap_err().contains("key=value"));
        assert!(NodeEntry::decode("hwm=x").unwrap_err().contains("`hwm`"));
    }

    #[test]
    fn a_placement_reads_back() {
        let nodes = ["n1".to_owned(), "n2".to_owned(), "n3".to_owned()];
        let p = Placement::round_robin(4, 5, &nodes);
        assert_eq!(p.owners, ["n1", "n2", "n3", "n1", "n2"]);
        assert_eq!(Placement::decode(&p.encode()).unwrap(), p);
        assert!(Placement::decode("1=n1").unwrap_err().contains("order"));
    }
}
