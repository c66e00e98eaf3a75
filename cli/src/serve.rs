//! `retina serve`: a node replaying a Debezium JSON source, serving until it is stopped.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use retina_node::catalog::Catalog;
use retina_node::debezium::TxnMode;
use retina_node::node::{Node, NodeOptions, NodeStatus};
use retina_node::settings::Settings;
use retina_node::sink::{OnError, SinkOptions, SourceSpec};
use signal_hook::consts::{SIGINT, SIGTERM};

/// What the serving thread waits for.
enum Event {
    Signal(i32),
    /// The sink's run ended (the run's number: an earlier run's end is old news); its handle
    /// has the report.
    SinkDone(u64),
    /// A cluster member: this node leads now, with this epoch (or could not find out).
    Leading(Result<u64, String>),
    /// A cluster member: its lease expired; another node may lead.
    LeaseLost,
    /// A cluster's leader: replay stopped for a reason of this node's own (see
    /// `NodeStatus::failed_here`); another member should take over.
    FailedHere,
    /// A cluster's leader lost a member that runs some of its shards: it starts again from
    /// the newest checkpoint, with the next epoch, over the members live then.
    HostLost,
    /// A cluster's leader sees a member that can run shards and was not there when it placed
    /// them: it starts again likewise, to place shards on it too.
    HostJoined,
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// Where the node keeps its state and, by default, its lake (Parquet files under
    /// `lake/`).
    #[arg(long)]
    data_dir: PathBuf,
    /// Where the lake goes: `s3://BUCKET/PREFIX` (default: DATA_DIR/lake on local disk). The
    /// S3 client is configured from the standard environment: AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT (or AWS_ENDPOINT_URL) and
    /// AWS_ALLOW_HTTP=true for a plain-HTTP endpoint. With an S3 lake every checkpoint is also
    /// kept in the bucket (PREFIX/checkpoints/), so a node started elsewhere with an empty
    /// --data-dir, the same --lake and the same source recovers from the newest one.
    /// `retina sql` reads the lake with the same variables from its own environment.
    #[arg(long, value_name = "s3://BUCKET/PREFIX")]
    lake: Option<retina_node::lake::LakeSpec>,
    /// SQL DDL of the tables to replay (`CREATE TABLE ... PRIMARY KEY (...)`). Declare time
    /// columns with the source's fractional-second precision: without the envelope schema an
    /// integer time is read in the unit it implies (`TIMESTAMP(0..3)`/`TIME(0..3)`:
    /// milliseconds, `(4..6)`: microseconds, `(7..9)`: nanoseconds; undeclared: 6). MySQL's
    /// plain DATETIME is DATETIME(0): declare it so. With a Postgres source it may be left
    /// out: the publication's tables are then read from Postgres.
    #[arg(long)]
    schema: Option<PathBuf>,
    /// The change stream: `file:PATH` or `stdin` (Debezium JSON, one message per line), or
    /// Debezium's topics on Kafka: `kafka://HOST:PORT[,HOST:PORT...]?topic_prefix=PREFIX`
    /// (the connector's `topic.prefix`; optional `topics=A,B` or `topics_regex=RE` instead of
    /// every `PREFIX.*` topic, `transaction_topic=T` (default `PREFIX.transaction`), and
    /// `max_buffered=N`, the events of later transactions held while one waits for a slower
    /// partition, default 1000000), or a Postgres publication through a logical replication
    /// slot: `postgres://USER[:PASSWORD]@HOST:PORT/DB?publication=PUB&slot=SLOT` (optional
    /// `sslmode=require|verify-ca|verify-full`, `sslrootcert=PATH`; the password also from
    /// PGPASSWORD or ~/.pgpass). The first run creates the slot and copies the tables.
    #[arg(long)]
    source: SourceSpec,
    /// Replayer shards (default: the config file's, else one per core).
    #[arg(long)]
    shards: Option<u16>,
    /// Settings file (TOML); see ops/retina.toml.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides one setting of the file (repeatable): `--set zstd_level=0`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Keep reading at the end of the source file, like `tail -f` (a Kafka source always is).
    #[arg(long)]
    follow: bool,
    /// The stream has no BEGIN/END transaction metadata: replay each event as a transaction.
    #[arg(long)]
    no_txn_metadata: bool,
    /// A transaction that cannot be replayed stops replay (stop), or goes to the dead-letter
    /// file while replay goes on (skip).
    #[arg(long, value_enum, default_value_t = OnError::Stop)]
    on_error: OnError,
    /// Dead-letter file for `--on-error skip` (default: DATA_DIR/dead-letter.jsonl).
    #[arg(long)]
    dead_letter: Option<PathBuf>,
    /// Where the coordinator's Cap'n Proto service listens (port 0: any free port). An address
    /// beyond loopback needs --auth-token. A cluster's standby passes connections here to the
    /// leader's coordinator service.
    #[arg(long, default_value = "127.0.0.1:7400")]
    listen: SocketAddr,
    /// The token query clients present when they bootstrap (and Arrow Flight clients as the
    /// header `authorization: Bearer TOKEN`).
    #[arg(long, env = "RETINA_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    /// Serve Arrow Flight and Flight SQL on this address, e.g. 127.0.0.1:8815 (port 0: any
    /// free port): pyarrow, ADBC and JDBC drivers, DuckDB and other engines read the tables at
    /// one snapshot. An address beyond loopback needs --auth-token.
    #[arg(long, value_name = "HOST:PORT")]
    flight: Option<SocketAddr>,
    /// The memory the Flight service's reads take together, in MiB (sorts, joins and
    /// aggregates of Flight SQL spill to temporary files beyond it, or fail).
    #[arg(long, default_value_t = 2048, value_name = "MIB")]
    flight_memory_mb: usize,
    /// Serve Prometheus metrics over HTTP on this address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    metrics: Option<SocketAddr>,
    /// Run as a member of a cluster whose metadata is in etcd:
    /// `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`. One member leads (replays the source and
    /// serves queries); the others wait as standbys and the first to see the leader's lease
    /// expire takes over from the newest checkpoint the cluster recorded. Every member needs
    /// the same --lake (on S3), --source and --schema, and a --node-id of its own.
    #[arg(
        long,
        value_name = "etcd://HOST:PORT[,...]/PREFIX",
        requires = "node_id"
    )]
    cluster: Option<retina_node::cluster::ClusterSpec>,
    /// This node's id in the cluster (letters, digits, `.`, `_`, `-`).
    #[arg(long, requires = "cluster")]
    node_id: Option<String>,
    /// Where clients reach this node's coordinator service when it leads, as the cluster
    /// lists it (default: --listen).
    #[arg(long, requires = "cluster", value_name = "HOST:PORT")]
    advertise: Option<String>,
    /// Seconds a cluster member's lease lasts without renewal (at least 2): a standby takes
    /// over about this long after the leader stops, and a leader that cannot reach etcd pauses
    /// replay once it runs out.
    #[arg(long, default_value_t = 5, value_name = "SECONDS")]
    lease_ttl: u64,
    /// Run shards for the cluster's leader: it connects here (TCP), and shard k placed on this
    /// member serves its scans on the port k + 1 after this one, on the same address, which
    /// the leader and query clients must reach. The leader places the shards (the cluster's
    /// --shards) over itself and every live member with --peer, round-robin.
    #[arg(long, requires = "cluster", value_name = "HOST:PORT")]
    peer: Option<SocketAddr>,
}

