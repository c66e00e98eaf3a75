//! `retina serve --cluster etcd://...` as a user runs it, against a real etcd (Debian's
//! `etcd-server`) and a real S3 server (moto's), both on loopback; skipped with a note where
//! either is not installed, except in CI.
//!
//! - A leader killed with SIGKILL is replaced by the standby, which resumes from the checkpoint
//!   the cluster recorded: the final table equals the model, and a query after the failover
//!   never sees less than one before it. Before that, a query through the standby reaches the
//!   leader.
//! - A leader cut off from etcd pauses replay once its lease runs out, and goes on when etcd
//!   is back.
//! - A leader frozen (SIGSTOP) past its lease is deposed: the standby takes over, and the old
//!   leader, thawed, stops without writing anything the new one reads.
//! - A leader that cannot write its state file leaves the cluster, and the standby takes over.
//! - Three members run the shards (`--peer`): members that join get shards, queries through
//!   any member see one snapshot of every shard, a member killed during replay is left out
//!   once its lease expires and gets shards again when it comes back, and a killed leader is
//!   replaced by a member that ran shards for it; the table equals the model throughout.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use retina_tests::etcd::Etcd;
use retina_tests::s3::Moto;

const DDL: &str = "CREATE TABLE public.t (id INT PRIMARY KEY, v VARCHAR(10), amount DECIMAL(8,2));";
/// Seconds: a standby takes over about this long after the leader stops renewing.
const LEASE_TTL: &str = "2";

/// The source: transaction `i` inserts row `i`; every third one also updates row `i / 2`.
/// Keeps the model (every row's `v`) as it writes.
struct Source {
    next: usize,
    model: BTreeMap<usize, String>,
}

impl Source {
    fn new() -> Self {
        Source {
            next: 0,
            model: BTreeMap::new(),
        }
    }

    /// The next `n` transactions as Debezium JSON lines.
    fn txns(&mut self, n: usize) -> String {
        let mut s = String::new();
        let event = |op: &str, before: String, after: String, txn: usize, order: usize| {
            format!(
                "{{\"before\":{before},\"after\":{after},\"op\":\"{op}\",\
                 \"source\":{{\"schema\":\"public\",\"table\":\"t\"}},\
                 \"transaction\":{{\"id\":\"{txn}\",\"total_order\":{order},\"data_collection_order\":{order}}}}}\n"
            )
        };
        let row =
            |id: usize, v: &str| format!("{{\"id\":{id},\"v\":\"{v}\",\"amount\":\"{id}.25\"}}");
        for i in self.next..self.next + n {
            s += &format!(
                "{{\"status\":\"BEGIN\",\"id\":\"{i}\",\"event_count\":null,\"data_collections\":null}}\n"
            );
            let v = format!("r{i}");
            s += &event("c", "null".into(), row(i, &v), i, 1);
            self.model.insert(i, v);
            let mut events = 1;
            if i > 0 && i % 3 == 0 {
                let id = i / 2;
                let (old, new) = (self.model[&id].clone(), format!("u{i}"));
                s += &event("u", row(id, &old), row(id, &new), i, 2);
                self.model.insert(id, new);
                events = 2;
            }
            s += &format!(
                "{{\"status\":\"END\",\"id\":\"{i}\",\"event_count\":{events},\
                 \"data_collections\":[{{\"data_collection\":\"public.t\",\"event_count\":{events}}}]}}\n"
            );
        }
        self.next += n;
        s
    }

    /// HWM once every transaction so far is visible: one timestamp per transaction.
    fn hwm(&self) -> f64 {
        (self.next + 2) as f64
    }

    /// The table as `SELECT id, v ... ORDER BY id` prints it in CSV.
    fn table(&self) -> String {
        let mut out = "id,v\n".to_owned();
        for (id, v) in &self.model {
            out += &format!("{id},{v}\n");
        }
        out
    }
}

