//! The generated workloads end to end: a CH-benCHmark and a HyBench dataset and change stream,
//! written as Debezium JSON, replayed by a node with two shards through the sink, read back
//! table by table at the final snapshot, and compared row for row with a naive model that
//! applied the same transactions.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use retina_bench::workload::Txn;
use retina_bench::{chgen, hybench};
use retina_node::catalog::Catalog;
use retina_node::debezium::TxnMode;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_node::sink::{OnError, SinkOptions, SourceSpec, run_sink};
use retina_storage::batch_rows;
use retina_storage::{ColumnType, RowOp, TableSchema, Value};

/// Every table's rows after `txns`, keyed by primary key, as sorted printable rows.
fn model(schemas: &[Arc<TableSchema>], txns: &[Txn]) -> Vec<Vec<String>> {
    let key = |t: usize, r: &[Value]| -> String {
        format!(
            "{:?}",
            schemas[t]
                .primary_key()
                .iter()
                .map(|&i| &r[i])
                .collect::<Vec<_>>()
        )
    };
    let mut tables: Vec<BTreeMap<String, Vec<Value>>> = vec![BTreeMap::new(); schemas.len()];
    for txn in txns {
        for op in txn {
            let t = op.table as usize;
            match &op.op {
                RowOp::Insert(r) => {
                    assert!(tables[t].insert(key(t, r), r.clone()).is_none());
                }
                RowOp::Delete(r) => {
                    assert!(tables[t].remove(&key(t, r)).is_some());
                }
                RowOp::Update { before, after } => {
                    assert!(tables[t].remove(&key(t, before)).is_some());
                    assert!(tables[t].insert(key(t, after), after.clone()).is_none());
                }
                RowOp::Upsert(r) => {
                    tables[t].insert(key(t, r), r.clone());
                }
                RowOp::Truncate => tables[t].clear(),
            }
        }
    }
    tables
        .into_iter()
        .map(|t| {
            let mut rows: Vec<String> = t.values().map(|r| format!("{r:?}")).collect();
            rows.sort();
            rows
        })
        .collect()
}

fn replay_and_compare(
    dir: &Path,
    ddl: &str,
    schemas: &[Arc<TableSchema>],
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>),
    txns: &[Txn],
) {
    let json = dir.join("changes.json");
    {
        let mut out = std::io::BufWriter::new(std::fs::File::create(&json).unwrap());
        write(&mut out);
        std::io::Write::flush(&mut out).unwrap();
    }
    let node = Node::start(NodeOptions {
        data_dir: dir.join("data"),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(ddl, "workload").unwrap()),
        settings: Settings {
            shards: 2,
            tile_rows: 256,
            block_rows: 1024,
            row_group_rows: 1024,
            file_rows: 4096,
            flush_interval_ms: 5,
            gc_interval_ms: 10,
            ..Settings::default()
        },
        listen: None,
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap();
    let report = run_sink(
        node.handle(),
        &SinkOptions {
            source: SourceSpec::File(json),
            follow: false,
            mode: TxnMode::Metadata,
            on_error: OnError::Stop,
            dead_letter: dir.join("dead.json"),
            max_group_txns: 64,
            group_commit_interval: Duration::from_millis(2),
            checkpoint_interval: None,
            max_txn_bytes: retina_node::settings::Settings::default().max_txn_bytes,
            decode_lanes: 3,
        },
    );
    assert_eq!(report.stopped_by, None);
    assert_eq!(report.transactions, txns.len() as u64);
    let h = node.handle();
    assert!(h.wait_visible(report.last_ts.unwrap(), Duration::from_secs(60)));
    let (query, snapshot) = h.begin_query().unwrap();
    let want = model(schemas, txns);
    for (t, schema) in schemas.iter().enumerate() {
        let mut types: Vec<ColumnType> = schema.columns().iter().map(|c| c.ty).collect();
        types.push(ColumnType::Int64);
        let mut got: Vec<String> = h
            .read_table(t as u32, snapshot)
            .unwrap()
            .iter()
            .flat_map(|b| batch_rows(b, &types))
            .map(|mut r| {
                r.pop();
                format!("{r:?}")
            })
            .collect();
        got.sort();
        assert_eq!(
            got.len(),
            want[t].len(),
            "rows of `{}` at the final snapshot",
            schema.name()
        );
        assert!(got == want[t], "the rows of `{}` differ", schema.name());
    }
    h.end_query(query);
    assert!(h.status().error().is_none());
    node.shutdown();
}

#[test]
fn a_replayed_ch_benchmark_stream_equals_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let w = chgen::generate(chgen::ChScale::tiny(), 5, 1500);
    let all: Vec<Txn> = w.load.iter().chain(&w.stream).cloned().collect();
    replay_and_compare(
        dir.path(),
        chgen::DDL,
        &chgen::schemas(),
        |out| w.write_debezium(out).unwrap(),
        &all,
    );
}

#[test]
fn a_replayed_hybench_stream_equals_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let w = hybench::generate(hybench::HyScale::tiny(), 5, 1500);
    let all: Vec<Txn> = w.load.iter().chain(&w.stream).cloned().collect();
    replay_and_compare(
        dir.path(),
        hybench::DDL,
        &hybench::schemas(),
        |out| w.write_debezium(out).unwrap(),
        &all,
    );
}
