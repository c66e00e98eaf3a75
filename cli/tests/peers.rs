//! `retina bench peers` end to end on a tiny scale: the same load and stream replayed into every
//! system this build has (Retina always; DuckDB and Delta Lake with `--features peers`), paced
//! and unpaced, with the final states fingerprinted (the command fails if they differ), the
//! CH queries timed and every measurement recorded.

use std::process::{Command, Output};

use retina_tests::stdout_of;

fn peers(systems: &str, results: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_retina"))
        .args([
            "bench",
            "peers",
            "--scale",
            "tiny",
            "--systems",
            systems,
            "--rates",
            "3000,max",
            "--seconds",
            "2",
            "--max-rows",
            "5000",
            "--delta-commit-ms",
            "500",
            "--query-runs",
            "1",
            "--shards",
            "2",
        ])
        .env("RETINA_BENCH_RESULTS", results)
        .output()
        .unwrap()
}

/// The systems this build can measure.
fn built() -> Vec<&'static str> {
    let mut systems = vec!["retina"];
    if cfg!(feature = "peer-duckdb") {
        systems.push("duckdb");
    }
    if cfg!(feature = "peer-delta") {
        systems.push("delta");
    }
    systems
}

#[test]
fn every_built_system_replays_the_same_stream_to_the_same_state() {
    let results = tempfile::tempdir().unwrap();
    let systems = built();
    let out = stdout_of(&peers(&systems.join(","), results.path()));
    let labels: Vec<&str> = systems
        .iter()
        .map(|s| if *s == "delta" { "delta_500ms" } else { s })
        .collect();
    for label in &labels {
        for rate in ["3000", "max"] {
            let line = out
                .lines()
                .find(|l| {
                    let mut w = l.split_whitespace();
                    w.next() == Some(label) && w.next() == Some(rate)
                })
                .unwrap_or_else(|| panic!("no {label} line at {rate} in:\n{out}"));
            // Rows replayed, and freshness measured while they were.
            let cols: Vec<&str> = line.split_whitespace().collect();
            assert!(cols[2].parse::<u64>().unwrap() >= 5000, "{line}");
            assert!(cols[3].parse::<f64>().unwrap() > 0.0, "{line}");
        }
    }
    assert!(out.contains("CH queries on the final state"), "{out}");
    let recorded = std::fs::read_to_string(results.path().join("peers-tiny.jsonl")).unwrap();
    for label in &labels {
        for name in [
            format!("rows_per_s_{label}_at_3000"),
            format!("rows_per_s_{label}_at_max"),
            format!("q3_ms_{label}"),
        ] {
            assert!(
                recorded.contains(&format!("\"{name}\"")),
                "{name} not recorded:\n{recorded}"
            );
        }
    }
}

#[test]
fn bad_arguments_name_their_position() {
    let results = tempfile::tempdir().unwrap();
    let out = peers("retina,oracle", results.path());
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--systems, entry 2: unknown system `oracle`"),
        "{err}"
    );
    if !cfg!(feature = "peer-duckdb") {
        let out = peers("duckdb", results.path());
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--features peers"), "{err}");
    }
}
