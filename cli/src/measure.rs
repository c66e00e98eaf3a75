//! What the commands that run a node to watch it share (`retina bench`, its peers comparison,
//! `retina demo`): a node in this process, the clock, medians and percentiles, and this
//! process's memory.

use std::sync::Arc;

use retina_node::catalog::Catalog;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;

/// A node for a measurement over `data_dir`, serving queries on a free loopback port if
/// `listen`.
pub(crate) fn local_node(
    data_dir: std::path::PathBuf,
    catalog: Arc<Catalog>,
    settings: Settings,
    listen: bool,
) -> Result<Node, retina_node::node::NodeError> {
    Node::start(NodeOptions {
        data_dir,
        catalog,
        settings,
        listen: listen.then(|| "127.0.0.1:0".parse().expect("a socket address")),
        auth_token: None,
        await_source: false,
    })
}

/// Microseconds since the Unix epoch (the unit of `fresh_ts`).
pub(crate) fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The median of `v` (sorting it); `v` must not be empty.
pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The `p`th percentile of `v` (sorting it); `None` when it is empty.
pub(crate) fn percentile(v: &mut [f64], p: usize) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    v.get((v.len() * p / 100).min(v.len().saturating_sub(1)))
        .copied()
}

/// This process's resident memory.
pub(crate) fn rss_mib() -> f64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages as f64 * 4096.0 / (1 << 20) as f64
}
