//! The coordinator's Cap'n Proto service over loopback, as a query engine's client uses it:
//! bootstrap with the token, list tables, begin, renew and end queries; typed errors for a bad
//! token, the wrong service and an expired lease; no listening beyond loopback without a token.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use retina_node::catalog::Catalog;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_protocol::query::read_table;
use retina_protocol::retina_capnp::{bootstrap, coordinator, error, query_result};
use retina_storage::{RowOp, TableOp, Value};

const DDL: &str = "CREATE TABLE public.t (id INT PRIMARY KEY, v DECIMAL(8,2));
                   CREATE TABLE public.u (k VARCHAR(8), n BIGINT NOT NULL, PRIMARY KEY (k, n));";

fn start(dir: &std::path::Path, listen: SocketAddr, token: Option<&str>) -> Result<Node, String> {
    let settings = Settings {
        shards: 2,
        query_lease_ms: 200,
        persist_interval_ms: 10,
        ..Settings::default()
    };
    start_with(dir, listen, token, settings)
}

/// A node on loopback whose tables fill and combine small files: 64-row blocks, 128-row row
/// groups, 256-row files.
fn small_files(dir: &std::path::Path, token: Option<&str>) -> Node {
    let settings = Settings {
        shards: 2,
        tile_rows: 64,
        block_rows: 64,
        row_group_rows: 128,
        file_rows: 256,
        flush_interval_ms: 5,
        ..Settings::default()
    };
    start_with(dir, "127.0.0.1:0".parse().unwrap(), token, settings).unwrap()
}

fn start_with(
    dir: &std::path::Path,
    listen: SocketAddr,
    token: Option<&str>,
    settings: Settings,
) -> Result<Node, String> {
    Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "s.sql").unwrap()),
        settings,
        listen: Some(listen),
        listener: None,
        auth_token: token.map(str::to_owned),
        await_source: false,
        cluster: None,
    })
    .map_err(|e| e.to_string())
}

/// Runs `f` as a Cap'n Proto client of `addr` on a glommio executor of its own.
fn client<T: Send + 'static, F: Future<Output = T> + 'static>(
    addr: SocketAddr,
    f: impl FnOnce(bootstrap::Client) -> F + Send + 'static,
) -> T {
    common::on_executor(move || async move {
        let boot = retina_client::bootstrap(addr).await.unwrap();
        f(boot).await
    })
}

async fn connect(boot: &bootstrap::Client, token: &str) -> Result<coordinator::Client, String> {
    let mut req = boot.coordinator_request();
    req.get().set_auth_token(token);
    let resp = req.send().promise.await.map_err(|e| e.to_string())?;
    match resp.get().unwrap().get_result().unwrap().which().unwrap() {
        retina_protocol::retina_capnp::coordinator_result::Which::Ok(c) => Ok(c.unwrap()),
        retina_protocol::retina_capnp::coordinator_result::Which::Error(e) => {
            Err(describe(e.unwrap()))
        }
    }
}

fn describe(e: error::Reader<'_>) -> String {
    match e.which().unwrap() {
        error::Which::Unauthorized(()) => "unauthorized".into(),
        error::Which::LeaseExpired(id) => format!("lease expired {id}"),
        error::Which::WrongService(t) => format!("wrong service: {}", t.unwrap().to_str().unwrap()),
        _ => "other".into(),
    }
}

fn query(r: query_result::Reader<'_>) -> Result<(u64, u64, u64), String> {
    match r.which().unwrap() {
        query_result::Which::Ok(q) => {
            let q = q.unwrap();
            Ok((q.get_id(), q.get_snapshot(), q.get_lease_ms()))
        }
        query_result::Which::Error(e) => Err(describe(e.unwrap())),
    }
}

