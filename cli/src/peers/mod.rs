//! `retina bench peers`: the same CH-benCHmark change stream replayed into Retina and into the
//! systems a user would otherwise pick, side by side on the same machine in the same run:
//! DuckDB (an embedded transactional analytics database) and Delta Lake through delta-rs (the
//! lakehouse way: changes buffered and MERGEd into Delta tables at a commit interval).
//!
//! Every system gets the same initial load and the same stream (generated once per rate from
//! the same seed). A driver thread emits the stream's transactions at a fixed rate, or as fast
//! as the system takes them (`max`), stamping each one's `fresh_ts` with the time it is emitted;
//! the system's applier takes whatever is queued, whole transactions only. A monitor thread
//! runs `SELECT max(fresh_ts) FROM district` on its own connection every 100 ms: freshness is
//! the time the query started minus the newest `fresh_ts` it saw. After the stream, every
//! system's final state is fingerprinted with the same aggregate queries (they must agree), and
//! CH Q1, Q6 and Q3 are timed on it.
//!
//! DuckDB and Delta Lake are compiled only with the `peer-duckdb` and `peer-delta` features
//! (`peers` for both): their builds take long, and neither the default build nor CI pays for
//! them.

#[cfg(any(feature = "peer-duckdb", feature = "peer-delta"))]
mod collapse;
#[cfg(feature = "peer-delta")]
mod delta;
#[cfg(feature = "peer-duckdb")]
mod duckdb;
mod retina;
mod target;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::chgen::{ChGen, FreshClock, schemas};
use retina_bench::results::record;
use retina_bench::workload::{Txn, stamp_fresh};
use retina_node::catalog::Catalog;

use self::retina::RetinaTarget;
use self::target::{Reader, Target};
use crate::measure::{median, now_us, percentile};

#[derive(clap::Args)]
pub struct PeersArgs {
    /// Systems to measure, comma-separated: `retina`, `duckdb`, `delta` (one run per commit
    /// interval). DuckDB and Delta Lake need the binary built with `--features peers`.
    #[arg(long, value_delimiter = ',', default_value = "retina,duckdb,delta")]
    systems: Vec<String>,
    /// Rates to emit the stream at, in rows per second, comma-separated; `max` emits as fast
    /// as each system takes it.
    #[arg(long, value_delimiter = ',', default_value = "10000,40000,max")]
    rates: Vec<String>,
    /// Seconds of stream per fixed rate.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Rows of stream in a `max` run.
    #[arg(long, default_value_t = 400_000)]
    max_rows: u64,
    /// Delta Lake's commit intervals in milliseconds (how often the buffered changes are
    /// MERGEd), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    delta_commit_ms: Vec<u64>,
    /// Dataset: `tpcc` (1 warehouse at TPC-C's full size), `tpcc:N` (N warehouses), `small`
    /// or `tiny`. Results go to `peers.jsonl` for `tpcc`, else to `peers-<scale>.jsonl`.
    #[arg(long, default_value = "tpcc")]
    scale: String,
    /// Runs of each query on the final state; the median is reported (a query takes
    /// milliseconds here, so a few runs leave the median at the mercy of one hiccup).
    #[arg(long, default_value_t = 15)]
    query_runs: usize,
    /// Retina's replayer shards (default: one per core).
    #[arg(long)]
    shards: Option<u16>,
}

/// The generator's seed: every system gets the same rows.
const SEED: u64 = 42;
/// Rows per transaction of the initial load.
const LOAD_ROWS_PER_TXN: usize = 1000;
/// How often the monitor queries.
const MONITOR_EVERY: Duration = Duration::from_millis(100);
/// Freshness samples start this long after the driver does (the appliers warming up).
const WARM_UP: Duration = Duration::from_secs(1);
/// Transactions queued ahead of the applier in a `max` run.
const MAX_QUEUE: usize = 4096;
/// The most transactions an applier takes at once.
const MAX_GROUP: usize = 8192;

