//! The contract's calls, one function each: bootstrap on a port, begin and end a query, take a
//! table's scan plan, ask a shard's scan service for bitmaps and its write buffer. [`read`] and
//! [`read_at`] read a whole table at a snapshot the way any query engine would: they read
//! Parquet from the object store themselves and apply VFoR. Runs on a glommio executor (the
//! streams are glommio's); [`crate::Connection`] runs them on a thread of its own for any
//! other runtime.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use capnp_rpc::rpc_twoparty_capnp::Side;
use capnp_rpc::{RpcSystem, twoparty};
use futures::AsyncReadExt;
use object_store::ObjectStore;
use object_store::path::Path;
use retina_protocol::query::read_table;
use retina_protocol::retina_capnp::{
    bitmaps_result, bootstrap, buffer_part, buffer_result, coordinator, coordinator_result, done,
    file_bitmaps_result, query_result, scan_plan_result, scan_service, scan_service_result,
};
use retina_storage::file::{Projection, RowGroupInfo, filter_visible, get, read_visible};
use retina_storage::{TableSchema, Timestamp};

use crate::error::{ClientError, refused};
use crate::types::{
    BufferPart, PartData, PlanFile, QueryInfo, RowGroupBitmap, ScanPlan, TableInfo, TableRead,
};

/// Largest reply this client reads, in 8-byte words (Cap'n Proto's default, 64 MiB, is less than
/// one shard's write buffer of a table with wide rows may take even in parts of
/// `MAX_PART_BYTES`).
pub const MAX_REPLY_WORDS: usize = 1 << 27;

/// Bootstraps on `addr` and returns its bootstrap capability.
pub async fn bootstrap(addr: SocketAddr) -> Result<bootstrap::Client, ClientError> {
    let stream =
        glommio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| ClientError::Connect {
                addr,
                reason: e.to_string(),
            })?;
    let _ = stream.set_nodelay(true);
    let (r, w) = stream.split();
    let mut options = capnp::message::ReaderOptions::new();
    options.traversal_limit_in_words(Some(MAX_REPLY_WORDS));
    let network = twoparty::VatNetwork::new(
        futures::io::BufReader::with_capacity(retina_protocol::query::RPC_BUFFER_BYTES, r),
        futures::io::BufWriter::with_capacity(retina_protocol::query::RPC_BUFFER_BYTES, w),
        Side::Client,
        options,
    );
    let mut rpc = RpcSystem::new(Box::new(network), None);
    let boot: bootstrap::Client = rpc.bootstrap(Side::Server);
    glommio::spawn_local(async move {
        let _ = rpc.await;
    })
    .detach();
    Ok(boot)
}

/// How long connecting to a service may take, from the TCP connect to its answer: a port
/// that accepts and never answers (a node stuck, or another program on it) is an error, not
/// a wait without end.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `connect`, or [`ClientError::Connect`] after [`CONNECT_TIMEOUT`].
async fn within_connect_timeout<T>(
    addr: SocketAddr,
    connect: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    let connect = std::pin::pin!(connect);
    let timer = std::pin::pin!(glommio::timer::sleep(CONNECT_TIMEOUT));
    match futures::future::select(connect, timer).await {
        futures::future::Either::Left((result, _)) => result,
        futures::future::Either::Right(_) => Err(ClientError::Connect {
            addr,
            reason: format!("no answer in {CONNECT_TIMEOUT:?}"),
        }),
    }
}

/// The coordinator at `addr`.
pub async fn coordinator(
    addr: SocketAddr,
    token: &str,
) -> Result<coordinator::Client, ClientError> {
    within_connect_timeout(addr, async {
        let boot = bootstrap(addr).await?;
        let mut req = boot.coordinator_request();
        req.get().set_auth_token(token);
        let resp = req.send().promise.await?;
        match resp.get()?.get_result()?.which()? {
            coordinator_result::Which::Ok(c) => Ok(c?),
            coordinator_result::Which::Error(e) => Err(refused(e)),
        }
    })
    .await
}

/// A shard's scan service at `addr`.
pub async fn scan_service(
    addr: SocketAddr,
    token: &str,
) -> Result<scan_service::Client, ClientError> {
    within_connect_timeout(addr, async {
        let boot = bootstrap(addr).await?;
        let mut req = boot.scan_service_request();
        req.get().set_auth_token(token);
        let resp = req.send().promise.await?;
        match resp.get()?.get_result()?.which()? {
            scan_service_result::Which::Ok(c) => Ok(c?),
            scan_service_result::Which::Error(e) => Err(refused(e)),
        }
    })
    .await
}

