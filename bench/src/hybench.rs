//! The HyBench workload (Zhang, Li and Lv, "HyBench: A New Benchmark for HTAP Databases",
//! VLDB 2024): its eight banking tables (DDL in `bench/ddl/hybench.sql`), the initial load as
//! HyBench's data generator populates them, and the stream of its ten write transactions
//! TP-9..TP-18, all deterministic from a seed. The self-check and the Debezium JSON writer are
//! [`crate::workload`]'s.
//!
//! The generator keeps a model of every row the stream may update, so each update carries the
//! row's exact before-image, and money is conserved: transfers, salaries, cheques and
//! saving/checking moves only move it between accounts; lending a loan adds it and repaying
//! one removes it. Rows hold one value per column in DDL order; table ids are the DDL's order
//! ([`table`]).
//!
//! Reconstructed from HyBench's reference implementation (Rucchao/HyBench-2023:
//! `TPClient.execTxn9..18`, `conf/stmt_postgres.toml`, `parameters.toml`,
//! `DataGenerator_RiskControlling`):
//! - SF1 sizes ([`HyScale::sf`]): 300K customers, 2K companies, one saving and one checking
//!   account each (302K), 6M transfers, 600K cheques (`checking`), 600K loan applications and
//!   600K loan transactions (one per application). Account ids are user ids: customers
//!   `1..=customers`, companies after them. Initial balances: saving 2,000 / 10,000,
//!   checking 5,000 / 100,000 (customer / company); loan credit (`loan_balance`) 10,000 /
//!   1,000,000. 80% of loaded transfers come from customers, 20% of cheques and loans.
//! - Weights, HyBench's defaults for its write transactions (out of 100 with the read-only
//!   TP-1..TP-8, which emit nothing): TP-9 transfer 7, TP-10 salary 7, TP-11 cheque 7,
//!   TP-12 loan application 7, TP-13 loan review 6, TP-14 lending 4, TP-15 delinquency check 4,
//!   TP-16 repayment 4, TP-17 saving-to-checking 12, TP-18 checking-to-saving 12 ([`WEIGHTS`]).
//! - Rows: TP-9 and TP-11 update two accounts and insert a transfer / cheque; TP-10 updates the
//!   company's saving account, the employee's and inserts a transfer per employee paid;
//!   TP-12 takes the amount off the applicant's `loan_balance` (customer or company) and
//!   inserts an `under_review` application (HyBench inserts it even when the credit is short,
//!   after rolling the balance update back: then only the insert is emitted); TP-13 takes a
//!   random application under review and accepts (half: inserts a loan transaction) or
//!   rejects it (half: gives the amount back to `loan_balance`), and updates its status;
//!   TP-14 lends an accepted loan (the applicant's saving account, the loan's status `lent`);
//!   TP-15 marks the oldest lent loan delinquent if it is overdue; TP-16 repays a random lent
//!   loan (saving account, status `repaid`); TP-17 / TP-18 move money between an account's
//!   saving and checking rows. So HyBench does update more than the account tables: the
//!   loan transactions update `customer`/`company` (`loan_balance`), `loanapps` (status) and
//!   `loantrans` (status, delinquency), a few percent of the rows; transfers and cheques are
//!   insert-only. This generator does the same.
//! - Rolled-back transactions (a short balance in TP-9, TP-11, TP-16, TP-17, TP-18; a blocked
//!   account in TP-17/TP-18) and ones that find nothing to do (TP-13..TP-16 with no loan in the
//!   state they look for, TP-15 with no overdue loan) emit nothing, and the next draw is taken.
//! - Assumptions where HyBench is loose: amounts are drawn in whole cents; TP-18 checks the
//!   balance of the checking row it debits (HyBench's SQL reads the saving row's); the stream
//!   writes `now` (the `fresh_ts`) as every business timestamp it sets and judges TP-15's
//!   overdue against it (HyBench uses dates drawn around its 2023-12-31 end date); TP-13's
//!   contract is signed `now`; picking "a random" row (HyBench's `ORDER BY RANDOM()`) takes the
//!   first one at or after a uniformly drawn id.
//! - The salary transaction pays every employee in HyBench (150 on average at SF1, so a stream
//!   of ~47 rows per transaction); [`HyScale::salary_employees`] caps it, and its default
//!   ([`DEFAULT_SALARY_EMPLOYEES`]) makes the stream average about 10 rows per transaction,
//!   the 10.23 the Retina paper reports for HyBench.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::Write;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_storage::{ColumnDef, ColumnType, TableId, TableOp, TableSchema, Value};

pub use crate::workload::{
    DebeziumWriter, FreshClock, InsertOp, LOAD_US, SelfCheck, TableCounts, Txn,
};
use crate::workload::{QueuedLoad, decimal, insert, int, update, write_load_and_stream};

/// The eight tables, as `Catalog::from_ddl` reads them; [`schemas`] builds the same.
pub const DDL: &str = include_str!("../ddl/hybench.sql");

/// Table ids: positions in [`DDL`] and [`schemas`].
pub mod table {
    use retina_storage::TableId;

    pub const CUSTOMER: TableId = 0;
    pub const COMPANY: TableId = 1;
    pub const SAVING_ACCOUNT: TableId = 2;
    pub const CHECKING_ACCOUNT: TableId = 3;
    pub const TRANSFER: TableId = 4;
    pub const CHECKING: TableId = 5;
    pub const LOANAPPS: TableId = 6;
    pub const LOANTRANS: TableId = 7;
    pub const COUNT: usize = 8;
}

/// HyBench's weights of its write transactions TP-9..TP-18, in that order.
pub const WEIGHTS: [u32; 10] = [7, 7, 7, 7, 6, 4, 4, 4, 12, 12];

/// Employees one salary transaction pays by default: with it the stream averages about 10
/// rows per transaction (the Retina paper's 10.23 for HyBench).
pub const DEFAULT_SALARY_EMPLOYEES: i64 = 26;

/// Rows per initial-load transaction by default.
pub const LOAD_ROWS_PER_TXN: usize = 1000;

