//! The `retina` command.

mod demo;

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
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Demo(args) => demo::run(args),
    }
}
