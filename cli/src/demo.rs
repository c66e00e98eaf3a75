//! `retina demo`: the storage engine on a generated workload, end to end on one core.
//!
//! Until the node (coordinator, sink, shards) and the query path exist, the demo drives one
//! shard directly: it replays NewOrder-shaped transactions of order lines, updates and deletes
//! some of them, flushes blocks and combines files into Parquet, reads snapshots back with VFoR
//! and runs memory GC, printing what each step did.

use std::time::Instant;

use anyhow::Context;
use arrow::array::AsArray;
use arrow::datatypes::Decimal128Type;
use futures::executor::block_on;
use retina_bench::ch::{OrderLines, orderline_schema};
use retina_storage::file::local_store;
use retina_storage::{RowOp, Shard, StorageConfig, TableOp, Timestamp, Value};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Order lines to replay.
    #[arg(long, default_value_t = 2_000_000)]
    rows: usize,
    /// Keep the data directory instead of removing it at the end.
    #[arg(long)]
    keep: bool,
}

const LINES_PER_TXN: usize = 10;

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new()
        .prefix("retina-demo-")
        .tempdir()
        .context("creating the demo directory")?;
    let store = local_store(dir.path())?;
    let config = StorageConfig {
        file_rows: 1 << 19,
        ..StorageConfig::default()
    };
    let mut shard = Shard::new(0, config)?;
    let schema = orderline_schema();
    let t = shard.add_table(schema.clone());
    println!(
        "retina demo: one storage shard, table `orderline`, data in {}",
        dir.path().display()
    );

    // 1. Replay: transactions of order lines, in timestamp order.
    let rows: Vec<Vec<Value>> = OrderLines::new(42, 10).take(args.rows).collect();
    let txns: Vec<Vec<_>> = rows
        .chunks(LINES_PER_TXN)
        .map(|c| {
            c.iter()
                .map(|r| TableOp {
                    table: t,
                    op: RowOp::Insert(r.clone()),
                })
                .collect()
        })
        .collect();
    let mut ts = Timestamp::GENESIS;
    let secs = replay(&mut shard, &mut ts, txns)?;
    println!(
        "replayed {} rows in {} transactions: {:.0} rows/s ({:.2} s)",
        rows.len(),
        ts.get() - 1,
        rows.len() as f64 / secs,
        secs
    );
    let after_inserts = ts;

    // 2. Updates (deliveries set ol_delivery_d) and deletes, as their own transactions.
    let updates = rows.chunks(LINES_PER_TXN).step_by(4).map(|c| {
        c.iter()
            .map(|r| {
                let mut after = r.clone();
                after[6] = Value::Timestamp(1_767_300_000_000_000);
                TableOp {
                    table: t,
                    op: RowOp::Update {
                        before: r.clone(),
                        after,
                    },
                }
            })
            .collect::<Vec<_>>()
    });
    let deletes = rows.chunks(LINES_PER_TXN).skip(1).step_by(10).map(|c| {
        c.iter()
            .map(|r| TableOp {
                table: t,
                op: RowOp::Delete(r.clone()),
            })
            .collect::<Vec<_>>()
    });
    let txns: Vec<_> = updates.chain(deletes).collect();
    let changed: usize = txns.iter().map(|t| t.len()).sum();
    let secs = replay(&mut shard, &mut ts, txns)?;
    println!(
        "updated and deleted {changed} rows: {:.0} rows/s",
        changed as f64 / secs
    );
    print_memory(&shard);

    // 3. Flush full blocks and combine full virtual files into Parquet.
    let start = Instant::now();
    block_on(shard.flush_and_combine(store.as_ref()))?;
    block_on(shard.flush_and_combine(store.as_ref()))?;
    println!(
        "flushed and combined into Parquet in {:.2} s: {} files, {:.1} MiB",
        start.elapsed().as_secs_f64(),
        count_files(dir.path(), "parquet"),
        dir_bytes(dir.path()) as f64 / (1 << 20) as f64
    );

    // 4. Snapshot reads with VFoR: the same table at three points in time.
    for (label, at) in [
        ("after the first transaction", Timestamp::new(2)?),
        ("after the inserts", after_inserts),
        ("now", ts),
    ] {
        let start = Instant::now();
        let snap = shard.snapshot(t, at)?;
        let batches = block_on(snap.read(store.as_ref(), Some(&[8])))?;
        let visible: usize = batches.iter().map(|b| b.num_rows()).sum();
        let amount: i128 = batches
            .iter()
            .map(|b| {
                b.column(0)
                    .as_primitive::<Decimal128Type>()
                    .values()
                    .iter()
                    .sum::<i128>()
            })
            .sum();
        println!(
            "snapshot {at:>7} ({label}): {visible:>8} rows visible, sum(ol_amount) = {}.{:02}, read in {:.0} ms",
            amount / 100,
            amount % 100,
            start.elapsed().as_secs_f64() * 1e3
        );
    }

    // 5. Memory GC: fold deletes into base bitmaps, drop index versions nothing can see.
    let dropped = shard.gc(ts);
    println!("memory GC at {ts}: dropped {dropped} index versions");
    print_memory(&shard);
    let (stored, deleted) = shard.row_counts(t)?;
    println!(
        "rows stored {stored}, deleted {deleted}, live keys {}",
        shard.live_keys(t)?
    );

    if args.keep {
        let kept = dir.keep();
        println!("kept the data in {}", kept.display());
    } else {
        println!(
            "removed {} (pass --keep to look at the files)",
            dir.path().display()
        );
    }
    Ok(())
}

/// Applies each transaction at the next timestamp; the seconds it took.
fn replay(
    shard: &mut Shard,
    ts: &mut Timestamp,
    txns: Vec<Vec<TableOp<Vec<Value>>>>,
) -> anyhow::Result<f64> {
    let start = Instant::now();
    for ops in &txns {
        *ts = ts.next()?;
        shard.apply(*ts, ops)?;
    }
    Ok(start.elapsed().as_secs_f64())
}

fn print_memory(shard: &Shard) {
    let m = shard.memory();
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "memory: index {:.1} MiB, write buffer {:.1} MiB, visibility {:.2} MiB",
        mib(m.index_bytes),
        mib(m.write_buffer_bytes),
        mib(m.visibility_bytes)
    );
}

fn walk(dir: &std::path::Path, f: &mut dyn FnMut(&std::path::Path)) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, f);
            } else {
                f(&p);
            }
        }
    }
}

fn count_files(dir: &std::path::Path, ext: &str) -> usize {
    let mut n = 0;
    walk(dir.join("tables").as_path(), &mut |p| {
        if p.extension().is_some_and(|e| e == ext) && !p.to_string_lossy().contains("/buffer/") {
            n += 1;
        }
    });
    n
}

fn dir_bytes(dir: &std::path::Path) -> u64 {
    let mut n = 0;
    walk(dir, &mut |p| n += p.metadata().map_or(0, |m| m.len()));
    n
}
