//! `retina bench flight`: reading a whole table over Arrow Flight (`DoGet` of every endpoint,
//! in parallel, over loopback) beside reading the same rows through the DataFusion connector
//! in this process: rows/s, MB/s and the time to the first batch.

use std::time::Instant;

use anyhow::Context;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{FlightData, FlightDescriptor};
use futures::{StreamExt, TryStreamExt};
use retina_bench::results::record;
use retina_flight::{FlightOptions, FlightServer};
use retina_query::Retina;
use tonic::transport::Channel;

use super::common::order_line_node;
use crate::measure::median;

/// One read of the table: rows, bytes and times.
struct Read {
    rows: u64,
    bytes: u64,
    first_batch_ms: f64,
    seconds: f64,
}

impl Read {
    fn rows_per_s(&self) -> f64 {
        self.rows as f64 / self.seconds
    }

    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }
}

pub(super) fn run(rows: usize, runs: usize, shards: u16) -> anyhow::Result<()> {
    let (_dir, node) = order_line_node(rows, 0, shards)?;
    let addr = node.coordinator_addr().context("the node listens")?;
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let server = FlightServer::start(FlightOptions {
        listen: "127.0.0.1:0".parse()?,
        node: addr,
        token: None,
        threads,
        memory_limit: 2 << 30,
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (mut flight, mut connector) = (Vec::new(), Vec::new());
    runtime.block_on(async {
        let retina = Retina::connect(addr, "")?;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", server.addr()))?
            .tcp_nodelay(true)
            .connect()
            .await?;
        let client = FlightServiceClient::new(channel);
        // The first run of each warms the caches.
        for run in 0..=runs {
            let f = read_flight(&client).await?;
            let c = read_connector(&retina).await?;
            anyhow::ensure!(
                f.rows == rows as u64 && c.rows == rows as u64,
                "read {} rows over Flight and {} through the connector, not {rows}",
                f.rows,
                c.rows
            );
            println!(
                "run {run}: Flight {:.2}M rows/s, {:.0} MB/s, first batch {:.1} ms; \
                 connector {:.2}M rows/s, {:.0} MB/s, first batch {:.1} ms",
                f.rows_per_s() / 1e6,
                f.mb_per_s(),
                f.first_batch_ms,
                c.rows_per_s() / 1e6,
                c.mb_per_s(),
                c.first_batch_ms
            );
            if run > 0 {
                flight.push(f);
                connector.push(c);
            }
        }
        anyhow::Ok(())
    })?;
    for (name, reads) in [("doget", &flight), ("connector", &connector)] {
        let m = |f: fn(&Read) -> f64| median(&mut reads.iter().map(f).collect::<Vec<_>>());
        let (rps, mbps, first) = (
            m(Read::rows_per_s),
            m(Read::mb_per_s),
            m(|r| r.first_batch_ms),
        );
        println!(
            "{name:>9}: {:.2}M rows/s, {mbps:.0} MB/s, first batch {first:.1} ms (medians of {runs})",
            rps / 1e6
        );
        let _ = record("flight", &format!("{name}_rows_per_s"), rps, "rows/s");
        let _ = record("flight", &format!("{name}_mb_per_s"), mbps, "MB/s");
        let _ = record("flight", &format!("{name}_first_batch_ms"), first, "ms");
    }
    drop(server);
    node.shutdown();
    Ok(())
}

/// `GetFlightInfo` of the table, then `DoGet` of every endpoint at once; bytes are the Flight
/// messages' (IPC header and body).
async fn read_flight(client: &FlightServiceClient<Channel>) -> anyhow::Result<Read> {
    let start = Instant::now();
    let info = client
        .clone()
        .get_flight_info(FlightDescriptor::new_path(vec!["orderline".into()]))
        .await?
        .into_inner();
    let first = std::sync::Mutex::new(None::<f64>);
    let reads = futures::future::try_join_all(info.endpoint.iter().map(|e| {
        let mut client = client.clone();
        let ticket = e.ticket.clone().context("an endpoint has a ticket");
        let first = &first;
        async move {
            let mut data = client.do_get(ticket?).await?.into_inner();
            let (mut rows, mut bytes) = (0u64, 0u64);
            while let Some(d) = data.next().await {
                let d: FlightData = d?;
                bytes += (d.data_header.len() + d.data_body.len()) as u64;
                if !d.data_body.is_empty() {
                    first
                        .lock()
                        .expect("first batch")
                        .get_or_insert(start.elapsed().as_secs_f64() * 1e3);
                }
                // The row count of a record batch message, without decoding it.
                if let Ok(message) = arrow::ipc::root_as_message(&d.data_header)
                    && let Some(batch) = message.header_as_record_batch()
                {
                    rows += batch.length() as u64;
                }
            }
            anyhow::Ok((rows, bytes))
        }
    }))
    .await?;
    let seconds = start.elapsed().as_secs_f64();
    Ok(Read {
        rows: reads.iter().map(|r| r.0).sum(),
        bytes: reads.iter().map(|r| r.1).sum(),
        first_batch_ms: first.into_inner().expect("first batch").unwrap_or(f64::NAN),
        seconds,
    })
}

/// `SELECT *` through the DataFusion connector; bytes are the batches' Arrow buffers.
async fn read_connector(retina: &Retina) -> anyhow::Result<Read> {
    let start = Instant::now();
    let session = retina.begin().await?;
    let mut stream = session.sql("SELECT * FROM orderline").await?;
    let (mut rows, mut bytes, mut first) = (0u64, 0u64, None);
    while let Some(batch) = stream.try_next().await? {
        first.get_or_insert(start.elapsed().as_secs_f64() * 1e3);
        rows += batch.num_rows() as u64;
        bytes += batch.get_array_memory_size() as u64;
    }
    Ok(Read {
        rows,
        bytes,
        first_batch_ms: first.unwrap_or(f64::NAN),
        seconds: start.elapsed().as_secs_f64(),
    })
}
