//! The Flight service's own rules, with Rust's generated Flight client (the tests with real
//! client tools, pyarrow, ADBC and DuckDB, are in `cli/tests/flight.rs`): a Flight query ends
//! when every endpoint is read or when nobody comes for it, lives on while a stream is open,
//! every endpoint is read once with an unforgeable ticket, and the token is enforced.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightDescriptor, FlightInfo, Ticket};
use futures::StreamExt;
use retina_flight::{FlightOptions, FlightServer, FlightStartError};
use retina_node::catalog::Catalog;
use retina_node::node::{Node, NodeOptions};
use retina_node::settings::Settings;
use retina_storage::{RowOp, TableOp, Value};
use tonic::transport::Channel;

const DDL: &str = "CREATE TABLE bank.accounts (id BIGINT PRIMARY KEY, balance BIGINT NOT NULL);
                   CREATE TABLE bank.ledger (n BIGINT PRIMARY KEY, amount BIGINT NOT NULL);";
const LEASE_MS: u64 = 600;
const ROWS: i64 = 3000;
/// Ledger entries: enough (16 MB) that a stream outgrows what HTTP/2's flow control lets the
/// server send ahead, so the server cannot finish it before the client reads.
const ENTRIES: i64 = 1_000_000;

/// A node holding `ROWS` accounts and `entries` ledger entries.
fn start_node(dir: &std::path::Path, entries: i64) -> Node {
    let catalog = Arc::new(Catalog::from_ddl(DDL, "bank.sql").unwrap());
    let node = Node::start(NodeOptions {
        data_dir: dir.to_path_buf(),
        lake: Default::default(),
        catalog: catalog.clone(),
        settings: Settings {
            query_lease_ms: LEASE_MS,
            shards: 2,
            ..Settings::default()
        },
        listen: Some("127.0.0.1:0".parse().unwrap()),
        listener: None,
        auth_token: None,
        await_source: false,
        cluster: None,
    })
    .unwrap();
    let (accounts, ledger) = (
        catalog.resolve("bank.accounts").unwrap(),
        catalog.resolve("bank.ledger").unwrap(),
    );
    let mut last = 0;
    for chunk in (0..entries.max(ROWS)).collect::<Vec<_>>().chunks(20_000) {
        let txn: Vec<_> = chunk
            .iter()
            .filter(|&&i| i < ROWS)
            .map(|&i| TableOp {
                table: accounts,
                op: RowOp::Insert(vec![Value::Int(i), Value::Int(1000)]),
            })
            .chain(chunk.iter().filter(|&&i| i < entries).map(|&i| TableOp {
                table: ledger,
                op: RowOp::Insert(vec![Value::Int(i), Value::Int(i)]),
            }))
            .collect();
        last = *node.handle().submit(&[txn]).unwrap().end();
    }
    assert!(node.handle().wait_visible(last, Duration::from_secs(30)));
    node
}

fn serve(node: &Node, token: Option<&str>) -> FlightServer {
    FlightServer::start(FlightOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        node: node.coordinator_addr().unwrap(),
        token: token.map(str::to_owned),
        threads: 2,
        memory_limit: 256 << 20,
    })
    .unwrap()
}

async fn client(server: &FlightServer) -> FlightServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    FlightServiceClient::new(channel)
}

fn path(p: &[&str]) -> FlightDescriptor {
    FlightDescriptor::new_path(p.iter().map(|s| s.to_string()).collect())
}

/// Rows of one endpoint.
async fn read(
    client: &mut FlightServiceClient<Channel>,
    ticket: Ticket,
) -> Result<u64, tonic::Status> {
    let mut data = client.do_get(ticket).await?.into_inner();
    let mut rows = 0;
    while let Some(d) = data.next().await {
        rows += batch_rows(&d?);
    }
    Ok(rows)
}

fn batch_rows(d: &arrow_flight::FlightData) -> u64 {
    arrow::ipc::root_as_message(&d.data_header)
        .ok()
        .and_then(|m| m.header_as_record_batch())
        .map_or(0, |b| b.length() as u64)
}

