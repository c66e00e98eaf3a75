//! The HyBench generator: deterministic bytes, the stream's shape against BENCH.md, the DDL
//! against the node's catalog, the Debezium JSON against the node's parser, and every update
//! against a plain model of the tables (exact before-images, money conserved).

use std::collections::BTreeMap;
use std::sync::Arc;

use retina_bench::hybench::{
    self, FreshClock, HyGen, HyScale, HyWorkload, LOAD_US, SelfCheck, Txn, TxnKind, table,
};
use retina_node::catalog::Catalog;
use retina_node::debezium::{SourcePosition, TxnAssembler, TxnMode, parse_line};
use retina_storage::{RowOp, TableSchema, Value};

const STREAM_TXNS: usize = 3000;

fn workload(seed: u64) -> HyWorkload {
    hybench::generate(HyScale::tiny(), seed, STREAM_TXNS)
}

fn json(w: &HyWorkload) -> Vec<u8> {
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
    let mut g = HyGen::new(HyScale::tiny(), 7);
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
    let schemas = hybench::schemas();
    let check = SelfCheck::of(&schemas, &w.stream);
    println!("{check}");
    let c = w.counts;
    for k in TxnKind::ALL {
        println!(
            "{:>6} drawn {:>5} emitted {:>5}",
            k.name(),
            c.drawn[k.index()],
            c.emitted[k.index()]
        );
    }
    assert_eq!(check.transactions, STREAM_TXNS as u64);
    assert_eq!(c.emitted_total(), STREAM_TXNS as u64);
    // ~10 rows per transaction with the default salary size (the paper's 10.23).
    let rows_per_txn = check.rows_per_txn();
    assert!((8.0..13.0).contains(&rows_per_txn), "{rows_per_txn}");
    // No deletes; updates mostly on the two account tables; transfers and cheques only
    // inserted; the loan tables updated only by the loan transactions, as in HyBench.
    assert_eq!(check.delete_share(), 0.0);
    let updates = |name: &str| {
        check
            .tables
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, t)| t.updates)
    };
    let all_updates: u64 = check.tables.iter().map(|(_, t)| t.updates).sum();
    let account_updates = updates("savingAccount") + updates("checkingAccount");
    assert!(account_updates as f64 > 0.9 * all_updates as f64, "{check}");
    for (name, t) in &check.tables {
        if ["transfer", "checking"].contains(&name.as_str()) {
            assert_eq!(t.updates, 0, "{name}");
            assert!(t.inserts > 0, "{name}");
        }
        if ["customer", "company"].contains(&name.as_str()) {
            assert_eq!(t.inserts, 0, "{name}");
        }
    }
    assert!(check.table_share("savingAccount") > 0.4, "{check}");
    assert!(check.table_share("transfer") > 0.2, "{check}");
    // The mix: HyBench's weights over the draws.
    let total: u32 = hybench::WEIGHTS.iter().sum();
    let drawn = c.drawn_total() as f64;
    for k in TxnKind::ALL {
        let want = f64::from(hybench::WEIGHTS[k.index()]) / f64::from(total);
        let got = c.drawn[k.index()] as f64 / drawn;
        assert!((got - want).abs() < 0.03, "{}: {got} vs {want}", k.name());
        assert!(c.emitted[k.index()] <= c.drawn[k.index()]);
    }
    // Transfers, salaries, loan applications and own-account moves rarely fail.
    for k in [TxnKind::Transfer, TxnKind::Salary, TxnKind::LoanApply] {
        assert_eq!(c.emitted[k.index()], c.drawn[k.index()], "{}", k.name());
    }
    // Paying every employee, as HyBench does, makes salaries dominate.
    let all = HyScale {
        salary_employees: None,
        ..HyScale::tiny()
    };
    let w = hybench::generate(all, 11, 500);
    let check = SelfCheck::of(&schemas, &w.stream);
    assert!(check.rows_per_txn() > 20.0, "{check}");
}

#[test]
fn the_load_has_hybench_sizes() {
    let s = HyScale::tiny();
    let mut g = HyGen::new(s, 3);
    let mut load = Vec::new();
    while let Some(t) = g.next_load_txn(777) {
        assert!(!t.is_empty() && t.len() <= 777);
        load.push(t);
    }
    assert!(load[..load.len() - 1].iter().all(|t| t.len() == 777));
    let check = SelfCheck::of(&hybench::schemas(), &load);
    println!("{check}");
    let rows = |t: u32| check.tables[t as usize].1.inserts as i64;
    assert_eq!(rows(table::CUSTOMER), s.customers);
    assert_eq!(rows(table::COMPANY), s.companies);
    assert_eq!(rows(table::SAVING_ACCOUNT), s.accounts());
    assert_eq!(rows(table::CHECKING_ACCOUNT), s.accounts());
    assert_eq!(rows(table::TRANSFER), s.transfers);
    assert_eq!(rows(table::CHECKING), s.checkings);
    assert_eq!(rows(table::LOANAPPS), s.loans);
    assert_eq!(rows(table::LOANTRANS), s.loans);
    assert_eq!(check.update_share() + check.delete_share(), 0.0);
    // Loading in other transaction sizes gives the same rows.
    let all: Vec<_> = load.concat();
    let other: Vec<_> = HyGen::new(s, 3).load(10_000).concat();
    assert_eq!(all, other);
    // SF1 is HyBench's published population.
    let sf1 = HyScale::sf(1);
    assert_eq!(
        (sf1.customers, sf1.companies, sf1.accounts(), sf1.transfers),
        (300_000, 2_000, 302_000, 6_000_000)
    );
    assert_eq!((sf1.checkings, sf1.loans), (600_000, 600_000));
}

