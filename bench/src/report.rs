//! `retina bench report`: the newest value of every measurement under `bench/results/`, as
//! SVG charts in the style of the paper's figures (freshness against throughput, Figure 8;
//! replay throughput against shards, Figure 12; query latency against the GC interval,
//! Figure 14; and recovery and query consistency) and a `BENCHMARKS.md` with the numbers, the
//! charts and the paper's figures beside them. Charts are written by hand as SVG: no plotting
//! dependency to build.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One measurement as `results::record` wrote it.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    pub at: u64,
    pub value: f64,
    pub unit: String,
}

/// The newest value of every measurement, by results file (without `.jsonl`) and name.
pub type Results = BTreeMap<String, BTreeMap<String, Measurement>>;

/// Reads every `*.jsonl` of `dir`; a line that is not a measurement is an error naming it.
pub fn load(dir: &Path) -> Result<Results, String> {
    let mut out = Results::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    for path in files {
        let file = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let entries = out.entry(file).or_default();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
        {
            let bad = |why: &str| format!("{} line {}: {why}", path.display(), i + 1);
            let v: serde_json::Value =
                serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
            let name = v["name"].as_str().ok_or_else(|| bad("no name"))?;
            let m = Measurement {
                at: v["at"].as_u64().unwrap_or(0),
                value: v["value"].as_f64().ok_or_else(|| bad("no numeric value"))?,
                unit: v["unit"].as_str().unwrap_or("").to_owned(),
            };
            // Later lines are newer runs.
            if entries.get(name).is_none_or(|old| old.at <= m.at) {
                entries.insert(name.to_owned(), m);
            }
        }
    }
    Ok(out)
}

/// A grouped bar chart: one group per x label, one bar per series.
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<String>,
    /// (x label, one value per series; `None` where missing).
    pub groups: Vec<(String, Vec<Option<f64>>)>,
    /// A logarithmic y axis (decades), for series orders of magnitude apart.
    pub log: bool,
}

const COLORS: [&str; 4] = ["#4878d0", "#ee854a", "#6acc64", "#d65f5f"];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A round number at or above `max` for the y axis.
fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(max.log10().floor());
    for step in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if step * magnitude >= max {
            return step * magnitude;
        }
    }
    10.0 * magnitude
}

