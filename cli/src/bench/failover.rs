//! `retina bench failover`: a leader and a standby (`retina serve --cluster`, this binary, as
//! processes) on a real etcd (Debian's `etcd-server`) and a real S3 server (moto's), all on
//! loopback, following a Debezium JSON file a writer appends to at a steady rate. The leader is
//! killed with SIGKILL; measured from the kill:
//!
//! - takeover: until the cluster's `leader` key names the standby (its lease expired and the
//!   standby's next try took the lead);
//! - outage: until a query through the new leader (resolved in etcd, as `retina sql
//!   --cluster` does) answers with every transaction the file held at the kill: the takeover,
//!   the checkpoint fetched from the lake, and the replay from it.
//!
//! With `--kill member`, the leader runs one shard and two members (`--peer`) one each, and
//! the members are killed instead; measured from each kill, until a query through the leader
//! answers with every transaction the file held at the kill:
//!
//! - member back: a member is killed and started again at once; the leader starts its shard
//!   alone again on it once it registered (after its old lease expired), from the newest
//!   checkpoint, while the other shards go on;
//! - member gone: a member is killed for good; once its lease expired (and a grace for it to
//!   come back), its shard starts on the other member.
//!
//! Each run also says how many times the leader started its node again (its epoch grew): none
//! since shards start again alone.
//!
//! Each lease TTL is run `--runs` times (a new cluster prefix and lake prefix each time); the
//! medians go to `bench/results/failover.jsonl`.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::etcd::Etcd;
use retina_bench::moto::Moto;
use retina_bench::results::record;
use retina_bench::workload::{DebeziumWriter, InsertOp};
use retina_node::catalog::Catalog;
use retina_node::cluster::{ClusterSpec, Member};
use retina_query::Retina;
use retina_storage::{RowOp, TableOp, Value};

use crate::measure::median;

pub(super) const DDL: &str =
    "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(16), amount BIGINT);";
const BUCKET: &str = "failover";
/// Transactions in the file before the leader starts.
const PRELOAD: u64 = 20_000;

/// Source transaction `n`: the rows it changes.
pub(super) type TxnFn = Box<dyn FnMut(u64) -> Vec<TableOp<Vec<Value>>> + Send>;

/// A Debezium JSON source file with its first transactions written and flushed;
/// [`Source::append`] goes on at a steady rate.
pub(super) struct Source {
    out: BufWriter<std::fs::File>,
    writer: DebeziumWriter,
    txn: TxnFn,
    /// Transactions written.
    n: u64,
}

impl Source {
    /// Creates the file at `path` with transactions `txn(0)` to `txn(preload - 1)` of the
    /// tables of `catalog`.
    pub(super) fn create(
        path: &Path,
        catalog: &Catalog,
        preload: u64,
        mut txn: TxnFn,
    ) -> anyhow::Result<Source> {
        let file = std::fs::File::create(path)?;
        let mut writer = DebeziumWriter::new(catalog.tables().to_vec()).with_database("bench");
        let mut out = BufWriter::new(file);
        for n in 0..preload {
            writer.write_txn(&mut out, &txn(n), InsertOp::Create)?;
        }
        out.flush()?;
        Ok(Source {
            out,
            writer,
            txn,
            n: preload,
        })
    }

    /// Appends the next transactions at `rate` per second (flushing every 10 ms) until the
    /// writer is dropped.
    pub(super) fn append(self, rate: u64) -> Writer {
        let Source {
            mut out,
            mut writer,
            mut txn,
            n: first,
        } = self;
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(first));
        let flushes = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (stop, written, flushes) = (stop.clone(), written.clone(), flushes.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut n = first;
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(10));
                    let due = first + (start.elapsed().as_secs_f64() * rate as f64) as u64;
                    while n < due {
                        writer.write_txn(&mut out, &txn(n), InsertOp::Create)?;
                        n += 1;
                    }
                    out.flush()?;
                    written.store(n, Ordering::Release);
                    flushes
                        .lock()
                        .expect("flushes lock")
                        .push((n, Instant::now()));
                }
                Ok(())
            })
        };
        Writer {
            stop,
            written,
            flushes,
            thread: Some(thread),
        }
    }
}