fn waits_for(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tickets(info: &FlightInfo) -> Vec<Ticket> {
    info.endpoint
        .iter()
        .map(|e| e.ticket.clone().unwrap())
        .collect()
}

#[test]
fn a_flight_query_lives_while_read_and_ends_when_read_or_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), ENTRIES);
    let running = || {
        node.handle()
            .status()
            .running_queries
            .load(Ordering::Relaxed)
    };
    let server = serve(&node, None);
    let rt = retina_tests::runtime();
    rt.block_on(async {
        let mut c = client(&server).await;
        // Read to the end: the query ends with its last stream.
        let info = c
            .get_flight_info(path(&["bank.accounts", "bank", "ledger"]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(server.queries(), 1);
        assert!(
            info.total_records >= ROWS + ENTRIES,
            "{}",
            info.total_records
        );
        let mut rows = 0;
        for t in tickets(&info) {
            rows += read(&mut c, t).await.unwrap();
        }
        assert_eq!(rows, (ROWS + ENTRIES) as u64, "both tables, every row once");
        waits_for(
            "the query ends with its last stream",
            Duration::from_secs(5),
            || server.queries() == 0 && running() == 0,
        );
        // An endpoint is read once; a forged ticket reads nothing.
        let err = read(&mut c, tickets(&info)[0].clone()).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
        let info = c
            .get_flight_info(path(&["bank.accounts"]))
            .await
            .unwrap()
            .into_inner();
        let t = tickets(&info);
        let mut forged = t[0].ticket.to_vec();
        let at = forged.len() - 5;
        forged[at] ^= 1;
        let err = read(&mut c, Ticket::new(forged)).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
        if t.len() > 1 {
            read(&mut c, t[0].clone()).await.unwrap();
            let err = read(&mut c, t[0].clone()).await.unwrap_err();
            assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err}");
        }
        // Nobody comes back for this one: it ends after the lease length.
        waits_for(
            "an abandoned query ends",
            Duration::from_millis(LEASE_MS * 5 + 2000),
            || server.queries() == 0 && running() == 0,
        );

        // A stream held open keeps the query (and its lease) alive far past the lease.
        let info = c
            .get_flight_info(path(&["bank.ledger"]))
            .await
            .unwrap()
            .into_inner();
        let mut streams = Vec::new();
        for t in tickets(&info) {
            streams.push(c.do_get(t).await.unwrap().into_inner());
        }
        let mut rows = 0;
        for s in &mut streams {
            rows += batch_rows(&s.next().await.unwrap().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(LEASE_MS * 4)).await;
        assert_eq!(server.queries(), 1, "an open stream holds its query");
        assert_eq!(running(), 1);
        for s in &mut streams {
            while let Some(d) = s.next().await {
                rows += batch_rows(&d.unwrap());
            }
        }
        assert_eq!(rows, ENTRIES as u64, "the held stream reads on");
        drop(streams);
        waits_for("the query ends", Duration::from_secs(5), || {
            server.queries() == 0 && running() == 0
        });

        // SQL text in a command descriptor; anything but a query is refused.
        let info = c
            .get_flight_info(FlightDescriptor::new_cmd(
                "SELECT count(*) FROM bank.accounts a JOIN bank.ledger l ON a.id = l.n",
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(info.endpoint.len(), 1);
        let mut data = c
            .do_get(tickets(&info)[0].clone())
            .await
            .unwrap()
            .into_inner();
        let mut batches = Vec::new();
        while let Some(d) = data.next().await {
            batches.push(d.unwrap());
        }
        let decoded = arrow_flight::utils::flight_data_to_batches(&batches).unwrap();
        assert_eq!(retina_tests::ints(&decoded), vec![vec![ROWS]]);
        let err = c
            .get_flight_info(FlightDescriptor::new_cmd("DROP TABLE bank.accounts"))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("SELECT only"), "{err}");
    });
    drop(server);
    node.shutdown();
}

#[test]
fn the_token_is_required_and_an_open_address_needs_one() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), 10);
    let err = FlightServer::start(FlightOptions {
        listen: "0.0.0.0:0".parse().unwrap(),
        node: node.coordinator_addr().unwrap(),
        token: None,
        threads: 1,
        memory_limit: 256 << 20,
    })
    .err()
    .expect("no open address without a token");
    assert!(matches!(err, FlightStartError::NotLoopback(_)), "{err}");
    let server = serve(&node, Some("s3cret"));
    retina_tests::runtime().block_on(async {
        let mut c = client(&server).await;
        let err = c
            .get_flight_info(path(&["bank.accounts"]))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        let mut wrong = tonic::Request::new(path(&["bank.accounts"]));
        wrong
            .metadata_mut()
            .insert("authorization", "Bearer nope".parse().unwrap());
        let err = c.get_flight_info(wrong).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Unauthenticated);
        let mut right = tonic::Request::new(path(&["bank.accounts"]));
        right
            .metadata_mut()
            .insert("authorization", "bearer s3cret".parse().unwrap());
        let info = c.get_flight_info(right).await.unwrap().into_inner();
        assert!(!info.endpoint.is_empty());
    });
    drop(server);
    node.shutdown();
}

#[test]
fn stopping_does_not_wait_for_a_client_that_holds_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let node = start_node(dir.path(), ENTRIES);
    let server = serve(&node, None);
    let rt = retina_tests::runtime();
    let held = rt.block_on(async {
        let mut c = client(&server).await;
        let info = c
            .get_flight_info(path(&["bank.ledger"]))
            .await
            .unwrap()
            .into_inner();
        let mut stream = c
            .do_get(tickets(&info)[0].clone())
            .await
            .unwrap()
            .into_inner();
        stream.next().await.unwrap().unwrap();
        (c, stream)
    });
    let start = Instant::now();
    server.stop();
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "stopped in {:?} with a stream held open",
        start.elapsed()
    );
    drop(held);
    node.shutdown();
}
