//! Assembling transactions: total order, END's counts, sequencing errors, duplicates,
//! redeliveries, Postgres ids, truncates and logical messages inside transactions.

use super::*;
use crate::debezium::txn::collection_matches;

fn begin(id: &str, line: u64) -> Message {
    Message::Begin {
        id: id.into(),
        pos: at(line),
    }
}

fn end(id: &str, count: u64, collections: &[(&str, u64)], line: u64) -> Message {
    Message::End {
        id: id.into(),
        event_count: count,
        data_collections: collections
            .iter()
            .map(|(n, c)| ((*n).to_owned(), *c))
            .collect(),
        pos: at(line),
    }
}

/// An insert of `id` in transaction `txn` at `total_order`, parsed from line `line`.
fn insert(txn: Option<&str>, total_order: u64, id: i64, line: u64) -> Message {
    let row = json!({"id": id, "qty": 1});
    let line_text = event("c", Json::Null, row, txn.map(|t| (t, total_order))).to_string();
    parse(&line_text, line).unwrap()
}

fn ids(txn: &Transaction) -> Vec<i64> {
    txn.events
        .iter()
        .map(|e| match &e.op {
            ChangeOp::Insert(row) => match row[0] {
                Value::Int(v) => v,
                _ => unreachable!(),
            },
            _ => unreachable!(),
        })
        .collect()
}

fn feed(
    asm: &mut TxnAssembler,
    msgs: Vec<Message>,
) -> Vec<Result<Option<Transaction>, DebeziumError>> {
    msgs.into_iter().map(|m| asm.push(m)).collect()
}

#[test]
fn assembles_in_total_order() {
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    let out = feed(
        &mut asm,
        vec![
            begin("t1", 1),
            insert(Some("t1"), 3, 30, 2),
            insert(Some("t1"), 1, 10, 3),
            Message::Tombstone { pos: at(4) },
            insert(Some("t1"), 2, 20, 5),
        ],
    );
    assert!(out.iter().all(|r| matches!(r, Ok(None))));
    assert_eq!(asm.open_transaction(), Some("t1"));
    let txn = asm
        .push(end("t1", 3, &[("public.orders", 3)], 6))
        .unwrap()
        .unwrap();
    assert_eq!(txn.id, "t1");
    assert_eq!(ids(&txn), [10, 20, 30]);
    assert_eq!((txn.begin, txn.end), (at(1), at(6)));
    assert_eq!(asm.open_transaction(), None);
    // Empty transactions are transactions too.
    asm.push(begin("t2", 7)).unwrap();
    let txn = asm.push(end("t2", 0, &[], 8)).unwrap().unwrap();
    assert!(txn.events.is_empty());
}

#[test]
fn three_part_collection_names_match() {
    assert!(collection_matches("testDB.dbo.orders", "dbo.orders"));
    assert!(collection_matches("dbo.orders", "dbo.orders"));
    assert!(!collection_matches("testDB.xdbo.orders", "dbo.orders"));
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    asm.push(begin("t", 1)).unwrap();
    asm.push(insert(Some("t"), 1, 1, 2)).unwrap();
    let txn = asm.push(end("t", 1, &[("shop.public.orders", 1)], 3));
    assert!(txn.unwrap().is_some());
}

#[test]
fn count_mismatches() {
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    asm.push(begin("t1", 1)).unwrap();
    asm.push(insert(Some("t1"), 1, 1, 2)).unwrap();
    let e = asm.push(end("t1", 2, &[], 3)).unwrap_err();
    assert!(
        matches!(&e, DebeziumError::CountMismatch { id, collection: None, expected: 2, got: 1, .. } if id == "t1")
    );
    assert_eq!(
        e.to_string(),
        "events.json:3: transaction `t1`: END announces 2 events, but 1 arrived; the stream \
         lost or repeated events"
    );
    assert_eq!(
        asm.open_transaction(),
        None,
        "the broken transaction is discarded"
    );

    asm.push(begin("t2", 4)).unwrap();
    asm.push(insert(Some("t2"), 1, 1, 5)).unwrap();
    asm.push(insert(Some("t2"), 2, 2, 6)).unwrap();
    let e = asm
        .push(end(
            "t2",
            2,
            &[("public.orders", 1), ("public.items", 1)],
            7,
        ))
        .unwrap_err();
    assert!(matches!(
        &e,
        DebeziumError::CountMismatch { collection: Some(c), expected: 1, got: 2, .. } if c == "public.orders"
    ));
    assert!(
        e.to_string()
            .contains("END announces 1 events for `public.orders`, but 2 arrived"),
        "{e}"
    );
    assert_eq!(e.position(), &at(7));

    // Counts agree, but an event is on a collection END does not list.
    asm.push(begin("t3", 8)).unwrap();
    asm.push(insert(Some("t3"), 1, 1, 9)).unwrap();
    let e = asm
        .push(end("t3", 1, &[("public.items", 0)], 10))
        .unwrap_err();
    assert!(
        e.to_string().contains("on no data collection END lists"),
        "{e}"
    );

    // The assembler is usable afterwards.
    asm.push(begin("t4", 11)).unwrap();
    asm.push(insert(Some("t4"), 1, 1, 12)).unwrap();
    assert!(
        asm.push(end("t4", 1, &[("public.orders", 1)], 13))
            .unwrap()
            .is_some()
    );
}

