//! A hostile client of the Cap'n Proto services, written against the schema with capnp-rpc
//! directly (not the node's client): garbage and oversized messages, unbounded lists, hundreds
//! of connections, thousands of queries, calls on other connections' queries and snapshots the
//! coordinator never handed out. Each is refused with a typed error (or, over the message
//! limits, the connection is closed), and the node keeps serving other clients correctly.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{RpcSystem, twoparty};
use futures::AsyncReadExt;
use retina_node::catalog::Catalog;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_protocol::retina_capnp::{
    bitmaps_result, bootstrap, buffer_result, coordinator, coordinator_result, done, error,
    file_bitmaps_result, query_result, scan_plan_result, scan_service, scan_service_result,
};
use retina_storage::{RowOp, TableOp, Value};

const DDL: &str = "CREATE TABLE public.t (id INT PRIMARY KEY, v BIGINT);";

fn start(dir: &std::path::Path) -> Node {
    Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: Arc::new(Catalog::from_ddl(DDL, "s.sql").unwrap()),
        settings: Settings {
            shards: 2,
            query_lease_ms: 60_000,
            ..Settings::default()
        },
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap()
}

/// A bootstrap capability on `addr`, from capnp-rpc alone.
async fn boot(addr: SocketAddr) -> bootstrap::Client {
    let (b, rpc) = boot_closable(addr).await;
    rpc.detach();
    b
}

/// [`boot`], with the task that runs the connection: dropping it closes the connection.
async fn boot_closable(addr: SocketAddr) -> (bootstrap::Client, glommio::Task<()>) {
    let stream = glommio::net::TcpStream::connect(addr).await.unwrap();
    let (r, w) = stream.split();
    let network = twoparty::VatNetwork::new(r, w, Side::Client, Default::default());
    let mut rpc = RpcSystem::new(Box::new(network), None);
    let b: bootstrap::Client = rpc.bootstrap(Side::Server);
    let task = glommio::spawn_local(async move {
        let _ = rpc.await;
    });
    (b, task)
}

async fn coord(addr: SocketAddr) -> coordinator::Client {
    let (c, rpc) = coord_closable(addr).await;
    rpc.detach();
    c
}

async fn coord_closable(addr: SocketAddr) -> (coordinator::Client, glommio::Task<()>) {
    let (b, rpc) = boot_closable(addr).await;
    let mut req = b.coordinator_request();
    req.get().set_auth_token("");
    let resp = req.send().promise.await.unwrap();
    match resp.get().unwrap().get_result().unwrap().which().unwrap() {
        coordinator_result::Which::Ok(c) => (c.unwrap(), rpc),
        coordinator_result::Which::Error(_) => panic!("refused"),
    }
}

async fn scan(addr: SocketAddr) -> scan_service::Client {
    let b = boot(addr).await;
    let mut req = b.scan_service_request();
    req.get().set_auth_token("");
    let resp = req.send().promise.await.unwrap();
    match resp.get().unwrap().get_result().unwrap().which().unwrap() {
        scan_service_result::Which::Ok(c) => c.unwrap(),
        scan_service_result::Which::Error(_) => panic!("refused"),
    }
}

/// A typed error in short: `kind` or `kind:detail`.
fn kind(e: error::Reader<'_>) -> String {
    match e.which().unwrap() {
        error::Which::LeaseExpired(id) => format!("leaseExpired:{id}"),
        error::Which::InvalidArgument(t) => {
            format!("invalidArgument:{}", t.unwrap().to_str().unwrap())
        }
        error::Which::TooManyQueries(n) => format!("tooManyQueries:{n}"),
        error::Which::UnknownFile(id) => format!("unknownFile:{id}"),
        error::Which::UnknownTable(_) => "unknownTable".into(),
        error::Which::Internal(t) => format!("internal:{}", t.unwrap().to_str().unwrap()),
        _ => "other".into(),
    }
}

#[derive(Clone, Copy, Debug)]
struct Q {
    id: u64,
    snapshot: u64,
    secret: u64,
}

async fn begin(c: &coordinator::Client) -> Result<Q, String> {
    let resp = c.begin_query_request().send().promise.await.unwrap();
    match resp.get().unwrap().get_result().unwrap().which().unwrap() {
        query_result::Which::Ok(q) => {
            let q = q.unwrap();
            Ok(Q {
                id: q.get_id(),
                snapshot: q.get_snapshot(),
                secret: q.get_secret(),
            })
        }
        query_result::Which::Error(e) => Err(kind(e.unwrap())),
    }
}