fn append(path: &Path, text: &str) {
    let mut f = std::fs::File::options()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn metric(port: u16, name: &str) -> Option<f64> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// A member of the cluster, with its ports.
struct Member {
    child: Option<Child>,
    listen: u16,
    metrics: u16,
    log: std::path::PathBuf,
}

impl Member {
    fn start(etcd: &Etcd, moto: &Moto, dir: &Path, id: &str) -> Member {
        Member::start_with(etcd, moto, dir, id, 2, false)
    }

    /// A member of a cluster of `shards` shards; with `peer` it runs shards a leader places on
    /// it. Ports: the coordinator's, one per shard for the scan services, the metrics', the
    /// peer's, and one per shard after the peer's.
    fn start_with(
        etcd: &Etcd,
        moto: &Moto,
        dir: &Path,
        id: &str,
        shards: u16,
        peer: bool,
    ) -> Member {
        let listen = retina_bench::ports::free_ports(2 * shards + 3);
        Member::start_on(etcd, moto, dir, id, shards, peer, listen)
    }

    /// As [`Member::start_with`], on the ports from `listen` on (a member started again
    /// keeps its addresses).
    fn start_on(
        etcd: &Etcd,
        moto: &Moto,
        dir: &Path,
        id: &str,
        shards: u16,
        peer: bool,
        listen: u16,
    ) -> Member {
        let metrics = listen + shards + 1;
        let log = dir.join(format!("{id}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_retina"));
        cmd.args(["serve", "--lake", "s3://cluster-lake/t"])
            .arg("--shards")
            .arg(shards.to_string())
            .args(["--set", "checkpoint_interval_ms=50", "--follow"])
            .args(["--source", "file:in.json", "--schema", "s.sql"])
            .args(["--cluster", &etcd.url("retina-test"), "--node-id", id])
            .args(["--lease-ttl", LEASE_TTL])
            .arg("--listen")
            .arg(format!("127.0.0.1:{listen}"))
            .arg("--metrics")
            .arg(format!("127.0.0.1:{metrics}"));
        if peer {
            cmd.arg("--peer").arg(format!("127.0.0.1:{}", metrics + 1));
        }
        let child = cmd
            .arg("--data-dir")
            .arg(dir.join(id))
            .current_dir(dir)
            .envs(moto.env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        Member {
            child: Some(child),
            listen,
            metrics,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the member runs")
    }

    /// Waits until its metrics satisfy `done` (it serves metrics once it leads).
    fn wait(&mut self, what: &str, name: &str, done: impl Fn(f64) -> bool) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child().try_wait().unwrap() {
                panic!(
                    "retina serve exited ({status}) waiting for {what}: {}",
                    self.log()
                );
            }
            if metric(self.metrics, name).is_some_and(&done) {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "timed out waiting for {what}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits until the member exits with an error whose log says `why`.
    fn wait_failed(&mut self, what: &str, why: &str) {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child().try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{what} went on: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(!status.success(), "{what} stopped cleanly: {}", self.log());
        assert!(
            self.log().contains(why),
            "{what} says why it stopped: {}",
            self.log()
        );
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until its `--listen` accepts connections (a member started again runs its shards
    /// before it registered, and listens once it did).
    fn wait_listening(&mut self) {
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.listen)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "never listening: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal(&mut self, signal: &str) {
        let pid = self.child().id().to_string();
        let sent = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(sent.success(), "kill {signal} {pid}");
    }

    fn sql(&self, moto: &Moto, query: &str) -> String {
        let out = sql_through(self.listen, &moto.env(), query);
        assert!(
            out.status.success(),
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The table as `Source::table` prints it.
    fn table(&self, moto: &Moto) -> String {
        self.sql(moto, "SELECT id, v FROM public.t ORDER BY id")
    }

    fn count(&self, moto: &Moto) -> u64 {
        let out = self.sql(moto, "SELECT count(*) AS n FROM public.t");
        out.lines().nth(1).unwrap().parse().unwrap()
    }

    /// The row count, if the member answers queries now.
    fn try_count(&self, moto: &Moto) -> Option<u64> {
        let out = sql_through(
            self.listen,
            &moto.env(),
            "SELECT count(*) AS n FROM public.t",
        );
        let text = String::from_utf8(out.stdout).ok()?;
        out.status
            .success()
            .then(|| text.lines().nth(1)?.parse().ok())?
    }
}

/// `retina sql` through the service on `port`, in CSV.
fn sql_through(port: u16, env: &[(&'static str, String)], query: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["sql", "--format", "csv", "--connect"])
        .arg(format!("127.0.0.1:{port}"))
        .arg(query)
        .envs(env.iter().cloned())
        .output()
        .unwrap()
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Each member's role as `retina cluster status` lists it.
fn roles(status: &str) -> Vec<(String, String)> {
    status
        .lines()
        .skip_while(|l| !l.starts_with("nodes:"))
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| {
            let mut cells = l.split_whitespace();
            Some((cells.next()?.to_owned(), cells.next()?.to_owned()))
        })
        .collect()
}

/// Waits until `id` stands by.
fn wait_standby(etcd: &Etcd, id: &str) {
    let start = Instant::now();
    while !roles(&cluster_status(etcd)).contains(&(id.to_owned(), "standby".to_owned())) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{id} never stood by"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `retina sql --cluster`: through whichever member leads.
fn sql_at_leader(etcd: &Etcd, moto: &Moto, query: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args([
            "sql",
            "--format",
            "csv",
            "--cluster",
            &etcd.url("retina-test"),
        ])
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

fn cluster_status(etcd: &Etcd) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["cluster", "status", "--cluster", &etcd.url("retina-test")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `a` leading after replaying 1,000 transactions of a new source, and `b` standing by.
fn leader_and_standby(etcd: &Etcd, moto: &Moto, dir: &Path) -> (Source, Member, Member) {
    let mut source = Source::new();
    append(&dir.join("in.json"), &source.txns(1000));
    let mut a = Member::start(etcd, moto, dir, "a");
    a.wait("a to replay", "retina_hwm", |h| h == source.hwm());
    let b = Member::start(etcd, moto, dir, "b");
    wait_standby(etcd, "b");
    (source, a, b)
}

/// `a`, which runs shards for a leader (`--peer`, `shards` of them), leading after replaying
/// `txns` transactions of a new source.
fn peered_leader(
    etcd: &Etcd,
    moto: &Moto,
    dir: &Path,
    shards: u16,
    txns: usize,
) -> (Source, Member) {
    let mut source = Source::new();
    append(&dir.join("in.json"), &source.txns(txns));
    let mut a = Member::start_with(etcd, moto, dir, "a", shards, true);
    a.wait("a to lead and replay", "retina_hwm", |h| h == source.hwm());
    (source, a)
}

/// etcd, an S3 bucket, and a folder with the schema and an empty source; `None` where a
/// server is not installed (outside CI).
fn setup() -> Option<(Etcd, Moto, tempfile::TempDir)> {
    let etcd = Etcd::start()?;
    let moto = Moto::start()?;
    moto.create_bucket("cluster-lake");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("s.sql"), DDL).unwrap();
    std::fs::write(dir.path().join("in.json"), "").unwrap();
    Some((etcd, moto, dir))
}

#[test]
fn a_standby_takes_over_from_a_killed_leader_and_queries_never_go_back() {
    let Some((etcd, moto, dir)) = setup() else {
        return;
    };
    let input = dir.path().join("in.json");
    let mut source = Source::new();
    append(&input, &source.txns(2000));
    let mut a = Member::start(&etcd, &moto, dir.path(), "a");
    a.wait("a to lead and replay", "retina_hwm", |h| h == source.hwm());
    let mut b = Member::start(&etcd, &moto, dir.path(), "b");
    wait_standby(&etcd, "b");
    let status = cluster_status(&etcd);
    assert!(status.contains("leader: a (epoch 1)"), "{status}");
    assert_eq!(
        roles(&status),
        [
            ("a".into(), "leader".into()),
            ("b".into(), "standby".into())
        ]
    );
    // Any member answers: the standby passes a connection to the leader's service.
    assert_eq!(b.count(&moto), 2000);

    // More while a leads; it is killed once a checkpoint covers some of it.
    append(&input, &source.txns(2000));
    a.wait(
        "a checkpoint of the second part",
        "retina_checkpoint_ts",
        |t| t > 2100.0,
    );
    let seen = a.count(&moto);
    a.kill();
    append(&input, &source.txns(1000));

    // b's first answer, as soon as it gives one, has everything a query saw before.
    let start = Instant::now();
    let first = loop {
        if let Some(n) = b.try_count(&moto) {
            break n;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "b never answered: {}",
            b.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        first >= seen,
        "a query after the failover saw {first} rows, fewer than one before it ({seen})"
    );
    b.wait("b to catch up", "retina_hwm", |h| h == source.hwm());
    // b's checkpoints are numbered in its epoch: ids from 2 << 32.
    b.wait("b's first checkpoint", "retina_checkpoint_id", |id| {
        id >= (2u64 << 32) as f64
    });
    assert_eq!(
        sql_at_leader(&etcd, &moto, "SELECT id, v FROM public.t ORDER BY id"),
        source.table()
    );
    let log = b.log();
    assert!(
        log.contains("recovering from checkpoint") && log.contains("recorded by the cluster"),
        "b started from the cluster's checkpoint: {log}"
    );
    let status = cluster_status(&etcd);
    assert!(status.contains("leader: b (epoch 2)"), "{status}");
    assert!(
        status.contains("nodes: 1") && !status.contains("\n  a "),
        "a's entry went with its lease: {status}"
    );
    let recorded: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint: "))
        .and_then(|l| l.split(' ').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{status}"));
    assert!(
        recorded >= 2 << 32,
        "checkpoint {recorded} is not b's: {status}"
    );

    // A clean stop hands over at once: a starts again and leads.
    b.signal("-TERM");
    let out = b.child.take().unwrap().wait().unwrap();
    assert!(out.success(), "b stopped cleanly: {}", b.log());
    let mut a = Member::start(&etcd, &moto, dir.path(), "a");
    a.wait("a to lead again", "retina_hwm", |h| h == source.hwm());
    assert!(cluster_status(&etcd).contains("leader: a (epoch 3)"));
    assert_eq!(a.table(&moto), source.table());
}

#[test]
fn a_leader_cut_off_from_etcd_pauses_replay_and_goes_on_when_it_is_back() {
    let Some((mut etcd, moto, dir)) = setup() else {
        return;
    };
    let input = dir.path().join("in.json");
    let mut source = Source::new();
    append(&input, &source.txns(1000));
    let mut a = Member::start(&etcd, &moto, dir.path(), "a");
    a.wait("a to replay", "retina_hwm", |h| h == source.hwm());

    etcd.stop();
    // Past the lease as a renewed before the outage: a no longer knows it leads.
    std::thread::sleep(Duration::from_secs(3));
    let paused = source.hwm();
    append(&input, &source.txns(1000));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        metric(a.metrics, "retina_hwm"),
        Some(paused),
        "replay went on without the lease: {}",
        a.log()
    );
    // Queries still answer, at the last consistent snapshot.
    assert_eq!(a.count(&moto), 1000);

    etcd.resume();
    a.wait("replay to go on", "retina_hwm", |h| h == source.hwm());
    assert_eq!(a.table(&moto), source.table());
    let log = a.log();
    assert!(
        log.contains("replay pauses") && log.contains("replay goes on"),
        "{log}"
    );
    assert!(cluster_status(&etcd).contains("leader: a (epoch 1)"));
}

#[test]
fn a_frozen_leader_is_deposed_and_stops_without_touching_what_the_new_one_wrote() {
    let Some((etcd, moto, dir)) = setup() else {
        return;
    };
    let input = dir.path().join("in.json");
    let (mut source, mut a, mut b) = leader_and_standby(&etcd, &moto, dir.path());

    // a freezes; its lease expires and b takes over, replaying what came meanwhile.
    a.signal("-STOP");
    append(&input, &source.txns(1000));
    b.wait("b to lead and catch up", "retina_hwm", |h| {
        h == source.hwm()
    });
    assert!(cluster_status(&etcd).contains("leader: b (epoch 2)"));

    // a thaws: it finds its lease gone and stops, with an error, before replaying anything.
    a.signal("-CONT");
    a.wait_failed("the deposed leader", "cluster lease expired");

    append(&input, &source.txns(500));
    b.wait("b to go on", "retina_hwm", |h| h == source.hwm());
    assert_eq!(b.table(&moto), source.table());
    assert!(cluster_status(&etcd).contains("leader: b (epoch 2)"));
}

#[test]
fn a_leader_that_cannot_write_its_state_hands_over_to_the_standby() {
    let Some((etcd, moto, dir)) = setup() else {
        return;
    };
    let input = dir.path().join("in.json");
    let (mut source, mut a, mut b) = leader_and_standby(&etcd, &moto, dir.path());

    // a's state file can no longer be replaced: the file it writes first is a folder now.
    // (The coordinator may be writing the file at that moment: then again once it is renamed.)
    let tmp = dir.path().join("a/coordinator.tmp");
    let start = Instant::now();
    while let Err(e) = std::fs::create_dir(&tmp) {
        assert!(
            e.kind() == std::io::ErrorKind::AlreadyExists
                && start.elapsed() < Duration::from_secs(10),
            "making {} a folder: {e}",
            tmp.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    append(&input, &source.txns(1000));
    a.wait_failed(
        "a without its state",
        "it leaves the cluster, so that another member takes over",
    );

    b.wait("b to lead and catch up", "retina_hwm", |h| {
        h == source.hwm()
    });
    assert_eq!(b.table(&moto), source.table());
    assert!(cluster_status(&etcd).contains("leader: b (epoch 2)"));
}

/// The table after the first `n` transactions of a [`Source`], as `Source::table` prints it.
fn table_at(n: usize) -> String {
    let mut s = Source::new();
    s.txns(n);
    s.table()
}

/// The members the current leadership placed shards on, as `retina cluster status` lists
/// them (its SHARDS column).
fn placed(status: &str) -> Vec<String> {
    status
        .lines()
        .skip_while(|l| !l.starts_with("nodes:"))
        .skip(2)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells.get(4)? != &"-").then(|| cells[0].to_owned())
        })
        .collect()
}

/// A long-lived client, as a query engine holds one: one connection to a coordinator service,
/// and its connections to the scan services it read from.
struct Engine {
    rt: tokio::runtime::Runtime,
    retina: retina_query::Retina,
}

impl Engine {
    fn connect(port: u16, moto: &Moto) -> Engine {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let retina = retina_query::Retina::connect(addr, "")
            .unwrap()
            .with_object_store(
                &url::Url::parse("s3://cluster-lake").unwrap(),
                moto.bucket_store("cluster-lake"),
            );
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        Engine { rt, retina }
    }

    /// The rows of `t` at a new snapshot.
    fn count(&self) -> Result<u64, String> {
        self.rt.block_on(async {
            use arrow::array::AsArray;
            use arrow::datatypes::Int64Type;
            let session = self.retina.begin().await.map_err(|e| e.to_string())?;
            let batches = session
                .collect("SELECT count(*) FROM t")
                .await
                .map_err(|e| e.to_string())?;
            let b = batches.first().ok_or("no batch")?;
            Ok(b.column(0).as_primitive::<Int64Type>().value(0) as u64)
        })
    }
}

/// Waits until the current leadership placed shards on exactly `nodes` (the members'
/// logs in the message if it never does).
fn wait_placed(etcd: &Etcd, nodes: &[&str], members: &[&Member]) -> String {
    wait_status(etcd, &format!("shards placed on {nodes:?}"), members, |s| {
        placed(s) == nodes
    })
}

/// Waits until `retina cluster status` says what `done` looks for.
fn wait_status(
    etcd: &Etcd,
    what: &str,
    members: &[&Member],
    done: impl Fn(&str) -> bool,
) -> String {
    let start = Instant::now();
    loop {
        let status = cluster_status(etcd);
        if done(&status) {
            return status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "never {what}: {status}\n{}",
            members
                .iter()
                .map(|m| m.log())
                .collect::<Vec<_>>()
                .join("\n----\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Queries through several members' addresses, one after another, until stopped: each answer
/// must be the table after some prefix of the source's transactions (never part of one), and
/// never fewer transactions than an answer before it.
struct Checker {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<String>)>,
}

impl Checker {
    fn start(ports: Vec<u16>, env: Vec<(&'static str, String)>) -> Checker {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut answers, mut wrong, mut seen) = (0, Vec::new(), 0);
                for port in ports.iter().cycle() {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let out = sql_through(*port, &env, "SELECT id, v FROM public.t ORDER BY id");
                    // A member starting again answers nothing for a moment.
                    if !out.status.success() {
                        continue;
                    }
                    let text = String::from_utf8(out.stdout).unwrap();
                    let n = text.lines().count().saturating_sub(1);
                    answers += 1;
                    if text != table_at(n) {
                        wrong.push(format!("through {port}, {n} rows:\n{text}"));
                    }
                    if n < seen {
                        wrong.push(format!("through {port}: {n} rows after {seen}"));
                    }
                    seen = seen.max(n);
                }
                (answers, wrong)
            })
        };
        Checker { stop, thread }
    }

    /// Stops; how many answers there were, after asserting that each was consistent.
    fn stop(self) -> usize {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (answers, wrong) = self.thread.join().unwrap();
        assert!(wrong.is_empty(), "inconsistent answers: {wrong:#?}");
        answers
    }
}

#[test]
fn three_members_run_the_shards_and_a_killed_one_rejoins() {
    let Some((etcd, moto, dir)) = setup() else {
        return;
    };
    let input = dir.path().join("in.json");
    let (mut source, mut a) = peered_leader(&etcd, &moto, dir.path(), 3, 300);
    // Members that join a running leader get shards: it starts again from its checkpoint to
    // place them.
    let mut b = Member::start_with(&etcd, &moto, dir.path(), "b", 3, true);
    let mut c = Member::start_with(&etcd, &moto, dir.path(), "c", 3, true);
    let status = wait_placed(&etcd, &["a", "b", "c"], &[&a, &b, &c]);
    assert!(
        status.contains("placement: 3 shards over 3 nodes"),
        "{status}"
    );
    append(&input, &source.txns(300));
    a.wait("replay over three members", "retina_hwm", |h| {
        h == source.hwm()
    });
    assert!(
        metric(a.metrics, "retina_remote_batch_bytes_total").is_some_and(|b| b > 0.0),
        "the leader sent batches to the members"
    );
    // A member that runs shards serves their metrics, with the HWM the leader sent it.
    b.wait(
        "b's metrics of its shard",
        "retina_rows_applied_total",
        |r| r > 0.0,
    );
    b.wait("the leader's HWM at b", "retina_hwm", |h| h == source.hwm());
    // The leader reports each shard's progress, wherever it runs.
    let applied = format!("{}", source.hwm() as u64 - 1);
    wait_status(&etcd, "each shard's progress", &[&a], |s| {
        s.contains("SHARD  NODE  APPLIED_TS")
            && s.lines().filter(|l| l.contains(&applied)).count() >= 3
    });
    // Transactions span the members (row i and row i/2 on different shards); every answer,
    // through any member, is one snapshot of all of them.
    assert_eq!(a.table(&moto), source.table());
    assert_eq!(b.table(&moto), source.table());
    let checker = Checker::start(vec![a.listen, b.listen, c.listen], moto.env());

    // A member running a shard is killed during replay and started again: the leader starts
    // that shard alone on it again, from the newest checkpoint, while the other shards go on
    // (no new epoch, no new placement).
    // A query engine's client holds its connections: one to a's coordinator, and one to
    // each scan service it read from, c's among them.
    let engine = Engine::connect(a.listen, &moto);
    assert_eq!(engine.count(), Ok(source.model.len() as u64));
    let epoch = metric(a.metrics, "retina_cluster_epoch").unwrap();
    append(&input, &source.txns(300));
    std::thread::sleep(Duration::from_millis(200));
    c.kill();
    append(&input, &source.txns(300));
    c = Member::start_on(&etcd, &moto, dir.path(), "c", 3, true, c.listen);
    a.wait("replay with c's shard started again", "retina_hwm", |h| {
        h == source.hwm()
    });
    a.wait(
        "c's shard started again",
        "retina_shard_restarts_total",
        |n| n >= 1.0,
    );
    assert_eq!(metric(a.metrics, "retina_cluster_epoch"), Some(epoch));
    assert!(
        a.log().contains("shard 2 runs again on node c"),
        "the leader started c's shard again on c: {}",
        a.log()
    );
    let status = wait_placed(&etcd, &["a", "b", "c"], &[&a, &b, &c]);
    assert!(
        status.contains("placement: 3 shards over 3 nodes"),
        "{status}"
    );
    assert_eq!(a.table(&moto), source.table());
    c.wait_listening();
    assert_eq!(c.table(&moto), source.table());
    // The engine's connection to c's scan service ended with the old run: it connects again.
    assert_eq!(engine.count(), Ok(source.model.len() as u64));

    // A member killed for good: once its lease expired, its shard moves to the member with
    // the fewest shards (c), again without stopping the others.
    append(&input, &source.txns(300));
    b.kill();
    append(&input, &source.txns(300));
    wait_placed(&etcd, &["a", "c"], &[&a, &c]);
    a.wait("replay with b's shard moved to c", "retina_hwm", |h| {
        h == source.hwm()
    });
    assert_eq!(metric(a.metrics, "retina_cluster_epoch"), Some(epoch));
    assert_eq!(a.table(&moto), source.table());
    let log = a.log();
    assert!(
        log.contains("shard 1 moved from node b to node c"),
        "the leader moved b's shard to c: {log}"
    );

    // b comes back: c, which runs two shards, hands one over to it (the old run stops after
    // what it was sent, a new one starts on b from the newest checkpoint), still without
    // stopping the others.
    b = Member::start_with(&etcd, &moto, dir.path(), "b", 3, true);
    wait_placed(&etcd, &["a", "b", "c"], &[&a, &b, &c]);
    append(&input, &source.txns(300));
    a.wait("replay over three members again", "retina_hwm", |h| {
        h == source.hwm()
    });
    assert_eq!(metric(a.metrics, "retina_cluster_epoch"), Some(epoch));
    let log = a.log();
    assert!(
        log.contains("moving shard 2 from node c to node b"),
        "the leader moved a shard of c's to b: {log}"
    );
    assert_eq!(b.table(&moto), source.table());
    if std::env::var_os("RETINA_TEST_LOG").is_some() {
        eprintln!("{}", a.log());
    }

    // The leader is killed: a member that ran shards for it leads, over the members left.
    append(&input, &source.txns(300));
    a.kill();
    append(&input, &source.txns(300));
    let status = wait_status(&etcd, "b or c leading over b and c", &[&b, &c], |s| {
        placed(s) == ["b", "c"] && (s.contains("leader: b ") || s.contains("leader: c "))
    });
    let leader = if status.contains("leader: b ") {
        &mut b
    } else {
        &mut c
    };
    leader.wait("the new leader to catch up", "retina_hwm", |h| {
        h == source.hwm()
    });
    let answers = checker.stop();
    eprintln!("{answers} consistent answers");
    assert!(answers > 0, "no query answered");
    assert_eq!(
        sql_at_leader(&etcd, &moto, "SELECT id, v FROM public.t ORDER BY id"),
        source.table()
    );
}

#[test]
fn a_lost_member_with_no_other_to_take_its_shard_makes_the_leader_start_again() {
    let Some((etcd, moto, dir)) = setup() else {
        return;
    };
    let input = dir.path().join("in.json");
    let (mut source, mut a) = peered_leader(&etcd, &moto, dir.path(), 2, 200);
    let mut b = Member::start_with(&etcd, &moto, dir.path(), "b", 2, true);
    wait_placed(&etcd, &["a", "b"], &[&a, &b]);
    append(&input, &source.txns(200));
    a.wait("replay over two members", "retina_hwm", |h| {
        h == source.hwm()
    });
    let epoch = metric(a.metrics, "retina_cluster_epoch").unwrap();
    // b is killed for good, and no other member runs shards: once b's lease expired, the
    // leader starts every shard again from the checkpoint (the next epoch), on itself alone.
    b.kill();
    append(&input, &source.txns(200));
    wait_placed(&etcd, &["a"], &[&a]);
    a.wait("replay on a alone", "retina_hwm", |h| h == source.hwm());
    assert!(metric(a.metrics, "retina_cluster_epoch").is_some_and(|e| e > epoch));
    assert_eq!(a.table(&moto), source.table());
    let log = a.log();
    assert!(
        log.contains("no other member that runs shards answers"),
        "the leader found no member for b's shard: {log}"
    );
}
