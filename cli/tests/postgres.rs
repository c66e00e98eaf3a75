//! The Postgres source against a real PostgreSQL (Debian's `postgresql`, a fresh cluster on
//! loopback with `wal_level = logical`, which `.ci/run` installs).
//!
//! The campaign: `retina serve --source postgres://...` without `--schema` (the catalog is read
//! from Postgres) copies a bank's tables on its first run while several `psql` clients already
//! write, and then follows their concurrent transactions: transfers (two accounts and a ledger row, in one
//! transaction), accounts moved to a new key (an update of the key, and a delete plus insert),
//! rows of every supported type inserted, updated and deleted (with NULLs, text with quotes and
//! non-ASCII characters, infinite floats), big transactions, and a table truncated now and
//! then (that one with `REPLICA IDENTITY FULL`). The node is killed with SIGKILL several times
//! during the stream and started again, on a server whose `wal_sender_timeout` is 3 s. Every query on the way sees the bank's total intact (no
//! partial transaction, nothing twice, nothing lost), and at the end every table equals what
//! Postgres itself returns, value by value.
//!
//! The second test: what the source refuses, and how it says so (a missing publication, a table
//! without a primary key or with a type the lake cannot hold when the catalog is read from
//! Postgres, a replica identity that is not the catalog's key: replay stops before that
//! transaction, naming it, and what came before stays visible).
//!
//! `RETINA_PG_KILLS` sets the number of kills (default 4).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float32Type, Float64Type, Int32Type, Int64Type,
    Time64MicrosecondType, TimeUnit, TimestampMicrosecondType,
};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_bench::postgres::PgServer;
use retina_query::Retina;

const DB: &str = "bank";
const ACCOUNTS: i64 = 2000;
const OPENING: i64 = 1000;
const SEED: u64 = 0x9057_9e55;

const SETUP: &str = "
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(14,2) NOT NULL,
    updated timestamptz);
CREATE TABLE ledger (n bigint PRIMARY KEY, acct int NOT NULL, amount numeric(14,2) NOT NULL,
    note varchar(40), at timestamp);
CREATE TABLE kinds (k1 int, k2 text, b boolean, i2 smallint, i8 bigint, r real,
    f double precision, n numeric(20,6), vc varchar(10), c char(4), d date, ts timestamp(3),
    tz timestamptz, tm time, u uuid, j jsonb, PRIMARY KEY (k1, k2));
CREATE TABLE scratch (id int PRIMARY KEY, v text);
ALTER TABLE scratch REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR TABLE accounts, ledger, kinds, scratch;
INSERT INTO accounts SELECT g, 'owner ' || g, 1000, '2024-01-01 00:00:00+00'
    FROM generate_series(1, 2000) g;
INSERT INTO ledger SELECT g, 1 + g % 2000, 0, 'opening', NULL FROM generate_series(1, 200000) g;
INSERT INTO kinds (k1, k2, b, i8, n, d) SELECT g, 'k' || g, g % 2 = 0, g::bigint * 1000000000, g / 7.0,
    date '2000-01-01' + g FROM generate_series(1, 300) g;
";

/// How each column is compared: Postgres's text of an expression that names the value exactly,
/// against the value the node's Arrow column holds, written the same way.
#[derive(Clone, Copy)]
enum Kind {
    Int,
    /// Numeric at this scale: the unscaled integer.
    Dec(u32),
    Text,
    Bool,
    /// Compared as numbers (Postgres's text parsed, NaN and infinities included).
    Float,
    /// Days since 1970-01-01.
    Date,
    /// Microseconds since the epoch (UTC).
    Ts,
    /// Microseconds since midnight.
    Time,
}

fn tables() -> Vec<(&'static str, Vec<(&'static str, Kind)>)> {
    use Kind::*;
    vec![
        (
            "accounts",
            vec![
                ("id", Int),
                ("owner", Text),
                ("balance", Dec(2)),
                ("updated", Ts),
            ],
        ),
        (
            "ledger",
            vec![
                ("n", Int),
                ("acct", Int),
                ("amount", Dec(2)),
                ("note", Text),
                ("at", Ts),
            ],
        ),
        (
            "kinds",
            vec![
                ("k1", Int),
                ("k2", Text),
                ("b", Bool),
                ("i2", Int),
                ("i8", Int),
                ("r", Float),
                ("f", Float),
                ("n", Dec(6)),
                ("vc", Text),
                ("c", Text),
                ("d", Date),
                ("ts", Ts),
                ("tz", Ts),
                ("tm", Time),
                ("u", Text),
                ("j", Text),
            ],
        ),
        ("scratch", vec![("id", Int), ("v", Text)]),
    ]
}