/// `writeBuffer` of table 0 at `snapshot` for query `(id, secret)`: "ok" or the typed error;
/// `Err` when the call itself failed (the connection closed).
async fn write_buffer(
    s: &scan_service::Client,
    id: u64,
    secret: u64,
    snapshot: u64,
    known: u32,
    columns: &[u16],
) -> Result<String, String> {
    let mut req = s.write_buffer_request();
    req.get().set_table(0);
    req.get().set_snapshot(snapshot);
    req.get().set_query_id(id);
    req.get().set_secret(secret);
    let mut list = req.get().init_known_files(known);
    for i in 0..known {
        list.set(i, u64::from(i));
    }
    let mut cols = req.get().init_columns(columns.len() as u32);
    for (i, c) in columns.iter().enumerate() {
        cols.set(i as u32, *c);
    }
    let resp = req.send().promise.await.map_err(|e| e.to_string())?;
    Ok(
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            buffer_result::Which::Ok(p) => format!("ok:{}", p.unwrap().len()),
            buffer_result::Which::Error(e) => kind(e.unwrap()),
        },
    )
}

async fn bitmaps(
    s: &scan_service::Client,
    q: Q,
    snapshot: u64,
    groups: &[u32],
) -> Result<String, String> {
    let mut req = s.bitmaps_request();
    req.get().set_file_id(1);
    req.get().set_snapshot(snapshot);
    req.get().set_query_id(q.id);
    req.get().set_secret(q.secret);
    let mut list = req.get().init_row_groups(groups.len() as u32);
    for (i, g) in groups.iter().enumerate() {
        list.set(i as u32, *g);
    }
    let resp = req.send().promise.await.map_err(|e| e.to_string())?;
    Ok(
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            bitmaps_result::Which::Ok(l) => format!("ok:{}", l.unwrap().len()),
            bitmaps_result::Which::Error(e) => kind(e.unwrap()),
        },
    )
}

async fn file_bitmaps(
    s: &scan_service::Client,
    q: Q,
    snapshot: u64,
    files: &[(u64, &[u32])],
) -> Result<String, String> {
    let mut req = s.file_bitmaps_request();
    req.get().set_snapshot(snapshot);
    req.get().set_query_id(q.id);
    req.get().set_secret(q.secret);
    let mut list = req.get().init_files(files.len() as u32);
    for (i, (file, groups)) in files.iter().enumerate() {
        let mut f = list.reborrow().get(i as u32);
        f.set_file_id(*file);
        let mut g = f.init_row_groups(groups.len() as u32);
        for (j, group) in groups.iter().enumerate() {
            g.set(j as u32, *group);
        }
    }
    let resp = req.send().promise.await.map_err(|e| e.to_string())?;
    Ok(
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            file_bitmaps_result::Which::Ok(l) => format!("ok:{}", l.unwrap().len()),
            file_bitmaps_result::Which::Error(e) => kind(e.unwrap()),
        },
    )
}

async fn end(c: &coordinator::Client, id: u64) -> Result<String, String> {
    let mut req = c.end_query_request();
    req.get().set_query_id(id);
    let resp = req.send().promise.await.map_err(|e| e.to_string())?;
    Ok(
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            done::Which::Ok(()) => "ok".into(),
            done::Which::Error(e) => kind(e.unwrap()),
        },
    )
}

async fn renew(c: &coordinator::Client, id: u64) -> Result<String, String> {
    let mut req = c.renew_lease_request();
    req.get().set_query_id(id);
    let resp = req.send().promise.await.map_err(|e| e.to_string())?;
    Ok(
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            query_result::Which::Ok(_) => "ok".into(),
            query_result::Which::Error(e) => kind(e.unwrap()),
        },
    )
}

async fn plan(c: &coordinator::Client, id: u64, table: &str) -> Result<String, String> {
    let mut req = c.scan_plan_request();
    req.get().set_query_id(id);
    req.get().set_table(table);
    let resp = req.send().promise.await.map_err(|e| e.to_string())?;
    Ok(
        match resp.get().unwrap().get_result().unwrap().which().unwrap() {
            scan_plan_result::Which::Ok(_) => "ok".into(),
            scan_plan_result::Which::Error(e) => kind(e.unwrap()),
        },
    )
}

/// Rows of `public.t` through the node's own client: what an honest client reads.
fn honest_read(addr: SocketAddr, lake: std::path::PathBuf) -> usize {
    common::on_executor(move || async move {
        let store = retina_storage::file::local_store(&lake).unwrap();
        let c = retina_client::coordinator(addr, "").await.unwrap();
        let read = retina_client::read(&c, "", store.as_ref(), "public.t", None)
            .await
            .unwrap();
        read.batches.iter().map(|b| b.num_rows()).sum()
    })
}