/// Column positions the stream updates, by table (checked against [`schemas`] in a test).
mod col {
    pub const C_LOAN_BALANCE: usize = 8;
    pub const C_ISBLOCKED: usize = 12;
    pub const C_FRESH: usize = 15;
    pub const CO_LOAN_BALANCE: usize = 4;
    pub const CO_ISBLOCKED: usize = 11;
    pub const CO_FRESH: usize = 14;
    /// savingAccount and checkingAccount alike.
    pub const A_BALANCE: usize = 2;
    pub const A_ISBLOCKED: usize = 3;
    pub const A_FRESH: usize = 5;
    pub const LA_ID: usize = 0;
    pub const LA_APPLICANT: usize = 1;
    pub const LA_AMOUNT: usize = 2;
    pub const LA_DURATION: usize = 3;
    pub const LA_STATUS: usize = 4;
    pub const LA_TIMESTAMP: usize = 5;
    pub const LA_FRESH: usize = 6;
    pub const LT_ID: usize = 0;
    pub const LT_APPLICANT: usize = 1;
    pub const LT_AMOUNT: usize = 3;
    pub const LT_STATUS: usize = 4;
    pub const LT_TIMESTAMP: usize = 5;
    pub const LT_DURATION: usize = 6;
    pub const LT_CONTRACT: usize = 7;
    pub const LT_DELINQUENCY: usize = 8;
    pub const LT_FRESH: usize = 9;
}

/// The schemas of [`DDL`], in table-id order.
pub fn schemas() -> Vec<Arc<TableSchema>> {
    use ColumnType::*;
    let money = Decimal {
        precision: 15,
        scale: 2,
    };
    let t = |name: &str, cols: &[(&str, ColumnType)], nullable: &[&str], pk: &str| {
        let columns = cols
            .iter()
            .map(|&(n, ty)| ColumnDef::new(n, ty, nullable.contains(&n)))
            .chain([ColumnDef::new("fresh_ts", Timestamp, false)])
            .collect();
        TableSchema::new(name, columns, &[pk]).expect("the HyBench schemas are valid")
    };
    let account = |name: &str| {
        t(
            name,
            &[
                ("accountID", Int32),
                ("userID", Int32),
                ("balance", money),
                ("Isblocked", Int32),
                ("timestamp", Timestamp),
            ],
            &[],
            "accountID",
        )
    };
    let movement = |name: &str, id| {
        t(
            name,
            &[
                ("id", id),
                ("sourceID", Int32),
                ("targetID", Int32),
                ("amount", money),
                ("type", Utf8),
                ("timestamp", Timestamp),
            ],
            &[],
            "id",
        )
    };
    vec![
        t(
            "customer",
            &[
                ("custID", Int32),
                ("companyID", Int32),
                ("gender", Utf8),
                ("name", Utf8),
                ("age", Int32),
                ("phone", Utf8),
                ("province", Utf8),
                ("city", Utf8),
                ("loan_balance", money),
                ("saving_credit", Int32),
                ("checking_credit", Int32),
                ("loan_credit", Int32),
                ("Isblocked", Int32),
                ("created_date", Date),
                ("last_update_timestamp", Timestamp),
            ],
            &[],
            "custID",
        ),
        t(
            "company",
            &[
                ("companyID", Int32),
                ("name", Utf8),
                ("category", Utf8),
                ("staff_size", Int32),
                ("loan_balance", money),
                ("phone", Utf8),
                ("province", Utf8),
                ("city", Utf8),
                ("saving_credit", Int32),
                ("checking_credit", Int32),
                ("loan_credit", Int32),
                ("Isblocked", Int32),
                ("created_date", Date),
                ("last_update_timestamp", Timestamp),
            ],
            &[],
            "companyID",
        ),
        account("savingAccount"),
        account("checkingAccount"),
        movement("transfer", Int64),
        movement("checking", Int32),
        t(
            "loanapps",
            &[
                ("id", Int32),
                ("applicantID", Int32),
                ("amount", money),
                ("duration", Int32),
                ("status", Utf8),
                ("timestamp", Timestamp),
            ],
            &[],
            "id",
        ),
        t(
            "loantrans",
            &[
                ("id", Int32),
                ("applicantID", Int32),
                ("appID", Int32),
                ("amount", money),
                ("status", Utf8),
                ("timestamp", Timestamp),
                ("duration", Int32),
                ("contract_timestamp", Timestamp),
                ("delinquency", Int32),
            ],
            &["contract_timestamp"],
            "id",
        ),
    ]
}

/// How big the database is, and how many employees a salary transaction pays.
/// [`HyScale::sf`] is HyBench's population; [`HyScale::tiny`] keeps every table small enough
/// for a unit test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HyScale {
    pub customers: i64,
    pub companies: i64,
    pub transfers: i64,
    /// Rows of `checking` (cheques).
    pub checkings: i64,
    /// Loan applications, and loan transactions (HyBench loads one per application).
    pub loans: i64,
    /// The most employees one salary transaction (TP-10) pays; `None` pays every employee of
    /// the company, as HyBench does.
    pub salary_employees: Option<i64>,
}

impl HyScale {
    /// HyBench's sizes at scale factor `sf`: 300K customers, 2K companies, 6M transfers,
    /// 600K cheques, 600K loan applications and transactions per scale factor; salaries
    /// capped at [`DEFAULT_SALARY_EMPLOYEES`].
    pub fn sf(sf: i64) -> Self {
        HyScale {
            customers: 300_000 * sf,
            companies: 2_000 * sf,
            transfers: 6_000_000 * sf,
            checkings: 600_000 * sf,
            loans: 600_000 * sf,
            salary_employees: Some(DEFAULT_SALARY_EMPLOYEES),
        }
    }

    /// 1,500 customers in 10 companies (150 employees each, as at SF1), 3,000 transfers,
    /// 300 cheques, 300 loans.
    pub fn tiny() -> Self {
        HyScale {
            customers: 1500,
            companies: 10,
            transfers: 3000,
            checkings: 300,
            loans: 300,
            salary_employees: Some(DEFAULT_SALARY_EMPLOYEES),
        }
    }

    /// Customers and companies: the number of saving (and of checking) accounts.
    pub fn accounts(&self) -> i64 {
        self.customers + self.companies
    }

    fn check(&self) {
        assert!(self.customers >= 2, "at least two customers");
        assert!(self.companies >= 1, "at least one company");
        assert!(
            self.transfers >= 0 && self.checkings >= 0 && self.loans >= 0,
            "table sizes are not negative"
        );
        assert!(
            self.accounts() < i64::from(i32::MAX),
            "account ids are INT: customers + companies must stay below 2^31"
        );
        assert!(
            self.salary_employees.is_none_or(|e| e >= 1),
            "a salary pays at least one employee"
        );
    }
}

/// Which transaction a draw of the mix is: HyBench's TP-9..TP-18.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnKind {
    /// TP-9: a transfer between two saving accounts.
    Transfer,
    /// TP-10: a company pays its employees.
    Salary,
    /// TP-11: a cheque between two checking accounts.
    Cheque,
    /// TP-12: a loan application.
    LoanApply,
    /// TP-13: a loan application accepted or rejected.
    LoanReview,
    /// TP-14: an accepted loan paid out.
    Lend,
    /// TP-15: the oldest lent loan marked delinquent if overdue.
    Delinquency,
    /// TP-16: a lent loan repaid.
    Repay,
    /// TP-17: saving to checking, one account holder.
    SavingToChecking,
    /// TP-18: checking to saving, one account holder.
    CheckingToSaving,
}

