//! The primary index against a `BTreeMap` of versions, and the key encoding's promises:
//! unambiguous (it decodes back) and order-preserving (bytes sort as the values do).

use std::cmp::Ordering;
use std::collections::BTreeMap;

use proptest::prelude::*;
use retina_storage::key::{decode_key, encode_key};
use retina_storage::{ColumnDef, ColumnType, PrimaryIndex, RowId, TableSchema, Timestamp, Value};

#[derive(Clone, Debug)]
enum Op {
    Put { key: u8, advance: u64, row: u64 },
    Tombstone { key: u8, advance: u64 },
    Purge { lag: u64 },
    Lookup { key: u8, lag: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..16, 0u64..3, 0u64..1000).prop_map(|(key, advance, row)| Op::Put { key, advance, row }),
        2 => (0u8..16, 0u64..3).prop_map(|(key, advance)| Op::Tombstone { key, advance }),
        1 => (0u64..10).prop_map(|lag| Op::Purge { lag }),
        4 => (0u8..16, 0u64..30).prop_map(|(key, lag)| Op::Lookup { key, lag }),
    ]
}

fn ts(v: u64) -> Timestamp {
    Timestamp::new(v).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn index_matches_the_model(ops in proptest::collection::vec(op(), 1..300)) {
        let mut ix = PrimaryIndex::new();
        // key -> ts -> row (None = tombstone); the model is never purged.
        let mut model: BTreeMap<Vec<u8>, BTreeMap<u64, Option<u64>>> = BTreeMap::new();
        let mut now = 1u64;
        let mut purged_to = 0u64;
        let lookup = |m: &BTreeMap<Vec<u8>, BTreeMap<u64, Option<u64>>>, k: &[u8], at: u64| {
            m.get(k).and_then(|v| v.range(..=at).next_back()).and_then(|(_, r)| *r)
        };
        for op in ops {
            match op {
                Op::Put { key, advance, row } => {
                    now += advance;
                    ix.put(&[key], ts(now), RowId(row)).unwrap();
                    model.entry(vec![key]).or_default().insert(now, Some(row));
                }
                Op::Tombstone { key, advance } => {
                    now += advance;
                    ix.tombstone(&[key], ts(now)).unwrap();
                    model.entry(vec![key]).or_default().insert(now, None);
                }
                Op::Purge { lag } => {
                    let at = now.saturating_sub(lag).max(1).max(purged_to);
                    ix.purge(ts(at));
                    purged_to = at;
                }
                Op::Lookup { key, lag } => {
                    // Only snapshots at or above the purge watermark are defined.
                    let at = now.saturating_sub(lag).max(1).max(purged_to);
                    prop_assert_eq!(
                        ix.lookup(&[key], ts(at)).map(|r| r.0),
                        lookup(&model, &[key], at)
                    );
                }
            }
            prop_assert_eq!(ix.latest(&[0]).map(|r| r.0), lookup(&model, &[0], u64::MAX >> 12));
        }
        // Writing at an older timestamp than a live key's newest version is refused.
        let live = |v: &BTreeMap<u64, Option<u64>>| v.values().next_back().unwrap().is_some();
        if let Some((k, v)) = model.iter().find(|(_, v)| live(v) && v.keys().any(|&t| t > 1)) {
            let newest = *v.keys().next_back().unwrap();
            prop_assert!(ix.put(k, ts(newest - 1), RowId(0)).is_err());
        }
    }

    #[test]
    fn keys_decode_and_sort_like_values(
        a in any::<(i32, String, i128, i32, i64, bool, f64)>(),
        b in any::<(i32, String, i128, i32, i64, bool, f64)>(),
    ) {
        let schema = key_schema();
        let row = |t: &(i32, String, i128, i32, i64, bool, f64)| {
            let d = t.2 % 10i128.pow(38);
            vec![
                Value::Int(t.0.into()),
                Value::Utf8(t.1.clone()),
                Value::Decimal(d),
                Value::Date(t.3),
                Value::Timestamp(t.4),
                Value::Boolean(t.5),
                Value::Float(t.6),
            ]
        };
        let (ra, rb) = (row(&a), row(&b));
        let (mut ka, mut kb) = (Vec::new(), Vec::new());
        schema.check_row(&ra).unwrap();
        encode_key(&schema, &ra, &mut ka);
        encode_key(&schema, &rb, &mut kb);
        let back = decode_key(&schema, &ka).unwrap();
        prop_assert_eq!(back.len(), ra.len());
        for (x, y) in back.iter().zip(&ra) {
            match (x, y) {
                (Value::Float(p), Value::Float(q)) => prop_assert_eq!(p.to_bits(), q.to_bits()),
                _ => prop_assert_eq!(x, y),
            }
        }
        prop_assert_eq!(ka.cmp(&kb), cmp_rows(&ra, &rb));
    }

    #[test]
    fn string_keys_with_zero_bytes_sort(a in "[\\x00-\\x02a]{0,6}", b in "[\\x00-\\x02a]{0,6}") {
        let schema = TableSchema::new(
            "s",
            vec![
                ColumnDef::new("s", ColumnType::Utf8, false),
                ColumnDef::new("n", ColumnType::Int64, false),
            ],
            &["s", "n"],
        ).unwrap();
        let (ra, rb) = (vec![Value::Utf8(a.clone()), Value::Int(1)], vec![Value::Utf8(b.clone()), Value::Int(0)]);
        let (mut ka, mut kb) = (Vec::new(), Vec::new());
        encode_key(&schema, &ra, &mut ka);
        encode_key(&schema, &rb, &mut kb);
        prop_assert_eq!(ka.cmp(&kb), a.cmp(&b).then(Ordering::Greater));
        prop_assert_eq!(decode_key(&schema, &ka).unwrap(), ra);
    }
}

fn key_schema() -> std::sync::Arc<TableSchema> {
    let cols = vec![
        ColumnDef::new("i", ColumnType::Int32, false),
        ColumnDef::new("s", ColumnType::Utf8, false),
        ColumnDef::new(
            "d",
            ColumnType::Decimal {
                precision: 38,
                scale: 4,
            },
            false,
        ),
        ColumnDef::new("day", ColumnType::Date, false),
        ColumnDef::new("at", ColumnType::Timestamp, false),
        ColumnDef::new("b", ColumnType::Boolean, false),
        ColumnDef::new("f", ColumnType::Float64, false),
    ];
    TableSchema::new("k", cols, &["i", "s", "d", "day", "at", "b", "f"]).unwrap()
}

fn cmp_rows(a: &[Value], b: &[Value]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = match (x, y) {
            (Value::Int(p), Value::Int(q)) => p.cmp(q),
            (Value::Utf8(p), Value::Utf8(q)) => p.as_bytes().cmp(q.as_bytes()),
            (Value::Decimal(p), Value::Decimal(q)) => p.cmp(q),
            (Value::Date(p), Value::Date(q)) => p.cmp(q),
            (Value::Timestamp(p), Value::Timestamp(q)) => p.cmp(q),
            (Value::Boolean(p), Value::Boolean(q)) => p.cmp(q),
            (Value::Float(p), Value::Float(q)) => p.total_cmp(q),
            _ => unreachable!(),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}
