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
//! Each lease TTL is run `--runs` times (a new cluster prefix and lake prefix each time); the
//! medians go to `bench/results/failover.jsonl`.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

const DDL: &str = "CREATE TABLE t (id BIGINT PRIMARY KEY, v VARCHAR(16), amount BIGINT);";
const BUCKET: &str = "failover";
/// Transactions in the file before the leader starts.
const PRELOAD: u64 = 20_000;

/// Appends transactions (one insert each) to the source file at `rate` per second until
/// stopped; `written` counts those flushed.
struct Writer {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Writer {
    fn start(path: &Path, catalog: &Catalog, rate: u64) -> anyhow::Result<Writer> {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let file = std::fs::File::create(path)?;
        let mut writer = DebeziumWriter::new(catalog.tables().to_vec()).with_database("bench");
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
        let mut out = BufWriter::new(file);
        for n in 0..PRELOAD {
            writer.write_txn(&mut out, &txn(n), InsertOp::Create)?;
        }
        out.flush()?;
        written.store(PRELOAD, Ordering::Release);
        let thread = {
            let (stop, written) = (stop.clone(), written.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut n = PRELOAD;
                while !stop.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(10));
                    let due = PRELOAD + (start.elapsed().as_secs_f64() * rate as f64) as u64;
                    while n < due {
                        writer.write_txn(&mut out, &txn(n), InsertOp::Create)?;
                        n += 1;
                    }
                    out.flush()?;
                    written.store(n, Ordering::Release);
                }
                Ok(())
            })
        };
        Ok(Writer {
            stop,
            written,
            thread: Some(thread),
        })
    }

    fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
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

/// A `retina serve --cluster` process, killed when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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
    fn serve(&self, id: &str, listen: u16) -> anyhow::Result<Serve> {
        let exe = std::env::current_exe().context("finding this binary")?;
        let log = std::fs::File::create(self.dir.join(format!("{id}.log")))?;
        let child = Command::new(exe)
            .args([
                "serve",
                "--follow",
                "--source",
                "file:in.json",
                "--schema",
                "s.sql",
            ])
            .args(["--shards", &self.shards.to_string(), "--lake", &self.lake])
            .args(["--set", "checkpoint_interval_ms=1000"])
            .args(["--cluster", &self.cluster, "--node-id", id])
            .args(["--lease-ttl", &self.ttl.to_string()])
            .arg("--listen")
            .arg(format!("127.0.0.1:{listen}"))
            .arg("--data-dir")
            .arg(self.dir.join(id))
            .current_dir(self.dir)
            .envs(self.moto.env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting retina serve")?;
        Ok(Serve(child))
    }
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
                self.last_error = e;
                None
            }
        }
    }
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        anyhow::ensure!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub(super) fn run(ttls: &[u64], runs: usize, rate: u64, shards: u16) -> anyhow::Result<()> {
    let etcd = Etcd::start().context("etcd is needed: apt-get install etcd-server")?;
    let moto = Moto::start().context("moto_server is needed: pip install 'moto[server]'")?;
    moto.create_bucket(BUCKET);
    let store: Arc<dyn object_store::ObjectStore> =
        Arc::new(retina_query::s3_store(BUCKET, &moto.options()).map_err(anyhow::Error::msg)?);
    let catalog = Catalog::from_ddl(DDL, "failover")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    println!(
        "failover: a leader and a standby on etcd and S3 (loopback), {rate} txns/s appended, \
         checkpoints every 1 s, {shards} shards, {runs} runs per lease"
    );
    for &ttl in ttls {
        let (mut takeovers, mut outages) = (Vec::new(), Vec::new());
        for r in 0..runs {
            let dir = tempfile::tempdir()?;
            // On a failure, the members' logs say why.
            let logs = |e: anyhow::Error| {
                let tail = |id: &str| {
                    let log = std::fs::read_to_string(dir.path().join(format!("{id}.log")))
                        .unwrap_or_default();
                    let lines: Vec<&str> = log.lines().collect();
                    let head = &lines[..lines.len().min(15)];
                    let tail = &lines[lines.len().saturating_sub(5).max(head.len())..];
                    format!("{}\n...\n{}", head.join("\n"), tail.join("\n"))
                };
                e.context(format!(
                    "a's log ends:\n{}\nb's log ends:\n{}",
                    tail("a"),
                    tail("b")
                ))
            };
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
