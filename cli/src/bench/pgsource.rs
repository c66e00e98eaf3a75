//! `retina bench postgres`: the Postgres source against a real server on loopback (Debian's
//! `postgresql`, a fresh cluster). The workload is pgbench's kind, as a custom script: each
//! transaction moves an amount between two accounts, adds it to a branch and writes two
//! history rows (five row changes, three tables), from several clients at once.
//!
//! - Throughput: with the node stopped, pgbench writes `--txns` transactions (the slot keeps
//!   them); the node then starts, reads the slot to its end and hands everything over: changes
//!   per second from the sink's start until the last transaction is visible. Beside it, the
//!   same number of transactions of the same shape as Debezium JSON lines in a file, replayed
//!   by the same node settings.
//! - Freshness: the node follows the slot while pgbench runs at a rate (`-R`); every 100 ms a
//!   query through the DataFusion connector reads `max(fresh_ts)` of the branches (each
//!   transaction stamps its branch with `clock_timestamp()` just before it commits): freshness
//!   is the time the query's snapshot was fixed minus that stamp.

use std::io::BufWriter;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_bench::postgres::PgServer;
use retina_bench::results::record;
use retina_bench::workload::{DebeziumWriter, InsertOp};
use retina_node::catalog::Catalog;
use retina_node::settings::Settings;
use retina_node::sink::{SinkOptions, SourceSpec};
use retina_storage::{RowOp, TableOp, Value};

use crate::measure::{file_sink, local_node, median, monitor_freshness_of, now_us, percentile};

const DB: &str = "bench";
const ACCOUNTS: i64 = 100_000;
const BRANCHES: i64 = 100;
/// Row changes per transaction of the script.
const CHANGES_PER_TXN: u64 = 5;

const SETUP: &str = "
CREATE TABLE branches (id int PRIMARY KEY, balance bigint NOT NULL, fresh_ts timestamptz);
CREATE TABLE accounts (id int PRIMARY KEY, branch int NOT NULL, balance bigint NOT NULL,
    filler varchar(84), fresh_ts timestamptz);
CREATE TABLE history (id bigserial PRIMARY KEY, account int NOT NULL, branch int NOT NULL,
    delta bigint NOT NULL, at timestamptz);
CREATE PUBLICATION bench FOR TABLE branches, accounts, history;
INSERT INTO branches SELECT g, 0, now() FROM generate_series(1, 100) g;
INSERT INTO accounts SELECT g, 1 + g % 100, 0, repeat('x', 84), now()
    FROM generate_series(1, 100000) g;
";

/// Accounts locked in key order, then the branch: no deadlocks between clients.
const SCRIPT: &str = "\\set x random(1, 100000)
\\set y random(1, 100000)
\\set lo least(:x, :y)
\\set hi greatest(:x, :y)
\\set b random(1, 100)
\\set d random(-5000, 5000)
BEGIN;
UPDATE accounts SET balance = balance - :d, fresh_ts = clock_timestamp() WHERE id = :lo;
UPDATE accounts SET balance = balance + :d, fresh_ts = clock_timestamp() WHERE id = :hi;
INSERT INTO history (account, branch, delta, at) VALUES (:lo, :b, 0 - :d, clock_timestamp());
INSERT INTO history (account, branch, delta, at) VALUES (:hi, :b, :d, clock_timestamp());
UPDATE branches SET balance = balance + :d, fresh_ts = clock_timestamp() WHERE id = :b;
END;
";