/// Postgres's expression for a column of `kind`, whose text is the canonical value.
fn pg_expr(column: &str, kind: Kind) -> String {
    match kind {
        Kind::Int | Kind::Float => format!("{column}::text"),
        // The type's own text (`char(n)` keeps its padding, which a cast to text drops).
        Kind::Text => format!("CASE WHEN {column} IS NOT NULL THEN format('%s', {column}) END"),
        Kind::Dec(scale) => format!("({column} * 1e{scale})::numeric(40,0)::text"),
        Kind::Bool => format!("CASE WHEN {column} THEN 't' WHEN NOT {column} THEN 'f' END"),
        Kind::Date => format!("({column} - date '1970-01-01')::text"),
        Kind::Ts => format!("(extract(epoch from {column}) * 1000000)::bigint::text"),
        Kind::Time => format!("(extract(epoch from {column}) * 1000000)::bigint::text"),
    }
}

/// The node's value at `row` of `array`, written as [`pg_expr`] writes it (`None`: NULL).
fn arrow_text(array: &dyn Array, row: usize, kind: Kind) -> Option<String> {
    if array.is_null(row) {
        return None;
    }
    Some(match (kind, array.data_type()) {
        (Kind::Int, DataType::Int32) => array.as_primitive::<Int32Type>().value(row).to_string(),
        (Kind::Int, DataType::Int64) => array.as_primitive::<Int64Type>().value(row).to_string(),
        (Kind::Dec(_), _) => array
            .as_primitive::<Decimal128Type>()
            .value(row)
            .to_string(),
        (Kind::Text, _) => array.as_string::<i32>().value(row).to_owned(),
        (Kind::Bool, _) => if array.as_boolean().value(row) {
            "t"
        } else {
            "f"
        }
        .to_owned(),
        (Kind::Float, DataType::Float32) => {
            format!("{:?}", array.as_primitive::<Float32Type>().value(row))
        }
        (Kind::Float, _) => format!("{:?}", array.as_primitive::<Float64Type>().value(row)),
        (Kind::Date, _) => array.as_primitive::<Date32Type>().value(row).to_string(),
        (Kind::Ts, DataType::Timestamp(TimeUnit::Microsecond, _)) => array
            .as_primitive::<TimestampMicrosecondType>()
            .value(row)
            .to_string(),
        (Kind::Time, DataType::Time64(TimeUnit::Microsecond)) => array
            .as_primitive::<Time64MicrosecondType>()
            .value(row)
            .to_string(),
        (_, other) => panic!("column of type {other} read as {}", kind_name(kind)),
    })
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Int => "int",
        Kind::Dec(_) => "decimal",
        Kind::Text => "text",
        Kind::Bool => "bool",
        Kind::Float => "float",
        Kind::Date => "date",
        Kind::Ts => "timestamp",
        Kind::Time => "time",
    }
}

/// Postgres's float text as the node's value is written (`Infinity` is `inf`).
fn float_text(pg: &str, single: bool) -> String {
    if single {
        format!("{:?}", pg.parse::<f32>().expect("a real"))
    } else {
        format!("{:?}", pg.parse::<f64>().expect("a double"))
    }
}

type Rows = BTreeMap<Vec<Option<String>>, usize>;

/// Every table of Postgres, canonical, as a multiset of rows.
fn pg_state(pg: &PgServer) -> Vec<Rows> {
    tables()
        .into_iter()
        .map(|(table, columns)| {
            let exprs: Vec<String> = columns.iter().map(|(c, k)| pg_expr(c, *k)).collect();
            // NULL and the empty string differ: NULLs come back as a marker.
            let select: Vec<String> = exprs
                .iter()
                .map(|e| format!("coalesce({e}, '\\N')"))
                .collect();
            let rows = pg
                .rows(DB, &format!("SELECT {} FROM {table}", select.join(", ")))
                .unwrap();
            let mut out = Rows::new();
            for row in rows {
                let row: Vec<Option<String>> = row
                    .into_iter()
                    .zip(&columns)
                    .map(|(v, (c, kind))| {
                        if v == "\\N" {
                            return None;
                        }
                        Some(match kind {
                            Kind::Float => float_text(&v, *c == "r"),
                            _ => v,
                        })
                    })
                    .collect();
                *out.entry(row).or_default() += 1;
            }
            out
        })
        .collect()
}