impl Chart {
    pub fn svg(&self) -> String {
        let (w, h) = (640.0, 360.0);
        let (left, right, top, bottom) = (70.0, 20.0, 40.0, 60.0);
        let plot_w = w - left - right;
        let plot_h = h - top - bottom;
        let values = || self.groups.iter().flat_map(|(_, v)| v.iter().flatten());
        let max = values().fold(0.0f64, |a, &b| a.max(b));
        let top_value = nice_ceiling(max);
        // The log axis spans whole decades from below the smallest positive value.
        let decades = if self.log {
            let min = values()
                .copied()
                .filter(|v| *v > 0.0)
                .fold(f64::INFINITY, f64::min);
            // Below the smallest value, so that its bar shows.
            let low = if min.is_finite() {
                (min.log10() - 1e-9).floor()
            } else {
                0.0
            };
            let high = (max.log10().ceil()).max(low + 1.0);
            Some((low, high))
        } else {
            None
        };
        // A value's height as a fraction of the plot.
        let frac = |v: f64| match decades {
            Some((low, high)) => ((v.max(f64::MIN_POSITIVE).log10() - low) / (high - low)).max(0.0),
            None => v / top_value,
        };
        let ticks: Vec<f64> = match decades {
            Some((low, high)) => (low as i32..=high as i32).map(|e| 10f64.powi(e)).collect(),
            None => (0..=4).map(|i| top_value * f64::from(i) / 4.0).collect(),
        };
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" text-anchor="middle" font-size="14">{}</text>"#,
            w / 2.0,
            escape(&self.title)
        );
        // Axes and grid.
        for &v in &ticks {
            let y = top + plot_h - plot_h * frac(v);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{y:.1}" x2="{}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + plot_w,
                left - 6.0,
                y + 4.0,
                trim_number(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/>"#,
            top + plot_h,
            top + plot_h,
            left + plot_w,
            top + plot_h
        );
        let _ = writeln!(
            s,
            r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
            top + plot_h / 2.0,
            top + plot_h / 2.0,
            escape(&self.y_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            left + plot_w / 2.0,
            h - 12.0,
            escape(&self.x_label)
        );
        // Bars.
        let groups = self.groups.len().max(1) as f64;
        let group_w = plot_w / groups;
        let bar_w = group_w * 0.8 / self.series.len().max(1) as f64;
        for (g, (label, values)) in self.groups.iter().enumerate() {
            let x0 = left + group_w * g as f64 + group_w * 0.1;
            for (k, v) in values.iter().enumerate() {
                let Some(v) = v else { continue };
                let bh = plot_h * frac(*v);
                let x = x0 + bar_w * k as f64;
                let _ = writeln!(
                    s,
                    r#"<rect x="{x:.1}" y="{:.1}" width="{:.1}" height="{bh:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                    top + plot_h - bh,
                    bar_w * 0.95,
                    COLORS[k % COLORS.len()],
                    escape(&self.series[k]),
                    trim_number(*v)
                );
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}" text-anchor="middle">{}</text>"#,
                x0 + group_w * 0.4,
                top + plot_h + 16.0,
                escape(label)
            );
        }
        // Legend.
        for (k, name) in self.series.iter().enumerate() {
            let x = left + 10.0 + 150.0 * k as f64;
            let _ = writeln!(
                s,
                r#"<rect x="{x}" y="{}" width="10" height="10" fill="{}"/><text x="{}" y="{}">{}</text>"#,
                top - 12.0,
                COLORS[k % COLORS.len()],
                x + 14.0,
                top - 3.0,
                escape(name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

fn trim_number(v: f64) -> String {
    if v >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The numbers `names` like `{prefix}{x}{suffix}` take, sorted, with the name for each.
fn keyed(entries: &BTreeMap<String, Measurement>, prefix: &str, suffix: &str) -> Vec<(u64, f64)> {
    let mut out: Vec<(u64, f64)> = entries
        .iter()
        .filter_map(|(name, m)| {
            let x = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
            Some((x.parse().ok()?, m.value))
        })
        .collect();
    out.sort_by_key(|(x, _)| *x);
    out
}

/// A chart of series sharing one x key, each series `(label, prefix, suffix)`.
fn chart_by_key(
    entries: &BTreeMap<String, Measurement>,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[(&str, &str, &str)],
    x_text: impl Fn(u64) -> String,
    scale: f64,
) -> Option<Chart> {
    // A series without a value (a measurement not run, like those through Kafka) is left out.
    let kept: Vec<_> = series
        .iter()
        .map(|t| (t.0, keyed(entries, t.1, t.2)))
        .filter(|(_, c)| !c.is_empty())
        .collect();
    let series: Vec<&str> = kept.iter().map(|(l, _)| *l).collect();
    let columns: Vec<&Vec<(u64, f64)>> = kept.iter().map(|(_, c)| c).collect();
    let mut xs: Vec<u64> = columns.iter().copied().flatten().map(|(x, _)| *x).collect();
    xs.sort_unstable();
    xs.dedup();
    if xs.is_empty() {
        return None;
    }
    Some(Chart {
        title: title.into(),
        x_label: x_label.into(),
        y_label: y_label.into(),
        series: series.iter().map(|l| (*l).to_owned()).collect(),
        groups: xs
            .iter()
            .map(|&x| {
                (
                    x_text(x),
                    columns
                        .iter()
                        .map(|c| c.iter().find(|(k, _)| *k == x).map(|(_, v)| v * scale))
                        .collect(),
                )
            })
            .collect(),
        log: false,
    })
}

fn thousands(x: u64) -> String {
    if x >= 1000 && x.is_multiple_of(1000) {
        format!("{}K", x / 1000)
    } else {
        x.to_string()
    }
}

/// `retina bench scale`'s `rows_per_s_nodes_N_shards_S`: by shard count, on one member
/// beside spread over the members of a cluster.
fn scale_chart(entries: &BTreeMap<String, Measurement>) -> Option<Chart> {
    let mut by_shards: BTreeMap<u64, [Option<f64>; 2]> = BTreeMap::new();
    for (name, m) in entries {
        let Some((n, shards)) = name
            .strip_prefix("rows_per_s_nodes_")
            .and_then(|r| r.split_once("_shards_"))
        else {
            continue;
        };
        let (Ok(n), Ok(shards)) = (n.parse::<u64>(), shards.parse::<u64>()) else {
            continue;
        };
        let slot = by_shards.entry(shards).or_default();
        slot[usize::from(n > 1)] = Some(m.value * 1e-3);
        if n == 1 && shards == 1 {
            // One shard on one member is also the smallest cluster.
            slot[1] = Some(m.value * 1e-3);
        }
    }
    (!by_shards.is_empty()).then(|| Chart {
        title: "Replay throughput against cluster size (cf. Figure 10)".into(),
        x_label: "shards in all (one per member in a cluster)".into(),
        y_label: "thousand rows/s".into(),
        series: vec![
            "every shard in one process".into(),
            "one shard per member, over TCP".into(),
        ],
        groups: by_shards
            .into_iter()
            .map(|(shards, v)| (shards.to_string(), v.to_vec()))
            .collect(),
        log: false,
    })
}

/// What limits the curve past one machine, from the measured constants.
fn scale_model(results: &Results) -> String {
    let empty = BTreeMap::new();
    let get = |f: &str| results.get(f).unwrap_or(&empty);
    let (replay, scale) = (get("replay"), get("scale"));
    let max_of = |entries: &BTreeMap<String, Measurement>, prefix: &str| {
        entries
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, m)| m.value)
            .fold(None, |a: Option<f64>, v| Some(a.map_or(v, |a| a.max(v))))
    };
    let k = |v: f64| format!("{:.0}K", v / 1e3);
    let mut s = String::from(
        "Paper: replay linear in nodes, about 200K rows/s per 16-vCPU node and 3.2M rows/s on 16 \
         nodes. Model past one machine: one sink (on the leader) reads, decodes and stamps the \
         source for every member, so a cluster replays at most min(the sink's decode rate, the \
         shards' apply rate times what the hop keeps of it, the network).",
    );
    let sink = max_of(replay, "json_rows_per_s_");
    let shard = replay.get("batches_rows_per_s_1_shards").map(|m| m.value);
    let narrow = max_of(scale, "rows_per_s_nodes_1_shards_");
    if let (Some(sink), Some(shard)) = (sink, shard) {
        s += &format!(
            " Measured: the sink decodes Debezium JSON at up to {} rows/s of CH-benCHmark's rows \
             (`retina bench replay`){}, and one shard applies {} rows/s of encoded batches, so \
             past a shard or two the sink is the bound: members add apply capacity that one \
             sink cannot feed, and the curve stays at the sink's rate. The paper's 3.2M rows/s \
             needs {:.0}x today's decode rate of CH rows: decoding in parallel (decode lanes, a \
             sink per source partition) before anything else.",
            k(sink),
            narrow.map_or(String::new(), |n| format!(
                " and {} rows/s of this benchmark's three-column rows",
                k(n)
            )),
            k(shard),
            3.2e6 / sink
        );
    }
    if let Some(hop) = max_of(scale, "tcp_over_in_process_") {
        s += &format!(
            " Over TCP on loopback a cluster keeps up to {:.0}% of the rows/s of one process \
             with the same shards.",
            hop * 100.0
        );
    }
    if let Some(bytes) = max_of(scale, "batch_bytes_per_row") {
        s += &format!(
            " A row costs {bytes:.0} bytes of batch on the wire, so a 10 Gb/s link carries about \
             {:.1}M rows/s to a member: not the bound.",
            10e9 / 8.0 / bytes / 1e6
        );
    }
    s
}

/// The charts the results allow: (file name, chart, the paper's figure beside it).
pub fn charts(results: &Results) -> Vec<(String, Chart, String)> {
    let empty = BTreeMap::new();
    let get = |f: &str| results.get(f).unwrap_or(&empty);
    let mut out = Vec::new();
    if let Some(c) = chart_by_key(
        get("freshness"),
        "Freshness against throughput (cf. Figure 8)",
        "rows/s emitted",
        "freshness, ms",
        &[
            ("P50", "p50_ms_at_", "_rows_per_s"),
            ("P99", "p99_ms_at_", "_rows_per_s"),
            ("P50 through Kafka", "p50_ms_at_", "_rows_per_s_kafka"),
            ("P99 through Kafka", "p99_ms_at_", "_rows_per_s_kafka"),
        ],
        thousands,
        1.0,
    ) {
        out.push((
            "fig-freshness.svg".into(),
            c,
            "Paper: P50 about 10 ms, P99 under 250 ms per node; CH-benCHmark W10000 at 80K rows/s: P99 103 ms.".into(),
        ));
    }
    if let Some(c) = chart_by_key(
        get("replay"),
        "Replay throughput against shards (cf. Figure 12)",
        "shards",
        "thousand rows/s",
        &[
            ("from Debezium JSON", "json_rows_per_s_", "_shards"),
            ("from Kafka", "kafka_rows_per_s_", "_shards"),
            ("from encoded batches", "batches_rows_per_s_", "_shards"),
        ],
        |x| x.to_string(),
        1e-3,
    ) {
        out.push((
            "fig-replay.svg".into(),
            c,
            "Paper: about 200K rows/s per 16-vCPU node, 3.2M rows/s on 16 nodes.".into(),
        ));
    }
    if let Some(c) = chart_by_key(
        get("replay"),
        "Replay from Debezium JSON against decode lanes",
        "decode lanes",
        "thousand rows/s",
        &[
            ("1 shard", "json_rows_per_s_1_shards_", "_lanes"),
            ("2 shards", "json_rows_per_s_2_shards_", "_lanes"),
            ("4 shards", "json_rows_per_s_4_shards_", "_lanes"),
            ("8 shards", "json_rows_per_s_8_shards_", "_lanes"),
        ],
        |x| x.to_string(),
        1e-3,
    ) {
        out.push(("fig-replay-lanes.svg".into(), c, "Not in the paper.".into()));
    }
    if let Some(c) = chart_by_key(
        get("gc"),
        "Query latency against the GC interval at 10K rows/s (cf. Figure 14)",
        "GC interval, s",
        "query latency, ms",
        &[
            ("P50", "p50_ms_gc_every_", "_ms_at_10000_rows_per_s"),
            ("P99", "p99_ms_gc_every_", "_ms_at_10000_rows_per_s"),
        ],
        |x| (x / 1000).to_string(),
        1.0,
    ) {
        out.push((
            "fig-gc.svg".into(),
            c,
            "Paper: flat query latency for GC intervals from 10 s to 240 s.".into(),
        ));
    }
    if let Some(c) = chart_by_key(
        get("recovery"),
        "Recovery time against rows since the checkpoint",
        "rows since the checkpoint",
        "seconds",
        &[
            ("checkpoint load", "restore_s_with_", "_rows_since"),
            ("whole recovery", "recovery_s_with_", "_rows_since"),
        ],
        thousands,
        1.0,
    ) {
        out.push(("fig-recovery.svg".into(), c, "Not in the paper.".into()));
    }
    if let Some(c) = scale_chart(get("scale")) {
        out.push(("fig-scale.svg".into(), c, scale_model(results)));
    }
    for (file, entries) in peer_files(results) {
        let peers = Peers::of(entries);
        if peers.systems.is_empty() {
            continue;
        }
        let data = dataset(file);
        for (chart, key, what, y_label, note) in [
            (
                "throughput",
                "rows_per_s",
                "rows/s replayed",
                "rows/s (log)",
                "Retina against DuckDB and Delta Lake (delta-rs MERGE at each commit interval); \
                 `max` emits as fast as each system takes the stream.",
            ),
            (
                "freshness",
                "p50_ms",
                "freshness P50, the same max(fresh_ts) monitor",
                "ms (log)",
                "Freshness = query start - newest visible fresh_ts, every 100 ms.",
            ),
        ] {
            out.push((
                format!("fig-{file}-{chart}.svg"),
                Chart {
                    title: format!("Peers ({data}): {what}"),
                    x_label: "rows/s emitted".into(),
                    y_label: y_label.into(),
                    series: peers.systems.clone(),
                    groups: peers
                        .rates
                        .iter()
                        .map(|r| {
                            let x = r.parse().map_or(r.clone(), thousands);
                            (x, peers.column(key, r))
                        })
                        .collect(),
                    log: true,
                },
                note.into(),
            ));
        }
        out.push((
            format!("fig-{file}-queries.svg"),
            Chart {
                title: format!("Peers ({data}): CH queries on the final state"),
                x_label: "query".into(),
                y_label: "ms (log)".into(),
                series: peers.systems.clone(),
                groups: ["q1", "q6", "q3"]
                    .iter()
                    .map(|q| {
                        (
                            q.to_uppercase(),
                            peers
                                .systems
                                .iter()
                                .map(|s| peers.value(&format!("{q}_ms_{s}")))
                                .collect(),
                        )
                    })
                    .collect(),
                log: true,
            },
            "Median of runs after the last rate's stream; the same SQL on every system.".into(),
        ));
    }
    let consistency = get("consistency");
    let queries: Vec<(String, f64)> = consistency
        .iter()
        .filter_map(|(n, m)| {
            let q = n
                .strip_suffix("_at_10000_rows_per_s")?
                .strip_suffix("_normalized")?;
            Some((q.to_owned(), m.value))
        })
        .collect();
    if !queries.is_empty() {
        out.push((
            "fig-consistency.svg".into(),
            Chart {
                title: "Query latency under a 10K rows/s stream, normalized to static".into(),
                x_label: "query".into(),
                y_label: "under change / static".into(),
                series: vec!["normalized latency".into()],
                groups: queries
                    .into_iter()
                    .map(|(q, v)| (q, vec![Some(v)]))
                    .collect(),
                log: false,
            },
            "Paper: normalized latency about 1.04 from 10K to 160K rows/s.".into(),
        ));
    }
    out
}

/// The peers' results files: `peers` (CH at 1 warehouse) and `peers-<scale>`, one section each.
fn peer_files(results: &Results) -> impl Iterator<Item = (&str, &BTreeMap<String, Measurement>)> {
    results
        .iter()
        .filter(|(f, _)| *f == "peers" || f.starts_with("peers-"))
        .map(|(f, e)| (f.as_str(), e))
}

/// The dataset a peers results file holds, in words.
fn dataset(file: &str) -> String {
    match file.strip_prefix("peers-") {
        None => "CH, 1 warehouse".into(),
        Some(scale) => match scale.strip_prefix("tpcc").map(str::parse::<u64>) {
            Some(Ok(w)) => format!("CH, {w} warehouses"),
            _ => format!("CH, {scale}"),
        },
    }
}

/// The peers results (`retina bench peers`) of the newest run: systems and rates as measured,
/// in order. A run records `load_rows` first; what an older run measured and the newest did
/// not (another rate, another system) is left out, so the tables and charts compare the
/// systems of one run side by side.
struct Peers<'a> {
    entries: BTreeMap<&'a str, &'a Measurement>,
    /// `retina`, `duckdb`, then Delta Lake by commit interval.
    systems: Vec<String>,
    /// Fixed rates ascending, then `max`.
    rates: Vec<String>,
}

impl<'a> Peers<'a> {
    fn of(entries: &'a BTreeMap<String, Measurement>) -> Self {
        let since = entries.get("load_rows").map_or(0, |m| m.at);
        let entries: BTreeMap<&str, &Measurement> = entries
            .iter()
            .filter(|(_, m)| m.at >= since)
            .map(|(n, m)| (n.as_str(), m))
            .collect();
        let mut systems = Vec::new();
        let mut rates = Vec::new();
        for name in entries.keys() {
            if let Some((system, rate)) = name
                .strip_prefix("rows_per_s_")
                .and_then(|n| n.rsplit_once("_at_"))
            {
                systems.push(system.to_owned());
                rates.push(rate.to_owned());
            }
        }
        let order = |s: &String| match s.as_str() {
            "retina" => (0, 0),
            "duckdb" => (1, 0),
            other => (
                2,
                other
                    .trim_start_matches("delta_")
                    .trim_end_matches("ms")
                    .parse()
                    .unwrap_or(u64::MAX),
            ),
        };
        systems.sort_by_key(order);
        systems.dedup();
        rates.sort_by_key(|r| r.parse::<u64>().unwrap_or(u64::MAX));
        rates.dedup();
        Peers {
            entries,
            systems,
            rates,
        }
    }

    fn value(&self, name: &str) -> Option<f64> {
        self.entries.get(name).map(|m| m.value)
    }

    /// `metric` of every system at `rate`.
    fn column(&self, metric: &str, rate: &str) -> Vec<Option<f64>> {
        self.systems
            .iter()
            .map(|s| self.value(&format!("{metric}_{s}_at_{rate}")))
            .collect()
    }

    /// Each peer against Retina: best rows/s against best rows/s (with the freshness each had
    /// there), and freshness P50 at every fixed rate both ran.
    fn ratios(&self) -> Vec<String> {
        // The run with the most rows/s: (rate, rows/s).
        let best = |sys: &str| {
            self.rates
                .iter()
                .filter_map(|r| Some((r, self.value(&format!("rows_per_s_{sys}_at_{r}"))?)))
                .max_by(|a, b| a.1.total_cmp(&b.1))
        };
        let p50 = |sys: &str, r: &str| self.value(&format!("p50_ms_{sys}_at_{r}"));
        let at = |sys: &str, r: &str| {
            p50(sys, r).map_or(String::new(), |p| format!(", P50 {} ms", trim_number(p)))
        };
        let Some((retina_rate, retina)) = best("retina") else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for sys in self.systems.iter().filter(|s| *s != "retina") {
            let Some((rate, theirs)) = best(sys) else {
                continue;
            };
            let mut line = format!(
                "{sys}: Retina's best rows/s is {:.1}x {sys}'s best ({} at {retina_rate}{} \
                 against {} at {rate}{})",
                retina / theirs,
                trim_number(retina),
                at("retina", retina_rate),
                trim_number(theirs),
                at(sys, rate),
            );
            for r in self.rates.iter().filter(|r| *r != "max") {
                if let (Some(a), Some(b)) = (p50("retina", r), p50(sys, r)) {
                    let _ = write!(
                        line,
                        "; at {r} rows/s Retina's P50 freshness is {:.0}x better",
                        b / a
                    );
                }
            }
            line.push('.');
            out.push(line);
        }
        out
    }

    /// The side-by-side table and the ratios the targets name.
    fn markdown(&self, data: &str, s: &mut String) {
        let cell = |v: Option<f64>| v.map_or("-".to_owned(), trim_number);
        let _ = writeln!(s, "## Peers side by side ({data})\n");
        s.push_str(
            "`retina bench peers`: the same CH-benCHmark load and stream, the same \
             `max(fresh_ts)` monitor and the same queries for every system, in one run.",
        );
        if let Some(rows) = self.value("load_rows") {
            let _ = write!(s, " The initial load: {} rows.", trim_number(rows));
        }
        s.push_str("\n\n");
        s.push_str("| system | rows/s emitted | rows/s replayed | freshness P50 ms | P99 ms | lag after the last emit, s |\n| --- | --- | --- | --- | --- | --- |\n");
        for sys in &self.systems {
            for r in &self.rates {
                let v = |m: &str| self.value(&format!("{m}_{sys}_at_{r}"));
                if v("rows_per_s").is_none() {
                    continue;
                }
                let _ = writeln!(
                    s,
                    "| {sys} | {r} | {} | {} | {} | {} |",
                    cell(v("rows_per_s")),
                    cell(v("p50_ms")),
                    cell(v("p99_ms")),
                    cell(v("lag_s"))
                );
            }
        }
        s.push_str("\n| system | Q1 ms | Q6 ms | Q3 ms |\n| --- | --- | --- | --- |\n");
        for sys in &self.systems {
            let q = |q: &str| cell(self.value(&format!("{q}_ms_{sys}")));
            let _ = writeln!(s, "| {sys} | {} | {} | {} |", q("q1"), q("q6"), q("q3"));
        }
        let ratios = self.ratios();
        if !ratios.is_empty() {
            s.push('\n');
            for r in ratios {
                let _ = writeln!(s, "- {r}");
            }
        }
        s.push('\n');
    }
}

/// The peers' ratios to Retina (`retina bench peers` prints them at the end of a run).
pub fn peer_ratios(entries: &BTreeMap<String, Measurement>) -> Vec<String> {
    Peers::of(entries).ratios()
}

/// `BENCHMARKS.md`: every measurement's newest value, by results file, with the charts.
pub fn markdown(results: &Results, charts: &[(String, Chart, String)], chart_dir: &str) -> String {
    let mut s = String::from(
        "# Benchmarks\n\nWritten by `retina bench report` from the newest value of each \
         measurement in `bench/results/*.jsonl`. Measured on the machine the runs were made on \
         (the project's: 2 cores, 24 GiB); the paper's node had 16 vCPUs. See \
         `bench/README.md` for what each measurement means.\n\n",
    );
    for (file, chart, paper) in charts {
        let _ = writeln!(
            s,
            "## {}\n\n![{}]({chart_dir}/{file})\n\n{paper}\n",
            chart.title, chart.title
        );
    }
    for (file, entries) in peer_files(results) {
        Peers::of(entries).markdown(&dataset(file), &mut s);
    }
    s.push_str("## Every measurement\n\n");
    for (file, entries) in results {
        let _ = writeln!(
            s,
            "### {file}\n\n| measurement | value | unit |\n| --- | --- | --- |"
        );
        for (name, m) in entries {
            // Ratios to two decimals, as their targets are given (1.15 is not 1.2).
            let value = match m.unit.as_str() {
                "x" => format!("{:.2}", m.value),
                _ => trim_number(m.value),
            };
            let _ = writeln!(s, "| {name} | {value} | {} |", m.unit);
        }
        s.push('\n');
    }
    s
}

/// Reads `results_dir`, writes the charts there and `BENCHMARKS.md` at `out`; returns the
/// files written.
pub fn write(results_dir: &Path, out: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let results = load(results_dir)?;
    let charts = charts(&results);
    let mut written = Vec::new();
    for (file, chart, _) in &charts {
        let path = results_dir.join(file);
        std::fs::write(&path, chart.svg()).map_err(|e| format!("{}: {e}", path.display()))?;
        written.push(path);
    }
    let base = out
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let rel = pathdiff(results_dir, base);
    std::fs::write(out, markdown(&results, &charts, &rel))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    written.push(out.to_owned());
    Ok(written)
}

/// `target` relative to `base` when it lies below it, else as given.
fn pathdiff(target: &Path, base: &Path) -> String {
    let (t, b) = (
        target.canonicalize().unwrap_or_else(|_| target.to_owned()),
        base.canonicalize().unwrap_or_else(|_| base.to_owned()),
    );
    t.strip_prefix(&b)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| target.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_chart_sets_a_cluster_beside_one_process_and_models_the_bound() {
        let m = |v: f64| Measurement {
            at: 1,
            value: v,
            unit: "rows/s".into(),
        };
        let mut results = Results::new();
        results.insert(
            "scale".into(),
            [
                ("rows_per_s_nodes_1_shards_1", 100_000.0),
                ("rows_per_s_nodes_1_shards_2", 120_000.0),
                ("rows_per_s_nodes_2_shards_2", 90_000.0),
                ("tcp_over_in_process_nodes_2_shards_2", 0.75),
                ("batch_bytes_per_row", 50.0),
            ]
            .into_iter()
            .map(|(n, v)| (n.to_owned(), m(v)))
            .collect(),
        );
        results.insert(
            "replay".into(),
            [
                ("json_rows_per_s_1_shards", 200_000.0),
                ("batches_rows_per_s_1_shards", 1_000_000.0),
            ]
            .into_iter()
            .map(|(n, v)| (n.to_owned(), m(v)))
            .collect(),
        );
        let c = scale_chart(&results["scale"]).unwrap();
        assert_eq!(
            c.groups,
            vec![
                ("1".to_owned(), vec![Some(100.0), Some(100.0)]),
                ("2".to_owned(), vec![Some(120.0), Some(90.0)]),
            ]
        );
        let model = scale_model(&results);
        assert!(model.contains("up to 200K rows/s"), "{model}");
        assert!(model.contains("and 120K rows/s of this"), "{model}");
        assert!(model.contains("needs 16x"), "{model}");
        assert!(model.contains("up to 75%"), "{model}");
        assert!(model.contains("about 25.0M rows/s"), "{model}");
    }

    #[test]
    fn newest_values_become_charts_and_tables() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("freshness.jsonl"),
            "{\"at\":1,\"name\":\"p50_ms_at_10000_rows_per_s\",\"value\":9.0,\"unit\":\"ms\"}\n\
             {\"at\":2,\"name\":\"p50_ms_at_10000_rows_per_s\",\"value\":2.0,\"unit\":\"ms\"}\n\
             {\"at\":2,\"name\":\"p99_ms_at_10000_rows_per_s\",\"value\":15.4,\"unit\":\"ms\"}\n\
             {\"at\":2,\"name\":\"p50_ms_at_80000_rows_per_s\",\"value\":1.2,\"unit\":\"ms\"}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("overhead_tpcc.jsonl"),
            "{\"at\":1,\"name\":\"q6_ratio_load\",\"value\":1.1549,\"unit\":\"x\"}\n",
        )
        .unwrap();
        let results = load(dir.path()).unwrap();
        assert_eq!(
            results["freshness"]["p50_ms_at_10000_rows_per_s"].value, 2.0,
            "the newest run wins"
        );
        let charts = charts(&results);
        assert_eq!(charts.len(), 1);
        let c = &charts[0].1;
        assert_eq!(
            c.groups,
            vec![
                ("10K".to_owned(), vec![Some(2.0), Some(15.4)]),
                ("80K".to_owned(), vec![Some(1.2), None]),
            ]
        );
        let svg = c.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("<rect x=").count(),
            3 + 2,
            "three bars, two legend keys"
        );
        let md = markdown(&results, &charts, "bench/results");
        assert!(md.contains(
            "![Freshness against throughput (cf. Figure 8)](bench/results/fig-freshness.svg)"
        ));
        assert!(md.contains("| p99_ms_at_10000_rows_per_s | 15.4 | ms |"));
        assert!(md.contains("| q6_ratio_load | 1.15 | x |"), "{md}");

        std::fs::write(dir.path().join("bad.jsonl"), "{\"name\":1}\n").unwrap();
        let err = load(dir.path()).unwrap_err();
        assert!(err.contains("bad.jsonl line 1"), "{err}");
    }

