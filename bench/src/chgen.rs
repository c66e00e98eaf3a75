//! The CH-benCHmark workload: TPC-C's nine tables plus CH's supplier, nation and region (DDL in
//! `bench/ddl/ch.sql`), the initial load as TPC-C populates a warehouse, and the NewOrder /
//! Payment / Delivery change stream, all deterministic from a seed; a self-check of a stream's
//! shape, and a writer of Debezium JSON lines (both shared with the other generators, from
//! [`crate::workload`], and re-exported here).
//!
//! The generator keeps a model of every row the stream may touch, so each update and delete
//! carries the row's exact before-image. Rows hold one value per column in DDL order; table
//! ids are the DDL's order ([`table`]).

use std::collections::VecDeque;
use std::io::Write;
use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use retina_storage::{ColumnDef, ColumnType, RowOp, TableOp, TableSchema, Value};

use crate::ch::nurand;
pub use crate::workload::{
    DebeziumWriter, FreshClock, InsertOp, LOAD_US, SelfCheck, TableCounts, Txn,
};
use crate::workload::{QueuedLoad, decimal, insert, int, update, write_load_and_stream};

/// The twelve tables, as `Catalog::from_ddl` reads them; [`schemas`] builds the same.
pub const DDL: &str = include_str!("../ddl/ch.sql");

/// Table ids: positions in [`DDL`] and [`schemas`].
pub mod table {
    use retina_storage::TableId;

    pub const WAREHOUSE: TableId = 0;
    pub const DISTRICT: TableId = 1;
    pub const CUSTOMER: TableId = 2;
    pub const HISTORY: TableId = 3;
    pub const NEWORDER: TableId = 4;
    pub const ORDERS: TableId = 5;
    pub const ORDERLINE: TableId = 6;
    pub const STOCK: TableId = 7;
    pub const ITEM: TableId = 8;
    pub const SUPPLIER: TableId = 9;
    pub const NATION: TableId = 10;
    pub const REGION: TableId = 11;
    pub const COUNT: usize = 12;
}

/// CH-benCHmark's fixed nation and region counts.
pub const NATIONS: i64 = 62;
pub const REGIONS: i64 = 5;

/// TPC-C's weights of the write transactions, after dropping the read-only OrderStatus and
/// StockLevel: NewOrder, Payment, Delivery (one Delivery is a transaction per district).
pub const WEIGHTS: [u32; 3] = [45, 43, 4];

/// Column positions the stream updates, by table (checked against [`schemas`] in a test).
mod col {
    pub const W_NAME: usize = 1;
    pub const W_YTD: usize = 8;
    pub const W_FRESH: usize = 9;
    pub const D_NAME: usize = 2;
    pub const D_YTD: usize = 9;
    pub const D_NEXT_O_ID: usize = 10;
    pub const D_FRESH: usize = 11;
    pub const C_CREDIT: usize = 13;
    pub const C_BALANCE: usize = 16;
    pub const C_YTD_PAYMENT: usize = 17;
    pub const C_PAYMENT_CNT: usize = 18;
    pub const C_DELIVERY_CNT: usize = 19;
    pub const C_DATA: usize = 20;
    pub const C_FRESH: usize = 21;
    pub const O_C_ID: usize = 3;
    pub const O_CARRIER_ID: usize = 5;
    pub const O_FRESH: usize = 8;
    pub const OL_DELIVERY_D: usize = 6;
    pub const OL_AMOUNT: usize = 8;
    pub const OL_FRESH: usize = 10;
    pub const S_QUANTITY: usize = 2;
    pub const S_DIST_01: usize = 3;
    pub const S_YTD: usize = 13;
    pub const S_ORDER_CNT: usize = 14;
    pub const S_REMOTE_CNT: usize = 15;
    pub const S_FRESH: usize = 17;
}

