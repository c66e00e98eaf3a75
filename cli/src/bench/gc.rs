//! `retina bench gc`: query latency while memory GC and storage GC run at different intervals
//! (the paper's Figure 14), the replay workload at a fixed rate and a scan query through the
//! DataFusion connector every 100 ms.

use std::time::{Duration, Instant};

use retina_bench::results::record;
use retina_node::settings::Settings;

use super::common::{WARM_UP_US, drive_replay_workload};
use crate::measure::{median, percentile};

pub(super) fn run(
    intervals_ms: &[u64],
    seconds: u64,
    rate: u64,
    shards: u16,
) -> anyhow::Result<()> {
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
        let (_dir, node, driver) = drive_replay_workload(settings, rate, seconds)?;
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
        driver.stop()?;
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
