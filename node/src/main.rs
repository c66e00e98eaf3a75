//! The `retina` command.

mod bench;
mod demo;
mod serve;

use clap::{Parser, Subcommand};

// Replay allocates many short-lived rows and JSON values; mimalloc handles that pattern
// markedly better than glibc's allocator (measured with `retina bench replay`).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    /// Runs the storage engine on a generated CH-benCHmark order-line stream in a temporary
    /// directory and shows what it does: replay, flushes into Parquet, snapshot reads, GC.
    Demo(demo::DemoArgs),
    /// Runs a node: replays a Debezium JSON source into Parquet until stopped (SIGTERM, Ctrl-C).
    Serve(serve::ServeArgs),
    /// Measures a node on generated workloads (see shared BENCH.md).
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args),
    }
}