impl TxnKind {
    /// In [`WEIGHTS`] order.
    pub const ALL: [TxnKind; 10] = [
        TxnKind::Transfer,
        TxnKind::Salary,
        TxnKind::Cheque,
        TxnKind::LoanApply,
        TxnKind::LoanReview,
        TxnKind::Lend,
        TxnKind::Delinquency,
        TxnKind::Repay,
        TxnKind::SavingToChecking,
        TxnKind::CheckingToSaving,
    ];

    /// HyBench's name: `TP-9` .. `TP-18`.
    pub fn name(self) -> String {
        format!("TP-{}", self.index() + 9)
    }

    pub fn index(self) -> usize {
        TxnKind::ALL
            .iter()
            .position(|&k| k == self)
            .expect("listed")
    }
}

/// What the stream has done so far, by transaction kind (indexed by [`TxnKind::index`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxnCounts {
    pub drawn: [u64; 10],
    /// Drawn and emitted; the rest rolled back or found nothing to do.
    pub emitted: [u64; 10],
}

impl TxnCounts {
    pub fn drawn_total(&self) -> u64 {
        self.drawn.iter().sum()
    }

    pub fn emitted_total(&self) -> u64 {
        self.emitted.iter().sum()
    }
}

/// Loan rows in the states the loan transactions look for, by id.
#[derive(Default)]
struct Loans {
    /// `loanapps` rows with status `under_review` (TP-13 picks from them).
    under_review: BTreeMap<i64, Vec<Value>>,
    /// `loantrans` rows with status `accept` (TP-14).
    accepted: BTreeMap<i64, Vec<Value>>,
    /// `loantrans` rows with status `lent` (TP-15, TP-16), and the same by timestamp.
    lent: BTreeMap<i64, Vec<Value>>,
    lent_by_ts: BTreeSet<(i64, i64)>,
}

/// The rows the stream updates, as the source database holds them now.
struct Model {
    /// By `custID - 1`.
    customers: Vec<Vec<Value>>,
    /// By `companyID - customers - 1`.
    companies: Vec<Vec<Value>>,
    /// By `accountID - 1`.
    saving: Vec<Vec<Value>>,
    checking: Vec<Vec<Value>>,
    /// Each company's employees (customer ids), by company index.
    employees: Vec<Vec<i64>>,
    loans: Loans,
    next_transfer_id: i64,
    next_checking_id: i64,
    next_loanapp_id: i64,
    next_loantrans_id: i64,
}

impl Model {
    /// The saving (or checking) account rows and their table.
    fn accounts(&mut self, saving: bool) -> (&mut Vec<Vec<Value>>, TableId) {
        if saving {
            (&mut self.saving, table::SAVING_ACCOUNT)
        } else {
            (&mut self.checking, table::CHECKING_ACCOUNT)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoadStage {
    Customers(i64),
    Companies(i64),
    Saving(i64),
    Checking(i64),
    Transfers(i64),
    Cheques(i64),
    Loans(i64),
    Done,
}

/// Rows one step of the load generates at most.
const LOAD_UNIT_ROWS: i64 = 1000;

/// The HyBench generator: first the initial load ([`HyGen::next_load_txn`]), then the change
/// stream ([`HyGen::next_txn`]). The same scale and seed give the same rows.
pub struct HyGen {
    scale: HyScale,
    load_rng: SmallRng,
    rng: SmallRng,
    stage: LoadStage,
    queue: VecDeque<TableOp<Vec<Value>>>,
    model: Model,
    counts: TxnCounts,
}

// HyBench's calendar (parameters.toml), in days since 1970-01-01.
const START_DAY: i32 = 16_071; // 2014-01-01
const MID_DAY: i32 = 17_897; // 2019-01-01
const LOAN_DAY: i32 = 19_631; // 2023-10-01
const END_DAY: i32 = 19_722; // 2023-12-31
const DAY_US: i64 = 86_400_000_000;

const CUST_TRANSFER_TYPES: [&str; 4] = ["transfer", "red_packet", "donate", "invest"];
const COMPANY_TRANSFER_TYPES: [&str; 4] = ["business", "salary", "service", "invest"];
const CUST_CHECK_TYPES: [&str; 2] = ["check", "others"];
const COMPANY_CHECK_TYPES: [&str; 3] = ["business", "service", "invest"];
const LOAN_STATUSES: [&str; 3] = ["under_review", "reject", "accept"];
const LOAN_DURATIONS: [i64; 5] = [30, 60, 90, 180, 365];
const PROVINCES: [&str; 34] = [
    "Guangdong",
    "Jiangsu",
    "Shandong",
    "Zhejiang",
    "Henan",
    "Sichuan",
    "Hubei",
    "Fujian",
    "Hunan",
    "Shanghai",
    "Anhui",
    "Hebei",
    "Beijing",
    "Shaanxi",
    "Jiangxi",
    "Chongqing",
    "Liaoning",
    "Yunnan",
    "Guangxi",
    "Hong_Kong",
    "Shanxi",
    "Inner_Mongolia",
    "Guizhou",
    "Xinjiang",
    "Tianjin",
    "Heilongjiang",
    "Jilin",
    "Gansu",
    "Hainan",
    "Ningxia",
    "Qinghai",
    "Tibet",
    "Macau",
    "Taiwan",
];
const CATEGORIES: [&str; 12] = [
    "agriculture",
    "mining",
    "manufacturing",
    "construction",
    "wholesale",
    "retail",
    "transportation",
    "software_IT",
    "finance",
    "real_estate",
    "education",
    "health",
];
const LAST_NAMES: [&str; 10] = [
    "Wang", "Li", "Zhang", "Liu", "Chen", "Yang", "Huang", "Zhao", "Wu", "Zhou",
];
const FIRST_NAMES: [&str; 10] = [
    "Wei", "Fang", "Min", "Jing", "Lei", "Yan", "Jun", "Li", "Hua", "Qiang",
];
const PHONE_PREFIXES: [&str; 8] = ["134", "135", "138", "150", "158", "182", "187", "199"];

// HyBench's money parameters (parameters.toml, SF1), in cents.
const CUST_SAVING: i128 = 200_000;
const COMPANY_SAVING: i128 = 1_000_000;
const CUST_CHECKING: i128 = 500_000;
const COMPANY_CHECKING: i128 = 10_000_000;
const CUST_LOAN: i128 = 1_000_000;
const COMPANY_LOAN: i128 = 100_000_000;

fn pick<'a>(rng: &mut SmallRng, from: &[&'a str]) -> &'a str {
    from[rng.random_range(0..from.len())]
}

