//! Tests of [`CoordinatorState`]: each call on its own, and random sequences of them.

use super::*;
use crate::coordinator::persist::StateFile;

/// Writes `p` the way the coordinator does, on a glommio executor of its own.
fn store(file: &StateFile, p: Persisted) {
    let dir = file.path().parent().unwrap().to_owned();
    glommio::LocalExecutorBuilder::default()
        .spawn(move || async move { StateFile::new(&dir).write(&p).await })
        .unwrap()
        .join()
        .unwrap()
        .unwrap();
}

fn ts(v: u64) -> Timestamp {
    Timestamp::new(v).unwrap()
}

#[test]
fn hwm_is_the_slowest_shard_plus_one() {
    let mut c = CoordinatorState::new(2, Persisted::default(), false);
    let range = c.allocate(10).unwrap();
    assert_eq!(range, 2..=11);
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
    let mut c = CoordinatorState::new(1, Persisted::default(), false);
    c.allocate(100).unwrap();
    c.applied(0, ts(10)).unwrap();
    let (q1, s1) = c.begin_query(LOCAL, 0, 1000).unwrap();
    assert_eq!(s1, ts(10));
    c.applied(0, ts(20)).unwrap();
    let (q2, _) = c.begin_query(LOCAL, 500, 1000).unwrap();
    assert_eq!(c.lwm().get(), ts(10));
    assert!(c.renew_query(LOCAL, q2, 900, 1000).is_some());
    assert_eq!(c.expire_queries(1000), vec![q1]);
    assert_eq!(c.lwm().get(), ts(20));
    assert!(!c.end_query(LOCAL, q1), "an expired query is gone");
    assert!(c.end_query(LOCAL, q2));
    c.applied(0, ts(30)).unwrap();
    assert_eq!(c.lwm().get(), ts(30));
}

#[test]
fn a_restart_resumes_after_the_checkpoint_and_waits_for_the_shown_hwm() {
    let dir = tempfile::tempdir().unwrap();
    let file = StateFile::new(dir.path());
    assert_eq!(file.load().unwrap(), Persisted::default());
    let mut c = CoordinatorState::new(2, file.load().unwrap(), true);
    assert!(!c.ready(), "waits for the sink");
    c.caught_up(None);
    assert!(c.ready(), "nothing was shown before");
    c.allocate(10).unwrap();
    c.applied(0, ts(6)).unwrap();
    c.applied(1, ts(6)).unwrap();
    let mark = SourceMark {
        offset: 600,
        line: 30,
    };
    let record = c.begin_checkpoint(mark).unwrap();
    assert_eq!((record.id, record.ts), (1, ts(11)));
    assert!(c.begin_checkpoint(mark).is_none(), "one at a time");
    assert!(c.checkpoint_done(1, 0, true).is_none());
    assert!(c.checkpoint_done(2, 1, true).is_none(), "another id");
    let done = c.checkpoint_done(1, 1, true).unwrap();
    c.applied(0, ts(11)).unwrap();
    c.applied(1, ts(11)).unwrap();
    store(&file, c.persisted_with(done));
    assert_eq!(c.checkpoint_recorded(done), None);
    c.allocate(5).unwrap();
    c.applied(0, ts(16)).unwrap();
    c.applied(1, ts(16)).unwrap();
    store(&file, c.persisted());

    // Crash: timestamps restart after the checkpoint, HWM with them; queries wait until
    // HWM is back at what was persisted.
    let mut again = CoordinatorState::new(2, file.load().unwrap(), false);
    assert_eq!(again.hwm().snapshot(), ts(11));
    assert_eq!(again.allocate(5).unwrap(), 12..=16);
    assert!(!again.ready());
    again.applied(0, ts(16)).unwrap();
    again.applied(1, ts(16)).unwrap();
    assert!(again.ready());
    again.caught_up(Some(ts(40)));
    assert!(!again.ready(), "the sink says it is not there yet");
    again.replay_stopped();
    again.caught_up(Some(ts(40)));
    assert!(again.ready(), "after replay stopped nothing waits for HWM");
    // A failed image abandons the checkpoint.
    let r = again.begin_checkpoint(mark).unwrap();
    assert_eq!(r.id, 2);
    assert!(again.checkpoint_done(2, 0, false).is_none());
    assert!(
        again.begin_checkpoint(mark).is_some(),
        "the next one may start"
    );

    std::fs::write(dir.path().join("coordinator.state"), "hwm=x\n").unwrap();
    let err = file.load().unwrap_err().to_string();
    assert!(err.contains("damaged"), "{err}");
    std::fs::write(
        dir.path().join("coordinator.state"),
        "hwm=9\ncheckpoint_id=1\n",
    )
    .unwrap();
    let err = file.load().unwrap_err().to_string();
    assert!(err.contains("without checkpoint_ts"), "{err}");
}

