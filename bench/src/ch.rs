//! CH-benCHmark (TPC-C) shaped data. Deterministic from a seed.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_storage::{ColumnDef, ColumnType, RowOp, TableOp, TableSchema, Value};

use crate::workload::{DebeziumWriter, InsertOp};

/// TPC-C's `order_line` with CH-benCHmark's `fresh_ts`.
pub fn orderline_schema() -> Arc<TableSchema> {
    use ColumnType::*;
    let c = |n: &str, t, null| ColumnDef::new(n, t, null);
    TableSchema::new(
        "orderline",
        vec![
            c("ol_o_id", Int32, false),
            c("ol_d_id", Int32, false),
            c("ol_w_id", Int32, false),
            c("ol_number", Int32, false),
            c("ol_i_id", Int32, false),
            c("ol_supply_w_id", Int32, false),
            c("ol_delivery_d", Timestamp, true),
            c("ol_quantity", Int32, false),
            c(
                "ol_amount",
                Decimal {
                    precision: 6,
                    scale: 2,
                },
                false,
            ),
            c("ol_dist_info", Utf8, false),
            c("fresh_ts", Timestamp, false),
        ],
        &["ol_w_id", "ol_d_id", "ol_o_id", "ol_number"],
    )
    .expect("the orderline schema is valid")
}

/// TPC-C's NURand(A, x, y) with a fixed C.
pub fn nurand(rng: &mut SmallRng, a: i64, x: i64, y: i64) -> i64 {
    const C: i64 = 259;
    (((rng.random_range(0..=a) | rng.random_range(x..=y)) + C) % (y - x + 1)) + x
}

/// Order lines in key order: `warehouses` x 10 districts x orders x 5..=15 lines.
pub struct OrderLines {
    rng: SmallRng,
    warehouses: i64,
    w: i64,
    d: i64,
    o: i64,
    line: i64,
    lines: i64,
    now_us: i64,
}

impl OrderLines {
    pub fn new(seed: u64, warehouses: i64) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let lines = rng.random_range(5..=15);
        OrderLines {
            rng,
            warehouses,
            w: 1,
            d: 1,
            o: 1,
            line: 1,
            lines,
            now_us: 1_767_225_600_000_000,
        }
    }
}

impl Iterator for OrderLines {
    type Item = Vec<Value>;

    fn next(&mut self) -> Option<Vec<Value>> {
        let rng = &mut self.rng;
        let dist: String = (0..24)
            .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
            .collect();
        let row = vec![
            Value::Int(self.o),
            Value::Int(self.d),
            Value::Int(self.w),
            Value::Int(self.line),
            Value::Int(nurand(rng, 8191, 1, 100_000)),
            Value::Int(self.w),
            Value::Null,
            Value::Int(5),
            Value::Decimal(rng.random_range(1..=999_999)),
            Value::Utf8(dist),
            Value::Timestamp(self.now_us),
        ];
        self.now_us += 7;
        self.line += 1;
        if self.line > self.lines {
            self.line = 1;
            self.lines = rng.random_range(5..=15);
            self.d += 1;
            if self.d > 10 {
                self.d = 1;
                self.w += 1;
                if self.w > self.warehouses {
                    self.w = 1;
                    self.o += 1;
                }
            }
        }
        Some(row)
    }
}

/// TPC-C's `district`, reduced to what the replay workload updates, with `fresh_ts`.
pub fn district_schema() -> Arc<TableSchema> {
    use ColumnType::*;
    let c = |n: &str, t, null| ColumnDef::new(n, t, null);
    TableSchema::new(
        "district",
        vec![
            c("d_id", Int32, false),
            c("d_w_id", Int32, false),
            c("d_next_o_id", Int32, false),
            c("fresh_ts", Timestamp, false),
        ],
        &["d_w_id", "d_id"],
    )
    .expect("the district schema is valid")
}

/// TPC-C's `stock` with CH-benCHmark's `fresh_ts`.
pub fn stock_schema() -> Arc<TableSchema> {
    use ColumnType::*;
    let c = |n: &str, t, null| ColumnDef::new(n, t, null);
    TableSchema::new(
        "stock",
        vec![
            c("s_i_id", Int32, false),
            c("s_w_id", Int32, false),
            c("s_quantity", Int32, false),
            c(
                "s_ytd",
                Decimal {
                    precision: 8,
                    scale: 2,
                },
                false,
            ),
            c("s_order_cnt", Int32, false),
            c("s_dist_info", Utf8, false),
            c("fresh_ts", Timestamp, false),
        ],
        &["s_w_id", "s_i_id"],
    )
    .expect("the stock schema is valid")
}

