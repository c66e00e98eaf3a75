//! Arrow Flight and Flight SQL as their users' tools read them: pyarrow, the ADBC Flight SQL
//! driver and DuckDB, all from Python (no Rust on the client side), against `retina serve
//! --flight` replaying a stream.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const DDL: &str = "
CREATE TABLE bank.accounts (id INT PRIMARY KEY, owner VARCHAR(20), balance BIGINT NOT NULL);
CREATE TABLE bank.ledger (n BIGINT PRIMARY KEY, src INT NOT NULL, dst INT NOT NULL, amount BIGINT NOT NULL);";
const TOKEN: &str = "flight-test-token";
const ACCOUNTS: i64 = 40;
const OPENING: i64 = 1000;

fn scripts() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/flight"))
}

/// One Debezium event of a bank table.
fn event(txn: &str, order: usize, table: &str, op: &str, before: &str, after: &str) -> String {
    format!(
        "{{\"before\":{before},\"after\":{after},\"op\":\"{op}\",\
         \"source\":{{\"schema\":\"bank\",\"table\":\"{table}\"}},\
         \"transaction\":{{\"id\":\"{txn}\",\"total_order\":{order},\"data_collection_order\":{order}}}}}\n"
    )
}

fn account(id: i64, balance: i64) -> String {
    format!("{{\"id\":{id},\"owner\":\"owner-{id}\",\"balance\":{balance}}}")
}

/// The accounts' opening transaction, then `transfers` transfers (each: two account updates
/// and a ledger entry, in one transaction), from transfer `first` on; `balances` is kept.
fn transfers(first: usize, transfers: usize, balances: &mut Vec<i64>) -> String {
    let mut s = String::new();
    if first == 0 {
        s += "{\"status\":\"BEGIN\",\"id\":\"open\"}\n";
        for id in 1..=ACCOUNTS {
            s += &event(
                "open",
                id as usize,
                "accounts",
                "c",
                "null",
                &account(id, OPENING),
            );
        }
        s += &format!(
            "{{\"status\":\"END\",\"id\":\"open\",\"event_count\":{ACCOUNTS},\
             \"data_collections\":[{{\"data_collection\":\"bank.accounts\",\"event_count\":{ACCOUNTS}}}]}}\n"
        );
        *balances = vec![OPENING; ACCOUNTS as usize];
    }
    for n in first..first + transfers {
        let src = (n * 7 % ACCOUNTS as usize) as i64 + 1;
        let dst = ((n * 13 + 5) % ACCOUNTS as usize) as i64 + 1;
        if src == dst {
            continue;
        }
        let amount = (n % 97) as i64 + 1;
        let (s0, d0) = (balances[src as usize - 1], balances[dst as usize - 1]);
        balances[src as usize - 1] -= amount;
        balances[dst as usize - 1] += amount;
        let id = format!("t{n}");
        s += &format!("{{\"status\":\"BEGIN\",\"id\":\"{id}\"}}\n");
        s += &event(
            &id,
            1,
            "accounts",
            "u",
            &account(src, s0),
            &account(src, s0 - amount),
        );
        s += &event(
            &id,
            2,
            "ledger",
            "c",
            "null",
            &format!("{{\"n\":{n},\"src\":{src},\"dst\":{dst},\"amount\":{amount}}}"),
        );
        s += &event(
            &id,
            3,
            "accounts",
            "u",
            &account(dst, d0),
            &account(dst, d0 + amount),
        );
        s += &format!(
            "{{\"status\":\"END\",\"id\":\"{id}\",\"event_count\":3,\"data_collections\":[\
             {{\"data_collection\":\"bank.accounts\",\"event_count\":2}},\
             {{\"data_collection\":\"bank.ledger\",\"event_count\":1}}]}}\n"
        );
    }
    s
}

