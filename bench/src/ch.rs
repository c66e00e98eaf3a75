//! CH-benCHmark (TPC-C) shaped data. Deterministic from a seed.

use std::sync::Arc;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use retina_storage::{ColumnDef, ColumnType, TableSchema, Value};

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
}