/// The DDL of the replay workload's tables, in table-id order: stock (0), orderline (1),
/// district (2, the small table a freshness monitor reads).
pub const REPLAY_DDL: &str = "
CREATE TABLE stock (
    s_i_id INT NOT NULL, s_w_id INT NOT NULL, s_quantity INT NOT NULL, s_ytd DECIMAL(8,2) NOT NULL,
    s_order_cnt INT NOT NULL, s_dist_info CHAR(24) NOT NULL, fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (s_w_id, s_i_id));
CREATE TABLE orderline (
    ol_o_id INT NOT NULL, ol_d_id INT NOT NULL, ol_w_id INT NOT NULL, ol_number INT NOT NULL,
    ol_i_id INT NOT NULL, ol_supply_w_id INT NOT NULL, ol_delivery_d TIMESTAMP,
    ol_quantity INT NOT NULL, ol_amount DECIMAL(6,2) NOT NULL, ol_dist_info CHAR(24) NOT NULL,
    fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number));
CREATE TABLE district (
    d_id INT NOT NULL, d_w_id INT NOT NULL, d_next_o_id INT NOT NULL, fresh_ts TIMESTAMP NOT NULL,
    PRIMARY KEY (d_w_id, d_id));";

/// The `fresh_ts` column of every table of [`REPLAY_DDL`].
pub const REPLAY_FRESH_TS: [usize; 3] = [6, 10, 3];

/// Items per warehouse in TPC-C.
pub const ITEMS: i64 = 100_000;

/// The replay workload: a stock and district load (transactions of 1,000 inserts), then
/// NewOrder-shaped transactions: the district's next order id updated, 5..=15 order lines
/// inserted and as many stock rows updated, items drawn with NURand(8191). Table ids as in
/// [`REPLAY_DDL`].
pub fn replay_workload(
    seed: u64,
    warehouses: i64,
    new_orders: usize,
) -> Vec<Vec<TableOp<Vec<Value>>>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut stock: std::collections::HashMap<(i64, i64), Vec<Value>> = Default::default();
    let mut txns = Vec::new();
    let now = 1_767_225_600_000_000i64;
    let mut load = Vec::new();
    for w in 1..=warehouses {
        for i in 1..=ITEMS {
            let row = vec![
                Value::Int(i),
                Value::Int(w),
                Value::Int(rng.random_range(10..=100)),
                Value::Decimal(0),
                Value::Int(0),
                Value::Utf8(format!("{:024}", i * 7 + w)),
                Value::Timestamp(now),
            ];
            stock.insert((w, i), row.clone());
            load.push(TableOp {
                table: 0,
                op: RowOp::Insert(row),
            });
            if load.len() == 1000 {
                txns.push(std::mem::take(&mut load));
            }
        }
    }
    for w in 1..=warehouses {
        for d in 1..=10 {
            load.push(TableOp {
                table: 2,
                op: RowOp::Insert(district(w, d, 1, now)),
            });
        }
    }
    if !load.is_empty() {
        txns.push(load);
    }
    let mut next_o = vec![[1i64; 10]; warehouses as usize];
    for n in 0..new_orders {
        let w = rng.random_range(1..=warehouses);
        let d = rng.random_range(1..=10i64);
        let o = next_o[(w - 1) as usize][(d - 1) as usize];
        next_o[(w - 1) as usize][(d - 1) as usize] += 1;
        let fresh = Value::Timestamp(now + n as i64 * 1000);
        let lines = rng.random_range(5..=15);
        let mut items = std::collections::BTreeSet::new();
        while items.len() < lines {
            items.insert(nurand(&mut rng, 8191, 1, ITEMS));
        }
        let mut ops = Vec::with_capacity(lines * 2 + 1);
        ops.push(TableOp {
            table: 2,
            op: RowOp::Update {
                before: district(w, d, o, now),
                after: district(w, d, o + 1, now + n as i64 * 1000),
            },
        });
        for (k, &i) in items.iter().enumerate() {
            let qty = rng.random_range(1..=10);
            let before = stock.get(&(w, i)).expect("loaded").clone();
            let mut after = before.clone();
            if let (Value::Int(q), Value::Int(cnt)) = (&before[2], &before[4]) {
                after[2] = Value::Int(if q - qty >= 10 { q - qty } else { q - qty + 91 });
                after[4] = Value::Int(cnt + 1);
            }
            if let Value::Decimal(ytd) = before[3] {
                after[3] = Value::Decimal(ytd + i128::from(qty) * 100);
            }
            after[6] = fresh.clone();
            stock.insert((w, i), after.clone());
            ops.push(TableOp {
                table: 0,
                op: RowOp::Update { before, after },
            });
            ops.push(TableOp {
                table: 1,
                op: RowOp::Insert(vec![
                    Value::Int(o),
                    Value::Int(d),
                    Value::Int(w),
                    Value::Int(k as i64 + 1),
                    Value::Int(i),
                    Value::Int(w),
                    Value::Null,
                    Value::Int(qty),
                    Value::Decimal(rng.random_range(1..=999_999)),
                    Value::Utf8(format!("{:024}", i)),
                    fresh.clone(),
                ]),
            });
        }
        txns.push(ops);
    }
    txns
}