#[test]
fn a_client_bootstraps_lists_tables_and_holds_queries() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(dir.path(), "127.0.0.1:0".parse().unwrap(), Some("s3cret")).unwrap();
    let addr = node.coordinator_addr().unwrap();
    let h = node.handle().clone();
    let ts = h
        .submit(&[vec![TableOp {
            table: 0,
            op: RowOp::Insert(vec![Value::Int(1), Value::Decimal(5)]),
        }]])
        .unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(10)));
    let hwm = h.status().hwm();

    let (refused, wrong, tables, q, renewed, ended, again, expired) =
        client(addr, |boot| async move {
            let refused = connect(&boot, "nope").await.err();
            let mut req = boot.scan_service_request();
            req.get().set_auth_token("s3cret");
            let resp = req.send().promise.await.unwrap();
            let wrong = match resp.get().unwrap().get_result().unwrap().which().unwrap() {
                retina_protocol::retina_capnp::scan_service_result::Which::Error(e) => {
                    describe(e.unwrap())
                }
                _ => "ok".into(),
            };
            let c = connect(&boot, "s3cret").await.unwrap();

            let resp = c.list_tables_request().send().promise.await.unwrap();
            let tables: Vec<(u32, String, usize)> = resp
                .get()
                .unwrap()
                .get_tables()
                .unwrap()
                .iter()
                .map(|t| {
                    let (id, s) = read_table(t).unwrap();
                    (id, s.name().to_owned(), s.primary_key().len())
                })
                .collect();

            let resp = c.begin_query_request().send().promise.await.unwrap();
            let q = query(resp.get().unwrap().get_result().unwrap());
            let id = q.clone().unwrap().0;
            let mut req = c.renew_lease_request();
            req.get().set_query_id(id);
            let resp = req.send().promise.await.unwrap();
            let renewed = query(resp.get().unwrap().get_result().unwrap());
            let end = |id| {
                let mut req = c.end_query_request();
                req.get().set_query_id(id);
                req.send().promise
            };
            let resp = end(id).await.unwrap();
            let ended = match resp.get().unwrap().get_result().unwrap().which().unwrap() {
                retina_protocol::retina_capnp::done::Which::Ok(()) => "ok".to_owned(),
                retina_protocol::retina_capnp::done::Which::Error(e) => describe(e.unwrap()),
            };
            let resp = end(id).await.unwrap();
            let again = match resp.get().unwrap().get_result().unwrap().which().unwrap() {
                retina_protocol::retina_capnp::done::Which::Ok(()) => "ok".to_owned(),
                retina_protocol::retina_capnp::done::Which::Error(e) => describe(e.unwrap()),
            };
            // A query nobody renews loses its lease.
            let resp = c.begin_query_request().send().promise.await.unwrap();
            let lapsed = query(resp.get().unwrap().get_result().unwrap()).unwrap().0;
            glommio::timer::sleep(Duration::from_millis(500)).await;
            let mut req = c.renew_lease_request();
            req.get().set_query_id(lapsed);
            let resp = req.send().promise.await.unwrap();
            let expired = query(resp.get().unwrap().get_result().unwrap());
            (refused, wrong, tables, q, renewed, ended, again, expired)
        });

    assert_eq!(refused.as_deref(), Some("unauthorized"));
    assert!(wrong.starts_with("wrong service"), "{wrong}");
    assert_eq!(
        tables,
        vec![(0, "public.t".to_owned(), 1), (1, "public.u".to_owned(), 2)]
    );
    let (id, snapshot, lease) = q.unwrap();
    assert_eq!(snapshot, hwm.snapshot().get(), "a query reads at HWM - 1");
    assert_eq!(lease, 200);
    assert_eq!(renewed.unwrap(), (id, snapshot, 200));
    assert_eq!(ended, "ok");
    assert_eq!(again, format!("lease expired {id}"));
    assert!(expired.unwrap_err().starts_with("lease expired"));
    node.shutdown();
}

#[test]
fn listening_beyond_loopback_needs_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let err = start(dir.path(), "0.0.0.0:0".parse().unwrap(), None)
        .err()
        .unwrap();
    assert!(err.contains("needs --auth-token"), "{err}");
}