/// Begins a query: its id, snapshot, lease and secret.
pub async fn begin(coordinator: &coordinator::Client) -> Result<QueryInfo, ClientError> {
    let resp = coordinator.begin_query_request().send().promise.await?;
    query_info(resp.get()?.get_result()?)
}

/// Begins a query and takes the scan plan of each of `tables` at its snapshot, in one round
/// trip: the query, and each table's plan or refusal in the order asked. A node that does not
/// serve the combined call (an older one) is asked to begin only, and the plans are empty:
/// ask for each with [`plan`].
pub async fn begin_and_plan(
    coordinator: &coordinator::Client,
    tables: &[String],
) -> Result<(QueryInfo, Vec<Result<ScanPlan, ClientError>>), ClientError> {
    let mut req = coordinator.begin_query_and_plan_request();
    let mut list = req.get().init_tables(tables.len() as u32);
    for (i, t) in tables.iter().enumerate() {
        list.set(i as u32, t);
    }
    let resp = match req.send().promise.await {
        Err(e) if e.kind == capnp::ErrorKind::Unimplemented => {
            return Ok((begin(coordinator).await?, Vec::new()));
        }
        r => r?,
    };
    let r = resp.get()?;
    let query = query_info(r.get_result()?)?;
    let plans = r.get_plans()?.iter().map(scan_plan).collect();
    Ok((query, plans))
}

/// A `QueryResult` as a [`QueryInfo`] or the refusal.
fn query_info(r: query_result::Reader<'_>) -> Result<QueryInfo, ClientError> {
    match r.which()? {
        query_result::Which::Ok(q) => {
            let q = q?;
            Ok(QueryInfo {
                id: q.get_id(),
                snapshot: Timestamp::new(q.get_snapshot())?,
                lease_ms: q.get_lease_ms(),
                secret: q.get_secret(),
            })
        }
        query_result::Which::Error(e) => Err(refused(e)),
    }
}

/// Ends a query (an error if its lease had run out).
pub async fn end(coordinator: &coordinator::Client, query: u64) -> Result<(), ClientError> {
    let mut req = coordinator.end_query_request();
    req.get().set_query_id(query);
    let resp = req.send().promise.await?;
    if let done::Which::Error(e) = resp.get()?.get_result()?.which()? {
        return Err(refused(e));
    }
    Ok(())
}

/// Renews a query's lease: the query as it stands now.
pub async fn renew(
    coordinator: &coordinator::Client,
    query: u64,
) -> Result<QueryInfo, ClientError> {
    let mut req = coordinator.renew_lease_request();
    req.get().set_query_id(query);
    let resp = req.send().promise.await?;
    query_info(resp.get()?.get_result()?)
}

/// The node's tables.
pub async fn tables(coordinator: &coordinator::Client) -> Result<Vec<TableInfo>, ClientError> {
    let resp = coordinator.list_tables_request().send().promise.await?;
    resp.get()?
        .get_tables()?
        .iter()
        .map(|t| {
            let (id, schema) = read_table(t)?;
            Ok(TableInfo { id, schema })
        })
        .collect()
}

/// The scan plan of `table` at the snapshot of the running query `query`.
pub async fn plan(
    coordinator: &coordinator::Client,
    query: u64,
    table: &str,
) -> Result<ScanPlan, ClientError> {
    let mut req = coordinator.scan_plan_request();
    req.get().set_query_id(query);
    req.get().set_table(table);
    let resp = req.send().promise.await?;
    scan_plan(resp.get()?.get_result()?)
}

/// A `ScanPlanResult` as a [`ScanPlan`] or the refusal.
fn scan_plan(r: scan_plan_result::Reader<'_>) -> Result<ScanPlan, ClientError> {
    let plan = match r.which()? {
        scan_plan_result::Which::Ok(p) => p?,
        scan_plan_result::Which::Error(e) => return Err(refused(e)),
    };
    let (id, schema) = read_table(plan.get_table()?)?;
    let mut files = Vec::new();
    for f in plan.get_files()? {
        files.push(PlanFile {
            file: f.get_file_id(),
            path: f.get_path()?.to_str()?.to_owned(),
            bytes: f.get_bytes(),
            owner: endpoint(f.get_owner()?.get_address()?.to_str()?)?,
            row_groups: row_groups(f.get_row_groups()?),
        });
    }
    let buffers = plan
        .get_buffers()?
        .iter()
        .map(|b| endpoint(b.get_address()?.to_str()?))
        .collect::<Result<_, _>>()?;
    Ok(ScanPlan {
        table: TableInfo { id, schema },
        snapshot: Timestamp::new(plan.get_snapshot())?,
        store_url: plan.get_store_url()?.to_str()?.to_owned(),
        files,
        buffers,
    })
}

