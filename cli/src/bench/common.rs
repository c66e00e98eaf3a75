//! What several `retina bench` measurements share: a node loaded with the replay workload, and
//! a driver thread emitting its NewOrders at a fixed rate.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use retina_bench::ch::{REPLAY_DDL, replay_workload, write_debezium_from};
use retina_node::catalog::Catalog;
use retina_node::node::Node;
use retina_node::settings::Settings;
use retina_node::sink::kafka::{KafkaSpec, Producer};

use crate::measure::{local_node, now_us};

/// Freshness samples start this long after the driver does.
pub(super) const WARM_UP_US: i64 = 1_000_000;

/// A node over a temporary directory with the replay workload's load applied, and a driver
/// emitting its NewOrders at `rate` rows per second, each stamped with the time it is emitted
/// in `fresh_ts`, until stopped (enough for `seconds` and a margin).
pub(super) fn drive_replay_workload(
    settings: Settings,
    rate: u64,
    seconds: u64,
) -> anyhow::Result<(tempfile::TempDir, Node, Driver)> {
    let (dir, node, txns) = loaded_replay_node(settings, rate, seconds, 0)?;
    let driver = spawn_driver(node.handle().clone(), txns, rate);
    Ok((dir, node, driver))
}

/// The replay workload's transactions after its load.
pub(super) type Stream = Vec<Vec<retina_storage::TableOp<Vec<retina_storage::Value>>>>;

/// A node over a temporary directory with the replay workload's load and its first
/// `preload` NewOrders applied, and the NewOrders for `seconds` at `rate` (and a margin) that
/// follow them.
pub(super) fn loaded_replay_node(
    settings: Settings,
    rate: u64,
    seconds: u64,
    preload: usize,
) -> anyhow::Result<(tempfile::TempDir, Node, Stream)> {
    let catalog = Arc::new(Catalog::from_ddl(REPLAY_DDL, "replay workload")?);
    let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
    let node = local_node(dir.path().join("data"), catalog, settings, true)?;
    let h = node.handle().clone();
    // About 22 rows per NewOrder; enough for the run and a margin.
    let new_orders = (rate * seconds / 20 + 1000) as usize;
    let mut txns = replay_workload(7, 1, preload + new_orders);
    let load_txns = txns.len() - new_orders;
    let load: Vec<_> = txns.drain(..load_txns).collect();
    let mut last = 0;
    for group in load.chunks(1024) {
        last = *h.submit(group)?.end();
    }
    anyhow::ensure!(
        h.wait_visible(last, Duration::from_secs(300)),
        "the load did not finish"
    );
    Ok((dir, node, txns))
}

/// A thread emitting transactions to a node at a fixed rate, until stopped.
pub(super) struct Driver {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<anyhow::Result<()>>,
}

impl Driver {
    /// Stops the thread and waits for it; what it failed with, if it did.
    pub(super) fn stop(self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the driver panicked"))?
    }
}

/// A driver emitting `txns` at `rate` rows per second, each stamped with the time it is
/// emitted in `fresh_ts`, until stopped.
pub(super) fn spawn_driver(h: retina_node::node::NodeHandle, txns: Stream, rate: u64) -> Driver {
    spawn_driver_with(txns, rate, move |group| {
        h.submit(group)?;
        Ok(())
    })
}

/// [`spawn_driver`] into Kafka: each group written as Debezium JSON into `spec`'s topics in
/// Debezium's layout (three partitions per table topic), for a node reading them.
pub(super) fn spawn_kafka_driver(
    spec: &KafkaSpec,
    catalog: Arc<Catalog>,
    txns: Stream,
    rate: u64,
) -> anyhow::Result<Driver> {
    let mut producer = Producer::connect(spec, catalog.clone(), 3).map_err(anyhow::Error::msg)?;
    let mut next_id = 0;
    let mut text = Vec::new();
    Ok(spawn_driver_with(txns, rate, move |group| {
        text.clear();
        write_debezium_from(&mut text, catalog.tables(), group, next_id)?;
        next_id += group.len();
        producer
            .send(std::str::from_utf8(&text)?.lines())
            .map_err(anyhow::Error::msg)
    }))
}