/// The node's tables at one snapshot, canonical: (snapshot, tables); every table, or (not
/// `all`) the accounts alone.
fn node_state(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    all: bool,
) -> Result<(u64, Vec<Rows>), String> {
    rt.block_on(async {
        let retina = Retina::connect(addr, "").map_err(|e| e.to_string())?;
        let session = retina.begin().await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for (table, columns) in tables().into_iter().take(if all { 4 } else { 1 }) {
            let names: Vec<&str> = columns.iter().map(|(c, _)| *c).collect();
            let batches: Vec<RecordBatch> = session
                .collect(&format!("SELECT {} FROM public.{table}", names.join(", ")))
                .await
                .map_err(|e| e.to_string())?;
            let mut rows = Rows::new();
            for b in &batches {
                for r in 0..b.num_rows() {
                    let row = columns
                        .iter()
                        .enumerate()
                        .map(|(i, (_, kind))| arrow_text(b.column(i).as_ref(), r, *kind))
                        .collect();
                    *rows.entry(row).or_default() += 1;
                }
            }
            out.push(rows);
        }
        Ok((session.snapshot().get(), out))
    })
}

/// The sum of every balance, in cents.
fn total(state: &[Rows]) -> i64 {
    state[0]
        .iter()
        .map(|(row, n)| row[2].as_ref().unwrap().parse::<i64>().unwrap() * *n as i64)
        .sum()
}

/// A client's script: `txns` transactions, seeded.
fn script(client: u64, txns: usize) -> String {
    let mut rng = SmallRng::seed_from_u64(SEED ^ client);
    let mut sql = String::new();
    let quoted = |s: &str| format!("'{}'", s.replace('\'', "''"));
    for i in 0..txns {
        // Paced, so that the stream goes on through every kill.
        if i % 4 == 0 {
            sql += "SELECT pg_sleep(0.05);\n";
        }
        let n = client as i64 * 1_000_000 + i as i64;
        let a = rng.random_range(1..=ACCOUNTS);
        let b = rng.random_range(1..=ACCOUNTS);
        sql += "BEGIN;\n";
        match rng.random_range(0..100) {
            // A transfer: both accounts or neither, and its ledger row.
            0..=59 if a != b => {
                let cents = rng.random_range(1..50_000);
                let amount = format!("{}.{:02}", cents / 100, cents % 100);
                // Both rows locked first (in key order: no deadlocks), then moved together if
                // both still exist (one may have moved to another key meanwhile).
                sql += &format!(
                    "SELECT id FROM accounts WHERE id IN ({a}, {b}) ORDER BY id FOR UPDATE;\n\
                     UPDATE accounts SET balance = balance + CASE id WHEN {a} THEN -{amount} \
                     ELSE {amount} END, updated = now() WHERE id IN ({a}, {b}) \
                     AND (SELECT count(*) FROM accounts WHERE id IN ({a}, {b})) = 2;\n\
                     INSERT INTO ledger VALUES ({n}, {a}, -{amount}, {}, now()::timestamp);\n",
                    if rng.random_bool(0.3) {
                        "NULL".to_owned()
                    } else {
                        quoted(&format!("to {b}: l'été {i}"))
                    }
                );
            }
            // The key changes.
            60..=64 => sql += &format!("UPDATE accounts SET id = id + 100000 WHERE id = {a};\n"),
            // Deleted and inserted under a new key, in one transaction.
            65..=67 => {
                sql += &format!(
                    "WITH d AS (DELETE FROM accounts WHERE id = {a} RETURNING owner, balance) \
                     INSERT INTO accounts SELECT {a} + 200000, owner, balance, now() FROM d;\n"
                )
            }
            // Every supported type, NULLs among them.
            68..=79 => {
                let k2 = quoted(&format!("c{client}'n{i}é"));
                let f = match rng.random_range(0..10) {
                    0 => "'Infinity'".to_owned(),
                    1 => "'-Infinity'".to_owned(),
                    _ => format!("{}", rng.random::<f64>() * 1e6 - 5e5),
                };
                let raw = [
                    (i % 2 == 0).to_string(),
                    rng.random_range(-32768..32768).to_string(),
                    rng.random::<i64>().to_string(),
                    format!("{}", rng.random::<f32>() * 100.0),
                    f,
                    format!("{}.{:06}", rng.random_range(-99999..99999), i),
                    quoted(&format!("v{i}\"q")),
                    quoted("ab"),
                    format!("date '1999-12-31' + {i}"),
                    "now()::timestamp(3)".into(),
                    format!("timestamptz '2024-06-01 12:00:00.123456+05:30' + interval '{i} s'"),
                    format!("time '23:59:59.999999' - interval '{i} min'"),
                    "gen_random_uuid()".into(),
                    quoted(&format!("{{\"i\": {i}, \"s\": \"x\"}}")),
                ];
                // A fifth of the values NULL.
                let values: Vec<String> = raw
                    .into_iter()
                    .map(|v| {
                        if rng.random_bool(0.2) {
                            "NULL".into()
                        } else {
                            v
                        }
                    })
                    .collect();
                sql += &format!(
                    "INSERT INTO kinds VALUES ({n}, {k2}, {});\n",
                    values.join(", ")
                );
                let k1 = rng.random_range(1..=300);
                match rng.random_range(0..3) {
                    0 => {
                        sql += &format!(
                            "UPDATE kinds SET f = f * 2, b = NOT b, n = n + 1, ts = now() \
                             WHERE k1 = {k1};\n"
                        )
                    }
                    1 => sql += &format!("DELETE FROM kinds WHERE k1 = {k1};\n"),
                    _ => {
                        sql += &format!(
                            "UPDATE kinds SET k2 = k2 || '+' WHERE k1 = {k1} AND k2 NOT LIKE '%+';\n"
                        )
                    }
                }
            }
            // A big transaction: many ledger rows at once.
            80..=81 => {
                sql += &format!(
                    "INSERT INTO ledger SELECT {n}::bigint * 10000 + g, {a}, 0, 'bulk', NULL \
                     FROM generate_series(1, 3000) g;\n"
                )
            }
            // The full-identity table: rows in, changed, out, and truncated.
            82..=91 => {
                sql += &format!(
                    "INSERT INTO scratch VALUES ({n}, 'x{i}');\n\
                     UPDATE scratch SET v = v || '!' WHERE id = {n};\n"
                );
                if rng.random_bool(0.3) {
                    sql += &format!("DELETE FROM scratch WHERE id = {n};\n");
                }
            }
            92..=93 => sql += "TRUNCATE scratch;\n",
            _ => {
                sql += &format!(
                    "INSERT INTO ledger VALUES ({n}, {a}, 0, NULL, NULL);\n\
                     UPDATE ledger SET note = 'seen' WHERE n = {n};\n"
                )
            }
        }
        sql += "COMMIT;\n";
    }
    sql
}

