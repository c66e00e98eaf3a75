//! `retina bench overhead`: what Retina adds to a query, measured against the same rows
//! without it. The CH-benCHmark dataset is loaded into a node; its tables are read through the
//! DataFusion connector at one snapshot and written as plain Parquet files on local disk (the
//! settings Retina's regular files use, no `_create_ts`, no visibility, no RPC); then the CH
//! queries run through the connector (a query session each time, as a client would) and through
//! DataFusion of the same version over the exported files, alternating, and their results must
//! agree. Twice: right after the load, and after a change stream of a tenth of the loaded rows.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use futures::TryStreamExt;
use retina_bench::chgen::{ChGen, FreshClock};
use retina_bench::results::record;
use retina_node::catalog::Catalog;
use retina_node::settings::Settings;
use retina_storage::StorageConfig;

use crate::measure::{local_node, median};

/// The dataset's seed (the one `retina bench peers` uses).
const SEED: u64 = 42;
/// Rows per transaction of the initial load.
const LOAD_ROWS_PER_TXN: usize = 1000;
/// How long the node is left alone after each phase's rows are visible, before the export.
const SETTLE: Duration = Duration::from_secs(2);

pub(super) fn run(scale_name: &str, runs: usize, shards: u16) -> anyhow::Result<()> {
    anyhow::ensure!(runs > 0, "--runs must be positive");
    let scale = crate::ch::scale(scale_name)?;
    let catalog = Arc::new(Catalog::from_ddl(retina_bench::chgen::DDL, "ch.sql")?);
    let dir = tempfile::Builder::new()
        .prefix("retina-overhead-")
        .tempdir()?;
    let settings = Settings {
        shards,
        ..Settings::default()
    };
    let node = local_node(dir.path().join("data"), catalog.clone(), settings, true)?;
    let addr = node.coordinator_addr().context("the node listens")?;
    let mut generator = ChGen::new(scale, SEED);
    let load = generator.load(LOAD_ROWS_PER_TXN);
    let load_rows: usize = load.iter().map(Vec::len).sum();
    let h = node.handle();
    let mut last = 0;
    for group in load.chunks(1024) {
        last = *h.submit(group)?.end();
    }
    anyhow::ensure!(
        h.wait_visible(last, Duration::from_secs(600)),
        "the load did not become visible: {:?}",
        h.status().error()
    );
    // A tenth of the loaded rows as CH's transactions (new orders, payments, deliveries).
    let mut clock = FreshClock::logical();
    let mut stream = Vec::new();
    let mut stream_rows = 0;
    while stream_rows < load_rows / 10 {
        let txn = generator.next_txn(clock.now_us());
        stream_rows += txn.len();
        stream.push(txn);
    }
    println!(
        "retina bench overhead: CH-benCHmark (scale {scale_name}), {load_rows} rows loaded, \
         {shards} shards; {runs} runs of each query on each side, medians"
    );
    println!(
        "{:>10} {:>6} {:>11} {:>11} {:>7}",
        "phase", "query", "Retina ms", "Parquet ms", "ratio"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let results = format!("overhead_{}", scale_name.replace(':', "_"));
    for phase in ["load", "stream"] {
        if phase == "stream" {
            for group in stream.chunks(1024) {
                last = *h.submit(group)?.end();
            }
            anyhow::ensure!(
                h.wait_visible(last, Duration::from_secs(600)),
                "the stream did not become visible: {:?}",
                h.status().error()
            );
        }
        // The flushes and combinations the load or stream started settle first.
        std::thread::sleep(SETTLE);
        let plain = dir.path().join(format!("plain-{phase}"));
        runtime.block_on(async {
            let retina = retina_query::Retina::connect(addr, "")?;
            let ctx = export(&retina, &catalog, &plain).await?;
            for (q, (name, sql)) in crate::ch::QUERIES.iter().enumerate() {
                let (mut ours, mut theirs) = (Vec::new(), Vec::new());
                for run in 0..=runs {
                    let t = Instant::now();
                    // One statement in a query of its own, as a client runs one.
                    let a: Vec<RecordBatch> = retina.sql(sql).await?.1.try_collect().await?;
                    let a_ms = t.elapsed().as_secs_f64() * 1e3;
                    let t = Instant::now();
                    let b = ctx.sql(sql).await?.collect().await?;
                    let b_ms = t.elapsed().as_secs_f64() * 1e3;
                    if run == 0 {
                        // The first run warms caches; it checks the answers instead (as sets
                        // of rows: rows that tie in an ORDER BY may come in either order).
                        let (a, b) = (pretty_format_batches(&a)?, pretty_format_batches(&b)?);
                        let rows = |t: &dyn std::fmt::Display| {
                            let mut lines: Vec<String> =
                                t.to_string().lines().map(str::to_owned).collect();
                            lines.sort();
                            lines
                        };
                        anyhow::ensure!(
                            rows(&a) == rows(&b),
                            "{name}: Retina and the exported files disagree:\n{a}\n{b}"
                        );
                        continue;
                    }
                    ours.push(a_ms);
                    theirs.push(b_ms);
                }
                let (ours, theirs) = (median(&mut ours), median(&mut theirs));
                let label = ["q1", "q6", "q3"][q];
                println!(
                    "{phase:>10} {label:>6} {ours:>11.1} {theirs:>11.1} {:>7.2}",
                    ours / theirs
                );
                let _ = record(&results, &format!("{label}_ms_retina_{phase}"), ours, "ms");
                let _ = record(
                    &results,
                    &format!("{label}_ms_parquet_{phase}"),
                    theirs,
                    "ms",
                );
                let _ = record(
                    &results,
                    &format!("{label}_ratio_{phase}"),
                    ours / theirs,
                    "x",
                );
            }
            anyhow::Ok(())
        })?;
    }
    node.shutdown();
    Ok(())
}

/// Every table of `catalog` read through the connector at one snapshot and written under
/// `dir` as one Parquet file each (Retina's file settings); a DataFusion context over them.
async fn export(
    retina: &retina_query::Retina,
    catalog: &Catalog,
    dir: &std::path::Path,
) -> anyhow::Result<SessionContext> {
    let session = retina.begin().await?;
    let ctx = SessionContext::new_with_config(SessionConfig::new());
    for table in catalog.tables() {
        let name = table.name();
        let batches: Vec<RecordBatch> = session.collect(&format!("SELECT * FROM {name}")).await?;
        let table_dir = dir.join(name);
        std::fs::create_dir_all(&table_dir)?;
        let path = table_dir.join("part-0.parquet");
        let file = std::fs::File::create(&path)?;
        let schema = match batches.first() {
            Some(b) => b.schema(),
            None => Arc::new(
                table
                    .arrow_schema()
                    .project(&(0..table.columns().len()).collect::<Vec<_>>())?,
            ),
        };
        let props = retina_storage::file::writer_properties(&StorageConfig::default());
        let mut writer = ArrowWriter::try_new(file, schema, Some(props))?;
        for b in &batches {
            writer.write(b)?;
        }
        writer.close()?;
        ctx.register_parquet(
            name,
            table_dir.to_str().context("a UTF-8 path")?,
            ParquetReadOptions::default(),
        )
        .await?;
    }
    Ok(ctx)
}