/// The schemas of [`DDL`], in table-id order.
pub fn schemas() -> Vec<Arc<TableSchema>> {
    use ColumnType::*;
    let dec = |precision, scale| Decimal { precision, scale };
    let t = |name: &str, cols: &[(&str, ColumnType)], nullable: &[&str], pk: &[&str]| {
        let columns = cols
            .iter()
            .map(|&(n, ty)| ColumnDef::new(n, ty, nullable.contains(&n)))
            .chain([ColumnDef::new("fresh_ts", Timestamp, false)])
            .collect();
        TableSchema::new(name, columns, pk).expect("the CH schemas are valid")
    };
    let dists: Vec<String> = (1..=10).map(|d| format!("s_dist_{d:02}")).collect();
    let mut stock: Vec<(&str, ColumnType)> =
        vec![("s_i_id", Int32), ("s_w_id", Int32), ("s_quantity", Int32)];
    stock.extend(dists.iter().map(|d| (d.as_str(), Utf8)));
    stock.extend([
        ("s_ytd", Int32),
        ("s_order_cnt", Int32),
        ("s_remote_cnt", Int32),
        ("s_data", Utf8),
    ]);
    vec![
        t(
            "warehouse",
            &[
                ("w_id", Int32),
                ("w_name", Utf8),
                ("w_street_1", Utf8),
                ("w_street_2", Utf8),
                ("w_city", Utf8),
                ("w_state", Utf8),
                ("w_zip", Utf8),
                ("w_tax", dec(4, 4)),
                ("w_ytd", dec(12, 2)),
            ],
            &[],
            &["w_id"],
        ),
        t(
            "district",
            &[
                ("d_id", Int32),
                ("d_w_id", Int32),
                ("d_name", Utf8),
                ("d_street_1", Utf8),
                ("d_street_2", Utf8),
                ("d_city", Utf8),
                ("d_state", Utf8),
                ("d_zip", Utf8),
                ("d_tax", dec(4, 4)),
                ("d_ytd", dec(12, 2)),
                ("d_next_o_id", Int32),
            ],
            &[],
            &["d_w_id", "d_id"],
        ),
        t(
            "customer",
            &[
                ("c_id", Int32),
                ("c_d_id", Int32),
                ("c_w_id", Int32),
                ("c_first", Utf8),
                ("c_middle", Utf8),
                ("c_last", Utf8),
                ("c_street_1", Utf8),
                ("c_street_2", Utf8),
                ("c_city", Utf8),
                ("c_state", Utf8),
                ("c_zip", Utf8),
                ("c_phone", Utf8),
                ("c_since", Timestamp),
                ("c_credit", Utf8),
                ("c_credit_lim", dec(12, 2)),
                ("c_discount", dec(4, 4)),
                ("c_balance", dec(12, 2)),
                ("c_ytd_payment", dec(12, 2)),
                ("c_payment_cnt", Int32),
                ("c_delivery_cnt", Int32),
                ("c_data", Utf8),
            ],
            &[],
            &["c_w_id", "c_d_id", "c_id"],
        ),
        t(
            "history",
            &[
                ("h_id", Int64),
                ("h_c_id", Int32),
                ("h_c_d_id", Int32),
                ("h_c_w_id", Int32),
                ("h_d_id", Int32),
                ("h_w_id", Int32),
                ("h_date", Timestamp),
                ("h_amount", dec(6, 2)),
                ("h_data", Utf8),
            ],
            &[],
            &["h_id"],
        ),
        t(
            "neworder",
            &[("no_o_id", Int32), ("no_d_id", Int32), ("no_w_id", Int32)],
            &[],
            &["no_w_id", "no_d_id", "no_o_id"],
        ),
        t(
            "orders",
            &[
                ("o_id", Int32),
                ("o_d_id", Int32),
                ("o_w_id", Int32),
                ("o_c_id", Int32),
                ("o_entry_d", Timestamp),
                ("o_carrier_id", Int32),
                ("o_ol_cnt", Int32),
                ("o_all_local", Int32),
            ],
            &["o_carrier_id"],
            &["o_w_id", "o_d_id", "o_id"],
        ),
        t(
            "orderline",
            &[
                ("ol_o_id", Int32),
                ("ol_d_id", Int32),
                ("ol_w_id", Int32),
                ("ol_number", Int32),
                ("ol_i_id", Int32),
                ("ol_supply_w_id", Int32),
                ("ol_delivery_d", Timestamp),
                ("ol_quantity", Int32),
                ("ol_amount", dec(6, 2)),
                ("ol_dist_info", Utf8),
            ],
            &["ol_delivery_d"],
            &["ol_w_id", "ol_d_id", "ol_o_id", "ol_number"],
        ),
        t("stock", &stock, &[], &["s_w_id", "s_i_id"]),
        t(
            "item",
            &[
                ("i_id", Int32),
                ("i_im_id", Int32),
                ("i_name", Utf8),
                ("i_price", dec(5, 2)),
                ("i_data", Utf8),
            ],
            &[],
            &["i_id"],
        ),
        t(
            "supplier",
            &[
                ("su_suppkey", Int32),
                ("su_name", Utf8),
                ("su_address", Utf8),
                ("su_nationkey", Int32),
                ("su_phone", Utf8),
                ("su_acctbal", dec(12, 2)),
                ("su_comment", Utf8),
            ],
            &[],
            &["su_suppkey"],
        ),
        t(
            "nation",
            &[
                ("n_nationkey", Int32),
                ("n_name", Utf8),
                ("n_regionkey", Int32),
                ("n_comment", Utf8),
            ],
            &[],
            &["n_nationkey"],
        ),
        t(
            "region",
            &[
                ("r_regionkey", Int32),
                ("r_name", Utf8),
                ("r_comment", Utf8),
            ],
            &[],
            &["r_regionkey"],
        ),
    ]
}

/// How big the database is. [`ChScale::tpcc`] is TPC-C's population per warehouse;
/// [`ChScale::tiny`] keeps every table small enough for a unit test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChScale {
    pub warehouses: i64,
    pub districts_per_warehouse: i64,
    pub customers_per_district: i64,
    /// Orders loaded per district (TPC-C: one per customer).
    pub orders_per_district: i64,
    /// The newest loaded orders of each district that are not yet delivered (TPC-C: 900),
    /// with a `neworder` row each.
    pub undelivered_per_district: i64,
    /// Items, and stock rows per warehouse.
    pub items: i64,
    pub suppliers: i64,
}

impl ChScale {
    /// TPC-C's sizes: per warehouse 10 districts, 30K customers, 30K orders (~300K order
    /// lines, 9K undelivered), 100K stock; 100K items and CH's 10K suppliers fixed.
    pub fn tpcc(warehouses: i64) -> Self {
        ChScale {
            warehouses,
            districts_per_warehouse: 10,
            customers_per_district: 3000,
            orders_per_district: 3000,
            undelivered_per_district: 900,
            items: 100_000,
            suppliers: 10_000,
        }
    }

    /// Two warehouses (so remote stock and remote payments happen) of 10 districts with 30
    /// customers each, 1,000 items, 100 suppliers.
    pub fn tiny() -> Self {
        ChScale {
            warehouses: 2,
            districts_per_warehouse: 10,
            customers_per_district: 30,
            orders_per_district: 30,
            undelivered_per_district: 9,
            items: 1000,
            suppliers: 100,
        }
    }