/// HyBench's `getRandomDouble(max)` in whole cents: 1..=max.
fn cents(rng: &mut SmallRng, max: i128) -> i128 {
    rng.random_range(1..=max.max(1))
}

fn phone(rng: &mut SmallRng) -> String {
    let mut s = pick(rng, &PHONE_PREFIXES).to_owned();
    (0..8).for_each(|_| s.push(char::from(b'0' + rng.random_range(0..10u8))));
    s
}

fn day_us(day: i32) -> i64 {
    i64::from(day) * DAY_US
}

/// A timestamp drawn in `[from, to)` days, to the second.
fn timestamp_between(rng: &mut SmallRng, from: i32, to: i32) -> i64 {
    let secs = rng.random_range(0..(i64::from(to - from) * 86_400));
    day_us(from) + secs * 1_000_000
}

fn utf8(s: &str) -> Value {
    Value::Utf8(s.to_owned())
}

fn timestamp(v: &Value) -> i64 {
    match v {
        Value::Timestamp(t) => *t,
        other => panic!("the model holds a timestamp here, not {other:?}"),
    }
}

/// An account id in `1..=accounts` other than `id`.
fn other_account(rng: &mut SmallRng, accounts: i64, id: i64) -> i64 {
    loop {
        let other = rng.random_range(1..=accounts);
        if other != id {
            return other;
        }
    }
}

/// A `transfer` or `checking` row.
fn movement(
    id: i64,
    source: i64,
    target: i64,
    amount: i128,
    kind: &str,
    ts: i64,
    fresh: i64,
) -> Vec<Value> {
    vec![
        Value::Int(id),
        Value::Int(source),
        Value::Int(target),
        Value::Decimal(amount),
        utf8(kind),
        Value::Timestamp(ts),
        Value::Timestamp(fresh),
    ]
}

/// The first entry at or after a uniformly drawn key (HyBench's `ORDER BY RANDOM() LIMIT 1`).
fn random_entry(rng: &mut SmallRng, map: &BTreeMap<i64, Vec<Value>>) -> Option<i64> {
    let (&first, _) = map.first_key_value()?;
    let (&last, _) = map.last_key_value()?;
    let at = rng.random_range(first..=last);
    map.range(at..).next().map(|(&k, _)| k)
}

impl QueuedLoad for HyGen {
    fn load_queue(&mut self) -> &mut VecDeque<TableOp<Vec<Value>>> {
        &mut self.queue
    }

    fn load_generated(&self) -> bool {
        self.stage == LoadStage::Done
    }

    /// Generates up to [`LOAD_UNIT_ROWS`] rows of the current table from id `from`, and
    /// returns the next stage.
    fn load_next_unit(&mut self) {
        let s = self.scale;
        let unit = |from: i64, total: i64| (from..=total.min(from + LOAD_UNIT_ROWS - 1), total);
        let next = |from: i64, total: i64, this: fn(i64) -> LoadStage, then: LoadStage| {
            let to = from + LOAD_UNIT_ROWS;
            if to <= total { this(to) } else { then }
        };
        self.stage = match self.stage {
            LoadStage::Customers(from) => {
                let (ids, total) = unit(from, s.customers);
                ids.for_each(|id| self.load_customer(id));
                next(from, total, LoadStage::Customers, LoadStage::Companies(1))
            }
            LoadStage::Companies(from) => {
                let (ids, total) = unit(from, s.companies);
                ids.for_each(|i| self.load_company(s.customers + i));
                next(from, total, LoadStage::Companies, LoadStage::Saving(1))
            }
            LoadStage::Saving(from) => {
                let (ids, total) = unit(from, s.accounts());
                ids.for_each(|id| self.load_account(id, true));
                next(from, total, LoadStage::Saving, LoadStage::Checking(1))
            }
            LoadStage::Checking(from) => {
                let (ids, total) = unit(from, s.accounts());
                ids.for_each(|id| self.load_account(id, false));
                next(from, total, LoadStage::Checking, LoadStage::Transfers(1))
            }
            LoadStage::Transfers(from) => {
                let (ids, total) = unit(from, s.transfers);
                ids.for_each(|id| self.load_transfer(id));
                next(from, total, LoadStage::Transfers, LoadStage::Cheques(1))
            }
            LoadStage::Cheques(from) => {
                let (ids, total) = unit(from, s.checkings);
                ids.for_each(|id| self.load_cheque(id));
                next(from, total, LoadStage::Cheques, LoadStage::Loans(1))
            }
            LoadStage::Loans(from) => {
                let (ids, total) = unit(from, s.loans);
                ids.for_each(|id| self.load_loan(id));
                next(from, total, LoadStage::Loans, LoadStage::Done)
            }
            LoadStage::Done => LoadStage::Done,
        };
    }
}

impl HyGen {
    pub fn new(scale: HyScale, seed: u64) -> Self {
        scale.check();
        let accounts = scale.accounts() as usize;
        HyGen {
            scale,
            load_rng: SmallRng::seed_from_u64(seed),
            // A separate stream keeps the load's rows the same however the stream is drawn.
            rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            stage: LoadStage::Customers(1),
            queue: VecDeque::new(),
            model: Model {
                customers: Vec::with_capacity(scale.customers as usize),
                companies: Vec::with_capacity(scale.companies as usize),
                saving: Vec::with_capacity(accounts),
                checking: Vec::with_capacity(accounts),
                employees: vec![Vec::new(); scale.companies as usize],
                loans: Loans::default(),
                next_transfer_id: scale.transfers + 1,
                next_checking_id: scale.checkings + 1,
                next_loanapp_id: scale.loans + 1,
                next_loantrans_id: scale.loans + 1,
            },
            counts: TxnCounts::default(),
        }
    }

    pub fn scale(&self) -> &HyScale {
        &self.scale
    }

    pub fn counts(&self) -> TxnCounts {
        self.counts
    }

    fn is_customer(&self, id: i64) -> bool {
        id <= self.scale.customers
    }

    // ---- The initial load ----

    /// The next transaction of the initial load: up to `rows_per_txn` inserts, table by table
    /// in id order. `None` once the load is complete.
    pub fn next_load_txn(&mut self, rows_per_txn: usize) -> Option<Txn> {
        QueuedLoad::next_load_txn(self, rows_per_txn)
    }

