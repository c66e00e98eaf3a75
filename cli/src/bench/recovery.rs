//! `retina bench recovery`: recovery time against the rows applied since the last checkpoint. A
//! node loads the stock table, checkpoints, applies that many more rows and stops without a
//! checkpoint; a restart loads the checkpoint and the same rows are redone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use retina_bench::ch::{REPLAY_DDL, replay_workload};
use retina_bench::results::record;
use retina_node::catalog::Catalog;
use retina_node::settings::Settings;

use crate::measure::local_node;

pub(super) fn run(rows: &[u64], shards: u16) -> anyhow::Result<()> {
    use std::sync::atomic::Ordering;
    let catalog = Arc::new(Catalog::from_ddl(REPLAY_DDL, "replay workload")?);
    println!(
        "{:>12} {:>16} {:>12} {:>14} {:>16}",
        "rows since", "checkpoint MiB", "restore s", "redo s", "recovery s"
    );
    for &since in rows {
        let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
        let data = dir.path().join("data");
        let start = || {
            local_node(
                data.clone(),
                catalog.clone(),
                Settings {
                    shards,
                    ..Settings::default()
                },
                false,
            )
        };
        // About 22 rows per NewOrder.
        let mut txns = replay_workload(11, 1, (since / 20 + 1) as usize);
        let load: Vec<_> = txns
            .drain(..txns.len() - (since / 20 + 1) as usize)
            .collect();
        let mut redo = Vec::new();
        let mut n = 0u64;
        for t in txns {
            if n >= since {
                break;
            }
            n += t.len() as u64;
            redo.push(t);
        }
        let node = start()?;
        let h = node.handle().clone();
        let ts = h.submit(&load)?;
        anyhow::ensure!(h.wait_visible(*ts.end(), Duration::from_secs(120)));
        let id = h
            .checkpoint(Default::default(), Vec::new())?
            .context("a checkpoint was already on its way")?;
        let waited = Instant::now();
        while h.status().checkpoint_id.load(Ordering::Acquire) < id {
            anyhow::ensure!(
                waited.elapsed() < Duration::from_secs(120),
                "the checkpoint did not complete"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let submit_all = |h: &retina_node::node::NodeHandle| -> anyhow::Result<()> {
            for group in redo.chunks(1024) {
                let ts = h.submit(group)?;
                if group.as_ptr_range().end == redo.as_ptr_range().end {
                    anyhow::ensure!(h.wait_visible(*ts.end(), Duration::from_secs(600)));
                }
            }
            Ok(())
        };
        submit_all(&h)?;
        node.shutdown();
        let ckpt_bytes: u64 = std::fs::read_dir(data.join("checkpoints"))?
            .flatten()
            .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
            .filter_map(|f| f.metadata().ok().map(|m| m.len()))
            .sum();

        // The restart: the checkpoint loaded, then the rows after it redone from the source.
        let t0 = Instant::now();
        let node = start()?;
        let restored = t0.elapsed();
        let h = node.handle().clone();
        submit_all(&h)?;
        let total = t0.elapsed();
        node.shutdown();
        let redo_s = (total - restored).as_secs_f64();
        println!(
            "{n:>12} {:>16.1} {:>12.3} {redo_s:>14.3} {:>16.3}",
            ckpt_bytes as f64 / (1 << 20) as f64,
            restored.as_secs_f64(),
            total.as_secs_f64()
        );
        for (name, v, unit) in [
            ("restore_s", restored.as_secs_f64(), "s"),
            ("redo_s", redo_s, "s"),
            ("recovery_s", total.as_secs_f64(), "s"),
            ("checkpoint_bytes", ckpt_bytes as f64, "bytes"),
        ] {
            let _ = record("recovery", &format!("{name}_with_{n}_rows_since"), v, unit);
        }
    }
    Ok(())
}