/// Ledger entries among the first `n` transfers (a transfer to oneself is not written).
fn entries(n: usize) -> usize {
    (0..n)
        .filter(|&k| k * 7 % ACCOUNTS as usize != (k * 13 + 5) % ACCOUNTS as usize)
        .count()
}

struct Served {
    child: Child,
    flight: String,
    _log: Receiver<String>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `retina serve --follow --flight` on ephemeral ports, with the Flight address from its log.
fn serve(dir: &Path, source: &Path) -> Served {
    std::fs::write(dir.join("s.sql"), DDL).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["serve", "--shards", "2", "--follow"])
        .args(["--listen", "127.0.0.1:0", "--flight", "127.0.0.1:0"])
        .args(["--auth-token", TOKEN])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--schema")
        .arg(dir.join("s.sql"))
        .arg("--source")
        .arg(format!("file:{}", source.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (flight, rx) =
        retina_tests::logged_after(&mut child, "Arrow Flight and Flight SQL on ", true);
    Served {
        child,
        flight,
        _log: rx,
    }
}

fn python(script: &str, args: &[&str]) -> Command {
    let mut c = Command::new("python3");
    c.arg(scripts().join(script)).args(args);
    c
}

fn assert_ran(out: std::process::Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn pyarrow_reads_every_table_at_one_snapshot_during_replay() {
    if !retina_tests::python_modules(&["pyarrow.flight"]) {
        eprintln!("skipped: no pyarrow (python3 -m pip install pyarrow)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("in.json");
    let mut balances = Vec::new();
    std::fs::write(&source, transfers(0, 200, &mut balances)).unwrap();
    let node = serve(dir.path(), &source);
    let done = dir.path().join("done.json");
    let reader = python(
        "snapshot_reads.py",
        &[&node.flight, TOKEN, done.to_str().unwrap()],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();

    // The stream goes on while pyarrow reads: 3000 more transfers, a chunk at a time.
    let total = 3200;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&source)
        .unwrap();
    let start = Instant::now();
    for first in (200..total).step_by(100) {
        file.write_all(transfers(first, 100, &mut balances).as_bytes())
            .unwrap();
        file.flush().unwrap();
        std::thread::sleep(Duration::from_millis(150));
    }
    let expected = format!("{{\"accounts\":{ACCOUNTS},\"entries\":{}}}", entries(total));
    std::fs::write(dir.path().join("done.tmp"), expected).unwrap();
    std::fs::rename(dir.path().join("done.tmp"), &done).unwrap();
    let out = reader.wait_with_output().unwrap();
    let summary = assert_ran(out, "pyarrow's reads");
    let summary: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
    eprintln!("{summary} in {:?}", start.elapsed());
    assert!(
        summary["reads"].as_u64().unwrap() >= 5 && summary["snapshots"].as_u64().unwrap() >= 3,
        "pyarrow read all through replay: {summary}"
    );
}

#[test]
fn adbc_and_duckdb_query_through_flight_sql() {
    if !retina_tests::python_modules(&["adbc_driver_flightsql.dbapi", "duckdb"]) {
        eprintln!(
            "skipped: no ADBC or DuckDB \
             (python3 -m pip install adbc-driver-flightsql adbc-driver-manager duckdb)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("in.json");
    let mut balances = Vec::new();
    let n = 500;
    std::fs::write(&source, transfers(0, n, &mut balances)).unwrap();
    let node = serve(dir.path(), &source);
    // Waits until the whole stream is visible, through Flight SQL itself.
    let entries = entries(n).to_string();
    let accounts = ACCOUNTS.to_string();
    let start = Instant::now();
    loop {
        let out = python("flight_sql.py", &[&node.flight, TOKEN, &accounts, &entries])
            .output()
            .unwrap();
        if out.status.success() {
            break;
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            (stderr.contains("the ledger's count") || stderr.contains("count and sum"))
                && start.elapsed() < Duration::from_secs(60),
            "ADBC and DuckDB through Flight SQL:\n{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
