//! `retina bench vfor`: the overhead of the visibility check (VFoR), the same SQL queries over the
//! same order lines through the DataFusion connector with the check on and off.

use std::time::Instant;

use anyhow::Context;
use futures::TryStreamExt;
use retina_bench::results::record;

use super::common::order_line_node;
use crate::measure::median;

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

/// One mode's runs of a query, in ms: the whole query, and its planning (until the result
/// stream starts: it waits for the scan's plan, bitmaps and write buffers from the node).
#[derive(Default)]
struct Times {
    whole: Vec<f64>,
    planning: Vec<f64>,
}

pub(super) fn run(
    rows: usize,
    deleted_per_mille: u32,
    runs: usize,
    shards: u16,
) -> anyhow::Result<()> {
    use retina_query::{Retina, Visibility};
    // Runs with another share of deleted rows go to their own file, so that a run without
    // deletes does not stand in for the 1% the README quotes.
    let results = match deleted_per_mille {
        10 => "vfor".to_owned(),
        n => format!("vfor-{n}permille"),
    };
    let (_dir, node) = order_line_node(rows, deleted_per_mille, shards)?;
    let addr = node.coordinator_addr().context("the node listens")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let retina = Retina::connect(addr, "")?;
        for (name, sql) in QUERIES {
            let mut on = Times::default();
            let mut off = Times::default();
            for run in 0..=runs {
                for (mode, out) in [(Visibility::Check, &mut on), (Visibility::Ignore, &mut off)] {
                    let session = retina.begin_with(mode).await?;
                    let t = Instant::now();
                    let stream = session.sql(sql).await?;
                    let planned = t.elapsed();
                    stream.try_collect::<Vec<_>>().await?;
                    // The first run of each warms the caches.
                    if run > 0 {
                        out.whole.push(t.elapsed().as_secs_f64() * 1e3);
                        out.planning.push(planned.as_secs_f64() * 1e3);
                    }
                }
            }
            let (on, on_plan) = (median(&mut on.whole), median(&mut on.planning));
            let (off, off_plan) = (median(&mut off.whole), median(&mut off.planning));
            let overhead = (on / off - 1.0) * 100.0;
            println!(
                "{name:>9}: {on:7.1} ms with visibility, {off:7.1} ms without: {overhead:+.1}% \
                 (planning {on_plan:.2} ms against {off_plan:.2} ms)"
            );
            let _ = record(&results, &format!("{name}_plan_ms_check"), on_plan, "ms");
            let _ = record(&results, &format!("{name}_plan_ms_ignore"), off_plan, "ms");
            let _ = record(&results, &format!("{name}_ms_check"), on, "ms");
            let _ = record(&results, &format!("{name}_ms_ignore"), off, "ms");
            let _ = record(&results, &format!("{name}_overhead_pct"), overhead, "%");
        }
        anyhow::Ok(())
    })?;
    node.shutdown();
    Ok(())
}