fn district(w: i64, d: i64, next_o: i64, fresh_us: i64) -> Vec<Value> {
    vec![
        Value::Int(d),
        Value::Int(w),
        Value::Int(next_o),
        Value::Timestamp(fresh_us),
    ]
}

/// Writes transactions as Debezium JSON lines, the way a PostgreSQL connector emits them (see
/// [`DebeziumWriter`]: columns in table order, decimals as strings, timestamps as
/// microseconds, BEGIN/END metadata), inserts as created rows.
pub fn write_debezium(
    out: &mut impl std::io::Write,
    schemas: &[Arc<TableSchema>],
    txns: &[Vec<TableOp<Vec<Value>>>],
) -> std::io::Result<()> {
    write_debezium_from(out, schemas, txns, 0)
}

/// [`write_debezium`], the transactions' ids counted from `first` (a stream written in parts
/// keeps its ids unique).
pub fn write_debezium_from(
    out: &mut impl std::io::Write,
    schemas: &[Arc<TableSchema>],
    txns: &[Vec<TableOp<Vec<Value>>>],
    first: usize,
) -> std::io::Result<()> {
    let mut writer = DebeziumWriter::new(schemas.to_vec()).numbered_from(first as u64);
    for txn in txns {
        writer.write_txn(out, txn, InsertOp::Create)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic_and_fit_the_schema() {
        let s = orderline_schema();
        let a: Vec<_> = OrderLines::new(7, 2).take(500).collect();
        let b: Vec<_> = OrderLines::new(7, 2).take(500).collect();
        assert_eq!(a, b);
        for r in &a {
            s.check_row(r).unwrap();
        }
        let mut keys = std::collections::HashSet::new();
        for r in &a {
            let mut k = Vec::new();
            retina_storage::key::encode_key(&s, r, &mut k);
            assert!(keys.insert(k), "keys are unique");
        }
    }

    #[test]
    fn the_replay_workload_is_deterministic_and_applies_cleanly() {
        let a = replay_workload(3, 1, 200);
        assert_eq!(a, replay_workload(3, 1, 200));
        let mut shard = retina_storage::Shard::new(0, Default::default()).unwrap();
        shard.add_table(stock_schema());
        shard.add_table(orderline_schema());
        shard.add_table(district_schema());
        for (i, t) in a.iter().enumerate() {
            let ts = retina_storage::Timestamp::new(i as u64 + 2).unwrap();
            shard.apply(ts, t).unwrap();
        }
        assert_eq!(shard.live_keys(0).unwrap(), ITEMS as usize);
        let mut json = Vec::new();
        write_debezium(
            &mut json,
            &[stock_schema(), orderline_schema(), district_schema()],
            &a[a.len() - 2..],
        )
        .unwrap();
        let text = String::from_utf8(json).unwrap();
        assert!(
            text.starts_with(r#"{"status":"BEGIN","id":"0","#),
            "{}",
            &text[..80]
        );
        // As Debezium writes them: each image's columns in table order.
        let schemas = [stock_schema(), orderline_schema(), district_schema()];
        let mut events = 0;
        for line in text.lines().filter(|l| l.starts_with(r#"{"before":"#)) {
            let event: serde_json::Value = serde_json::from_str(line).unwrap();
            let table = event["source"]["table"].as_str().unwrap();
            let schema = schemas.iter().find(|s| s.name() == table).unwrap();
            // The images, `before` then `after`: a column's first place is in the first one.
            let image = &line[..line.find(r#","source":"#).unwrap()];
            let at: Vec<usize> = schema
                .columns()
                .iter()
                .map(|c| image.find(&format!("\"{}\":", c.name)).unwrap())
                .collect();
            assert!(at.is_sorted(), "{line}");
            events += 1;
        }
        assert!(events > 0);
    }
}
