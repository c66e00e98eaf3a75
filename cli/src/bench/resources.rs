//! `retina bench resources`: the process's CPU, resident memory and memory by structure while the
//! replay workload runs at fixed rates (bench/README.md).

use std::time::{Duration, Instant};

use retina_bench::results::record;
use retina_node::settings::Settings;

use super::common::drive_replay_workload;
use crate::measure::{proc_stat_cpu, rss_mib};

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    proc_stat_cpu(&stat).map_or(0.0, |(_, secs)| secs)
}

pub(super) fn run(rates: &[u64], seconds: u64, shards: u16) -> anyhow::Result<()> {
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
        let (_dir, node, driver) = drive_replay_workload(settings, rate, seconds)?;
        // The first seconds are the driver catching up; measure after them.
        std::thread::sleep(Duration::from_secs(2));
        let (cpu0, t0) = (cpu_seconds(), Instant::now());
        std::thread::sleep(Duration::from_secs(seconds.saturating_sub(2).max(1)));
        let cpu = (cpu_seconds() - cpu0) / t0.elapsed().as_secs_f64() * 100.0;
        driver.stop()?;
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
        let rss = rss_mib();
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
