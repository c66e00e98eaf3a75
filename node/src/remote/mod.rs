//! Shards on other machines. A cluster's leader runs the coordinator and the sink; it places
//! the shards over itself and every other live member that serves a `--peer` address
//! (round-robin: shard `k` on the `k mod n`-th, the leader first), and records the placement
//! in the cluster's metadata store. For each shard placed elsewhere it opens one TCP
//! connection to that member:
//!
//! - the leader's side ([`proxy`]) takes the shard's queues as a local shard would and sends
//!   the same rkyv batch bytes a local shard reads, with credit-based flow control, and hands
//!   the shard's reports (applied through, checkpoint images written, files combined, queries
//!   known) to the coordinator. HWM is the minimum over every shard, wherever it runs;
//! - the member's side ([`host`]) runs the shard on an executor of its own, from the
//!   checkpoint the leader started from (its image fetched from the lake), with its own scan
//!   service, which the scan plans name for that shard's files and write buffer.
//!
//! A connection that ends while the leader runs starts that shard again, alone: HWM stays
//! where the shard left it, the proxy connects a new run of it ([`Rejoiner`]: on the same
//! member once it is back, else, once the member's lease expired, on the live member with the
//! fewest shards), and sends it the batches since the newest complete checkpoint again. The
//! other shards go on. Where that cannot be (no other member, or more batches since the
//! checkpoint than a proxy keeps), the leader's node fails, and the leader starts every shard
//! again from the newest checkpoint with the next epoch, placing them over the members that
//! are live then.
//!
//! Frames: [`wire`]; the actors' messages in them: [`msg`].

pub mod host;
pub mod msg;
pub mod proxy;
pub mod wire;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use retina_storage::Timestamp;

use crate::cluster::{ClusterError, Member, Placement};
use crate::rpc::ScanAddrs;
pub use host::{Host, HostOptions, HostStatus};
pub use proxy::{Connected, Rejoin};
pub use wire::Hello;

/// How long a leader waits for a placed member that does not answer while its lease stands.
const PLACE_WITHIN: Duration = Duration::from_secs(120);

/// How long a lost shard waits for a member that stays registered but does not answer (cut off
/// from the leader, not from etcd) before it moves to another.
const OWNER_WITHIN: Duration = Duration::from_secs(10);

/// Where a leader placed the shards, and the connections to the members for theirs (`None`:
/// this node's own).
pub struct Placed {
    pub connections: Vec<Option<Connected>>,
    pub placement: Placement,
    /// The nodes placed over, this leader first.
    pub nodes: Vec<String>,
}

