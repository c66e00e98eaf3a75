//! `retina serve` as a user runs it: from a file and from stdin, serving metrics, until SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DDL: &str = "CREATE TABLE public.t (id INT PRIMARY KEY, v VARCHAR(10), amount DECIMAL(8,2));";

fn stream(txns: usize) -> String {
    let mut s = String::new();
    for i in 0..txns {
        let id = format!("{i}");
        s += &format!(
            "{{\"status\":\"BEGIN\",\"id\":\"{id}\",\"event_count\":null,\"data_collections\":null}}\n"
        );
        s += &format!(
            "{{\"before\":null,\"after\":{{\"id\":{i},\"v\":\"r{i}\",\"amount\":\"{i}.25\"}},\"op\":\"c\",\
             \"source\":{{\"schema\":\"public\",\"table\":\"t\"}},\
             \"transaction\":{{\"id\":\"{id}\",\"total_order\":1,\"data_collection_order\":1}}}}\n"
        );
        s += &format!(
            "{{\"status\":\"END\",\"id\":\"{id}\",\"event_count\":1,\
             \"data_collections\":[{{\"data_collection\":\"public.t\",\"event_count\":1}}]}}\n"
        );
    }
    s
}

/// A port for `--listen` (the shards' scan services take the ports after it) or metrics.
fn free_port() -> u16 {
    retina_tests::free_ports()
}

