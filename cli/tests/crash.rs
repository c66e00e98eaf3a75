//! Crash recovery for real: `retina serve` follows a Debezium file that a writer keeps growing
//! (transfers between accounts, with a ledger whose old entries are deleted), and is killed
//! with SIGKILL at seeded random moments, over and over, while it replays, flushes, combines
//! files, runs memory GC and storage GC (rewriting files the updates and deletes left mostly
//! dead) and takes checkpoints (all set to run every few milliseconds). After
//! every restart a query reads both tables through the DataFusion connector: its snapshot is
//! never behind one a query was shown before the kill, and the rows are exactly the naive
//! model's at that snapshot (nothing lost, nothing twice). At the end, with the writer done,
//! the node catches up to the whole stream and matches the model's final state.
//!
//! Redone transactions get the timestamps they had, so transaction `k` (from 0) always has
//! timestamp `k + 2`, and the model at snapshot `s` is the first `s - 1` transactions.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::Int64Type;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_query::Retina;

const DDL: &str = "CREATE TABLE bank.accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
                   CREATE TABLE bank.ledger (n BIGINT PRIMARY KEY, acct BIGINT NOT NULL, amount BIGINT NOT NULL);";
const ACCOUNTS: i64 = 30;
const TXNS: usize = 5000;
const KILLS: usize = 22;
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
fn generate() -> Vec<Vec<Change>> {
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut state = State::default();
    let mut txns = Vec::with_capacity(TXNS);
    let open: Vec<Change> = (0..ACCOUNTS)
        .map(|id| Change::Insert("accounts", vec![id, 1000]))
        .collect();
    state.apply(&open);
    txns.push(open);
    let mut next_n = 0;
    while txns.len() < TXNS {
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

/// A port whose next three ports (the shards' scan services, then metrics) are free too.
fn free_ports() -> u16 {
    loop {
        let p = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if p < 65_000 && (1..=3).all(|i| TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            return p;
        }
    }
}

fn serve(dir: &std::path::Path, port: u16) -> Child {
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
        .arg(format!("file:{}", dir.join("in.json").display()))
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

fn model_at(txns: &[Vec<Change>], snapshot: u64) -> State {
    let mut state = State::default();
    for txn in txns.iter().take(snapshot.saturating_sub(1) as usize) {
        state.apply(txn);
    }
    state
}

/// A counter or gauge of the node's metrics on `port`, if it answers.
fn metric(port: u16, name: &str) -> Option<u64> {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

fn kill(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn sigkill_at_random_moments_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let path = dir.path().join("in.json");
    std::fs::write(&path, "").unwrap();
    let log = dir.path().join("serve.log");
    let txns = Arc::new(generate());

    // The source database: appends transactions at a steady rate until told to hurry.
    let hurry = Arc::new(AtomicBool::new(false));
    let writer = {
        let (txns, hurry, path) = (txns.clone(), hurry.clone(), path.clone());
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&path)
                .unwrap();
            for (k, txn) in txns.iter().enumerate() {
                f.write_all(txn_json(k, txn).as_bytes()).unwrap();
                if k % 10 == 9 && !hurry.load(Ordering::Relaxed) {
                    f.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(25));
                }
            }
            f.flush().unwrap();
        })
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // Fresh ports each start: connections of the killed process may hold the old ones a while.
    let ports = || {
        let port = free_ports();
        (
            port,
            format!("127.0.0.1:{port}").parse::<SocketAddr>().unwrap(),
        )
    };
    let mut rng = SmallRng::seed_from_u64(SEED ^ 1);
    let mut shown = 0u64;
    let mut checkpointed_kills = 0;
    let mut rewritten = 0;
    for cycle in 0..KILLS {
        let (port, addr) = ports();
        let mut child = serve(dir.path(), port);
        // A query right after the (re)start, and another a random moment later: each never
        // behind what an earlier one saw, each exactly the model at its snapshot.
        for pause_ms in [0, rng.random_range(0..350)] {
            std::thread::sleep(Duration::from_millis(pause_ms));
            let (snapshot, state) = read(&rt, addr, &mut child, &log);
            assert!(
                snapshot >= shown,
                "cycle {cycle}: a query saw {shown} before, now {snapshot}"
            );
            assert_eq!(
                state,
                model_at(&txns, snapshot),
                "cycle {cycle} at {snapshot}"
            );
            shown = snapshot;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..150)));
        rewritten += metric(port + 3, "retina_files_rewritten_total").unwrap_or(0);
        kill(child);
        let state =
            std::fs::read_to_string(dir.path().join("data/coordinator.state")).unwrap_or_default();
        if state.contains("checkpoint_id=") {
            checkpointed_kills += 1;
        }
    }
    assert!(
        checkpointed_kills >= KILLS / 2,
        "most kills should come after a checkpoint: {checkpointed_kills}"
    );
    assert!(
        rewritten > 0,
        "storage GC rewrote files in the runs that were killed"
    );
    hurry.store(true, Ordering::Relaxed);
    writer.join().unwrap();

    // The writer is done: the node catches up to the whole stream.
    let (port, addr) = ports();
    let mut child = serve(dir.path(), port);
    let last = TXNS as u64 + 1;
    let start = Instant::now();
    loop {
        let (snapshot, state) = read(&rt, addr, &mut child, &log);
        assert!(snapshot >= shown);
        assert_eq!(state, model_at(&txns, snapshot), "at {snapshot}");
        shown = snapshot;
        if snapshot == last {
            let total: i64 = state.accounts.values().sum();
            assert_eq!(total, ACCOUNTS * 1000, "money is neither made nor lost");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "stuck at {snapshot} of {last}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{text}");
    assert!(text.contains("resuming from checkpoint"), "{text}");
}