/// Checks a node id: what etcd keys and logs can carry unquoted.
fn check_node_id(id: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !id.is_empty()
            && id.len() <= 64
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')),
        "--node-id `{id}`: use 1 to 64 letters, digits, `.`, `_` or `-`"
    );
    Ok(())
}

/// The catalog: the `--schema` file's tables, or a Postgres publication's as Postgres defines
/// them.
pub fn load_catalog(
    schema: Option<&std::path::Path>,
    source: &SourceSpec,
) -> anyhow::Result<Catalog> {
    match (schema, source) {
        (Some(path), _) => {
            let ddl = std::fs::read_to_string(path)
                .with_context(|| format!("reading the schema {}", path.display()))?;
            Ok(Catalog::from_ddl(&ddl, &path.display().to_string())?)
        }
        (None, SourceSpec::Postgres(spec)) => {
            let ddl = retina_node::sink::postgres::read_catalog_ddl(spec)
                .map_err(|e| anyhow::anyhow!("reading the catalog from Postgres: {e}"))?;
            tracing::info!("the tables as Postgres defines them:\n{ddl}");
            Ok(Catalog::from_ddl(&ddl, &spec.to_string())?)
        }
        (None, _) => anyhow::bail!("--schema is needed (only a Postgres source can do without)"),
    }
}