pub(super) fn run(
    txns: u64,
    clients: u32,
    runs: usize,
    rates: &[u64],
    seconds: u64,
    shards: u16,
    checkpoint_ms: Option<u64>,
) -> anyhow::Result<()> {
    // No fsync on the server: it writes the workload faster, and the node's reading is
    // what is measured.
    let pg = PgServer::start(&["fsync=off", "max_connections=50"]).map_err(anyhow::Error::msg)?;
    pg.psql("postgres", &format!("CREATE DATABASE {DB}"))
        .map_err(anyhow::Error::msg)?;
    pg.psql(DB, SETUP).map_err(anyhow::Error::msg)?;
    let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
    let script = dir.path().join("transfer.sql");
    std::fs::write(&script, SCRIPT)?;
    let source = pg.source_url(DB, "bench", "retina_bench");
    let SourceSpec::Postgres(spec) = source.parse().map_err(anyhow::Error::msg)? else {
        unreachable!("a postgres:// URL")
    };
    let ddl = retina_node::sink::postgres::read_catalog_ddl(&spec).map_err(anyhow::Error::msg)?;
    let catalog = Arc::new(Catalog::from_ddl(&ddl, "postgres")?);
    let defaults = Settings::default();
    let settings = Settings {
        shards,
        checkpoint_interval_ms: checkpoint_ms.unwrap_or(defaults.checkpoint_interval_ms),
        ..defaults
    };
    let mut options = file_sink(&settings, Default::default(), dir.path().join("dead.jsonl"));
    options.source = SourceSpec::Postgres(spec);
    options.checkpoint_interval = Some(Duration::from_millis(
        settings.checkpoint_interval_ms.max(1),
    ));
    let data = dir.path().join("pg-node");
    // Results with another checkpoint interval than the default are recorded apart.
    let suffix = checkpoint_ms
        .map(|ms| format!("_checkpoint_{ms}_ms"))
        .unwrap_or_default();

    // The first run creates the slot and copies the tables.
    let copy_start = Instant::now();
    let copied = drain(&data, &catalog, &settings, &options)?;
    println!(
        "copy: {} rows of {} accounts and {} branches in {:.2} s",
        copied.0,
        ACCOUNTS,
        BRANCHES,
        copy_start.elapsed().as_secs_f64()
    );

    println!(
        "{:>8} {:>10} {:>26} {:>26}",
        "run", "txns", "slot changes/s", "JSON file changes/s"
    );
    let (mut slot_rates, mut json_rates) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let wrote = Instant::now();
        pgbench(
            pg.bin(),
            pg.port,
            &script,
            clients,
            &["-t", &(txns / u64::from(clients)).to_string()],
        )?;
        let written = txns / u64::from(clients) * u64::from(clients);
        let wrote = wrote.elapsed().as_secs_f64();
        let (changes, secs) = drain(&data, &catalog, &settings, &options)?;
        anyhow::ensure!(
            changes == written * CHANGES_PER_TXN,
            "read {changes} changes, expected {}",
            written * CHANGES_PER_TXN
        );
        let slot = changes as f64 / secs;
        let json = json_replay(dir.path(), &catalog, &settings, written, run as u64)?;
        println!(
            "{:>8} {written:>10} {slot:>26.0} {json:>26.0}   (pgbench wrote {:.0} changes/s)",
            run + 1,
            changes as f64 / wrote
        );
        slot_rates.push(slot);
        json_rates.push(json);
    }
    let (slot, json) = (median(&mut slot_rates), median(&mut json_rates));
    println!("median: slot {slot:.0} changes/s, JSON file {json:.0} changes/s");
    record(
        "postgres",
        &format!("slot_changes_per_s_{shards}_shards{suffix}"),
        slot,
        "changes/s",
    )?;
    record(
        "postgres",
        &format!("json_file_changes_per_s_{shards}_shards{suffix}"),
        json,
        "changes/s",
    )?;

    // Freshness while the node follows the slot.
    println!(
        "{:>14} {:>10} {:>10} {:>9}",
        "changes/s", "P50 ms", "P99 ms", "samples"
    );
    for &rate in rates {
        let node = local_node(data.clone(), catalog.clone(), settings.clone(), true)?;
        let mut follow = options.clone();
        follow.follow = true;
        let sink = retina_node::sink::spawn(node.handle().clone(), follow)?;
        // Caught up with what earlier runs left before the clock starts.
        std::thread::sleep(Duration::from_secs(1));
        let addr = node.coordinator_addr().expect("listening");
        let txn_rate = (rate / CHANGES_PER_TXN).max(1);
        let from_us = now_us() + 1_000_000;
        let driver = {
            let (pg_bin, port, script) = (pg.bin().to_owned(), pg.port, script.clone());
            let (rate, seconds) = (txn_rate.to_string(), (seconds + 1).to_string());
            std::thread::spawn(move || {
                pgbench(
                    &pg_bin,
                    port,
                    &script,
                    clients,
                    &["-R", &rate, "-T", &seconds],
                )
            })
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let mut samples = runtime.block_on(async {
            let retina = retina_query::Retina::connect(addr, "")?;
            let mut samples = Vec::new();
            let end = Instant::now() + Duration::from_secs(seconds + 1);
            monitor_freshness_of(&retina, "public.branches", end, from_us, |ms| {
                samples.push(ms)
            })
            .await?;
            anyhow::Ok(samples)
        })?;
        driver.join().expect("pgbench thread")?;
        sink.stop();
        let report = sink.join().expect("the sink ran");
        anyhow::ensure!(
            report.stopped_by.is_none(),
            "replay stopped: {:?}",
            report.stopped_by
        );
        node.shutdown();
        let n = samples.len();
        let p50 = percentile(&mut samples, 50).unwrap_or(f64::NAN);
        let p99 = percentile(&mut samples, 99).unwrap_or(f64::NAN);
        println!("{rate:>14} {p50:>10.1} {p99:>10.1} {n:>9}");
        record(
            "postgres",
            &format!("p50_ms_at_{rate}_changes_per_s{suffix}"),
            p50,
            "ms",
        )?;
        record(
            "postgres",
            &format!("p99_ms_at_{rate}_changes_per_s{suffix}"),
            p99,
            "ms",
        )?;
    }
    Ok(())
}