/// The queries every system answers on its final state; their results must agree.
const FINGERPRINT: [&str; 8] = [
    "SELECT count(*), CAST(sum(w_ytd * 100) AS BIGINT) FROM warehouse",
    "SELECT count(*), CAST(sum(d_next_o_id) AS BIGINT), CAST(sum(d_ytd * 100) AS BIGINT) \
     FROM district",
    "SELECT count(*), CAST(sum(c_balance * 100) AS BIGINT), CAST(sum(c_payment_cnt) AS BIGINT), \
     CAST(sum(c_delivery_cnt) AS BIGINT) FROM customer",
    "SELECT count(*), CAST(max(h_id) AS BIGINT), CAST(sum(h_amount * 100) AS BIGINT) FROM history",
    "SELECT count(*), CAST(sum(no_o_id) AS BIGINT) FROM neworder",
    "SELECT count(*), CAST(sum(o_id) AS BIGINT), CAST(sum(o_carrier_id) AS BIGINT) FROM orders",
    "SELECT count(*), CAST(sum(ol_o_id) AS BIGINT), CAST(sum(ol_amount * 100) AS BIGINT), \
     count(ol_delivery_d) FROM orderline",
    "SELECT count(*), CAST(sum(s_quantity) AS BIGINT), CAST(sum(s_ytd) AS BIGINT), \
     CAST(sum(s_order_cnt) AS BIGINT), CAST(sum(s_remote_cnt) AS BIGINT) FROM stock",
];

/// A system and its settings, as measured.
#[derive(Clone, Debug)]
enum System {
    Retina,
    DuckDb,
    Delta { commit_every: Duration },
}

impl System {
    /// The name results are recorded under.
    fn label(&self) -> String {
        match self {
            System::Retina => "retina".into(),
            System::DuckDb => "duckdb".into(),
            System::Delta { commit_every } => format!("delta_{}ms", commit_every.as_millis()),
        }
    }

    fn open(
        &self,
        dir: &Path,
        catalog: &Arc<Catalog>,
        shards: Option<u16>,
    ) -> anyhow::Result<Box<dyn Target>> {
        Ok(match self {
            System::Retina => Box::new(RetinaTarget::start(dir, catalog.clone(), shards)?),
            #[cfg(feature = "peer-duckdb")]
            System::DuckDb => Box::new(duckdb::DuckDbTarget::open(dir, catalog.tables())?),
            #[cfg(feature = "peer-delta")]
            System::Delta { commit_every } => Box::new(delta::DeltaTarget::create(
                dir,
                catalog.tables(),
                *commit_every,
            )?),
            #[allow(unreachable_patterns)]
            other => unreachable!("{} was checked to be in this build", other.label()),
        })
    }
}

fn parse_systems(names: &[String], delta_commit_ms: &[u64]) -> anyhow::Result<Vec<System>> {
    let mut systems = Vec::new();
    for (i, name) in names.iter().enumerate() {
        match name.trim() {
            "retina" => systems.push(System::Retina),
            "duckdb" if !cfg!(feature = "peer-duckdb") => anyhow::bail!(
                "--systems, entry {}: DuckDB is not in this build: build with \
                 `cargo build --release --features peers` (or `peer-duckdb`)",
                i + 1
            ),
            "delta" if !cfg!(feature = "peer-delta") => anyhow::bail!(
                "--systems, entry {}: Delta Lake is not in this build: build with \
                 `cargo build --release --features peers` (or `peer-delta`)",
                i + 1
            ),
            "duckdb" => systems.push(System::DuckDb),
            "delta" => {
                anyhow::ensure!(!delta_commit_ms.is_empty(), "--delta-commit-ms is empty");
                for &ms in delta_commit_ms {
                    anyhow::ensure!(ms > 0, "--delta-commit-ms: an interval of 0 ms");
                    systems.push(System::Delta {
                        commit_every: Duration::from_millis(ms),
                    });
                }
            }
            other => anyhow::bail!(
                "--systems, entry {}: unknown system `{other}` (retina, duckdb or delta)",
                i + 1
            ),
        }
    }
    anyhow::ensure!(!systems.is_empty(), "--systems is empty");
    Ok(systems)
}

