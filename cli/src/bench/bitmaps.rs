//! `retina bench bitmaps`: bitmap requests to a shard's scan service over loopback, latency one
//! at a time and throughput with many in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use retina_bench::results::record;
use retina_node::catalog::Catalog;
use retina_node::settings::Settings;

use crate::measure::{local_node, median, percentile};

pub(super) fn run(requests: usize, in_flight: usize) -> anyhow::Result<()> {
    use retina_storage::{RowOp, TableOp, Value};
    let catalog = Arc::new(Catalog::from_ddl(
        "CREATE TABLE t (id BIGINT PRIMARY KEY, v BIGINT)",
        "bench",
    )?);
    let dir = tempfile::Builder::new().prefix("retina-bench-").tempdir()?;
    // One shard, one combined file of 2 row groups of 4,096 rows (a 512-byte bitmap each).
    let settings = Settings {
        shards: 1,
        block_rows: 4096,
        row_group_rows: 4096,
        file_rows: 8192,
        flush_interval_ms: 5,
        ..Settings::default()
    };
    let node = local_node(dir.path().join("data"), catalog, settings, true)?;
    let h = node.handle().clone();
    let rows: Vec<_> = (0..8192i64)
        .map(|i| TableOp {
            table: 0,
            op: RowOp::Insert(vec![Value::Int(i), Value::Int(i)]),
        })
        .collect();
    let ts = h.submit(&[rows])?;
    anyhow::ensure!(h.wait_visible(*ts.end(), Duration::from_secs(30)));
    let lake = dir.path().join("data/lake/tables/t");
    let start = Instant::now();
    let file = loop {
        let found = std::fs::read_dir(&lake).ok().and_then(|d| {
            d.flatten().find_map(|e| {
                let name = e.file_name().into_string().ok()?;
                u64::from_str_radix(name.strip_suffix(".parquet")?, 16).ok()
            })
        });
        if let Some(f) = found {
            break f;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(30),
            "the file was not combined"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let addr = node.scan_addrs()[0];
    let coordinator = node
        .coordinator_addr()
        .ok_or_else(|| anyhow::anyhow!("the bench node serves no queries"))?;
    let (mut latencies, per_second) =
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(512 << 10)
            .spawn(move || async move {
                let scan = retina_client::scan_service(addr, "")
                    .await
                    .expect("scan service");
                // Bitmap calls name a running query, read at its snapshot.
                let c = retina_client::coordinator(coordinator, "")
                    .await
                    .expect("coordinator");
                let q = retina_client::begin(&c).await.expect("a query");
                let call = |rg: u32| {
                    let mut req = scan.bitmaps_request();
                    req.get().set_file_id(file);
                    req.get().set_snapshot(q.snapshot.get());
                    req.get().set_query_id(q.id);
                    req.get().set_secret(q.secret);
                    req.get().init_row_groups(1).set(0, rg);
                    req.send().promise
                };
                let mut latencies = Vec::with_capacity(requests);
                for i in 0..requests {
                    let t = Instant::now();
                    call((i % 2) as u32).await.expect("a bitmap");
                    latencies.push(t.elapsed().as_secs_f64() * 1e6);
                }
                let t = Instant::now();
                let mut done = 0;
                while done < requests {
                    let batch: Vec<_> = (0..in_flight.min(requests - done))
                        .map(|i| call((i % 2) as u32))
                        .collect();
                    done += batch.len();
                    for r in futures::future::join_all(batch).await {
                        r.expect("a bitmap");
                    }
                }
                (latencies, requests as f64 / t.elapsed().as_secs_f64())
            })
            .map_err(|e| anyhow::anyhow!("client executor: {e}"))?
            .join()
            .map_err(|e| anyhow::anyhow!("client executor: {e}"))?;
    let p50 = median(&mut latencies);
    let p99 = percentile(&mut latencies, 99).expect("at least one sample");
    println!(
        "bitmap requests over loopback (4,096-row row group, 512-byte bitmap): p50 {p50:.0} us, p99 {p99:.0} us one at a time; {per_second:.0} requests/s with {in_flight} in flight"
    );
    let _ = record("rpc", "bitmap_latency_p50_us", p50, "us");
    let _ = record("rpc", "bitmap_latency_p99_us", p99, "us");
    let _ = record("rpc", "bitmap_requests_per_s", per_second, "requests/s");
    node.shutdown();
    Ok(())
}