#[test]
fn sequencing_errors() {
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    // END without BEGIN.
    let e = asm.push(end("t0", 0, &[], 1)).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("events.json:1: transaction `t0`: END without a BEGIN"),
        "{e}"
    );
    // A change outside any transaction.
    let e = asm.push(insert(Some("t0"), 1, 1, 2)).unwrap_err();
    assert!(matches!(&e, DebeziumError::Transaction { id, .. } if id == "t0"));
    assert_eq!(e.position(), &at(2));
    // A non-snapshot change without a transaction block.
    let e = asm.push(insert(None, 0, 1, 3)).unwrap_err();
    assert!(matches!(e, DebeziumError::MissingTxnMetadata { .. }));
    assert!(
        e.to_string()
            .starts_with("events.json:3: change event without a `transaction` block")
    );
    // BEGIN while open names both ids; the new transaction stays open.
    asm.push(begin("t1", 4)).unwrap();
    asm.push(insert(Some("t1"), 1, 1, 5)).unwrap();
    let e = asm.push(begin("t2", 6)).unwrap_err();
    let text = e.to_string();
    assert!(
        text.starts_with(
            "events.json:6: transaction `t2`: BEGIN while transaction `t1` (begun at events.json:4)"
        ),
        "{text}"
    );
    assert_eq!(asm.open_transaction(), Some("t2"));
    // A change of another transaction breaks the open one.
    let e = asm.push(insert(Some("t9"), 1, 1, 7)).unwrap_err();
    assert!(e.to_string().contains("inside transaction `t2`"), "{e}");
    assert_eq!(asm.open_transaction(), None);
    // A change without a transaction block inside BEGIN/END breaks it too.
    asm.push(begin("t3", 8)).unwrap();
    let e = asm.push(insert(None, 0, 1, 9)).unwrap_err();
    assert!(matches!(&e, DebeziumError::Transaction { id, .. } if id == "t3"));
    assert_eq!(asm.open_transaction(), None);
    // END of another id.
    asm.push(begin("t4", 10)).unwrap();
    let e = asm.push(end("t5", 0, &[], 11)).unwrap_err();
    assert!(e.to_string().contains("END while transaction `t4`"), "{e}");
    assert_eq!(asm.open_transaction(), None);
    // reset() discards an open transaction.
    asm.push(begin("t6", 12)).unwrap();
    asm.reset();
    assert_eq!(asm.open_transaction(), None);
    assert!(asm.push(end("t6", 0, &[], 13)).is_err());
}

#[test]
fn snapshot_reads_stand_alone_with_metadata() {
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    let line = event("r", Json::Null, json!({"id": 1, "qty": 1}), None).to_string();
    let msg = parse(&line, 5).unwrap();
    let txn = asm.push(msg).unwrap().unwrap();
    assert_eq!(txn.id, "events.json:5");
    assert_eq!(txn.events.len(), 1);
}

#[test]
fn duplicates_are_skipped() {
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    let run = |asm: &mut TxnAssembler, first_line: u64| {
        asm.push(begin("t1", first_line)).unwrap();
        asm.push(insert(Some("t1"), 1, 1, first_line + 1)).unwrap();
        asm.push(end("t1", 1, &[("public.orders", 1)], first_line + 2))
            .unwrap()
    };
    let txn = run(&mut asm, 1).unwrap();
    // Not applied yet: the assembler never marks on its own.
    assert!(run(&mut asm, 4).is_some());
    asm.mark_applied(&txn.id, &txn.end);
    assert_eq!(asm.last_applied(), Some(("t1", &at(3))));
    assert!(run(&mut asm, 7).is_none());
    assert_eq!(asm.duplicates_skipped(), 1);
    // A duplicate's counts are still checked.
    asm.push(begin("t1", 10)).unwrap();
    assert!(asm.push(end("t1", 1, &[], 11)).is_err());
    assert_eq!(asm.duplicates_skipped(), 1);
}