pub fn run(mut args: ServeArgs) -> anyhow::Result<()> {
    // Absolute once: the node and the dead-letter file must not depend on the working folder.
    args.data_dir = retina_node::node::absolute_dir(&args.data_dir)
        .with_context(|| format!("data directory {}", args.data_dir.display()))?;
    let mut settings = Settings::load(args.config.as_deref(), &args.overrides)?;
    if let Some(n) = args.shards {
        settings.shards = n;
    }
    settings.validate()?;
    let catalog = Arc::new(load_catalog(args.schema.as_deref(), &args.source)?);
    let max_group_txns = settings.max_group_txns;
    let max_txn_bytes = settings.max_txn_bytes;
    let decode_lanes = settings.decode_lanes();
    let group_commit_interval = Duration::from_millis(settings.group_commit_interval_ms);
    let checkpoint_interval = (settings.checkpoint_interval_ms > 0)
        .then(|| Duration::from_millis(settings.checkpoint_interval_ms));
    let shards = settings.shard_count();

    // Signals, the sink's end and the cluster's news arrive on one queue.
    let (events, next) = flume::bounded::<Event>(4);
    {
        let events = events.clone();
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        std::thread::Builder::new()
            .name("retina-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    if events.send(Event::Signal(signal)).is_err() {
                        break;
                    }
                }
            })?;
    }

    // A cluster member joins, then waits as a standby until it leads.
    let mut leave = None;
    let (member, mut listener) = match &args.cluster {
        Some(spec) => {
            let id = args.node_id.as_deref().unwrap_or_default();
            check_node_id(id)?;
            anyhow::ensure!(
                args.lake.as_ref().is_some_and(|l| l.is_remote()),
                "--cluster: every member reads and writes one lake, so give --lake s3://BUCKET/PREFIX"
            );
            let advertise = args
                .advertise
                .clone()
                .unwrap_or_else(|| args.listen.to_string());
            let ttl = Duration::from_secs(args.lease_ttl);
            if let Some(peer) = args.peer {
                anyhow::ensure!(
                    !peer.ip().is_unspecified(),
                    "--peer {peer}: give the address the leader and query clients reach this \
                     node at, not a wildcard"
                );
            }
            let peer = args.peer.map(|p| p.to_string());
            // Until it leads, it runs the shards a leader places on it. It listens before it
            // joins: a member started again (same id, same --peer) waits for its old lease to
            // expire before it registers, and the leader finds it at the address registered
            // meanwhile, so its shard starts again on it at once.
            let host = match args.peer {
                Some(peer) => Some(retina_node::remote::Host::start(
                    retina_node::remote::HostOptions {
                        peer,
                        data_dir: args.data_dir.clone(),
                        lake: args.lake.clone().unwrap_or_default(),
                        catalog: catalog.clone(),
                        settings: settings.clone(),
                        auth_token: args.auth_token.clone(),
                    },
                )?),
                None => None,
            };
            let member =
                retina_node::cluster::Member::join(spec, id, &advertise, peer.as_deref(), ttl)?;
            // Until it leads, its metrics are those of the shards it runs.
            let host_metrics = match (&host, args.metrics) {
                (Some(host), Some(addr)) => {
                    let status = host.status();
                    let current = move || {
                        (status.lock().expect("status lock").clone())
                            .unwrap_or_else(|| Arc::new(NodeStatus::default()))
                    };
                    let stop = Arc::new(AtomicBool::new(false));
                    let (bound, thread) = retina_node::metrics::serve(addr, current, stop.clone())
                        .with_context(|| format!("serving metrics on {addr}"))?;
                    tracing::info!("metrics of the shards run here on http://{bound}/metrics");
                    Some((bound, thread, stop))
                }
                _ => None,
            };
            // Until it leads, its --listen passes connections to the leader's.
            let forwarder =
                retina_node::cluster::forward::Forwarder::start(args.listen, spec.clone())
                    .with_context(|| format!("listening on {}", args.listen))?;
            {
                let (member, events) = (member.clone(), events.clone());
                std::thread::Builder::new()
                    .name("retina-campaign".into())
                    .spawn(move || {
                        let led = member.lead().map_err(|e| e.to_string());
                        let _ = events.send(Event::Leading(led));
                    })?;
            }
            let epoch = loop {
                match next.recv().expect("this thread holds a sender") {
                    Event::Leading(Ok(epoch)) => break epoch,
                    Event::Leading(Err(e)) => anyhow::bail!("waiting to lead {spec}: {e}"),
                    Event::Signal(signal) => {
                        tracing::info!("standby stopping on signal {signal}");
                        if let Some(host) = host {
                            host.stop();
                        }
                        member.leave();
                        return Ok(());
                    }
                    Event::SinkDone(_)
                    | Event::LeaseLost
                    | Event::FailedHere
                    | Event::HostLost
                    | Event::HostJoined => {}
                }
            };
            // The port is this node's own now: its socket passes to the coordinator's service
            // (never free meanwhile). So are the shards it ran for the leader before (their
            // sessions end; the new leadership starts them from its checkpoint).
            let listener = forwarder.stop();
            if let Some(host) = host {
                host.stop();
            }
            // The leader serves its own on the same address.
            if let Some((bound, thread, stop)) = host_metrics {
                stop.store(true, Ordering::Relaxed);
                retina_node::metrics::stop(bound, thread);
            }
            tracing::info!("leading the cluster {spec} with epoch {epoch}");
            // However this run ends, the lease goes with it and a standby takes over at once.
            leave = Some(LeaveOnExit(member.clone()));
            {
                let (lost, events) = (member.lost(), events.clone());
                std::thread::Builder::new()
                    .name("retina-lease".into())
                    .spawn(move || {
                        // Woken by the loss, or closed with the member: only a loss counts.
                        if lost.recv().is_ok() {
                            let _ = events.send(Event::LeaseLost);
                        }
                    })?;
            }
            (Some(member), listener)
        }
        None => (None, None),
    };
    // The first start takes the standby's socket; a node started again binds the address.
    let mut start = || {
        Node::start(NodeOptions {
            data_dir: args.data_dir.clone(),
            lake: args.lake.clone().unwrap_or_default(),
            catalog: catalog.clone(),
            settings: settings.clone(),
            listen: Some(args.listen),
            listener: listener.take(),
            auth_token: args.auth_token.clone(),
            // Queries wait until the sink replayed what the source held before a restart.
            await_source: true,
            cluster: member.clone(),
        })
    };
    if let Some(listen) = args.flight {
        // Shard n serves scans on the coordinator's port + 1 + n.
        let scans =
            args.listen.port().saturating_add(1)..=args.listen.port().saturating_add(shards);
        let same_host = listen.ip() == args.listen.ip()
            || listen.ip().is_unspecified()
            || args.listen.ip().is_unspecified();
        anyhow::ensure!(
            !same_host
                || args.listen.port() == 0
                || listen.port() == 0
                || (listen.port() != args.listen.port() && !scans.contains(&listen.port())),
            "--flight {listen}: ports {} to {} are the coordinator's and its shards' scan \
             services (--listen {}); choose another port, e.g. 8815",
            args.listen.port(),
            scans.end(),
            args.listen
        );
    }
    let mut node = start()?;
    if let Some(addr) = node.coordinator_addr() {
        tracing::info!("coordinator service (Cap'n Proto) on {addr}");
    }
    let flight = match args.flight {
        Some(listen) => {
            let node_addr = node
                .coordinator_addr()
                .context("the Flight service reads through the coordinator's --listen")?;
            let server = retina_flight::FlightServer::start(retina_flight::FlightOptions {
                listen,
                node: node_addr,
                token: args.auth_token.clone(),
                threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
                memory_limit: args.flight_memory_mb << 20,
            })?;
            tracing::info!("Arrow Flight and Flight SQL on {}", server.addr());
            Some(server)
        }
        None => None,
    };
    tracing::info!(
        "serving {} tables on {shards} shards from {}; data in {}, lake {}",
        catalog.tables().len(),
        args.source,
        args.data_dir.display(),
        args.lake.clone().unwrap_or_default()
    );

    // Stops the metrics server.
    let stop = Arc::new(AtomicBool::new(false));
    // The node's status, for metrics: a node restarted to skip a refused transaction has a
    // new one.
    let status = Arc::new(RwLock::new(node.handle().status().clone()));
    if member.is_some() {
        // A leader that fails for a reason of its own hands over, even while its source is
        // quiet (the sink only notices a failure when it has something to replay).
        let (status, events, stop) = (status.clone(), events.clone(), stop.clone());
        // Likewise a leader that lost a member running its shards starts again at once, and
        // one that sees a new member that can run shards (checked every second) places shards
        // on it.
        let member = member.clone().expect("a member");
        std::thread::Builder::new()
            .name("retina-failed-here".into())
            .spawn(move || {
                let mut told_lost = None;
                let mut polls = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                    polls += 1;
                    if polls.is_multiple_of(10) && host_joined(&member) {
                        let _ = events.send(Event::HostJoined);
                    }
                    let current = status.read().expect("status lock").clone();
                    if current.failed_here.load(Ordering::Acquire) {
                        let _ = events.send(Event::FailedHere);
                        return;
                    }
                    let this = Arc::as_ptr(&current);
                    if current.host_lost.load(Ordering::Acquire) && told_lost != Some(this) {
                        told_lost = Some(this);
                        let _ = events.send(Event::HostLost);
                    }
                }
            })?;
    }
    let metrics = match args.metrics {
        Some(addr) => {
            let status = status.clone();
            let current = move || status.read().expect("status lock").clone();
            let (bound, thread) = retina_node::metrics::serve(addr, current, stop.clone())
                .with_context(|| format!("serving metrics on {addr}"))?;
            tracing::info!("metrics on http://{bound}/metrics");
            Some((bound, thread))
        }
        None => None,
    };

    let options = SinkOptions {
        source: args.source.clone(),
        // A Kafka topic or a replication slot has no end: the node reads on as it grows.
        follow: args.follow
            || matches!(args.source, SourceSpec::Kafka(_) | SourceSpec::Postgres(_)),
        mode: if args.no_txn_metadata {
            TxnMode::NoMetadata
        } else {
            TxnMode::Metadata
        },
        on_error: args.on_error,
        dead_letter: args
            .dead_letter
            .clone()
            .unwrap_or_else(|| args.data_dir.join("dead-letter.jsonl")),
        max_group_txns,
        group_commit_interval,
        checkpoint_interval,
        max_txn_bytes,
        decode_lanes,
    };

    // Starts the node again from its newest checkpoint (after replay skipped a refused
    // transaction, or a cluster's leader lost a member running its shards).
    let mut restart = |node: Node| -> anyhow::Result<Node> {
        node.shutdown();
        if let Some(member) = &member {
            let epoch = member.next_epoch()?;
            tracing::info!("leading with epoch {epoch} from now on");
        }
        let node = start()?;
        *status.write().expect("status lock") = node.handle().status().clone();
        if let (Some(flight), Some(addr)) = (&flight, node.coordinator_addr()) {
            flight.reconnect(addr)?;
        }
        Ok(node)
    };
    let mut run = 0u64;
    let signal = 'serve: loop {
        run += 1;
        let sink = {
            let events = events.clone();
            retina_node::sink::spawn_with(node.handle().clone(), options.clone(), move || {
                let _ = events.send(Event::SinkDone(run));
            })?
        };
        // Serve until SIGTERM or Ctrl-C.
        let event = loop {
            match next.recv().expect("this thread holds a sender") {
                Event::SinkDone(r) if r != run => {}
                Event::HostLost if !node.handle().status().host_lost.load(Ordering::Acquire) => {}
                Event::HostJoined if !member.as_ref().is_some_and(|m| host_joined(m)) => {}
                // Moved to it from members that run more, while the other shards go on.
                Event::HostJoined if node.rebalance() => {}
                event => break event,
            }
        };
        match event {
            Event::LeaseLost | Event::Leading(_) => {
                sink.stop();
                return lease_lost(node, &stop, flight, metrics);
            }
            Event::FailedHere => {
                sink.stop();
                return failed_here(node, &stop, flight, metrics);
            }
            Event::HostLost => {
                tracing::warn!(
                    "{}; starting again from the newest checkpoint",
                    node.handle().status().error().unwrap_or_default()
                );
                let _ = sink.stop_and_join();
                node = restart(node)?;
                continue;
            }
            Event::HostJoined => {
                tracing::info!(
                    "a member that runs shards joined, and the shards to spare run here; \
                     starting again from the newest checkpoint to place shards on it"
                );
                let _ = sink.stop_and_join();
                node = restart(node)?;
                continue;
            }
            Event::Signal(signal) => {
                sink.stop();
                stop.store(true, Ordering::Relaxed);
                // A sink blocked on stdin cannot be interrupted; give it a moment, then go on
                // without it.
                for _ in 0..50 {
                    if sink.is_finished() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                break signal;
            }
            Event::SinkDone(_) => {
                // `on_end` runs only once the run has returned its report.
                let report = sink.join().expect("the sink's run ended");
                if let Some(why) = &report.restart {
                    tracing::warn!("{why}; restarting from the checkpoint to replay without it");
                    node = restart(node)?;
                    continue;
                }
                if node.handle().status().host_lost.load(Ordering::Acquire) {
                    tracing::warn!(
                        "{}; starting again from the newest checkpoint",
                        node.handle().status().error().unwrap_or_default()
                    );
                    node = restart(node)?;
                    continue;
                }
                match &report.stopped_by {
                    Some(_)
                        if member.is_some()
                            && node.handle().status().failed_here.load(Ordering::Acquire) =>
                    {
                        return failed_here(node, &stop, flight, metrics);
                    }
                    Some(e) => tracing::error!("replay stopped: {e}"),
                    None => tracing::info!(
                        "source done: {} transactions, {} duplicates skipped, {} dead-lettered; still serving",
                        report.transactions,
                        report.duplicates_skipped,
                        report.dead_lettered
                    ),
                }
                // Still serving queries until SIGTERM or Ctrl-C.
                let signal = loop {
                    match next.recv().expect("this thread holds a sender") {
                        Event::Signal(signal) => break signal,
                        Event::LeaseLost => return lease_lost(node, &stop, flight, metrics),
                        Event::FailedHere => return failed_here(node, &stop, flight, metrics),
                        Event::HostLost
                            if node.handle().status().host_lost.load(Ordering::Acquire) =>
                        {
                            // The source was done: replay from the checkpoint to its end.
                            node = restart(node)?;
                            continue 'serve;
                        }
                        Event::HostJoined
                            if member.as_ref().is_some_and(|m| host_joined(m))
                                && !node.rebalance() =>
                        {
                            node = restart(node)?;
                            continue 'serve;
                        }
                        Event::SinkDone(_)
                        | Event::Leading(_)
                        | Event::HostLost
                        | Event::HostJoined => {}
                    }
                };
                break signal;
            }
        }
    };
    tracing::info!("stopping on signal {signal}");
    let hwm = stop_serving(node, &stop, flight, metrics);
    tracing::info!("stopped at HWM {hwm}");
    drop(leave);
    Ok(())
}

