//! `retina demo` end to end on a tiny scale: it generates the CH-benCHmark dataset, replays the
//! load and a short stream through a node, runs the CH queries through the SQL connector, prints
//! a summary, and keeps or removes its files as asked.

use std::process::Command;

fn demo(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_retina"))
        .args([
            "demo",
            "--scale",
            "tiny",
            "--seconds",
            "3",
            "--rate",
            "2000",
            "--shards",
            "2",
        ])
        .args(extra)
        .output()
        .unwrap();
    retina_tests::stdout_of(&out)
}

/// The folder a line `  <word> <path>...` names.
fn folder_after<'a>(out: &'a str, word: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(word))
        .and_then(|rest| rest.trim().split([' ', ':']).next())
        .unwrap_or_else(|| panic!("no `{word}` line in:\n{out}"))
}

#[test]
fn the_demo_replays_queries_and_cleans_up() {
    let out = demo(&[]);
    for want in [
        "generated the initial load",
        "replayed the load",
        "CH Q1",
        "CH Q6",
        "CH Q3",
        "| ol_number |",
        "summary",
        "freshness (query start - newest fresh_ts",
    ] {
        assert!(out.contains(want), "missing `{want}` in:\n{out}");
    }
    // Every order line the stream wrote is replayed: the stream line counts rows.
    assert!(!out.contains("replay stopped"), "{out}");
    let dir = folder_after(&out, "removed");
    assert!(!std::path::Path::new(dir).exists(), "{dir} was removed");
}

#[test]
fn with_keep_the_files_stay() {
    let out = demo(&["--keep"]);
    let dir = std::path::PathBuf::from(folder_after(&out, "kept"));
    for f in [
        "ch.sql",
        "changes.json",
        "data/lake",
        "data/coordinator.state",
    ] {
        assert!(dir.join(f).exists(), "{} is kept", dir.join(f).display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
