//! End to end: a node with two shards replays a Debezium stream (both message forms, decimal
//! and time types, key-changing updates across shards, duplicated transactions, events out of
//! order) and the rows visible at the final snapshot equal a naive model's. Then every kind of
//! bad input: replay stops before the bad transaction with an error naming its position, and
//! everything before it stays visible; with `--on-error skip` it goes to the dead-letter file.
//! The same stream from a real Kafka broker on loopback, in Debezium's topic layout.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use retina_bench::kafka::Broker;
use retina_node::catalog::Catalog;
use retina_node::debezium::TxnMode;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_node::sink::kafka::{KafkaSpec, Producer};
use retina_node::sink::{OnError, SinkOptions, SinkReport, SourceSpec, run_sink};
use retina_storage::Value;
use retina_tests::bank::{DDL, generate, tables, visible};
use retina_tests::cdc::{Change, Row, V, Writer};

fn settings(shards: u16) -> Settings {
    Settings {
        shards,
        ..retina_tests::small_files(5, 3)
    }
}

fn start(dir: &Path, shards: u16) -> Node {
    Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "bank.sql").unwrap()),
        settings: settings(shards),
        listen: None,
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap()
}

fn sink(node: &Node, path: &Path, on_error: OnError, dead_letter: &Path) -> SinkReport {
    let max_txn_bytes = Settings::default().max_txn_bytes;
    sink_with(node, path, on_error, dead_letter, max_txn_bytes)
}

fn sink_with(
    node: &Node,
    path: &Path,
    on_error: OnError,
    dead_letter: &Path,
    max_txn_bytes: u64,
) -> SinkReport {
    let options = SinkOptions {
        source: SourceSpec::File(path.to_path_buf()),
        follow: false,
        mode: TxnMode::Metadata,
        on_error,
        dead_letter: dead_letter.to_path_buf(),
        max_group_txns: 16,
        group_commit_interval: Duration::from_millis(2),
        checkpoint_interval: None,
        max_txn_bytes,
        decode_lanes: 3,
    };
    run_sink(node.handle(), &options)
}

#[test]
fn replayed_stream_equals_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("bank.json");
    let model = generate(7, 1500, &stream);
    let node = start(&dir.path().join("data"), 2);
    let report = sink(&node, &stream, OnError::Stop, &dir.path().join("dead.json"));
    assert_eq!(report.stopped_by, None);
    assert!(
        report.duplicates_skipped > 0,
        "the stream repeats some transactions"
    );
    let last = report.last_ts.unwrap();
    assert!(
        node.handle().wait_visible(last, Duration::from_secs(30)),
        "{:?}",
        node.handle().status().error()
    );
    // Let flushes and combinations run, then read everything through storage.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(visible(&node), model.tables);
    let total: i64 = model.tables[0]
        .values()
        .map(|r| match r[2] {
            V::I(c) => c,
            _ => 0,
        })
        .sum();
    assert!(total != 0);
    node.shutdown();
    let lake = dir.path().join("data/lake/tables/bank.accounts");
    assert!(lake.exists(), "blocks were flushed to the lake");
}

/// Writes `lines` (a good transaction, then the bad ones) and replays them.
fn replay_lines(lines: &[String], on_error: OnError) -> (tempfile::TempDir, Node, SinkReport) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.json");
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    let node = start(&dir.path().join("data"), 2);
    let report = sink(&node, &path, on_error, &dir.path().join("dead.json"));
    if let Some(ts) = report.last_ts {
        node.handle().wait_visible(ts, Duration::from_secs(10));
    }
    // A shard's failure reaches the status through the coordinator.
    std::thread::sleep(Duration::from_millis(50));
    (dir, node, report)
}