#[test]
fn a_table_read_through_the_contract_equals_the_node_s_own_read() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_files(&dir.path().join("data"), Some("tok"));
    let h = node.handle().clone();
    let row = |id: i64, v: i64| vec![Value::Int(id), Value::Decimal(v.into())];
    // 1,200 rows (files fill and combine), then updates and deletes of early rows.
    let inserts: Vec<Vec<TableOp<Vec<Value>>>> = (0..120)
        .map(|t| {
            (0..10)
                .map(|i| TableOp {
                    table: 0,
                    op: RowOp::Insert(row(t * 10 + i, 1)),
                })
                .collect()
        })
        .collect();
    h.submit(&inserts).unwrap();
    let changes: Vec<Vec<TableOp<Vec<Value>>>> = (0..60)
        .map(|i| {
            if i % 2 == 0 {
                vec![TableOp {
                    table: 0,
                    op: RowOp::Delete(row(i * 5, 1)),
                }]
            } else {
                vec![TableOp {
                    table: 0,
                    op: RowOp::Update {
                        before: row(i * 5, 1),
                        after: row(i * 5, 7),
                    },
                }]
            }
        })
        .collect();
    let last = h.submit(&changes).unwrap();
    assert!(h.wait_visible(*last.end(), Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(300)); // flushes and combinations

    let addr = node.coordinator_addr().unwrap();
    let lake = dir.path().join("data/lake");
    let (snapshot, mut rows, bitmaps) = client(addr, move |_| async move {
        let store = retina_storage::file::local_store(&lake).unwrap();
        let c = retina_client::coordinator(addr, "tok").await.unwrap();
        let read = retina_client::read(&c, "tok", store.as_ref(), "public.t", None)
            .await
            .unwrap();
        let types: Vec<_> = read.schema.columns().iter().map(|c| c.ty).collect();
        let rows: Vec<Vec<Value>> = read
            .batches
            .iter()
            .flat_map(|b| retina_storage::batch_rows(b, &types))
            .collect();
        // A combined file's bitmaps straight from its owner shard.
        let files: Vec<u64> = std::fs::read_dir(lake.join("tables/public.t"))
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".parquet")
                    .and_then(|h| u64::from_str_radix(h, 16).ok())
            })
            .collect();
        let file = *files.iter().min().expect("a combined file");
        (read.snapshot, rows, file)
    });
    rows.sort_by_key(|r| match r[0] {
        Value::Int(i) => i,
        _ => 0,
    });
    let mut expected: Vec<Vec<Value>> = (0..1200)
        .filter(|&id| !(id % 10 == 0 && id < 300))
        .map(|id| row(id, if id % 10 == 5 && id < 300 { 7 } else { 1 }))
        .collect();
    expected.sort_by_key(|r| match r[0] {
        Value::Int(i) => i,
        _ => 0,
    });
    assert_eq!(rows.len(), expected.len());
    assert_eq!(rows, expected);
    // The same rows as the node's own in-process read at that snapshot.
    let own: usize = h
        .read_table(0, snapshot)
        .unwrap()
        .iter()
        .map(|b| b.num_rows())
        .sum();
    assert_eq!(own, rows.len());

    // Bitmaps of a combined file's row groups, from the shard that owns it.
    let file = bitmaps;
    let shard = (file >> 48) as usize;
    let scan_addr = node.scan_addrs()[shard];
    let (rows_in_groups, deleted, unknown) = client(scan_addr, move |_| async move {
        let scan = retina_client::scan_service(scan_addr, "tok").await.unwrap();
        // Bitmap calls name a running query and read at its snapshot.
        let c = retina_client::coordinator(addr, "tok").await.unwrap();
        let q = retina_client::begin(&c).await.unwrap();
        assert!(q.snapshot >= snapshot);
        let mut req = scan.bitmaps_request();
        req.get().set_file_id(file);
        req.get().set_snapshot(q.snapshot.get());
        req.get().set_query_id(q.id);
        req.get().set_secret(q.secret);
        // Each row group asked twice is answered once.
        let mut rgs = req.get().init_row_groups(4);
        for (i, g) in [0, 1, 1, 0].into_iter().enumerate() {
            rgs.set(i as u32, g);
        }
        let resp = req.send().promise.await.unwrap();
        let (mut rows, mut deleted) = (0, 0);
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            retina_protocol::retina_capnp::bitmaps_result::Which::Ok(list) => {
                for b in list.unwrap() {
                    rows += b.get_rows();
                    deleted += b
                        .get_deleted()
                        .unwrap()
                        .iter()
                        .map(|x| x.count_ones() as u64)
                        .sum::<u64>();
                }
            }
            retina_protocol::retina_capnp::bitmaps_result::Which::Error(e) => {
                panic!("{}", describe(e.unwrap()))
            }
        }
        let mut req = scan.bitmaps_request();
        req.get().set_file_id(file + 1_000_000);
        req.get().set_snapshot(q.snapshot.get());
        req.get().set_query_id(q.id);
        req.get().set_secret(q.secret);
        let resp = req.send().promise.await.unwrap();
        let unknown = match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            retina_protocol::retina_capnp::bitmaps_result::Which::Error(e) => {
                retina_client::describe(e.unwrap())
            }
            _ => "ok".into(),
        };
        (rows, deleted, unknown)
    });
    assert_eq!(
        rows_in_groups, 256,
        "two row groups of 128 rows, each answered once"
    );
    assert!(deleted > 0, "the first file holds deleted and updated rows");
    assert!(
        unknown.ends_with("is gone: ask for a new plan"),
        "{unknown}"
    );
    node.shutdown();
}