    fn check(&self) {
        assert!(self.warehouses >= 1, "at least one warehouse");
        assert!(self.districts_per_warehouse >= 1, "at least one district");
        assert!(self.customers_per_district >= 1, "at least one customer");
        assert!(
            self.orders_per_district == self.customers_per_district,
            "TPC-C loads one order per customer: orders_per_district must equal \
             customers_per_district"
        );
        assert!(
            (0..=self.orders_per_district).contains(&self.undelivered_per_district),
            "undelivered_per_district must be within 0..=orders_per_district"
        );
        assert!(self.items >= 15, "a NewOrder needs up to 15 distinct items");
        assert!(self.suppliers >= 1, "at least one supplier");
    }
}

/// Which transaction a draw of the mix is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxnKind {
    NewOrder,
    Payment,
    Delivery,
}

/// What the stream has done so far, by transaction kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxnCounts {
    pub new_orders: u64,
    /// NewOrders that rolled back (1%, TPC-C's unused item); nothing of them is emitted.
    pub rolled_back: u64,
    pub payments: u64,
    /// Delivery draws; each emits one transaction per district with an undelivered order.
    pub deliveries: u64,
    pub delivery_txns: u64,
    /// Districts a Delivery found without an undelivered order (TPC-C skips them).
    pub districts_skipped: u64,
}

/// A loaded order not yet delivered: what a Delivery deletes and updates.
struct OpenOrder {
    new_order: Vec<Value>,
    order: Vec<Value>,
    lines: Vec<Vec<Value>>,
}

/// The rows the stream updates, as the source database holds them now.
struct Model {
    /// By `w - 1`.
    warehouses: Vec<Vec<Value>>,
    /// By [`ChGen::district_index`].
    districts: Vec<Vec<Value>>,
    /// By district index * customers + `c - 1`.
    customers: Vec<Vec<Value>>,
    /// By `(w - 1) * items + i - 1`.
    stock: Vec<Vec<Value>>,
    /// Unscaled cents, by `i - 1`.
    item_prices: Vec<i128>,
    /// By district index, oldest first.
    undelivered: Vec<VecDeque<OpenOrder>>,
    next_h_id: i64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoadStage {
    Fixed,
    Items,
    Warehouse(i64),
    District(i64, i64),
    Done,
}

#[derive(Clone, Copy, Debug)]
struct PendingDelivery {
    w: i64,
    carrier: i64,
    next_d: i64,
}

/// The CH-benCHmark generator: first the initial load ([`ChGen::next_load_txn`]), then the
/// change stream ([`ChGen::next_txn`]). The same scale and seed give the same rows.
pub struct ChGen {
    scale: ChScale,
    load_rng: SmallRng,
    rng: SmallRng,
    stage: LoadStage,
    queue: VecDeque<TableOp<Vec<Value>>>,
    model: Model,
    delivery: Option<PendingDelivery>,
    counts: TxnCounts,
}

const ALNUM: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const SYLLABLES: [&str; 10] = [
    "BAR", "OUGHT", "ABLE", "PRI", "PRES", "ESE", "ANTI", "CALLY", "ATION", "EING",
];
const REGION_NAMES: [&str; 5] = ["AFRICA", "AMERICA", "ASIA", "EUROPE", "MIDDLE EAST"];
/// TPC-H's 25 nations and their regions; CH's other 37 are named `NATION_nn` here.
const NATION_NAMES: [(&str, i64); 25] = [
    ("ALGERIA", 0),
    ("ARGENTINA", 1),
    ("BRAZIL", 1),
    ("CANADA", 1),
    ("EGYPT", 4),
    ("ETHIOPIA", 0),
    ("FRANCE", 3),
    ("GERMANY", 3),
    ("INDIA", 2),
    ("INDONESIA", 2),
    ("IRAN", 4),
    ("IRAQ", 4),
    ("JAPAN", 2),
    ("JORDAN", 4),
    ("KENYA", 0),
    ("MOROCCO", 0),
    ("MOZAMBIQUE", 0),
    ("PERU", 1),
    ("CHINA", 2),
    ("ROMANIA", 3),
    ("SAUDI ARABIA", 4),
    ("VIETNAM", 2),
    ("RUSSIA", 3),
    ("UNITED KINGDOM", 3),
    ("UNITED STATES", 1),
];

fn astring(rng: &mut SmallRng, min: usize, max: usize) -> String {
    let n = rng.random_range(min..=max);
    (0..n)
        .map(|_| char::from(ALNUM[rng.random_range(0..ALNUM.len())]))
        .collect()
}

fn nstring(rng: &mut SmallRng, min: usize, max: usize) -> String {
    let n = rng.random_range(min..=max);
    (0..n)
        .map(|_| char::from(b'0' + rng.random_range(0..10u8)))
        .collect()
}

fn zip(rng: &mut SmallRng) -> String {
    nstring(rng, 4, 4) + "11111"
}

fn state(rng: &mut SmallRng) -> String {
    (0..2)
        .map(|_| char::from(b'A' + rng.random_range(0..26u8)))
        .collect()
}

/// TPC-C's address columns: street 1 and 2, city, state, zip.
fn address(rng: &mut SmallRng) -> [Value; 5] {
    [
        Value::Utf8(astring(rng, 10, 20)),
        Value::Utf8(astring(rng, 10, 20)),
        Value::Utf8(astring(rng, 10, 20)),
        Value::Utf8(state(rng)),
        Value::Utf8(zip(rng)),
    ]
}

/// A warehouse's or a district's name, address and tax.
fn name_address_tax(rng: &mut SmallRng) -> Vec<Value> {
    let mut row = vec![Value::Utf8(astring(rng, 6, 10))];
    row.extend(address(rng));
    row.push(Value::Decimal(rng.random_range(0..=2000)));
    row
}

/// TPC-C's `i_data` / `s_data`: 26..50 characters, 10% with "ORIGINAL" somewhere inside.
fn data_original(rng: &mut SmallRng) -> String {
    let mut s = astring(rng, 26, 50);
    if rng.random_range(0..10) == 0 {
        let at = rng.random_range(0..=s.len() - 8);
        s.replace_range(at..at + 8, "ORIGINAL");
    }
    s
}

/// TPC-C's customer last name from a number in 0..=999.
fn last_name(n: i64) -> String {
    let n = n as usize;
    [n / 100, (n / 10) % 10, n % 10]
        .iter()
        .map(|&s| SYLLABLES[s])
        .collect()
}

impl QueuedLoad for ChGen {
    fn load_queue(&mut self) -> &mut VecDeque<TableOp<Vec<Value>>> {
        &mut self.queue
    }

