//! A shard with an owner refuses a key routed to another shard, like any other bad operation:
//! the transaction has no effect and its timestamp stays free. Without an owner nothing is
//! checked.

use std::sync::Arc;

use retina_storage::route::{shard_for_key, shard_of};
use retina_storage::{
    ColumnDef, ColumnType, RowOp, Shard, StorageConfig, StorageError, TableOp, TableSchema,
    Timestamp, Value,
};

const SHARDS: u16 = 4;
const ME: u16 = 1;

fn schema() -> Arc<TableSchema> {
    TableSchema::new(
        "accounts",
        vec![
            ColumnDef::new("id", ColumnType::Int64, false),
            ColumnDef::new("balance", ColumnType::Int64, true),
        ],
        &["id"],
    )
    .unwrap()
}

fn row(id: i64, balance: i64) -> Vec<Value> {
    vec![Value::Int(id), Value::Int(balance)]
}

fn ts(v: u64) -> Timestamp {
    Timestamp::new(v).unwrap()
}

/// The first `n` ids whose keys route to shard `ME` (`mine`) and to another shard.
fn ids(schema: &TableSchema, n: usize, mine: bool) -> Vec<i64> {
    let mut scratch = Vec::new();
    (0..)
        .filter(|&id| (shard_of(schema, &row(id, 0), SHARDS, &mut scratch) == ME) == mine)
        .take(n)
        .collect()
}

fn op(table: u32, op: RowOp<Vec<Value>>) -> TableOp<Vec<Value>> {
    TableOp { table, op }
}

#[test]
fn shard_of_a_row_is_shard_for_its_encoded_key() {
    let schema = schema();
    let mut key = Vec::new();
    let mut scratch = Vec::new();
    for id in [0i64, 1, -7, 1 << 40] {
        key.clear();
        retina_storage::key::encode_key(&schema, &row(id, 0), &mut key);
        assert_eq!(
            shard_of(&schema, &row(id, 3), SHARDS, &mut scratch),
            shard_for_key("accounts", &key, SHARDS)
        );
    }
}

#[test]
fn a_key_of_another_shard_is_refused_and_changes_nothing() {
    let schema = schema();
    let mine = ids(&schema, 4, true);
    let theirs = ids(&schema, 1, false)[0];
    let mut shard = Shard::new(ME, StorageConfig::default()).unwrap();
    shard.set_owner(SHARDS);
    let t = shard.add_table(schema);
    shard
        .apply(
            ts(2),
            &[
                op(t, RowOp::Insert(row(mine[0], 10))),
                op(t, RowOp::Insert(row(mine[1], 20))),
            ],
        )
        .unwrap();
    let before = (
        shard.row_counts(t).unwrap(),
        shard.live_keys(t).unwrap(),
        shard.index_versions(t).unwrap(),
        shard.memory(),
        shard.applied_through(),
    );

    // Each way a key reaches the shard, after valid operations of the same transaction.
    let refused: Vec<(usize, RowOp<Vec<Value>>)> = vec![
        (2, RowOp::Insert(row(theirs, 1))),
        (2, RowOp::Delete(row(theirs, 0))),
        (2, RowOp::Upsert(row(theirs, 1))),
        (
            2,
            RowOp::Update {
                before: row(theirs, 0),
                after: row(mine[3], 1),
            },
        ),
        (
            2,
            RowOp::Update {
                before: row(mine[0], 10),
                after: row(theirs, 1),
            },
        ),
    ];
    for (index, bad) in refused {
        let txn = vec![
            op(t, RowOp::Delete(row(mine[1], 20))),
            op(t, RowOp::Insert(row(mine[2], 30))),
            op(t, bad),
        ];
        let err = shard.apply(ts(3), &txn).unwrap_err();
        match &err {
            StorageError::Op {
                index: i, source, ..
            } => {
                assert_eq!(*i, index, "{err}");
                assert!(matches!(**source, StorageError::WrongShard { .. }), "{err}");
                assert_eq!(
                    source.to_string(),
                    "a key of table `accounts` routed to the wrong shard"
                );
            }
            other => panic!("not an operation error: {other}"),
        }
        assert!(!err.is_retryable());
        assert_eq!(
            err.to_string(),
            format!(
                "operation {index} of the transaction at ts 3: a key of table `accounts` \
                 routed to the wrong shard"
            )
        );
        let after = (
            shard.row_counts(t).unwrap(),
            shard.live_keys(t).unwrap(),
            shard.index_versions(t).unwrap(),
            shard.memory(),
            shard.applied_through(),
        );
        assert_eq!(after, before, "a refused transaction changes nothing");
    }

    // The timestamp is still free, and the rows are as the first transaction left them.
    let stats = shard
        .apply(
            ts(3),
            &[
                op(t, RowOp::Delete(row(mine[1], 20))),
                op(t, RowOp::Insert(row(mine[2], 30))),
                op(t, RowOp::Truncate),
            ],
        )
        .unwrap();
    assert_eq!((stats.inserted, stats.deleted), (1, 3));
    assert_eq!(shard.live_keys(t).unwrap(), 0);
}

#[test]
fn without_an_owner_nothing_is_checked() {
    let schema = schema();
    let theirs = ids(&schema, 2, false);
    let mut shard = Shard::new(ME, StorageConfig::default()).unwrap();
    let t = shard.add_table(schema);
    shard
        .apply(
            ts(2),
            &[
                op(t, RowOp::Insert(row(theirs[0], 1))),
                op(t, RowOp::Upsert(row(theirs[1], 2))),
            ],
        )
        .unwrap();
    assert_eq!(shard.live_keys(t).unwrap(), 2);
}

#[test]
fn an_owner_needs_its_shard_among_the_shards() {
    let result = std::panic::catch_unwind(|| {
        let mut shard = Shard::new(4, StorageConfig::default()).unwrap();
        shard.set_owner(4);
    });
    assert!(result.is_err());
}