#[test]
fn no_metadata_mode() {
    let mut asm = TxnAssembler::new(TxnMode::NoMetadata);
    assert_eq!(asm.mode(), TxnMode::NoMetadata);
    let txn = asm.push(insert(None, 0, 1, 4)).unwrap().unwrap();
    assert_eq!(txn.id, "events.json:4");
    assert_eq!((txn.begin.clone(), txn.end.clone()), (at(4), at(4)));
    assert_eq!(ids(&txn), [1]);
    // A transaction block is ignored.
    assert!(asm.push(insert(Some("t1"), 1, 2, 5)).unwrap().is_some());
    let e = asm.push(begin("t1", 6)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "events.json:6: transaction `t1`: transaction metadata in a stream replayed with \
         --no-txn-metadata; replay without that flag"
    );
    assert!(asm.push(end("t1", 0, &[], 7)).is_err());
    // Positions identify applied events.
    asm.mark_applied(&txn.id, &txn.end);
    assert!(asm.push(insert(None, 0, 1, 4)).unwrap().is_none());
    assert_eq!(asm.duplicates_skipped(), 1);
}

// --- hardening: redeliveries, Postgres ids, reads, times, decimals, skipped lines ---

#[test]
fn a_repeated_begin_restarts_the_open_transaction() {
    // BEGIN t1, e1, BEGIN t1, e1, e2, END t1: the partial delivery is replaced by the full
    // one instead of breaking the transaction.
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    asm.push(begin("t1", 1)).unwrap();
    asm.push(insert(Some("t1"), 1, 1, 2)).unwrap();
    assert!(asm.push(begin("t1", 3)).unwrap().is_none());
    assert_eq!(asm.restarts(), 1);
    assert_eq!(asm.open_begin(), Some(&at(3)));
    asm.push(insert(Some("t1"), 1, 1, 4)).unwrap();
    asm.push(insert(Some("t1"), 2, 2, 5)).unwrap();
    let txn = asm
        .push(end("t1", 2, &[("public.orders", 2)], 6))
        .unwrap()
        .unwrap();
    assert_eq!(ids(&txn), [1, 2]);
    assert_eq!((txn.begin, txn.end), (at(3), at(6)));
}

/// A Postgres change event as Debezium 2.x writes it: `txId:LSN` ids whose LSN part is the
/// last LSN seen when the event was written.
fn pg_insert(txn_id: &str, total_order: u64, id: i64, line: u64) -> Message {
    let text = json!({
        "before": null,
        "after": {"id": id, "qty": 1, "price": "1.00", "note": null, "created": null, "day": null},
        "source": {
            "version": "2.5.0.Final", "connector": "postgresql", "name": "shop",
            "ts_ms": 1_700_000_000_000u64, "snapshot": "false", "db": "shop",
            "sequence": "[\"53195776\",\"53195840\"]", "schema": "public", "table": "orders",
            "txId": 571, "lsn": 53195840, "xmin": null
        },
        "op": "c",
        "ts_ms": 1_700_000_000_123u64,
        "transaction": {"id": txn_id, "total_order": total_order, "data_collection_order": total_order}
    })
    .to_string();
    parse(&text, line).unwrap()
}

#[test]
fn postgres_transaction_ids_match_by_their_txid() {
    let begin_line = r#"{"status":"BEGIN","id":"571:53195832","ts_ms":1700000000100,"event_count":null,"data_collections":null}"#;
    let end_line = r#"{"status":"END","id":"571:53196048","ts_ms":1700000000200,"event_count":2,"data_collections":[{"data_collection":"public.orders","event_count":2}]}"#;
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    asm.push(parse(begin_line, 1).unwrap()).unwrap();
    asm.push(pg_insert("571:53195840", 1, 1, 2)).unwrap();
    asm.push(pg_insert("571:53195992", 2, 2, 3)).unwrap();
    let txn = asm.push(parse(end_line, 4).unwrap()).unwrap().unwrap();
    assert_eq!(ids(&txn), [1, 2]);
    assert_eq!(txn.id, "571:53196048", "the full id stays available");
    assert_eq!(txn.events[0].txn.as_ref().unwrap().id, "571:53195840");

    // Another txId is another transaction, whatever the LSN.
    asm.push(parse(&begin_line.replace("571:", "572:"), 5).unwrap())
        .unwrap();
    let e = asm.push(pg_insert("573:53195840", 1, 3, 6)).unwrap_err();
    assert!(
        e.to_string().contains("inside transaction `572:53195832`"),
        "{e}"
    );
    assert_eq!(e.position(), &at(6));

    // Only Postgres ids compare by their first part: MySQL GTIDs share the server uuid.
    let gtid = |n: u32| format!("3e11fa47-71ca-11e1-9e33-c80aa9429562:{n}");
    assert!(!same_transaction(&gtid(23), &gtid(24), Some("mysql")));
    assert!(!same_transaction("571:1", "571:2", Some("mysql")));
    assert!(!same_transaction(
        "571:1",
        "572:1",
        Some(POSTGRES_CONNECTOR)
    ));
    assert!(same_transaction("571", "571:9", Some(POSTGRES_CONNECTOR)));
}