    fn load_generated(&self) -> bool {
        self.stage == LoadStage::Done
    }

    fn load_next_unit(&mut self) {
        let s = self.scale;
        self.stage = match self.stage {
            LoadStage::Fixed => {
                self.load_fixed();
                LoadStage::Items
            }
            LoadStage::Items => {
                self.load_items();
                LoadStage::Warehouse(1)
            }
            LoadStage::Warehouse(w) => {
                self.load_warehouse(w);
                LoadStage::District(w, 1)
            }
            LoadStage::District(w, d) => {
                self.load_district(w, d);
                if d < s.districts_per_warehouse {
                    LoadStage::District(w, d + 1)
                } else if w < s.warehouses {
                    LoadStage::Warehouse(w + 1)
                } else {
                    LoadStage::Done
                }
            }
            LoadStage::Done => LoadStage::Done,
        };
    }
}

impl ChGen {
    pub fn new(scale: ChScale, seed: u64) -> Self {
        scale.check();
        let districts = (scale.warehouses * scale.districts_per_warehouse) as usize;
        ChGen {
            scale,
            load_rng: SmallRng::seed_from_u64(seed),
            // A separate stream keeps the load's rows the same however the stream is drawn.
            rng: SmallRng::seed_from_u64(seed ^ 0x9e37_79b9_7f4a_7c15),
            stage: LoadStage::Fixed,
            queue: VecDeque::new(),
            model: Model {
                warehouses: Vec::with_capacity(scale.warehouses as usize),
                districts: Vec::with_capacity(districts),
                customers: Vec::with_capacity(districts * scale.customers_per_district as usize),
                stock: Vec::with_capacity((scale.warehouses * scale.items) as usize),
                item_prices: Vec::with_capacity(scale.items as usize),
                undelivered: (0..districts).map(|_| VecDeque::new()).collect(),
                next_h_id: 1,
            },
            delivery: None,
            counts: TxnCounts::default(),
        }
    }

    pub fn scale(&self) -> &ChScale {
        &self.scale
    }

    pub fn counts(&self) -> TxnCounts {
        self.counts
    }

    fn district_index(&self, w: i64, d: i64) -> usize {
        ((w - 1) * self.scale.districts_per_warehouse + d - 1) as usize
    }

    fn customer_index(&self, w: i64, d: i64, c: i64) -> usize {
        self.district_index(w, d) * self.scale.customers_per_district as usize + (c - 1) as usize
    }

    fn stock_index(&self, w: i64, i: i64) -> usize {
        ((w - 1) * self.scale.items + i - 1) as usize
    }

    // ---- The initial load ----

    /// The next transaction of the initial load: up to `rows_per_txn` inserts (region, nation,
    /// supplier and item first, then warehouse by warehouse: warehouse, stock, districts, and
    /// per district customers, history, orders, order lines, new orders). `None` once the
    /// load is complete.
    pub fn next_load_txn(&mut self, rows_per_txn: usize) -> Option<Txn> {
        QueuedLoad::next_load_txn(self, rows_per_txn)
    }

    /// The whole initial load, in transactions of `rows_per_txn` inserts.
    pub fn load(&mut self, rows_per_txn: usize) -> Vec<Txn> {
        QueuedLoad::load(self, rows_per_txn)
    }

    fn load_fixed(&mut self) {
        let rng = &mut self.load_rng;
        let fresh = Value::Timestamp(LOAD_US);
        for (r, name) in REGION_NAMES.iter().enumerate() {
            self.queue.push_back(insert(
                table::REGION,
                vec![
                    Value::Int(r as i64),
                    Value::Utf8((*name).into()),
                    Value::Utf8(astring(rng, 31, 115)),
                    fresh.clone(),
                ],
            ));
        }
        for n in 0..NATIONS {
            let (name, region) = match NATION_NAMES.get(n as usize) {
                Some(&(name, region)) => (name.to_owned(), region),
                None => (format!("NATION_{n:02}"), n % REGIONS),
            };
            self.queue.push_back(insert(
                table::NATION,
                vec![
                    Value::Int(n),
                    Value::Utf8(name),
                    Value::Int(region),
                    Value::Utf8(astring(rng, 31, 114)),
                    fresh.clone(),
                ],
            ));
        }
        for su in 0..self.scale.suppliers {
            let nation = rng.random_range(0..NATIONS);
            self.queue.push_back(insert(
                table::SUPPLIER,
                vec![
                    Value::Int(su),
                    Value::Utf8(format!("Supplier#{su:09}")),
                    Value::Utf8(astring(rng, 10, 40)),
                    Value::Int(nation),
                    Value::Utf8(format!(
                        "{}-{}-{}-{}",
                        nation + 10,
                        nstring(rng, 3, 3),
                        nstring(rng, 3, 3),
                        nstring(rng, 4, 4)
                    )),
                    Value::Decimal(rng.random_range(-99_999..=999_999)),
                    Value::Utf8(astring(rng, 25, 100)),
                    fresh.clone(),
                ],
            ));
        }
    }

