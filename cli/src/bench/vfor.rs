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

/// Order lines a run loads unless told otherwise: the runs the README quotes.
pub(super) const DEFAULT_ROWS: usize = 2_097_152;
/// Per mille of them deleted unless told otherwise (1%, as the paper measures).
pub(super) const DEFAULT_DELETED_PER_MILLE: u32 = 10;

/// The results file a run records into: `vfor` for the runs the README quotes, and a file of
/// its own for a run with another number of rows or share of deleted rows (so that a smaller
/// run, or one without deletes, never stands in for them).
fn results_name(rows: usize, deleted_per_mille: u32) -> String {
    let mut name = "vfor".to_owned();
    if rows != DEFAULT_ROWS {
        name += &format!("-{rows}rows");
    }
    if deleted_per_mille != DEFAULT_DELETED_PER_MILLE {
        name += &format!("-{deleted_per_mille}permille");
    }
    name
}

pub(super) fn run(
    rows: usize,
    deleted_per_mille: u32,
    runs: usize,
    shards: u16,
) -> anyhow::Result<()> {
    use retina_query::{Retina, Visibility};
    let results = results_name(rows, deleted_per_mille);
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