/// Reads every row of `table` visible at a new query's snapshot, through the contract.
/// `store` is the plan's store, rooted at its store URL; these calls run on glommio, so it
/// must be one that any executor can poll (a local lake's). A lake on S3 is read through
/// the DataFusion connector (`retina_query`), which runs on tokio.
pub async fn read(
    coordinator: &coordinator::Client,
    token: &str,
    store: &dyn ObjectStore,
    table: &str,
    projection: Projection<'_>,
) -> Result<TableRead, ClientError> {
    let query = begin(coordinator).await?;
    let result = read_at(coordinator, token, store, table, &query, projection).await;
    end(coordinator, query.id).await?;
    let (schema, batches) = result?;
    Ok(TableRead {
        snapshot: query.snapshot,
        schema,
        batches,
    })
}

/// Reads every row of `table` visible at the snapshot of the running query `query`; several
/// tables read under one query are consistent with each other.
pub async fn read_at(
    coordinator: &coordinator::Client,
    token: &str,
    store: &dyn ObjectStore,
    table: &str,
    query: &QueryInfo,
    projection: Projection<'_>,
) -> Result<(Arc<TableSchema>, Vec<RecordBatch>), ClientError> {
    let mut req = coordinator.scan_plan_request();
    req.get().set_query_id(query.id);
    req.get().set_table(table);
    let resp = req.send().promise.await?;
    let plan = match resp.get()?.get_result()?.which()? {
        scan_plan_result::Which::Ok(p) => p?,
        scan_plan_result::Which::Error(e) => return Err(refused(e)),
    };
    let snapshot = Timestamp::new(plan.get_snapshot())?;
    if snapshot != query.snapshot {
        return Err(ClientError::BadPlan(format!(
            "a plan at {snapshot} for query {} at {}",
            query.id, query.snapshot
        )));
    }
    let (table_id, schema) = read_table(plan.get_table()?)?;
    let known: Vec<u64> = plan.get_files()?.iter().map(|f| f.get_file_id()).collect();
    let mut scans = HashMap::new();
    let mut out = Vec::new();
    // The plan's regular files, whole, with the owner's bitmaps of all their row groups.
    for f in plan.get_files()? {
        let groups = row_groups(f.get_row_groups()?);
        let owner = endpoint(f.get_owner()?.get_address()?.to_str()?)?;
        let scan = cached_scan_service(&mut scans, owner, token).await?;
        let all: Vec<u32> = (0..groups.len() as u32).collect();
        let bits = bitmaps(&scan, query, f.get_file_id(), &all).await?;
        let deleted = file_bitmap(&groups, &bits);
        let bytes = get(store, &Path::from(f.get_path()?.to_str()?)).await?;
        out.extend(read_visible(
            bytes, &schema, snapshot, &deleted, projection,
        )?);
    }
    for e in plan.get_buffers()? {
        let addr = endpoint(e.get_address()?.to_str()?)?;
        let scan = cached_scan_service(&mut scans, addr, token).await?;
        for part in write_buffer(&scan, query, table_id, &known, &[]).await? {
            match part.data {
                PartData::Memory(batches) => {
                    for batch in batches {
                        out.push(filter_visible(
                            &batch,
                            &schema,
                            snapshot,
                            &part.deleted,
                            projection,
                        )?);
                    }
                }
                PartData::Path(path) => {
                    let bytes = get(store, &Path::from(path)).await?;
                    out.extend(read_visible(
                        bytes,
                        &schema,
                        snapshot,
                        &part.deleted,
                        projection,
                    )?);
                }
            }
        }
    }
    Ok((schema, out))
}

/// The scan service at `addr`, bootstrapped once per read.
async fn cached_scan_service(
    scans: &mut HashMap<SocketAddr, scan_service::Client>,
    addr: SocketAddr,
    token: &str,
) -> Result<scan_service::Client, ClientError> {
    if let Some(s) = scans.get(&addr) {
        return Ok(s.clone());
    }
    let s = scan_service(addr, token).await?;
    scans.insert(addr, s.clone());
    Ok(s)
}