    /// The whole initial load, in transactions of `rows_per_txn` inserts.
    pub fn load(&mut self, rows_per_txn: usize) -> Vec<Txn> {
        QueuedLoad::load(self, rows_per_txn)
    }

    /// 1% of customers and companies are blocked (HyBench's `prob_blocked`), with their
    /// accounts.
    fn blocked(rng: &mut SmallRng) -> i64 {
        i64::from(rng.random_range(0..100) == 0)
    }

    fn load_customer(&mut self, id: i64) {
        let s = self.scale;
        let rng = &mut self.load_rng;
        let gender = if rng.random_range(0..2) == 0 {
            "female"
        } else {
            "male"
        };
        let company = rng.random_range(1..=s.companies);
        self.model.employees[(company - 1) as usize].push(id);
        let province = pick(rng, &PROVINCES);
        let created = rng.random_range(START_DAY..MID_DAY);
        let row = vec![
            Value::Int(id),
            Value::Int(s.customers + company),
            utf8(gender),
            Value::Utf8(format!(
                "{} {}",
                pick(rng, &LAST_NAMES),
                pick(rng, &FIRST_NAMES)
            )),
            Value::Int(rng.random_range(18..=60)),
            Value::Utf8(phone(rng)),
            utf8(province),
            Value::Utf8(format!("city_{}", rng.random_range(1..=20))),
            Value::Decimal(CUST_LOAN),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(Self::blocked(rng)),
            Value::Date(created),
            Value::Timestamp(day_us(created)),
            Value::Timestamp(LOAD_US),
        ];
        self.model.customers.push(row.clone());
        self.queue.push_back(insert(table::CUSTOMER, row));
    }

    fn load_company(&mut self, id: i64) {
        let rng = &mut self.load_rng;
        let category = pick(rng, &CATEGORIES);
        let created = rng.random_range(START_DAY..MID_DAY);
        let row = vec![
            Value::Int(id),
            Value::Utf8(format!("{category}{id}")),
            utf8(category),
            Value::Int(rng.random_range(10..=100)),
            Value::Decimal(COMPANY_LOAN),
            Value::Utf8(phone(rng)),
            utf8(pick(rng, &PROVINCES)),
            Value::Utf8(format!("city_{}", rng.random_range(1..=20))),
            Value::Int(0),
            Value::Int(0),
            Value::Int(0),
            Value::Int(Self::blocked(rng)),
            Value::Date(created),
            Value::Timestamp(day_us(created)),
            Value::Timestamp(LOAD_US),
        ];
        self.model.companies.push(row.clone());
        self.queue.push_back(insert(table::COMPANY, row));
    }

    /// An account of user `id` (its owner's blocked flag and creation time).
    fn account_row(&self, id: i64, saving: bool) -> Vec<Value> {
        let (owner, blocked, created) = if self.is_customer(id) {
            let row = &self.model.customers[(id - 1) as usize];
            (row, col::C_ISBLOCKED, 14)
        } else {
            let row = &self.model.companies[(id - self.scale.customers - 1) as usize];
            (row, col::CO_ISBLOCKED, 13)
        };
        let balance = match (self.is_customer(id), saving) {
            (true, true) => CUST_SAVING,
            (false, true) => COMPANY_SAVING,
            (true, false) => CUST_CHECKING,
            (false, false) => COMPANY_CHECKING,
        };
        vec![
            Value::Int(id),
            Value::Int(id),
            Value::Decimal(balance),
            owner[blocked].clone(),
            owner[created].clone(),
            Value::Timestamp(LOAD_US),
        ]
    }

    /// The saving (or checking) account of user `id`.
    fn load_account(&mut self, id: i64, saving: bool) {
        let row = self.account_row(id, saving);
        let (rows, t) = self.model.accounts(saving);
        rows.push(row.clone());
        self.queue.push_back(insert(t, row));
    }

    /// HyBench loads 80% of transfers from customers (dated 2019..2024) and the rest from
    /// companies (2014..2019), to anyone else.
    fn load_transfer(&mut self, id: i64) {
        let s = self.scale;
        let rng = &mut self.load_rng;
        let by_customer = id <= (s.transfers * 4 + 4) / 5;
        let source = if by_customer {
            rng.random_range(1..=s.customers)
        } else {
            rng.random_range(s.customers + 1..=s.accounts())
        };
        let target = other_account(rng, s.accounts(), source);
        let (kind, ts) = if by_customer {
            (
                pick(rng, &CUST_TRANSFER_TYPES),
                timestamp_between(rng, MID_DAY, END_DAY + 1),
            )
        } else {
            (
                pick(rng, &COMPANY_TRANSFER_TYPES),
                timestamp_between(rng, START_DAY, MID_DAY),
            )
        };
        let amount = cents(rng, CUST_SAVING / 100);
        let row = movement(id, source, target, amount, kind, ts, LOAD_US);
        self.queue.push_back(insert(table::TRANSFER, row));
    }

    /// 20% of loaded cheques are written by customers, the rest by companies.
    fn load_cheque(&mut self, id: i64) {
        let s = self.scale;
        let rng = &mut self.load_rng;
        let by_customer = id <= s.checkings / 5;
        let (source, amount, kind) = if by_customer {
            (
                rng.random_range(1..=s.customers),
                cents(rng, CUST_CHECKING / 100),
                pick(rng, &CUST_CHECK_TYPES),
            )
        } else {
            (
                rng.random_range(s.customers + 1..=s.accounts()),
                cents(rng, COMPANY_CHECKING / 100),
                pick(rng, &COMPANY_CHECK_TYPES),
            )
        };
        let target = other_account(rng, s.accounts(), source);
        let ts = timestamp_between(rng, START_DAY, END_DAY + 1);
        let row = movement(id, source, target, amount, kind, ts, LOAD_US);
        self.queue.push_back(insert(table::CHECKING, row));
    }

