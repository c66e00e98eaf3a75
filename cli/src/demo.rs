//! `retina demo`: the whole system on a generated CH-benCHmark workload, embedded in one
//! process. It generates a small CH-benCHmark dataset (the twelve tables of
//! `bench/ddl/ch.sql`) as Debezium JSON in a temporary directory, starts a node, replays the
//! initial load through the Debezium sink, then appends the NewOrder / Payment / Delivery stream
//! to the same file at a steady rate while the node follows it, with a live display of rows
//! replayed, rows/s, HWM, freshness (a monitor querying `max(fresh_ts)` through the Cap'n Proto
//! query path every 100 ms) and memory. At the end it runs CH queries through `retina sql`'s path
//! (the DataFusion connector), prints their results and a summary, and removes the directory
//! unless `--keep` is given.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::chgen::{ChGen, DDL, DebeziumWriter, FreshClock, InsertOp, schemas};
use retina_node::catalog::Catalog;
use retina_node::node::NodeStatus;
use retina_node::settings::Settings;
use retina_node::sink::SinkOptions;
use retina_query::{Format, Retina, write_batches};

use crate::ch::{QUERIES, scale};
use crate::measure::{self, file_sink, local_node, now_us, percentile, rss_mib};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Seconds the change stream runs after the initial load.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Rows per second the change stream is emitted at.
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Dataset size: `small` (1 warehouse, 300 customers and orders per district, 10,000
    /// items), `tiny` (for tests), `tpcc` (1 warehouse at TPC-C's full size) or `tpcc:N`
    /// (N warehouses).
    #[arg(long, default_value = "small")]
    scale: String,
    /// Replayer shards (default: one per core).
    #[arg(long)]
    shards: Option<u16>,
    /// Keep the data directory instead of removing it at the end.
    #[arg(long)]
    keep: bool,
}

/// Rows per load transaction (a snapshot read is replayed in transactions of this size).
const LOAD_ROWS_PER_TXN: usize = 1000;
/// How often the display refreshes.
const DISPLAY_EVERY: Duration = Duration::from_millis(250);

/// What the stream writer and the monitor report to the display.
#[derive(Default)]
struct Progress {
    /// Source transactions written to the change file.
    txns_written: AtomicU64,
    /// Freshness samples in milliseconds.
    freshness_ms: Mutex<Vec<f64>>,
}

impl Progress {
    /// Freshness P50 and P99 so far, and the samples.
    fn freshness(&self) -> (Option<f64>, Option<f64>, usize) {
        let mut f = self.freshness_ms.lock().expect("freshness lock").clone();
        (percentile(&mut f, 50), percentile(&mut f, 99), f.len())
    }
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let scale = scale(&args.scale)?;
    let dir = tempfile::Builder::new()
        .prefix("retina-demo-")
        .tempdir()
        .context("creating the demo directory")?;
    let path = dir.path();
    let started = Instant::now();
    println!("retina demo: CH-benCHmark, replayed into Parquet, queried while it changes");
    println!("  files in {}", path.display());