fn metrics(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until the node's metrics say the source is done at `hwm`.
fn wait_done(child: &mut Child, port: u16, hwm: f64) {
    let start = Instant::now();
    loop {
        assert!(
            child.try_wait().unwrap().is_none(),
            "retina serve exited early"
        );
        if let Some(m) = metrics(port)
            && metric(&m, "retina_source_done") == Some(1.0)
            && metric(&m, "retina_hwm") == Some(hwm)
        {
            assert_eq!(metric(&m, "retina_replay_stopped"), Some(0.0));
            assert_eq!(metric(&m, "retina_rows_applied_total"), Some(hwm - 2.0));
            assert_eq!(
                metric(&m, "retina_transactions_applied_total"),
                Some(hwm - 2.0)
            );
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no progress: {:?}",
            metrics(port)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(child: Child) -> String {
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    log
}

fn serve(dir: &std::path::Path, source: &str, port: u16, stdin: Stdio) -> Child {
    serve_with(dir, source, port, stdin, &[])
}

fn serve_with(
    dir: &std::path::Path,
    source: &str,
    port: u16,
    stdin: Stdio,
    extra: &[&str],
) -> Child {
    Command::new(env!("CARGO_BIN_EXE_retina"))
        .args([
            "serve",
            "--shards",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--source",
            source,
            "--metrics",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .args(extra)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--schema")
        .arg(dir.join("s.sql"))
        .stdin(stdin)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn serves_a_file_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    std::fs::write(dir.path().join("in.json"), stream(500)).unwrap();
    let port = free_port();
    let source = format!("file:{}", dir.path().join("in.json").display());
    let mut child = serve(dir.path(), &source, port, Stdio::null());
    wait_done(&mut child, port, 502.0);
    // It keeps serving after the source ended.
    std::thread::sleep(Duration::from_millis(200));
    assert!(child.try_wait().unwrap().is_none());
    let log = stop(child);
    assert!(log.contains("stopped at HWM 502"), "{log}");
    let state = std::fs::read_to_string(dir.path().join("data/coordinator.state")).unwrap();
    assert!(state.contains("hwm=502"), "{state}");
}

#[test]
fn serves_stdin_and_reports_bad_input_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let port = free_port();
    let mut child = serve(dir.path(), "stdin", port, Stdio::piped());
    let mut input = child.stdin.take().unwrap();
    input.write_all(stream(20).as_bytes()).unwrap();
    input
        .write_all(b"{\"status\":\"BEGIN\",\"id\":\"x\"}\nnot json at all\n")
        .unwrap();
    drop(input);
    let start = Instant::now();
    loop {
        let m = metrics(port).unwrap_or_default();
        // The 20 good transactions stay visible; the shards may report them just after the
        // sink stopped on the bad line.
        if metric(&m, "retina_replay_stopped") == Some(1.0)
            && metric(&m, "retina_hwm") == Some(22.0)
        {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = stop(child);
    assert!(
        log.contains("stdin:62: malformed Debezium message"),
        "{log}"
    );
    assert!(log.contains("(transaction x)"), "{log}");
}

/// Waits until the node's HWM is `hwm`.
fn wait_hwm(child: &mut Child, port: u16, hwm: f64) {
    let start = Instant::now();
    while metrics(port).and_then(|m| metric(&m, "retina_hwm")) != Some(hwm) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "retina serve exited early"
        );
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{:?}",
            metrics(port)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn follows_a_growing_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let path = dir.path().join("in.json");
    std::fs::write(&path, "").unwrap();
    let port = free_port();
    let source = format!("file:{}", path.display());
    let mut child = serve_with(dir.path(), &source, port, Stdio::null(), &["--follow"]);
    let all = stream(20);
    let lines: Vec<&str> = all.lines().collect();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all((lines[..30].join("\n") + "\n").as_bytes())
        .unwrap();
    wait_hwm(&mut child, port, 12.0);
    // A line written in two pieces is read once it is whole.
    let rest = lines[30..].join("\n") + "\n";
    let (a, b) = rest.split_at(17);
    f.write_all(a.as_bytes()).unwrap();
    f.flush().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    f.write_all(b.as_bytes()).unwrap();
    wait_hwm(&mut child, port, 22.0);
    stop(child);
}

#[test]
fn replays_a_stream_without_transaction_metadata() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let events: String = stream(30)
        .lines()
        .filter(|l| !l.contains("\"status\""))
        .map(|l| l.to_owned() + "\n")
        .collect();
    std::fs::write(dir.path().join("in.json"), events).unwrap();
    let port = free_port();
    let source = format!("file:{}", dir.path().join("in.json").display());
    let mut child = serve_with(
        dir.path(),
        &source,
        port,
        Stdio::null(),
        &["--no-txn-metadata", "--set", "max_group_txns=4"],
    );
    wait_done(&mut child, port, 32.0);
    stop(child);
}

fn lake_files(dir: &std::path::Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    fn walk(
        p: &std::path::Path,
        out: &mut std::collections::BTreeMap<std::path::PathBuf, Vec<u8>>,
    ) {
        for e in std::fs::read_dir(p).into_iter().flatten().flatten() {
            let path = e.path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = Default::default();
    walk(&dir.join("data/lake"), &mut out);
    out
}

/// Waits until the metrics satisfy `done`.
fn wait_metrics(child: &mut Child, port: u16, done: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let m = metrics(port).unwrap_or_default();
        if done(&m) {
            return m;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "retina serve exited early"
        );
        assert!(start.elapsed() < Duration::from_secs(30), "{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_restart_resumes_from_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let path = dir.path().join("in.json");
    std::fs::write(&path, stream(600)).unwrap();
    let source = format!("file:{}", path.display());
    let small = [
        "--set",
        "tile_rows=64",
        "--set",
        "block_rows=64",
        "--set",
        "row_group_rows=128",
        "--set",
        "file_rows=256",
        "--set",
        "flush_interval_ms=5",
        "--set",
        "checkpoint_interval_ms=20",
    ];
    let port = free_port();
    let mut child = serve_with(dir.path(), &source, port, Stdio::null(), &small);
    wait_done(&mut child, port, 602.0);
    std::thread::sleep(Duration::from_millis(200));
    stop(child);
    let state = std::fs::read_to_string(dir.path().join("data/coordinator.state")).unwrap();
    // The clean stop checkpointed everything: the last transaction has timestamp 601.
    assert!(state.contains("checkpoint_ts=601\n"), "{state}");
    let first = lake_files(dir.path());
    assert!(!first.is_empty(), "blocks were flushed");

    // 300 more transactions arrive while it is down; a restart replays only those, with the
    // timestamps that follow.
    let all = stream(900);
    let tail: String = all
        .lines()
        .skip(600 * 3)
        .map(|l| l.to_owned() + "\n")
        .collect();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(tail.as_bytes()).unwrap();
    drop(f);
    let port = free_port();
    let mut child = serve_with(dir.path(), &source, port, Stdio::null(), &small);
    let m = wait_metrics(&mut child, port, |m| {
        metric(m, "retina_source_done") == Some(1.0) && metric(m, "retina_hwm") == Some(902.0)
    });
    assert_eq!(metric(&m, "retina_rows_applied_total"), Some(300.0), "{m}");
    assert_eq!(metric(&m, "retina_replay_stopped"), Some(0.0));
    std::thread::sleep(Duration::from_millis(100));
    let log = stop(child);
    assert!(log.contains("resuming from checkpoint"), "{log}");
    // Files the first run combined are read as they were, never rewritten.
    let second = lake_files(dir.path());
    for (path, bytes) in first
        .iter()
        .filter(|(p, _)| !p.to_string_lossy().contains("/buffer/"))
    {
        assert_eq!(second.get(path), Some(bytes), "{} changed", path.display());
    }

    // A restart with another shard count is refused with the reason.
    let out = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args([
            "serve",
            "--shards",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--source",
            &source,
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--schema")
        .arg(dir.path().join("s.sql"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("start with --shards 2"), "{err}");
}

/// Starts `retina serve` on ephemeral ports and returns it with its coordinator's address
/// (from its log) and the rest of its log as it comes.
fn serve_listening(
    dir: &std::path::Path,
    source: &str,
    port: u16,
) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    let mut child = serve(dir, source, port, Stdio::null());
    let (addr, rx) =
        retina_tests::logged_after(&mut child, "coordinator service (Cap'n Proto) on ", false);
    (child, addr, rx)
}

fn sql(addr: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["sql", "--connect", addr])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn sql_reads_a_serving_node_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    std::fs::write(dir.path().join("in.json"), stream(300)).unwrap();
    let port = free_port();
    let source = format!("file:{}", dir.path().join("in.json").display());
    let (child, addr, _log) = serve_listening(dir.path(), &source, port);
    let mut node = Running(Some(child));
    wait_done(node.0.as_mut().unwrap(), port, 302.0);

    let out = sql(
        &addr,
        &["SELECT count(*) AS n, sum(amount) AS total FROM public.t"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // 0.25 + 1.25 + ... + 299.25 = 44850 + 75
    assert!(text.contains("| n   | total    |"), "{text}");
    assert!(text.contains("| 300 | 44925.00 |"), "{text}");

    let out = sql(
        &addr,
        &[
            "--format",
            "csv",
            "SELECT id, v FROM public.t WHERE id < 3 ORDER BY id",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "id,v\n0,r0\n1,r1\n2,r2\n"
    );
    let out = sql(
        &addr,
        &[
            "--format",
            "json",
            "SELECT id, amount FROM public.t WHERE id = 7",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"id\":7,\"amount\":7.25}\n"
    );

    let out = sql(&addr, &["SELEC id FROM public.t"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("SELEC"), "{err}");
    let out = sql(&addr, &["SELECT * FROM public.nope"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("nope"), "{err}");
    stop_quietly(node.0.take().unwrap());
}

/// A node that is killed if the test fails before stopping it.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn stop_quietly(child: Child) {
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
}

/// A transaction of `public.t` as Debezium JSON lines: `events` are (op, before, after).
fn txn_lines(id: &str, events: &[(&str, &str, &str)]) -> String {
    let mut s = format!("{{\"status\":\"BEGIN\",\"id\":\"{id}\"}}\n");
    for (i, (op, before, after)) in events.iter().enumerate() {
        s += &format!(
            "{{\"before\":{before},\"after\":{after},\"op\":\"{op}\",\
             \"source\":{{\"schema\":\"public\",\"table\":\"t\"}},\
             \"transaction\":{{\"id\":\"{id}\",\"total_order\":{n},\"data_collection_order\":{n}}}}}\n",
            n = i + 1
        );
    }
    s + &format!(
        "{{\"status\":\"END\",\"id\":\"{id}\",\"event_count\":{n},\
         \"data_collections\":[{{\"data_collection\":\"public.t\",\"event_count\":{n}}}]}}\n",
        n = events.len()
    )
}

fn row(id: i64, v: &str) -> String {
    format!("{{\"id\":{id},\"v\":\"{v}\",\"amount\":\"1.00\"}}")
}

#[test]
fn a_relative_data_directory_works_from_any_folder() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    std::fs::write(dir.path().join("in.json"), stream(100)).unwrap();
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_retina"))
        .current_dir(dir.path())
        .args(["serve", "--shards", "2", "--listen", "127.0.0.1:0"])
        .args([
            "--data-dir",
            "data",
            "--schema",
            "s.sql",
            "--source",
            "file:in.json",
        ])
        .args(["--set", "checkpoint_interval_ms=5", "--metrics"])
        .arg(format!("127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Replay is not stopped (wait_done checks), and the checkpoints are written.
    wait_done(&mut child, port, 102.0);
    stop(child);
    let state = std::fs::read_to_string(dir.path().join("data/coordinator.state")).unwrap();
    assert!(state.contains("checkpoint_ts=101\n"), "{state}");
}

#[test]
fn a_transaction_redelivered_after_a_restart_is_not_applied_again() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let path = dir.path().join("in.json");
    let t2 = txn_lines("T2", &[("u", &row(1, "a"), &row(1, "b"))]);
    let first = txn_lines("T1", &[("c", "null", &row(1, "a"))])
        + &t2
        + &txn_lines("T3", &[("u", &row(1, "b"), &row(1, "c"))]);
    std::fs::write(&path, first).unwrap();
    let source = format!("file:{}", path.display());
    let port = free_port();
    let mut child = serve(dir.path(), &source, port, Stdio::null());
    wait_done(&mut child, port, 5.0);
    stop(child);

    // The source redelivers T2 (as Debezium does after a connector restart), then goes on.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(t2.as_bytes()).unwrap();
    f.write_all(txn_lines("T4", &[("c", "null", &row(2, "d"))]).as_bytes())
        .unwrap();
    drop(f);
    let port = free_port();
    let (child, addr, _log) = serve_listening(dir.path(), &source, port);
    let mut node = Running(Some(child));
    let m = wait_metrics(node.0.as_mut().unwrap(), port, |m| {
        metric(m, "retina_source_done") == Some(1.0)
    });
    assert_eq!(
        metric(&m, "retina_duplicates_skipped_total"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(metric(&m, "retina_hwm"), Some(6.0), "{m}");
    let out = sql(
        &addr,
        &["--format", "csv", "SELECT id, v FROM public.t ORDER BY id"],
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "id,v\n1,c\n2,d\n");
    stop_quietly(node.0.take().unwrap());
}

#[test]
fn dead_letters_are_written_once_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let path = dir.path().join("in.json");
    let bad = "{\"id\":2,\"v\":\"b\",\"amount\":\"not a number\"}";
    let input = txn_lines("T1", &[("c", "null", &row(1, "a"))])
        + &txn_lines("T2", &[("c", "null", bad)])
        + &txn_lines("T3", &[("c", "null", &row(3, "c"))]);
    std::fs::write(&path, input).unwrap();
    let source = format!("file:{}", path.display());
    // Without checkpoints every restart replays the source from its start.
    let args = ["--on-error", "skip", "--set", "checkpoint_interval_ms=0"];
    for _ in 0..2 {
        let port = free_port();
        let mut child = serve_with(dir.path(), &source, port, Stdio::null(), &args);
        wait_metrics(&mut child, port, |m| {
            metric(m, "retina_source_done") == Some(1.0) && metric(m, "retina_hwm") == Some(4.0)
        });
        stop(child);
    }
    let dead = std::fs::read_to_string(dir.path().join("data/dead-letter.jsonl")).unwrap();
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("\"transaction\":\"T2\""), "{dead}");
}

#[test]
fn skip_means_skip_for_transactions_a_shard_refuses() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    let path = dir.path().join("in.json");
    // T2 inserts row 1 again and row 5 (a duplicate key: the shard refuses it, after its other
    // shard may have applied its half); T3 goes on with rows on both shards.
    let input = txn_lines("T1", &[("c", "null", &row(1, "a"))])
        + &txn_lines(
            "T2",
            &[("c", "null", &row(5, "x")), ("c", "null", &row(1, "dup"))],
        )
        + &txn_lines(
            "T3",
            &[
                ("c", "null", &row(2, "b")),
                ("c", "null", &row(3, "c")),
                ("u", &row(1, "a"), &row(1, "a2")),
            ],
        );
    std::fs::write(&path, input).unwrap();
    let source = format!("file:{}", path.display());
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["serve", "--shards", "2", "--listen", "127.0.0.1:0"])
        .args(["--source", &source, "--on-error", "skip", "--metrics"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--schema")
        .arg(dir.path().join("s.sql"))
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // T1 and T3 are visible (timestamps 2 and 3 after the restart without T2), replay is not
    // stopped, and T2 is in the dead-letter file once.
    let m = wait_metrics(&mut child, port, |m| {
        metric(m, "retina_source_done") == Some(1.0) && metric(m, "retina_hwm") == Some(4.0)
    });
    assert_eq!(metric(&m, "retina_replay_stopped"), Some(0.0), "{m}");
    let log = stop(child);
    assert!(log.contains("restarting from the checkpoint"), "{log}");
    let dead = std::fs::read_to_string(dir.path().join("data/dead-letter.jsonl")).unwrap();
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(dead.contains("transaction T2"), "{dead}");
    let record: serde_json::Value = serde_json::from_str(dead.trim()).unwrap();
    assert_eq!(record["transaction"], "T2", "{dead}");
    assert!(dead.contains("\\\"dup\\\""), "the lines are kept: {dead}");

    let port = free_port();
    let (child, addr, _log) = serve_listening(dir.path(), &source, port);
    let mut node = Running(Some(child));
    wait_metrics(node.0.as_mut().unwrap(), port, |m| {
        metric(m, "retina_source_done") == Some(1.0)
    });
    let out = sql(
        &addr,
        &["--format", "csv", "SELECT id, v FROM public.t ORDER BY id"],
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "id,v\n1,a2\n2,b\n3,c\n"
    );
    stop_quietly(node.0.take().unwrap());
    let dead = std::fs::read_to_string(dir.path().join("data/dead-letter.jsonl")).unwrap();
    assert_eq!(dead.lines().count(), 1, "{dead}");
}
