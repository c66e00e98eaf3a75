//! The CH-benCHmark generator: deterministic bytes, the stream's shape against BENCH.md, the DDL
//! against the node's catalog, the Debezium JSON against the node's parser, and every update and
//! delete against a plain model of the tables.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use retina_bench::chgen::{
    self, ChGen, ChScale, ChWorkload, FreshClock, LOAD_US, SelfCheck, Txn, table,
};
use retina_node::catalog::Catalog;
use retina_node::debezium::{SourcePosition, TxnAssembler, TxnMode, parse_line};
use retina_storage::{RowOp, TableSchema, Value};

const STREAM_TXNS: usize = 3000;

fn workload(seed: u64) -> ChWorkload {
    chgen::generate(ChScale::tiny(), seed, STREAM_TXNS)
}

fn json(w: &ChWorkload) -> Vec<u8> {
    let mut out = Vec::new();
    w.write_debezium(&mut out).unwrap();
    out
}

#[test]
fn the_same_seed_gives_the_same_bytes() {
    let a = workload(7);
    let b = workload(7);
    assert_eq!(a.load, b.load);
    assert_eq!(a.stream, b.stream);
    let bytes = json(&a);
    assert_eq!(bytes, json(&b));
    let c = workload(8);
    assert_ne!(a.stream, c.stream);
    assert_ne!(bytes, json(&c));
    // Stamping real time changes only the timestamps, not the draws.
    let mut g = ChGen::new(ChScale::tiny(), 7);
    g.load(1000);
    let wall = g.stream(STREAM_TXNS, &mut FreshClock::Wall);
    assert_eq!(wall.len(), a.stream.len());
    for (x, y) in wall.iter().zip(&a.stream) {
        assert_eq!(x.len(), y.len());
        assert!(x.iter().zip(y).all(|(p, q)| p.table == q.table));
    }
}

#[test]
fn the_stream_has_bench_md_shape() {
    let w = workload(11);
    let schemas = chgen::schemas();
    let check = SelfCheck::of(&schemas, &w.stream);
    println!("{check}");
    println!("{:?}", w.counts);
    assert_eq!(check.transactions, STREAM_TXNS as u64);
    let rows_per_txn = check.rows_per_txn();
    assert!((10.0..17.0).contains(&rows_per_txn), "{rows_per_txn}");
    let updates = check.update_share();
    assert!((0.60..0.80).contains(&updates), "{updates}");
    let deletes = check.delete_share();
    assert!(deletes > 0.0 && deletes < 0.05, "{deletes}");
    assert!(
        check.table_share("stock") + check.table_share("orderline") > 0.6,
        "{check}"
    );
    // Only neworder rows are deleted; only the TPC-C tables change.
    for (name, t) in &check.tables {
        assert_eq!(t.deletes > 0, name == "neworder", "{name}");
        if ["item", "supplier", "nation", "region"].contains(&name.as_str()) {
            assert_eq!(t.rows(), 0, "{name}");
        }
    }
    // The mix: 45/43/4 of the draws, 1% of NewOrders rolled back, a Delivery per district.
    let c = w.counts;
    let draws = (c.new_orders + c.payments + c.deliveries) as f64;
    let share = |n: u64| n as f64 / draws;
    assert!((share(c.new_orders) - 45.0 / 92.0).abs() < 0.04, "{c:?}");
    assert!((share(c.payments) - 43.0 / 92.0).abs() < 0.04, "{c:?}");
    assert!((share(c.deliveries) - 4.0 / 92.0).abs() < 0.02, "{c:?}");
    assert!(c.rolled_back > 0 && (c.rolled_back as f64) < 0.03 * c.new_orders as f64);
    let districts = ChScale::tiny().districts_per_warehouse;
    assert!(c.delivery_txns + c.districts_skipped <= c.deliveries * districts as u64);
    assert!(c.delivery_txns + c.districts_skipped + (districts as u64) > c.deliveries * 10);
    assert_eq!(
        c.new_orders - c.rolled_back + c.payments + c.delivery_txns,
        STREAM_TXNS as u64
    );
}