    /// A loan application (20% by customers, for up to 20% of their credit) and its loan
    /// transaction, both in the application's status (HyBench loads one of each per loan;
    /// an accepted one has its contract signed the day after applying).
    fn load_loan(&mut self, id: i64) {
        let s = self.scale;
        let rng = &mut self.load_rng;
        let (applicant, amount) = if id <= s.loans / 5 {
            (rng.random_range(1..=s.customers), cents(rng, CUST_LOAN / 5))
        } else {
            (
                rng.random_range(s.customers + 1..=s.accounts()),
                cents(rng, COMPANY_LOAN / 5),
            )
        };
        let applied = timestamp_between(rng, LOAN_DAY, END_DAY + 1);
        let duration = LOAN_DURATIONS[rng.random_range(0..LOAN_DURATIONS.len())];
        let status = pick(rng, &LOAN_STATUSES);
        let fresh = Value::Timestamp(LOAD_US);
        let app = vec![
            Value::Int(id),
            Value::Int(applicant),
            Value::Decimal(amount),
            Value::Int(duration),
            utf8(status),
            Value::Timestamp(applied),
            fresh.clone(),
        ];
        let signed = applied + DAY_US;
        let trans = vec![
            Value::Int(id),
            Value::Int(applicant),
            Value::Int(id),
            Value::Decimal(amount),
            utf8(status),
            Value::Timestamp(signed),
            Value::Int(duration),
            if status == "accept" {
                Value::Timestamp(signed)
            } else {
                Value::Null
            },
            Value::Int(0),
            fresh,
        ];
        match status {
            "under_review" => {
                self.model.loans.under_review.insert(id, app.clone());
            }
            "accept" => {
                self.model.loans.accepted.insert(id, trans.clone());
            }
            _ => {}
        }
        self.queue.push_back(insert(table::LOANAPPS, app));
        self.queue.push_back(insert(table::LOANTRANS, trans));
    }

    // ---- The change stream ----

    /// The next transaction of the change stream, its `fresh_ts` (and every timestamp it
    /// writes) `now_us`. Never empty: rolled-back draws and ones with nothing to do emit
    /// nothing and the next draw is taken. The rest of the load, if it was not drained, is
    /// generated (and dropped) first, since the stream updates the load's rows.
    pub fn next_txn(&mut self, now_us: i64) -> Txn {
        self.finish_load();
        let total: u32 = WEIGHTS.iter().sum();
        loop {
            let mut draw = self.rng.random_range(0..total);
            let mut k = 0;
            while draw >= WEIGHTS[k] {
                draw -= WEIGHTS[k];
                k += 1;
            }
            let kind = TxnKind::ALL[k];
            self.counts.drawn[k] += 1;
            let txn = match kind {
                TxnKind::Transfer => self.transfer(now_us, true),
                TxnKind::Salary => self.salary(now_us),
                TxnKind::Cheque => self.transfer(now_us, false),
                TxnKind::LoanApply => Some(self.loan_apply(now_us)),
                TxnKind::LoanReview => self.loan_review(now_us),
                TxnKind::Lend => self.lend(now_us),
                TxnKind::Delinquency => self.delinquency(now_us),
                TxnKind::Repay => self.repay(now_us),
                TxnKind::SavingToChecking => self.between_own_accounts(now_us, true),
                TxnKind::CheckingToSaving => self.between_own_accounts(now_us, false),
            };
            if let Some(txn) = txn {
                debug_assert!(!txn.is_empty());
                self.counts.emitted[k] += 1;
                return txn;
            }
        }
    }

    /// `n` stream transactions stamped by `clock`.
    pub fn stream(&mut self, n: usize, clock: &mut FreshClock) -> Vec<Txn> {
        (0..n).map(|_| self.next_txn(clock.now_us())).collect()
    }

    /// Adds `delta` to account `id`'s balance (saving or checking), returning the update.
    fn move_money(
        &mut self,
        saving: bool,
        id: i64,
        delta: i128,
        now_us: i64,
    ) -> TableOp<Vec<Value>> {
        let (rows, t) = self.model.accounts(saving);
        let row = &mut rows[(id - 1) as usize];
        let before = row.clone();
        row[col::A_BALANCE] = Value::Decimal(decimal(&before[col::A_BALANCE]) + delta);
        row[col::A_FRESH] = Value::Timestamp(now_us);
        update(t, before, row.clone())
    }

    fn balance(&self, saving: bool, id: i64) -> i128 {
        let rows = if saving {
            &self.model.saving
        } else {
            &self.model.checking
        };
        decimal(&rows[(id - 1) as usize][col::A_BALANCE])
    }

    /// TP-9 (`saving`: saving accounts, a `transfer` row) or TP-11 (checking accounts, a
    /// `checking` row): any account to any account (the same one too, as in HyBench), up to
    /// 0.01% of the sender's kind of initial balance; rolled back if the sender is short.
    fn transfer(&mut self, now_us: i64, saving: bool) -> Option<Txn> {
        let accounts = self.scale.accounts();
        let source = self.rng.random_range(1..=accounts);
        let target = self.rng.random_range(1..=accounts);
        let customer = self.is_customer(source);
        let (max, kind) = match (saving, customer) {
            (true, true) => (CUST_SAVING, pick(&mut self.rng, &CUST_TRANSFER_TYPES)),
            (true, false) => (COMPANY_SAVING, pick(&mut self.rng, &COMPANY_TRANSFER_TYPES)),
            (false, true) => (CUST_CHECKING, pick(&mut self.rng, &CUST_TRANSFER_TYPES)),
            (false, false) => (
                COMPANY_CHECKING,
                pick(&mut self.rng, &COMPANY_TRANSFER_TYPES),
            ),
        };
        let amount = cents(&mut self.rng, max / 10_000);
        if self.balance(saving, source) < amount {
            return None;
        }
        let mut ops = Vec::with_capacity(3);
        ops.push(self.move_money(saving, source, -amount, now_us));
        ops.push(self.move_money(saving, target, amount, now_us));
        let (t, id) = if saving {
            self.model.next_transfer_id += 1;
            (table::TRANSFER, self.model.next_transfer_id - 1)
        } else {
            self.model.next_checking_id += 1;
            (table::CHECKING, self.model.next_checking_id - 1)
        };
        ops.push(insert(
            t,
            movement(id, source, target, amount, kind, now_us, now_us),
        ));
        Some(ops)
    }

    /// TP-10: a company pays each of its employees (consecutive ones from a random one, at
    /// most [`HyScale::salary_employees`]) the same salary, up to 1% of a company's initial
    /// saving balance: per employee the company's account, the employee's and a `salary`
    /// transfer. No balance check, as in HyBench. Nothing for a company without employees.
    fn salary(&mut self, now_us: i64) -> Option<Txn> {
        let s = self.scale;
        let c = self.rng.random_range(0..s.companies) as usize;
        let company = s.customers + 1 + c as i64;
        let salary = cents(&mut self.rng, COMPANY_SAVING / 100);
        let staff = self.model.employees[c].len();
        if staff == 0 {
            return None;
        }
        let paid = s.salary_employees.map_or(staff, |e| staff.min(e as usize));
        let first = self.rng.random_range(0..staff);
        let mut ops = Vec::with_capacity(3 * paid);
        for k in 0..paid {
            let employee = self.model.employees[c][(first + k) % staff];
            ops.push(self.move_money(true, company, -salary, now_us));
            ops.push(self.move_money(true, employee, salary, now_us));
            let id = self.model.next_transfer_id;
            self.model.next_transfer_id += 1;
            let row = movement(id, company, employee, salary, "salary", now_us, now_us);
            ops.push(insert(table::TRANSFER, row));
        }
        Some(ops)
    }