    fn load_items(&mut self) {
        let rng = &mut self.load_rng;
        for i in 1..=self.scale.items {
            let price = rng.random_range(100..=10_000i128);
            self.model.item_prices.push(price);
            self.queue.push_back(insert(
                table::ITEM,
                vec![
                    Value::Int(i),
                    Value::Int(rng.random_range(1..=10_000)),
                    Value::Utf8(astring(rng, 14, 24)),
                    Value::Decimal(price),
                    Value::Utf8(data_original(rng)),
                    Value::Timestamp(LOAD_US),
                ],
            ));
        }
    }

    fn load_warehouse(&mut self, w: i64) {
        let rng = &mut self.load_rng;
        let fresh = Value::Timestamp(LOAD_US);
        let mut row = vec![Value::Int(w)];
        row.extend(name_address_tax(rng));
        row.extend([Value::Decimal(30_000_000), fresh.clone()]);
        self.model.warehouses.push(row.clone());
        self.queue.push_back(insert(table::WAREHOUSE, row));
        for i in 1..=self.scale.items {
            let mut row = vec![
                Value::Int(i),
                Value::Int(w),
                Value::Int(rng.random_range(10..=100)),
            ];
            row.extend((0..10).map(|_| Value::Utf8(astring(rng, 24, 24))));
            row.extend([
                Value::Int(0),
                Value::Int(0),
                Value::Int(0),
                Value::Utf8(data_original(rng)),
                fresh.clone(),
            ]);
            self.model.stock.push(row.clone());
            self.queue.push_back(insert(table::STOCK, row));
        }
        for d in 1..=self.scale.districts_per_warehouse {
            let mut row = vec![Value::Int(d), Value::Int(w)];
            row.extend(name_address_tax(rng));
            row.extend([
                Value::Decimal(3_000_000),
                Value::Int(self.scale.orders_per_district + 1),
                fresh.clone(),
            ]);
            self.model.districts.push(row.clone());
            self.queue.push_back(insert(table::DISTRICT, row));
        }
    }

    fn load_district(&mut self, w: i64, d: i64) {
        let s = self.scale;
        let di = self.district_index(w, d);
        let rng = &mut self.load_rng;
        let fresh = Value::Timestamp(LOAD_US);
        for c in 1..=s.customers_per_district {
            let last = if c <= 1000 {
                c - 1
            } else {
                nurand(rng, 255, 0, 999)
            };
            let credit = if rng.random_range(0..10) == 0 {
                "BC"
            } else {
                "GC"
            };
            let mut row = vec![
                Value::Int(c),
                Value::Int(d),
                Value::Int(w),
                Value::Utf8(astring(rng, 8, 16)),
                Value::Utf8("OE".into()),
                Value::Utf8(last_name(last)),
            ];
            row.extend(address(rng));
            row.extend([
                Value::Utf8(nstring(rng, 16, 16)),
                Value::Timestamp(LOAD_US),
                Value::Utf8(credit.into()),
                Value::Decimal(5_000_000),
                Value::Decimal(rng.random_range(0..=5000)),
                Value::Decimal(-1000),
                Value::Decimal(1000),
                Value::Int(1),
                Value::Int(0),
                Value::Utf8(astring(rng, 300, 500)),
                fresh.clone(),
            ]);
            self.model.customers.push(row.clone());
            self.queue.push_back(insert(table::CUSTOMER, row));
            let h_id = self.model.next_h_id;
            self.model.next_h_id += 1;
            self.queue.push_back(insert(
                table::HISTORY,
                vec![
                    Value::Int(h_id),
                    Value::Int(c),
                    Value::Int(d),
                    Value::Int(w),
                    Value::Int(d),
                    Value::Int(w),
                    Value::Timestamp(LOAD_US),
                    Value::Decimal(1000),
                    Value::Utf8(astring(rng, 12, 24)),
                    fresh.clone(),
                ],
            ));
        }
        let mut customers: Vec<i64> = (1..=s.customers_per_district).collect();
        customers.shuffle(rng);
        let first_undelivered = s.orders_per_district - s.undelivered_per_district + 1;
        for (o, &c) in (1..=s.orders_per_district).zip(&customers) {
            let delivered = o < first_undelivered;
            let ol_cnt = rng.random_range(5..=15);
            let order = vec![
                Value::Int(o),
                Value::Int(d),
                Value::Int(w),
                Value::Int(c),
                Value::Timestamp(LOAD_US),
                if delivered {
                    Value::Int(rng.random_range(1..=10))
                } else {
                    Value::Null
                },
                Value::Int(ol_cnt),
                Value::Int(1),
                fresh.clone(),
            ];
            self.queue.push_back(insert(table::ORDERS, order.clone()));
            let mut lines = Vec::with_capacity(ol_cnt as usize);
            for n in 1..=ol_cnt {
                let line = vec![
                    Value::Int(o),
                    Value::Int(d),
                    Value::Int(w),
                    Value::Int(n),
                    Value::Int(rng.random_range(1..=s.items)),
                    Value::Int(w),
                    if delivered {
                        Value::Timestamp(LOAD_US)
                    } else {
                        Value::Null
                    },
                    Value::Int(5),
                    Value::Decimal(if delivered {
                        0
                    } else {
                        rng.random_range(1..=999_999)
                    }),
                    Value::Utf8(astring(rng, 24, 24)),
                    fresh.clone(),
                ];
                self.queue.push_back(insert(table::ORDERLINE, line.clone()));
                if !delivered {
                    lines.push(line);
                }
            }
            if !delivered {
                let new_order = vec![Value::Int(o), Value::Int(d), Value::Int(w), fresh.clone()];
                self.queue
                    .push_back(insert(table::NEWORDER, new_order.clone()));
                self.model.undelivered[di].push_back(OpenOrder {
                    new_order,
                    order,
                    lines,
                });
            }
        }
    }