/// The driver's loop: every transaction due at `rate` rows per second, stamped, handed to
/// `emit` in groups.
fn spawn_driver_with(
    txns: Stream,
    rate: u64,
    mut emit: impl FnMut(&Stream) -> anyhow::Result<()> + Send + 'static,
) -> Driver {
    use retina_bench::ch::REPLAY_FRESH_TS;
    use retina_bench::workload::stamp_fresh;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::spawn(move || -> anyhow::Result<()> {
            let start = Instant::now();
            let mut sent = 0u64;
            let mut pending = txns.into_iter();
            while !stop.load(Ordering::Relaxed) {
                // Every transaction due by now, stamped with the time it is emitted.
                let due = (start.elapsed().as_secs_f64() * rate as f64) as u64;
                let mut group = Vec::new();
                while sent < due {
                    let Some(mut txn) = pending.next() else { break };
                    stamp_fresh(&mut txn, now_us(), &REPLAY_FRESH_TS);
                    sent += txn.len() as u64;
                    group.push(txn);
                }
                if group.is_empty() {
                    std::thread::sleep(Duration::from_micros(200));
                } else {
                    emit(&group)?;
                }
            }
            Ok(())
        })
    };
    Driver { stop, thread }
}

/// A node over a temporary directory (listening on loopback) holding `rows` order lines in
/// regular files of 65,536 rows, `deleted_per_mille` of them deleted after the load, scattered;
/// returned once every full file is combined.
pub(super) fn order_line_node(
    rows: usize,
    deleted_per_mille: u32,
    shards: u16,
) -> anyhow::Result<(tempfile::TempDir, Node)> {
    use anyhow::Context;
    use rand::{Rng, SeedableRng};
    use retina_bench::ch::OrderLines;
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
    let t = Instant::now();
    let mut rng = rand::rngs::SmallRng::seed_from_u64(3);
    let mut doomed = Vec::new();
    let mut lines = OrderLines::new(7, 10).take(rows).peekable();
    while lines.peek().is_some() {
        let txn: Vec<_> = lines
            .by_ref()
            .take(10_000)
            .map(|r| {
                if rng.random_range(0..1000) < deleted_per_mille {
                    doomed.push(TableOp {
                        table: orderline,
                        op: RowOp::Delete(r.clone()),
                    });
                }
                TableOp {
                    table: orderline,
                    op: RowOp::Insert(r),
                }
            })
            .collect();
        h.submit(&[txn])?;
    }
    let deleted = doomed.len();
    let mut last = 0;
    for chunk in doomed.chunks(1000) {
        last = *h.submit(&[chunk.to_vec()])?.end();
    }
    anyhow::ensure!(h.wait_visible(last, Duration::from_secs(300)));
    println!(
        "loaded {rows} order lines and deleted {deleted} in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    let addr = node.coordinator_addr().context("the node listens")?;
    let conn = retina_client::Connection::connect(addr, "")?;
    // Wait until every full file is combined: the plan lists them all.
    let full = (rows as u64 / FILE_ROWS / u64::from(shards)) * u64::from(shards);
    let start = Instant::now();
    loop {
        let (files, groups) = futures::executor::block_on(async {
            let q = conn.begin().await?;
            let plan = conn.plan(q.id, "orderline").await?;
            conn.end(q.id).await?;
            let groups: usize = plan.files.iter().map(|f| f.row_groups.len()).sum();
            anyhow::Ok((plan.files.len() as u64, groups))
        })?;
        if files >= full.saturating_sub(u64::from(shards)) {
            println!("{files} regular files, {groups} row groups");
            break;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(300),
            "files not combined"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((dir, node))
}
