//! `retina bench scale`: a cluster's shards over several machines (`retina serve --cluster ...
//! --peer`, this binary, as processes on loopback), on a real etcd (Debian's `etcd-server`) and
//! a real S3 server (moto's), against the same shards in one process.
//!
//! For each cluster size `n` (`--nodes`), `n` members with `n * --shards-per-node` shards in
//! all: the leader runs shard `k` itself when `k % n == 0` and has the others run the rest, each
//! over TCP on the member it placed it on. For `n > 1` the same shard count also runs on one
//! member alone (every shard in its process), which gives the cost of the hop. Each run:
//!
//! - a new Debezium JSON file of `--txns` transactions (four inserts each, keys spread over
//!   every shard), written and flushed before any member starts; a new cluster prefix in etcd
//!   and a new lake prefix;
//! - the members started, and held back from leading until every one is registered (the
//!   benchmark holds the cluster's leader key under a lease of its own meanwhile): a leader
//!   places the shards over the members registered when it starts leading;
//! - throughput: rows/s from the first poll of the leader's metrics (`--metrics`) that shows a
//!   transaction applied until the one that shows all of them visible
//!   (`retina_transactions_applied_total`, every 10 ms); startup is the time from releasing the
//!   leader key until that first applied transaction (the election, placement, connecting to
//!   the hosts, the sink's start); for a cluster, the batch bytes the leader sent to the other
//!   members (`retina_remote_batch_bytes_total`) per row it did not apply itself;
//! - freshness: a writer appends transactions at `--rate` per second for `--seconds` after a
//!   second of warm-up, flushing every 10 ms; a flush's freshness is the time from its return
//!   until a poll of the leader's metrics (every 5 ms) shows every transaction it wrote
//!   visible.
//!
//! The medians over `--runs` (freshness: P50 and P99 over every run's samples) go to
//! `bench/results/scale.jsonl`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::etcd::Etcd;
use retina_bench::moto::Moto;
use retina_bench::results::record;
use retina_node::catalog::Catalog;
use retina_node::cluster::gateway::{Gateway, cmp_create, put};
use retina_node::cluster::{ClusterSpec, Member};
use retina_storage::{RowOp, TableOp, Value};

use super::failover::{DDL, Serve, Source, log_tails, member_args, spawn_serve, wait_for};
use crate::measure::{median, percentile};

const BUCKET: &str = "scale";
/// Rows each transaction inserts.
const ROWS_PER_TXN: u64 = 4;
const LEASE_TTL_S: u64 = 2;
/// Freshness samples start this long after the writer does.
const WARM_UP: Duration = Duration::from_secs(1);
/// The longest a replay of the file may take.
const REPLAY_LIMIT: Duration = Duration::from_secs(900);

/// Transaction `n`: rows `4n` to `4n + 3` (their keys route to shards independently).
fn txn(n: u64) -> Vec<TableOp<Vec<Value>>> {
    (0..ROWS_PER_TXN)
        .map(|j| {
            let id = (n * ROWS_PER_TXN + j) as i64;
            TableOp {
                table: 0,
                op: RowOp::Insert(vec![
                    Value::Int(id),
                    Value::Utf8(format!("r{id}")),
                    Value::Int(id * 3),
                ]),
            }
        })
        .collect()
}

/// What one run measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Setup {
    nodes: usize,
    shards: u16,
}

impl Setup {
    /// Shards on the members the leader placed them on: all but those with `k % n == 0`.
    fn remote_shards(&self) -> u16 {
        let n = self.nodes as u16;
        self.shards - self.shards.div_ceil(n)
    }

    fn name(&self) -> String {
        format!("nodes_{}_shards_{}", self.nodes, self.shards)
    }
}

/// What one run measured.
struct Measured {
    rows_per_s: f64,
    startup_ms: f64,
    /// Shards whose scan service answered on a member other than the leader.
    remote: u16,
    /// Bytes of batch the leader sent to other members per row they applied.
    batch_bytes_per_row: Option<f64>,
    freshness_ms: Vec<f64>,
}