    // ---- The change stream ----

    /// The next transaction of the change stream, its `fresh_ts` (and every date it writes)
    /// `now_us`. Never empty: rolled-back NewOrders and Delivery's empty districts emit
    /// nothing and the next draw is taken. The rest of the load, if it was not drained, is
    /// generated (and dropped) first, since the stream updates the load's rows.
    pub fn next_txn(&mut self, now_us: i64) -> Txn {
        self.finish_load();
        loop {
            if let Some(delivery) = self.delivery {
                if let Some(txn) = self.delivery_district(delivery, now_us) {
                    return txn;
                }
                continue;
            }
            let total: u32 = WEIGHTS.iter().sum();
            let draw = self.rng.random_range(0..total);
            let kind = if draw < WEIGHTS[0] {
                TxnKind::NewOrder
            } else if draw < WEIGHTS[0] + WEIGHTS[1] {
                TxnKind::Payment
            } else {
                TxnKind::Delivery
            };
            match kind {
                TxnKind::NewOrder => {
                    if let Some(txn) = self.new_order(now_us) {
                        return txn;
                    }
                }
                TxnKind::Payment => return self.payment(now_us),
                TxnKind::Delivery => {
                    self.counts.deliveries += 1;
                    self.delivery = Some(PendingDelivery {
                        w: self.rng.random_range(1..=self.scale.warehouses),
                        carrier: self.rng.random_range(1..=10),
                        next_d: 1,
                    });
                }
            }
        }
    }

    /// `n` stream transactions stamped by `clock`.
    pub fn stream(&mut self, n: usize, clock: &mut FreshClock) -> Vec<Txn> {
        (0..n).map(|_| self.next_txn(clock.now_us())).collect()
    }

    /// A warehouse other than `w` (for remote stock and remote customers), or `w` when it is
    /// the only one.
    fn other_warehouse(&mut self, w: i64) -> i64 {
        if self.scale.warehouses == 1 {
            return w;
        }
        let o = self.rng.random_range(1..self.scale.warehouses);
        if o >= w { o + 1 } else { o }
    }

    /// TPC-C NewOrder: the district's next order id, the order, its new-order row, 5..=15
    /// order lines and each line's stock. 1% roll back (`None`).
    fn new_order(&mut self, now_us: i64) -> Option<Txn> {
        let s = self.scale;
        let w = self.rng.random_range(1..=s.warehouses);
        let d = self.rng.random_range(1..=s.districts_per_warehouse);
        let c = nurand(&mut self.rng, 1023, 1, s.customers_per_district);
        let ol_cnt = self.rng.random_range(5..=15usize);
        let rollback = self.rng.random_range(1..=100) == 1;
        let mut lines = Vec::with_capacity(ol_cnt);
        while lines.len() < ol_cnt {
            let i = nurand(&mut self.rng, 8191, 1, s.items);
            if lines.iter().any(|&(item, _, _)| item == i) {
                continue;
            }
            let supply = if self.rng.random_range(0..100) == 0 {
                self.other_warehouse(w)
            } else {
                w
            };
            lines.push((i, supply, self.rng.random_range(1..=10i64)));
        }
        self.counts.new_orders += 1;
        if rollback {
            // TPC-C's unused item id: the transaction aborts and nothing reaches the log.
            self.counts.rolled_back += 1;
            return None;
        }
        let fresh = Value::Timestamp(now_us);
        let di = self.district_index(w, d);
        let mut ops = Vec::with_capacity(3 + 2 * ol_cnt);

        let before = self.model.districts[di].clone();
        let o = int(&before[col::D_NEXT_O_ID]);
        let after = &mut self.model.districts[di];
        after[col::D_NEXT_O_ID] = Value::Int(o + 1);
        after[col::D_FRESH] = fresh.clone();
        ops.push(update(table::DISTRICT, before, after.clone()));

        let all_local = lines.iter().all(|&(_, supply, _)| supply == w);
        let order = vec![
            Value::Int(o),
            Value::Int(d),
            Value::Int(w),
            Value::Int(c),
            Value::Timestamp(now_us),
            Value::Null,
            Value::Int(ol_cnt as i64),
            Value::Int(i64::from(all_local)),
            fresh.clone(),
        ];
        ops.push(insert(table::ORDERS, order.clone()));
        let new_order = vec![Value::Int(o), Value::Int(d), Value::Int(w), fresh.clone()];
        ops.push(insert(table::NEWORDER, new_order.clone()));

        let mut order_lines = Vec::with_capacity(ol_cnt);
        for (n, &(i, supply, qty)) in lines.iter().enumerate() {
            let si = self.stock_index(supply, i);
            let before = self.model.stock[si].clone();
            let after = &mut self.model.stock[si];
            let q = int(&before[col::S_QUANTITY]);
            after[col::S_QUANTITY] = Value::Int(if q >= qty + 10 { q - qty } else { q - qty + 91 });
            after[col::S_YTD] = Value::Int(int(&before[col::S_YTD]) + qty);
            after[col::S_ORDER_CNT] = Value::Int(int(&before[col::S_ORDER_CNT]) + 1);
            if supply != w {
                after[col::S_REMOTE_CNT] = Value::Int(int(&before[col::S_REMOTE_CNT]) + 1);
            }
            after[col::S_FRESH] = fresh.clone();
            let dist_info = after[col::S_DIST_01 + (d as usize - 1) % 10].clone();
            ops.push(update(table::STOCK, before, after.clone()));

            let line = vec![
                Value::Int(o),
                Value::Int(d),
                Value::Int(w),
                Value::Int(n as i64 + 1),
                Value::Int(i),
                Value::Int(supply),
                Value::Null,
                Value::Int(qty),
                Value::Decimal(i128::from(qty) * self.model.item_prices[(i - 1) as usize]),
                dist_info,
                fresh.clone(),
            ];
            ops.push(insert(table::ORDERLINE, line.clone()));
            order_lines.push(line);
        }
        self.model.undelivered[di].push_back(OpenOrder {
            new_order,
            order,
            lines: order_lines,
        });
        Some(ops)
    }

