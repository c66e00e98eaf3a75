//! `retina bench vfor` on a few order lines: each share of deleted rows records into its own
//! results file, so a run without deletes never stands in for the 1% runs.

use std::process::Command;

#[test]
fn a_run_without_deletes_records_apart_from_the_one_percent_runs() {
    let results = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args([
            "bench",
            "vfor",
            "--rows",
            "20000",
            "--deleted-per-mille",
            "0",
            "--runs",
            "1",
            "--shards",
            "2",
        ])
        .env("RETINA_BENCH_RESULTS", results.path())
        .output()
        .unwrap();
    let stdout = retina_tests::stdout_of(&out);
    assert!(stdout.contains("deleted 0"), "{stdout}");
    let text = std::fs::read_to_string(results.path().join("vfor-0permille.jsonl")).unwrap();
    for query in ["scan", "group_by", "filter"] {
        for metric in ["ms_check", "ms_ignore", "overhead_pct"] {
            let name = format!("\"name\":\"{query}_{metric}\"");
            assert!(text.contains(&name), "{name} in {text}");
        }
    }
    assert!(!results.path().join("vfor.jsonl").exists());
}
