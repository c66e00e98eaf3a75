//! Retina's workloads and measurement helpers: CH-benCHmark-shaped rows for the storage
//! microbenchmarks (`ch`), the CH-benCHmark and HyBench generators (`chgen`, `hybench`: load,
//! change stream), what they share (`workload`: self-check, Debezium JSON, the `fresh_ts`
//! clock), a JSON-lines results writer, a Kafka broker on loopback (`kafka`), a PostgreSQL
//! server on loopback (`postgres`) and the ports such servers listen on (`ports`).

pub mod ch;
pub mod chgen;
pub mod etcd;
pub mod hybench;
pub mod kafka;
pub mod moto;
pub mod ports;
pub mod postgres;
pub mod report;
pub mod results;
pub mod workload;

/// Whether the test server `program` can be started (`program arg` succeeds). CI installs the
/// servers (`.ci/run`), so there a missing one is a failure, not a skip; elsewhere the caller
/// skips after a note saying how to `install` it.
pub fn server_available(program: &str, arg: &str, install: &str) -> bool {
    let ok = std::process::Command::new(program)
        .arg(arg)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("{program} is required in CI: .ci/run installs it ({install})");
        }
        eprintln!("note: {program} is not installed ({install}); skipping this test");
    }
    ok
}
