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
//! A connection that ends while the leader runs fails the leader's node: HWM stays where
//! the shard left it (queries go on at the last consistent snapshot), and the leader starts
//! again from the newest checkpoint with the next epoch, placing the shards over the members
//! that are live then (a restarted member rejoins; one whose lease expired is left out).
//!
//! Frames: [`wire`]; the actors' messages in them: [`msg`].

pub mod host;
pub mod msg;
pub mod proxy;
pub mod wire;

use std::time::{Duration, Instant};

use crate::cluster::{ClusterError, Member, Placement};
pub use host::{Host, HostOptions, HostStatus};
pub use proxy::Connected;
pub use wire::Hello;

/// How long a leader waits for a placed member that does not answer while its lease stands.
const PLACE_WITHIN: Duration = Duration::from_secs(120);

/// Places `shards` shards over this leader and the cluster's live hosts, and connects to the
/// hosts for theirs: a connection per shard placed elsewhere (`None`: this node's own). A
/// member that does not answer is waited for while it stays registered; once its lease
/// expires the shards are placed again without it.
pub fn place(
    member: &Member,
    shards: u16,
    hello: &Hello,
) -> Result<Vec<Option<Connected>>, ClusterError> {
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
            return Ok(connected);
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