fn txn_lines(id: &str, changes: &[Change]) -> Vec<String> {
    let tables = tables();
    let mut out = Vec::new();
    let order: Vec<usize> = (0..changes.len()).collect();
    Writer {
        out: &mut out,
        tables: &tables,
    }
    .txn(id, changes, false, &order);
    String::from_utf8(out)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn account(id: i64, cents: i64) -> Row {
    vec![
        V::I(id),
        V::S(format!("o{id}")),
        V::I(cents),
        V::I(19_000),
        V::I(1_700_000_000_000_000),
    ]
}

#[test]
fn bad_input_stops_before_the_transaction_and_keeps_what_came_before() {
    let good = txn_lines(
        "t1",
        &[
            Change::Insert(0, account(1, 100)),
            Change::Insert(0, account(2, 200)),
        ],
    );
    let later = txn_lines("t3", &[Change::Insert(0, account(9, 900))]);
    let insert3 = txn_lines("t2", &[Change::Insert(0, account(3, 300))]);
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        (
            "not json",
            vec![insert3[0].clone(), "{not json".into()],
            "in.json:6:",
        ),
        (
            "unknown table",
            vec![
                insert3[0].clone(),
                insert3[1].replace("\"accounts\"", "\"ghosts\""),
                insert3[2].clone(),
            ],
            "ghosts",
        ),
        (
            "missing key column",
            vec![
                insert3[0].clone(),
                insert3[1].replace("\"id\":3,", ""),
                insert3[2].clone(),
            ],
            "`id`",
        ),
        (
            "value too wide",
            vec![
                insert3[0].clone(),
                insert3[1].replace("\"3.00\"", "\"99999999999.00\""),
                insert3[2].clone(),
            ],
            "balance",
        ),
        (
            "END count mismatch",
            vec![
                insert3[0].clone(),
                insert3[1].clone(),
                insert3[2].replace("\"event_count\":1", "\"event_count\":2"),
            ],
            "t2",
        ),
        (
            "delete of a missing key",
            txn_lines("t2", &[Change::Delete(0, account(42, 0))]),
            "(id=42) does not exist",
        ),
        (
            "duplicate insert",
            txn_lines("t2", &[Change::Insert(0, account(1, 5))]),
            "(id=1) already exists",
        ),
    ];
    for (name, bad, expect) in cases {
        let mut lines = good.clone();
        lines.extend(bad);
        lines.extend(later.clone());
        let (_dir, node, report) = replay_lines(&lines, OnError::Stop);
        let error = node
            .handle()
            .status()
            .error()
            .unwrap_or_else(|| panic!("{name}: no error"));
        assert!(error.contains(expect), "{name}: {error}");
        assert!(
            error.contains("in.json:") || error.contains("shard"),
            "{name} names a position: {error}"
        );
        let rows = visible(&node);
        let ids: Vec<&Row> = rows[0].keys().collect();
        assert_eq!(
            ids,
            vec![&vec![V::I(1)], &vec![V::I(2)]],
            "{name}: t1 stays, nothing after it: {report:?} hwm {:?} {error}",
            node.handle().status().hwm()
        );
        node.shutdown();
    }
}

