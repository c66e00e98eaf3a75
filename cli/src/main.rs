//! The `retina` command.

mod bench;
mod ch;
mod cluster;
mod demo;
mod measure;
mod peers;
mod serve;
mod sql;

use clap::{Parser, Subcommand};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

// Replay allocates many short-lived rows and JSON values; mimalloc handles that pattern
// markedly better than glibc's allocator (measured with `retina bench replay`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `mi_option_purge_delay` in mimalloc.h (the 16th option, in both v2 and v3).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// Freed memory stays with the process (-1: mimalloc never purges it to the OS) and is reused.
/// With mimalloc's default (purge after 10 ms) the pages of every op batch a shard frees go back
/// to the OS and the sink faults fresh zeroed (huge) pages in again; never purging gave about
/// 20% more rows/s from Debezium JSON and 25% from batches in `retina bench replay` (delays of
/// 1 s and 10 s recovered only part of that). The cost: RSS stays at its peak, the working set
/// of a long-running node.
const ALLOCATOR_PURGE_DELAY_MS: std::os::raw::c_long = -1;
/// `mi_option_allow_thp` in mimalloc.h (v3, the version the `mimalloc` crate links).
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

#[derive(Parser)]
#[command(
    name = "retina",
    version,
    about = "Real-time transactional data sync for lakehouses"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs everything embedded on a generated CH-benCHmark workload in a temporary directory:
    /// a node replays the load and a steady change stream (Debezium JSON), with live rows/s,
    /// HWM, freshness and memory, then CH queries through the SQL connector and a summary.
    Demo(demo::DemoArgs),
    /// Runs a node: replays a Debezium JSON source into Parquet until stopped (SIGTERM, Ctrl-C).
    Serve(Box<serve::ServeArgs>),
    /// Runs one SQL statement against a running node, at one snapshot of all its tables.
    Sql(sql::SqlArgs),
    /// Measures a node on generated workloads (see bench/README.md).
    Bench(bench::BenchArgs),
    /// Looks at a cluster of nodes (`retina serve --cluster`).
    Cluster(cluster::ClusterArgs),
}

/// Turns transparent huge pages off for this process, unless `MIMALLOC_ALLOW_THP` says
/// otherwise. mimalloc asks the kernel for huge pages (`madvise`), and the kernel zeroes a whole
/// 2 MiB page on the first touch of any byte of it: in `retina bench replay` on a machine whose
/// THP setting is `madvise`, the JSON replay spent most of its time in `clear_page_erms` and
/// reached 260K rows/s on two shards, against 435K with huge pages off (every thread's CPU per
/// row fell: the writer's from 1.9 to 0.5 µs). Both switches are needed: mimalloc's option for
/// the memory it maps from now on, the process flag for the arena it reserved before `main`.
fn disable_transparent_huge_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    // SAFETY: sets a process-wide allocator option by its documented index; no other thread
    // runs yet.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ALLOW_THP, 0) };
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours. Failure
    // (an old kernel) leaves huge pages on, which is only slower.
    unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

/// The log's levels: INFO, some chatty libraries less, and `RUST_LOG` (`debug`,
/// `retina_node=debug,info`, ...) over those; with the reason a `RUST_LOG` given was not used.
fn log_filter(rust_log: Option<&str>) -> (Targets, Option<String>) {
    // delta-rs (only in `bench peers` builds) logs every snapshot it loads at INFO, and routine
    // MERGE metrics at WARN; rskafka (the Kafka source) every connection it opens at INFO.
    let filter = Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("rskafka", LevelFilter::WARN)
        .with_target("deltalake", LevelFilter::ERROR)
        .with_target("buoyant_kernel", LevelFilter::ERROR);
    let Some(spec) = rust_log.filter(|s| !s.trim().is_empty()) else {
        return (filter, None);
    };
    match spec.parse::<Targets>() {
        Ok(given) => {
            let filter = match given.default_level() {
                Some(level) => filter.with_default(level),
                None => filter,
            };
            (filter.with_targets(given), None)
        }
        Err(e) => (
            filter,
            Some(format!(
                "RUST_LOG={spec:?} is not a list of [target=]level: {e}"
            )),
        ),
    }
}

fn main() -> anyhow::Result<()> {
    // SAFETY: sets a process-wide allocator option by its documented index; no other thread
    // runs yet.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, ALLOCATOR_PURGE_DELAY_MS) };
    disable_transparent_huge_pages();
    let (filter, bad_log_spec) = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_max_level(LevelFilter::TRACE)
        .finish()
        .with(filter)
        .init();
    if let Some(e) = bad_log_spec {
        tracing::warn!("{e}; logging at the default levels");
    }
    match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
        Command::Serve(args) => serve::run(*args),
        Command::Sql(args) => sql::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Cluster(args) => cluster::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    #[test]
    fn rust_log_sets_levels_over_the_defaults_and_a_bad_one_is_named() {
        let (filter, bad) = log_filter(None);
        assert!(bad.is_none());
        assert!(filter.would_enable("retina_node::sink", &Level::INFO));
        assert!(!filter.would_enable("retina_node::sink", &Level::DEBUG));
        assert!(!filter.would_enable("rskafka::client", &Level::INFO));

        let (filter, bad) = log_filter(Some("retina_node=debug"));
        assert!(bad.is_none());
        assert!(filter.would_enable("retina_node::query", &Level::DEBUG));
        assert!(!filter.would_enable("retina_storage", &Level::DEBUG));
        assert!(filter.would_enable("retina_storage", &Level::INFO));

        let (filter, _) = log_filter(Some("warn,retina_node=trace"));
        assert!(!filter.would_enable("retina_storage", &Level::INFO));
        assert!(filter.would_enable("retina_node::shard", &Level::TRACE));

        for blank in [Some(""), Some("  ")] {
            let (filter, bad) = log_filter(blank);
            assert!(bad.is_none());
            assert!(filter.would_enable("retina", &Level::INFO));
        }
        let (filter, bad) = log_filter(Some("retina_node=loud"));
        let bad = bad.expect("a bad RUST_LOG is named");
        assert!(bad.contains("retina_node=loud"), "{bad}");
        assert!(filter.would_enable("retina_node", &Level::INFO));
        assert!(!filter.would_enable("retina_node", &Level::DEBUG));
    }
}
