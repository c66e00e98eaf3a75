//! The CH-benCHmark generator: deterministic bytes, the stream's shape against bench/README.md, the DDL
//! against the node's catalog, the Debezium JSON against the node's parser, and every update and
//! delete against a plain model of the tables.

mod common;

use std::collections::HashMap;

use retina_bench::chgen::{self, ChGen, ChScale, ChWorkload, FreshClock, SelfCheck, table};
use retina_storage::Value;

use common::Model;

const STREAM_TXNS: usize = 3000;

fn workload(seed: u64) -> ChWorkload {
    chgen::generate(ChScale::tiny(), seed, STREAM_TXNS)
}

#[test]
fn the_same_seed_gives_the_same_bytes() {
    let mut g = ChGen::new(ChScale::tiny(), 7);
    g.load(1000);
    let wall = g.stream(STREAM_TXNS, &mut FreshClock::Wall);
    common::assert_deterministic(workload, &wall);
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
    let load = common::load_in_txns_of(777, |n| g.next_load_txn(n));
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
    common::assert_ddl_is(chgen::DDL, "bench/ddl/ch.sql", &chgen::schemas());
}

#[test]
fn the_node_reads_back_exactly_what_was_generated() {
    common::assert_reads_back(chgen::DDL, "ch", &chgen::generate(ChScale::tiny(), 5, 500));
}

/// Every transaction applies to a plain model of the source database.
#[test]
fn every_update_and_delete_hits_the_row_it_names() {
    let w = workload(13);
    let mut model = Model::new(chgen::schemas());
    for (n, txn) in w.load.iter().chain(&w.stream).enumerate() {
        model.apply(n, txn, n >= w.load.len());
    }
    // Every order is either delivered or has its new-order row; the districts' next ids
    // count the orders.
    let s = ChScale::tiny();
    let per_district: HashMap<(i64, i64), i64> = model.tables[table::DISTRICT as usize]
        .values()
        .map(|r| match (&r[0], &r[1], &r[10]) {
            (Value::Int(d), Value::Int(w), Value::Int(next)) => ((*w, *d), *next),
            _ => panic!("district ids"),
        })
        .collect();
    assert_eq!(
        per_district.values().map(|n| n - 1).sum::<i64>() as usize,
        model.count(table::ORDERS)
    );
    assert!(model.count(table::NEWORDER) <= model.count(table::ORDERS));
    assert_eq!(model.count(table::STOCK) as i64, s.warehouses * s.items);

    model.assert_storage_agrees(w.load.iter().chain(&w.stream));
}