#[test]
fn skip_sends_the_whole_bad_transaction_to_the_dead_letter_file() {
    let mut lines = txn_lines("t1", &[Change::Insert(0, account(1, 100))]);
    let bad = txn_lines(
        "t2",
        &[
            Change::Insert(0, account(2, 1)),
            Change::Insert(0, account(3, 1)),
        ],
    );
    lines.push(bad[0].clone());
    lines.push(bad[1].clone());
    lines.push(bad[2].replace("\"owner\":\"o3\"", "\"owner\":12"));
    lines.push(bad[3].clone());
    lines.extend(txn_lines("t3", &[Change::Insert(0, account(4, 400))]));
    let (dir, node, report) = replay_lines(&lines, OnError::Skip);
    assert_eq!(report.stopped_by, None);
    assert_eq!(report.dead_lettered, 1);
    let rows = visible(&node);
    let ids: Vec<&Row> = rows[0].keys().collect();
    assert_eq!(ids, vec![&vec![V::I(1)], &vec![V::I(4)]], "no partial t2");
    let dead = std::fs::read_to_string(dir.path().join("dead.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(dead.trim()).unwrap();
    assert_eq!(record["transaction"], "t2");
    assert_eq!(
        record["lines"].as_array().unwrap().len(),
        4,
        "BEGIN, two events, END"
    );
    assert!(
        record["reason"].as_str().unwrap().contains("owner"),
        "{record}"
    );
    node.shutdown();
}

#[test]
fn skip_survives_a_transaction_whose_end_never_comes() {
    let t2 = txn_lines("t2", &[Change::Insert(0, account(2, 200))]);
    let mut lines = txn_lines("t1", &[Change::Insert(0, account(1, 100))]);
    // t2 loses its END; t3 begins while it is open.
    lines.extend(t2[..2].iter().cloned());
    lines.extend(txn_lines("t3", &[Change::Insert(0, account(3, 300))]));
    // t5 breaks mid-way and never ends either; the source ends after it.
    let t5 = txn_lines("t5", &[Change::Insert(0, account(5, 500))]);
    lines.extend(txn_lines("t4", &[Change::Insert(0, account(4, 400))]));
    lines.push(t5[0].clone());
    lines.push("{broken".into());
    let (dir, node, report) = replay_lines(&lines, OnError::Skip);
    assert_eq!(report.stopped_by, None);
    assert_eq!(report.dead_lettered, 2, "{report:?}");
    let rows = visible(&node);
    let ids: Vec<&Row> = rows[0].keys().collect();
    assert_eq!(ids, vec![&vec![V::I(1)], &vec![V::I(3)], &vec![V::I(4)]]);
    let dead: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("dead.json"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dead[0]["transaction"], "t2");
    assert_eq!(
        dead[0]["lines"].as_array().unwrap().len(),
        2,
        "t2's BEGIN and event"
    );
    assert_eq!(dead[1]["transaction"], "t5");
    assert!(
        dead[1]["reason"]
            .as_str()
            .unwrap()
            .contains("ended before its END"),
        "{}",
        dead[1]
    );
    node.shutdown();
}

/// `line` (one JSON message) changed by `edit`.
fn edited(line: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let mut v: serde_json::Value = serde_json::from_str(line).unwrap();
    edit(&mut v);
    v.to_string()
}

fn account_ids(node: &Node) -> Vec<i64> {
    visible(node)[0]
        .keys()
        .map(|k| match k[0] {
            V::I(i) => i,
            _ => unreachable!(),
        })
        .collect()
}

#[test]
fn skip_keeps_a_full_redelivery_after_a_partial_one() {
    // BEGIN t2, e1, BEGIN t2, e1, e2, END t2: the redelivery restarts t2, nothing is lost.
    let t2 = txn_lines(
        "t2",
        &[
            Change::Insert(0, account(2, 200)),
            Change::Insert(0, account(3, 300)),
        ],
    );
    let mut lines = txn_lines("t1", &[Change::Insert(0, account(1, 100))]);
    lines.extend(t2[..2].iter().cloned());
    lines.extend(t2.iter().cloned());
    // t4 breaks in its partial delivery (a half-written line), then comes again whole.
    let t4 = txn_lines("t4", &[Change::Insert(0, account(4, 400))]);
    lines.push(t4[0].clone());
    lines.push(t4[1][..20].to_owned());
    lines.extend(t4.iter().cloned());
    let (dir, node, report) = replay_lines(&lines, OnError::Skip);
    assert_eq!(report.stopped_by, None);
    assert_eq!(account_ids(&node), [1, 2, 3, 4]);
    assert_eq!(
        node.handle()
            .status()
            .txn_restarts
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    // Only t4's broken partial delivery is dead-lettered, and says why it ended.
    assert_eq!(report.dead_lettered, 1, "{report:?}");
    let dead = std::fs::read_to_string(dir.path().join("dead.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(dead.trim()).unwrap();
    assert_eq!(record["transaction"], "t4");
    assert_eq!(record["lines"].as_array().unwrap().len(), 2);
    assert!(
        record["reason"]
            .as_str()
            .unwrap()
            .contains("delivered the transaction again"),
        "{record}"
    );
    node.shutdown();
}

#[test]
fn snapshot_reads_of_existing_rows_are_upserts() {
    let mut lines = txn_lines("t1", &[Change::Insert(0, account(1, 100))]);
    // A re-snapshot sends row 1 again (changed meanwhile) and row 2, outside transactions.
    let read = |id: i64, cents: i64| {
        let line = txn_lines("x", &[Change::Insert(0, account(id, cents))])[1].clone();
        edited(&line, |v| {
            v["op"] = "r".into();
            v["transaction"] = serde_json::Value::Null;
            v["source"]["snapshot"] = "incremental".into();
        })
    };
    lines.push(read(1, 555));
    lines.push(read(2, 200));
    lines.push(read(2, 200));
    let (_dir, node, report) = replay_lines(&lines, OnError::Stop);
    assert_eq!(
        report.stopped_by,
        None,
        "{:?}",
        node.handle().status().error()
    );
    let rows = visible(&node);
    assert_eq!(rows[0].len(), 2, "{report:?} {rows:?}");
    assert_eq!(
        rows[0][&vec![V::I(1)]][2],
        V::I(555),
        "the read replaced row 1"
    );
    node.shutdown();
}

#[test]
fn postgres_txid_lsn_ids_replay() {
    // Debezium 2.1+ Postgres ids: `txId:LSN`, the LSN differing at BEGIN, each event and END.
    let t = txn_lines(
        "t",
        &[
            Change::Insert(0, account(1, 100)),
            Change::Insert(0, account(2, 200)),
        ],
    );
    let mut lines = Vec::new();
    for (i, line) in t.iter().enumerate() {
        let id = format!("571:{}", 53_195_832 + 8 * i);
        lines.push(edited(line, |v| {
            if v.get("status").is_some() {
                v["id"] = id.into();
            } else {
                v["transaction"]["id"] = id.into();
                v["source"]["txId"] = 571.into();
            }
        }));
    }
    let (_dir, node, report) = replay_lines(&lines, OnError::Stop);
    assert_eq!(
        report.stopped_by,
        None,
        "{:?}",
        node.handle().status().error()
    );
    assert_eq!((report.transactions, account_ids(&node)), (1, vec![1, 2]));
    node.shutdown();
}

#[test]
fn truncates_empty_every_shard_and_quiet_lines_are_skipped() {
    let rows: Vec<Change> = (1..=20)
        .map(|id| Change::Insert(0, account(id, id * 10)))
        .collect();
    let mut lines = txn_lines("t1", &rows);
    lines.push(r#"{"ts_ms":1700000000000}"#.into());
    lines.push(
        r#"{"schema":{"type":"struct","name":"io.debezium.connector.common.Heartbeat"},"payload":{"ts_ms":1700000000001}}"#
            .into(),
    );
    lines.push(
        serde_json::json!({
            "source": {"connector": "postgresql", "db": "bankdb", "schema": "bank", "table": "accounts"},
            "ddl": "ALTER TABLE bank.accounts ADD COLUMN x int", "tableChanges": []
        })
        .to_string(),
    );
    // t2: a truncate of accounts, a logical message, then a new row, in one transaction.
    let t2 = txn_lines(
        "t2",
        &[
            Change::Insert(0, account(99, 1)),
            Change::Insert(0, account(30, 300)),
        ],
    );
    lines.push(t2[0].clone());
    lines.push(edited(&t2[1], |v| {
        v["op"] = "t".into();
        v["after"] = serde_json::Value::Null;
    }));
    lines.push(
        serde_json::json!({
            "op": "m", "ts_ms": 1,
            "source": {"connector": "postgresql", "db": "bankdb", "schema": "", "table": ""},
            "message": {"prefix": "audit", "content": "aGk="},
            "transaction": {"id": "t2", "total_order": 3, "data_collection_order": 1}
        })
        .to_string(),
    );
    lines.push(t2[2].clone());
    lines.push(edited(&t2[3], |v| {
        v["event_count"] = 3.into();
        v["data_collections"] = serde_json::json!([
            {"data_collection": "bank.accounts", "event_count": 2},
            {"data_collection": "audit", "event_count": 1}
        ]);
    }));
    let (_dir, node, report) = replay_lines(&lines, OnError::Stop);
    assert_eq!(
        report.stopped_by,
        None,
        "{:?}",
        node.handle().status().error()
    );
    assert_eq!(account_ids(&node), [30], "the truncate reached both shards");
    let status = node.handle().status();
    let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        (
            load(&status.heartbeats_skipped),
            load(&status.messages_skipped),
            load(&status.schema_changes_skipped)
        ),
        (2, 1, 1)
    );
    node.shutdown();
}

#[test]
fn follow_mode_waits_for_a_character_split_across_writes() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.json");
    let mut owner = account(1, 100);
    owner[1] = V::S("Zoë".into());
    let text = txn_lines("t1", &[Change::Insert(0, owner)]).join("\n") + "\n";
    let cut = text.find('ë').unwrap() + 1;
    let mut f = File::create(&path).unwrap();
    f.write_all(&text.as_bytes()[..cut]).unwrap();
    f.flush().unwrap();
    let node = start(&dir.path().join("data"), 2);
    let options = SinkOptions {
        source: SourceSpec::File(path.clone()),
        follow: true,
        mode: TxnMode::Metadata,
        on_error: OnError::Stop,
        dead_letter: dir.path().join("dead.json"),
        max_group_txns: 16,
        group_commit_interval: Duration::from_millis(2),
        checkpoint_interval: None,
        max_txn_bytes: Settings::default().max_txn_bytes,
        decode_lanes: 2,
    };
    let sink = retina_node::sink::spawn(node.handle().clone(), options).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    f.write_all(&text.as_bytes()[cut..]).unwrap();
    f.flush().unwrap();
    let start = std::time::Instant::now();
    while node
        .handle()
        .status()
        .txns_submitted
        .load(std::sync::atomic::Ordering::Relaxed)
        < 1
    {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            node.handle().status().error()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = sink.stop_and_join().unwrap();
    assert_eq!((report.stopped_by, report.transactions), (None, 1));
    node.shutdown();
}

#[test]
fn queries_hold_lwm_until_they_end_or_their_lease_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeOptions {
        data_dir: dir.path().join("data"),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "bank.sql").unwrap()),
        settings: Settings {
            query_lease_ms: 300,
            persist_interval_ms: 10,
            ..settings(2)
        },
        listen: None,
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap();
    let h = node.handle();
    let lwm = || h.status().lwm.load(std::sync::atomic::Ordering::Acquire);
    let txn = |id: i64| {
        vec![retina_storage::TableOp {
            table: 0,
            op: retina_storage::RowOp::Insert(vec![
                Value::Int(id),
                Value::Null,
                Value::Decimal(1),
                Value::Null,
                Value::Null,
            ]),
        }]
    };
    let first = h.submit(&[txn(1)]).unwrap();
    assert!(h.wait_visible(*first.end(), Duration::from_secs(10)));
    let (held, snapshot) = h.begin_query().unwrap();
    let (short, _) = h.begin_query().unwrap();
    let later = h.submit(&[txn(2), txn(3)]).unwrap();
    assert!(h.wait_visible(*later.end(), Duration::from_secs(10)));
    assert_eq!(lwm(), snapshot.get(), "the oldest query holds LWM");
    // One query keeps renewing; the other lets its lease run out.
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(100));
        assert!(h.renew_query(held).unwrap());
    }
    assert!(
        !h.renew_query(short).unwrap(),
        "an expired lease cannot be renewed"
    );
    assert_eq!(lwm(), snapshot.get(), "the renewed query still holds LWM");
    h.end_query(held);
    let start = std::time::Instant::now();
    while lwm() != *later.end() {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "LWM stayed at {}",
            lwm()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    node.shutdown();
}

/// What one line of a good stream becomes in [`the_sink_keeps_every_good_transaction`].
#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    Bytes(Vec<u8>),
    Drop,
    Duplicate,
    WrongType,
    HugeNumber,
    DeepNesting(usize),
}

fn mutation() -> impl proptest::strategy::Strategy<Value = Mutation> {
    use proptest::prelude::*;
    prop_oneof![
        (0usize..200).prop_map(Mutation::Truncate),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Mutation::Bytes),
        Just(Mutation::Drop),
        Just(Mutation::Duplicate),
        Just(Mutation::WrongType),
        Just(Mutation::HugeNumber),
        (1usize..5000).prop_map(Mutation::DeepNesting),
    ]
}

