//! Storage microbenchmarks, one core each: write-buffer inserts, visibility deletes,
//! `bitmap_at`, index updates, shard transactions, plus two sizes that are not times:
//! visibility bits per row after a fold and `_create_ts` bits per row on disk.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use retina_bench::ch::{OrderLines, orderline_schema};
use retina_bench::results::record;
use retina_protocol::AlignedVec;
use retina_storage::key::encode_key;
use retina_storage::{
    PrimaryIndex, RowId, RowOp, Shard, StorageConfig, TableOp, TileVisibility, Timestamp,
    WriteBuffer, file,
};

fn ts(v: u64) -> Timestamp {
    Timestamp::new(v).unwrap()
}

fn write_buffer(c: &mut Criterion) {
    let schema = orderline_schema();
    let rows: Vec<_> = OrderLines::new(1, 10).take(65_536).collect();
    let config = StorageConfig::default();
    let mut g = c.benchmark_group("write_buffer");
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.bench_function("append_orderline", |b| {
        b.iter_batched(
            || {
                let mut buf = WriteBuffer::new(schema.clone(), &config);
                buf.start_file(retina_storage::FileId::new(0, 0));
                buf
            },
            |mut buf| {
                for (i, r) in rows.iter().enumerate() {
                    buf.append(r, ts(i as u64 / 13 + 2));
                }
                buf
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

fn visibility(c: &mut Criterion) {
    const TILES: usize = 256;
    let mut g = c.benchmark_group("visibility");
    // Deletes spread over many tiles, timestamps rising: the replay pattern.
    // Tile i % TILES, offset a permutation of the tile's rows: every delete is a first delete.
    let offsets: Vec<(usize, u32)> = (0..TILES * 512)
        .map(|i| (i % TILES, ((i / TILES) * 2654435761 % 4096) as u32))
        .collect();
    g.throughput(Throughput::Elements(offsets.len() as u64));
    g.bench_function("delete", |b| {
        b.iter_batched(
            || vec![TileVisibility::new(4096).unwrap(); TILES],
            |mut tiles| {
                for (i, &(t, o)) in offsets.iter().enumerate() {
                    tiles[t].delete(o, ts(i as u64 / 8 + 2)).unwrap();
                }
                tiles
            },
            BatchSize::LargeInput,
        )
    });

    // bitmap_at on a tile with 512 pending deletes: at the newest snapshot (one copy) and in
    // the middle of the chain (base copy + OR of half the entries).
    let mut tile = TileVisibility::new(4096).unwrap();
    for i in 0..512u32 {
        tile.delete((i * 2654435761u32) % 4096, ts(u64::from(i) + 2))
            .unwrap_or(());
    }
    let mut out = vec![0u64; tile.words()];
    g.throughput(Throughput::Elements(4096));
    g.bench_function("bitmap_at_newest", |b| {
        b.iter(|| tile.bitmap_at(black_box(ts(1_000)), &mut out).unwrap())
    });
    g.bench_function("bitmap_at_mid_chain", |b| {
        b.iter(|| tile.bitmap_at(black_box(ts(258)), &mut out).unwrap())
    });
    let mut folded = tile.clone();
    folded.fold(ts(400));
    g.bench_function("bitmap_at_after_fold", |b| {
        b.iter(|| folded.bitmap_at(black_box(ts(450)), &mut out).unwrap())
    });
    g.finish();
}

fn index(c: &mut Criterion) {
    let schema = orderline_schema();
    let keys: Vec<Vec<u8>> = OrderLines::new(2, 10)
        .take(200_000)
        .map(|r| {
            let mut k = Vec::new();
            encode_key(&schema, &r, &mut k);
            k
        })
        .collect();
    let mut ix = PrimaryIndex::new();
    for (i, k) in keys.iter().enumerate() {
        ix.put(k, ts(2), RowId(i as u64)).unwrap();
    }
    let mut g = c.benchmark_group("index");
    g.throughput(Throughput::Elements(1));
    let mut now = 3u64;
    let mut i = 0usize;
    // An update: look the key up, write the new version (and the old one ages out in GC).
    g.bench_function("update", |b| {
        b.iter(|| {
            let k = &keys[(i * 7919) % keys.len()];
            let old = ix.latest(k).unwrap();
            ix.put(k, ts(now), RowId(old.0 + 1)).unwrap();
            i += 1;
            now += 1;
            // GC runs now and then (every 60 s in a node); its cost is spread over updates.
            if i.is_multiple_of(1 << 16) {
                ix.purge(ts(now - 1));
            }
        })
    });
    g.bench_function("lookup", |b| {
        b.iter(|| {
            i += 1;
            black_box(ix.lookup(&keys[(i * 7919) % keys.len()], ts(now)))
        })
    });
    g.finish();
}

fn shard(c: &mut Criterion) {
    // Pre-encoded NewOrder-shaped transactions of ~10 order lines, then updates of them.
    let schema = orderline_schema();
    let rows: Vec<_> = OrderLines::new(3, 10).take(100_000).collect();
    let txns: Vec<Vec<TableOp<Vec<retina_storage::Value>>>> = rows
        .chunks(10)
        .map(|c| {
            c.iter()
                .map(|r| TableOp {
                    table: 0,
                    op: RowOp::Insert(r.clone()),
                })
                .collect()
        })
        .collect();
    let updates: Vec<Vec<TableOp<Vec<retina_storage::Value>>>> = rows
        .chunks(10)
        .map(|c| {
            c.iter()
                .map(|r| {
                    let mut after = r.clone();
                    after[7] = retina_storage::Value::Int(6);
                    TableOp {
                        table: 0,
                        op: RowOp::Update {
                            before: r.clone(),
                            after,
                        },
                    }
                })
                .collect()
        })
        .collect();
    let mut g = c.benchmark_group("shard");
    g.throughput(Throughput::Elements(rows.len() as u64));
    let fresh = || {
        let mut s = Shard::new(0, StorageConfig::default()).unwrap();
        s.add_table(schema.clone());
        s
    };
    g.bench_function("apply_inserts", |b| {
        b.iter_batched(
            fresh,
            |mut s| {
                for (i, t) in txns.iter().enumerate() {
                    s.apply(ts(i as u64 + 2), t).unwrap();
                }
                s
            },
            BatchSize::LargeInput,
        )
    });
    // The same transactions as rkyv op batches of 100 transactions, read in place by the shard:
    // what a shard does with what the sink sends it.
    let batches: Vec<_> = txns
        .chunks(100)
        .enumerate()
        .map(|(i, chunk)| {
            let first = i as u64 * 100 + 2;
            retina_protocol::OpBatch {
                txns: chunk
                    .iter()
                    .enumerate()
                    .map(|(j, t)| retina_protocol::WireTxn {
                        ts: first + j as u64,
                        ops: t.iter().map(retina_protocol::WireTableOp::from).collect(),
                    })
                    .collect(),
                applied_through: first + chunk.len() as u64 - 1,
            }
            .encode()
            .unwrap()
        })
        .collect();
    g.bench_function("apply_archived_inserts", |b| {
        b.iter_batched(
            fresh,
            |mut s| {
                for bytes in &batches {
                    let batch = retina_protocol::OpBatch::access(bytes).unwrap();
                    for t in batch.txns.iter() {
                        s.apply(ts(t.ts.to_native()), &t.ops[..]).unwrap();
                    }
                }
                s
            },
            BatchSize::LargeInput,
        )
    });
    // What the sink does: the rows borrowed, each value encoded once.
    g.bench_function("encode_batches", |b| {
        b.iter(|| {
            for chunk in txns.chunks(100) {
                let batch = retina_protocol::OpBatchRef {
                    txns: chunk
                        .iter()
                        .map(|t| retina_protocol::WireTxnRef {
                            ts: 2,
                            ops: t
                                .iter()
                                .map(retina_protocol::WireTableOpRef::from)
                                .collect(),
                        })
                        .collect(),
                    applied_through: 2,
                };
                black_box(
                    batch
                        .encode_into(AlignedVec::with_capacity(1 << 20))
                        .unwrap(),
                );
            }
        })
    });
    // The same bytes from rows copied into owned wire values first (what the sink did before).
    g.bench_function("encode_batches_copied", |b| {
        b.iter(|| {
            for chunk in txns.chunks(100) {
                let batch = retina_protocol::OpBatch {
                    txns: chunk
                        .iter()
                        .map(|t| retina_protocol::WireTxn {
                            ts: 2,
                            ops: t.iter().map(retina_protocol::WireTableOp::from).collect(),
                        })
                        .collect(),
                    applied_through: 2,
                };
                black_box(batch.encode().unwrap());
            }
        })
    });
    g.bench_function("apply_updates", |b| {
        b.iter_batched(
            || {
                let mut s = fresh();
                for (i, t) in txns.iter().enumerate() {
                    s.apply(ts(i as u64 + 2), t).unwrap();
                }
                s
            },
            |mut s| {
                let base = txns.len() as u64 + 2;
                for (i, t) in updates.iter().enumerate() {
                    s.apply(ts(base + i as u64), t).unwrap();
                }
                s
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// A shard holding 1M order lines (seeded), one transaction per 1000, then every tenth row
/// deleted, 100 deletes per transaction.
fn orderlines_with_deletes(seed: u64) -> (Shard, Vec<Vec<retina_storage::Value>>) {
    let mut shard = Shard::new(0, StorageConfig::default()).unwrap();
    let t = shard.add_table(orderline_schema());
    let rows: Vec<_> = OrderLines::new(seed, 10).take(1 << 20).collect();
    for (i, c) in rows.chunks(1000).enumerate() {
        let ops: Vec<_> = c
            .iter()
            .map(|r| TableOp {
                table: t,
                op: RowOp::Insert(r.clone()),
            })
            .collect();
        shard.apply(ts(i as u64 + 2), &ops).unwrap();
    }
    let mut now = shard.applied_through().get();
    for c in rows.iter().step_by(10).collect::<Vec<_>>().chunks(100) {
        now += 1;
        let ops: Vec<_> = c
            .iter()
            .map(|r| TableOp {
                table: t,
                op: RowOp::Delete((*r).clone()),
            })
            .collect();
        shard.apply(ts(now), &ops).unwrap();
    }
    (shard, rows)
}

/// Sizes, not times: printed and recorded to `bench/results/storage_sizes.jsonl`.
fn sizes(_: &mut Criterion) {
    // Visibility after a fold: a file of 1M rows with 10% of its rows deleted, folded.
    let (mut shard, rows) = orderlines_with_deletes(4);
    let now = shard.applied_through().get();
    let before = shard.memory().visibility_bytes as f64 * 8.0 / rows.len() as f64;
    shard.gc(ts(now));
    let after = shard.memory().visibility_bytes as f64 * 8.0 / rows.len() as f64;
    println!(
        "visibility bits per row: {before:.3} with pending deletes, {after:.3} after the fold (paper: 1.16)"
    );
    let _ = record(
        "storage_sizes",
        "visibility_bits_per_row_pending",
        before,
        "bit/row",
    );
    let _ = record(
        "storage_sizes",
        "visibility_bits_per_row_folded",
        after,
        "bit/row",
    );

    // `_create_ts` on disk: bulk-loaded (one ts) and replayed (~13 rows per transaction).
    let schema = orderline_schema();
    let config = StorageConfig::default();
    let n = 1 << 20;
    for (label, rows_per_ts) in [("bulk", usize::MAX), ("replayed", 13)] {
        let mut buf = WriteBuffer::new(schema.clone(), &config);
        buf.start_file(retina_storage::FileId::new(0, 0));
        for (i, r) in rows.iter().take(n).enumerate() {
            let at = if rows_per_ts == usize::MAX {
                1
            } else {
                i / rows_per_ts + 2
            };
            buf.append(r, ts(at as u64));
        }
        let batches: Vec<_> = buf.take_flush_jobs().into_iter().map(|j| j.batch).collect();
        let bytes = file::encode(&schema, &batches, file::writer_properties(&config)).unwrap();
        let meta = parquet::file::metadata::ParquetMetaDataReader::new()
            .parse_and_finish(&bytes)
            .unwrap();
        let ts_col = schema.create_ts_index();
        let ts_bytes: i64 = meta
            .row_groups()
            .iter()
            .map(|rg| rg.column(ts_col).compressed_size())
            .sum();
        let bits = ts_bytes as f64 * 8.0 / n as f64;
        let total_bits = bytes.len() as f64 * 8.0 / n as f64;
        println!(
            "_create_ts {label}: {bits:.3} bits/row on disk (file {total_bits:.1} bits/row; paper: 0.18 bulk, 1.85 replayed)"
        );
        let _ = record(
            "storage_sizes",
            &format!("create_ts_bits_per_row_{label}"),
            bits,
            "bit/row",
        );
    }
}

/// VFoR overhead: the same scan-and-sum over the same Parquet file, as a plain reader does it
/// (every row) and through VFoR at a snapshot (row-group statistics, the deleted bitmap of 1%
/// of the rows, the `_create_ts` filter where a row group needs it).
fn vfor(c: &mut Criterion) {
    use arrow::array::BooleanArray;
    use arrow::array::{AsArray, types::Decimal128Type};
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::{
        ParquetRecordBatchReaderBuilder, RowSelection, RowSelectionPolicy,
    };

    let schema = orderline_schema();
    let config = StorageConfig::default();
    let rows: Vec<_> = OrderLines::new(5, 10).take(1 << 20).collect();
    let mut buf = WriteBuffer::new(schema.clone(), &config);
    buf.start_file(retina_storage::FileId::new(0, 0));
    for (i, r) in rows.iter().enumerate() {
        buf.append(r, ts(i as u64 / 13 + 2));
    }
    let batches: Vec<_> = buf.take_flush_jobs().into_iter().map(|j| j.batch).collect();
    let bytes = file::encode(&schema, &batches, file::writer_properties(&config)).unwrap();
    let mut vis = retina_storage::FileVisibility::new(config.tile_rows).unwrap();
    vis.extend_to(rows.len() as u64);
    let last = rows.len() as u64 / 13 + 2;
    for (k, off) in (0..rows.len() as u64).step_by(100).enumerate() {
        vis.delete(off, ts(last + 1 + k as u64)).unwrap();
    }
    let newest = ts(last + 1 + rows.len() as u64 / 100);
    let amount = schema.column_index("ol_amount").unwrap();
    let sum = |b: &arrow::record_batch::RecordBatch| -> i128 {
        b.column(0)
            .as_primitive::<Decimal128Type>()
            .values()
            .iter()
            .sum()
    };
    let mut g = c.benchmark_group("vfor");
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.sample_size(20);
    // The amounts summed by a plain Parquet read, with the rows `selection` keeps if given.
    let scan_sum = |selection: Option<(&RowSelection, RowSelectionPolicy)>| -> i128 {
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes.clone()).unwrap();
        let mask = ProjectionMask::roots(builder.parquet_schema(), [amount]);
        let mut builder = builder.with_projection(mask);
        if let Some((selection, policy)) = selection {
            builder = builder
                .with_row_selection(selection.clone())
                .with_row_selection_policy(policy);
        }
        builder.build().unwrap().map(|b| sum(&b.unwrap())).sum()
    };
    g.bench_function("plain_scan_sum", |b| b.iter(|| black_box(scan_sum(None))));
    let mut deleted = Vec::new();
    vis.bitmap_range(0, rows.len() as u64, newest, &mut deleted)
        .unwrap();
    g.bench_function("vfor_scan_sum_newest", |b| {
        b.iter(|| {
            let out = file::read_visible(bytes.clone(), &schema, newest, &deleted, Some(&[amount]))
                .unwrap();
            black_box(out.iter().map(&sum).sum::<i128>())
        })
    });
    // The same rows dropped inside the reader: decoded whole, then filtered by a row
    // selection applied as a mask (and, for comparison, as a list of skip/select runs).
    let keep = |i: usize| deleted.get(i / 64).is_none_or(|w| w >> (i % 64) & 1 == 0);
    let selection = RowSelection::from_filters(&[BooleanArray::from_iter(
        (0..rows.len()).map(|i| Some(keep(i))),
    )]);
    for (name, policy) in [
        ("mask_scan_sum", RowSelectionPolicy::Mask),
        ("selectors_scan_sum", RowSelectionPolicy::Selectors),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| black_box(scan_sum(Some((&selection, policy)))))
        });
    }
    // A snapshot inside the last row group: the `_create_ts` filter runs there.
    let mid = ts(last - 1000);
    let mut deleted_mid = Vec::new();
    vis.bitmap_range(0, rows.len() as u64, mid, &mut deleted_mid)
        .unwrap();
    g.bench_function("vfor_scan_sum_mid_row_group", |b| {
        b.iter(|| {
            let out =
                file::read_visible(bytes.clone(), &schema, mid, &deleted_mid, Some(&[amount]))
                    .unwrap();
            black_box(out.iter().map(&sum).sum::<i128>())
        })
    });
    g.finish();
}

/// A shard's checkpoint image of 1M order lines (combined into files, 10% deleted): the time
/// to take and encode it, to decode and restore it, and its size per row (recorded to
/// `bench/results/storage_sizes.jsonl`).
fn checkpoint(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = retina_storage::file::local_store(dir.path()).unwrap();
    let schema = orderline_schema();
    let (mut shard, rows) = orderlines_with_deletes(5);
    futures::executor::block_on(shard.flush_and_combine(store.as_ref())).unwrap();
    let mut id = 0;
    let bytes = {
        id += 1;
        shard.checkpoint(id).unwrap().encode().unwrap()
    };
    let per_row = bytes.len() as f64 * 8.0 / rows.len() as f64;
    println!(
        "checkpoint: {} bytes for {} rows ({per_row:.1} bit/row; index {:.1} MiB in memory)",
        bytes.len(),
        rows.len(),
        shard.memory().index_bytes as f64 / (1 << 20) as f64
    );
    let _ = record(
        "storage_sizes",
        "checkpoint_bits_per_row",
        per_row,
        "bit/row",
    );
    let mut g = c.benchmark_group("checkpoint");
    g.throughput(Throughput::Elements(rows.len() as u64));
    g.sample_size(10);
    g.bench_function("take_and_encode", |b| {
        b.iter(|| {
            id += 1;
            shard.checkpoint(id).unwrap().encode().unwrap()
        })
    });
    g.bench_function("decode_and_restore", |b| {
        b.iter(|| {
            let image = retina_storage::ShardImage::decode(&bytes).unwrap();
            Shard::from_image(
                StorageConfig::default(),
                std::slice::from_ref(&schema),
                image,
                1,
            )
            .unwrap()
        })
    });
    g.finish();
}

/// Parsing the replay workload's Debezium JSON lines into messages on one core, as a decode
/// lane does (the catalog lookup included): 20,000 lines of the NewOrder stream (stock updates,
/// order-line inserts, district updates and BEGIN/END markers).
fn decode(c: &mut Criterion) {
    use retina_node::catalog::Catalog;
    use retina_node::debezium::{ParseOptions, SourcePosition, parse_line_with};
    let catalog = Catalog::from_ddl(retina_bench::ch::REPLAY_DDL, "replay workload").unwrap();
    let txns = retina_bench::ch::replay_workload(1, 1, 2_000);
    let mut json = Vec::new();
    retina_bench::ch::write_debezium(&mut json, catalog.tables(), &txns).unwrap();
    let text = String::from_utf8(json).unwrap();
    // The NewOrder part: the load's inserts are a different shape, and the stream is mostly this.
    let lines: Vec<&str> = text.lines().rev().take(20_000).collect();
    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    let lookup = |name: &str| {
        catalog
            .resolve(name)
            .and_then(|id| catalog.get(id).cloned())
    };
    // As the node's decode lanes parse: a before image's key is all replay reads of it.
    let options = ParseOptions {
        before_keys_only: true,
        ..Default::default()
    };
    let pos = SourcePosition::new("bench", 1);
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Elements(lines.len() as u64));
    g.bench_function("neworder_lines", |b| {
        b.iter(|| {
            for line in &lines {
                black_box(parse_line_with(line, &pos, &lookup, &options).unwrap());
            }
        })
    });
    g.finish();
    eprintln!(
        "decode: {} lines, {bytes} bytes ({} bytes per line)",
        lines.len(),
        bytes / lines.len()
    );
}

criterion_group!(
    benches,
    sizes,
    write_buffer,
    visibility,
    index,
    shard,
    vfor,
    checkpoint,
    decode
);
criterion_main!(benches);