#[test]
fn a_write_buffer_of_wide_rows_over_64_mib_is_read_in_parts() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeOptions {
        data_dir: dir.path().join("data"),
        lake: Default::default(),
        catalog: Arc::new(
            Catalog::from_ddl(
                "CREATE TABLE public.w (id INT PRIMARY KEY, body TEXT);",
                "w.sql",
            )
            .unwrap(),
        ),
        settings: Settings {
            shards: 1,
            ..Settings::default()
        },
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap();
    let h = node.handle().clone();
    // 700 rows of 100 KB: one memory block of about 70 MB, more than Cap'n Proto's default
    // 64 MiB a reader takes.
    let txns: Vec<Vec<TableOp<Vec<Value>>>> = (0..700)
        .map(|i| {
            vec![TableOp {
                table: 0,
                op: RowOp::Insert(vec![
                    Value::Int(i),
                    Value::Utf8(
                        i.to_string()
                            .repeat(100_000)
                            .chars()
                            .take(100_000)
                            .collect(),
                    ),
                ]),
            }]
        })
        .collect();
    let ts = h.submit(&txns).unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(30)));
    let addr = node.coordinator_addr().unwrap();
    let lake = dir.path().join("data/lake");
    let (rows, bytes) = client(addr, move |_| async move {
        let store = retina_storage::file::local_store(&lake).unwrap();
        let c = retina_client::coordinator(addr, "").await.unwrap();
        let read = retina_client::read(&c, "", store.as_ref(), "public.w", None)
            .await
            .unwrap();
        let types: Vec<_> = read.schema.columns().iter().map(|c| c.ty).collect();
        let rows: Vec<Vec<Value>> = read
            .batches
            .iter()
            .flat_map(|b| retina_storage::batch_rows(b, &types))
            .collect();
        let bytes: usize = rows
            .iter()
            .map(|r| match &r[1] {
                Value::Utf8(s) => s.len(),
                _ => 0,
            })
            .sum();
        (rows.len(), bytes)
    });
    assert_eq!(rows, 700);
    assert_eq!(bytes, 700 * 100_000);
    node.shutdown();
}

#[test]
fn a_begin_brings_the_scan_plans_of_the_tables_asked() {
    let dir = tempfile::tempdir().unwrap();
    let node = small_files(&dir.path().join("data"), None);
    let h = node.handle().clone();
    let inserts: Vec<Vec<TableOp<Vec<Value>>>> = (0..1200)
        .map(|id| {
            vec![TableOp {
                table: 0,
                op: RowOp::Insert(vec![Value::Int(id), Value::Decimal(1)]),
            }]
        })
        .collect();
    let last = h.submit(&inserts).unwrap();
    assert!(h.wait_visible(*last.end(), Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(300)); // flushes and combinations

    let addr = node.coordinator_addr().unwrap();
    /// What a plan says: the table, the snapshot, the files with their row groups, the
    /// write buffers' services.
    type Said = (u32, u64, Vec<(u64, String, u64, usize)>, Vec<SocketAddr>);
    let said = |p: &retina_client::ScanPlan| -> Said {
        let files = p.files.iter();
        (
            p.table.id,
            p.snapshot.get(),
            files
                .map(|f| (f.file, f.path.clone(), f.bytes, f.row_groups.len()))
                .collect(),
            p.buffers.clone(),
        )
    };
    let (q, with_begin, alone, over, ended) = client(addr, move |_| async move {
        let c = retina_client::coordinator(addr, "").await.unwrap();
        let asked: Vec<String> = ["public.t", "public.nope", "public.u", &"x".repeat(1025)]
            .map(str::to_owned)
            .into();
        let (q, plans) = retina_client::begin_and_plan(&c, &asked).await.unwrap();
        let with_begin: Vec<Result<Said, String>> = plans
            .iter()
            .map(|p| p.as_ref().map(said).map_err(|e| e.to_string()))
            .collect();
        // The same query's plans asked one by one.
        let mut alone = Vec::new();
        for table in ["public.t", "public.u"] {
            alone.push(said(&retina_client::plan(&c, q.id, table).await.unwrap()));
        }
        let over = retina_client::begin_and_plan(&c, &vec!["public.t".to_owned(); 257])
            .await
            .err()
            .map(|e| e.to_string());
        let ended = retina_client::end(&c, q.id).await.is_ok();
        (q, with_begin, alone, over, ended)
    });
    assert_eq!(with_begin.len(), 4, "one answer per table asked, in order");
    let t = with_begin[0].as_ref().unwrap();
    assert_eq!(t.1, q.snapshot.get(), "planned at the query's snapshot");
    assert!(!t.2.is_empty(), "the table's combined files are listed");
    assert_eq!(t, &alone[0]);
    assert_eq!(with_begin[2].as_ref().unwrap(), &alone[1]);
    assert_eq!(
        with_begin[1].as_ref().unwrap_err(),
        "unknown table public.nope"
    );
    let long = with_begin[3].as_ref().unwrap_err();
    assert!(long.contains("at most 1024"), "{long}");
    let over = over.expect("257 tables are refused");
    assert!(over.contains("at most 256"), "{over}");
    assert!(ended, "the query began and ran until ended");
    node.shutdown();
}
