use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_storage::{ColumnDef, ColumnType, TableSchema, Value};

use super::*;
use crate::debezium::{ChangeOp, TxnRef};

/// Partition 0 is the transaction topic; 1..=3 hold table `a`, 4..=5 table `b`.
const PARTS: usize = 6;

fn table(name: &str) -> Arc<TableSchema> {
    TableSchema::new(
        name,
        vec![ColumnDef::new("id", ColumnType::Int64, false)],
        &["id"],
    )
    .unwrap()
}

fn pos(part: u32, offset: i64) -> SourcePosition {
    SourcePosition::new(format!("kafka:t/{part}"), offset as u64)
}

/// The messages of one source transaction, each with the partition it is written to.
struct Txn {
    id: String,
    /// (collection, key) of each event, in total order.
    events: Vec<(&'static str, i64)>,
}

fn part_of(collection: &str, key: i64) -> u32 {
    match collection {
        "public.a" => 1 + (key % 3) as u32,
        _ => 4 + (key % 2) as u32,
    }
}

/// Lays `txns` out as Debezium does: BEGIN/END on partition 0, each event on its table's
/// partition by key. Returns each partition's messages (offset = index).
fn layout(txns: &[Txn]) -> Vec<Vec<Message>> {
    let mut parts: Vec<Vec<Message>> = (0..PARTS).map(|_| Vec::new()).collect();
    for t in txns {
        let o = parts[0].len() as i64;
        parts[0].push(Message::Begin {
            id: t.id.clone(),
            pos: pos(0, o),
        });
        let mut per: Vec<(String, u64)> = Vec::new();
        for (i, (c, key)) in t.events.iter().enumerate() {
            let n = match per.iter_mut().find(|(pc, _)| pc == c) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    per.push((c.to_string(), 1));
                    1
                }
            };
            let p = part_of(c, *key);
            let o = parts[p as usize].len() as i64;
            parts[p as usize].push(Message::Change(ChangeEvent {
                table: table(c),
                data_collection: (*c).into(),
                op: ChangeOp::Upsert(vec![Value::Int(*key)]),
                snapshot: false,
                txn: Some(TxnRef {
                    id: t.id.clone(),
                    total_order: i as u64 + 1,
                    data_collection_order: n,
                }),
                connector: Some("postgresql".into()),
                pos: pos(p, o),
            }));
        }
        let o = parts[0].len() as i64;
        parts[0].push(Message::End {
            id: t.id.clone(),
            event_count: t.events.len() as u64,
            data_collections: per,
            pos: pos(0, o),
        });
    }
    parts
}

fn random_txns(rng: &mut SmallRng, n: usize) -> Vec<Txn> {
    (0..n)
        .map(|i| Txn {
            // Postgres ids: the LSN part is not what identifies it.
            id: format!("{}:{}", 1000 + i, rng.random_range(1..1_000_000)),
            events: (0..rng.random_range(1..6))
                .map(|_| {
                    let c = if rng.random_bool(0.5) {
                        "public.a"
                    } else {
                        "public.b"
                    };
                    (c, rng.random_range(0..50))
                })
                .collect(),
        })
        .collect()
}

/// What a transaction holds, comparable: its txId and its events' (collection, key).
fn summary(t: &KafkaTxn) -> (String, Vec<(String, i64)>) {
    let events = t
        .events
        .iter()
        .map(|e| match &e.op {
            ChangeOp::Upsert(row) => match row[0] {
                Value::Int(k) => (e.data_collection.to_string(), k),
                _ => unreachable!(),
            },
            _ => unreachable!(),
        })
        .collect();
    (txn_key(&t.id).to_owned(), events)
}

fn expected(txns: &[Txn]) -> Vec<(String, Vec<(String, i64)>)> {
    txns.iter()
        .map(|t| {
            (
                txn_key(&t.id).to_owned(),
                t.events.iter().map(|(c, k)| (c.to_string(), *k)).collect(),
            )
        })
        .collect()
}