    /// Adds `delta` to the `loan_balance` (the credit left) of customer or company `id`.
    fn loan_credit(&mut self, id: i64, delta: i128, now_us: i64) -> TableOp<Vec<Value>> {
        let (row, t, balance, fresh) = if self.is_customer(id) {
            (
                &mut self.model.customers[(id - 1) as usize],
                table::CUSTOMER,
                col::C_LOAN_BALANCE,
                col::C_FRESH,
            )
        } else {
            (
                &mut self.model.companies[(id - self.scale.customers - 1) as usize],
                table::COMPANY,
                col::CO_LOAN_BALANCE,
                col::CO_FRESH,
            )
        };
        let before = row.clone();
        row[balance] = Value::Decimal(decimal(&before[balance]) + delta);
        row[fresh] = Value::Timestamp(now_us);
        update(t, before, row.clone())
    }

    fn loan_balance(&self, id: i64) -> i128 {
        if self.is_customer(id) {
            decimal(&self.model.customers[(id - 1) as usize][col::C_LOAN_BALANCE])
        } else {
            decimal(
                &self.model.companies[(id - self.scale.customers - 1) as usize]
                    [col::CO_LOAN_BALANCE],
            )
        }
    }

    /// TP-12: anyone applies for up to their whole initial credit; the credit shrinks by the
    /// amount if it covers it, and the application is inserted either way.
    fn loan_apply(&mut self, now_us: i64) -> Txn {
        let applicant = self.rng.random_range(1..=self.scale.accounts());
        let max = if self.is_customer(applicant) {
            CUST_LOAN
        } else {
            COMPANY_LOAN
        };
        let amount = cents(&mut self.rng, max);
        let duration = LOAN_DURATIONS[self.rng.random_range(0..LOAN_DURATIONS.len())];
        let mut ops = Vec::with_capacity(2);
        if self.loan_balance(applicant) >= amount {
            ops.push(self.loan_credit(applicant, -amount, now_us));
        }
        let id = self.model.next_loanapp_id;
        self.model.next_loanapp_id += 1;
        let app = vec![
            Value::Int(id),
            Value::Int(applicant),
            Value::Decimal(amount),
            Value::Int(duration),
            utf8("under_review"),
            Value::Timestamp(now_us),
            Value::Timestamp(now_us),
        ];
        self.model.loans.under_review.insert(id, app.clone());
        ops.push(insert(table::LOANAPPS, app));
        ops
    }

    /// TP-13: a random application under review is accepted (half: a loan transaction in
    /// status `accept`, its contract signed now) or rejected (half: the credit is given back);
    /// its status is updated.
    fn loan_review(&mut self, now_us: i64) -> Option<Txn> {
        let id = random_entry(&mut self.rng, &self.model.loans.under_review)?;
        let accept = self.rng.random_range(0..2) == 0;
        let before = self.model.loans.under_review.remove(&id).expect("picked");
        let applicant = int(&before[col::LA_APPLICANT]);
        let amount = decimal(&before[col::LA_AMOUNT]);
        let mut ops = Vec::with_capacity(2);
        if accept {
            let lt = self.model.next_loantrans_id;
            self.model.next_loantrans_id += 1;
            let trans = vec![
                Value::Int(lt),
                Value::Int(applicant),
                before[col::LA_ID].clone(),
                Value::Decimal(amount),
                utf8("accept"),
                before[col::LA_TIMESTAMP].clone(),
                before[col::LA_DURATION].clone(),
                Value::Timestamp(now_us),
                Value::Int(0),
                Value::Timestamp(now_us),
            ];
            self.model.loans.accepted.insert(lt, trans.clone());
            ops.push(insert(table::LOANTRANS, trans));
        } else {
            ops.push(self.loan_credit(applicant, amount, now_us));
        }
        let mut after = before.clone();
        after[col::LA_STATUS] = utf8(if accept { "accept" } else { "reject" });
        after[col::LA_FRESH] = Value::Timestamp(now_us);
        ops.push(update(table::LOANAPPS, before, after));
        Some(ops)
    }

    fn lent_insert(&mut self, row: Vec<Value>) {
        let (id, ts) = (int(&row[col::LT_ID]), timestamp(&row[col::LT_TIMESTAMP]));
        self.model.loans.lent_by_ts.insert((ts, id));
        self.model.loans.lent.insert(id, row);
    }

    fn lent_remove(&mut self, id: i64) -> Vec<Value> {
        let row = self.model.loans.lent.remove(&id).expect("a lent loan");
        let ts = timestamp(&row[col::LT_TIMESTAMP]);
        assert!(self.model.loans.lent_by_ts.remove(&(ts, id)));
        row
    }

    /// TP-14: a random accepted loan is paid into the applicant's saving account; its status
    /// becomes `lent`.
    fn lend(&mut self, now_us: i64) -> Option<Txn> {
        let id = random_entry(&mut self.rng, &self.model.loans.accepted)?;
        let before = self.model.loans.accepted.remove(&id).expect("picked");
        let applicant = int(&before[col::LT_APPLICANT]);
        let amount = decimal(&before[col::LT_AMOUNT]);
        let mut after = before.clone();
        after[col::LT_STATUS] = utf8("lent");
        after[col::LT_TIMESTAMP] = Value::Timestamp(now_us);
        after[col::LT_FRESH] = Value::Timestamp(now_us);
        self.lent_insert(after.clone());
        Some(vec![
            self.move_money(true, applicant, amount, now_us),
            update(table::LOANTRANS, before, after),
        ])
    }

    /// TP-15: the lent loan with the oldest timestamp is marked delinquent (and its
    /// timestamp set) if its contract plus its duration is past; otherwise nothing.
    fn delinquency(&mut self, now_us: i64) -> Option<Txn> {
        let &(_, id) = self.model.loans.lent_by_ts.first()?;
        let row = &self.model.loans.lent[&id];
        let due = timestamp(&row[col::LT_CONTRACT]) + int(&row[col::LT_DURATION]) * DAY_US;
        if due >= now_us {
            return None;
        }
        let before = self.lent_remove(id);
        let mut after = before.clone();
        after[col::LT_DELINQUENCY] = Value::Int(1);
        after[col::LT_TIMESTAMP] = Value::Timestamp(now_us);
        after[col::LT_FRESH] = Value::Timestamp(now_us);
        self.lent_insert(after.clone());
        Some(vec![update(table::LOANTRANS, before, after)])
    }