/// Appends transactions to a source file at a steady rate until dropped; `written` counts
/// those flushed.
pub(super) struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    /// After each flush: the transactions in the file, and when the flush returned.
    flushes: Arc<Mutex<Vec<(u64, Instant)>>>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Writer {
    /// [`PRELOAD`] transactions of one insert each, then more at `rate` per second.
    fn start(path: &Path, catalog: &Catalog, rate: u64) -> anyhow::Result<Writer> {
        let txn = |n: u64| {
            vec![TableOp {
                table: 0,
                op: RowOp::Insert(vec![
                    Value::Int(n as i64),
                    Value::Utf8(format!("r{n}")),
                    Value::Int(n as i64 * 3),
                ]),
            }]
        };
        Ok(Source::create(path, catalog, PRELOAD, Box::new(txn))?.append(rate))
    }

    pub(super) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// The flushes from the `from`th on: the transactions in the file after each, and when
    /// it returned.
    pub(super) fn flushes_from(&self, from: usize) -> Vec<(u64, Instant)> {
        let flushes = self.flushes.lock().expect("flushes lock");
        flushes.get(from..).unwrap_or_default().to_vec()
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A `retina serve` process, killed when dropped.
pub(super) struct Serve(pub(super) Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts this binary (or `$RETINA_BENCH_SERVE`) with `args` in `dir`, configured for `moto`'s S3, its stderr in
/// `dir/ID.log`.
pub(super) fn spawn_serve(
    dir: &Path,
    moto: &Moto,
    id: &str,
    args: &[String],
) -> anyhow::Result<Serve> {
    // Another build's `retina` may serve instead, to compare versions in one run.
    let exe = match std::env::var_os("RETINA_BENCH_SERVE") {
        Some(exe) => exe.into(),
        None => std::env::current_exe().context("finding this binary")?,
    };
    let log = std::fs::File::create(dir.join(format!("{id}.log")))?;
    let child = Command::new(exe)
        .args(args)
        .current_dir(dir)
        .envs(moto.env())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("starting retina serve")?;
    Ok(Serve(child))
}

/// The start and the end of each member's log (`dir/ID.log`), to say why a run failed.
pub(super) fn log_tails(dir: &Path, ids: &[&str]) -> String {
    let mut out = String::new();
    for id in ids {
        let log = std::fs::read_to_string(dir.join(format!("{id}.log"))).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let head = &lines[..lines.len().min(15)];
        let tail = &lines[lines.len().saturating_sub(5).max(head.len())..];
        out += &format!(
            "{id}'s log ends:\n{}\n...\n{}\n",
            head.join("\n"),
            tail.join("\n")
        );
    }
    out
}

struct Run<'a> {
    moto: &'a Moto,
    dir: &'a Path,
    cluster: String,
    lake: String,
    ttl: u64,
    shards: u16,
}

impl Run<'_> {
    /// A member that runs shards for the leader: its `--peer` is the port after its own ones.
    fn host(&self, id: &str, listen: u16) -> anyhow::Result<Serve> {
        self.spawn(id, listen, Some(listen + self.shards + 1))
    }

    fn serve(&self, id: &str, listen: u16) -> anyhow::Result<Serve> {
        self.spawn(id, listen, None)
    }

    fn spawn(&self, id: &str, listen: u16, peer: Option<u16>) -> anyhow::Result<Serve> {
        let mut args = member_args(
            self.dir,
            &self.cluster,
            &self.lake,
            self.shards,
            id,
            self.ttl,
        );
        args.extend(
            ["--set", "checkpoint_interval_ms=1000", "--listen"]
                .map(String::from)
                .into_iter()
                .chain([format!("127.0.0.1:{listen}")]),
        );
        if let Some(peer) = peer {
            args.extend(["--peer".into(), format!("127.0.0.1:{peer}")]);
        }
        spawn_serve(self.dir, self.moto, id, &args)
    }
}

/// The arguments every benchmark's cluster member takes: the source file and schema in `dir`,
/// the lake, the cluster, its id, lease and data directory.
pub(super) fn member_args(
    dir: &Path,
    cluster: &str,
    lake: &str,
    shards: u16,
    id: &str,
    ttl: u64,
) -> Vec<String> {
    [
        "serve",
        "--follow",
        "--source",
        "file:in.json",
        "--schema",
        "s.sql",
        "--shards",
        &shards.to_string(),
        "--lake",
        lake,
        "--cluster",
        cluster,
        "--node-id",
        id,
        "--lease-ttl",
        &ttl.to_string(),
        "--data-dir",
        &dir.join(id).display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

/// Queries through the cluster's leader, over one connection until the leader changes or the
/// connection fails.
struct LeaderClient<'a> {
    spec: &'a ClusterSpec,
    rt: &'a tokio::runtime::Runtime,
    /// The lake's bucket (`s3://BUCKET`) and a client of it on the S3 server.
    lake: url::Url,
    store: Arc<dyn object_store::ObjectStore>,
    connected: Option<(std::net::SocketAddr, Retina)>,
    /// Why the last query got no answer.
    last_error: String,
}

impl LeaderClient<'_> {
    /// Rows of `t` a query through the leader sees now (`None`: no answer yet).
    fn count(&mut self) -> Option<u64> {
        let addr: std::net::SocketAddr = Member::leader_address(self.spec).ok()??.parse().ok()?;
        if self.connected.as_ref().is_none_or(|(a, _)| *a != addr) {
            self.connected = None;
            let retina = Retina::connect(addr, "")
                .map_err(|e| self.last_error = e.to_string())
                .ok()?;
            self.connected = Some((
                addr,
                retina.with_object_store(&self.lake, self.store.clone()),
            ));
        }
        let (_, retina) = self.connected.as_ref()?;
        let counted = self.rt.block_on(async {
            use arrow::array::AsArray;
            use arrow::datatypes::Int64Type;
            let session = retina.begin().await.map_err(|e| e.to_string())?;
            let batches = session
                .collect("SELECT count(*) FROM t")
                .await
                .map_err(|e| e.to_string())?;
            let b = batches.first().ok_or("no batch")?;
            Ok::<_, String>(b.column(0).as_primitive::<Int64Type>().value(0) as u64)
        });
        match counted {
            Ok(n) => Some(n),
            Err(e) => {
                // The leader's node may have started again (a new coordinator service).
                if e.contains("Disconnected") {
                    self.connected = None;
                }
                self.last_error = e;
                None
            }
        }
    }
}

pub(super) fn wait_for<T>(
    what: &str,
    limit: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        anyhow::ensure!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Which process `retina bench failover` kills.
#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kill {
    /// The leader: a standby takes over.
    Leader,
    /// Members that run shards for the leader: their shards start again alone.
    Member,
}

pub(super) fn run(
    ttls: &[u64],
    runs: usize,
    rate: u64,
    shards: u16,
    kill: Kill,
) -> anyhow::Result<()> {
    let etcd = Etcd::start().context("etcd is needed: apt-get install etcd-server")?;
    let moto = Moto::start().context("moto_server is needed: pip install 'moto[server]'")?;
    moto.create_bucket(BUCKET);
    let store: Arc<dyn object_store::ObjectStore> =
        Arc::new(retina_query::s3_store(BUCKET, &moto.options()).map_err(anyhow::Error::msg)?);
    let catalog = Catalog::from_ddl(DDL, "failover")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if kill == Kill::Member {
        println!(
            "failover of members: a leader and two members running a shard each, on etcd and S3 \
             (loopback), {rate} txns/s appended, checkpoints every 1 s, {runs} runs per lease"
        );
    } else {
        println!(
            "failover: a leader and a standby on etcd and S3 (loopback), {rate} txns/s \
             appended, checkpoints every 1 s, {shards} shards, {runs} runs per lease"
        );
    }
    for &ttl in ttls {
        if kill == Kill::Member {
            members(&moto, &etcd, &store, &catalog, &rt, ttl, runs, rate)?;
            continue;
        }
        let (mut takeovers, mut outages) = (Vec::new(), Vec::new());
        for r in 0..runs {
            let dir = tempfile::tempdir()?;
            // On a failure, the members' logs say why.
            let logs = |e: anyhow::Error| e.context(log_tails(dir.path(), &["a", "b"]));
            std::fs::write(dir.path().join("s.sql"), DDL)?;
            let prefix = format!("lease-{ttl}-run-{r}-{}", std::process::id());
            let run = Run {
                moto: &moto,
                dir: dir.path(),
                cluster: etcd.url(&prefix),
                lake: format!("s3://{BUCKET}/{prefix}"),
                ttl,
                shards,
            };
            let spec: ClusterSpec = run.cluster.parse().map_err(anyhow::Error::msg)?;
            let writer = Writer::start(&dir.path().join("in.json"), &catalog, rate)?;
            let mut client = LeaderClient {
                spec: &spec,
                rt: &rt,
                lake: url::Url::parse(&format!("s3://{BUCKET}"))?,
                store: store.clone(),
                connected: None,
                last_error: String::new(),
            };
            let ports = retina_bench::ports::free_ports(2 * (shards + 1));
            let mut leader = run.serve("a", ports)?;
            wait_for(
                "a to lead and replay the preload",
                Duration::from_secs(120),
                || client.count().filter(|&n| n >= PRELOAD),
            )?;
            let _standby = run.serve("b", ports + shards + 1)?;
            wait_for("b to stand by", Duration::from_secs(60), || {
                let s = Member::snapshot(&spec).ok()?;
                s.nodes.iter().any(|(id, _, _)| id == "b").then_some(())
            })?;
            // A few checkpoints into the stream.
            std::thread::sleep(Duration::from_secs(3));
            let _ = leader.0.kill();
            let killed = Instant::now();
            let at_kill = writer.written();
            let _ = leader.0.wait();
            wait_for("b to lead", Duration::from_secs(120), || {
                let s = Member::snapshot(&spec).ok()?;
                (s.leader.as_deref() == Some("b")).then_some(())
            })?;
            let takeover = killed.elapsed().as_secs_f64() * 1e3;
            wait_for(
                "a query to see the kill's transactions",
                Duration::from_secs(120),
                || client.count().filter(|&n| n >= at_kill),
            )
            .map_err(|e| logs(e.context(client.last_error.clone())))?;
            let outage = killed.elapsed().as_secs_f64() * 1e3;
            println!(
                "  lease {ttl} s, run {}: takeover {takeover:.0} ms, outage {outage:.0} ms \
                 ({at_kill} txns in the file at the kill)",
                r + 1
            );
            takeovers.push(takeover);
            outages.push(outage);
        }
        let (takeover, outage) = (median(&mut takeovers), median(&mut outages));
        println!("lease {ttl} s: takeover {takeover:.0} ms, outage {outage:.0} ms (medians)");
        record(
            "failover",
            &format!("takeover_ms_lease_{ttl}s"),
            takeover,
            "ms",
        )?;
        record("failover", &format!("outage_ms_lease_{ttl}s"), outage, "ms")?;
    }
    Ok(())
}

/// `--kill member` at lease `ttl`: see the module's documentation.
#[allow(clippy::too_many_arguments)]
fn members(
    moto: &Moto,
    etcd: &Etcd,
    store: &Arc<dyn object_store::ObjectStore>,
    catalog: &Catalog,
    rt: &tokio::runtime::Runtime,
    ttl: u64,
    runs: usize,
    rate: u64,
) -> anyhow::Result<()> {
    const SHARDS: u16 = 3;
    let (mut back, mut gone) = (Vec::new(), Vec::new());
    for r in 0..runs {
        let dir = tempfile::tempdir()?;
        let logs = |e: anyhow::Error| e.context(log_tails(dir.path(), &["a", "b", "c"]));
        std::fs::write(dir.path().join("s.sql"), DDL)?;
        let prefix = format!("members-lease-{ttl}-run-{r}-{}", std::process::id());
        let run = Run {
            moto,
            dir: dir.path(),
            cluster: etcd.url(&prefix),
            lake: format!("s3://{BUCKET}/{prefix}"),
            ttl,
            shards: SHARDS,
        };
        let spec: ClusterSpec = run.cluster.parse().map_err(anyhow::Error::msg)?;
        let writer = Writer::start(&dir.path().join("in.json"), catalog, rate)?;
        let mut client = LeaderClient {
            spec: &spec,
            rt,
            lake: url::Url::parse(&format!("s3://{BUCKET}"))?,
            store: store.clone(),
            connected: None,
            last_error: String::new(),
        };
        // Each member: its listen and scan ports, then its peer and its scan services.
        let stride = 2 * (SHARDS + 1);
        let ports = retina_bench::ports::free_ports(3 * stride);
        let _leader = run.serve("a", ports)?;
        wait_for(
            "a to lead and replay the preload",
            Duration::from_secs(120),
            || client.count().filter(|&n| n >= PRELOAD),
        )?;
        let _b = run.host("b", ports + stride)?;
        let mut c = Some(run.host("c", ports + 2 * stride)?);
        let placed_over = |n: usize| {
            let s = Member::snapshot(&spec).ok()?;
            let p = s.placement?;
            let mut owners = p.owners.clone();
            owners.sort();
            owners.dedup();
            (owners.len() == n).then_some(p)
        };
        wait_for("a shard on each member", Duration::from_secs(120), || {
            placed_over(3)
        })
        .map_err(logs)?;
        let epoch = Member::snapshot(&spec).map_err(anyhow::Error::msg)?.epoch;
        let mut outage = |what: &str, kill: &mut dyn FnMut() -> anyhow::Result<()>| {
            // A few checkpoints into the stream.
            std::thread::sleep(Duration::from_secs(3));
            let killed = Instant::now();
            let at_kill = writer.written();
            kill()?;
            wait_for(what, Duration::from_secs(120), || {
                client.count().filter(|&n| n >= at_kill)
            })
            .map_err(|e| logs(e.context(client.last_error.clone())))?;
            anyhow::Ok(killed.elapsed().as_secs_f64() * 1e3)
        };
        let member_back = outage("c's shard to start again on c", &mut || {
            drop(c.take());
            c = Some(run.host("c", ports + 2 * stride)?);
            Ok(())
        })?;
        let mut b = Some(_b);
        let member_gone = outage("b's shard to move to c", &mut || {
            drop(b.take());
            Ok(())
        })?;
        let s = Member::snapshot(&spec).map_err(anyhow::Error::msg)?;
        let restarts = s.epoch - epoch;
        println!(
            "  lease {ttl} s, run {}: member back {member_back:.0} ms, member gone \
             {member_gone:.0} ms, leader restarts {restarts}",
            r + 1
        );
        back.push(member_back);
        gone.push(member_gone);
    }
    let (back, gone) = (median(&mut back), median(&mut gone));
    println!("lease {ttl} s: member back {back:.0} ms, member gone {gone:.0} ms (medians)");
    record(
        "failover",
        &format!("member_back_outage_ms_lease_{ttl}s"),
        back,
        "ms",
    )?;
    record(
        "failover",
        &format!("member_gone_outage_ms_lease_{ttl}s"),
        gone,
        "ms",
    )?;
    Ok(())
}