/// A running `retina serve`, killed when dropped.
struct Served(Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(dir: &std::path::Path, port: u16, source: &str, extra: &[&str]) -> Served {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("serve.log"))
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(["serve", "--shards", "2", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--source")
        .arg(source)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args([
            "--set",
            "tile_rows=256",
            "--set",
            "block_rows=512",
            "--set",
            "row_group_rows=2048",
            "--set",
            "file_rows=8192",
            "--set",
            "flush_interval_ms=5",
            "--set",
            "checkpoint_interval_ms=50",
            "--set",
            "persist_interval_ms=10",
        ])
        .args(extra)
        .env("RUST_BACKTRACE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map(Served)
        .unwrap()
}

fn log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
}

/// Reads the node (see [`node_state`]), retrying while it starts (or recovers).
fn read(
    rt: &tokio::runtime::Runtime,
    addr: SocketAddr,
    all: bool,
    served: &mut Served,
    dir: &std::path::Path,
) -> (u64, Vec<Rows>) {
    let start = Instant::now();
    loop {
        assert!(
            served.0.try_wait().unwrap().is_none(),
            "retina serve exited:\n{}",
            log(dir)
        );
        match node_state(rt, addr, all) {
            Ok(state) => return state,
            Err(e) => {
                assert!(
                    start.elapsed() < Duration::from_secs(90),
                    "no query answered in 90 s: {e}\n{}",
                    log(dir)
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[test]
fn postgres_source_copies_streams_and_survives_kills() {
    // A short sender timeout: the node's status updates must keep the session alive through
    // the load, the kills and the catch-ups.
    let Some(pg) = PgServer::for_test_with(&["wal_sender_timeout=3s"]) else {
        return;
    };
    pg.psql("postgres", &format!("CREATE DATABASE {DB}"))
        .unwrap();
    pg.psql(DB, SETUP).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = retina_tests::free_ports();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let source = pg.source_url(DB, "pub", "retina_test");
    let rt = retina_tests::runtime();
    let kills: usize = std::env::var("RETINA_PG_KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(4);
    let opening = ACCOUNTS * OPENING * 100;

    // Clients write concurrently while the node copies, streams, and is killed and restarted.
    let clients: Vec<_> = (1..=4u64)
        .map(|c| {
            let sql = script(c, 1500);
            let psql = pg.bin().join("psql");
            let port = pg.port;
            std::thread::spawn(move || {
                let mut child = Command::new(psql)
                    .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
                    .args(["-d", DB, "-X", "-q", "-v", "ON_ERROR_STOP=1"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                use std::io::Write;
                // psql stops at an error; what it said is below.
                let _ = child.stdin.take().unwrap().write_all(sql.as_bytes());
                let out = child.wait_with_output().unwrap();
                assert!(
                    out.status.success(),
                    "client {c}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            })
        })
        .collect();
    let started = Instant::now();
    // The first run starts as the clients do: it creates the slot and copies the tables while
    // they write; what they commit after the slot's snapshot comes from the stream.
    let mut served = serve(dir.path(), port, &source, &[]);
    wait_for(dir.path(), "copied ", 1, 120);
    assert!(log(dir.path()).contains("created slot `retina_test`"));
    let mut rng = SmallRng::seed_from_u64(SEED);
    let mut seen = 0u64;
    let mut queries = 0usize;
    for k in 0..kills {
        // Queries at random moments: the bank's total is whole at every snapshot, and no
        // snapshot is older than one shown before.
        for _ in 0..3 {
            std::thread::sleep(Duration::from_millis(rng.random_range(20..400)));
            let (snapshot, state) = read(&rt, addr, false, &mut served, dir.path());
            assert!(snapshot >= seen, "snapshot {snapshot} after {seen}");
            seen = snapshot;
            assert_eq!(total(&state), opening, "the total at snapshot {snapshot}");
            queries += 1;
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(0..300)));
        drop(served);
        eprintln!(
            "kill {} at {:?}: after snapshot {seen}",
            k + 1,
            started.elapsed()
        );
        served = serve(dir.path(), port, &source, &[]);
    }
    for c in clients {
        c.join().unwrap();
    }
    eprintln!("clients done at {:?}", started.elapsed());

    // With the clients done, the node catches up to exactly what Postgres holds.
    let expected = pg_state(&pg);
    assert_eq!(total(&expected), opening);
    let start = Instant::now();
    let last = loop {
        let (snapshot, state) = read(&rt, addr, true, &mut served, dir.path());
        assert!(snapshot >= seen);
        seen = snapshot;
        assert_eq!(total(&state), opening);
        if state == expected || start.elapsed() > Duration::from_secs(90) {
            break state;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for (i, (table, _)) in tables().iter().enumerate() {
        let missing: Vec<_> = expected[i]
            .iter()
            .filter(|(r, n)| last[i].get(*r) != Some(n))
            .take(3)
            .collect();
        let invented: Vec<_> = last[i]
            .iter()
            .filter(|(r, n)| expected[i].get(*r) != Some(n))
            .take(3)
            .collect();
        assert!(
            missing.is_empty() && invented.is_empty(),
            "table {table}: {} rows in Postgres, {} in the node; missing {missing:?}, \
             invented {invented:?}\n{}",
            expected[i].values().sum::<usize>(),
            last[i].values().sum::<usize>(),
            log(dir.path())
        );
    }
    let ledger_rows: usize = expected[1].values().sum();
    assert!(ledger_rows > 10_000, "{ledger_rows} ledger rows");
    // The slot is confirmed as far as checkpoints go, and, once the node is idle, past WAL
    // that holds nothing for it (writes to a table outside the publication): Postgres does not
    // keep WAL for the node that it will never need.
    pg.psql(
        DB,
        "CREATE TABLE unpublished (id int PRIMARY KEY);
         INSERT INTO unpublished SELECT generate_series(1, 50000);",
    )
    .unwrap();
    let written = pg.psql(DB, "SELECT pg_current_wal_lsn()").unwrap();
    let start = Instant::now();
    loop {
        let passed = pg
            .psql(
                DB,
                &format!(
                    "SELECT confirmed_flush_lsn >= '{}' FROM pg_replication_slots \
                     WHERE slot_name = 'retina_test'",
                    written.trim()
                ),
            )
            .unwrap();
        if passed.trim() == "t" {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the slot stayed behind {written}\n{}",
            log(dir.path())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "{kills} kills, {queries} queries; {} rows in the end",
        expected
            .iter()
            .map(|t| t.values().sum::<usize>())
            .sum::<usize>()
    );
}

#[test]
fn postgres_sources_refuse_what_they_cannot_replay() {
    let Some(pg) = PgServer::for_test() else {
        return;
    };
    pg.psql("postgres", "CREATE DATABASE shop").unwrap();
    pg.psql(
        "shop",
        "CREATE TABLE ok (id int PRIMARY KEY, v text);
         CREATE TABLE nokey (id int, v text);
         CREATE TABLE blob (id int PRIMARY KEY, b bytea);
         CREATE PUBLICATION good FOR TABLE ok;
         CREATE PUBLICATION nokeys FOR TABLE ok, nokey;
         CREATE PUBLICATION blobs FOR TABLE blob;",
    )
    .unwrap();
    let run = |url: String, extra: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_retina"))
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--source")
            .arg(url)
            .args(extra)
            .env("RUST_BACKTRACE", "0")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(pg.source_url("shop", "missing", "s1"), &[]);
    assert!(e.contains("publication `missing` does not exist"), "{e}");
    let e = run(pg.source_url("shop", "nokeys", "s1"), &[]);
    assert!(
        e.contains("table \"public\".\"nokey\" has no primary key"),
        "{e}"
    );
    let e = run(pg.source_url("shop", "blobs", "s1"), &[]);
    assert!(
        e.contains("column `b` of type bytea: the lake has no column type for it"),
        "{e}"
    );
    let e = run(
        format!(
            "postgres://postgres:wrong@127.0.0.1:{}/nodb?publication=good&slot=s1",
            pg.port
        ),
        &[],
    );
    assert!(e.contains("nodb") && !e.contains("wrong"), "{e}");

    // A table whose replica identity is not the catalog's key: replay stops before its first
    // change, naming the table, and everything before stays.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.sql"),
        "CREATE TABLE public.ok (id INT PRIMARY KEY, v TEXT);
         CREATE TABLE public.nokey (id INT PRIMARY KEY, v TEXT);",
    )
    .unwrap();
    let port = retina_tests::free_ports();
    let schema = dir.path().join("s.sql").display().to_string();
    pg.psql("shop", "INSERT INTO ok VALUES (1, 'a')").unwrap();
    let served = serve(
        dir.path(),
        port,
        &pg.source_url("shop", "nokeys", "s2"),
        &["--schema", &schema],
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Wait for the copy, then change both tables.
    wait_for(dir.path(), "streaming from", 1, 30);
    pg.psql(
        "shop",
        "INSERT INTO ok VALUES (2, 'b'); INSERT INTO nokey VALUES (1, 'x'); \
         INSERT INTO ok VALUES (3, 'c');",
    )
    .unwrap();
    wait_for(dir.path(), "replay stopped", 1, 30);
    let text = log(dir.path());
    assert!(
        text.contains(
            "table public.nokey: its replica identity (none) is not the catalog's primary key (id)"
        ) && text.contains("transaction "),
        "{text}"
    );
    let ids = node_ids(dir.path(), addr, "ok").expect("the node answers");
    assert_eq!(ids, [1, 2], "the transactions before the refused one");
    drop(served);
}

#[test]
fn postgres_source_dead_letters_with_on_error_skip() {
    let Some(pg) = PgServer::for_test() else {
        return;
    };
    pg.psql("postgres", "CREATE DATABASE skip").unwrap();
    pg.psql(
        "skip",
        "CREATE TABLE events (id int PRIMARY KEY, day date);
         CREATE PUBLICATION p FOR TABLE events;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = retina_tests::free_ports();
    let _served = serve(
        dir.path(),
        port,
        &pg.source_url("skip", "p", "s"),
        &["--on-error", "skip"],
    );
    wait_for(dir.path(), "streaming from", 1, 30);
    // The middle transaction holds a date the lake has no value for.
    pg.psql(
        "skip",
        "INSERT INTO events VALUES (1, '2024-01-01');
         BEGIN; INSERT INTO events VALUES (2, '2024-01-02'); INSERT INTO events VALUES (3, 'infinity'); COMMIT;
         INSERT INTO events VALUES (4, '2024-01-04');",
    )
    .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let start = Instant::now();
    let ids = loop {
        if let Some(ids) = node_ids(dir.path(), addr, "events")
            && (ids.len() >= 2 || start.elapsed() > Duration::from_secs(30))
        {
            break ids;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        ids,
        [1, 4],
        "the bad transaction is skipped whole\n{}",
        log(dir.path())
    );
    let dead = std::fs::read_to_string(dir.path().join("data/dead-letter.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = dead
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 1, "{dead}");
    let r = &records[0];
    let reason = r["reason"].as_str().unwrap();
    assert!(
        reason.contains("column `day`: \"infinity\" has no value in the lake")
            && reason.contains("(transaction "),
        "{reason}"
    );
    assert_eq!(
        r["transaction"],
        serde_json::Value::String(
            reason
                .split("(transaction ")
                .nth(1)
                .unwrap()
                .split(')')
                .next()
                .unwrap()
                .to_owned()
        )
    );
    let lines: Vec<&str> = r["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "both changes of the transaction: {lines:?}");
    assert!(lines[1].contains("infinity"), "{lines:?}");
    assert!(r["offset"].as_u64().unwrap() > 0);
}

#[test]
fn postgres_sources_use_tls_when_asked() {
    if std::env::var_os("CI").is_none()
        && (retina_bench::postgres::postgres_bin().is_none()
            || Command::new("openssl").arg("version").output().is_err())
    {
        eprintln!("skipped: no PostgreSQL server or no openssl");
        return;
    }
    let pg = PgServer::start_tls(&["fsync=off"]).unwrap();
    pg.psql("postgres", "CREATE DATABASE secure").unwrap();
    pg.psql(
        "secure",
        "CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1), (2);
         CREATE PUBLICATION p FOR TABLE t;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = retina_tests::free_ports();
    let url = format!("{}&sslmode=require", pg.source_url("secure", "p", "s"));
    let _served = serve(dir.path(), port, &url, &[]);
    wait_for(dir.path(), "copied 2 rows", 1, 30);
    // The session Postgres saw was encrypted.
    let ssl = pg
        .psql(
            "secure",
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'retina'",
        )
        .unwrap();
    assert_eq!(ssl.trim(), "t", "{}", log(dir.path()));
}

/// Stops `served` with SIGTERM (a clean stop) and waits for it, 60 s at most.
fn stop(mut served: Served, dir: &std::path::Path) {
    let pid = served.0.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let asked = Instant::now();
    while served.0.try_wait().unwrap().is_none() {
        assert!(
            asked.elapsed() < Duration::from_secs(60),
            "retina serve did not stop in 60 s after SIGTERM\n{}",
            log(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the node's log holds `text` at least `times` times, for `secs` at most.
fn wait_for(dir: &std::path::Path, text: &str, times: usize, secs: u64) {
    let start = Instant::now();
    while log(dir).matches(text).count() < times {
        assert!(
            start.elapsed() < Duration::from_secs(secs),
            "no `{text}` (x{times}) in {secs} s:\n{}",
            log(dir)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `query` on a thread of its own (with a runtime of its own): one that has not returned
/// in 60 s fails the test with the node's log, rather than stall the whole run.
fn on_node<T: Send + 'static>(
    dir: &std::path::Path,
    query: impl FnOnce(&tokio::runtime::Runtime) -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        let _ = tx.send(query(&retina_tests::runtime()));
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(v) => {
            let _ = worker.join();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a query of the node had no answer in 60 s\n{}", log(dir))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(worker.join().expect_err("it ended without an answer"))
        }
    }
}

/// The `int` ids of `public.table` in the node, in order (`None`: it does not answer yet).
fn node_ids(dir: &std::path::Path, addr: SocketAddr, table: &str) -> Option<Vec<i32>> {
    let sql = format!("SELECT id FROM public.{table} ORDER BY id");
    on_node(dir, move |rt| {
        rt.block_on(async {
            let retina = Retina::connect(addr, "").ok()?;
            let session = retina.begin().await.ok()?;
            let batches = session.collect(&sql).await.ok()?;
            Some(
                batches
                    .iter()
                    .flat_map(|b| b.column(0).as_primitive::<Int32Type>().values().to_vec())
                    .collect(),
            )
        })
    })
}

/// `(count, sum of id)` of `public.table` in the node, once it answers.
fn node_count(dir: &std::path::Path, addr: SocketAddr, table: &str) -> Option<(i64, i64)> {
    let ids = node_ids(dir, addr, table)?;
    Some((ids.len() as i64, ids.iter().map(|&i| i64::from(i)).sum()))
}

/// Waits until `public.table` in the node has `expected` (count, sum of id), 60 s at most.
fn wait_count(dir: &std::path::Path, addr: SocketAddr, table: &str, expected: (i64, i64)) {
    let start = Instant::now();
    loop {
        let now = node_count(dir, addr, table);
        if now == Some(expected) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{table}: the node has {now:?}, not {expected:?}\n{}",
            log(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn postgres_source_survives_stops_during_the_copy_and_a_server_restart() {
    let Some(pg) = PgServer::for_test() else {
        return;
    };
    pg.psql("postgres", "CREATE DATABASE restarts").unwrap();
    pg.psql(
        "restarts",
        "CREATE TABLE big (id int PRIMARY KEY, v text);
         INSERT INTO big SELECT g, repeat('v', 40) FROM generate_series(1, 300000) g;
         CREATE PUBLICATION p FOR TABLE big;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = retina_tests::free_ports();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let source = pg.source_url("restarts", "p", "s");
    // SIGTERM during the copy: a clean stop that must not checkpoint a partial copy.
    let served = serve(dir.path(), port, &source, &[]);
    wait_for(dir.path(), "created slot", 1, 60);
    std::thread::sleep(Duration::from_millis(300));
    stop(served, dir.path());
    assert!(
        !log(dir.path()).contains("copied "),
        "the copy ended before the stop; make the table bigger\n{}",
        log(dir.path())
    );
    // SIGKILL during the second copy.
    let served = serve(dir.path(), port, &source, &[]);
    wait_for(dir.path(), "created slot", 2, 60);
    std::thread::sleep(Duration::from_millis(300));
    drop(served);
    // The third run copies whole.
    let _served = serve(dir.path(), port, &source, &[]);
    wait_for(dir.path(), "copied ", 1, 60);
    assert_eq!(
        log(dir.path())
            .matches("was cut short; dropping slot")
            .count(),
        2,
        "{}",
        log(dir.path())
    );
    // Changes, a server restart in their midst, more changes: all arrive once.
    pg.psql(
        "restarts",
        "INSERT INTO big SELECT g, 'new' FROM generate_series(300001, 300100) g;
         DELETE FROM big WHERE id <= 50;",
    )
    .unwrap();
    pg.restart().unwrap();
    pg.psql(
        "restarts",
        "INSERT INTO big SELECT g, 'after' FROM generate_series(300101, 300200) g;
         UPDATE big SET id = id + 1000000 WHERE id BETWEEN 51 AND 60;",
    )
    .unwrap();
    let expected: Vec<i64> = pg
        .psql("restarts", "SELECT count(*), sum(id) FROM big")
        .unwrap()
        .trim()
        .split('|')
        .map(|v| v.parse().unwrap())
        .collect();
    wait_count(dir.path(), addr, "big", (expected[0], expected[1]));
    assert!(log(dir.path()).contains("streaming again from"));
}

#[test]
fn postgres_source_skips_a_transaction_a_shard_refused() {
    let Some(pg) = PgServer::for_test() else {
        return;
    };
    pg.psql("postgres", "CREATE DATABASE refused").unwrap();
    // Postgres has no key here; the catalog says `id` is one, so a second row with the same id
    // is refused by the shard, not by Postgres.
    pg.psql(
        "refused",
        "CREATE TABLE dup (id int NOT NULL, v text);
         ALTER TABLE dup REPLICA IDENTITY FULL;
         CREATE PUBLICATION p FOR TABLE dup;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.sql"),
        "CREATE TABLE public.dup (id INT PRIMARY KEY, v TEXT);",
    )
    .unwrap();
    let schema = dir.path().join("s.sql").display().to_string();
    let port = retina_tests::free_ports();
    let _served = serve(
        dir.path(),
        port,
        &pg.source_url("refused", "p", "s"),
        &["--schema", &schema, "--on-error", "skip"],
    );
    wait_for(dir.path(), "streaming from", 1, 60);
    pg.psql(
        "refused",
        "INSERT INTO dup VALUES (1, 'a'); INSERT INTO dup VALUES (1, 'b');
         INSERT INTO dup VALUES (2, 'c');",
    )
    .unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_count(dir.path(), addr, "dup", (2, 3));
    let dead = std::fs::read_to_string(dir.path().join("data/dead-letter.jsonl")).unwrap();
    assert_eq!(dead.lines().count(), 1, "{dead}");
    assert!(
        dead.contains("duplicate") || dead.contains("exists"),
        "{dead}"
    );
    // Only the refused transaction is missing: the first row keeps its value.
    let v = on_node(dir.path(), move |rt| {
        rt.block_on(async {
            let retina = Retina::connect(addr, "").unwrap();
            let session = retina.begin().await.unwrap();
            let b = session
                .collect("SELECT v FROM public.dup WHERE id = 1")
                .await
                .unwrap();
            b[0].column(0).as_string::<i32>().value(0).to_owned()
        })
    });
    assert_eq!(v, "a");
}

#[test]
fn postgres_source_waits_for_a_slot_another_session_holds() {
    let Some(pg) = PgServer::for_test() else {
        return;
    };
    pg.psql("postgres", "CREATE DATABASE held").unwrap();
    pg.psql(
        "held",
        "CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION p FOR TABLE t;",
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let port = retina_tests::free_ports();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let source = pg.source_url("held", "p", "s");
    let served = serve(dir.path(), port, &source, &[]);
    wait_for(dir.path(), "streaming from", 1, 60);
    pg.psql("held", "INSERT INTO t VALUES (1)").unwrap();
    wait_count(dir.path(), addr, "t", (1, 1));
    stop(served, dir.path());
    // Another session holds the slot, as the session of a node that crashed does until the
    // server notices it is gone: the node waits for it rather than stop replay.
    let mut holder = Command::new(pg.bin().join("pg_recvlogical"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &pg.port.to_string(),
            "-U",
            "postgres",
        ])
        .args(["-d", "held", "--slot", "s", "--start", "-f", "/dev/null"])
        .args(["-o", "proto_version=1", "-o", "publication_names=p"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while pg
        .psql(
            "held",
            "SELECT active FROM pg_replication_slots WHERE slot_name = 's'",
        )
        .unwrap()
        .trim()
        != "t"
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pg_recvlogical holds the slot"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _served = serve(dir.path(), port, &source, &[]);
    wait_for(dir.path(), "SQLSTATE 55006", 1, 60);
    pg.psql("held", "INSERT INTO t VALUES (2)").unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    wait_count(dir.path(), addr, "t", (2, 3));
    assert!(
        !log(dir.path()).contains("replay stopped"),
        "{}",
        log(dir.path())
    );
}
