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
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_node::sink::{OnError, SinkOptions, SourceSpec, run_sink};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
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
    /// Freshness the BENCH.md way: the workload emitted at fixed rates, a monitor querying
    /// `max(fresh_ts)` of the district table through the Cap'n Proto path every 100 ms.
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
        BenchCommand::Replay {
            shards,
            warehouses,
            new_orders,
            runs,
        } => replay(&shards, warehouses, new_orders, runs),
        BenchCommand::Bitmaps {
            requests,
            in_flight,
        } => bitmaps(requests, in_flight),
        BenchCommand::Freshness {
            rates,
            seconds,
            shards,
        } => freshness(&rates, seconds, shards),
    }
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
            Node::start(NodeOptions {
                data_dir: data.to_path_buf(),
                catalog: catalog.clone(),
                settings: settings.clone(),
                listen: None,
                auth_token: None,
            })
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
                groups.push(h.encode_group(group, range, &[]));
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

fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Freshness samples start this long after the driver does.
const WARM_UP_US: i64 = 1_000_000;

fn freshness(rates: &[u64], seconds: u64, shards: u16) -> anyhow::Result<()> {
    use retina_bench::ch::REPLAY_FRESH_TS;
    use retina_storage::{RowOp, Value};
    println!(
        "{:>10} {:>14} {:>14} {:>9}",
        "rows/s", "P50 ms", "P99 ms", "samples"
    );
    for &rate in rates {
        let catalog = Arc::new(Catalog::from_ddl(REPLAY_DDL, "replay workload")?);
        let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
        let node = Node::start(NodeOptions {
            data_dir: dir.path().join("data"),
            catalog,
            settings: Settings {
                shards,
                ..Settings::default()
            },
            listen: Some("127.0.0.1:0".parse()?),
            auth_token: None,
        })?;
        let h = node.handle().clone();
        // About 22 rows per NewOrder; enough for the run and a margin.
        let new_orders = (rate * seconds / 20 + 1000) as usize;
        let mut txns = replay_workload(7, 1, new_orders);
        let load_txns = txns.len() - new_orders;
        let load: Vec<_> = txns.drain(..load_txns).collect();
        let ts = h.submit(&load, &[])?;
        anyhow::ensure!(
            h.wait_visible(*ts.end(), Duration::from_secs(60)),
            "the load did not finish"
        );

        let stop = Arc::new(AtomicBool::new(false));
        let driver = {
            let h = h.clone();
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
                        let stamp = now_us();
                        for op in &mut txn {
                            let col = REPLAY_FRESH_TS[op.table as usize];
                            match &mut op.op {
                                RowOp::Insert(r) | RowOp::Update { after: r, .. } => {
                                    r[col] = Value::Timestamp(stamp)
                                }
                                RowOp::Delete(_) => {}
                            }
                        }
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
        let addr = node.coordinator_addr().expect("listening");
        let lake = dir.path().join("data/lake");
        let driver_start = now_us();
        let mut samples: Vec<f64> = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(512 << 10)
            .spawn(move || async move {
                let store = retina_storage::file::local_store(&lake).expect("the lake");
                let c = retina_node::client::coordinator(addr, "")
                    .await
                    .expect("coordinator");
                let mut samples = Vec::new();
                let end = Instant::now() + Duration::from_secs(seconds);
                while Instant::now() < end {
                    glommio::timer::sleep(Duration::from_millis(100)).await;
                    let start = now_us();
                    let (q, _) = retina_node::client::begin(&c).await.expect("a query");
                    let (_, batches) = retina_node::client::read_at(
                        &c,
                        "",
                        store.as_ref(),
                        "district",
                        q,
                        Some(&[REPLAY_FRESH_TS[2]]),
                    )
                    .await
                    .expect("a read");
                    let _ = retina_node::client::end(&c, q).await;
                    let newest = batches
                        .iter()
                        .filter_map(|b| {
                            arrow::compute::max(
                                b.column(0)
                                    .as_any()
                                    .downcast_ref::<arrow::array::TimestampMicrosecondArray>()?,
                            )
                        })
                        .max()
                        .unwrap_or(0);
                    // The first second is warm-up (the driver catching up to its rate).
                    if newest >= driver_start + WARM_UP_US {
                        samples.push((start - newest) as f64 / 1000.0);
                    }
                }
                samples
            })
            .map_err(|e| anyhow::anyhow!("monitor executor: {e}"))?
            .join()
            .map_err(|e| anyhow::anyhow!("monitor executor: {e}"))?;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        driver
            .join()
            .map_err(|_| anyhow::anyhow!("the driver panicked"))??;
        anyhow::ensure!(!samples.is_empty(), "no freshness sample");
        let p50 = median(&mut samples);
        let p99 = samples[(samples.len() * 99 / 100).min(samples.len() - 1)];
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
    let node = Node::start(NodeOptions {
        data_dir: dir.path().join("data"),
        catalog,
        settings,
        listen: Some("127.0.0.1:0".parse()?),
        auth_token: None,
    })?;
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
    let snapshot = *ts.end();
    let (mut latencies, per_second) =
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(512 << 10)
            .spawn(move || async move {
                let scan = retina_node::client::scan_service(addr, "")
                    .await
                    .expect("scan service");
                let call = |rg: u32| {
                    let mut req = scan.bitmaps_request();
                    req.get().set_file_id(file);
                    req.get().set_snapshot(snapshot);
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
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    println!(
        "bitmap requests over loopback (4,096-row row group, 512-byte bitmap): p50 {p50:.0} us, p99 {p99:.0} us one at a time; {per_second:.0} requests/s with {in_flight} in flight"
    );
    let _ = record("rpc", "bitmap_latency_p50_us", p50, "us");
    let _ = record("rpc", "bitmap_latency_p99_us", p99, "us");
    let _ = record("rpc", "bitmap_requests_per_s", per_second, "requests/s");
    node.shutdown();
    Ok(())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