    // 1. The dataset: DDL and the initial load as Debezium snapshot reads.
    std::fs::write(path.join("ch.sql"), DDL)?;
    let changes = path.join("changes.json");
    let mut generator = ChGen::new(scale, 42);
    let mut writer = DebeziumWriter::new(schemas());
    let (load_txns, load_rows) = {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&changes)?);
        let (mut txns, mut rows) = (0u64, 0u64);
        while let Some(txn) = generator.next_load_txn(LOAD_ROWS_PER_TXN) {
            writer.write_txn(&mut out, &txn, InsertOp::Read)?;
            txns += 1;
            rows += txn.len() as u64;
        }
        out.flush()?;
        (txns, rows)
    };
    println!(
        "  generated the initial load: {load_rows} rows in 12 tables ({:.0} MiB of Debezium JSON)",
        std::fs::metadata(&changes)?.len() as f64 / (1 << 20) as f64
    );

    // 2. A node following the change file.
    let settings = Settings {
        shards: args.shards.unwrap_or(0),
        // Small files, so the demo's few hundred thousand rows become Parquet files and GC
        // has something to do within a minute.
        block_rows: 8192,
        row_group_rows: 16_384,
        file_rows: 65_536,
        gc_interval_ms: 5000,
        ..Settings::default()
    };
    let shards = settings.shard_count();
    let options = SinkOptions {
        follow: true,
        checkpoint_interval: Some(Duration::from_millis(settings.checkpoint_interval_ms)),
        ..file_sink(
            &settings,
            changes.clone(),
            path.join("data/dead-letter.jsonl"),
        )
    };
    let node = local_node(
        path.join("data"),
        Arc::new(Catalog::from_ddl(DDL, "ch.sql")?),
        settings,
        true,
    )?;
    let addr = node.coordinator_addr().expect("the node listens");
    let handle = node.handle().clone();
    let status = handle.status().clone();
    let sink = retina_node::sink::spawn(handle.clone(), options)?;
    println!("  node: {shards} shards, queries on {addr} (Cap'n Proto)");
    let load_start = Instant::now();
    wait_applied(&status, load_txns, Duration::from_secs(300))?;
    let load_s = load_start.elapsed().as_secs_f64();
    println!(
        "  replayed the load in {load_s:.1} s ({:.0} rows/s)",
        load_rows as f64 / load_s
    );

    // 3. The change stream at a steady rate, with the monitor and the live display.
    let progress = Arc::new(Progress::default());
    let stream_end = Instant::now() + Duration::from_secs(args.seconds);
    let stream = {
        let progress = progress.clone();
        let changes = changes.clone();
        let rate = args.rate;
        std::thread::Builder::new()
            .name("retina-demo-source".into())
            .spawn(move || -> anyhow::Result<()> {
                let mut out = std::fs::OpenOptions::new().append(true).open(&changes)?;
                let mut clock = FreshClock::Wall;
                let start = Instant::now();
                let mut buf = Vec::with_capacity(1 << 20);
                let mut rows = 0u64;
                while Instant::now() < stream_end {
                    let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                    if rows >= due {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    buf.clear();
                    while rows < due {
                        let txn = generator.next_txn(clock.now_us());
                        writer.write_txn(&mut buf, &txn, InsertOp::Create)?;
                        rows += txn.len() as u64;
                        progress.txns_written.fetch_add(1, Ordering::Relaxed);
                    }
                    // Whole transactions at a time: the sink never reads half of one.
                    out.write_all(&buf)?;
                }
                Ok(())
            })?
    };
    let monitor = {
        let progress = progress.clone();
        std::thread::Builder::new()
            .name("retina-demo-monitor".into())
            .spawn(move || monitor_freshness(addr, &progress, stream_end))?
    };
    let rows_before = status.rows_applied.load(Ordering::Relaxed);
    display(&status, &progress, args.seconds, stream_end);
    stream
        .join()
        .map_err(|_| anyhow::anyhow!("the stream writer panicked"))??;
    monitor
        .join()
        .map_err(|_| anyhow::anyhow!("the monitor panicked"))??;
    let stream_txns = progress.txns_written.load(Ordering::Relaxed);
    wait_applied(&status, load_txns + stream_txns, Duration::from_secs(120))?;
    let stream_rows = status.rows_applied.load(Ordering::Relaxed) - rows_before;

    // 4. CH queries through the DataFusion connector, at one snapshot.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let retina = Retina::connect(addr, "")?;
        let session = retina.begin().await?;
        println!(
            "\nCH queries at snapshot {} (every transaction replayed so far):",
            session.snapshot()
        );
        for (title, sql) in QUERIES {
            let start = Instant::now();
            let batches = session.collect(sql).await?;
            println!(
                "\n{title} ({:.1} ms)",
                start.elapsed().as_secs_f64() * 1000.0
            );
            write_batches(&mut std::io::stdout().lock(), Format::Table, &batches)?;
        }
        anyhow::Ok(())
    })?;

    // 5. Summary.
    let (p50, p99, samples) = progress.freshness();
    let parquet = count_parquet(&path.join("data/lake/tables"));
    println!("\nsummary");
    println!(
        "  load:   {load_rows} rows in {load_txns} transactions, {load_s:.1} s ({:.0} rows/s)",
        load_rows as f64 / load_s
    );
    println!(
        "  stream: {stream_rows} rows in {stream_txns} transactions over {} s at {} rows/s asked",
        args.seconds, args.rate
    );
    match (p50, p99) {
        (Some(p50), Some(p99)) => println!(
            "  freshness (query start - newest fresh_ts, {samples} samples): P50 {p50:.1} ms, P99 {p99:.1} ms"
        ),
        _ => println!("  freshness: no sample"),
    }
    println!(
        "  HWM {}, {parquet} Parquet files, checkpoint {}, {} GC runs, {} files rewritten by storage GC, {:.0} MiB resident",
        status.hwm.load(Ordering::Relaxed),
        status.checkpoint_id.load(Ordering::Relaxed),
        status.gc_runs.load(Ordering::Relaxed),
        status.files_rewritten.load(Ordering::Relaxed),
        rss_mib()
    );
    if let Some(e) = status.error() {
        println!("  replay stopped: {e}");
    }

    let _ = sink.stop_and_join();
    node.shutdown();
    println!("  done in {:.0} s", started.elapsed().as_secs_f64());
    if args.keep {
        let kept = dir.keep();
        println!(
            "  kept {}: ch.sql, changes.json (Debezium JSON), data/lake/tables/*/*.parquet (read them \
             with any Parquet reader), data/checkpoints",
            kept.display()
        );
    } else {
        println!(
            "  removed {} (pass --keep to look at the files)",
            path.display()
        );
    }
    Ok(())
}