/// Reads the partitions from `from` in a random interleaving (each in order), for at most
/// `steps` messages (all: `usize::MAX`), pushing into `a` and collecting what it completes.
fn read(
    rng: &mut SmallRng,
    parts: &[Vec<Message>],
    a: &mut KafkaAssembler,
    steps: usize,
    out: &mut Vec<KafkaTxn>,
) {
    let mut at: Vec<usize> = a.next_offsets().iter().map(|&o| o as usize).collect();
    for _ in 0..steps {
        let open: Vec<usize> = (0..PARTS).filter(|&p| at[p] < parts[p].len()).collect();
        if open.is_empty() {
            break;
        }
        // Partitions read at very different speeds: a few read in bursts.
        let p = open[rng.random_range(0..open.len())];
        for _ in 0..rng.random_range(1..4) {
            if at[p] == parts[p].len() {
                break;
            }
            let msg = clone_message(&parts[p][at[p]]);
            a.push(p as u32, at[p] as i64, msg).unwrap();
            at[p] += 1;
            while let Some(t) = a.pop().unwrap() {
                out.push(t);
            }
        }
    }
}

fn clone_message(m: &Message) -> Message {
    match m {
        Message::Begin { id, pos } => Message::Begin {
            id: id.clone(),
            pos: pos.clone(),
        },
        Message::End {
            id,
            event_count,
            data_collections,
            pos,
        } => Message::End {
            id: id.clone(),
            event_count: *event_count,
            data_collections: data_collections.clone(),
            pos: pos.clone(),
        },
        Message::Change(ev) => Message::Change(ev.clone()),
        _ => unreachable!(),
    }
}

#[test]
fn any_interleaving_gives_whole_transactions_in_topic_order() {
    for seed in 0..200 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let txns = random_txns(&mut rng, 40);
        let parts = layout(&txns);
        let mut a = KafkaAssembler::new(TxnMode::Metadata, vec![0; PARTS], Vec::new());
        let mut out = Vec::new();
        read(&mut rng, &parts, &mut a, usize::MAX, &mut out);
        let got: Vec<_> = out.iter().map(summary).collect();
        assert_eq!(got, expected(&txns), "seed {seed}");
        assert!(a.is_idle());
        assert_eq!(a.waiting(), 0);
    }
}

/// Stops at a random point, restarts from the resume offsets and replayable ids a checkpoint
/// would record there, and again: every transaction comes out exactly once, in order.
#[test]
fn restarts_from_resume_offsets_lose_and_repeat_nothing() {
    for seed in 0..300 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let txns = random_txns(&mut rng, 30);
        let parts = layout(&txns);
        let mut next = vec![0; PARTS];
        let mut handed = Vec::new();
        let mut out = Vec::new();
        for _ in 0..rng.random_range(1..4) {
            let mut a = KafkaAssembler::new(TxnMode::Metadata, next.clone(), handed);
            let steps = rng.random_range(0..60);
            read(&mut rng, &parts, &mut a, steps, &mut out);
            // A checkpoint of everything handed over so far, then a crash.
            next = a.resume_offsets();
            handed = a.replayable(&next);
        }
        let mut a = KafkaAssembler::new(TxnMode::Metadata, next, handed);
        read(&mut rng, &parts, &mut a, usize::MAX, &mut out);
        let got: Vec<_> = out.iter().map(summary).collect();
        assert_eq!(got, expected(&txns), "seed {seed}");
    }
}

#[test]
fn a_redelivered_transaction_is_dropped() {
    let txns = [
        Txn {
            id: "7:100".into(),
            events: vec![("public.a", 1), ("public.b", 2)],
        },
        // The connector restarted and sent it again, its LSN part moved on.
        Txn {
            id: "7:180".into(),
            events: vec![("public.a", 1), ("public.b", 2)],
        },
        Txn {
            id: "8:200".into(),
            events: vec![("public.a", 3)],
        },
    ];
    let parts = layout(&txns);
    let mut a = KafkaAssembler::new(TxnMode::Metadata, vec![0; PARTS], Vec::new());
    let mut out = Vec::new();
    // The table topics first, then the transaction topic.
    for p in (1..PARTS).chain([0]) {
        for (o, m) in parts[p].iter().enumerate() {
            a.push(p as u32, o as i64, clone_message(m)).unwrap();
            while let Some(t) = a.pop().unwrap() {
                out.push(t);
            }
        }
    }
    let ids: Vec<_> = out.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["7:100", "8:200"]);
    assert_eq!(a.duplicates_skipped(), 1);
    assert!(a.is_idle());
}