    /// TPC-C Payment: the warehouse's and district's year-to-date, the customer's balance
    /// (and `c_data` for bad credit), a history row. 15% of customers are remote. Customers
    /// are picked by NURand id (TPC-C picks 60% by last name; the rows written are alike).
    fn payment(&mut self, now_us: i64) -> Txn {
        let s = self.scale;
        self.counts.payments += 1;
        let w = self.rng.random_range(1..=s.warehouses);
        let d = self.rng.random_range(1..=s.districts_per_warehouse);
        let (c_w, c_d) = if self.rng.random_range(0..100) < 85 {
            (w, d)
        } else {
            let c_w = self.other_warehouse(w);
            (c_w, self.rng.random_range(1..=s.districts_per_warehouse))
        };
        let c = nurand(&mut self.rng, 1023, 1, s.customers_per_district);
        let amount = self.rng.random_range(100..=500_000i128);
        let fresh = Value::Timestamp(now_us);
        let mut ops = Vec::with_capacity(4);

        let before = self.model.warehouses[(w - 1) as usize].clone();
        let after = &mut self.model.warehouses[(w - 1) as usize];
        after[col::W_YTD] = Value::Decimal(decimal(&before[col::W_YTD]) + amount);
        after[col::W_FRESH] = fresh.clone();
        let w_name = after[col::W_NAME].clone();
        ops.push(update(table::WAREHOUSE, before, after.clone()));

        let di = self.district_index(w, d);
        let before = self.model.districts[di].clone();
        let after = &mut self.model.districts[di];
        after[col::D_YTD] = Value::Decimal(decimal(&before[col::D_YTD]) + amount);
        after[col::D_FRESH] = fresh.clone();
        let d_name = after[col::D_NAME].clone();
        ops.push(update(table::DISTRICT, before, after.clone()));

        let ci = self.customer_index(c_w, c_d, c);
        let before = self.model.customers[ci].clone();
        let after = &mut self.model.customers[ci];
        after[col::C_BALANCE] = Value::Decimal(decimal(&before[col::C_BALANCE]) - amount);
        after[col::C_YTD_PAYMENT] = Value::Decimal(decimal(&before[col::C_YTD_PAYMENT]) + amount);
        after[col::C_PAYMENT_CNT] = Value::Int(int(&before[col::C_PAYMENT_CNT]) + 1);
        if before[col::C_CREDIT] == Value::Utf8("BC".into())
            && let Value::Utf8(data) = &before[col::C_DATA]
        {
            let mut new = format!(
                "{c} {c_d} {c_w} {d} {w} {}.{:02} {data}",
                amount / 100,
                amount % 100
            );
            new.truncate(500);
            after[col::C_DATA] = Value::Utf8(new);
        }
        after[col::C_FRESH] = fresh.clone();
        ops.push(update(table::CUSTOMER, before, after.clone()));

        let (Value::Utf8(w_name), Value::Utf8(d_name)) = (w_name, d_name) else {
            unreachable!("names are strings");
        };
        let h_id = self.model.next_h_id;
        self.model.next_h_id += 1;
        ops.push(insert(
            table::HISTORY,
            vec![
                Value::Int(h_id),
                Value::Int(c),
                Value::Int(c_d),
                Value::Int(c_w),
                Value::Int(d),
                Value::Int(w),
                Value::Timestamp(now_us),
                Value::Decimal(amount),
                Value::Utf8(format!("{w_name}    {d_name}")),
                fresh,
            ],
        ));
        ops
    }