    #[test]
    fn peers_become_log_charts_a_table_and_ratios() {
        let dir = tempfile::tempdir().unwrap();
        let line = |name: &str, v: f64| {
            format!("{{\"at\":1,\"name\":\"{name}\",\"value\":{v},\"unit\":\"x\"}}\n")
        };
        let mut text = String::new();
        for (sys, rows, p50) in [
            ("retina", 100_000.0, 5.0),
            ("delta_10000ms", 2_000.0, 9_000.0),
            ("delta_1000ms", 4_000.0, 1_500.0),
            ("duckdb", 30_000.0, 50.0),
        ] {
            for rate in ["10000", "max", "2000"] {
                text += &line(&format!("rows_per_s_{sys}_at_{rate}"), rows);
                text += &line(&format!("p50_ms_{sys}_at_{rate}"), p50);
            }
            text += &line(&format!("q1_ms_{sys}"), p50);
        }
        std::fs::write(dir.path().join("peers.jsonl"), &text).unwrap();
        // A second scale: its own charts and section.
        text += &line("load_rows", 2_400_000.0);
        std::fs::write(dir.path().join("peers-tpcc4.jsonl"), text).unwrap();
        let results = load(dir.path()).unwrap();
        let peers = Peers::of(&results["peers"]);
        assert_eq!(
            peers.systems,
            ["retina", "duckdb", "delta_1000ms", "delta_10000ms"]
        );
        assert_eq!(peers.rates, ["2000", "10000", "max"]);
        let charts = charts(&results);
        let names: Vec<&str> = charts.iter().map(|(f, ..)| f.as_str()).collect();
        assert_eq!(
            names,
            [
                "fig-peers-throughput.svg",
                "fig-peers-freshness.svg",
                "fig-peers-queries.svg",
                "fig-peers-tpcc4-throughput.svg",
                "fig-peers-tpcc4-freshness.svg",
                "fig-peers-tpcc4-queries.svg"
            ]
        );
        assert_eq!(
            charts[3].1.title,
            "Peers (CH, 4 warehouses): rows/s replayed"
        );
        let fresh = &charts[1].1;
        assert!(fresh.log);
        assert_eq!(fresh.groups[0].0, "2K");
        assert_eq!(
            fresh.groups[0].1,
            [Some(5.0), Some(50.0), Some(1500.0), Some(9000.0)]
        );
        // Decades from 1 to 10000 ms: the smallest bar still shows.
        let svg = fresh.svg();
        for tick in [">1<", ">10<", ">100<", ">1000<", ">10000<"] {
            assert!(svg.contains(tick), "{tick} in {svg}");
        }
        let md = markdown(&results, &charts, "r");
        assert!(
            md.contains("## Peers side by side (CH, 1 warehouse)\n"),
            "{md}"
        );
        assert!(
            md.contains("## Peers side by side (CH, 4 warehouses)\n")
                && md.contains("The initial load: 2400000 rows."),
            "{md}"
        );
        assert!(
            md.contains("| delta_1000ms | 10000 | 4000 | 1500 | - | - |"),
            "{md}"
        );
        assert!(
            md.contains(
                "- delta_1000ms: Retina's best rows/s is 25.0x delta_1000ms's best \
                 (100000 at max, P50 5 ms against 4000 at max, P50 1500 ms); \
                 at 2000 rows/s Retina's P50 freshness is 300x better"
            ),
            "{md}"
        );
    }