#[test]
fn the_load_has_tpcc_sizes() {
    let s = ChScale::tiny();
    let mut g = ChGen::new(s, 3);
    let mut load = Vec::new();
    while let Some(t) = g.next_load_txn(777) {
        assert!(!t.is_empty() && t.len() <= 777);
        load.push(t);
    }
    assert!(load[..load.len() - 1].iter().all(|t| t.len() == 777));
    let check = SelfCheck::of(&chgen::schemas(), &load);
    println!("{check}");
    let rows = |t: usize| check.tables[t].1.inserts as i64;
    let (w, d, c) = (
        s.warehouses,
        s.districts_per_warehouse,
        s.customers_per_district,
    );
    assert_eq!(rows(table::WAREHOUSE as usize), w);
    assert_eq!(rows(table::DISTRICT as usize), w * d);
    assert_eq!(rows(table::CUSTOMER as usize), w * d * c);
    assert_eq!(rows(table::HISTORY as usize), w * d * c);
    assert_eq!(rows(table::ORDERS as usize), w * d * s.orders_per_district);
    assert_eq!(
        rows(table::NEWORDER as usize),
        w * d * s.undelivered_per_district
    );
    let orders = w * d * s.orders_per_district;
    assert!((5 * orders..=15 * orders).contains(&rows(table::ORDERLINE as usize)));
    assert_eq!(rows(table::STOCK as usize), w * s.items);
    assert_eq!(rows(table::ITEM as usize), s.items);
    assert_eq!(rows(table::SUPPLIER as usize), s.suppliers);
    assert_eq!(rows(table::NATION as usize), chgen::NATIONS);
    assert_eq!(rows(table::REGION as usize), chgen::REGIONS);
    assert_eq!(
        check.rows(),
        check.tables.iter().map(|t| t.1.inserts).sum::<u64>()
    );
    // Loading in other transaction sizes gives the same rows.
    let all: Vec<_> = load.concat();
    let other: Vec<_> = ChGen::new(s, 3).load(10_000).concat();
    assert_eq!(all, other);
}

#[test]
fn the_ddl_is_the_generator_schema() {
    let catalog = Catalog::from_ddl(chgen::DDL, "bench/ddl/ch.sql").unwrap();
    let ours = chgen::schemas();
    assert_eq!(catalog.tables().len(), ours.len());
    for (theirs, ours) in catalog.tables().iter().zip(&ours) {
        assert_eq!(theirs.name(), ours.name());
        assert_eq!(theirs.columns(), ours.columns(), "{}", ours.name());
        assert_eq!(theirs.primary_key(), ours.primary_key(), "{}", ours.name());
        let fresh = ours
            .column_index("fresh_ts")
            .expect("every table has fresh_ts");
        assert!(!ours.columns()[fresh].nullable);
    }
}

/// Every transaction of the Debezium JSON, as the node's parser and assembler read it, with
/// table ids from the DDL's catalog.
fn parse(bytes: &[u8]) -> Vec<(Txn, bool)> {
    let catalog = Catalog::from_ddl(chgen::DDL, "ch.sql").unwrap();
    let lookup = |name: &str| -> Option<Arc<TableSchema>> {
        catalog
            .resolve(name)
            .and_then(|id| catalog.get(id).cloned())
    };
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    let mut txns = Vec::new();
    let text = std::str::from_utf8(bytes).unwrap();
    for (n, line) in text.lines().enumerate() {
        let pos = SourcePosition::new("ch.json", n as u64 + 1);
        let msg = parse_line(line, &pos, &lookup).unwrap_or_else(|e| panic!("{e}\n{line}"));
        if let Some(t) = asm.push(msg).unwrap_or_else(|e| panic!("{e}")) {
            asm.mark_applied(&t.id, &t.end);
            let snapshot = t.events.iter().all(|e| e.snapshot);
            let ops = t
                .events
                .into_iter()
                .map(|e| retina_storage::TableOp {
                    table: catalog.resolve(e.table.name()).unwrap(),
                    op: e.op.into(),
                })
                .collect();
            txns.push((ops, snapshot));
        }
    }
    assert_eq!(asm.open_transaction(), None);
    assert_eq!(asm.duplicates_skipped(), 0, "transaction ids are unique");
    txns
}

#[test]
fn the_node_reads_back_exactly_what_was_generated() {
    let w = chgen::generate(ChScale::tiny(), 5, 500);
    let bytes = json(&w);
    let parsed = parse(&bytes);
    assert_eq!(parsed.len(), w.load.len() + w.stream.len());
    let (load, stream) = parsed.split_at(w.load.len());
    for ((txn, snapshot), ours) in load.iter().zip(&w.load) {
        assert!(*snapshot, "the load is written as snapshot reads");
        assert_eq!(txn, ours);
    }
    for (i, ((txn, snapshot), ours)) in stream.iter().zip(&w.stream).enumerate() {
        assert!(!*snapshot);
        assert_eq!(txn, ours, "stream transaction {i}");
    }
}