    /// One district of a TPC-C Delivery: its oldest new order deleted, the order's carrier
    /// set, its lines' delivery date set, the customer's balance and delivery count raised.
    /// `None` for a district with no undelivered order, which TPC-C skips.
    fn delivery_district(&mut self, delivery: PendingDelivery, now_us: i64) -> Option<Txn> {
        let PendingDelivery { w, carrier, next_d } = delivery;
        let d = next_d;
        self.delivery = (d < self.scale.districts_per_warehouse).then_some(PendingDelivery {
            next_d: d + 1,
            ..delivery
        });
        let di = self.district_index(w, d);
        let Some(open) = self.model.undelivered[di].pop_front() else {
            self.counts.districts_skipped += 1;
            return None;
        };
        self.counts.delivery_txns += 1;
        let fresh = Value::Timestamp(now_us);
        let mut ops = Vec::with_capacity(3 + open.lines.len());
        ops.push(TableOp {
            table: table::NEWORDER,
            op: RowOp::Delete(open.new_order),
        });
        let mut order = open.order.clone();
        order[col::O_CARRIER_ID] = Value::Int(carrier);
        order[col::O_FRESH] = fresh.clone();
        let c = int(&order[col::O_C_ID]);
        ops.push(update(table::ORDERS, open.order, order));
        let mut total = 0i128;
        for before in open.lines {
            let mut after = before.clone();
            total += decimal(&before[col::OL_AMOUNT]);
            after[col::OL_DELIVERY_D] = Value::Timestamp(now_us);
            after[col::OL_FRESH] = fresh.clone();
            ops.push(update(table::ORDERLINE, before, after));
        }
        let ci = self.customer_index(w, d, c);
        let before = self.model.customers[ci].clone();
        let after = &mut self.model.customers[ci];
        after[col::C_BALANCE] = Value::Decimal(decimal(&before[col::C_BALANCE]) + total);
        after[col::C_DELIVERY_CNT] = Value::Int(int(&before[col::C_DELIVERY_CNT]) + 1);
        after[col::C_FRESH] = fresh;
        ops.push(update(table::CUSTOMER, before, after.clone()));
        Some(ops)
    }
}

/// The initial load and `stream_txns` stream transactions, stamped by a logical clock.
pub struct ChWorkload {
    pub load: Vec<Txn>,
    pub stream: Vec<Txn>,
    pub counts: TxnCounts,
}

/// Rows per initial-load transaction by default.
pub const LOAD_ROWS_PER_TXN: usize = 1000;

/// Generates the load (transactions of [`LOAD_ROWS_PER_TXN`] rows) and `stream_txns` stream
/// transactions with [`FreshClock::logical`]: the same bytes for the same arguments.
pub fn generate(scale: ChScale, seed: u64, stream_txns: usize) -> ChWorkload {
    let mut chgen = ChGen::new(scale, seed);
    let load = chgen.load(LOAD_ROWS_PER_TXN);
    let stream = chgen.stream(stream_txns, &mut FreshClock::logical());
    ChWorkload {
        load,
        stream,
        counts: chgen.counts(),
    }
}

impl ChWorkload {
    /// Debezium JSON lines: the load as snapshot reads (`r`) and then the stream, every
    /// transaction between BEGIN and END, ids counting from 1 across both.
    pub fn write_debezium(&self, out: &mut impl Write) -> std::io::Result<()> {
        write_load_and_stream(
            DebeziumWriter::new(schemas()),
            out,
            &self.load,
            &self.stream,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_positions_match_the_schemas() {
        let s = schemas();
        let at = |t: retina_storage::TableId, name: &str| s[t as usize].column_index(name).unwrap();
        assert_eq!(at(table::WAREHOUSE, "w_name"), col::W_NAME);
        assert_eq!(at(table::WAREHOUSE, "w_ytd"), col::W_YTD);
        assert_eq!(at(table::WAREHOUSE, "fresh_ts"), col::W_FRESH);
        assert_eq!(at(table::DISTRICT, "d_name"), col::D_NAME);
        assert_eq!(at(table::DISTRICT, "d_ytd"), col::D_YTD);
        assert_eq!(at(table::DISTRICT, "d_next_o_id"), col::D_NEXT_O_ID);
        assert_eq!(at(table::DISTRICT, "fresh_ts"), col::D_FRESH);
        assert_eq!(at(table::CUSTOMER, "c_credit"), col::C_CREDIT);
        assert_eq!(at(table::CUSTOMER, "c_balance"), col::C_BALANCE);
        assert_eq!(at(table::CUSTOMER, "c_ytd_payment"), col::C_YTD_PAYMENT);
        assert_eq!(at(table::CUSTOMER, "c_payment_cnt"), col::C_PAYMENT_CNT);
        assert_eq!(at(table::CUSTOMER, "c_delivery_cnt"), col::C_DELIVERY_CNT);
        assert_eq!(at(table::CUSTOMER, "c_data"), col::C_DATA);
        assert_eq!(at(table::CUSTOMER, "fresh_ts"), col::C_FRESH);
        assert_eq!(at(table::ORDERS, "o_c_id"), col::O_C_ID);
        assert_eq!(at(table::ORDERS, "o_carrier_id"), col::O_CARRIER_ID);
        assert_eq!(at(table::ORDERS, "fresh_ts"), col::O_FRESH);
        assert_eq!(at(table::ORDERLINE, "ol_delivery_d"), col::OL_DELIVERY_D);
        assert_eq!(at(table::ORDERLINE, "ol_amount"), col::OL_AMOUNT);
        assert_eq!(at(table::ORDERLINE, "fresh_ts"), col::OL_FRESH);
        assert_eq!(at(table::STOCK, "s_quantity"), col::S_QUANTITY);
        assert_eq!(at(table::STOCK, "s_dist_01"), col::S_DIST_01);
        assert_eq!(at(table::STOCK, "s_ytd"), col::S_YTD);
        assert_eq!(at(table::STOCK, "s_order_cnt"), col::S_ORDER_CNT);
        assert_eq!(at(table::STOCK, "s_remote_cnt"), col::S_REMOTE_CNT);
        assert_eq!(at(table::STOCK, "fresh_ts"), col::S_FRESH);
        let names: Vec<_> = s.iter().map(|t| t.name()).collect();
        assert_eq!(
            names,
            [
                "warehouse",
                "district",
                "customer",
                "history",
                "neworder",
                "orders",
                "orderline",
                "stock",
                "item",
                "supplier",
                "nation",
                "region"
            ]
        );
        assert_eq!(s.len(), table::COUNT);
    }

    #[test]
    fn last_names_follow_tpcc() {
        assert_eq!(last_name(0), "BARBARBAR");
        assert_eq!(last_name(371), "PRICALLYOUGHT");
    }
}