    /// TP-16: a random lent loan is repaid from the applicant's saving account (rolled back
    /// if it is short); its status becomes `repaid`.
    fn repay(&mut self, now_us: i64) -> Option<Txn> {
        let id = random_entry(&mut self.rng, &self.model.loans.lent)?;
        let row = &self.model.loans.lent[&id];
        let applicant = int(&row[col::LT_APPLICANT]);
        let amount = decimal(&row[col::LT_AMOUNT]);
        if self.balance(true, applicant) < amount {
            return None;
        }
        let before = self.lent_remove(id);
        let mut after = before.clone();
        after[col::LT_STATUS] = utf8("repaid");
        after[col::LT_TIMESTAMP] = Value::Timestamp(now_us);
        after[col::LT_FRESH] = Value::Timestamp(now_us);
        Some(vec![
            self.move_money(true, applicant, -amount, now_us),
            update(table::LOANTRANS, before, after),
        ])
    }

    /// TP-17 (`to_checking`) / TP-18: an account holder moves up to 0.01% of their kind of
    /// initial saving balance between their saving and checking accounts; rolled back if
    /// either account is blocked or the debited one is short.
    fn between_own_accounts(&mut self, now_us: i64, to_checking: bool) -> Option<Txn> {
        let id = self.rng.random_range(1..=self.scale.accounts());
        let max = if self.is_customer(id) {
            CUST_SAVING
        } else {
            COMPANY_SAVING
        };
        let amount = cents(&mut self.rng, max / 10_000);
        let i = (id - 1) as usize;
        let blocked = self.model.saving[i][col::A_ISBLOCKED] != Value::Int(0)
            || self.model.checking[i][col::A_ISBLOCKED] != Value::Int(0);
        if blocked || self.balance(to_checking, id) < amount {
            return None;
        }
        Some(vec![
            self.move_money(to_checking, id, -amount, now_us),
            self.move_money(!to_checking, id, amount, now_us),
        ])
    }
}

/// The initial load and `stream_txns` stream transactions, stamped by a logical clock.
pub struct HyWorkload {
    pub load: Vec<Txn>,
    pub stream: Vec<Txn>,
    pub counts: TxnCounts,
}

/// Generates the load (transactions of [`LOAD_ROWS_PER_TXN`] rows) and `stream_txns` stream
/// transactions with [`FreshClock::logical`]: the same bytes for the same arguments.
pub fn generate(scale: HyScale, seed: u64, stream_txns: usize) -> HyWorkload {
    let mut g = HyGen::new(scale, seed);
    let load = g.load(LOAD_ROWS_PER_TXN);
    let stream = g.stream(stream_txns, &mut FreshClock::logical());
    HyWorkload {
        load,
        stream,
        counts: g.counts(),
    }
}

impl HyWorkload {
    /// Debezium JSON lines from a source database named `hybench`: the load as snapshot
    /// reads (`r`) and then the stream, every transaction between BEGIN and END, ids counting
    /// from 1 across both.
    pub fn write_debezium(&self, out: &mut impl Write) -> std::io::Result<()> {
        let writer = DebeziumWriter::new(schemas()).with_database("hybench");
        write_load_and_stream(writer, out, &self.load, &self.stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_positions_match_the_schemas() {
        let s = schemas();
        let at = |t: retina_storage::TableId, name: &str| s[t as usize].column_index(name).unwrap();
        assert_eq!(at(table::CUSTOMER, "loan_balance"), col::C_LOAN_BALANCE);
        assert_eq!(at(table::CUSTOMER, "Isblocked"), col::C_ISBLOCKED);
        assert_eq!(at(table::CUSTOMER, "created_date"), 13);
        assert_eq!(at(table::CUSTOMER, "last_update_timestamp"), 14);
        assert_eq!(at(table::CUSTOMER, "fresh_ts"), col::C_FRESH);
        assert_eq!(at(table::COMPANY, "loan_balance"), col::CO_LOAN_BALANCE);
        assert_eq!(at(table::COMPANY, "Isblocked"), col::CO_ISBLOCKED);
        assert_eq!(at(table::COMPANY, "last_update_timestamp"), 13);
        assert_eq!(at(table::COMPANY, "fresh_ts"), col::CO_FRESH);
        for t in [table::SAVING_ACCOUNT, table::CHECKING_ACCOUNT] {
            assert_eq!(at(t, "balance"), col::A_BALANCE);
            assert_eq!(at(t, "Isblocked"), col::A_ISBLOCKED);
            assert_eq!(at(t, "fresh_ts"), col::A_FRESH);
        }
        assert_eq!(at(table::LOANAPPS, "id"), col::LA_ID);
        assert_eq!(at(table::LOANAPPS, "applicantID"), col::LA_APPLICANT);
        assert_eq!(at(table::LOANAPPS, "amount"), col::LA_AMOUNT);
        assert_eq!(at(table::LOANAPPS, "duration"), col::LA_DURATION);
        assert_eq!(at(table::LOANAPPS, "status"), col::LA_STATUS);
        assert_eq!(at(table::LOANAPPS, "timestamp"), col::LA_TIMESTAMP);
        assert_eq!(at(table::LOANAPPS, "fresh_ts"), col::LA_FRESH);
        assert_eq!(at(table::LOANTRANS, "id"), col::LT_ID);
        assert_eq!(at(table::LOANTRANS, "applicantID"), col::LT_APPLICANT);
        assert_eq!(at(table::LOANTRANS, "amount"), col::LT_AMOUNT);
        assert_eq!(at(table::LOANTRANS, "status"), col::LT_STATUS);
        assert_eq!(at(table::LOANTRANS, "timestamp"), col::LT_TIMESTAMP);
        assert_eq!(at(table::LOANTRANS, "duration"), col::LT_DURATION);
        assert_eq!(at(table::LOANTRANS, "contract_timestamp"), col::LT_CONTRACT);
        assert_eq!(at(table::LOANTRANS, "delinquency"), col::LT_DELINQUENCY);
        assert_eq!(at(table::LOANTRANS, "fresh_ts"), col::LT_FRESH);
        let names: Vec<_> = s.iter().map(|t| t.name()).collect();
        assert_eq!(
            names,
            [
                "customer",
                "company",
                "savingAccount",
                "checkingAccount",
                "transfer",
                "checking",
                "loanapps",
                "loantrans"
            ]
        );
        assert_eq!(s.len(), table::COUNT);
        assert_eq!(TxnKind::Transfer.name(), "TP-9");
        assert_eq!(TxnKind::CheckingToSaving.name(), "TP-18");
    }
}
