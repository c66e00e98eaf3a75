//! `retina bench consistency`: CH-style queries on the static loaded data (with and without the
//! visibility check), then while the replay workload changes it at a fixed rate (bench/README.md).

use std::time::{Duration, Instant};

use retina_bench::results::record;
use retina_node::settings::Settings;

use super::common::{loaded_replay_node, spawn_driver};
use crate::measure::median;

pub(super) fn run(preload: usize, rate: u64, runs: usize, shards: u16) -> anyhow::Result<()> {
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
    let driver = spawn_driver(node.handle().clone(), txns, rate);
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
    driver.stop()?;
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
