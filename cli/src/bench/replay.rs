//! `retina bench replay`: replay throughput on the CH-benCHmark-shaped replay workload with each
//! shard count, end to end from Debezium JSON (file source, parsing included), the same JSON
//! from a Kafka broker on loopback (`--kafka`), and from op batches encoded before the clock
//! starts (the shards alone). `--lake s3://...` puts the lake in a bucket (each run under its
//! own prefix) instead of a local folder.

use std::io::BufWriter;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::ch::{REPLAY_DDL, replay_workload, write_debezium};
use retina_bench::results::record;
use retina_node::catalog::Catalog;
use retina_node::lake::LakeSpec;
use retina_node::settings::Settings;
use retina_node::sink::kafka::{KafkaSpec, produce_lines};
use retina_node::sink::{SourceSpec, run_sink};

use crate::measure::{file_sink, median, node_with_lake, proc_stat_cpu, proc_stat_fields};

/// CPU time per kind of thread of this process while a replay runs, from
/// `/proc/self/task/*/stat`, sampled every 20 ms so that threads which end with the run (the
/// decode lanes, the source reader) still count (less what such a thread used in its last
/// 20 ms). Kinds are thread names without their number;
/// the thread that started the sampler (it runs the sink) is `sink`.
struct ThreadCpu {
    stop: Arc<std::sync::atomic::AtomicBool>,
    sampler: std::thread::JoinHandle<std::collections::HashMap<String, f64>>,
}

impl ThreadCpu {
    /// Kinds in the order they are reported.
    const KINDS: [&'static str; 5] = ["decode", "sink", "shard", "writer", "source"];

    fn start() -> ThreadCpu {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let me = std::fs::read_link("/proc/thread-self")
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse::<u64>().ok());
        let done = stop.clone();
        let first = Self::sample();
        let sampler = std::thread::spawn(move || {
            let mut last = first.clone();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(Duration::from_millis(20));
                last.extend(Self::sample());
            }
            last.extend(Self::sample());
            let mut per = std::collections::HashMap::new();
            for (tid, (name, secs)) in last {
                let before = first.get(&tid).map_or(0.0, |(_, s)| *s);
                let kind = if Some(tid) == me {
                    "sink"
                } else if name.starts_with("retina-decode") {
                    "decode"
                } else if name.starts_with("retina-shard") {
                    "shard"
                } else if name.starts_with("tokio-") || name == "retina-io" {
                    // The I/O thread and its pool encode and write Parquet.
                    "writer"
                } else if name == "retina-source" {
                    "source"
                } else {
                    "other"
                };
                *per.entry(kind.to_owned()).or_insert(0.0) += secs - before;
            }
            per
        });
        ThreadCpu { stop, sampler }
    }

    /// Each thread's name and CPU seconds (user and system) so far.
    fn sample() -> std::collections::HashMap<u64, (String, f64)> {
        let mut out = std::collections::HashMap::new();
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return out;
        };
        for task in tasks.flatten() {
            let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
                continue;
            };
            if let (Some(tid), Some((name, secs))) = (
                task.file_name().to_str().and_then(|t| t.parse().ok()),
                proc_stat_cpu(&stat),
            ) {
                out.insert(tid, (name.to_owned(), secs));
            }
        }
        out
    }

    /// CPU seconds per kind since [`Self::start`].
    fn stop(self) -> std::collections::HashMap<String, f64> {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.sampler.join().unwrap_or_default()
    }
}

/// Minor page faults of this process so far (every thread's, ended ones included), from
/// `/proc/self/stat`.
fn minor_faults() -> u64 {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            // minflt is field 10 of the line: the 8th after the command name.
            let (_, fields) = proc_stat_fields(&stat)?;
            fields.get(7)?.parse().ok()
        })
        .unwrap_or(0)
}

/// Deletes what a run left in an S3 lake (a local lake goes with its data directory).
fn clear_lake(lake: &LakeSpec) -> anyhow::Result<()> {
    use futures::TryStreamExt;
    use object_store::ObjectStoreExt;
    let LakeSpec::S3 {
        bucket,
        prefix,
        options,
    } = lake
    else {
        return Ok(());
    };
    let store = retina_node::lake::s3_lake_store(bucket, prefix, options)
        .map_err(|e| anyhow::anyhow!("the lake {lake}: {e}"))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let objects: Vec<_> = store.list(None).try_collect().await?;
        for o in objects {
            store.delete(&o.location).await?;
        }
        anyhow::Ok(())
    })
    .with_context(|| format!("clearing the lake {lake}"))
}

