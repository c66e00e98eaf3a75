//! Retina's end-to-end, model-based and interoperability tests live in `tests/`; this library
//! holds what they share.

pub mod cdc;

use std::process::Command;

/// Whether `python3` can import pyarrow. CI installs it (`.ci/run`), so there a missing
/// pyarrow is a failure, not a skip.
pub fn pyarrow_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import pyarrow.parquet"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("CI").is_some() {
        panic!("pyarrow is required in CI: .ci/run installs it with pip");
    }
    ok
}
