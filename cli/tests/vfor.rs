//! `retina bench vfor` on a few order lines: a run with another number of rows or share of
//! deleted rows than the runs the README quotes records into a results file of its own, so it
//! never stands in for them.

use std::path::Path;
use std::process::Command;

/// Runs `retina bench vfor` on 20,000 order lines with `deleted_per_mille` (the default where
/// none), recording into `results`, and returns its output.
fn vfor(results: &Path, deleted_per_mille: Option<&str>) -> String {
    let mut args = vec!["bench", "vfor", "--rows", "20000", "--runs", "1"];
    args.extend(["--shards", "2"]);
    if let Some(n) = deleted_per_mille {
        args.extend(["--deleted-per-mille", n]);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args(args)
        .env("RETINA_BENCH_RESULTS", results)
        .output()
        .unwrap();
    retina_tests::stdout_of(&out)
}

/// Asserts that `file` under `results` holds every metric of every query.
fn holds_every_metric(results: &Path, file: &str) {
    let text = std::fs::read_to_string(results.join(file)).unwrap();
    for query in ["scan", "group_by", "filter"] {
        for metric in ["ms_check", "ms_ignore", "overhead_pct"] {
            let name = format!("\"name\":\"{query}_{metric}\"");
            assert!(text.contains(&name), "{name} in {file}: {text}");
        }
    }
}

#[test]
fn smaller_runs_and_runs_without_deletes_record_apart_from_the_quoted_runs() {
    let results = tempfile::tempdir().unwrap();
    let stdout = vfor(results.path(), Some("0"));
    assert!(stdout.contains("deleted 0"), "{stdout}");
    holds_every_metric(results.path(), "vfor-20000rows-0permille.jsonl");
    // 1% deleted, as the quoted runs, but on fewer rows.
    vfor(results.path(), None);
    holds_every_metric(results.path(), "vfor-20000rows.jsonl");
    assert!(!results.path().join("vfor.jsonl").exists());
}
