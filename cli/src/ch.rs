//! The CH-benCHmark datasets by name and the CH queries, for `retina demo` and `retina bench
//! peers`.

use retina_bench::chgen::ChScale;

/// The CH queries `retina demo` runs at the end and `retina bench peers` times, as
/// CH-benCHmark writes them for this schema.
pub(crate) const QUERIES: [(&str, &str); 3] = [
    (
        "CH Q1: delivered order lines by line number",
        "SELECT ol_number, sum(ol_quantity) AS sum_qty, sum(ol_amount) AS sum_amount, \
         avg(ol_quantity) AS avg_qty, avg(ol_amount) AS avg_amount, count(*) AS count_order \
         FROM orderline WHERE ol_delivery_d > TIMESTAMP '2007-01-02 00:00:00' \
         GROUP BY ol_number ORDER BY ol_number",
    ),
    (
        "CH Q6: revenue of order lines of quantity 1 to 100000",
        "SELECT sum(ol_amount) AS revenue FROM orderline \
         WHERE ol_delivery_d >= TIMESTAMP '1999-01-01 00:00:00' \
         AND ol_delivery_d < TIMESTAMP '2120-01-01 00:00:00' \
         AND ol_quantity BETWEEN 1 AND 100000",
    ),
    (
        "CH Q3: the ten undelivered orders of customers in states A* with the highest revenue",
        "SELECT ol_o_id, ol_w_id, ol_d_id, sum(ol_amount) AS revenue, o_entry_d \
         FROM customer, neworder, orders, orderline \
         WHERE c_state LIKE 'A%' AND c_id = o_c_id AND c_w_id = o_w_id AND c_d_id = o_d_id \
         AND no_w_id = o_w_id AND no_d_id = o_d_id AND no_o_id = o_id \
         AND ol_w_id = o_w_id AND ol_d_id = o_d_id AND ol_o_id = o_id \
         GROUP BY ol_o_id, ol_w_id, ol_d_id, o_entry_d \
         ORDER BY revenue DESC, o_entry_d LIMIT 10",
    ),
];

/// The dataset a `--scale` names: `small` (1 warehouse, 300 customers and orders per district,
/// 10,000 items), `tiny` (for tests), `tpcc` (1 warehouse at TPC-C's full size) or `tpcc:N` (N
/// warehouses, 1 to 1000).
pub(crate) fn scale(name: &str) -> anyhow::Result<ChScale> {
    Ok(match name {
        "tiny" => ChScale::tiny(),
        "small" => ChScale {
            customers_per_district: 300,
            orders_per_district: 300,
            undelivered_per_district: 90,
            items: 10_000,
            suppliers: 1000,
            ..ChScale::tpcc(1)
        },
        "tpcc" => ChScale::tpcc(1),
        other => match other.strip_prefix("tpcc:").map(str::parse::<i64>) {
            Some(Ok(w)) if (1..=1000).contains(&w) => ChScale::tpcc(w),
            _ => anyhow::bail!(
                "unknown scale `{other}`: small, tiny, tpcc (1 warehouse) or tpcc:N \
                 (N warehouses, 1 to 1000)"
            ),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_by_name_and_by_warehouses() {
        assert_eq!(scale("tpcc").unwrap().warehouses, 1);
        let four = scale("tpcc:4").unwrap();
        assert_eq!(four.warehouses, 4);
        assert_eq!(
            four.customers_per_district,
            ChScale::tpcc(1).customers_per_district
        );
        for bad in ["tpcc:0", "tpcc:x", "tpcc:", "huge"] {
            let err = scale(bad).unwrap_err().to_string();
            assert!(
                err.contains(&format!("`{bad}`")) && err.contains("tpcc:N"),
                "{err}"
            );
        }
    }
}