#[test]
fn a_long_query_stops_holding_lwm_once_every_shard_checkpointed_it() {
    let mut c = CoordinatorState::new(2, Persisted::default(), false);
    c.allocate(100).unwrap();
    c.applied(0, ts(10)).unwrap();
    c.applied(1, ts(10)).unwrap();
    let (long, s) = c.begin_query(LOCAL, 0, 100_000).unwrap();
    c.applied(0, ts(50)).unwrap();
    c.applied(1, ts(50)).unwrap();
    let (short, _) = c.begin_query(LOCAL, 4_000, 100_000).unwrap();
    assert!(
        c.start_vis_checkpoints(4_000, 5_000).is_empty(),
        "not long yet"
    );
    assert_eq!(c.start_vis_checkpoints(5_000, 5_000), vec![(long, s)]);
    assert!(
        c.start_vis_checkpoints(8_000, 5_000).is_empty(),
        "asked once"
    );
    assert!(!c.vis_checkpoint_done(long, true));
    assert_eq!(c.lwm().get(), s, "held until every shard has it");
    assert!(c.vis_checkpoint_done(long, true));
    assert_eq!(c.lwm().get(), ts(50), "the short query holds LWM now");
    assert_eq!(c.retain_lwm().get(), s, "objects stay for the long query");
    assert_eq!(c.vis_checkpointed(), 1);
    assert!(c.end_query(LOCAL, short));
    assert!(c.take_vis_to_drop().is_empty());
    assert!(c.end_query(LOCAL, long));
    assert_eq!(c.take_vis_to_drop(), vec![long]);
    assert_eq!(c.retain_lwm().get(), ts(50));
    // A late confirmation for an ended query drops the copy again.
    assert!(!c.vis_checkpoint_done(long, true));
    assert_eq!(c.take_vis_to_drop(), vec![long]);
    // A shard that fails leaves the query holding LWM.
    let (q, s2) = c.begin_query(LOCAL, 10_000, 100_000).unwrap();
    c.applied(0, ts(60)).unwrap();
    c.applied(1, ts(60)).unwrap();
    assert_eq!(c.start_vis_checkpoints(20_000, 5_000), vec![(q, s2)]);
    c.vis_checkpoint_done(q, true);
    assert!(!c.vis_checkpoint_done(q, false));
    assert_eq!(c.lwm().get(), s2);
    assert_eq!(c.expire_queries(1_000_000), vec![q]);
    assert_eq!(c.take_vis_to_drop(), vec![q]);
}

#[test]
fn queries_belong_to_their_connection_which_runs_a_bounded_number() {
    let mut c = CoordinatorState::new(1, Persisted::default(), false);
    c.allocate(10).unwrap();
    c.applied(0, ts(5)).unwrap();
    let (a, _) = c.begin_query(7, 0, 1000).unwrap();
    assert_eq!(
        c.renew_query(8, a, 10, 1000),
        None,
        "not connection 8's query"
    );
    assert!(!c.end_query(8, a), "connection 8 cannot end it");
    assert!(c.renew_query(7, a, 10, 1000).is_some());
    for _ in 1..MAX_QUERIES_PER_CONNECTION {
        c.begin_query(7, 0, 1000).unwrap();
    }
    assert_eq!(
        c.begin_query(7, 0, 1000),
        Err(BeginRefused::ConnectionLimit {
            limit: MAX_QUERIES_PER_CONNECTION
        })
    );
    let (b, _) = c.begin_query(8, 0, 1000).unwrap();
    assert!(c.end_query(7, a));
    assert!(c.begin_query(7, 0, 1000).is_ok(), "room again after an end");
    let ended = c.end_owner(7);
    assert_eq!(ended.len(), MAX_QUERIES_PER_CONNECTION as usize);
    assert!(!ended.contains(&b));
    assert_eq!(c.running_queries(), 1, "connection 8's query runs on");
    assert!(
        c.begin_query(7, 0, 1000).is_ok(),
        "a closed owner's count is gone"
    );
    assert!(c.end_query(8, b));
}

