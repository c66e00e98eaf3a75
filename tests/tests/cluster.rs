//! The cluster's metadata store against a real etcd (Debian's `etcd-server`, skipped with a
//! note where it is not installed, except in CI): one leader at a time, each with a higher
//! epoch; the coordinator's state written only by the node that leads; membership under
//! leases.

use std::time::Duration;

use futures::executor::block_on;
use retina_node::cluster::{ClusterSpec, Member, SaveError};
use retina_node::coordinator::{CheckpointRecord, Persisted, SourceMark};
use retina_storage::{Hwm, Timestamp};
use retina_tests::etcd::Etcd;

fn state(ts: u64, id: u64) -> Persisted {
    let ts = Timestamp::new(ts).unwrap();
    Persisted {
        hwm: Hwm::after(ts).unwrap(),
        checkpoint: Some(CheckpointRecord {
            id,
            ts,
            shards: 2,
            source: SourceMark {
                offset: ts.get() * 100,
                line: ts.get() * 3,
            },
        }),
    }
}

#[test]
fn only_the_leader_writes_the_state_and_each_leadership_has_a_new_epoch() {
    let Some(etcd) = Etcd::start() else { return };
    let spec: ClusterSpec = etcd.url("fence").parse().unwrap();
    let ttl = Duration::from_secs(2);
    let one = Member::join(&spec, "one", "127.0.0.1:1", None, ttl).unwrap();
    let two = Member::join(&spec, "two", "127.0.0.1:2", None, ttl).unwrap();
    assert_eq!(one.load_state().unwrap(), None);
    assert_eq!(one.lead().unwrap(), 1);
    block_on(one.save_state(&state(10, 1 << 32))).unwrap();
    assert_eq!(two.load_state().unwrap(), Some(state(10, 1 << 32)));
    // A standby cannot write it.
    assert!(matches!(
        block_on(two.save_state(&state(11, 1 << 32 | 1))),
        Err(SaveError::Fenced(_))
    ));

    // `one` leaves (as on a stop): `two` leads with the next epoch; `one`'s writes now fail.
    one.leave();
    assert_eq!(two.lead().unwrap(), 2);
    assert!(matches!(
        block_on(one.save_state(&state(12, 1 << 32 | 2))),
        Err(SaveError::Fenced(_))
    ));
    block_on(two.save_state(&state(13, 2 << 32))).unwrap();
    assert_eq!(two.load_state().unwrap(), Some(state(13, 2 << 32)));

    let s = Member::snapshot(&spec).unwrap();
    assert_eq!(s.leader.as_deref(), Some("two"));
    assert_eq!(s.epoch, 2);
    assert_eq!(s.state, Some(state(13, 2 << 32)));
    let ids: Vec<&str> = s.nodes.iter().map(|(id, _, _)| id.as_str()).collect();
    assert_eq!(ids, ["two"], "`one`'s entry went with its lease");
    assert_eq!(s.nodes[0].1.role, "leader");
    assert_eq!(s.nodes[0].1.advertise, "127.0.0.1:2");

    // Only the leader reads the state to lead from it.
    let three = Member::join(&spec, "three", "127.0.0.1:3", None, ttl).unwrap();
    assert!(three.load_state_to_lead().is_err());
    assert_eq!(two.load_state_to_lead().unwrap(), Some(state(13, 2 << 32)));

    // A node id a live member holds is refused, naming where that member is.
    let e = Member::join(&spec, "three", "127.0.0.1:4", None, ttl)
        .err()
        .expect("`three` is live")
        .to_string();
    assert!(e.contains("a live node (at `127.0.0.1:3`)"), "{e}");

    // One that stopped without leaving (a crash) is waited for until its lease expires, then
    // taken over; the leadership went with the lease.
    drop(two);
    let again = Member::join(&spec, "two", "127.0.0.1:5", None, ttl).unwrap();
    let s = Member::snapshot(&spec).unwrap();
    assert_eq!(s.leader, None, "the crashed leader's lease expired");
    assert_eq!(again.lead().unwrap(), 3);
}

#[test]
fn a_cluster_that_cannot_be_reached_is_an_error_naming_it() {
    let port = retina_bench::ports::free_port();
    let spec: ClusterSpec = format!("etcd://127.0.0.1:{port}/x").parse().unwrap();
    let e = Member::join(&spec, "n", "127.0.0.1:1", None, Duration::from_secs(2))
        .err()
        .expect("nothing listens there")
        .to_string();
    assert!(e.contains(&format!("etcd://127.0.0.1:{port}/x")), "{e}");
}