/// A plain model of the source database: rows by encoded primary key, per table.
#[test]
fn every_update_and_delete_hits_the_row_it_names() {
    let w = workload(13);
    let schemas = chgen::schemas();
    let mut tables: Vec<BTreeMap<Vec<u8>, Vec<Value>>> = vec![BTreeMap::new(); schemas.len()];
    let key = |t: usize, row: &Vec<Value>| {
        let mut k = Vec::new();
        schemas[t].check_key(row).unwrap();
        retina_storage::key::encode_key(&schemas[t], row, &mut k);
        k
    };
    let mut last_fresh = LOAD_US;
    for (n, txn) in w.load.iter().chain(&w.stream).enumerate() {
        let in_stream = n >= w.load.len();
        let mut fresh = None;
        for op in txn {
            let t = op.table as usize;
            let schema = &schemas[t];
            let fresh_col = schema.column_index("fresh_ts").unwrap();
            let rows = &mut tables[t];
            let written = match &op.op {
                RowOp::Insert(row) => {
                    schema.check_row(row).unwrap();
                    let old = rows.insert(key(t, row), row.clone());
                    assert!(
                        old.is_none(),
                        "txn {n}: insert of an existing {} row",
                        schema.name()
                    );
                    Some(row)
                }
                RowOp::Update { before, after } => {
                    schema.check_row(after).unwrap();
                    let k = key(t, before);
                    assert_eq!(k, key(t, after), "txn {n}: CH never changes a key");
                    let stored = rows.insert(k, after.clone());
                    assert_eq!(
                        stored.as_ref(),
                        Some(before),
                        "txn {n}: the before-image of a {} update is the stored row",
                        schema.name()
                    );
                    Some(after)
                }
                RowOp::Delete(row) => {
                    let stored = rows.remove(&key(t, row));
                    assert_eq!(
                        stored.as_ref(),
                        Some(row),
                        "txn {n}: delete on {}",
                        schema.name()
                    );
                    None
                }
            };
            if let Some(row) = written {
                let Value::Timestamp(ts) = row[fresh_col] else {
                    panic!("fresh_ts is a timestamp")
                };
                if in_stream {
                    assert!(
                        fresh.is_none_or(|f| f == ts),
                        "one fresh_ts per transaction"
                    );
                    fresh = Some(ts);
                } else {
                    assert_eq!(ts, LOAD_US);
                }
            }
        }
        if let Some(ts) = fresh {
            assert!(ts > last_fresh, "fresh_ts increases");
            last_fresh = ts;
        }
    }
    // Every order is either delivered or has its new-order row; the districts' next ids
    // count the orders.
    let count = |t: u32| tables[t as usize].len();
    let s = ChScale::tiny();
    let per_district: HashMap<(i64, i64), i64> = tables[table::DISTRICT as usize]
        .values()
        .map(|r| match (&r[0], &r[1], &r[10]) {
            (Value::Int(d), Value::Int(w), Value::Int(next)) => ((*w, *d), *next),
            _ => panic!("district ids"),
        })
        .collect();
    assert_eq!(
        per_district.values().map(|n| n - 1).sum::<i64>() as usize,
        count(table::ORDERS)
    );
    assert!(count(table::NEWORDER) <= count(table::ORDERS));
    assert_eq!(count(table::STOCK) as i64, s.warehouses * s.items);

    // The storage engine agrees: every transaction applies, and it holds the same rows.
    let mut shard = retina_storage::Shard::new(0, Default::default()).unwrap();
    for s in &schemas {
        shard.add_table(s.clone());
    }
    for (i, t) in w.load.iter().chain(&w.stream).enumerate() {
        let ts = retina_storage::Timestamp::new(i as u64 + 2).unwrap();
        shard
            .apply(ts, t)
            .unwrap_or_else(|e| panic!("txn {i}: {e}"));
    }
    for (t, rows) in tables.iter().enumerate() {
        assert_eq!(
            shard.live_keys(t as u32).unwrap(),
            rows.len(),
            "{}",
            schemas[t].name()
        );
    }
}