/// `lake`, or for an S3 lake a prefix `run` below its own, so that every run starts empty.
fn lake_for_run(lake: &LakeSpec, run: &str) -> LakeSpec {
    match lake {
        LakeSpec::S3 {
            bucket,
            prefix,
            options,
        } => LakeSpec::S3 {
            bucket: bucket.clone(),
            prefix: if prefix.is_empty() {
                run.to_owned()
            } else {
                format!("{prefix}/{run}")
            },
            options: options.clone(),
        },
        other => other.clone(),
    }
}

pub(super) fn run(
    shard_counts: &[u16],
    lane_counts: &[usize],
    warehouses: i64,
    new_orders: usize,
    runs: usize,
    kafka: bool,
    lake: LakeSpec,
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
    // The same stream in a Kafka broker on loopback, in Debezium's layout (three partitions
    // per table topic), written before the clock starts.
    let broker = kafka
        .then(retina_bench::kafka::Broker::start)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let kafka_source = match &broker {
        Some(b) => {
            let spec = KafkaSpec::parse(&format!("{}?topic_prefix=ch", b.addr))
                .map_err(anyhow::Error::msg)?;
            let text = std::fs::read_to_string(&json)?;
            let start = Instant::now();
            let written =
                produce_lines(&spec, &catalog, 3, text.lines()).map_err(anyhow::Error::msg)?;
            let records: u64 = written.topics.values().sum();
            println!(
                "produced into Kafka ({}): {records} records in {:.1} s",
                b.addr,
                start.elapsed().as_secs_f64()
            );
            Some(SourceSpec::Kafka(spec))
        }
        None => None,
    };
    println!("lake: {lake}");
    // Without a list, the setting's default, recorded under the names earlier results have.
    let lanes_given = !lane_counts.is_empty();
    let lane_counts = if lanes_given {
        lane_counts.to_vec()
    } else {
        vec![Settings::default().decode_lanes()]
    };
    println!(
        "{:>7} {:>6} {:>22} {:>22} {:>22}",
        "shards",
        "lanes",
        "JSON rows/s (median)",
        "Kafka rows/s (median)",
        "batches rows/s (median)"
    );
    for &shards in shard_counts {
        let settings = Settings {
            shards,
            ..Settings::default()
        };
        let mut from_json = vec![Vec::new(); lane_counts.len()];
        let mut from_kafka = Vec::new();
        let mut from_batches = Vec::new();
        let run_lake = |data: &std::path::Path| {
            lake_for_run(
                &lake,
                &data.file_name().expect("a run folder").to_string_lossy(),
            )
        };
        let start_node = |data: &std::path::Path| {
            node_with_lake(
                data.to_path_buf(),
                run_lake(data),
                catalog.clone(),
                settings.clone(),
                false,
            )
        };
        // One timed replay through the sink (`what` names the source in errors): rows/s until
        // HWM passes its last transaction.
        let timed_sink_run =
            |data: &std::path::Path,
             options: &retina_node::sink::SinkOptions,
             what: &str|
             -> anyhow::Result<(f64, std::collections::HashMap<String, f64>, u64)> {
                let node = start_node(data)?;
                let start = Instant::now();
                let faults = minor_faults();
                let cpu = ThreadCpu::start();
                let report = run_sink(node.handle(), options);
                anyhow::ensure!(
                    report.stopped_by.is_none(),
                    "replay{what} stopped: {:?}",
                    report.stopped_by
                );
                let last = report
                    .last_ts
                    .with_context(|| format!("nothing replayed{what}"))?;
                anyhow::ensure!(
                    node.handle().wait_visible(last, Duration::from_secs(600)),
                    "HWM did not reach {last}"
                );
                anyhow::ensure!(
                    report.transactions == txns.len() as u64,
                    "{} of {} transactions came{what}",
                    report.transactions,
                    txns.len()
                );
                let rate = rows as f64 / start.elapsed().as_secs_f64();
                let cpu = cpu.stop();
                let faults = minor_faults().saturating_sub(faults);
                node.shutdown();
                std::fs::remove_dir_all(data)?;
                clear_lake(&run_lake(data))?;
                Ok((rate, cpu, faults))
            };
        // CPU µs per row by thread kind, per run at the default lane count.
        let mut cpu_per_row: std::collections::HashMap<String, Vec<f64>> = Default::default();
        // Page faults per row (first touches of memory: their cost depends on the machine, and
        // in a virtual machine on its host, so they explain runs of one build that differ).
        let mut faults_per_row = Vec::new();
        for run in 0..runs {
            // From Debezium JSON: the decode lanes read and parse, the sink groups, routes and
            // encodes.
            for (lanes, from_json) in lane_counts.iter().zip(&mut from_json) {
                let data = dir.path().join(format!("json-{shards}-{lanes}-{run}"));
                let mut options = file_sink(&settings, json.clone(), data.join("dead.jsonl"));
                options.decode_lanes = *lanes;
                let (rate, cpu, faults) = timed_sink_run(&data, &options, "")?;
                from_json.push(rate);
                if *lanes == Settings::default().decode_lanes() {
                    faults_per_row.push(faults as f64 / rows as f64);
                    let total: f64 = cpu.values().sum();
                    for (kind, secs) in cpu.into_iter().chain([("total".to_owned(), total)]) {
                        let per_row = secs * 1e6 / rows as f64;
                        cpu_per_row.entry(kind).or_default().push(per_row);
                    }
                }
            }

            // The same JSON from Kafka: fetching and rebuilding transactions across partitions.
            if let Some(source) = &kafka_source {
                let data = dir.path().join(format!("kafka-{shards}-{run}"));
                let mut options = file_sink(&settings, json.clone(), data.join("dead.jsonl"));
                options.source = source.clone();
                from_kafka.push(timed_sink_run(&data, &options, " from Kafka")?.0);
            }

            // From pre-encoded op batches: timestamps, routing and encoding before the clock.
            let data = dir.path().join(format!("batches-{shards}-{run}"));
            let node = start_node(&data)?;
            let h = node.handle();
            let mut groups = Vec::new();
            let mut last = 0;
            for group in txns.chunks(settings.max_group_txns) {
                let range = h.allocate(group.len() as u64)?;
                last = *range.end();
                groups.push(h.encode_group(group, range)?);
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
            clear_lake(&run_lake(&data))?;
        }
        let b = median(&mut from_batches);
        // The local lake keeps the names earlier results have.
        let on = if lake.is_remote() { "_s3_lake" } else { "" };
        let k = (!from_kafka.is_empty()).then(|| median(&mut from_kafka));
        let shown = k.map_or("-".to_owned(), |k| format!("{k:.0}"));
        for (lanes, from_json) in lane_counts.iter().zip(&mut from_json) {
            let j = median(from_json);
            println!("{shards:>7} {lanes:>6} {j:>22.0} {shown:>22} {b:>22.0}");
            if lanes_given {
                let _ = record(
                    "replay",
                    &format!("json_rows_per_s_{shards}_shards_{lanes}_lanes{on}"),
                    j,
                    "rows/s",
                );
            }
            if *lanes == Settings::default().decode_lanes() {
                let _ = record(
                    "replay",
                    &format!("json_rows_per_s_{shards}_shards{on}"),
                    j,
                    "rows/s",
                );
            }
        }
        // Where the JSON replay's CPU goes (medians over the runs).
        let mut line = Vec::new();
        for kind in ThreadCpu::KINDS.iter().chain(&["other", "total"]) {
            let Some(mut v) = cpu_per_row.remove(*kind) else {
                continue;
            };
            let us = median(&mut v);
            line.push(format!("{kind} {us:.2}"));
            let _ = record(
                "replay",
                &format!("json_cpu_us_per_row_{shards}_shards_{kind}{on}"),
                us,
                "us/row",
            );
        }
        println!("        JSON replay, CPU µs per row: {}", line.join(", "));
        if !faults_per_row.is_empty() {
            let faults = median(&mut faults_per_row);
            println!("        JSON replay, page faults per row: {faults:.3}");
            let _ = record(
                "replay",
                &format!("json_page_faults_per_row_{shards}_shards{on}"),
                faults,
                "faults/row",
            );
        }
        if let Some(k) = k {
            let _ = record(
                "replay",
                &format!("kafka_rows_per_s_{shards}_shards{on}"),
                k,
                "rows/s",
            );
        }
        let _ = record(
            "replay",
            &format!("batches_rows_per_s_{shards}_shards{on}"),
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
