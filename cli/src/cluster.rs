//! `retina cluster status`: what a cluster's metadata store says about it.

use retina_node::cluster::{ClusterSpec, Member};

#[derive(clap::Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Shows the leader and its epoch, the newest checkpoint the cluster recorded, and every
    /// live node: its role, address, lease, HWM and checkpoint.
    Status {
        /// The cluster: `etcd://HOST:PORT[,HOST:PORT...]/PREFIX`, as the nodes were given.
        #[arg(long, value_name = "etcd://HOST:PORT[,...]/PREFIX")]
        cluster: ClusterSpec,
    },
}

pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    match args.command {
        ClusterCommand::Status { cluster } => print!("{}", status(&cluster)?),
    }
    Ok(())
}

fn status(spec: &ClusterSpec) -> anyhow::Result<String> {
    let s = Member::snapshot(spec)?;
    let mut out = format!("cluster {spec}\n");
    out += &match &s.leader {
        Some(l) => format!("leader: {l} (epoch {})\n", s.epoch),
        None => format!("leader: none (last epoch {})\n", s.epoch),
    };
    out += &match s.state.and_then(|p| p.checkpoint.map(|c| (p, c))) {
        Some((p, c)) => format!(
            "checkpoint: {} at timestamp {} (source byte {}, line {}); HWM recorded {}\n",
            c.id,
            c.ts,
            c.source.offset,
            c.source.line,
            p.hwm.get()
        ),
        None => "checkpoint: none recorded\n".to_owned(),
    };
    out += &match &s.placement {
        Some(p) if p.epoch == s.epoch => format!(
            "placement: {} shards over {} nodes (leadership {})\n",
            p.owners.len(),
            p.owners
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len(),
            p.epoch
        ),
        Some(p) => format!(
            "placement: none by this leadership yet (the last was leadership {}'s)\n",
            p.epoch
        ),
        None => "placement: none recorded\n".to_owned(),
    };
    let mut rows = vec![
        [
            "NODE",
            "ROLE",
            "ADVERTISE",
            "PEER",
            "SHARDS",
            "LEASE_S",
            "HWM",
            "CHECKPOINT",
            "TXNS_APPLIED",
        ]
        .map(str::to_owned),
    ];
    for (id, e, ttl) in &s.nodes {
        let leads = e.role == "leader";
        let num = |n: u64| if leads { n.to_string() } else { "-".into() };
        // The shards the placement puts on the node (only a leadership's own is current).
        let shards: Vec<String> = s
            .placement
            .iter()
            .filter(|p| p.epoch == s.epoch)
            .flat_map(|p| p.owners.iter().enumerate())
            .filter(|(_, owner)| *owner == id)
            .map(|(k, _)| k.to_string())
            .collect();
        rows.push([
            id.clone(),
            e.role.clone(),
            e.advertise.clone(),
            if e.peer.is_empty() {
                "-".into()
            } else {
                e.peer.clone()
            },
            if shards.is_empty() {
                "-".into()
            } else {
                shards.join(",")
            },
            ttl.to_string(),
            num(e.hwm),
            num(e.checkpoint_id),
            num(e.txns_applied),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    out += &format!("nodes: {}\n", s.nodes.len());
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out += &format!("  {}\n", cells.join("  ").trim_end());
    }
    Ok(out)
}
