//! Retina's end-to-end, model-based and interoperability tests live in `tests/`; this library
//! holds what they share.

pub mod bank;
pub mod cdc;
pub use retina_bench::etcd;
pub mod s3;

use std::process::Command;

use retina_node::settings::Settings;

/// Two shards of tiny tiles, blocks, row groups (128 rows) and files (256 rows), so that a few
/// thousand rows flush, combine and spread over many files; the tests set the timers.
pub fn small_files(flush_interval_ms: u64, gc_interval_ms: u64) -> Settings {
    Settings {
        shards: 2,
        tile_rows: 64,
        block_rows: 64,
        row_group_rows: 128,
        file_rows: 256,
        flush_interval_ms,
        gc_interval_ms,
        ..Settings::default()
    }
}

/// Whether `python3` can import pyarrow. CI installs it (`.ci/run`), so there a missing
/// pyarrow is a failure, not a skip.
pub fn pyarrow_available() -> bool {
    python_modules(&["pyarrow.parquet"])
}

/// Whether python3 imports every one of `modules`; under CI they are required (`.ci/run`
/// installs them with pip).
pub fn python_modules(modules: &[&str]) -> bool {
    let ok = Command::new("python3")
        .args(["-c", &format!("import {}", modules.join(", "))])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("CI").is_some() {
        panic!("python3 modules {modules:?} are required in CI: .ci/run installs them with pip");
    }
    ok
}

/// Query results of BIGINT columns as rows of integers.
pub fn ints(batches: &[datafusion::arrow::array::RecordBatch]) -> Vec<Vec<i64>> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;
    let mut rows = Vec::new();
    for b in batches {
        for r in 0..b.num_rows() {
            rows.push(
                b.columns()
                    .iter()
                    .map(|c| c.as_primitive::<Int64Type>().value(r))
                    .collect(),
            );
        }
    }
    rows
}

/// The stdout of a command that must have succeeded; where it failed, the test fails with its
/// stdout and stderr.
pub fn stdout_of(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A two-thread tokio runtime for a test's async clients.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Reads a child's stderr until a line contains `marker`, and returns the word after it (an
/// address it logged) with the rest of the log as it comes. Each line also goes to this
/// test's stderr when `echo` is set.
pub fn logged_after(
    child: &mut std::process::Child,
    marker: &str,
    echo: bool,
) -> (String, std::sync::mpsc::Receiver<String>) {
    let stderr = child.stderr.take().expect("the child's stderr is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if echo {
                eprintln!("child: {line}");
            }
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("the child logs `{marker}`"));
        if let Some(at) = line.find(marker) {
            let word = line[at + marker.len()..]
                .split(|c: char| c.is_whitespace() || c == '\u{1b}')
                .next()
                .unwrap()
                .to_owned();
            return (word, rx);
        }
    }
}

/// A loopback port whose next three ports are free too (a node's coordinator service, its
/// shards' scan services after it, then metrics), below the ephemeral range so that a node
/// started again on them finds them free (see [`retina_bench::ports`]).
pub fn free_ports() -> u16 {
    retina_bench::ports::free_ports(4)
}