/// The cluster's leader key, held by the benchmark under a lease of its own so that no member
/// leads until it is released (revoked when dropped).
struct Hold {
    etcd: Gateway,
    lease: i64,
}

impl Hold {
    fn take(spec: &ClusterSpec) -> anyhow::Result<Hold> {
        let etcd = Gateway::new(&spec.endpoints);
        let lease = etcd.grant(120).map_err(anyhow::Error::msg)?;
        let key = format!("{}/leader", spec.prefix);
        let (held, _) = etcd
            .txn(
                vec![cmp_create(&key, 0)],
                vec![put(&key, "bench-hold", Some(lease))],
                vec![],
            )
            .map_err(anyhow::Error::msg)?;
        anyhow::ensure!(held, "{key} is taken already");
        Ok(Hold { etcd, lease })
    }

    fn release(&self) -> anyhow::Result<()> {
        self.etcd.revoke(self.lease).map_err(anyhow::Error::msg)
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let _ = self.etcd.revoke(self.lease);
    }
}

/// A member's ports: `listen` (its coordinator's, with its shards' scan services on the next
/// `shards` ports when it leads), `peer` (where the leader reaches it, with the scan services
/// of the shards it hosts on the next `shards`), and its metrics.
#[derive(Clone, Copy)]
struct Ports {
    listen: u16,
    peer: u16,
    metrics: u16,
}

impl Ports {
    fn take(shards: u16) -> Ports {
        let first = retina_bench::ports::free_ports(2 * shards + 3);
        Ports {
            listen: first,
            peer: first + shards + 1,
            metrics: first + 2 * shards + 2,
        }
    }
}

struct Node {
    id: String,
    ports: Ports,
    serve: Serve,
}

/// A member that exited, and how.
fn exited(nodes: &mut [Node]) -> Option<String> {
    nodes.iter_mut().find_map(|n| {
        let status = n.serve.0.try_wait().ok()??;
        Some(format!("member {} exited ({status})", n.id))
    })
}

/// What the leader's metrics say.
struct Scraped {
    /// Transactions visible (below HWM) since the leader started.
    applied: u64,
    /// Rows the shards in the leader's process applied.
    rows_here: u64,
    /// Bytes of batches the leader sent to shards on other members.
    remote_batch_bytes: u64,
    stopped: bool,
}

fn scrape(port: u16) -> Option<Scraped> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let value = |name: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    };
    Some(Scraped {
        applied: value("retina_transactions_applied_total")?,
        rows_here: value("retina_rows_applied_total")?,
        remote_batch_bytes: value("retina_remote_batch_bytes_total").unwrap_or(0),
        stopped: value("retina_replay_stopped")? > 0,
    })
}

struct Bench<'a> {
    etcd: &'a Etcd,
    moto: &'a Moto,
    catalog: &'a Catalog,
    txns: u64,
    rate: u64,
    seconds: u64,
    /// `checkpoint_interval_ms` for the members (`None`: the setting's default).
    checkpoint_ms: Option<u64>,
}