#[test]
fn counts_and_the_buffer_are_reported() {
    // 1: `a` 1 on partition 2, `b` 2 on partition 4; 2: `a` 3 on partition 1.
    let txns = [
        Txn {
            id: "1".into(),
            events: vec![("public.a", 1), ("public.b", 2)],
        },
        Txn {
            id: "2".into(),
            events: vec![("public.a", 3)],
        },
    ];
    let parts = layout(&txns);
    let mut a = KafkaAssembler::new(TxnMode::Metadata, vec![0; PARTS], Vec::new());
    a.push(1, 0, clone_message(&parts[1][0])).unwrap();
    assert_eq!(a.waiting(), 1);
    assert!(a.head_needs().is_none());
    a.push(0, 0, clone_message(&parts[0][0])).unwrap();
    assert_eq!(a.head_needs(), Some(("1", None)));
    a.push(0, 1, clone_message(&parts[0][1])).unwrap();
    assert_eq!(
        a.head_needs(),
        Some(("1", Some(vec!["public.a", "public.b"])))
    );
    a.push(0, 2, clone_message(&parts[0][2])).unwrap();
    a.push(2, 0, clone_message(&parts[2][0])).unwrap();
    assert_eq!(a.head_needs(), Some(("1", Some(vec!["public.b"]))));
    assert_eq!(a.waiting(), 1, "2's event; the head's do not count");
    assert!(a.pop().unwrap().is_none());
    assert_eq!(a.resume_offsets(), [0, 0, 0, 0, 0, 0]);
    a.push(4, 0, clone_message(&parts[4][0])).unwrap();
    assert_eq!(a.pop().unwrap().unwrap().id, "1");
    assert!(a.pop().unwrap().is_none(), "2's END has not arrived");
    // 2's BEGIN (offset 2) and event (partition 1, offset 0) are still needed.
    let resume = a.resume_offsets();
    assert_eq!(resume, [2, 0, 1, 0, 1, 0]);
    // 1 has nothing at or after those offsets: a restart need not know it.
    assert!(a.replayable(&resume).is_empty());

    // An END announcing fewer events than arrived.
    let mut a = KafkaAssembler::new(TxnMode::Metadata, vec![0; PARTS], Vec::new());
    a.push(0, 0, clone_message(&parts[0][0])).unwrap();
    a.push(2, 0, clone_message(&parts[2][0])).unwrap();
    a.push(4, 0, clone_message(&parts[4][0])).unwrap();
    a.push(
        0,
        1,
        Message::End {
            id: "1".into(),
            event_count: 1,
            data_collections: vec![("public.a".into(), 1)],
            pos: pos(0, 1),
        },
    )
    .unwrap();
    let e = a.pop().unwrap_err().to_string();
    assert!(e.contains("kafka:t/0:1"), "{e}");
}

#[test]
fn without_metadata_each_event_stands_alone() {
    // `a` 1 on partition 2, `a` 2 on partition 3.
    let txns = [Txn {
        id: "1".into(),
        events: vec![("public.a", 1), ("public.a", 2)],
    }];
    let parts = layout(&txns);
    let mut a = KafkaAssembler::new(TxnMode::NoMetadata, vec![0; PARTS], Vec::new());
    a.push(3, 0, clone_message(&parts[3][0])).unwrap();
    a.push(2, 0, clone_message(&parts[2][0])).unwrap();
    assert_eq!(a.pop().unwrap().unwrap().id, "kafka:t/3:0");
    assert_eq!(a.pop().unwrap().unwrap().id, "kafka:t/2:0");
    assert!(a.push(0, 0, clone_message(&parts[0][0])).is_err());
}
