//! What the commands that run a node to watch it share (`retina bench`, its peers comparison,
//! `retina demo`): a node in this process and a sink feeding it from a file, the clock, the
//! freshness monitor, medians and percentiles, and this process's memory.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use retina_node::catalog::Catalog;
use retina_node::debezium::TxnMode;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_node::sink::{OnError, SinkOptions, SourceSpec};
use retina_query::Retina;

/// A node for a measurement over `data_dir`, serving queries on a free loopback port if
/// `listen`.
pub(crate) fn local_node(
    data_dir: std::path::PathBuf,
    catalog: Arc<Catalog>,
    settings: Settings,
    listen: bool,
) -> Result<Node, retina_node::node::NodeError> {
    node_with_lake(data_dir, Default::default(), catalog, settings, listen)
}

/// [`local_node`] with its lake at `lake`.
pub(crate) fn node_with_lake(
    data_dir: std::path::PathBuf,
    lake: retina_node::lake::LakeSpec,
    catalog: Arc<Catalog>,
    settings: Settings,
    listen: bool,
) -> Result<Node, retina_node::node::NodeError> {
    Node::start(NodeOptions {
        data_dir,
        lake,
        catalog,
        settings,
        listen: listen.then(|| "127.0.0.1:0".parse().expect("a socket address")),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
}

/// A sink reading the Debezium JSON file `file` (with transaction metadata) to its end, stopping
/// at the first bad input, grouping and committing as `settings` say, without checkpoints.
pub(crate) fn file_sink(settings: &Settings, file: PathBuf, dead_letter: PathBuf) -> SinkOptions {
    SinkOptions {
        source: SourceSpec::File(file),
        follow: false,
        mode: TxnMode::Metadata,
        on_error: OnError::Stop,
        dead_letter,
        max_group_txns: settings.max_group_txns,
        group_commit_interval: Duration::from_millis(settings.group_commit_interval_ms),
        checkpoint_interval: None,
        max_txn_bytes: settings.max_txn_bytes,
        decode_lanes: settings.decode_lanes(),
    }
}

/// Every 100 ms until `end`: `SELECT max(fresh_ts) FROM district` through the connector, and
/// freshness in milliseconds, the time the query's snapshot was fixed minus the newest
/// `fresh_ts` it saw, handed to `sample` once that `fresh_ts` is at least `from_us` (what came
/// before is the load, or warm-up).
pub(crate) async fn monitor_freshness(
    retina: &Retina,
    end: Instant,
    from_us: i64,
    sample: impl FnMut(f64),
) -> anyhow::Result<()> {
    monitor_freshness_of(retina, "district", end, from_us, sample).await
}

/// [`monitor_freshness`] on the `fresh_ts` of `table`.
pub(crate) async fn monitor_freshness_of(
    retina: &Retina,
    table: &str,
    end: Instant,
    from_us: i64,
    mut sample: impl FnMut(f64),
) -> anyhow::Result<()> {
    use arrow::array::AsArray;
    use arrow::datatypes::TimestampMicrosecondType;
    let query = format!("SELECT max(fresh_ts) FROM {table}");
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let session = retina.begin().await?;
        let at = now_us();
        let batches = session.collect(&query).await?;
        let newest = batches
            .iter()
            .filter(|b| b.num_rows() > 0 && b.column(0).is_valid(0))
            .map(|b| {
                b.column(0)
                    .as_primitive::<TimestampMicrosecondType>()
                    .value(0)
            })
            .max();
        if let Some(newest) = newest.filter(|&n| n >= from_us) {
            sample((at - newest) as f64 / 1000.0);
        }
    }
    Ok(())
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

/// A `/proc/.../stat` line's command name and the fields after it (the line's third field is
/// the first of them).
pub(crate) fn proc_stat_fields(stat: &str) -> Option<(&str, Vec<&str>)> {
    // Fields after the command name (which may hold spaces or parentheses) start after the
    // last ')'.
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(').map_or("", |(_, n)| n);
    Some((name, rest.split_whitespace().collect()))
}

/// A `/proc/.../stat` line's command name and the CPU seconds used (user + system).
pub(crate) fn proc_stat_cpu(stat: &str) -> Option<(&str, f64)> {
    let (name, fields) = proc_stat_fields(stat)?;
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name, in
    // USER_HZ ticks, which Linux fixes at 100 per second in what /proc shows.
    Some((name, (ticks(11)? + ticks(12)?) / 100.0))
}

/// This process's resident memory.
pub(crate) fn rss_mib() -> f64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    pages as f64 * 4096.0 / (1 << 20) as f64
}

#[cfg(test)]
mod tests {
    use super::proc_stat_cpu;

    #[test]
    fn a_stat_line_gives_its_name_and_cpu_seconds() {
        // A name with spaces and parentheses; utime 250 and stime 50 ticks.
        let line = "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0";
        assert_eq!(proc_stat_cpu(line), Some(("a (b) c", 3.0)));
        assert_eq!(proc_stat_cpu("42 (x) S 1 2"), None);
        let own = std::fs::read_to_string("/proc/self/stat").unwrap();
        assert!(proc_stat_cpu(&own).is_some_and(|(_, s)| s >= 0.0));
    }
}