fn mutate(line: &str, m: &Mutation) -> Vec<Vec<u8>> {
    match m {
        Mutation::Truncate(n) => vec![line.as_bytes()[..(*n).min(line.len())].to_vec()],
        Mutation::Bytes(b) => vec![
            b.iter()
                .map(|&c| if c == b'\n' { b' ' } else { c })
                .collect(),
        ],
        Mutation::Drop => vec![],
        Mutation::Duplicate => vec![line.as_bytes().to_vec(); 2],
        Mutation::WrongType => vec![
            line.replacen("\"owner\":\"", "\"owner\":[\"", 1)
                .replacen("\"status\":\"", "\"status\":{\"x\":\"", 1)
                .into_bytes(),
        ],
        Mutation::HugeNumber => vec![
            line.replacen("\"id\":", "\"id\":123456789012345678901234567890", 1)
                .replacen("\"event_count\":", "\"event_count\":1e400,\"x\":", 1)
                .into_bytes(),
        ],
        Mutation::DeepNesting(depth) => {
            vec![format!("{{\"after\":{}{}}}", "[".repeat(*depth), "]".repeat(*depth)).into_bytes()]
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// The real sink and node, fed a stream with one line mutated (cut short, random bytes or
    /// invalid UTF-8, dropped, repeated, wrong types, huge numbers, deep nesting): never a
    /// panic; an error names the file and line; every transaction before the bad one stays,
    /// with `--on-error skip` every other one arrives too, and no row is invented.
    #[test]
    fn the_sink_keeps_every_good_transaction(
        at in 0usize..15,
        m in mutation(),
        skip in proptest::prelude::any::<bool>(),
    ) {
        const TXNS: i64 = 5;
        let lines: Vec<String> = (0..TXNS)
            .flat_map(|t| txn_lines(&format!("t{t}"), &[Change::Insert(0, account(t, 100 + t))]))
            .collect();
        // Each transaction is BEGIN, one event, END.
        let bad = at % lines.len();
        let bad_txn = (bad / 3) as i64;
        let mut text = Vec::new();
        for (i, line) in lines.iter().enumerate() {
            let fed = if i == bad { mutate(line, &m) } else { vec![line.as_bytes().to_vec()] };
            for l in fed {
                text.extend(l);
                text.push(b'\n');
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.json");
        std::fs::write(&path, &text).unwrap();
        let node = start(&dir.path().join("data"), 2);
        let on_error = if skip { OnError::Skip } else { OnError::Stop };
        let report = sink(&node, &path, on_error, &dir.path().join("dead.json"));
        if let Some(ts) = report.last_ts {
            node.handle().wait_visible(ts, Duration::from_secs(10));
        }
        let rows = visible(&node);
        let ids = account_ids(&node);
        for (key, row) in &rows[0] {
            let V::I(id) = key[0] else { unreachable!() };
            proptest::prop_assert_eq!(row, &account(id, 100 + id), "no row is invented");
        }
        for t in 0..bad_txn {
            proptest::prop_assert!(ids.contains(&t), "t{} came before the bad line: {:?}", t, ids);
        }
        if let Some(e) = &report.stopped_by {
            proptest::prop_assert!(!skip, "skip never stops on input: {}", e);
            proptest::prop_assert!(e.contains("in.json:"), "the error names its position: {}", e);
        } else {
            for t in (0..TXNS).filter(|&t| t != bad_txn) {
                proptest::prop_assert!(ids.contains(&t), "t{} is good: {:?} {:?}", t, ids, report);
            }
        }
        if skip && report.dead_lettered > 0 {
            let dead = std::fs::read_to_string(dir.path().join("dead.json")).unwrap();
            for record in dead.lines() {
                let record: serde_json::Value = serde_json::from_str(record).unwrap();
                let position = record["position"].as_str().unwrap_or_default();
                proptest::prop_assert!(position.contains("in.json:"), "{}", record);
            }
        }
        // A stopped replay says so in the node's status (and metrics) too.
        proptest::prop_assert_eq!(node.handle().status().error().is_some(), report.stopped_by.is_some());
        node.shutdown();
    }
}

#[test]
fn a_transaction_over_max_txn_bytes_is_refused_with_its_position() {
    let mut lines = txn_lines("t1", &[Change::Insert(0, account(1, 100))]);
    let big: Vec<Change> = (10..60).map(|i| Change::Insert(0, account(i, i))).collect();
    let t2 = txn_lines("t2", &big);
    // The line (1-based) where t2's text passes 4096 bytes: t2 starts at line 4.
    let over = 4 + t2
        .iter()
        .scan(0, |sum, l| {
            *sum += l.len();
            Some(*sum)
        })
        .position(|sum| sum > 4096)
        .expect("t2 is larger");
    assert!(over < 3 + t2.len(), "refused before its END");
    lines.extend(t2);
    // A transaction whose END never comes is bounded the same way.
    let endless = txn_lines("t3", &big);
    lines.extend(endless[..endless.len() - 1].iter().cloned());
    lines.extend(txn_lines("t4", &[Change::Insert(0, account(2, 200))]));
    for on_error in [OnError::Stop, OnError::Skip] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.json");
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let node = start(&dir.path().join("data"), 2);
        let dead = dir.path().join("dead.json");
        let report = sink_with(&node, &path, on_error, &dead, 4096);
        if let Some(ts) = report.last_ts {
            node.handle().wait_visible(ts, Duration::from_secs(10));
        }
        if on_error == OnError::Stop {
            let e = report.stopped_by.expect("refused");
            assert!(
                e.contains(&format!("in.json:{over}: ")) && e.contains("max_txn_bytes"),
                "the error names the line where t2 went over: {e}"
            );
            assert_eq!(account_ids(&node), [1]);
        } else {
            assert_eq!(report.stopped_by, None);
            assert_eq!(account_ids(&node), [1, 2], "t2 and t3 skipped, t4 replayed");
            let records: Vec<serde_json::Value> = std::fs::read_to_string(&dead)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            assert_eq!(records.len(), 2, "{records:?}");
            assert_eq!(records[0]["transaction"], "t2");
            assert_eq!(records[0]["lines_left_out"], true, "{}", records[0]);
            assert_eq!(records[1]["transaction"], "t3");
        }
        node.shutdown();
    }
}

/// `lines` written into `broker` in Debezium's Kafka layout under `prefix` (three partitions
/// per table topic, a tombstone after each delete), as a source with the URL's extra `params`.
fn kafka_source(broker: &Broker, prefix: &str, params: &str, lines: &[String]) -> SourceSpec {
    let spec = KafkaSpec::parse(&format!("{}?topic_prefix={prefix}{params}", broker.addr)).unwrap();
    let catalog = Arc::new(Catalog::from_ddl(DDL, "bank.sql").unwrap());
    let mut producer = Producer::connect(&spec, catalog, 3).unwrap();
    // Each delete followed by a tombstone, as Debezium writes them by default.
    producer.tombstones = true;
    producer.send(lines.iter().map(String::as_str)).unwrap();
    SourceSpec::Kafka(spec)
}

/// Replays `source` until it has read what its topics held.
fn sink_from(node: &Node, source: SourceSpec, mode: TxnMode) -> SinkReport {
    let options = SinkOptions {
        source,
        follow: false,
        mode,
        on_error: OnError::Stop,
        dead_letter: "/nonexistent/dead.json".into(),
        max_group_txns: 16,
        group_commit_interval: Duration::from_millis(2),
        checkpoint_interval: None,
        max_txn_bytes: Settings::default().max_txn_bytes,
        decode_lanes: 2,
    };
    run_sink(node.handle(), &options)
}

/// The generated stream (both message forms, events out of order within transactions,
/// transactions delivered twice) through a real broker: each transaction rebuilt from the
/// transaction topic and three partitions per table, read at their own speeds.
#[test]
fn the_stream_through_kafka_equals_the_model() {
    let Some(broker) = Broker::for_test() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let stream = dir.path().join("bank.json");
    let model = generate(7, 1500, &stream);
    let lines: Vec<String> = std::fs::read_to_string(&stream)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let source = kafka_source(&broker, "bankdb", "", &lines);
    let node = start(&dir.path().join("data"), 2);
    let report = sink_from(&node, source, TxnMode::Metadata);
    assert_eq!(report.stopped_by, None);
    assert!(report.duplicates_skipped > 0, "the stream repeats some");
    let last = report.last_ts.unwrap();
    assert!(node.handle().wait_visible(last, Duration::from_secs(30)));
    assert_eq!(visible(&node), model.tables);
    node.shutdown();
}

#[test]
fn kafka_errors_name_topic_partition_and_offset_and_waiting_is_bounded() {
    let Some(broker) = Broker::for_test() else {
        return;
    };
    let t1 = txn_lines("t1", &[Change::Insert(0, account(1, 100))]);
    // A transaction whose event never arrives, while later ones keep arriving.
    let mut lines = t1.clone();
    let mut lost = txn_lines("t2", &[Change::Insert(0, account(2, 200))]);
    lost.remove(1);
    lines.extend(lost);
    for k in 0..20 {
        lines.extend(txn_lines(
            &format!("t{}", k + 3),
            &[Change::Insert(0, account(10 + k, 5))],
        ));
    }
    let source = kafka_source(&broker, "lagging", "&max_buffered=5", &lines);
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 2);
    let report = sink_from(&node, source, TxnMode::Metadata);
    let error = report.stopped_by.unwrap();
    assert!(
        error.contains("transaction t2 still lacks events of bank.accounts")
            && error.contains("more than max_buffered=5"),
        "{error}"
    );
    assert_eq!(
        visible(&node)[0].keys().collect::<Vec<_>>(),
        [&vec![V::I(1)]]
    );
    node.shutdown();

    // A bad value: the error names its topic, partition and offset.
    let mut lines = t1;
    let bad = txn_lines("t2", &[Change::Insert(0, account(3, 300))]);
    lines.extend([
        bad[0].clone(),
        bad[1].replace("\"3.00\"", "\"99999999999.00\""),
        bad[2].clone(),
    ]);
    let source = kafka_source(&broker, "bad", "", &lines);
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 2);
    let report = sink_from(&node, source, TxnMode::Metadata);
    let error = report.stopped_by.unwrap();
    assert!(
        error.contains("kafka:bad.bank.accounts/") && error.contains("balance"),
        "{error}"
    );
    assert_eq!(
        visible(&node)[0].keys().collect::<Vec<_>>(),
        [&vec![V::I(1)]]
    );
    node.shutdown();
}

/// A connector without transaction metadata: each event is its own transaction.
#[test]
fn kafka_without_transaction_metadata_applies_each_event() {
    let Some(broker) = Broker::for_test() else {
        return;
    };
    let mut lines = Vec::new();
    for id in 0..30 {
        let txn = txn_lines("x", &[Change::Insert(0, account(id, id * 10))]);
        let mut event: serde_json::Value = serde_json::from_str(&txn[1]).unwrap();
        // Bare events (no envelope), as txn_lines writes them.
        event.as_object_mut().unwrap().remove("transaction");
        lines.push(event.to_string());
    }
    let source = kafka_source(&broker, "plain", "", &lines);
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"), 2);
    let report = sink_from(&node, source, TxnMode::NoMetadata);
    assert_eq!(report.stopped_by, None);
    assert_eq!(report.transactions, 30);
    node.handle()
        .wait_visible(report.last_ts.unwrap(), Duration::from_secs(10));
    assert_eq!(visible(&node)[0].len(), 30);
    node.shutdown();
}