/// Whether a member that runs shards is live now and was not when this leader placed them
/// (a member that cannot be asked is not counted).
fn host_joined(member: &retina_node::cluster::Member) -> bool {
    let placed = member.placed_over();
    !placed.is_empty()
        && member
            .hosts()
            .is_ok_and(|hosts| hosts.iter().any(|(id, _)| !placed.contains(id)))
}

/// Leaves the cluster when dropped: on a stop, and on an error after the node began to lead.
struct LeaveOnExit(Arc<retina_node::cluster::Member>);

impl Drop for LeaveOnExit {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// This node's cluster lease expired, so another node may lead: it stops serving at once,
/// and the process ends with an error (a supervisor starts it again, as a standby).
fn lease_lost(
    node: Node,
    stop: &AtomicBool,
    flight: Option<retina_flight::FlightServer>,
    metrics: Option<(SocketAddr, std::thread::JoinHandle<()>)>,
) -> anyhow::Result<()> {
    let hwm = stop_serving(node, stop, flight, metrics);
    anyhow::bail!(
        "this node's cluster lease expired at HWM {hwm}: another node may lead now, so this one \
         stopped; start it again to stand by"
    )
}

/// Replay stopped on this cluster leader for a reason of its own: it stops serving and the
/// process ends with an error, leaving the cluster (see `LeaveOnExit`) so that a standby takes
/// over at once.
fn failed_here(
    node: Node,
    stop: &AtomicBool,
    flight: Option<retina_flight::FlightServer>,
    metrics: Option<(SocketAddr, std::thread::JoinHandle<()>)>,
) -> anyhow::Result<()> {
    let error = node.handle().status().error().unwrap_or_default();
    let hwm = stop_serving(node, stop, flight, metrics);
    anyhow::bail!(
        "replay stopped on this node at HWM {hwm} ({error}): it leaves the cluster, so that \
         another member takes over"
    )
}

/// Stops the Flight service, the node and the metrics server; the HWM it stopped at.
fn stop_serving(
    node: Node,
    stop: &AtomicBool,
    flight: Option<retina_flight::FlightServer>,
    metrics: Option<(SocketAddr, std::thread::JoinHandle<()>)>,
) -> u64 {
    stop.store(true, Ordering::Relaxed);
    let hwm = node.handle().status().hwm().get().get();
    if let Some(flight) = flight {
        flight.stop();
    }
    node.shutdown();
    if let Some((bound, thread)) = metrics {
        retina_node::metrics::stop(bound, thread);
    }
    hwm
}