/// The bitmaps of `row_groups` of `file` at `query`'s snapshot, from a scan service.
pub async fn bitmaps(
    scan: &scan_service::Client,
    query: &QueryInfo,
    file: u64,
    row_groups: &[u32],
) -> Result<Vec<RowGroupBitmap>, ClientError> {
    let mut req = scan.bitmaps_request();
    req.get().set_file_id(file);
    req.get().set_snapshot(query.snapshot.get());
    req.get().set_query_id(query.id);
    req.get().set_secret(query.secret);
    let mut list = req.get().init_row_groups(row_groups.len() as u32);
    for (i, g) in row_groups.iter().enumerate() {
        list.set(i as u32, *g);
    }
    let resp = req.send().promise.await?;
    match resp.get()?.get_result()?.which()? {
        bitmaps_result::Which::Ok(list) => read_bitmaps(list?),
        bitmaps_result::Which::Error(e) => Err(refused(e)),
    }
}

/// The bitmaps of several files' row groups (`files`: each file and its row groups) at the
/// query's snapshot, in one call; each file's answer in the order asked.
pub async fn file_bitmaps(
    scan: &scan_service::Client,
    query: &QueryInfo,
    files: &[(u64, Vec<u32>)],
) -> Result<Vec<Vec<RowGroupBitmap>>, ClientError> {
    let mut req = scan.file_bitmaps_request();
    req.get().set_snapshot(query.snapshot.get());
    req.get().set_query_id(query.id);
    req.get().set_secret(query.secret);
    let mut list = req.get().init_files(files.len() as u32);
    for (i, (file, groups)) in files.iter().enumerate() {
        let mut entry = list.reborrow().get(i as u32);
        entry.set_file_id(*file);
        let mut g = entry.init_row_groups(groups.len() as u32);
        for (j, group) in groups.iter().enumerate() {
            g.set(j as u32, *group);
        }
    }
    let resp = req.send().promise.await?;
    match resp.get()?.get_result()?.which()? {
        file_bitmaps_result::Which::Ok(list) => {
            let list = list?;
            if list.len() as usize != files.len() {
                return Err(ClientError::BadPlan(format!(
                    "bitmaps of {} files asked, {} answered",
                    files.len(),
                    list.len()
                )));
            }
            list.iter()
                .zip(files)
                .map(|(entry, (file, _))| {
                    if entry.get_file_id() != *file {
                        return Err(ClientError::BadPlan(format!(
                            "bitmaps of file {file} asked, of file {} answered",
                            entry.get_file_id()
                        )));
                    }
                    read_bitmaps(entry.get_bitmaps()?)
                })
                .collect()
        }
        file_bitmaps_result::Which::Error(e) => Err(refused(e)),
    }
}

/// Row groups' bitmaps from the contract's list.
fn read_bitmaps(
    list: capnp::struct_list::Reader<'_, retina_protocol::retina_capnp::row_group_bitmap::Owned>,
) -> Result<Vec<RowGroupBitmap>, ClientError> {
    list.iter()
        .map(|b| {
            Ok(RowGroupBitmap {
                row_group: b.get_row_group(),
                rows: b.get_rows(),
                deleted: bitmap_words(b.get_deleted()?),
            })
        })
        .collect()
}

/// The write buffer of `table` at `query`'s snapshot from a scan service, with the regular
/// files it holds that are not in `known`; memory parts hold `columns` (empty: all), then
/// `_create_ts`.
pub async fn write_buffer(
    scan: &scan_service::Client,
    query: &QueryInfo,
    table: u32,
    known: &[u64],
    columns: &[u16],
) -> Result<Vec<BufferPart>, ClientError> {
    let mut req = scan.write_buffer_request();
    req.get().set_table(table);
    req.get().set_snapshot(query.snapshot.get());
    req.get().set_query_id(query.id);
    req.get().set_secret(query.secret);
    let mut list = req.get().init_known_files(known.len() as u32);
    for (i, f) in known.iter().enumerate() {
        list.set(i as u32, *f);
    }
    let mut list = req.get().init_columns(columns.len() as u32);
    for (i, c) in columns.iter().enumerate() {
        list.set(i as u32, *c);
    }
    let resp = req.send().promise.await?;
    let parts = match resp.get()?.get_result()?.which()? {
        buffer_result::Which::Ok(p) => p?,
        buffer_result::Which::Error(e) => return Err(refused(e)),
    };
    let mut out = Vec::with_capacity(parts.len() as usize);
    for part in parts {
        let data = match part.which()? {
            buffer_part::Which::Memory(ipc) => {
                let reader = arrow::ipc::reader::StreamReader::try_new(ipc?, None)?;
                PartData::Memory(reader.collect::<Result<_, _>>()?)
            }
            buffer_part::Which::Path(p) => PartData::Path(p?.to_str()?.to_owned()),
        };
        out.push(BufferPart {
            file: part.get_file_id(),
            offset: part.get_offset(),
            rows: part.get_rows(),
            deleted: bitmap_words(part.get_deleted()?),
            data,
            bytes: Some(part.get_bytes()).filter(|&b| b > 0),
            max_create_ts: Some(part.get_max_create_ts()).filter(|&t| t != u64::MAX),
        });
    }
    Ok(out)
}

