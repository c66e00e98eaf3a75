//! `retina serve --lake s3://...` as a user runs it, against a real S3 server (moto's; skipped
//! with a note where `moto_server` is not installed, except in CI): the node is killed with
//! SIGKILL while it replays, a second one starts on another (empty) data directory with the same
//! lake and source, recovers from the newest checkpoint in the bucket and replays the rest; and
//! `retina sql`, configured by its own AWS_* environment, reads the bucket.

use std::io::{Read, Write};
use std::net::TcpStream;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use retina_tests::s3::Moto;

const DDL: &str = "CREATE TABLE public.t (id INT PRIMARY KEY, v VARCHAR(10), amount DECIMAL(8,2));";
const TXNS: usize = 3000;

fn stream(txns: usize) -> String {
    let mut s = String::new();
    for i in 0..txns {
        s += &format!(
            "{{\"status\":\"BEGIN\",\"id\":\"{i}\",\"event_count\":null,\"data_collections\":null}}\n\
             {{\"before\":null,\"after\":{{\"id\":{i},\"v\":\"r{i}\",\"amount\":\"{i}.25\"}},\"op\":\"c\",\
             \"source\":{{\"schema\":\"public\",\"table\":\"t\"}},\
             \"transaction\":{{\"id\":\"{i}\",\"total_order\":1,\"data_collection_order\":1}}}}\n\
             {{\"status\":\"END\",\"id\":\"{i}\",\"event_count\":1,\
             \"data_collections\":[{{\"data_collection\":\"public.t\",\"event_count\":1}}]}}\n"
        );
    }
    s
}

/// A port for `--listen` (the shards' scan services take the ports after it) or metrics.
fn free_port() -> u16 {
    retina_tests::free_ports()
}

fn metric(port: u16, name: &str) -> Option<f64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

fn wait_metric(child: &mut Child, port: u16, name: &str, done: impl Fn(f64) -> bool) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut log = String::new();
            let _ = child.stderr.take().unwrap().read_to_string(&mut log);
            panic!("retina serve exited ({status}): {log}");
        }
        if metric(port, name).is_some_and(&done) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "timed out waiting for {name}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn serve(moto: &Moto, dir: &std::path::Path, data: &str, listen: u16, metrics: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["serve", "--shards", "2", "--lake", "s3://cli-lake/node"])
        .args(["--set", "checkpoint_interval_ms=30"])
        .args(["--source", "file:in.json", "--listen"])
        .arg(format!("127.0.0.1:{listen}"))
        .arg("--metrics")
        .arg(format!("127.0.0.1:{metrics}"))
        .arg("--data-dir")
        .arg(dir.join(data))
        .args(["--schema", "s.sql"])
        .current_dir(dir)
        .envs(moto.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn sql(moto: &Moto, listen: u16, query: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["sql", "--format", "csv", "--connect"])
        .arg(format!("127.0.0.1:{listen}"))
        .arg(query)
        .envs(moto.env())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_killed_node_resumes_from_the_bucket_on_a_new_data_dir_and_sql_reads_it() {
    let Some(moto) = Moto::start() else { return };
    moto.create_bucket("cli-lake");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    std::fs::write(dir.path().join("in.json"), stream(TXNS)).unwrap();

    let (listen, metrics) = (free_port(), free_port());
    let mut first = serve(&moto, dir.path(), "machine-1", listen, metrics);
    // Killed once a checkpoint is in the bucket, while it still replays (or just after).
    wait_metric(&mut first, metrics, "retina_checkpoint_id", |id| id >= 2.0);
    first.kill().unwrap();
    let _ = first.wait();

    let (listen, metrics) = (free_port(), free_port());
    let mut second = serve(&moto, dir.path(), "machine-2", listen, metrics);
    let hwm = (TXNS + 2) as f64;
    wait_metric(&mut second, metrics, "retina_hwm", |h| h == hwm);
    wait_metric(&mut second, metrics, "retina_source_done", |d| d == 1.0);
    let out = sql(
        &moto,
        listen,
        "SELECT count(*) AS n, sum(id) AS s, count(DISTINCT id) AS d FROM public.t",
    );
    let n = TXNS as i64;
    assert_eq!(
        out.lines().nth(1),
        Some(format!("{n},{},{n}", n * (n - 1) / 2).as_str()),
        "{out}"
    );
    assert!(
        !dir.path().join("machine-2/lake").exists(),
        "nothing went to a local lake"
    );
    second.kill().unwrap();
    let out = second.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        log.contains("recovering from checkpoint")
            && log.contains("of the lake s3://cli-lake/node/"),
        "the second node started from the lake's checkpoint: {log}"
    );
}