/// Inserts rows `ids`, one transaction each, and waits until they are visible.
fn load(node: &Node, ids: std::ops::Range<i64>) {
    let h = node.handle();
    let txns: Vec<Vec<TableOp<Vec<Value>>>> = ids
        .map(|i| {
            vec![TableOp {
                table: 0,
                op: RowOp::Insert(vec![Value::Int(i), Value::Int(i)]),
            }]
        })
        .collect();
    let ts = h.submit(&txns).unwrap();
    assert!(h.wait_visible(*ts.end(), Duration::from_secs(10)));
}

#[test]
fn scan_calls_serve_only_running_queries_at_the_snapshot_they_were_given() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"));
    load(&node, 0..100);
    let addr = node.coordinator_addr().unwrap();
    let shard = node.scan_addrs()[0];
    let answers = common::on_executor(move || async move {
        let c = coord(addr).await;
        let s = scan(shard).await;
        let q = begin(&c).await.unwrap();
        let mut a = Vec::new();
        // At once after beginQuery: the call finds the query (waiting for it if it came first).
        a.push(write_buffer(&s, q.id, q.secret, q.snapshot, 0, &[]).await);
        a.push(write_buffer(&s, q.id, q.secret ^ 1, q.snapshot, 0, &[]).await);
        a.push(write_buffer(&s, 0, 0, q.snapshot, 0, &[]).await);
        // Applied on this shard, but not a snapshot the coordinator handed out.
        a.push(write_buffer(&s, q.id, q.secret, q.snapshot + 1, 0, &[]).await);
        a.push(write_buffer(&s, q.id, q.secret, q.snapshot - 1, 0, &[]).await);
        a.push(bitmaps(&s, Q { secret: 7, ..q }, q.snapshot, &[0]).await);
        a.push(file_bitmaps(&s, Q { secret: 7, ..q }, q.snapshot, &[(1, &[0])]).await);
        // No file at all: nothing to answer, but the query is checked all the same.
        a.push(file_bitmaps(&s, q, q.snapshot, &[]).await);
        a.push(file_bitmaps(&s, Q { secret: 7, ..q }, q.snapshot, &[]).await);
        assert_eq!(end(&c, q.id).await.unwrap(), "ok");
        // The shard hears of the end by message: moments later.
        let start = Instant::now();
        let after_end = loop {
            let r = write_buffer(&s, q.id, q.secret, q.snapshot, 0, &[]).await;
            if !r.as_deref().is_ok_and(|a| a.starts_with("ok")) {
                break r;
            }
            assert!(start.elapsed() < Duration::from_secs(5), "still served");
            glommio::timer::sleep(Duration::from_millis(5)).await;
        };
        a.push(after_end);
        a
    });
    let answers: Vec<String> = answers.into_iter().map(Result::unwrap).collect();
    assert!(answers[0].starts_with("ok:"), "{answers:?}");
    assert!(answers[1].starts_with("leaseExpired:"), "{answers:?}");
    assert_eq!(answers[2], "leaseExpired:0");
    assert!(answers[3].starts_with("invalidArgument:"), "{answers:?}");
    assert!(answers[4].starts_with("invalidArgument:"), "{answers:?}");
    assert!(answers[5].starts_with("leaseExpired:"), "{answers:?}");
    assert!(answers[6].starts_with("leaseExpired:"), "{answers:?}");
    assert_eq!(answers[7], "ok:0");
    assert!(answers[8].starts_with("leaseExpired:"), "{answers:?}");
    assert!(answers[9].starts_with("leaseExpired:"), "{answers:?}");
    node.shutdown();
}

#[test]
fn every_argument_is_checked_with_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"));
    load(&node, 0..10);
    let addr = node.coordinator_addr().unwrap();
    let shard = node.scan_addrs()[0];
    let answers = common::on_executor(move || async move {
        let c = coord(addr).await;
        let s = scan(shard).await;
        let q = begin(&c).await.unwrap();
        vec![
            write_buffer(&s, q.id, q.secret, 0, 0, &[]).await,
            write_buffer(&s, q.id, q.secret, 1 << 53, 0, &[]).await,
            bitmaps(&s, q, 0, &[0]).await,
            bitmaps(&s, q, u64::MAX, &[0]).await,
            // Column 2 of a two-column table, and a column named twice.
            write_buffer(&s, q.id, q.secret, q.snapshot, 0, &[2]).await,
            write_buffer(&s, q.id, q.secret, q.snapshot, 0, &[1, 1]).await,
            file_bitmaps(&s, q, 0, &[(1, &[0])]).await,
            // Over the bounds on lists (for fileBitmaps, all files' row groups together).
            bitmaps(&s, q, q.snapshot, &vec![0; 65_537]).await,
            file_bitmaps(&s, q, q.snapshot, &[(1, &[0; 40_000]), (2, &[0; 25_537])]).await,
            write_buffer(&s, q.id, q.secret, q.snapshot, 65_537, &[]).await,
            plan(&c, q.id, &"x".repeat(2000)).await,
            // A projection the bounds allow.
            write_buffer(&s, q.id, q.secret, q.snapshot, 65_536, &[1]).await,
        ]
    });
    let answers: Vec<String> = answers.into_iter().map(Result::unwrap).collect();
    for (i, a) in answers[..11].iter().enumerate() {
        assert!(a.starts_with("invalidArgument:"), "call {i}: {answers:?}");
    }
    assert!(answers[11].starts_with("ok:"), "{answers:?}");
    node.shutdown();
}