impl Bench<'_> {
    fn run(&self, setup: Setup, run: usize) -> anyhow::Result<Measured> {
        let dir = tempfile::Builder::new().prefix("retina-scale-").tempdir()?;
        let dir = dir.path();
        std::fs::write(dir.join("s.sql"), DDL)?;
        let prefix = format!("scale-{}-run-{run}-{}", setup.name(), std::process::id());
        let cluster = self.etcd.url(&prefix);
        let spec: ClusterSpec = cluster.parse().map_err(anyhow::Error::msg)?;
        let lake = format!("s3://{BUCKET}/{prefix}");
        let source = Source::create(&dir.join("in.json"), self.catalog, self.txns, Box::new(txn))?;
        let hold = Hold::take(&spec)?;
        let mut nodes = Vec::new();
        for i in 0..setup.nodes {
            let id = format!("n{i}");
            let ports = Ports::take(setup.shards);
            let listen = format!("127.0.0.1:{}", ports.listen);
            let mut args = member_args(dir, &cluster, &lake, setup.shards, &id, LEASE_TTL_S);
            args.extend([
                "--listen".into(),
                listen.clone(),
                "--advertise".into(),
                listen,
                "--metrics".into(),
                format!("127.0.0.1:{}", ports.metrics),
            ]);
            if setup.nodes > 1 {
                args.extend(["--peer".into(), format!("127.0.0.1:{}", ports.peer)]);
            }
            if let Some(ms) = self.checkpoint_ms {
                args.extend(["--set".into(), format!("checkpoint_interval_ms={ms}")]);
            }
            let serve = spawn_serve(dir, self.moto, &id, &args)?;
            nodes.push(Node { id, ports, serve });
        }
        let measured = self.measure(setup, &spec, &hold, &mut nodes, source);
        drop(nodes);
        measured.map_err(|e| {
            let ids: Vec<String> = (0..setup.nodes).map(|i| format!("n{i}")).collect();
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            e.context(log_tails(dir, &ids))
        })
    }

    fn measure(
        &self,
        setup: Setup,
        spec: &ClusterSpec,
        hold: &Hold,
        nodes: &mut [Node],
        source: Source,
    ) -> anyhow::Result<Measured> {
        wait_for("every member to register", Duration::from_secs(60), || {
            if let Some(e) = exited(nodes) {
                return Some(Err(anyhow::anyhow!(e)));
            }
            let s = Member::snapshot(spec).ok()?;
            nodes
                .iter()
                .all(|n| s.nodes.iter().any(|(id, _, _)| *id == n.id))
                .then_some(Ok(()))
        })??;
        let released = Instant::now();
        hold.release()?;
        let leader = wait_for("a member to lead", Duration::from_secs(60), || {
            if let Some(e) = exited(nodes) {
                return Some(Err(anyhow::anyhow!(e)));
            }
            let s = Member::snapshot(spec).ok()?;
            let leader = s.leader?;
            nodes.iter().position(|n| n.id == leader).map(Ok)
        })??;
        let metrics = nodes[leader].ports.metrics;

        // Throughput: the whole file.
        let mut first: Option<(Instant, u64)> = None;
        let mut applied = 0;
        let (done, last) = loop {
            if let Some(e) = exited(nodes) {
                anyhow::bail!(e);
            }
            if let Some(m) = scrape(metrics) {
                let at = Instant::now();
                anyhow::ensure!(!m.stopped, "the leader's replay stopped");
                applied = m.applied;
                if first.is_none() && applied > 0 {
                    first = Some((at, applied));
                }
                if applied >= self.txns {
                    break (at, m);
                }
            }
            anyhow::ensure!(
                released.elapsed() < REPLAY_LIMIT,
                "timed out: {applied} of {} transactions applied",
                self.txns
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let (first_at, first_applied) = first.expect("set before done");
        anyhow::ensure!(
            done > first_at && first_applied < self.txns,
            "the replay ended between two polls: give more --txns"
        );
        let rows = (self.txns - first_applied) * ROWS_PER_TXN;
        let rows_per_s = rows as f64 / (done - first_at).as_secs_f64();
        let startup_ms = (first_at - released).as_secs_f64() * 1e3;
        // Every row not applied in the leader's process went over TCP.
        let rows_elsewhere = (self.txns * ROWS_PER_TXN).saturating_sub(last.rows_here);
        let batch_bytes_per_row = (setup.nodes > 1 && rows_elsewhere > 0)
            .then(|| last.remote_batch_bytes as f64 / rows_elsewhere as f64);

        // Which shards run elsewhere: their scan services answer on the hosts' peer ports.
        let mut remote = 0;
        for (i, n) in nodes.iter().enumerate() {
            if i == leader || setup.nodes == 1 {
                continue;
            }
            for k in 0..setup.shards {
                let addr = SocketAddr::from(([127, 0, 0, 1], n.ports.peer + 1 + k));
                if TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_ok() {
                    remote += 1;
                }
            }
        }

        // Freshness: the file grows at a steady rate.
        let writer = source.append(self.rate);
        let start = Instant::now();
        let (mut next, mut last_written) = (0, self.txns);
        let mut freshness_ms = Vec::new();
        while start.elapsed() < WARM_UP + Duration::from_secs(self.seconds) {
            std::thread::sleep(Duration::from_millis(5));
            if let Some(e) = exited(nodes) {
                anyhow::bail!(e);
            }
            let Some(m) = scrape(metrics) else { continue };
            let at = Instant::now();
            anyhow::ensure!(!m.stopped, "the leader's replay stopped");
            for (written, flushed) in writer.flushes_from(next) {
                if written > m.applied {
                    break;
                }
                next += 1;
                if written > last_written && flushed >= start + WARM_UP {
                    freshness_ms.push((at - flushed).as_secs_f64() * 1e3);
                }
                last_written = written;
            }
        }
        drop(writer);
        anyhow::ensure!(
            !freshness_ms.is_empty(),
            "no freshness sample: nothing the writer appended became visible"
        );
        Ok(Measured {
            rows_per_s,
            startup_ms,
            remote,
            batch_bytes_per_row,
            freshness_ms,
        })
    }
}

/// One setup's medians.
struct Summary {
    setup: Setup,
    rows_per_s: f64,
    startup_ms: f64,
    remote: u16,
    batch_bytes_per_row: Option<f64>,
    p50_ms: f64,
    p99_ms: f64,
    samples: usize,
}

impl Summary {
    fn of(setup: Setup, runs: &[Measured]) -> Summary {
        let mut rates: Vec<f64> = runs.iter().map(|m| m.rows_per_s).collect();
        let mut startups: Vec<f64> = runs.iter().map(|m| m.startup_ms).collect();
        let mut fresh: Vec<f64> = runs.iter().flat_map(|m| m.freshness_ms.clone()).collect();
        let mut bytes: Vec<f64> = runs.iter().filter_map(|m| m.batch_bytes_per_row).collect();
        Summary {
            setup,
            rows_per_s: median(&mut rates),
            startup_ms: median(&mut startups),
            remote: runs.iter().map(|m| m.remote).min().unwrap_or(0),
            batch_bytes_per_row: (!bytes.is_empty()).then(|| median(&mut bytes)),
            p50_ms: median(&mut fresh),
            p99_ms: percentile(&mut fresh, 99).unwrap_or(f64::NAN),
            samples: fresh.len(),
        }
    }

    fn print(&self) {
        println!(
            "{:>6} {:>7} {:>14} {:>12.0} {:>11.0} {:>10.1} {:>10.1} {:>8} {:>9}",
            self.setup.nodes,
            self.setup.shards,
            if self.setup.nodes == 1 {
                "in-process".into()
            } else {
                format!("{} on hosts", self.remote)
            },
            self.rows_per_s,
            self.startup_ms,
            self.p50_ms,
            self.p99_ms,
            self.samples,
            self.batch_bytes_per_row
                .map_or("-".into(), |b| format!("{b:.1}"))
        );
    }

    fn record(&self, suffix: &str) -> anyhow::Result<()> {
        let name = format!("{}{suffix}", self.setup.name());
        record(
            "scale",
            &format!("rows_per_s_{name}"),
            self.rows_per_s,
            "rows/s",
        )?;
        record(
            "scale",
            &format!("startup_ms_{name}"),
            self.startup_ms,
            "ms",
        )?;
        record(
            "scale",
            &format!("freshness_p50_ms_{name}"),
            self.p50_ms,
            "ms",
        )?;
        record(
            "scale",
            &format!("freshness_p99_ms_{name}"),
            self.p99_ms,
            "ms",
        )?;
        if let Some(b) = self.batch_bytes_per_row {
            record("scale", &format!("batch_bytes_per_row_{name}"), b, "bytes")?;
        }
        Ok(())
    }
}

fn print_header() {
    println!(
        "{:>6} {:>7} {:>14} {:>12} {:>11} {:>10} {:>10} {:>8} {:>9}",
        "nodes",
        "shards",
        "placement",
        "rows/s",
        "startup ms",
        "P50 ms",
        "P99 ms",
        "samples",
        "B/row TCP"
    );
}

pub(super) fn run(
    cluster_sizes: &[usize],
    per_node: u16,
    txns: u64,
    runs: usize,
    rate: u64,
    seconds: u64,
    checkpoint_ms: Option<u64>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        cluster_sizes.iter().all(|&n| (1..=64).contains(&n)),
        "--nodes: from 1 to 64 each"
    );
    anyhow::ensure!(
        per_node > 0 && runs > 0 && txns > 0 && rate > 0,
        "--shards-per-node, --runs, --txns and --rate must be positive"
    );
    let etcd = Etcd::start().context("etcd is needed: apt-get install etcd-server")?;
    let moto = Moto::start().context("moto_server is needed: pip install 'moto[server]'")?;
    moto.create_bucket(BUCKET);
    let catalog = Catalog::from_ddl(DDL, "scale")?;
    let bench = Bench {
        etcd: &etcd,
        moto: &moto,
        catalog: &catalog,
        txns,
        rate,
        seconds,
        checkpoint_ms,
    };
    // Results with another checkpoint interval than the default are recorded apart.
    let suffix = checkpoint_ms.map_or(String::new(), |ms| format!("_checkpoint_{ms}_ms"));
    println!(
        "scale: clusters of {cluster_sizes:?} members with {per_node} shard(s) each on etcd and \
         S3 (loopback), {txns} transactions of {ROWS_PER_TXN} rows replayed, then {rate} txns/s \
         appended for {seconds} s; beside each cluster, one member with its shard count; \
         checkpoints every {}; {runs} runs each",
        checkpoint_ms.map_or("10 s (the default)".into(), |ms| format!("{ms} ms"))
    );
    let mut summaries = Vec::new();
    for &n in cluster_sizes {
        let shards = u16::try_from(n)?
            .checked_mul(per_node)
            .context("too many shards")?;
        let mut setups = vec![Setup { nodes: n, shards }];
        if n > 1 {
            setups.push(Setup { nodes: 1, shards });
        }
        let mut measured: Vec<Vec<Measured>> = setups.iter().map(|_| Vec::new()).collect();
        // The setups alternate, so that a drift of the machine touches both alike.
        for r in 0..runs {
            for (setup, results) in setups.iter().zip(&mut measured) {
                let m = bench
                    .run(*setup, r)
                    .with_context(|| format!("{} nodes, {} shards, run {}", n, shards, r + 1))?;
                let mut fresh = m.freshness_ms.clone();
                let bytes = m.batch_bytes_per_row.map_or(String::new(), |b| {
                    format!(", {b:.1} batch bytes per remote row")
                });
                println!(
                    "  {} node(s), {} shards ({} remote), run {}: {:.0} rows/s, startup {:.0} ms, \
                     freshness P50 {:.1} ms, P99 {:.1} ms ({} samples){bytes}",
                    setup.nodes,
                    setup.shards,
                    m.remote,
                    r + 1,
                    m.rows_per_s,
                    m.startup_ms,
                    median(&mut fresh),
                    percentile(&mut fresh, 99).unwrap_or(f64::NAN),
                    fresh.len()
                );
                if setup.nodes > 1 && m.remote != setup.remote_shards() {
                    println!(
                        "  warning: {} of {} shards answered on the hosts, {} expected",
                        m.remote,
                        setup.shards,
                        setup.remote_shards()
                    );
                }
                results.push(m);
            }
        }
        let group: Vec<Summary> = setups
            .iter()
            .zip(&measured)
            .map(|(s, m)| Summary::of(*s, m))
            .collect();
        print_header();
        for s in &group {
            s.print();
            s.record(&suffix)?;
        }
        if let [cluster, alone] = &group[..] {
            let ratio = cluster.rows_per_s / alone.rows_per_s;
            println!(
                "{n} nodes over TCP: {:.0}% of the rows/s of one node with the same {shards} \
                 shards (medians)",
                ratio * 100.0
            );
            record(
                "scale",
                &format!("tcp_over_in_process_{}{suffix}", cluster.setup.name()),
                ratio,
                "ratio",
            )?;
        }
        summaries.extend(group);
    }
    println!("\nscale: medians over {runs} runs (freshness: over every run's samples)");
    print_header();
    for s in &summaries {
        s.print();
    }
    Ok(())
}