/// A plan's row groups, owned.
fn row_groups(
    list: capnp::struct_list::Reader<'_, retina_protocol::retina_capnp::row_group::Owned>,
) -> Vec<RowGroupInfo> {
    list.iter()
        .map(|g| RowGroupInfo {
            offset: g.get_offset(),
            rows: g.get_rows(),
            min_create_ts: g.get_min_create_ts(),
            max_create_ts: g.get_max_create_ts(),
        })
        .collect()
}

/// A file's deleted rows as one bitmap (bit i = row i), from its row groups' bitmaps.
pub fn file_bitmap(row_groups: &[RowGroupInfo], bits: &[RowGroupBitmap]) -> Vec<u64> {
    let rows: u64 = row_groups.iter().map(|g| g.rows).sum();
    let mut out = vec![0u64; rows.div_ceil(64) as usize];
    for b in bits {
        let at = row_groups[b.row_group as usize].offset;
        for (w, &word) in b.deleted.iter().enumerate() {
            let mut word = word;
            while word != 0 {
                let i = at + w as u64 * 64 + u64::from(word.trailing_zeros());
                word &= word - 1;
                if i < rows {
                    out[(i / 64) as usize] |= 1 << (i % 64);
                }
            }
        }
    }
    out
}

/// A scan service's address as a plan gives it.
fn endpoint(text: &str) -> Result<SocketAddr, ClientError> {
    text.parse()
        .map_err(|e| ClientError::BadPlan(format!("endpoint `{text}`: {e}")))
}

/// A bitmap as the contract carries it, little-endian bytes, back into 64-bit words.
pub fn bitmap_words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_words_reads_little_endian_bytes_and_a_short_last_word() {
        let words = [0x0102_0304_0506_0708u64, 0xff];
        let mut bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(bitmap_words(&bytes), words);
        bytes.truncate(9);
        assert_eq!(bitmap_words(&bytes), words);
        assert!(bitmap_words(&[]).is_empty());
    }

    #[test]
    fn file_bitmap_places_each_row_groups_bits_at_its_offset() {
        let group = |offset, rows| RowGroupInfo {
            offset,
            rows,
            min_create_ts: 1,
            max_create_ts: 1,
        };
        let groups = [group(0, 70), group(70, 60)];
        let bits = [
            RowGroupBitmap {
                row_group: 0,
                rows: 70,
                deleted: vec![1, 1 << 5],
            },
            // Bit 60 is past the group's and the file's last row: ignored.
            RowGroupBitmap {
                row_group: 1,
                rows: 60,
                deleted: vec![1 << 0 | 1 << 59 | 1 << 60],
            },
        ];
        let out = file_bitmap(&groups, &bits);
        let set: Vec<u64> = (0..130)
            .filter(|&i| out[(i / 64) as usize] >> (i % 64) & 1 == 1)
            .collect();
        assert_eq!(set, vec![0, 69, 70, 129]);
    }

    #[test]
    fn a_port_that_accepts_and_never_answers_is_an_error_in_time() {
        // Listening, never accepting: the kernel completes the connection, nothing answers.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap();
        let started = std::time::Instant::now();
        let err = crate::Connection::connect(addr, "")
            .err()
            .expect("no coordinator there");
        assert!(
            matches!(&err, ClientError::Connect { reason, .. } if reason.contains("no answer")),
            "{err}"
        );
        assert!(started.elapsed() >= CONNECT_TIMEOUT);
    }

    #[test]
    fn endpoints_are_socket_addresses() {
        assert_eq!(
            endpoint("127.0.0.1:7401").unwrap(),
            "127.0.0.1:7401".parse::<SocketAddr>().unwrap()
        );
        assert!(matches!(endpoint("shard-1"), Err(ClientError::BadPlan(_))));
    }
}