#[test]
fn a_hostile_client_is_refused_and_others_are_served_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(&dir.path().join("data"));
    load(&node, 0..300);
    let addr = node.coordinator_addr().unwrap();
    let shard = node.scan_addrs()[0];
    let lake = dir.path().join("data/lake");
    assert_eq!(honest_read(addr, lake.clone()), 300);

    // Garbage and a frame header claiming a huge message, on raw sockets: closed.
    for bytes in [
        vec![0xffu8; 64],
        [0u32.to_le_bytes(), (1u32 << 31).to_le_bytes()].concat(),
    ] {
        use std::io::{Read, Write};
        let mut raw = std::net::TcpStream::connect(addr).unwrap();
        raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        raw.write_all(&bytes).unwrap();
        let mut buf = [0u8; 1024];
        // The node answers with an abort message at most, then closes.
        let mut total = 0;
        while let Ok(n) = raw.read(&mut buf) {
            if n == 0 {
                break;
            }
            total += n;
            assert!(total < 1 << 16, "the node keeps talking to garbage");
        }
    }

    let status = node.handle().status().clone();
    let outcome = common::on_executor(move || async move {
        let mine = coord(addr).await;
        let theirs = coord(addr).await;
        let q = begin(&theirs).await.unwrap();
        let mut a = vec![
            // Another connection's query: neither renewed, ended nor planned here.
            renew(&mine, q.id).await,
            plan(&mine, q.id, "public.t").await,
            end(&mine, q.id).await,
            renew(&theirs, q.id).await,
        ];
        // Thousands of queries on one connection: refused past its limit.
        let t = Instant::now();
        let mut begun = 0;
        let mut refused = String::new();
        for _ in 0..2_000 {
            match begin(&mine).await {
                Ok(_) => begun += 1,
                Err(e) => {
                    refused = e;
                    break;
                }
            }
        }
        a.push(Ok(format!("{begun} then {refused}")));
        eprintln!("{begun} begins in {:?}", t.elapsed());
        // A message over the limit: the connection closes.
        let big = scan(shard).await;
        a.push(write_buffer(&big, q.id, q.secret, q.snapshot, 2_000_000, &[]).await);
        a.push(plan(&mine, q.id, &"y".repeat(16 << 20)).await);
        // Hundreds of connections at once, each begun and dropped.
        let conns: Vec<_> = futures::future::join_all((0..300).map(|_| coord_closable(addr))).await;
        let queries = futures::future::join_all(conns.iter().map(|(c, _)| begin(c))).await;
        let ok = queries.iter().filter(|q| q.is_ok()).count();
        a.push(Ok(format!("{ok} of 300")));
        // Closed: their queries end.
        drop(conns);
        drop(mine);
        a.push(end(&theirs, q.id).await);
        a
    });
    for (i, o) in outcome[..3].iter().enumerate() {
        assert!(
            o.as_ref().unwrap().starts_with("leaseExpired:"),
            "{i}: {outcome:?}"
        );
    }
    assert_eq!(outcome[3].as_deref(), Ok("ok"), "the owner may renew");
    assert_eq!(
        outcome[4].as_deref(),
        Ok("256 then tooManyQueries:256"),
        "{outcome:?}"
    );
    assert!(outcome[5].is_err(), "closed: {outcome:?}");
    assert!(outcome[6].is_err(), "closed: {outcome:?}");
    assert_eq!(outcome[7].as_deref(), Ok("300 of 300"));
    assert_eq!(outcome[8].as_deref(), Ok("ok"), "{outcome:?}");

    // Closed connections' queries end with them.
    let start = Instant::now();
    while status.running_queries.load(Ordering::Relaxed) > 0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} queries still run",
            status.running_queries.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // And the node serves an honest client as before.
    load(&node, 300..310);
    assert_eq!(honest_read(addr, lake), 310);
    node.shutdown();
}
