//! `retina bench vfor`: the overhead of the visibility check (VFoR), the same SQL queries over the
//! same order lines through the DataFusion connector with the check on and off.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::ch::REPLAY_DDL;
use retina_bench::results::record;
use retina_node::catalog::Catalog;
use retina_node::settings::Settings;

use crate::measure::{local_node, median};

/// The queries of `retina bench vfor`: a scan, an aggregate, and a selective filter.
const QUERIES: [(&str, &str); 3] = [
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

pub(super) fn run(
    rows: usize,
    deleted_per_mille: u32,
    runs: usize,
    shards: u16,
) -> anyhow::Result<()> {
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
        h.submit(&[txn])?;
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
        last = *h.submit(&[chunk.to_vec()])?.end();
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
        for (name, sql) in QUERIES {
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