/// Places `shards` shards over this leader and the cluster's live hosts, and connects to the
/// hosts for theirs: a connection per shard placed elsewhere (`None`: this node's own). A
/// member that does not answer is waited for while it stays registered; once its lease
/// expires the shards are placed again without it.
pub fn place(member: &Member, shards: u16, hello: &Hello) -> Result<Placed, ClusterError> {
    let deadline = Instant::now() + PLACE_WITHIN;
    let mut last_error = String::new();
    loop {
        member.clock().wait_valid()?;
        let hosts = member.hosts()?;
        let mut nodes = vec![member.node_id().to_owned()];
        nodes.extend(hosts.iter().map(|(id, _)| id.clone()));
        let placement = Placement::round_robin(hello.epoch, shards, &nodes);
        let mut connected = Vec::with_capacity(usize::from(shards));
        let mut failed = None;
        for (k, owner) in placement.owners.iter().enumerate() {
            let Some((_, peer)) = hosts.iter().find(|(id, _)| id == owner) else {
                connected.push(None);
                continue;
            };
            let shard = u16::try_from(k).expect("shards fit u16");
            match proxy::connect(shard, owner, peer, hello) {
                Ok(c) => connected.push(Some(c)),
                Err(e) => {
                    failed = Some(format!("shard {k} on node {owner} ({peer}): {e}"));
                    break;
                }
            }
        }
        let Some(error) = failed else {
            member.save_placement(&placement, &nodes)?;
            tracing::info!(
                "placed {shards} shards (leadership {}): {}",
                hello.epoch,
                placement
                    .owners
                    .iter()
                    .enumerate()
                    .map(|(k, n)| format!("{k}→{n}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            return Ok(Placed {
                connections: connected,
                placement,
                nodes,
            });
        };
        // The connections made go: their hosts end those sessions.
        drop(connected);
        if Instant::now() > deadline {
            return Err(ClusterError::Placement {
                cluster: member.spec().to_string(),
                reason: format!("{error} (for {PLACE_WITHIN:?}, while it stayed registered)"),
            });
        }
        if error != last_error {
            tracing::warn!(
                "waiting for a member to run its shards: {error}; once its lease expires the \
                 shards are placed without it"
            );
            last_error = error;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Starts lost shards again for a leader ([`proxy::Rejoin`]): on the member that ran the shard
/// once it answers again (a member started again listens on its `--peer` before it registers,
/// so the leader finds it at the address its old registration names while that lasts), else,
/// once that member's registration is gone (its lease expired) or it has not answered for
/// [`OWNER_WITHIN`], on the live member that runs the fewest shards; a member back after that
/// gets shards from the others ([`Rejoiner::rebalance`]). Records each move in the placement,
/// and points the scan plans at the new run's scan service.
pub struct Rejoiner {
    member: Arc<Member>,
    hello: Hello,
    scan: ScanAddrs,
    /// Whether proxies keep batches to start a shard again (`remote_redo_bytes` > 0).
    can_move: bool,
    placement: Mutex<Placement>,
    /// Members that did not answer while registered, since when.
    unanswered: Mutex<HashMap<String, Instant>>,
    /// Shards on their way to another member ([`Self::rebalance`]), and to which.
    moving: Mutex<HashMap<u16, String>>,
    /// Shards whose proxy could not hand them over (it kept too little).
    stuck: Mutex<std::collections::HashSet<u16>>,
    /// Each remote shard's proxy, told to hand its shard over to a new run.
    movers: Mutex<HashMap<u16, flume::Sender<()>>>,
}

impl Rejoiner {
    pub fn new(
        member: Arc<Member>,
        hello: Hello,
        placed: Placement,
        scan: ScanAddrs,
        can_move: bool,
    ) -> Self {
        Rejoiner {
            member,
            hello,
            scan,
            can_move,
            placement: Mutex::new(placed),
            unanswered: Mutex::new(HashMap::new()),
            moving: Mutex::new(HashMap::new()),
            stuck: Mutex::new(Default::default()),
            movers: Mutex::new(HashMap::new()),
        }
    }

    /// The channel that tells shard `shard`'s proxy to move it ([`proxy::ProxySetup::moves`]).
    pub fn mover(&self, shard: u16) -> flume::Receiver<()> {
        let (tx, rx) = flume::bounded(1);
        self.movers.lock().expect("movers").insert(shard, tx);
        rx
    }

    /// Gives members that run no shard (a member that joined, or came back after its shards
    /// moved) shards from the other members that run more than one more than they do, each
    /// handed over as a lost shard is (the old run stops after what it was sent, a new run
    /// starts on the new member from the newest complete checkpoint and is sent what came
    /// after it) while the other shards go on. False when some such member gets no shard that
    /// way (the shards to spare run on this leader itself, or proxies keep no batches): the
    /// leader then starts again to place them.
    pub fn rebalance(&self) -> bool {
        if !self.can_move {
            return false;
        }
        let Ok(hosts) = self.member.hosts() else {
            return false;
        };
        let leader = self.member.node_id();
        let stuck = self.stuck.lock().expect("stuck").clone();
        let mut moving = self.moving.lock().expect("moving");
        // Where each shard runs once the moves under way are done.
        let mut owners = self.placement.lock().expect("placement").owners.clone();
        for (shard, to) in moving.iter() {
            owners[usize::from(*shard)] = to.clone();
        }
        let load = |owners: &[String], id: &str| owners.iter().filter(|o| *o == id).count();
        let newcomers: Vec<String> = hosts
            .iter()
            .filter(|(id, _)| load(&owners, id) == 0)
            .map(|(id, _)| id.clone())
            .collect();
        let mut every_one_runs_shards = true;
        for newcomer in newcomers {
            // The last movable shard of the member that runs the most (at least two more).
            let movable =
                |k: usize| !stuck.contains(&(k as u16)) && !moving.contains_key(&(k as u16));
            let donor = hosts
                .iter()
                .map(|(id, _)| id)
                .filter(|id| *id != leader && load(&owners, id) > 1)
                .filter(|id| (0..owners.len()).any(|k| owners[k] == **id && movable(k)))
                .max_by_key(|id| (load(&owners, id), std::cmp::Reverse((*id).clone())));
            let Some(donor) = donor.cloned() else {
                every_one_runs_shards = false;
                continue;
            };
            let shard = (0..owners.len())
                .rev()
                .find(|&k| owners[k] == donor && movable(k))
                .expect("a donor's movable shard");
            let shard = u16::try_from(shard).expect("shards fit u16");
            let told = self
                .movers
                .lock()
                .expect("movers")
                .get(&shard)
                .is_some_and(|tx| tx.try_send(()).is_ok() || tx.is_full());
            if !told {
                every_one_runs_shards = false;
                continue;
            }
            tracing::info!("moving shard {shard} from node {donor} to node {newcomer}");
            owners[usize::from(shard)] = newcomer.clone();
            moving.insert(shard, newcomer.clone());
        }
        every_one_runs_shards
    }

    /// Whether `node` has not answered the leader for [`OWNER_WITHIN`] while registered.
    fn silent(&self, node: &str) -> bool {
        self.unanswered
            .lock()
            .expect("unanswered")
            .get(node)
            .is_some_and(|t| t.elapsed() > OWNER_WITHIN)
    }
}

impl Rejoin for Rejoiner {
    fn rejoin(
        &self,
        shard: u16,
        generation: u32,
        from: Option<(u64, Timestamp)>,
    ) -> Result<Option<Connected>, String> {
        let leader = self.member.node_id().to_owned();
        if self.member.clock().is_lost() {
            return Err("this leader's cluster lease expired".into());
        }
        if !self.member.clock().valid() {
            // Cut off from etcd for now: replay pauses, and so does this.
            return Ok(None);
        }
        let hosts = match self.member.hosts() {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!("shard {shard}: listing the members: {e}");
                return Ok(None);
            }
        };
        let live = |id: &str| {
            hosts
                .iter()
                .find(|(h, _)| h == id && !self.silent(id))
                .cloned()
        };
        let owner = self.placement.lock().expect("placement").owners[usize::from(shard)].clone();
        let planned = {
            let mut moving = self.moving.lock().expect("moving");
            let to = moving.get(&shard).cloned();
            match to.as_deref().and_then(live) {
                Some(host) => Some(host),
                None => {
                    // Its new member is gone or silent: the shard goes where a lost one would.
                    moving.remove(&shard);
                    None
                }
            }
        };
        let target = match planned.or_else(|| live(&owner)) {
            Some(host) => host,
            None => {
                let placement = self.placement.lock().expect("placement");
                let load = |id: &String| placement.owners.iter().filter(|o| *o == id).count();
                hosts
                    .iter()
                    .filter(|(id, _)| *id != owner && !self.silent(id))
                    .min_by_key(|(id, _)| (load(id), id.clone()))
                    .cloned()
                    .ok_or_else(|| {
                        format!(
                            "shard {shard}: node {owner} is gone, and no other member that runs \
                             shards answers"
                        )
                    })?
            }
        };
        let hello = Hello {
            generation,
            checkpoint: from,
            catalog: self.hello.catalog.clone(),
            ..self.hello
        };
        let conn = match proxy::connect(shard, &target.0, &target.1, &hello) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!("shard {shard} on node {}: {e}", target.0);
                let mut unanswered = self.unanswered.lock().expect("unanswered");
                unanswered.entry(target.0).or_insert_with(Instant::now);
                return Ok(None);
            }
        };
        self.unanswered
            .lock()
            .expect("unanswered")
            .remove(&target.0);
        self.moving.lock().expect("moving").remove(&shard);
        if let Some(addr) = self
            .scan
            .write()
            .expect("scan addresses")
            .get_mut(usize::from(shard))
        {
            *addr = conn.scan;
        }
        if target.0 != owner {
            let mut placement = self.placement.lock().expect("placement");
            placement.owners[usize::from(shard)] = target.0.clone();
            // The nodes placed over: this leader, then the live members placed over before
            // and the new one; the old owner only if it still runs a shard.
            let mut nodes = vec![leader.clone()];
            for n in self.member.placed_over().iter().chain([&target.0]) {
                let left = *n == owner && !placement.owners.contains(n);
                let registered = hosts.iter().any(|(h, _)| h == n);
                if *n != leader && registered && !left && !nodes.contains(n) {
                    nodes.push(n.clone());
                }
            }
            self.member
                .save_placement(&placement, &nodes)
                .map_err(|e| e.to_string())?;
            tracing::info!("shard {shard} moved from node {owner} to node {}", target.0);
        }
        Ok(Some(conn))
    }

    fn stays(&self, shard: u16) {
        self.moving.lock().expect("moving").remove(&shard);
        self.stuck.lock().expect("stuck").insert(shard);
    }
}
