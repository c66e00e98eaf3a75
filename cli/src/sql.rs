//! `retina sql`: one statement through the DataFusion connector, at one snapshot.

use std::net::SocketAddr;

use anyhow::Context;
use futures::TryStreamExt;
use retina_query::{Format, Retina, write_batches};

#[derive(clap::Args)]
pub struct SqlArgs {
    /// The statement, e.g. "SELECT count(*) FROM orderline".
    statement: String,
    /// The node's coordinator service. A node whose lake is on S3 is read with this
    /// process's AWS_* environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT, AWS_ALLOW_HTTP).
    #[arg(long, default_value = "127.0.0.1:7400", conflicts_with = "cluster")]
    connect: SocketAddr,
    /// Reads from whichever member leads this cluster (`etcd://HOST:PORT[,...]/PREFIX`, as the
    /// nodes were given), at the address it advertises, instead of --connect.
    #[arg(long, value_name = "etcd://HOST:PORT[,...]/PREFIX")]
    cluster: Option<retina_node::cluster::ClusterSpec>,
    /// The node's auth token, if it has one.
    #[arg(
        long,
        env = "RETINA_AUTH_TOKEN",
        default_value = "",
        hide_env_values = true
    )]
    auth_token: String,
    /// How to print the result: table, csv or json (one object per line).
    #[arg(long, default_value = "table")]
    format: Format,
    /// Print the snapshot the statement read at and its time to stderr.
    #[arg(long)]
    timing: bool,
}

/// The address the leader of `cluster` advertises.
fn leader_address(cluster: &retina_node::cluster::ClusterSpec) -> anyhow::Result<SocketAddr> {
    let advertise = retina_node::cluster::Member::leader_address(cluster)?
        .with_context(|| format!("no member leads the cluster {cluster} now"))?;
    std::net::ToSocketAddrs::to_socket_addrs(&advertise)
        .ok()
        .and_then(|mut a| a.next())
        .with_context(|| format!("the leader of {cluster} advertises `{advertise}`, not HOST:PORT"))
}

pub fn run(mut args: SqlArgs) -> anyhow::Result<()> {
    if let Some(cluster) = &args.cluster {
        args.connect = leader_address(cluster)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the query runtime")?;
    runtime.block_on(async {
        let start = std::time::Instant::now();
        let retina = Retina::connect(args.connect, &args.auth_token)
            .with_context(|| format!("connecting to the node at {}", args.connect))?;
        // One statement in a query of its own: the plans of the tables it names come with
        // the begin (one round trip).
        let (snapshot, batches): (_, Vec<_>) = match retina.sql(&args.statement).await {
            Ok((snapshot, stream)) => (snapshot, stream.try_collect().await?),
            Err(e) => return Err(anyhow::anyhow!("{e}")),
        };
        let mut out = std::io::stdout().lock();
        write_batches(&mut out, args.format, &batches).context("printing the result")?;
        if args.timing {
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            eprintln!(
                "{rows} rows at snapshot {snapshot} in {:.1} ms",
                start.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(())
    })
}
