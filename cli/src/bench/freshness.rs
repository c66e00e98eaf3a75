//! `retina bench freshness`: freshness as bench/README.md defines it, the replay workload
//! emitted at fixed rates while a monitor runs `SELECT max(fresh_ts) FROM district` through the
//! DataFusion connector every 100 ms; with `--kafka`, the workload written into a Kafka broker on
//! loopback and read from there by the node's sink (emit time to visible).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use retina_bench::kafka::Broker;
use retina_bench::results::record;
use retina_node::settings::Settings;
use retina_node::sink::SourceSpec;
use retina_node::sink::kafka::KafkaSpec;

use super::common::{WARM_UP_US, drive_replay_workload, loaded_replay_node, spawn_kafka_driver};
use crate::measure::{file_sink, median, monitor_freshness, now_us, percentile};

pub(super) fn run(rates: &[u64], seconds: u64, shards: u16, kafka: bool) -> anyhow::Result<()> {
    println!(
        "{:>10} {:>14} {:>14} {:>9}{}",
        "rows/s",
        "P50 ms",
        "P99 ms",
        "samples",
        if kafka { "  (through Kafka)" } else { "" }
    );
    for &rate in rates {
        let settings = Settings {
            shards,
            ..Settings::default()
        };
        // Through Kafka: the driver writes Debezium JSON into a broker on loopback, and the
        // node's sink reads it from there (fetching, parsing, rebuilding transactions).
        let (_dir, node, driver, through) = if kafka {
            let broker = Broker::start().map_err(anyhow::Error::msg)?;
            let (dir, node, txns) = loaded_replay_node(settings.clone(), rate, seconds, 0)?;
            let spec = KafkaSpec::parse(&format!("{}?topic_prefix=ch", broker.addr))
                .map_err(anyhow::Error::msg)?;
            let catalog = node.handle().catalog().clone();
            let driver = spawn_kafka_driver(&spec, catalog, txns, rate)?;
            // The driver creates the topics with its first transactions.
            std::thread::sleep(Duration::from_millis(200));
            let mut options = file_sink(&settings, PathBuf::new(), dir.path().join("dead.jsonl"));
            options.source = SourceSpec::Kafka(spec);
            options.follow = true;
            let sink = retina_node::sink::spawn(node.handle().clone(), options)?;
            (dir, node, driver, Some((sink, broker)))
        } else {
            let (dir, node, driver) = drive_replay_workload(settings, rate, seconds)?;
            (dir, node, driver, None)
        };
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
        if let Some((sink, broker)) = through {
            let report = sink
                .stop_and_join()
                .map_err(|_| anyhow::anyhow!("the sink panicked"))?;
            anyhow::ensure!(
                report.stopped_by.is_none(),
                "replay from Kafka stopped: {:?}",
                report.stopped_by
            );
            drop(broker);
        }
        anyhow::ensure!(!samples.is_empty(), "no freshness sample");
        let p50 = median(&mut samples);
        let p99 = percentile(&mut samples, 99).expect("at least one sample");
        println!("{rate:>10} {p50:>14.1} {p99:>14.1} {:>9}", samples.len());
        let via = if kafka { "_kafka" } else { "" };
        let _ = record(
            "freshness",
            &format!("p50_ms_at_{rate}_rows_per_s{via}"),
            p50,
            "ms",
        );
        let _ = record(
            "freshness",
            &format!("p99_ms_at_{rate}_rows_per_s{via}"),
            p99,
            "ms",
        );
        node.shutdown();
    }
    Ok(())
}