/// Waits until `txns` source transactions are visible, or says what stopped replay.
fn wait_applied(status: &NodeStatus, txns: u64, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    while status.txns_applied.load(Ordering::Acquire) < txns {
        if let Some(e) = status.error() {
            anyhow::bail!("replay stopped: {e}");
        }
        anyhow::ensure!(
            start.elapsed() < timeout,
            "replay did not reach {txns} transactions in {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(())
}

/// The freshness monitor until `end`, on a runtime of its own; until a district row of the
/// stream is visible, max(fresh_ts) is the load's.
fn monitor_freshness(
    addr: std::net::SocketAddr,
    progress: &Progress,
    end: Instant,
) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let started = now_us();
    runtime.block_on(async {
        let retina = Retina::connect(addr, "")?;
        measure::monitor_freshness(&retina, end, started, |ms| {
            progress
                .freshness_ms
                .lock()
                .expect("freshness lock")
                .push(ms)
        })
        .await
    })
}

/// The live display until `end`: one line redrawn in place on a terminal, a line every five
/// seconds otherwise.
fn display(status: &NodeStatus, progress: &Progress, seconds: u64, end: Instant) {
    let terminal = std::io::stdout().is_terminal();
    let start = Instant::now();
    let (mut last_rows, mut last_at) = (status.rows_applied.load(Ordering::Relaxed), start);
    let mut rate = 0.0;
    let mut last_line = start;
    while Instant::now() < end {
        std::thread::sleep(DISPLAY_EVERY);
        let rows = status.rows_applied.load(Ordering::Relaxed);
        let dt = last_at.elapsed().as_secs_f64();
        if dt >= 1.0 {
            rate = (rows - last_rows) as f64 / dt;
            (last_rows, last_at) = (rows, Instant::now());
        }
        let (p50, p99, _) = progress.freshness();
        let memory: u64 = status
            .shard_memory
            .iter()
            .map(|m| {
                m.index_bytes.load(Ordering::Relaxed)
                    + m.write_buffer_bytes.load(Ordering::Relaxed)
                    + m.visibility_bytes.load(Ordering::Relaxed)
            })
            .sum();
        let done = (start.elapsed().as_secs_f64() / seconds.max(1) as f64).min(1.0);
        const WIDTH: usize = 24;
        let filled = (done * WIDTH as f64) as usize;
        let bar = format!("{}{}", "#".repeat(filled), ".".repeat(WIDTH - filled));
        let fresh = match (p50, p99) {
            (Some(a), Some(b)) => format!("{a:.1}/{b:.1} ms"),
            _ => "-".into(),
        };
        let line = format!(
            "[{bar}] {:>9} rows replayed  {:>7.0} rows/s  HWM {:>8}  freshness P50/P99 {fresh:>14}  memory {:>5.1} MiB (RSS {:.0} MiB)",
            rows,
            rate,
            status.hwm.load(Ordering::Relaxed),
            memory as f64 / (1 << 20) as f64,
            rss_mib()
        );
        if terminal {
            print!("\r{line}");
            let _ = std::io::stdout().flush();
        } else if last_line.elapsed() >= Duration::from_secs(5) {
            println!("{line}");
            last_line = Instant::now();
        }
    }
    if terminal {
        println!();
    }
}

/// Parquet files under `dir` (combined files, not write-buffer blocks).
fn count_parquet(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|table| {
            std::fs::read_dir(table.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter(|f| f.path().extension().is_some_and(|e| e == "parquet"))
                .count()
        })
        .sum()
}