    #[test]
    fn peers_show_the_newest_run_only() {
        let dir = tempfile::tempdir().unwrap();
        let line = |at: u64, name: &str, v: f64| {
            format!("{{\"at\":{at},\"name\":\"{name}\",\"value\":{v},\"unit\":\"x\"}}\n")
        };
        let mut text = line(1, "load_rows", 600.0);
        for (sys, rate) in [("retina", "2000"), ("retina", "max"), ("duckdb", "max")] {
            text += &line(2, &format!("rows_per_s_{sys}_at_{rate}"), 1.0);
        }
        text += &line(3, "q1_ms_duckdb", 9.0);
        // The newest run: another rate, and no DuckDB.
        text += &line(10, "load_rows", 700.0);
        for rate in ["40000", "max"] {
            text += &line(11, &format!("rows_per_s_retina_at_{rate}"), 2.0);
        }
        std::fs::write(dir.path().join("peers.jsonl"), text).unwrap();
        let results = load(dir.path()).unwrap();
        let peers = Peers::of(&results["peers"]);
        assert_eq!(peers.systems, ["retina"]);
        assert_eq!(peers.rates, ["40000", "max"]);
        assert_eq!(peers.value("rows_per_s_retina_at_max"), Some(2.0));
        assert_eq!(peers.value("q1_ms_duckdb"), None);
        let md = markdown(&results, &charts(&results), "r");
        assert!(md.contains("The initial load: 700 rows."), "{md}");
        assert!(!md.contains("| retina | 2000 |"), "{md}");
    }
}
