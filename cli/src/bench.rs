//! `retina bench`: measurements that need a running node. `replay` measures replay throughput
//! on the CH-benCHmark-shaped replay workload: end to end from Debezium JSON (file source,
//! parsing included), and from op batches encoded before the clock starts (the shards alone).

use std::io::BufWriter;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::ch::{REPLAY_DDL, replay_workload, write_debezium};
use retina_bench::results::record;
use retina_node::catalog::Catalog;
use retina_node::debezium::TxnMode;
use retina_node::node::Node;
use retina_node::settings::Settings;
use retina_node::sink::{OnError, SinkOptions, SourceSpec, run_sink};

use crate::measure::{local_node, median, now_us, percentile};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Turns the newest results in bench/results/ into SVG charts (beside them) in the style of
    /// the paper's figures and a BENCHMARKS.md with every number and the paper's beside them.
    Report {
        /// Where to write the Markdown report.
        #[arg(long, default_value = "BENCHMARKS.md")]
        out: std::path::PathBuf,
    },
    /// Writes a generated workload to a folder: its DDL (`schema.sql`) and its initial load and
    /// change stream as Debezium JSON lines (`changes.json`, load first, ready for `retina serve
    /// --schema DIR/schema.sql --source file:DIR/changes.json`), and prints the stream's
    /// self-check (rows per transaction, c/u/d shares, per-table shares).
    Generate {
        /// `ch` (CH-benCHmark) or `hybench`.
        workload: String,
        /// `tiny`, or a scale: warehouses for `ch`, the scale factor for `hybench`.
        #[arg(long, default_value = "tiny")]
        scale: String,
        /// Change-stream transactions after the load.
        #[arg(long, default_value_t = 10_000)]
        txns: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// The folder to write to (created if missing).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Replay throughput with each shard count, from Debezium JSON and from pre-encoded batches.
    Replay {
        /// Shard counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        shards: Vec<u16>,
        /// Warehouses (100,000 stock rows each are loaded first).
        #[arg(long, default_value_t = 1)]
        warehouses: i64,
        /// NewOrder transactions after the load.
        #[arg(long, default_value_t = 100_000)]
        new_orders: usize,
        /// Runs of each measurement; the median is reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Freshness as bench/README.md defines it: the workload emitted at fixed rates, a monitor running
    /// `SELECT max(fresh_ts) FROM district` through the DataFusion connector every 100 ms.
    Freshness {
        /// Rows per second to emit, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000,80000")]
        rates: Vec<u64>,
        /// Seconds per rate.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// VFoR overhead: the same SQL queries over the same order lines through the DataFusion
    /// connector, with the visibility check on and off, alternating, medians.
    Vfor {
        /// Order lines loaded (they end up in regular files of 65,536 rows).
        #[arg(long, default_value_t = 2_097_152)]
        rows: usize,
        /// Per mille of the rows deleted after the load, scattered.
        #[arg(long, default_value_t = 10)]
        deleted_per_mille: u32,
        /// Runs of each query in each mode.
        #[arg(long, default_value_t = 7)]
        runs: usize,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Query latency while memory GC and storage GC run at different intervals (the paper's
    /// Figure 14): the workload at a fixed rate, a scan query through the DataFusion connector
    /// every 100 ms, P50/P99 per GC interval.
    Gc {
        /// GC intervals to measure, in milliseconds, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "10000,30000,60000,240000"
        )]
        intervals_ms: Vec<u64>,
        /// Seconds per interval.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Rows per second the workload is emitted at.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Query consistency (bench/README.md): CH-style queries on the static loaded data (with and
    /// without the visibility check), then while the workload changes it at a fixed rate;
    /// latency under change normalized to the static run with the check (medians).
    Consistency {
        /// NewOrders loaded before the queries (about 11 order lines each).
        #[arg(long, default_value_t = 20_000)]
        preload: usize,
        /// Rows per second of the change stream during the second run.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Runs of each query in each phase.
        #[arg(long, default_value_t = 7)]
        runs: usize,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Resources at a fixed rate (bench/README.md): the process's CPU (percent of one core, and per
    /// 1K rows/s), resident memory, and memory by structure.
    Resources {
        /// Rows per second, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000")]
        rates: Vec<u64>,
        /// Seconds per rate.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Recovery time against the rows applied since the last checkpoint: a node loads the
    /// stock table, checkpoints, applies that many more rows and stops without a checkpoint;
    /// a restart loads the checkpoint and the same rows are redone.
    Recovery {
        /// Rows applied after the checkpoint, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,100000,400000,1600000")]
        rows: Vec<u64>,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// The same CH-benCHmark load and stream replayed into Retina, DuckDB and Delta Lake (at
    /// several commit intervals) side by side: rows/s, freshness P50/P99 with the same
    /// `max(fresh_ts)` monitor, and CH Q1/Q6/Q3 latency; the final states must agree. DuckDB and
    /// Delta Lake need the binary built with `--features peers`.
    Peers(crate::peers::PeersArgs),
    /// Bitmap requests to a shard's scan service over loopback: latency one at a time, and
    /// throughput with many in flight.
    Bitmaps {
        /// Requests per measurement.
        #[arg(long, default_value_t = 5000)]
        requests: usize,
        /// Requests in flight for the throughput measurement.
        #[arg(long, default_value_t = 64)]
        in_flight: usize,
    },
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchCommand::Report { out } => {
            let written = retina_bench::report::write(&retina_bench::results::results_dir(), &out)
                .map_err(anyhow::Error::msg)?;
            for p in written {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
        BenchCommand::Generate {
            workload,
            scale,
            txns,
            seed,
            out,
        } => generate(&workload, &scale, txns, seed, &out),
        BenchCommand::Replay {
            shards,
            warehouses,
            new_orders,
            runs,
        } => replay(&shards, warehouses, new_orders, runs),
        BenchCommand::Peers(args) => crate::peers::run(args),
        BenchCommand::Bitmaps {
            requests,
            in_flight,
        } => bitmaps(requests, in_flight),
        BenchCommand::Vfor {
            rows,
            deleted_per_mille,
            runs,
            shards,
        } => vfor(rows, deleted_per_mille, runs, shards),
        BenchCommand::Freshness {
            rates,
            seconds,
            shards,
        } => freshness(&rates, seconds, shards),
        BenchCommand::Gc {
            intervals_ms,
            seconds,
            rate,
            shards,
        } => gc(&intervals_ms, seconds, rate, shards),
        BenchCommand::Recovery { rows, shards } => recovery(&rows, shards),
        BenchCommand::Consistency {
            preload,
            rate,
            runs,
            shards,
        } => consistency(preload, rate, runs, shards),
        BenchCommand::Resources {
            rates,
            seconds,
            shards,
        } => resources(&rates, seconds, shards),
    }
}

fn generate(
    workload: &str,
    scale: &str,
    txns: usize,
    seed: u64,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    use retina_bench::{chgen, hybench, workload::SelfCheck};
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let number = || -> anyhow::Result<i64> {
        scale
            .parse()
            .map_err(|_| anyhow::anyhow!("--scale `{scale}`: `tiny` or a positive number"))
    };
    let json = out.join("changes.json");
    let mut file = BufWriter::new(
        std::fs::File::create(&json).with_context(|| format!("creating {}", json.display()))?,
    );
    let (ddl, check) = match workload {
        "ch" => {
            let s = match scale {
                "tiny" => chgen::ChScale::tiny(),
                _ => chgen::ChScale::tpcc(number()?),
            };
            let w = chgen::generate(s, seed, txns);
            w.write_debezium(&mut file)?;
            (chgen::DDL, SelfCheck::of(&chgen::schemas(), &w.stream))
        }
        "hybench" => {
            let s = match scale {
                "tiny" => hybench::HyScale::tiny(),
                _ => hybench::HyScale::sf(number()?),
            };
            let w = hybench::generate(s, seed, txns);
            w.write_debezium(&mut file)?;
            (hybench::DDL, SelfCheck::of(&hybench::schemas(), &w.stream))
        }
        other => anyhow::bail!("unknown workload `{other}`: ch or hybench"),
    };
    std::io::Write::flush(&mut file)?;
    std::fs::write(out.join("schema.sql"), ddl)?;
    println!(
        "{workload} at scale {scale}, seed {seed}: {} and {} ({:.0} MiB)",
        out.join("schema.sql").display(),
        json.display(),
        std::fs::metadata(&json)?.len() as f64 / (1 << 20) as f64
    );
    println!("the change stream's self-check:\n{check}");
    Ok(())
}

fn replay(
    shard_counts: &[u16],
    warehouses: i64,
    new_orders: usize,
    runs: usize,
) -> anyhow::Result<()> {
    let catalog = Arc::new(Catalog::from_ddl(REPLAY_DDL, "replay workload")?);
    let txns = replay_workload(1, warehouses, new_orders);
    let rows: usize = txns.iter().map(|t| t.len()).sum();
    let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
    let json = dir.path().join("replay.json");
    {
        let mut out = BufWriter::new(std::fs::File::create(&json)?);
        write_debezium(&mut out, catalog.tables(), &txns)?;
    }
    let json_mib = std::fs::metadata(&json)?.len() as f64 / (1 << 20) as f64;
    println!(
        "replay workload: {} transactions, {rows} rows ({} stock loaded, {new_orders} NewOrders), {json_mib:.0} MiB of Debezium JSON",
        txns.len(),
        warehouses * retina_bench::ch::ITEMS
    );
    println!(
        "{:>7} {:>22} {:>22}",
        "shards", "JSON rows/s (median)", "batches rows/s (median)"
    );
    for &shards in shard_counts {
        let settings = Settings {
            shards,
            ..Settings::default()
        };
        let mut from_json = Vec::new();
        let mut from_batches = Vec::new();
        let start_node = |data: &std::path::Path| {
            local_node(data.to_path_buf(), catalog.clone(), settings.clone(), false)
        };
        for run in 0..runs {
            // From Debezium JSON: the sink reads, parses, groups, routes and encodes.
            let data = dir.path().join(format!("json-{shards}-{run}"));
            let node = start_node(&data)?;
            let options = SinkOptions {
                source: SourceSpec::File(json.clone()),
                follow: false,
                mode: TxnMode::Metadata,
                on_error: OnError::Stop,
                dead_letter: data.join("dead.jsonl"),
                max_group_txns: settings.max_group_txns,
                group_commit_interval: Duration::from_millis(settings.group_commit_interval_ms),
                checkpoint_interval: None,
                max_txn_bytes: retina_node::settings::Settings::default().max_txn_bytes,
            };
            let start = Instant::now();
            let report = run_sink(node.handle(), &options, &AtomicBool::new(false));
            anyhow::ensure!(
                report.stopped_by.is_none(),
                "replay stopped: {:?}",
                report.stopped_by
            );
            let last = report.last_ts.context("nothing replayed")?;
            anyhow::ensure!(
                node.handle().wait_visible(last, Duration::from_secs(600)),
                "HWM did not reach {last}"
            );
            from_json.push(rows as f64 / start.elapsed().as_secs_f64());
            node.shutdown();
            std::fs::remove_dir_all(&data)?;

            // From pre-encoded op batches: timestamps, routing and encoding before the clock.
            let data = dir.path().join(format!("batches-{shards}-{run}"));
            let node = start_node(&data)?;
            let h = node.handle();
            let mut groups = Vec::new();
            let mut last = 0;
            for group in txns.chunks(settings.max_group_txns) {
                let range = h.allocate(group.len() as u64)?;
                last = *range.end();
                groups.push(h.encode_group(group, range, &[])?);
            }
            let start = Instant::now();
            for g in groups {
                h.send_encoded(g)?;
            }
            anyhow::ensure!(
                h.wait_visible(last, Duration::from_secs(600)),
                "HWM did not reach {last}"
            );
            from_batches.push(rows as f64 / start.elapsed().as_secs_f64());
            node.shutdown();
            std::fs::remove_dir_all(&data)?;
        }
        let (j, b) = (median(&mut from_json), median(&mut from_batches));
        println!("{shards:>7} {j:>22.0} {b:>22.0}");
        let _ = record(
            "replay",
            &format!("json_rows_per_s_{shards}_shards"),
            j,
            "rows/s",
        );
        let _ = record(
            "replay",
            &format!("batches_rows_per_s_{shards}_shards"),
            b,
            "rows/s",
        );
    }
    println!(
        "(this machine: {} cores; results appended to bench/results/replay.jsonl)",
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    Ok(())
}

/// Freshness samples start this long after the driver does.
const WARM_UP_US: i64 = 1_000_000;

fn freshness(rates: &[u64], seconds: u64, shards: u16) -> anyhow::Result<()> {
    println!(
        "{:>10} {:>14} {:>14} {:>9}",
        "rows/s", "P50 ms", "P99 ms", "samples"
    );
    for &rate in rates {
        let settings = Settings {
            shards,
            ..Settings::default()
        };
        let (_dir, node, stop, driver) = drive_replay_workload(settings, rate, seconds)?;
        let addr = node.coordinator_addr().expect("listening");
        let driver_start = now_us();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let mut samples = runtime.block_on(async {
            use arrow::array::AsArray;
            use arrow::datatypes::TimestampMicrosecondType;
            use futures::TryStreamExt;
            let retina = retina_query::Retina::connect(addr, "")?;
            let mut samples = Vec::new();
            let end = Instant::now() + Duration::from_secs(seconds);
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(100)).await;
                // Freshness is measured from the moment the query's snapshot is fixed.
                let session = retina.begin().await?;
                let start = now_us();
                let stream = session.sql("SELECT max(fresh_ts) FROM district").await?;
                let batches: Vec<_> = stream.try_collect().await?;
                let newest = batches
                    .iter()
                    .filter(|b| b.num_rows() > 0)
                    .map(|b| {
                        b.column(0)
                            .as_primitive::<TimestampMicrosecondType>()
                            .value(0)
                    })
                    .max()
                    .unwrap_or(0);
                // The first second is warm-up (the driver catching up to its rate).
                if newest >= driver_start + WARM_UP_US {
                    samples.push((start - newest) as f64 / 1000.0);
                }
            }
            anyhow::Ok(samples)
        })?;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        driver
            .join()
            .map_err(|_| anyhow::anyhow!("the driver panicked"))??;
        anyhow::ensure!(!samples.is_empty(), "no freshness sample");
        let p50 = median(&mut samples);
        let p99 = percentile(&mut samples, 99).expect("at least one sample");
        println!("{rate:>10} {p50:>14.1} {p99:>14.1} {:>9}", samples.len());
        let _ = record(
            "freshness",
            &format!("p50_ms_at_{rate}_rows_per_s"),
            p50,
            "ms",
        );
        let _ = record(
            "freshness",
            &format!("p99_ms_at_{rate}_rows_per_s"),
            p99,
            "ms",
        );
        node.shutdown();
    }
    Ok(())
}

/// A node over a temporary directory with the replay workload's load applied, and a thread
/// emitting its NewOrders at `rate` rows per second, each stamped with the time it is emitted
/// in `fresh_ts`, until the flag is set (enough for `seconds` and a margin).
#[allow(clippy::type_complexity)]
fn drive_replay_workload(
    settings: Settings,
    rate: u64,
    seconds: u64,
) -> anyhow::Result<(
    tempfile::TempDir,
    Node,
    Arc<AtomicBool>,
    std::thread::JoinHandle<anyhow::Result<()>>,
)> {
    let (dir, node, txns) = loaded_replay_node(settings, rate, seconds, 0)?;
    let (stop, driver) = spawn_driver(node.handle().clone(), txns, rate);
    Ok((dir, node, stop, driver))
}

/// The replay workload's transactions after its load.
type Stream = Vec<Vec<retina_storage::TableOp<Vec<retina_storage::Value>>>>;

/// A node over a temporary directory with the replay workload's load and its first
/// `preload` NewOrders applied, and the NewOrders for `seconds` at `rate` (and a margin) that
/// follow them.
fn loaded_replay_node(
    settings: Settings,
    rate: u64,
    seconds: u64,
    preload: usize,
) -> anyhow::Result<(tempfile::TempDir, Node, Stream)> {
    let catalog = Arc::new(Catalog::from_ddl(REPLAY_DDL, "replay workload")?);
    let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
    let node = local_node(dir.path().join("data"), catalog, settings, true)?;
    let h = node.handle().clone();
    // About 22 rows per NewOrder; enough for the run and a margin.
    let new_orders = (rate * seconds / 20 + 1000) as usize;
    let mut txns = replay_workload(7, 1, preload + new_orders);
    let load_txns = txns.len() - new_orders;
    let load: Vec<_> = txns.drain(..load_txns).collect();
    let mut last = 0;
    for group in load.chunks(1024) {
        last = *h.submit(group, &[])?.end();
    }
    anyhow::ensure!(
        h.wait_visible(last, Duration::from_secs(300)),
        "the load did not finish"
    );
    Ok((dir, node, txns))
}

/// A thread emitting `txns` at `rate` rows per second, each stamped with the time it is
/// emitted in `fresh_ts`, until the flag is set.
fn spawn_driver(
    h: retina_node::node::NodeHandle,
    txns: Stream,
    rate: u64,
) -> (Arc<AtomicBool>, std::thread::JoinHandle<anyhow::Result<()>>) {
    use retina_bench::ch::REPLAY_FRESH_TS;
    use retina_bench::workload::stamp_fresh;
    let stop = Arc::new(AtomicBool::new(false));
    let driver = {
        let stop = stop.clone();
        std::thread::spawn(move || -> anyhow::Result<()> {
            let start = Instant::now();
            let mut sent = 0u64;
            let mut pending = txns.into_iter();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Every transaction due by now, stamped with the time it is emitted.
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                let mut group = Vec::new();
                while sent < due {
                    let Some(mut txn) = pending.next() else { break };
                    stamp_fresh(&mut txn, now_us(), &REPLAY_FRESH_TS);
                    sent += txn.len() as u64;
                    group.push(txn);
                }
                if group.is_empty() {
                    std::thread::sleep(Duration::from_micros(200));
                } else {
                    h.submit(&group, &[])?;
                }
            }
            Ok(())
        })
    };
    (stop, driver)
}

fn gc(intervals_ms: &[u64], seconds: u64, rate: u64, shards: u16) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    const QUERY: &str = "SELECT count(*), sum(s_quantity) FROM stock";
    println!(
        "{QUERY} every 100 ms for {seconds} s while the workload runs at {rate} rows/s on {shards} shards"
    );
    println!(
        "{:>12} {:>9} {:>9} {:>8} {:>8} {:>10} {:>14}",
        "GC every ms", "P50 ms", "P99 ms", "samples", "GC runs", "rewritten", "visibility MiB"
    );
    for &interval in intervals_ms {
        let settings = Settings {
            shards,
            gc_interval_ms: interval,
            ..Settings::default()
        };
        let (_dir, node, stop, driver) = drive_replay_workload(settings, rate, seconds)?;
        let status = node.handle().status().clone();
        let addr = node.coordinator_addr().expect("listening");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let mut samples = runtime.block_on(async {
            let retina = retina_query::Retina::connect(addr, "")?;
            let mut samples = Vec::new();
            let warm = Instant::now() + Duration::from_micros(WARM_UP_US as u64);
            let end = Instant::now() + Duration::from_secs(seconds);
            while Instant::now() < end {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let start = Instant::now();
                let batches = retina.begin().await?.collect(QUERY).await?;
                anyhow::ensure!(
                    batches.iter().map(|b| b.num_rows()).sum::<usize>() == 1,
                    "one row of aggregates"
                );
                if start >= warm {
                    samples.push(start.elapsed().as_secs_f64() * 1000.0);
                }
            }
            anyhow::Ok(samples)
        })?;
        stop.store(true, Ordering::Relaxed);
        driver
            .join()
            .map_err(|_| anyhow::anyhow!("the driver panicked"))??;
        anyhow::ensure!(!samples.is_empty(), "no latency sample");
        let runs = status.gc_runs.load(Ordering::Relaxed);
        let rewritten = status.files_rewritten.load(Ordering::Relaxed);
        let vis: u64 = status
            .shard_memory
            .iter()
            .map(|m| m.visibility_bytes.load(Ordering::Relaxed))
            .sum();
        let p50 = median(&mut samples);
        let p99 = percentile(&mut samples, 99).expect("at least one sample");
        println!(
            "{interval:>12} {p50:>9.1} {p99:>9.1} {:>8} {runs:>8} {rewritten:>10} {:>14.2}",
            samples.len(),
            vis as f64 / (1 << 20) as f64
        );
        for (name, v, unit) in [
            ("p50_ms", p50, "ms"),
            ("p99_ms", p99, "ms"),
            ("gc_runs", runs as f64, "runs"),
            ("files_rewritten", rewritten as f64, "files"),
            ("visibility_bytes", vis as f64, "bytes"),
        ] {
            let _ = record(
                "gc",
                &format!("{name}_gc_every_{interval}_ms_at_{rate}_rows_per_s"),
                v,
                unit,
            );
        }
        node.shutdown();
    }
    Ok(())
}

fn consistency(preload: usize, rate: u64, runs: usize, shards: u16) -> anyhow::Result<()> {
    use retina_query::Visibility;
    const QUERIES: [(&str, &str); 3] = [
        (
            "Q1",
            "SELECT ol_number, sum(ol_quantity), sum(ol_amount), avg(ol_amount), count(*) \
             FROM orderline GROUP BY ol_number ORDER BY ol_number",
        ),
        (
            "Q6",
            "SELECT sum(ol_amount) FROM orderline WHERE ol_quantity BETWEEN 1 AND 100000",
        ),
        (
            "join",
            "SELECT s_w_id, count(*), sum(ol_amount) FROM stock, orderline \
             WHERE ol_i_id = s_i_id AND ol_supply_w_id = s_w_id AND s_quantity < 50 \
             GROUP BY s_w_id",
        ),
    ];
    let seconds = (runs as u64 * 3).max(10);
    let settings = Settings {
        shards,
        ..Settings::default()
    };
    let (_dir, node, txns) = loaded_replay_node(settings, rate, seconds, preload)?;
    let status = node.handle().status().clone();
    let static_rows = status
        .rows_applied
        .load(std::sync::atomic::Ordering::Relaxed);
    let addr = node.coordinator_addr().expect("listening");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let retina = retina_query::Retina::connect(addr, "")?;
    let time = |visibility: Visibility, sql: &'static str| -> anyhow::Result<f64> {
        let mut ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            let start = Instant::now();
            runtime.block_on(async {
                let session = retina.begin_with(visibility).await?;
                session.collect(sql).await?;
                anyhow::Ok(())
            })?;
            ms.push(start.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(median(&mut ms))
    };
    // The static data with and without the visibility check: the preloaded NewOrders updated
    // stock rows, so without the check a query also reads their dead versions.
    let (mut base, mut unchecked) = (Vec::new(), Vec::new());
    for (_, sql) in QUERIES {
        time(Visibility::Check, sql)?; // warm-up
        base.push(time(Visibility::Check, sql)?);
        unchecked.push(time(Visibility::Ignore, sql)?);
    }
    let (stop, driver) = spawn_driver(node.handle().clone(), txns, rate);
    std::thread::sleep(Duration::from_secs(1));
    let changing_from = status
        .rows_applied
        .load(std::sync::atomic::Ordering::Relaxed);
    let mut under = Vec::new();
    for (_, sql) in QUERIES {
        under.push(time(Visibility::Check, sql)?);
    }
    let changed = status
        .rows_applied
        .load(std::sync::atomic::Ordering::Relaxed)
        - changing_from;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    driver
        .join()
        .map_err(|_| anyhow::anyhow!("the driver panicked"))??;
    println!(
        "{static_rows} rows loaded; {changed} rows ({:.1}%) changed while the queries ran at {rate} rows/s",
        changed as f64 * 100.0 / static_rows as f64
    );
    println!(
        "{:>6} {:>22} {:>12} {:>16} {:>11}",
        "query", "static, no check ms", "static ms", "under change ms", "normalized"
    );
    for ((((name, _), b), n), u) in QUERIES.iter().zip(&base).zip(&unchecked).zip(&under) {
        println!("{name:>6} {n:>22.1} {b:>12.1} {u:>16.1} {:>11.2}", u / b);
        let _ = record(
            "consistency",
            &format!("{name}_normalized_at_{rate}_rows_per_s"),
            u / b,
            "ratio",
        );
    }
    node.shutdown();
    Ok(())
}

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name, in
    // USER_HZ ticks, which Linux fixes at 100 per second in what /proc shows.
    (ticks(11) + ticks(12)) / 100.0
}

fn resources(rates: &[u64], seconds: u64, shards: u16) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    println!(
        "{:>9} {:>10} {:>16} {:>9} {:>10} {:>12} {:>14}",
        "rows/s",
        "CPU %",
        "CPU % per 1K/s",
        "RSS MiB",
        "index MiB",
        "buffers MiB",
        "visibility MiB"
    );
    for &rate in rates {
        let settings = Settings {
            shards,
            ..Settings::default()
        };
        let (_dir, node, stop, driver) = drive_replay_workload(settings, rate, seconds)?;
        // The first seconds are the driver catching up; measure after them.
        std::thread::sleep(Duration::from_secs(2));
        let (cpu0, t0) = (cpu_seconds(), Instant::now());
        std::thread::sleep(Duration::from_secs(seconds.saturating_sub(2).max(1)));
        let cpu = (cpu_seconds() - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
        stop.store(true, Ordering::Relaxed);
        driver
            .join()
            .map_err(|_| anyhow::anyhow!("the driver panicked"))??;
        let status = node.handle().status();
        let sum = |f: fn(&retina_node::node::ShardMemory) -> &std::sync::atomic::AtomicU64| {
            status
                .shard_memory
                .iter()
                .map(|m| f(m).load(Ordering::Relaxed))
                .sum::<u64>() as f64
                / (1 << 20) as f64
        };
        let (index, buffers, visibility) = (
            sum(|m| &m.index_bytes),
            sum(|m| &m.write_buffer_bytes),
            sum(|m| &m.visibility_bytes),
        );
        let rss = std::fs::read_to_string("/proc/self/statm")
            .ok()
            .and_then(|s| s.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0)
            * 4096.0
            / (1 << 20) as f64;
        let per_1k = cpu / (rate as f64 / 1000.0);
        println!(
            "{rate:>9} {cpu:>10.1} {per_1k:>16.2} {rss:>9.0} {index:>10.1} {buffers:>12.1} {visibility:>14.2}"
        );
        for (name, v, unit) in [
            ("cpu_percent", cpu, "%"),
            ("cpu_percent_per_1k_rows_per_s", per_1k, "%"),
            ("rss_mib", rss, "MiB"),
            ("index_mib", index, "MiB"),
            ("write_buffer_mib", buffers, "MiB"),
            ("visibility_mib", visibility, "MiB"),
        ] {
            let _ = record(
                "resources",
                &format!("{name}_at_{rate}_rows_per_s"),
                v,
                unit,
            );
        }
        node.shutdown();
    }
    Ok(())
}

fn recovery(rows: &[u64], shards: u16) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let catalog = Arc::new(Catalog::from_ddl(REPLAY_DDL, "replay workload")?);
    println!(
        "{:>12} {:>16} {:>12} {:>14} {:>16}",
        "rows since", "checkpoint MiB", "restore s", "redo s", "recovery s"
    );
    for &since in rows {
        let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
        let data = dir.path().join("data");
        let start = || {
            local_node(
                data.clone(),
                catalog.clone(),
                Settings {
                    shards,
                    ..Settings::default()
                },
                false,
            )
        };
        // About 22 rows per NewOrder.
        let mut txns = replay_workload(11, 1, (since / 20 + 1) as usize);
        let load: Vec<_> = txns
            .drain(..txns.len() - (since / 20 + 1) as usize)
            .collect();
        let mut redo = Vec::new();
        let mut n = 0u64;
        for t in txns {
            if n >= since {
                break;
            }
            n += t.len() as u64;
            redo.push(t);
        }
        let node = start()?;
        let h = node.handle().clone();
        let ts = h.submit(&load, &[])?;
        anyhow::ensure!(h.wait_visible(*ts.end(), Duration::from_secs(120)));
        let id = h
            .checkpoint(Default::default(), Vec::new())?
            .context("a checkpoint was already on its way")?;
        let waited = Instant::now();
        while h.status().checkpoint_id.load(Ordering::Acquire) < id {
            anyhow::ensure!(
                waited.elapsed() < Duration::from_secs(120),
                "the checkpoint did not complete"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let submit_all = |h: &retina_node::node::NodeHandle| -> anyhow::Result<()> {
            for group in redo.chunks(1024) {
                let ts = h.submit(group, &[])?;
                if group.as_ptr_range().end == redo.as_ptr_range().end {
                    anyhow::ensure!(h.wait_visible(*ts.end(), Duration::from_secs(600)));
                }
            }
            Ok(())
        };
        submit_all(&h)?;
        node.shutdown();
        let ckpt_bytes: u64 = std::fs::read_dir(data.join("checkpoints"))?
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .filter_map(|f| f.metadata().ok().map(|m| m.len()))
            .sum();

        // The restart: the checkpoint loaded, then the rows after it redone from the source.
        let t0 = Instant::now();
        let node = start()?;
        let restored = t0.elapsed();
        let h = node.handle().clone();
        submit_all(&h)?;
        let total = t0.elapsed();
        node.shutdown();
        let redo_s = (total - restored).as_secs_f64();
        println!(
            "{n:>12} {:>16.1} {:>12.3} {redo_s:>14.3} {:>16.3}",
            ckpt_bytes as f64 / (1 << 20) as f64,
            restored.as_secs_f64(),
            total.as_secs_f64()
        );
        for (name, v, unit) in [
            ("restore_s", restored.as_secs_f64(), "s"),
            ("redo_s", redo_s, "s"),
            ("recovery_s", total.as_secs_f64(), "s"),
            ("checkpoint_bytes", ckpt_bytes as f64, "bytes"),
        ] {
            let _ = record("recovery", &format!("{name}_with_{n}_rows_since"), v, unit);
        }
    }
    Ok(())
}

fn bitmaps(requests: usize, in_flight: usize) -> anyhow::Result<()> {
    use retina_storage::{RowOp, TableOp, Value};
    let catalog = Arc::new(Catalog::from_ddl(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)",
        "bench",
    )?);
    let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
    // One shard, one combined file of 2 row groups of 4,096 rows (a 512-byte bitmap each).
    let settings = Settings {
        shards: 1,
        block_rows: 4096,
        row_group_rows: 4096,
        file_rows: 8192,
        flush_interval_ms: 5,
        ..Settings::default()
    };
    let node = local_node(dir.path().join("data"), catalog, settings, true)?;
    let h = node.handle().clone();
    let rows: Vec<_> = (0..8192i64)
        .map(|i| TableOp {
            table: 0,
            op: RowOp::Insert(vec![Value::Int(i), Value::Int(i)]),
        })
        .collect();
    let ts = h.submit(&[rows], &[])?;
    anyhow::ensure!(h.wait_visible(*ts.end(), Duration::from_secs(30)));
    let lake = dir.path().join("data/lake/tables/t");
    let start = Instant::now();
    let file = loop {
        let found = std::fs::read_dir(&lake).ok().and_then(|d| {
            d.flatten().find_map(|e| {
                let name = e.file_name().into_string().ok()?;
                u64::from_str_radix(name.strip_suffix(".parquet")?, 16).ok()
            })
        });
        if let Some(f) = found {
            break f;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the file was not combined"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let addr = node.scan_addrs()[0];
    let coordinator = node
        .coordinator_addr()
        .ok_or_else(|| anyhow::anyhow!("the bench node serves no queries"))?;
    let (mut latencies, per_second) =
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(512 << 10)
            .spawn(move || async move {
                let scan = retina_node::client::scan_service(addr, "")
                    .await
                    .expect("scan service");
                // Bitmap calls name a running query, read at its snapshot.
                let c = retina_node::client::coordinator(coordinator, "")
                    .await
                    .expect("coordinator");
                let q = retina_node::client::begin(&c).await.expect("a query");
                let call = |rg: u32| {
                    let mut req = scan.bitmaps_request();
                    req.get().set_file_id(file);
                    req.get().set_snapshot(q.snapshot.get());
                    req.get().set_query_id(q.id);
                    req.get().set_secret(q.secret);
                    req.get().init_row_groups(1).set(0, rg);
                    req.send().promise
                };
                let mut latencies = Vec::with_capacity(requests);
                for i in 0..requests {
                    let t = Instant::now();
                    call((i % 2) as u32).await.expect("a bitmap");
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
                let t = Instant::now();
                let mut done = 0;
                while done < requests {
                    let batch: Vec<_> = (0..in_flight.min(requests - done))
                        .map(|i| call((i % 2) as u32))
                        .collect();
                    done += batch.len();
                    for r in futures::future::join_all(batch).await {
                        r.expect("a bitmap");
                    }
                }
                (latencies, requests as f64 / t.elapsed().as_secs_f64())
            })
            .map_err(|e| anyhow::anyhow!("client executor: {e}"))?
            .join()
            .map_err(|e| anyhow::anyhow!("client executor: {e}"))?;
    let p50 = median(&mut latencies);
    let p99 = percentile(&mut latencies, 99).expect("at least one sample");
    println!(
        "bitmap requests over loopback (4,096-row row group, 512-byte bitmap): p50 {p50:.0} us, p99 {p99:.0} us one at a time; {per_second:.0} requests/s with {in_flight} in flight"
    );
    let _ = record("rpc", "bitmap_latency_p50_us", p50, "us");
    let _ = record("rpc", "bitmap_latency_p99_us", p99, "us");
    let _ = record("rpc", "bitmap_requests_per_s", per_second, "requests/s");
    node.shutdown();
    Ok(())
}

/// The queries of `retina bench vfor`: a scan, an aggregate, and a selective filter.
const VFOR_QUERIES: [(&str, &str); 3] = [
    (
        "scan",
        "SELECT sum(ol_amount), sum(ol_quantity) FROM orderline",
    ),
    (
        "group_by",
        "SELECT ol_w_id, ol_d_id, count(*), sum(ol_amount), avg(ol_quantity) \
         FROM orderline GROUP BY ol_w_id, ol_d_id",
    ),
    (
        "filter",
        "SELECT count(*), sum(ol_amount) FROM orderline WHERE ol_i_id < 2000",
    ),
];

fn vfor(rows: usize, deleted_per_mille: u32, runs: usize, shards: u16) -> anyhow::Result<()> {
    use rand::{Rng, SeedableRng};
    use retina_bench::ch::OrderLines;
    use retina_query::{Retina, Visibility};
    use retina_storage::{RowOp, TableOp};
    const FILE_ROWS: u64 = 65_536;
    let catalog = Arc::new(Catalog::from_ddl(REPLAY_DDL, "bench")?);
    let orderline = catalog
        .resolve("orderline")
        .context("the replay DDL has orderline")?;
    let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
    let node = local_node(
        dir.path().join("data"),
        catalog,
        Settings {
            shards,
            file_rows: FILE_ROWS,
            ..Settings::default()
        },
        true,
    )?;
    let h = node.handle().clone();
    let lines: Vec<_> = OrderLines::new(7, 10).take(rows).collect();
    let t = Instant::now();
    for chunk in lines.chunks(10_000) {
        let txn: Vec<_> = chunk
            .iter()
            .map(|r| TableOp {
                table: orderline,
                op: RowOp::Insert(r.clone()),
            })
            .collect();
        h.submit(&[txn], &[])?;
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let doomed: Vec<_> = lines
        .iter()
        .filter(|_| rng.random_range(0..1000) < deleted_per_mille)
        .map(|r| TableOp {
            table: orderline,
            op: RowOp::Delete(r.clone()),
        })
        .collect();
    let deleted = doomed.len();
    let mut last = 0;
    for chunk in doomed.chunks(1000) {
        last = *h.submit(&[chunk.to_vec()], &[])?.end();
    }
    anyhow::ensure!(h.wait_visible(last, Duration::from_secs(120)));
    println!(
        "loaded {rows} order lines and deleted {deleted} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let addr = node.coordinator_addr().context("the node listens")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let retina = Retina::connect(addr, "")?;
        // Wait until every full file is combined: the plan lists them all.
        let full = (rows as u64 / FILE_ROWS / u64::from(shards)) * u64::from(shards);
        let start = Instant::now();
        loop {
            let q = retina.connection().begin().await?;
            let plan = retina.connection().plan(q.id, "orderline").await?;
            retina.connection().end(q.id).await?;
            if plan.files.len() as u64 >= full.saturating_sub(u64::from(shards)) {
                println!(
                    "{} regular files, {} row groups",
                    plan.files.len(),
                    plan.files.iter().map(|f| f.row_groups.len()).sum::<usize>()
                );
                break;
            }
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(120),
                "files not combined"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (name, sql) in VFOR_QUERIES {
            let mut on = Vec::new();
            let mut off = Vec::new();
            for run in 0..=runs {
                for (mode, out) in [(Visibility::Check, &mut on), (Visibility::Ignore, &mut off)] {
                    let session = retina.begin_with(mode).await?;
                    let t = Instant::now();
                    session.collect(sql).await?;
                    // The first run of each warms the caches.
                    if run > 0 {
                        out.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
            }
            let (on, off) = (median(&mut on), median(&mut off));
            let overhead = (on / off - 1.0) * 100.0;
            println!(
                "{name:>9}: {on:7.1} ms with visibility, {off:7.1} ms without: {overhead:+.1}%"
            );
            let _ = record("vfor", &format!("{name}_ms_check"), on, "ms");
            let _ = record("vfor", &format!("{name}_ms_ignore"), off, "ms");
            let _ = record("vfor", &format!("{name}_overhead_pct"), overhead, "%");
        }
        anyhow::Ok(())
    })?;
    node.shutdown();
    Ok(())
}