/// Any sequence of the actor's calls keeps the state consistent.
#[test]
fn every_step_keeps_the_invariants() {
    use rand::{Rng, SeedableRng};
    for seed in 0..64 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let shards = rng.random_range(1..4u16);
        let mut c = CoordinatorState::new(shards, Persisted::default(), seed % 2 == 0);
        let mut now = 0;
        let mut pending = None;
        let mut next_file = 0;
        for _ in 0..300 {
            now += rng.random_range(0..50);
            match rng.random_range(0..10) {
                0 => drop(c.allocate(rng.random_range(1..5))),
                1 | 2 => {
                    let shard = rng.random_range(0..shards);
                    let from = c.applied[usize::from(shard)].get();
                    let to = rng.random_range(from..=c.issued_through().max(from));
                    c.applied(shard, ts(to)).unwrap();
                }
                3 => drop(c.begin_query(rng.random_range(0..3), now, 100)),
                4 => {
                    let id = rng.random_range(1..=c.next_query);
                    c.end_query(rng.random_range(0..3), id);
                }
                5 => drop(c.expire_queries(now)),
                6 => {
                    if let Some(r) = c.begin_checkpoint(SourceMark::default()) {
                        pending = Some(r);
                    }
                }
                7 => {
                    if let Some(r) = pending {
                        let shard = rng.random_range(0..shards);
                        if let Some(done) = c.checkpoint_done(r.id, shard, true) {
                            c.checkpoint_recorded(done);
                            pending = None;
                        }
                    }
                }
                8 => {
                    next_file += 1;
                    c.file_added(
                        0,
                        PlanFile {
                            file: FileId(next_file),
                            path: object_store::path::Path::from("f"),
                            bytes: 1,
                            shard: 0,
                            row_groups: Vec::new(),
                            min_snapshot: Timestamp::GENESIS,
                            superseded_from: None,
                        },
                    );
                }
                _ => {
                    c.file_replaced(
                        0,
                        FileId(rng.random_range(0..=next_file)),
                        None,
                        c.hwm().get(),
                    );
                    c.retire_files();
                    for (id, _) in c.start_vis_checkpoints(now, 30) {
                        c.vis_checkpoint_done(id, rng.random_bool(0.9));
                    }
                }
            }
            c.check_invariants();
        }
    }
}

#[test]
fn a_shard_started_again_catches_up_without_moving_hwm_back() {
    let mut c = CoordinatorState::new(2, Persisted::default(), false);
    c.allocate(20).unwrap();
    let file = |shard: u16, id: u64| PlanFile {
        file: FileId::new(shard, id),
        path: format!("tables/t/{id}.parquet").into(),
        bytes: 1,
        shard,
        row_groups: Vec::new(),
        min_snapshot: Timestamp::GENESIS,
        superseded_from: None,
    };
    c.file_added(0, file(0, 1));
    c.file_added(0, file(1, 2));
    c.applied(0, ts(15)).unwrap();
    c.applied(1, ts(12)).unwrap();
    assert_eq!(c.hwm().snapshot(), ts(12));
    let (q, _) = c.begin_query(LOCAL, 0, 1000).unwrap();
    // Shard 1's member is lost: a new run of it starts from a checkpoint at 5, and the
    // running query ends (its plans may list the lost run's files).
    assert_eq!(c.shard_restarted(1).unwrap(), [q]);
    assert!(!c.end_query(LOCAL, q));
    let (q, _) = c.begin_query(LOCAL, 0, 1000).unwrap();
    let plan = |c: &mut CoordinatorState| {
        let (_, files) = c.plan(LOCAL, q, 0, 0, 1000).unwrap();
        files.into_iter().map(|f| f.file).collect::<Vec<_>>()
    };
    assert_eq!(
        plan(&mut c),
        [FileId::new(0, 1)],
        "the lost run's files leave the plans"
    );
    assert_eq!(
        c.applied(1, ts(5)).unwrap(),
        None,
        "catching up is not news"
    );
    assert_eq!(c.applied(1, ts(11)).unwrap(), None);
    assert_eq!(c.hwm().snapshot(), ts(12), "HWM never goes back");
    c.file_added(0, file(1, 3));
    assert_eq!(plan(&mut c), [FileId::new(0, 1), FileId::new(1, 3)]);
    assert_eq!(
        c.applied(1, ts(14)).unwrap(),
        Some(Hwm::after(ts(14)).unwrap())
    );
    // Caught up: applied goes back no more.
    assert!(c.applied(1, ts(13)).is_err());
    assert!(c.shard_restarted(2).is_err());
}

#[test]
fn the_sequencer_hands_out_consecutive_ranges_from_any_thread() {
    let c = CoordinatorState::new(1, Persisted::default(), false);
    let sequencer = c.sequencer();
    // Four threads draw at once: the ranges they get are disjoint and leave no gap.
    let mut ranges: Vec<_> = std::thread::scope(|s| {
        let drawers: Vec<_> = (1..=4u64)
            .map(|n| {
                let sequencer = &sequencer;
                s.spawn(move || {
                    (0..1000)
                        .map(|_| sequencer.allocate(n).unwrap())
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        drawers
            .into_iter()
            .flat_map(|d| d.join().unwrap())
            .collect()
    });
    ranges.sort_by_key(|r| *r.start());
    assert_eq!(*ranges[0].start(), 2, "the first after genesis");
    for pair in ranges.windows(2) {
        assert_eq!(*pair[0].end() + 1, *pair[1].start(), "{pair:?}");
    }
    assert_eq!(c.issued_through(), *ranges.last().unwrap().end());
    assert_eq!(c.issued_through(), 1 + 1000 * (1 + 2 + 3 + 4));

    // A range past the largest timestamp is refused, and hands nothing out.
    let before = c.issued_through();
    assert!(sequencer.allocate(Timestamp::MAX_RAW).is_err());
    assert_eq!(c.issued_through(), before);
    assert_eq!(c.allocate(1).unwrap(), before + 1..=before + 1);
}
