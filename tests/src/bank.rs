//! The bank workload of the replay tests: two tables (accounts, transfers) and a seeded
//! Debezium stream over them (inserts, transfers that update two accounts, key-changing
//! updates, deletes, events out of order, redelivered transactions), with the model after it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use retina_node::node::Node;
use retina_storage::{ColumnType, Value, batch_rows};

use crate::cdc::{Change, Kind, Model, Row, Table, V, Writer};

/// The catalog of the bank workload.
pub const DDL: &str = "
CREATE TABLE bank.accounts (
    id INT PRIMARY KEY, owner VARCHAR(20), balance DECIMAL(12,2) NOT NULL,
    opened DATE, updated TIMESTAMP);
CREATE TABLE bank.transfers (
    id BIGINT, src INT NOT NULL, dst INT NOT NULL, amount DECIMAL(12,2) NOT NULL,
    at TIMESTAMP, PRIMARY KEY (id));";

/// The bank workload's tables, as the stream writer and the model see them.
pub fn tables() -> Vec<Table> {
    vec![
        Table {
            schema: "bank",
            name: "accounts",
            columns: vec![
                ("id", Kind::Int),
                ("owner", Kind::Text),
                ("balance", Kind::Money),
                ("opened", Kind::Date),
                ("updated", Kind::Time),
            ],
            key: 1,
        },
        Table {
            schema: "bank",
            name: "transfers",
            columns: vec![
                ("id", Kind::BigInt),
                ("src", Kind::Int),
                ("dst", Kind::Int),
                ("amount", Kind::Money),
                ("at", Kind::Time),
            ],
            key: 1,
        },
    ]
}

/// A seeded stream of bank transactions, and the model after it.
pub fn generate(seed: u64, txns: usize, path: &Path) -> Model {
    let tables = tables();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut model = Model::new(2);
    let mut writer = Writer {
        out: BufWriter::new(File::create(path).unwrap()),
        tables: &tables,
    };
    let mut next_account = 1i64;
    let mut next_transfer = 1i64;
    let mut written: Vec<(String, Vec<Change>)> = Vec::new();
    let now = 1_767_225_600_000_000i64;
    for n in 0..txns {
        let accounts: Vec<Row> = model.tables[0].values().cloned().collect();
        let mut changes = Vec::new();
        let roll = rng.random_range(0..100);
        if accounts.len() < 4 || roll < 20 {
            for _ in 0..rng.random_range(1..=3) {
                let owner = if rng.random_bool(0.2) {
                    V::Null
                } else {
                    V::S(format!("owner-{next_account}"))
                };
                changes.push(Change::Insert(
                    0,
                    vec![
                        V::I(next_account),
                        owner,
                        V::I(rng.random_range(-5_000..1_000_000)),
                        V::I(rng.random_range(15_000..21_000)),
                        V::I(now + n as i64 * 1_000_003),
                    ],
                ));
                next_account += 1;
            }
        } else if roll < 75 {
            // Move money between two accounts: the total never changes.
            let mut pick = accounts.clone();
            pick.shuffle(&mut rng);
            let (a, b) = (&pick[0], &pick[1]);
            let amount = rng.random_range(1..50_000);
            let moved = |r: &Row, d: i64| {
                let mut r = r.clone();
                if let V::I(c) = r[2] {
                    r[2] = V::I(c + d)
                }
                r[4] = V::I(now + n as i64 * 1_000_003);
                r
            };
            changes.push(Change::Update(0, a.clone(), moved(a, -amount)));
            changes.push(Change::Update(0, b.clone(), moved(b, amount)));
            changes.push(Change::Insert(
                1,
                vec![
                    V::I(next_transfer),
                    a[0].clone(),
                    b[0].clone(),
                    V::I(amount),
                    V::I(now + n as i64),
                ],
            ));
            next_transfer += 1;
        } else if roll < 88 {
            // Renumber an account: an update that changes the key, often across shards.
            let a = &accounts[rng.random_range(0..accounts.len())];
            let mut after = a.clone();
            after[0] = V::I(next_account);
            next_account += 1;
            changes.push(Change::Update(0, a.clone(), after));
        } else if roll < 95 {
            let a = &accounts[rng.random_range(0..accounts.len())];
            // A delete's before-image may carry only the key.
            let mut key_only = a.clone();
            if rng.random_bool(0.5) {
                for v in &mut key_only[1..] {
                    *v = V::Null;
                }
            }
            changes.push(Change::Delete(0, key_only));
        } else {
            let transfers: Vec<Row> = model.tables[1].values().cloned().collect();
            if let Some(t) = transfers.first() {
                changes.push(Change::Delete(1, t.clone()));
            } else {
                continue;
            }
        }
        let id = format!("tx-{n}");
        let mut order: Vec<usize> = (0..changes.len()).collect();
        if rng.random_bool(0.3) {
            order.shuffle(&mut rng);
        }
        writer.txn(&id, &changes, rng.random_bool(0.5), &order);
        model.apply(&changes, &tables);
        written.push((id, changes));
        // Now and then the connector sends a transaction again (a restart): skipped.
        if rng.random_bool(0.03) {
            let (id, changes) = &written[rng.random_range(0..written.len())];
            let order: Vec<usize> = (0..changes.len()).collect();
            writer.txn(id, changes, false, &order);
        }
    }
    model
}

/// The visible rows of every table at the node's snapshot, as model rows.
pub fn visible(node: &Node) -> Vec<BTreeMap<Row, Row>> {
    let h = node.handle();
    // A query holds LWM at its snapshot, so memory GC (running every few milliseconds here)
    // cannot fold the bitmaps it reads.
    let (query, snapshot) = h.begin_query().unwrap();
    let tables = tables();
    let out = (0..2u32)
        .map(|t| {
            let schema = h.catalog().get(t).unwrap();
            let mut types: Vec<ColumnType> = schema.columns().iter().map(|c| c.ty).collect();
            types.push(ColumnType::Int64);
            let mut rows = BTreeMap::new();
            for b in h.read_table(t, snapshot).unwrap() {
                for r in batch_rows(&b, &types) {
                    let row: Row = r[..r.len() - 1]
                        .iter()
                        .map(|v| match v {
                            Value::Null => V::Null,
                            Value::Int(i) | Value::Timestamp(i) => V::I(*i),
                            Value::Decimal(d) => V::I(*d as i64),
                            Value::Date(d) => V::I(i64::from(*d)),
                            Value::Utf8(s) => V::S(s.clone()),
                            other => panic!("unexpected {other:?}"),
                        })
                        .collect();
                    let key = row[..tables[t as usize].key].to_vec();
                    assert!(rows.insert(key, row).is_none(), "a key is visible twice");
                }
            }
            rows
        })
        .collect();
    h.end_query(query);
    out
}