#[test]
fn the_ddl_is_the_generator_schema() {
    let catalog = Catalog::from_ddl(hybench::DDL, "bench/ddl/hybench.sql").unwrap();
    let ours = hybench::schemas();
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
    assert_eq!(
        catalog.resolve("public.savingAccount"),
        Some(table::SAVING_ACCOUNT)
    );
}

/// Every transaction of the Debezium JSON, as the node's parser and assembler read it, with
/// table ids from the DDL's catalog.
fn parse(bytes: &[u8]) -> Vec<(Txn, bool)> {
    let catalog = Catalog::from_ddl(hybench::DDL, "hybench.sql").unwrap();
    let lookup = |name: &str| -> Option<Arc<TableSchema>> {
        catalog
            .resolve(name)
            .and_then(|id| catalog.get(id).cloned())
    };
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    let mut txns = Vec::new();
    let text = std::str::from_utf8(bytes).unwrap();
    for (n, line) in text.lines().enumerate() {
        let pos = SourcePosition::new("hybench.json", n as u64 + 1);
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
    let w = hybench::generate(HyScale::tiny(), 5, 500);
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

fn money(row: &[Value], col: usize) -> i128 {
    match row[col] {
        Value::Decimal(d) => d,
        ref other => panic!("money is a decimal, not {other:?}"),
    }
}

/// A plain model of the source database: rows by encoded primary key, per table.
#[test]
fn every_update_hits_the_row_it_names_and_money_is_conserved() {
    let w = workload(13);
    let schemas = hybench::schemas();
    let mut tables: Vec<BTreeMap<Vec<u8>, Vec<Value>>> = vec![BTreeMap::new(); schemas.len()];
    let key = |t: usize, row: &Vec<Value>| {
        let mut k = Vec::new();
        schemas[t].check_key(row).unwrap();
        retina_storage::key::encode_key(&schemas[t], row, &mut k);
        k
    };
    let balance = schemas[table::SAVING_ACCOUNT as usize]
        .column_index("balance")
        .unwrap();
    let lt = &schemas[table::LOANTRANS as usize];
    let (lt_status, lt_amount) = (
        lt.column_index("status").unwrap(),
        lt.column_index("amount").unwrap(),
    );
    let mut last_fresh = LOAD_US;
    let (mut lent, mut repaid) = (0u64, 0u64);
    for (n, txn) in w.load.iter().chain(&w.stream).enumerate() {
        let in_stream = n >= w.load.len();
        let mut fresh = None;
        // Money on the account tables moves; it appears only when a loan is lent and leaves
        // only when one is repaid.
        let mut delta = 0i128;
        let mut expected = 0i128;
        for op in txn {
            let t = op.table as usize;
            let schema = &schemas[t];
            let fresh_col = schema.column_index("fresh_ts").unwrap();
            let rows = &mut tables[t];
            let account = op.table == table::SAVING_ACCOUNT || op.table == table::CHECKING_ACCOUNT;
            let written = match &op.op {
                RowOp::Insert(row) => {
                    schema.check_row(row).unwrap();
                    let old = rows.insert(key(t, row), row.clone());
                    assert!(
                        old.is_none(),
                        "txn {n}: insert of an existing {} row",
                        schema.name()
                    );
                    row
                }
                RowOp::Update { before, after } => {
                    assert!(in_stream, "the load only inserts");
                    schema.check_row(after).unwrap();
                    let k = key(t, before);
                    assert_eq!(k, key(t, after), "txn {n}: HyBench never changes a key");
                    let stored = rows.insert(k, after.clone());
                    assert_eq!(
                        stored.as_ref(),
                        Some(before),
                        "txn {n}: the before-image of a {} update is the stored row",
                        schema.name()
                    );
                    if account {
                        delta += money(after, balance) - money(before, balance);
                    }
                    if op.table == table::LOANTRANS && before[lt_status] != after[lt_status] {
                        match &after[lt_status] {
                            Value::Utf8(s) if s == "lent" => {
                                lent += 1;
                                expected += money(after, lt_amount);
                            }
                            Value::Utf8(s) if s == "repaid" => {
                                repaid += 1;
                                expected -= money(after, lt_amount);
                            }
                            other => panic!("txn {n}: loantrans becomes {other:?}"),
                        }
                    }
                    assert!(
                        [
                            table::SAVING_ACCOUNT,
                            table::CHECKING_ACCOUNT,
                            table::CUSTOMER,
                            table::COMPANY,
                            table::LOANAPPS,
                            table::LOANTRANS
                        ]
                        .contains(&op.table),
                        "txn {n}: update of {}",
                        schema.name()
                    );
                    after
                }
                RowOp::Delete(_) => panic!("txn {n}: HyBench deletes nothing"),
            };
            let Value::Timestamp(ts) = written[fresh_col] else {
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
        assert_eq!(delta, expected, "txn {n}: money appeared or vanished");
        if let Some(ts) = fresh {
            assert!(ts > last_fresh, "fresh_ts increases");
            last_fresh = ts;
        }
    }
    println!("{lent} loans lent, {repaid} repaid");
    assert!(lent > 0, "the stream lends loans");
    let s = HyScale::tiny();
    let count = |t: u32| tables[t as usize].len() as i64;
    assert_eq!(count(table::SAVING_ACCOUNT), s.accounts());
    assert_eq!(count(table::CHECKING_ACCOUNT), s.accounts());
    assert_eq!(count(table::CUSTOMER), s.customers);

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
