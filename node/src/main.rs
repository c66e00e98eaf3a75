//! The `retina` command.

mod demo;
mod serve;

use clap::{Parser, Subcommand};

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
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
        Command::Serve(args) => serve::run(args),
    }
}