/// `Some(rows per second)` or `None` for `max`.
fn parse_rates(rates: &[String]) -> anyhow::Result<Vec<Option<u64>>> {
    anyhow::ensure!(!rates.is_empty(), "--rates is empty");
    rates
        .iter()
        .enumerate()
        .map(|(i, r)| match r.trim() {
            "max" => Ok(None),
            n => match n.parse::<u64>() {
                Ok(v) if v > 0 => Ok(Some(v)),
                _ => anyhow::bail!(
                    "--rates, entry {}: `{n}` is not a positive number of rows per second or `max`",
                    i + 1
                ),
            },
        })
        .collect()
}

fn rate_label(rate: Option<u64>) -> String {
    rate.map_or("max".into(), |r| r.to_string())
}

/// One run of one system at one rate.
struct Outcome {
    rows: u64,
    /// From the first emit until every row was visible.
    seconds: f64,
    /// From the last emit until every row was visible.
    lag_s: f64,
    freshness_ms: Vec<f64>,
}

impl Outcome {
    fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.seconds
    }

    fn percentile(&self, p: usize) -> Option<f64> {
        percentile(&mut self.freshness_ms.clone(), p)
    }
}

pub fn run(args: PeersArgs) -> anyhow::Result<()> {
    let scale = crate::ch::scale(&args.scale)?;
    let results = results_file(&args.scale);
    let systems = parse_systems(&args.systems, &args.delta_commit_ms)?;
    let rates = parse_rates(&args.rates)?;
    anyhow::ensure!(args.seconds > 0, "--seconds must be positive");
    anyhow::ensure!(args.query_runs > 0, "--query-runs must be positive");
    let catalog = Arc::new(Catalog::from_ddl(retina_bench::chgen::DDL, "ch.sql")?);
    let fresh_cols: Arc<Vec<usize>> = Arc::new(
        schemas()
            .iter()
            .map(|s| {
                s.column_index("fresh_ts")
                    .expect("every CH table has fresh_ts")
            })
            .collect(),
    );
    println!(
        "retina bench peers: CH-benCHmark (scale {}), the same load and stream into {}",
        args.scale,
        systems
            .iter()
            .map(System::label)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let load = ChGen::new(scale, SEED).load(LOAD_ROWS_PER_TXN);
    let load_rows: usize = load.iter().map(Vec::len).sum();
    let _ = record(&results, "load_rows", load_rows as f64, "rows");
    println!(
        "  load: {load_rows} rows; stream: {} s per fixed rate, {} rows at max",
        args.seconds, args.max_rows
    );
    println!(
        "{:>14} {:>7} {:>10} {:>11} {:>9} {:>10} {:>10} {:>8} {:>9}",
        "system", "rate", "rows", "rows/s", "lag s", "P50 ms", "P99 ms", "samples", "load s"
    );
    let mut table: Vec<(String, Option<u64>, Outcome)> = Vec::new();
    let mut query_ms: Vec<(String, [f64; 3])> = Vec::new();
    let mut mismatches = Vec::new();
    for (ri, &rate) in rates.iter().enumerate() {
        let rows = rate.map_or(args.max_rows, |r| r * args.seconds);
        let stream = Arc::new(stream(scale, rows));
        let rows: u64 = stream.iter().map(|t| t.len() as u64).sum();
        let mut reference: Option<(String, Vec<Vec<Option<i64>>>)> = None;
        for system in &systems {
            let label = system.label();
            let dir = tempfile::Builder::new()
                .prefix("retina-peers-")
                .tempdir()
                .context("creating a directory for the run")?;
            let mut target = system.open(dir.path(), &catalog, args.shards)?;
            let started = Instant::now();
            target
                .load(&load)
                .with_context(|| format!("{label}: the initial load"))?;
            let load_s = started.elapsed().as_secs_f64();
            let outcome = drive(target.as_mut(), stream.clone(), rate, fresh_cols.clone())
                .with_context(|| format!("{label} at {} rows/s", rate_label(rate)))?;
            let fmt = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
            println!(
                "{label:>14} {:>7} {rows:>10} {:>11.0} {:>9.2} {:>10} {:>10} {:>8} {load_s:>9.1}",
                rate_label(rate),
                outcome.rows_per_s(),
                outcome.lag_s,
                fmt(outcome.percentile(50)),
                fmt(outcome.percentile(99)),
                outcome.freshness_ms.len(),
            );
            let mut reader = target.reader()?;
            let prints = FINGERPRINT
                .iter()
                .map(|q| reader.ints(q).with_context(|| format!("{label}: {q}")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            match &reference {
                None => reference = Some((label.clone(), prints)),
                Some((first, expected)) => {
                    for ((q, want), got) in FINGERPRINT.iter().zip(expected).zip(&prints) {
                        if want != got {
                            mismatches.push(format!(
                                "at {} rows/s, {q}: {first} has {want:?}, {label} has {got:?}",
                                rate_label(rate)
                            ));
                        }
                    }
                }
            }
            let at = rate_label(rate);
            let rec = |name: &str, v: f64, unit: &str| {
                let _ = record(&results, &format!("{name}_{label}_at_{at}"), v, unit);
            };
            rec("rows_per_s", outcome.rows_per_s(), "rows/s");
            rec("lag_s", outcome.lag_s, "s");
            if let Some(p) = outcome.percentile(50) {
                rec("p50_ms", p, "ms");
            }
            if let Some(p) = outcome.percentile(99) {
                rec("p99_ms", p, "ms");
            }
            rec("load_s", load_s, "s");
            rec("disk_bytes", target.disk_bytes() as f64, "bytes");
            // Queries on the final state of the last rate's run, the same for every system.
            if ri + 1 == rates.len() {
                let mut ms = [0.0; 3];
                for (m, (name, sql)) in ms.iter_mut().zip(crate::ch::QUERIES) {
                    let mut runs = Vec::with_capacity(args.query_runs);
                    for _ in 0..args.query_runs {
                        let t = Instant::now();
                        reader
                            .rows(sql)
                            .with_context(|| format!("{label}: {name}"))?;
                        runs.push(t.elapsed().as_secs_f64() * 1000.0);
                    }
                    *m = median(&mut runs);
                }
                for (q, v) in ["q1", "q6", "q3"].iter().zip(ms) {
                    let _ = record(&results, &format!("{q}_ms_{label}"), v, "ms");
                }
                query_ms.push((label.clone(), ms));
            }
            drop(reader);
            table.push((label, rate, outcome));
            drop(target);
        }
    }
    println!();
    println!(
        "CH queries on the final state (median of {} runs, ms):",
        args.query_runs
    );
    println!("{:>14} {:>9} {:>9} {:>9}", "system", "Q1", "Q6", "Q3");
    for (label, [q1, q6, q3]) in &query_ms {
        println!("{label:>14} {q1:>9.1} {q6:>9.1} {q3:>9.1}");
    }
    summarize(&table);
    println!(
        "(results appended to {})",
        retina_bench::results::results_dir()
            .join(format!("{results}.jsonl"))
            .display()
    );
    anyhow::ensure!(
        mismatches.is_empty(),
        "the systems' final states differ:\n{}",
        mismatches.join("\n")
    );
    Ok(())
}

/// The results file (without `.jsonl`) for a dataset: each scale its own side-by-side section in
/// `retina bench report`.
fn results_file(scale: &str) -> String {
    match scale {
        "tpcc" => "peers".into(),
        other => format!("peers-{}", other.replace(':', "")),
    }
}

/// The ratios the targets name, from this run's rows (as `retina bench report` words
/// them).
fn summarize(table: &[(String, Option<u64>, Outcome)]) {
    use retina_bench::report::Measurement;
    let mut entries = std::collections::BTreeMap::new();
    for (label, rate, o) in table {
        let at = rate_label(*rate);
        let mut put = |name: &str, value: Option<f64>| {
            if let Some(value) = value {
                let m = Measurement {
                    at: 0,
                    value,
                    unit: String::new(),
                };
                entries.insert(format!("{name}_{label}_at_{at}"), m);
            }
        };
        put("rows_per_s", Some(o.rows_per_s()));
        put("p50_ms", o.percentile(50));
    }
    let ratios = retina_bench::report::peer_ratios(&entries);
    if !ratios.is_empty() {
        println!();
    }
    for r in ratios {
        println!("{r}");
    }
}

/// The stream after the load: whole transactions until `rows` rows, stamped by a logical clock
/// (the driver restamps `fresh_ts` when it emits them).
fn stream(scale: retina_bench::chgen::ChScale, rows: u64) -> Vec<Txn> {
    let mut generator = ChGen::new(scale, SEED);
    let mut clock = FreshClock::logical();
    let mut out = Vec::new();
    let mut n = 0u64;
    while n < rows {
        let txn = generator.next_txn(clock.now_us());
        n += txn.len() as u64;
        out.push(txn);
    }
    out
}

/// One run: the driver emits `stream` at `rate` (or as fast as the applier takes it), this
/// thread applies it to `target`, and a monitor measures freshness until every row is visible.
fn drive(
    target: &mut dyn Target,
    stream: Arc<Vec<Txn>>,
    rate: Option<u64>,
    fresh_cols: Arc<Vec<usize>>,
) -> anyhow::Result<Outcome> {
    let (tx, rx) = match rate {
        Some(_) => flume::unbounded(),
        None => flume::bounded(MAX_QUEUE),
    };
    let reader = target.reader()?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let start_us = now_us();
    let driver = std::thread::spawn(move || {
        let mut sent = 0u64;
        for txn in stream.iter() {
            if let Some(rate) = rate {
                let due = Duration::from_secs_f64(sent as f64 / rate as f64);
                if let Some(wait) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
            let mut txn = txn.clone();
            stamp_fresh(&mut txn, now_us(), &fresh_cols);
            sent += txn.len() as u64;
            if tx.send(txn).is_err() {
                break;
            }
        }
        (sent, Instant::now())
    });
    let monitor = {
        let stop = stop.clone();
        std::thread::spawn(move || monitor(reader, &stop, start_us))
    };
    let applied = (|| {
        loop {
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(first) => {
                    let mut group = vec![first];
                    group.extend(rx.try_iter().take(MAX_GROUP - 1));
                    target.apply(group)?;
                }
                Err(flume::RecvTimeoutError::Timeout) => {}
                Err(flume::RecvTimeoutError::Disconnected) => break,
            }
            target.tick()?;
        }
        target.finish()
    })();
    let finished = Instant::now();
    drop(rx);
    stop.store(true, Ordering::Relaxed);
    let (rows, last_emit) = driver
        .join()
        .map_err(|_| anyhow::anyhow!("the driver panicked"))?;
    let freshness_ms = monitor
        .join()
        .map_err(|_| anyhow::anyhow!("the monitor panicked"))??;
    applied?;
    Ok(Outcome {
        rows,
        seconds: finished.duration_since(start).as_secs_f64(),
        lag_s: finished.saturating_duration_since(last_emit).as_secs_f64(),
        freshness_ms,
    })
}

/// Every 100 ms until stopped: the newest `fresh_ts` of district, and freshness = the time
/// the query started minus it. Before a change of the run is visible, the run's start stands
/// in for it (the system is as stale as the run is old).
fn monitor(
    mut reader: Box<dyn Reader>,
    stop: &AtomicBool,
    start_us: i64,
) -> anyhow::Result<Vec<f64>> {
    let warm = start_us + WARM_UP.as_micros() as i64;
    let mut samples = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(MONITOR_EVERY);
        let at = now_us();
        let newest = reader.max_fresh_us()?.unwrap_or(0).max(start_us);
        if at >= warm {
            samples.push((at - newest) as f64 / 1000.0);
        }
    }
    Ok(samples)
}
