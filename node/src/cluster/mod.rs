//! A node's place in a cluster: membership, leadership and the coordinator's durable state in
//! a metadata store.
//!
//! - [`store`]: where the coordinator's state lives ([`MetaStore`]): the data directory's
//!   state file for a node on its own (the default: no etcd needed), or etcd for a cluster.
//! - [`etcd`]: a node's membership in an etcd cluster ([`Member`]): a lease kept alive, the
//!   node's entry under it, the election of the one node that replays (the leader) and the
//!   fenced writes of its state, through etcd's JSON gateway ([`gateway`]).
//! - [`forward`]: a standby's `--listen`, passing each connection to the leader's.
//! - [`LeaseClock`]: how long the leader may still act on its lease, as it last heard from
//!   etcd. Timestamps are handed out only while it runs; once it runs out (etcd unreachable)
//!   replay pauses, and it resumes when etcd answers again and the lease still stands.
//!
//! One node leads at a time: it runs the coordinator, the sink and the shards. The others wait
//! as standbys and take over when the leader's lease expires, each leadership with a higher
//! epoch. A leader's epoch is in the high bits of every file and checkpoint id it makes, so a
//! deposed leader that still writes to the lake never overwrites what its successor writes.

pub mod etcd;
pub mod forward;
pub mod gateway;
pub mod store;

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use etcd::{ClusterError, Member, NodeEntry, Placement, Snapshot};
pub use store::{MetaStore, SaveError};

/// Where a cluster's metadata lives: `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// `http://HOST:PORT` of each etcd member.
    pub endpoints: Vec<String>,
    /// The key prefix every key of this cluster lives under (no trailing `/`).
    pub prefix: String,
}

impl FromStr for ClusterSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let rest = s
            .strip_prefix("etcd://")
            .ok_or_else(|| format!("`{s}`: expected etcd://HOST:PORT[,HOST:PORT...]/PREFIX"))?;
        let (hosts, prefix) = rest
            .split_once('/')
            .ok_or_else(|| format!("`{s}`: no /PREFIX after the endpoints"))?;
        let prefix = prefix.trim_end_matches('/');
        if prefix.is_empty() || prefix.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "`{s}`: the prefix must be non-empty, without spaces"
            ));
        }
        let endpoints = hosts
            .split(',')
            .enumerate()
            .map(|(i, h)| match h.rsplit_once(':') {
                Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(format!("http://{h}"))
                }
                _ => Err(format!(
                    "`{s}`: endpoint {} (`{h}`) is not HOST:PORT",
                    i + 1
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ClusterSpec {
            endpoints,
            prefix: prefix.to_owned(),
        })
    }
}

impl fmt::Display for ClusterSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts: Vec<&str> = (self.endpoints.iter())
            .map(|e| e.strip_prefix("http://").unwrap_or(e))
            .collect();
        write!(f, "etcd://{}/{}", hosts.join(","), self.prefix)
    }
}

/// How long the lease still stands, as the node last heard from etcd, and whether it is gone.
///
/// A renewal counts from when its request was *sent*: etcd extends the lease when it receives
/// the request, later, so the node's view always ends before etcd's does.
pub struct LeaseClock {
    base: Instant,
    /// Milliseconds after `base` until which the lease stands (0: not yet renewed).
    valid_until_ms: AtomicU64,
    lost: AtomicBool,
}

impl Default for LeaseClock {
    fn default() -> Self {
        LeaseClock {
            base: Instant::now(),
            valid_until_ms: AtomicU64::new(0),
            lost: AtomicBool::new(false),
        }
    }
}