#[test]
fn postgres_redelivery_restarts_by_txid() {
    // A redelivered BEGIN carries the same txId (its LSN may differ).
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    asm.push(parse(r#"{"status":"BEGIN","id":"571:100"}"#, 1).unwrap())
        .unwrap();
    asm.push(pg_insert("571:120", 1, 1, 2)).unwrap();
    assert!(
        asm.push(parse(r#"{"status":"BEGIN","id":"571:100"}"#, 3).unwrap())
            .unwrap()
            .is_none()
    );
    assert_eq!(asm.restarts(), 1);
    asm.push(pg_insert("571:120", 1, 1, 4)).unwrap();
    let end = r#"{"status":"END","id":"571:140","event_count":1}"#;
    assert!(asm.push(parse(end, 5).unwrap()).unwrap().is_some());
}

#[test]
fn postgres_duplicates_are_recognised_by_txid_across_a_restart() {
    let deliver = |asm: &mut TxnAssembler, end_lsn: u64, line: u64| {
        asm.push(parse(r#"{"status":"BEGIN","id":"571:100"}"#, line).unwrap())
            .unwrap();
        asm.push(pg_insert("571:120", 1, 1, line + 1)).unwrap();
        let end = format!(r#"{{"status":"END","id":"571:{end_lsn}","event_count":1}}"#);
        asm.push(parse(&end, line + 2).unwrap()).unwrap()
    };
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    let txn = deliver(&mut asm, 140, 1).unwrap();
    asm.mark_applied(&txn.id, &txn.end);
    let recorded = asm.recent_applied(8);
    assert_eq!(recorded, ["571"], "what a checkpoint records");

    // After a restart, the connector redelivers the transaction with other LSN parts.
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    asm.remember_applied(recorded.iter().map(String::as_str));
    assert!(deliver(&mut asm, 160, 4).is_none());
    assert_eq!(asm.duplicates_skipped(), 1);
}

#[test]
fn truncates_and_logical_messages_inside_transactions() {
    let mut asm = TxnAssembler::new(TxnMode::Metadata);
    asm.push(begin("t1", 1)).unwrap();
    let truncate = json!({
        "op": "t", "ts_ms": 1,
        "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": "orders"},
        "transaction": {"id": "t1", "total_order": 1, "data_collection_order": 1}
    });
    let msg = parse(&truncate.to_string(), 2).unwrap();
    assert!(matches!(&msg, Message::Change(ev) if ev.op == ChangeOp::Truncate));
    asm.push(msg).unwrap();
    let message = json!({
        "op": "m", "ts_ms": 1,
        "source": {"connector": "postgresql", "db": "shop", "schema": "", "table": ""},
        "message": {"prefix": "audit", "content": "aGk="},
        "transaction": {"id": "t1", "total_order": 2, "data_collection_order": 1}
    });
    asm.push(parse(&message.to_string(), 3).unwrap()).unwrap();
    asm.push(insert(Some("t1"), 3, 7, 4)).unwrap();
    // Debezium counts the message among the transaction's events, on a collection of its own.
    let txn = asm
        .push(end("t1", 3, &[("public.orders", 2), ("audit", 1)], 5))
        .unwrap()
        .unwrap();
    assert_eq!(txn.events.len(), 2);
    assert_eq!(txn.events[0].op, ChangeOp::Truncate);
    // Heartbeats between BEGIN and END change nothing.
    asm.push(begin("t2", 6)).unwrap();
    asm.push(parse(r#"{"ts_ms":5}"#, 7).unwrap()).unwrap();
    asm.push(insert(Some("t2"), 1, 8, 8)).unwrap();
    assert!(asm.push(end("t2", 1, &[], 9)).unwrap().is_some());
}
