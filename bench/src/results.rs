//! Results as JSON lines under `bench/results/`, one object per measurement, so a run can be
//! compared with the last one and with the paper.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;

/// The results folder: `RETINA_BENCH_RESULTS` if set (tests point it at a temporary folder),
/// else `bench/results/` of the workspace (beside this crate's manifest).
pub fn results_dir() -> PathBuf {
    std::env::var_os("RETINA_BENCH_RESULTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("results"))
}

/// Appends one measurement to `bench/results/{file}.jsonl`: `{"name":..,"value":..,"unit":..}`
/// plus the time it was taken.
pub fn record(file: &str, name: &str, value: f64, unit: &str) -> std::io::Result<()> {
    let dir = results_dir();
    std::fs::create_dir_all(&dir)?;
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{file}.jsonl")))?;
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    writeln!(
        f,
        "{{\"at\":{at},\"name\":{name:?},\"value\":{value},\"unit\":{unit:?}}}"
    )
}
