//! The HyBench generator: deterministic bytes, the stream's shape against bench/README.md, the DDL
//! against the node's catalog, the Debezium JSON against the node's parser, and every update
//! against a plain model of the tables (exact before-images, money conserved).

mod common;

use retina_bench::hybench::{
    self, FreshClock, HyGen, HyScale, HyWorkload, SelfCheck, TxnKind, table,
};
use retina_storage::{RowOp, Value};

use common::Model;

const STREAM_TXNS: usize = 3000;

fn workload(seed: u64) -> HyWorkload {
    hybench::generate(HyScale::tiny(), seed, STREAM_TXNS)
}

#[test]
fn the_same_seed_gives_the_same_bytes() {
    let mut g = HyGen::new(HyScale::tiny(), 7);
    g.load(1000);
    let wall = g.stream(STREAM_TXNS, &mut FreshClock::Wall);
    common::assert_deterministic(workload, &wall);
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
    let load = common::load_in_txns_of(777, |n| g.next_load_txn(n));
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
    let catalog = common::assert_ddl_is(hybench::DDL, "bench/ddl/hybench.sql", &hybench::schemas());
    assert_eq!(
        catalog.resolve("public.savingAccount"),
        Some(table::SAVING_ACCOUNT)
    );
}

#[test]
fn the_node_reads_back_exactly_what_was_generated() {
    let w = hybench::generate(HyScale::tiny(), 5, 500);
    common::assert_reads_back(hybench::DDL, "hybench", &w);
}

fn money(row: &[Value], col: usize) -> i128 {
    match row[col] {
        Value::Decimal(d) => d,
        ref other => panic!("money is a decimal, not {other:?}"),
    }
}

/// Every transaction applies to a plain model of the source database; only the stream
/// updates, only the tables HyBench updates, and money on the accounts moves, appearing only
/// when a loan is lent and leaving only when one is repaid.
#[test]
fn every_update_hits_the_row_it_names_and_money_is_conserved() {
    let w = workload(13);
    let schemas = hybench::schemas();
    let mut model = Model::new(schemas.clone());
    let balance = schemas[table::SAVING_ACCOUNT as usize]
        .column_index("balance")
        .unwrap();
    let lt = &schemas[table::LOANTRANS as usize];
    let (lt_status, lt_amount) = (
        lt.column_index("status").unwrap(),
        lt.column_index("amount").unwrap(),
    );
    let (mut lent, mut repaid) = (0u64, 0u64);
    for (n, txn) in w.load.iter().chain(&w.stream).enumerate() {
        let in_stream = n >= w.load.len();
        model.apply(n, txn, in_stream);
        let mut delta = 0i128;
        let mut expected = 0i128;
        for op in txn {
            let account = op.table == table::SAVING_ACCOUNT || op.table == table::CHECKING_ACCOUNT;
            match &op.op {
                RowOp::Insert(_) | RowOp::Upsert(_) => {}
                RowOp::Update { before, after } => {
                    assert!(in_stream, "the load only inserts");
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
                        schemas[op.table as usize].name()
                    );
                }
                RowOp::Delete(_) | RowOp::Truncate => panic!("txn {n}: HyBench deletes nothing"),
            }
        }
        assert_eq!(delta, expected, "txn {n}: money appeared or vanished");
    }
    println!("{lent} loans lent, {repaid} repaid");
    assert!(lent > 0, "the stream lends loans");
    let s = HyScale::tiny();
    let count = |t: u32| model.count(t) as i64;
    assert_eq!(count(table::SAVING_ACCOUNT), s.accounts());
    assert_eq!(count(table::CHECKING_ACCOUNT), s.accounts());
    assert_eq!(count(table::CUSTOMER), s.customers);

    model.assert_storage_agrees(w.load.iter().chain(&w.stream));
}
