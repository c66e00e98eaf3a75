//! `retina bench freshness`: freshness as bench/README.md defines it, the replay workload
//! emitted at fixed rates while a monitor runs `SELECT max(fresh_ts) FROM district` through the
//! DataFusion connector every 100 ms.

use std::time::{Duration, Instant};

use retina_bench::results::record;
use retina_node::settings::Settings;

use super::common::{WARM_UP_US, drive_replay_workload};
use crate::measure::{median, monitor_freshness, now_us, percentile};

pub(super) fn run(rates: &[u64], seconds: u64, shards: u16) -> anyhow::Result<()> {
    println!(
        "{:>10} {:>14} {:>14} {:>9}",
        "rows/s", "P50 ms", "P99 ms", "samples"
    );
    for &rate in rates {
        let settings = Settings {
            shards,
            ..Settings::default()
        };
        let (_dir, node, driver) = drive_replay_workload(settings, rate, seconds)?;
        let addr = node.coordinator_addr().expect("listening");
        let driver_start = now_us();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let mut samples = runtime.block_on(async {
            let retina = retina_query::Retina::connect(addr, "")?;
            let mut samples = Vec::new();
            let end = Instant::now() + Duration::from_secs(seconds);
            // The first second is warm-up (the driver catching up to its rate).
            monitor_freshness(&retina, end, driver_start + WARM_UP_US, |ms| {
                samples.push(ms)
            })
            .await?;
            anyhow::Ok(samples)
        })?;
        driver.stop()?;
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