/// Starts a node over `data`, runs the sink on the slot to its end, waits until the last
/// transaction is visible and stops the node: (row changes read, seconds).
fn drain(
    data: &std::path::Path,
    catalog: &Arc<Catalog>,
    settings: &Settings,
    options: &SinkOptions,
) -> anyhow::Result<(u64, f64)> {
    let node = local_node(data.to_owned(), catalog.clone(), settings.clone(), false)?;
    let before = node.handle().resume().map_or(0, |r| r.line);
    let start = Instant::now();
    let report = retina_node::sink::run_sink(node.handle(), options);
    if let Some(ts) = report.last_ts {
        node.handle().wait_visible(ts, Duration::from_secs(600));
    }
    let secs = start.elapsed().as_secs_f64();
    node.shutdown();
    anyhow::ensure!(
        report.stopped_by.is_none(),
        "replay stopped: {:?}",
        report.stopped_by
    );
    Ok((report.lines - before, secs))
}

/// pgbench (from the server's `bin`) with the transfer script, `clients` at once, and `args`
/// (`-t N`, or `-R` and `-T`).
fn pgbench(
    bin: &std::path::Path,
    port: u16,
    script: &std::path::Path,
    clients: u32,
    args: &[&str],
) -> anyhow::Result<()> {
    let out = Command::new(bin.join("pgbench"))
        .args([
            "-n",
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-c", &clients.to_string(), "-j", &clients.to_string(), "-f"])
        .arg(script)
        .args(args)
        .arg(DB)
        .stdin(Stdio::null())
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "pgbench: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `txns` transactions of the script's shape as Debezium JSON in a file, replayed by a node
/// with `settings` from its start: row changes per second until the last is visible.
fn json_replay(
    dir: &std::path::Path,
    catalog: &Arc<Catalog>,
    settings: &Settings,
    txns: u64,
    seed: u64,
) -> anyhow::Result<f64> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let (branches, accounts, history) = (
        catalog.resolve("public.branches").expect("branches"),
        catalog.resolve("public.accounts").expect("accounts"),
        catalog.resolve("public.history").expect("history"),
    );
    let path = dir.join("transfers.json");
    {
        let mut out = BufWriter::new(std::fs::File::create(&path)?);
        let mut writer = DebeziumWriter::new(catalog.tables().to_vec()).with_database(DB);
        let at = now_us();
        let account = |id: i64, balance: i64| {
            vec![
                Value::Int(id),
                Value::Int(1 + id % BRANCHES),
                Value::Int(balance),
                Value::Utf8("x".repeat(84)),
                Value::Timestamp(at),
            ]
        };
        for n in 0..txns as i64 {
            let (x, y) = (
                rng.random_range(1..=ACCOUNTS),
                rng.random_range(1..=ACCOUNTS),
            );
            let (lo, hi, b, d) = (
                x.min(y),
                x.max(y),
                rng.random_range(1..=BRANCHES),
                rng.random_range(-5000..=5000i64),
            );
            let update = |table, before: Vec<Value>, after: Vec<Value>| TableOp {
                table,
                op: RowOp::Update { before, after },
            };
            let entry = |id: i64, acct: i64, delta: i64| TableOp {
                table: history,
                op: RowOp::Insert(vec![
                    Value::Int(id),
                    Value::Int(acct),
                    Value::Int(b),
                    Value::Int(delta),
                    Value::Timestamp(at),
                ]),
            };
            let txn = vec![
                update(accounts, account(lo, 0), account(lo, -d)),
                update(accounts, account(hi, 0), account(hi, d)),
                entry(2 * n + 1, lo, -d),
                entry(2 * n + 2, hi, d),
                update(
                    branches,
                    vec![Value::Int(b), Value::Int(0), Value::Timestamp(at)],
                    vec![Value::Int(b), Value::Int(d), Value::Timestamp(at)],
                ),
            ];
            writer.write_txn(&mut out, &txn, InsertOp::Create)?;
        }
    }
    // Rows the updates change must exist: the JSON replay starts from the same copy.
    let data = dir.join(format!("json-node-{seed}"));
    let node = local_node(data.clone(), catalog.clone(), settings.clone(), false)?;
    {
        let mut load = Vec::new();
        for id in 1..=ACCOUNTS {
            load.push(TableOp {
                table: accounts,
                op: RowOp::Insert(vec![
                    Value::Int(id),
                    Value::Int(1 + id % BRANCHES),
                    Value::Int(0),
                    Value::Utf8("x".repeat(84)),
                    Value::Timestamp(0),
                ]),
            });
        }
        for id in 1..=BRANCHES {
            load.push(TableOp {
                table: branches,
                op: RowOp::Insert(vec![Value::Int(id), Value::Int(0), Value::Timestamp(0)]),
            });
        }
        let range = node.handle().submit(&[load])?;
        node.handle()
            .wait_visible(*range.end(), Duration::from_secs(60));
    }
    let options = file_sink(settings, path, dir.join("dead-json.jsonl"));
    let start = Instant::now();
    let report = retina_node::sink::run_sink(node.handle(), &options);
    if let Some(ts) = report.last_ts {
        node.handle().wait_visible(ts, Duration::from_secs(600));
    }
    let secs = start.elapsed().as_secs_f64();
    node.shutdown();
    let _ = std::fs::remove_dir_all(&data);
    anyhow::ensure!(
        report.stopped_by.is_none(),
        "JSON replay stopped: {:?}",
        report.stopped_by
    );
    Ok((txns * CHANGES_PER_TXN) as f64 / secs)
}
