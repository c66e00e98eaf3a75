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
        Some(p) if p.epoch == s.epoch && s.leader.is_some() => format!(
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
        .map(str::to_owned)
        .to_vec(),
    ];
    // The placement of the current leadership (an older one's is history).
    let placement = s
        .placement
        .as_ref()
        .filter(|p| p.epoch == s.epoch && s.leader.is_some());
    for (id, e, ttl) in &s.nodes {
        let leads = e.role == "leader";
        let num = |n: u64| if leads { n.to_string() } else { "-".into() };
        let shards: Vec<String> = placement
            .iter()
            .flat_map(|p| p.owners.iter().enumerate())
            .filter(|(_, owner)| *owner == id)
            .map(|(k, _)| k.to_string())
            .collect();
        let or_dash = |v: String| if v.is_empty() { "-".to_owned() } else { v };
        rows.push(vec![
            id.clone(),
            e.role.clone(),
            e.advertise.clone(),
            or_dash(e.peer.clone()),
            or_dash(shards.join(",")),
            ttl.to_string(),
            num(e.hwm),
            num(e.checkpoint_id),
            num(e.txns_applied),
        ]);
    }
    out += &format!("nodes: {}\n", s.nodes.len());
    table(&mut out, rows);
    // Each shard's progress, as the leader's coordinator last heard it: HWM is the lowest.
    let leader = s.nodes.iter().find(|(_, e, _)| e.role == "leader");
    if let Some((_, e, _)) = leader.filter(|(_, e, _)| !e.applied.is_empty()) {
        let newest = e.applied.iter().copied().max().unwrap_or(0);
        let mut rows = vec![
            ["SHARD", "NODE", "APPLIED_TS", "BEHIND_NEWEST"]
                .map(str::to_owned)
                .to_vec(),
        ];
        for (k, applied) in e.applied.iter().enumerate() {
            let node = placement
                .and_then(|p| p.owners.get(k))
                .cloned()
                .unwrap_or_else(|| "-".into());
            rows.push(vec![
                k.to_string(),
                node,
                applied.to_string(),
                (newest - applied).to_string(),
            ]);
        }
        out += &format!("shards: {}\n", e.applied.len());
        table(&mut out, rows);
    }
    Ok(out)
}

/// `rows` as aligned columns, indented.
fn table(out: &mut String, rows: Vec<Vec<String>>) {
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        *out += &format!("  {}\n", cells.join("  ").trim_end());
    }
}