impl LeaseClock {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// etcd renewed the lease for `ttl` on a request sent at `sent`.
    pub fn renewed(&self, sent: Instant, ttl: Duration) {
        let until = sent.saturating_duration_since(self.base) + ttl;
        let until = u64::try_from(until.as_millis()).unwrap_or(u64::MAX);
        self.valid_until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// etcd no longer has the lease: this node is no member (nor leader) any more.
    pub fn lose(&self) {
        self.lost.store(true, Ordering::Release);
    }

    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Whether the node may act on its lease now.
    pub fn valid(&self) -> bool {
        !self.is_lost() && self.now_ms() < self.valid_until_ms.load(Ordering::Acquire)
    }

    /// How long the lease still stands (zero once it ran out).
    pub fn remaining(&self) -> Duration {
        let until = self.valid_until_ms.load(Ordering::Acquire);
        Duration::from_millis(until.saturating_sub(self.now_ms()))
    }

    /// Blocks until the lease stands; `Err` once it is lost for good.
    pub fn wait_valid(&self) -> Result<(), LeaseLost> {
        let mut waited = false;
        loop {
            if self.is_lost() {
                return Err(LeaseLost);
            }
            if self.valid() {
                if waited {
                    tracing::info!("the cluster lease stands again: replay goes on");
                }
                return Ok(());
            }
            if !waited {
                tracing::warn!(
                    "the cluster lease is not renewed (etcd unreachable?): replay pauses until it is"
                );
                waited = true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// The node's lease is gone: another node may lead now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this node's cluster lease expired: another node may lead now")]
pub struct LeaseLost;

/// The bits of a file or checkpoint id below a leadership's epoch.
pub const EPOCH_SHIFT: u32 = 32;

/// Epochs a cluster can have: a file's sequence has 48 bits (see
/// [`retina_storage::FileId`]), of which the epoch takes the 16 above [`EPOCH_SHIFT`].
pub const MAX_EPOCH: u64 = (1 << 16) - 1;

/// The first file sequence and checkpoint id of leadership `epoch` (0 for a node on its own).
pub fn epoch_base(epoch: u64) -> u64 {
    epoch << EPOCH_SHIFT
}

/// Bits of a file sequence below the epoch's that number a shard's generation: a shard a
/// leader starts again in its leadership (its member was lost) numbers its files from
/// [`generation_base`], above every file an earlier generation of it can have made.
const GENERATION_SHIFT: u32 = 24;

/// Generations of one shard in one leadership; past it the leader takes the next epoch.
pub const MAX_GENERATION: u32 = (1 << (EPOCH_SHIFT - GENERATION_SHIFT)) - 1;

/// The first file sequence of generation `generation` of a shard in leadership `epoch`.
pub fn generation_base(epoch: u64, generation: u32) -> u64 {
    assert!(
        generation <= MAX_GENERATION,
        "generation {generation} is past the last"
    );
    epoch_base(epoch) + (u64::from(generation) << GENERATION_SHIFT)
}

/// The leadership that made file `id` (0: a node on its own, or before any).
pub fn file_epoch(id: retina_storage::FileId) -> u64 {
    (id.0 >> EPOCH_SHIFT) & MAX_EPOCH
}

/// The leadership that made checkpoint `id`.
pub fn checkpoint_epoch(id: u64) -> u64 {
    id >> EPOCH_SHIFT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_cluster_url() {
        let s: ClusterSpec = "etcd://127.0.0.1:2379,10.0.0.2:2379/retina/prod/"
            .parse()
            .unwrap();
        assert_eq!(
            s.endpoints,
            ["http://127.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        assert_eq!(s.prefix, "retina/prod");
        assert_eq!(
            s.to_string(),
            "etcd://127.0.0.1:2379,10.0.0.2:2379/retina/prod"
        );
        for (bad, says) in [
            ("http://h:1/p", "expected etcd://"),
            ("etcd://h:1", "no /PREFIX"),
            ("etcd://h:1/", "prefix must be non-empty"),
            ("etcd://h:1,h/p", "endpoint 2 (`h`)"),
            ("etcd://h:x/p", "endpoint 1"),
        ] {
            let e = bad.parse::<ClusterSpec>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn a_lease_stands_until_its_ttl_from_the_renewal_request() {
        let c = LeaseClock::default();
        assert!(!c.valid(), "not yet renewed");
        c.renewed(Instant::now(), Duration::from_secs(5));
        assert!(c.valid());
        assert!(c.remaining() > Duration::from_secs(4));
        // A renewal sent long ago ended already; it never shortens a later one.
        c.renewed(
            Instant::now() - Duration::from_secs(60),
            Duration::from_secs(5),
        );
        assert!(c.valid());
        c.lose();
        assert!(!c.valid());
        assert_eq!(c.wait_valid(), Err(LeaseLost));
    }

    #[test]
    fn an_epoch_owns_the_high_bits() {
        assert_eq!(epoch_base(0), 0);
        assert_eq!(epoch_base(3), 3 << 32);
        assert_eq!(generation_base(3, 0), epoch_base(3));
        assert!(generation_base(3, MAX_GENERATION) + (1 << 24) - 1 < epoch_base(4));
        assert_eq!(
            file_epoch(retina_storage::FileId::new(7, generation_base(3, 5) + 9)),
            3
        );
        let file = retina_storage::FileId::new(7, epoch_base(3) + 12);
        assert_eq!(file_epoch(file), 3);
        assert_eq!(file_epoch(retina_storage::FileId::new(7, 12)), 0);
        assert_eq!(checkpoint_epoch(epoch_base(MAX_EPOCH) + 1), MAX_EPOCH);
        retina_storage::FileId::new(u16::MAX, epoch_base(MAX_EPOCH) + u64::from(u32::MAX));
    }
}
