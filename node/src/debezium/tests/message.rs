//! Parsing lines: every op in both forms, table resolution, bad lines, transaction markers,
//! times and decimals without the envelope schema, lines without a row change.

use super::*;
use crate::debezium::value::{
    CONNECT_DECIMAL, TIME_US, TIMESTAMP_MS, TIMESTAMP_NS, precision_unit,
};
use base64::Engine as _;
use retina_storage::RowOp;

#[test]
fn position_display() {
    assert_eq!(at(17).to_string(), "events.json:17");
    assert_eq!(SourcePosition::new("stdin", 1).to_string(), "stdin:1");
}

#[test]
fn every_op_in_the_bare_form() {
    let row = json!({"id": 1, "qty": 2, "price": "3.5", "extra": "ignored"});
    let ev = change(&event("c", Json::Null, row.clone(), Some(("t1", 1))).to_string());
    assert_eq!(ev.op, ChangeOp::Insert(order_row(1, 2, Some(350))));
    assert_eq!(ev.table.name(), "public.orders");
    assert_eq!(&*ev.data_collection, "public.orders");
    assert!(!ev.snapshot);
    assert_eq!(
        ev.txn,
        Some(TxnRef {
            id: "t1".into(),
            total_order: 1,
            data_collection_order: 1
        })
    );
    assert_eq!(ev.pos, at(1));

    // A snapshot read is an upsert: Debezium re-sends reads of rows it already sent.
    let ev = change(&event("r", Json::Null, row.clone(), None).to_string());
    assert_eq!(ev.op, ChangeOp::Upsert(order_row(1, 2, Some(350))));
    assert!(ev.snapshot);
    assert_eq!(ev.txn, None);

    let after = json!({"id": 1, "qty": 5, "price": null});
    let ev = change(&event("u", row.clone(), after.clone(), None).to_string());
    assert_eq!(
        ev.op,
        ChangeOp::Update {
            before: order_row(1, 2, Some(350)),
            after: order_row(1, 5, None),
        }
    );

    // No before image (REPLICA IDENTITY DEFAULT): the after image's key stands in.
    let ev = change(&event("u", Json::Null, after, None).to_string());
    assert_eq!(
        ev.op,
        ChangeOp::Update {
            before: key_row(1),
            after: order_row(1, 5, None),
        }
    );

    // A delete's before image may hold only the key, or nulls in NOT NULL columns.
    let ev = change(&event("d", json!({"id": 7}), Json::Null, None).to_string());
    assert_eq!(ev.op, ChangeOp::Delete(key_row(7)));
    let ev = change(&event("d", json!({"id": 7, "qty": null}), Json::Null, None).to_string());
    assert_eq!(ev.op, ChangeOp::Delete(key_row(7)));
    let op: RowOp<Vec<Value>> = ev.op.into();
    assert_eq!(op, RowOp::Delete(key_row(7)));
}

#[test]
fn before_images_hold_only_their_key_where_asked() {
    let keys_only = ParseOptions {
        before_keys_only: true,
        ..Default::default()
    };
    let with =
        |line: &str, options: &ParseOptions| match parse_line_with(line, &at(4), &catalog, options)
        {
            Ok(Message::Change(ev)) => Ok(ev.op),
            Ok(other) => panic!("expected a change, got {other:?}"),
            Err(e) => Err(e.to_string()),
        };
    let before = json!({"id": 1, "qty": 2, "price": "3.50", "note": "old", "day": 19783});
    // The same in the envelope, where the schema makes the price bytes (350 at scale 2).
    let mut enveloped = before.clone();
    enveloped["price"] = json!("AV4=");
    let after = json!({"id": 1, "qty": 5, "price": null});
    let update = ChangeOp::Update {
        before: key_row(1),
        after: order_row(1, 5, None),
    };
    // Bare (the one-pass read) and in the envelope (the full parse) alike: an update's and a
    // delete's before image are their key, the after image whole, and without the option the
    // images as written.
    let fields = orders_fields();
    let forms = [
        event("u", before.clone(), after.clone(), None).to_string(),
        envelope(
            event("u", enveloped.clone(), after.clone(), None),
            fields.clone(),
        ),
    ];
    for line in &forms {
        assert_eq!(with(line, &keys_only), Ok(update.clone()), "{line}");
        let Ok(ChangeOp::Update { before, .. }) = with(line, &ParseOptions::default()) else {
            panic!("an update: {line}")
        };
        assert_eq!(before[..3], order_row(1, 2, Some(350))[..3], "{line}");
        assert_eq!(before[3], Value::Utf8("old".into()), "{line}");
    }
    let delete = event("d", before.clone(), Json::Null, None).to_string();
    assert_eq!(with(&delete, &keys_only), Ok(ChangeOp::Delete(key_row(1))));
    let delete = envelope(event("d", enveloped, Json::Null, None), fields);
    assert_eq!(with(&delete, &keys_only), Ok(ChangeOp::Delete(key_row(1))));
    // The other columns are not read, so not checked either; the key still is.
    let mut bad = before.clone();
    bad["qty"] = json!("many");
    let line = event("d", bad, Json::Null, None).to_string();
    assert_eq!(with(&line, &keys_only), Ok(ChangeOp::Delete(key_row(1))));
    assert!(
        with(&line, &ParseOptions::default())
            .unwrap_err()
            .contains("column `qty`")
    );
    let line = event("d", json!({"id": "x", "qty": 2}), Json::Null, None).to_string();
    assert!(with(&line, &keys_only).unwrap_err().contains("column `id`"));
    let line = event("u", json!({"qty": 2}), after, None).to_string();
    assert!(matches!(
        parse_line_with(&line, &at(4), &catalog, &keys_only),
        Err(DebeziumError::MissingColumn {
            image: "before",
            ..
        })
    ));
}

#[test]
fn every_op_in_the_envelope_form() {
    // 123.45 at scale 2 is 12345 = 0x3039; 2024-03-01T12:34:56Z; 2024-03-01 is day 19783.
    let created = 1_709_296_496_000_000i64;
    let row = json!({"id": 1, "qty": 2, "price": "MDk=", "created": created, "day": 19783});
    let expected = vec![
        Value::Int(1),
        Value::Int(2),
        Value::Decimal(12345),
        Value::Null,
        Value::Timestamp(created),
        Value::Date(19783),
    ];
    let fields = orders_fields();
    let line = envelope(event("c", Json::Null, row.clone(), None), fields.clone());
    assert_eq!(change(&line).op, ChangeOp::Insert(expected.clone()));
    let line = envelope(event("r", Json::Null, row.clone(), None), fields.clone());
    assert_eq!(change(&line).op, ChangeOp::Upsert(expected.clone()));
    let after = json!({"id": 1, "qty": 3, "price": "z8c=", "created": null, "day": -1});
    let line = envelope(event("u", row.clone(), after, None), fields.clone());
    let ChangeOp::Update { before, after } = change(&line).op else {
        panic!("an update")
    };
    assert_eq!(before, expected);
    assert_eq!(after[2], Value::Decimal(-12345));
    assert_eq!(after[5], Value::Date(-1));
    let line = envelope(event("d", row, Json::Null, None), fields.clone());
    assert_eq!(change(&line).op, ChangeOp::Delete(expected));
    let line = envelope(event("t", Json::Null, Json::Null, None), fields);
    assert_eq!(change(&line).op, ChangeOp::Truncate);
    let op: RowOp<Vec<Value>> = change(&line).op.into();
    assert_eq!(op, RowOp::Truncate);
}

#[test]
fn envelope_scale_differs_from_the_column() {
    // 12345 at scale 3 is 12.345: exact at scale 2 only if the last digit is 0.
    let fields = |scale: &str| json!([{"type": "bytes", "name": CONNECT_DECIMAL, "parameters": {"scale": scale}, "field": "price"}]);
    let row = |b64: &str| json!({"id": 1, "qty": 1, "price": b64});
    let b64 = |v: i128| {
        let bytes = v.to_be_bytes();
        base64::engine::general_purpose::STANDARD.encode(&bytes[14..])
    };
    let line = envelope(event("c", Json::Null, row(&b64(12340)), None), fields("3"));
    assert_eq!(
        change(&line).op,
        ChangeOp::Insert(order_row(1, 1, Some(1234)))
    );
    let line = envelope(event("c", Json::Null, row(&b64(12345)), None), fields("3"));
    let e = parse(&line, 4).unwrap_err().to_string();
    assert!(
        e.starts_with("events.json:4: table `public.orders`, column `price`:"),
        "{e}"
    );
    let line = envelope(event("c", Json::Null, row(&b64(123)), None), fields("0"));
    assert_eq!(
        change(&line).op,
        ChangeOp::Insert(order_row(1, 1, Some(12300)))
    );
}

#[test]
fn table_resolution() {
    // `items` is only in the catalog under its bare name; MySQL names the db, not a schema.
    let line = json!({
        "before": null,
        "after": {"a": 1, "b": "x", "ok": 1, "ratio": 2},
        "source": {"connector": "mysql", "db": "inventory", "table": "items"},
        "op": "c"
    });
    let ev = change(&line.to_string());
    assert_eq!(ev.table.name(), "items");
    assert_eq!(&*ev.data_collection, "inventory.items");
    assert_eq!(
        ev.op,
        ChangeOp::Insert(vec![
            Value::Int(1),
            Value::Utf8("x".into()),
            Value::Boolean(true),
            Value::Float(2.0)
        ])
    );

    let line = json!({
        "after": {"a": 1}, "source": {"schema": "sales", "table": "nope"}, "op": "c"
    });
    let e = parse(&line.to_string(), 9).unwrap_err();
    assert!(
        matches!(&e, DebeziumError::UnknownTable { tried, .. } if tried == &["sales.nope", "nope"])
    );
    assert_eq!(e.position(), &at(9));
    assert!(
        e.to_string()
            .starts_with("events.json:9: unknown table (tried `sales.nope`, `nope`)"),
        "{e}"
    );
}

#[test]
fn missing_and_invalid_columns() {
    let e = parse(
        &event("c", Json::Null, json!({"qty": 1}), None).to_string(),
        5,
    )
    .unwrap_err();
    assert!(
        matches!(&e, DebeziumError::MissingColumn { table, column, image: "after", .. }
            if table == "public.orders" && column == "id")
    );
    assert!(
        e.to_string().starts_with(
            "events.json:5: table `public.orders`: the after image has no column `id`"
        ),
        "{e}"
    );
    // A NOT NULL non-key column must be in an after image, not in a before image.
    let e = parse(
        &event("c", Json::Null, json!({"id": 1}), None).to_string(),
        5,
    )
    .unwrap_err();
    assert!(matches!(&e, DebeziumError::MissingColumn { column, .. } if column == "qty"));
    let e = parse(
        &event("d", json!({"qty": 1}), Json::Null, None).to_string(),
        6,
    )
    .unwrap_err();
    assert!(
        matches!(&e, DebeziumError::MissingColumn { column, image: "before", .. } if column == "id")
    );

    let e = parse(
        &event("c", Json::Null, json!({"id": 1, "qty": 1_i64 << 40}), None).to_string(),
        8,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "events.json:8: table `public.orders`, column `qty`: 1099511627776 does not fit in int"
    );
    let e = parse(
        &event("c", Json::Null, json!({"id": 1, "qty": null}), None).to_string(),
        8,
    )
    .unwrap_err();
    assert!(
        e.to_string().ends_with("null in a column that is NOT NULL"),
        "{e}"
    );
    // A key column is checked in a before image too.
    let e = parse(
        &event("d", json!({"id": null}), Json::Null, None).to_string(),
        8,
    )
    .unwrap_err();
    assert!(matches!(&e, DebeziumError::Value { column, .. } if column == "id"));
    let e = parse(
        &event(
            "c",
            Json::Null,
            json!({"id": 1, "qty": 1, "price": "1234567890.5"}),
            None,
        )
        .to_string(),
        8,
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("does not fit in decimal(10,2)"),
        "{e}"
    );
    let e = parse(
        &event("c", Json::Null, json!({"id": 1, "qty": 1, "note": 5}), None).to_string(),
        8,
    )
    .unwrap_err();
    assert!(
        e.to_string()
            .ends_with("column `note`: expected a string, got number 5"),
        "{e}"
    );
}

#[test]
fn malformed_lines() {
    let cases = [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (r#"{"hello": 1}"#, "neither a change event"),
        (
            r#"{"op": "x", "source": {"table": "orders"}}"#,
            "unknown op \"x\"",
        ),
        (
            r#"{"op": "c", "after": {"id": 1}}"#,
            "without a `source` object",
        ),
        (
            r#"{"op": "c", "source": {"schema": "public", "table": "orders"}}"#,
            "without the `after` image",
        ),
        (
            r#"{"op": "c", "after": 3, "source": {"schema": "public", "table": "orders"}}"#,
            "`after` must be an object",
        ),
        (
            r#"{"status": "MIDDLE", "id": "1"}"#,
            "expected \"BEGIN\" or \"END\"",
        ),
        (
            r#"{"status": "END", "id": "1"}"#,
            "without an `event_count`",
        ),
        (r#"{"status": "BEGIN"}"#, "without a string `id`"),
        (
            r#"{"op": "c", "after": {"id": 1, "qty": 1}, "source": {"schema": "public", "table": "orders"}, "transaction": {"id": "1"}}"#,
            "`transaction` needs",
        ),
    ];
    for (line, reason) in cases {
        let e = parse(line, 3).unwrap_err();
        assert!(matches!(e, DebeziumError::Malformed { .. }), "{line}: {e}");
        let text = e.to_string();
        assert!(
            text.starts_with("events.json:3: malformed Debezium message: "),
            "{text}"
        );
        assert!(text.contains(reason), "{line}: {text}");
    }
    // A truncate names its table like any change.
    let e = parse(r#"{"op": "t", "source": {"table": "ghosts"}}"#, 17).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("events.json:17: unknown table (tried `ghosts`)"),
        "{e}"
    );
    // Tombstones carry nothing.
    for line in ["null", "", "  ", r#"{"schema": null, "payload": null}"#] {
        assert!(
            matches!(parse(line, 4), Ok(Message::Tombstone { .. })),
            "{line:?}"
        );
    }
}

#[test]
fn transaction_markers() {
    let begin = r#"{"status":"BEGIN","id":"571:53195832","ts_ms":1,"event_count":null,"data_collections":null}"#;
    let Message::Begin { id, pos } = parse(begin, 1).unwrap() else {
        panic!("a BEGIN")
    };
    assert_eq!((id.as_str(), pos), ("571:53195832", at(1)));
    let end = json!({
        "status": "END", "id": "571:53195832", "event_count": 3,
        "data_collections": [
            {"data_collection": "public.orders", "event_count": 2},
            {"data_collection": "public.items", "event_count": "1"}
        ]
    });
    let expected = vec![
        ("public.orders".to_owned(), 2),
        ("public.items".to_owned(), 1),
    ];
    for line in [
        end.to_string(),
        json!({"schema": {"type": "struct"}, "payload": end}).to_string(),
    ] {
        let Message::End {
            id,
            event_count,
            data_collections,
            ..
        } = parse(&line, 2).unwrap()
        else {
            panic!("an END")
        };
        assert_eq!(id, "571:53195832");
        assert_eq!(event_count, 3);
        assert_eq!(data_collections, expected);
    }
}

/// A table with every time column kind, with and without declared precisions.
fn times() -> Arc<TableSchema> {
    TableSchema::new(
        "times",
        vec![
            ColumnDef::new("id", ColumnType::Int64, false),
            ColumnDef::new("plain", ColumnType::Timestamp, true),
            ColumnDef::new("ms", ColumnType::Timestamp, true).with_time_precision(3),
            ColumnDef::new("us", ColumnType::Timestamp, true).with_time_precision(6),
            ColumnDef::new("ns", ColumnType::Timestamp, true).with_time_precision(9),
            ColumnDef::new("tz", ColumnType::TimestampTz, true),
            ColumnDef::new("t_ms", ColumnType::Time, true).with_time_precision(3),
            ColumnDef::new("t", ColumnType::Time, true),
        ],
        &["id"],
    )
    .unwrap()
}

fn times_line(after: Json) -> String {
    json!({"op": "c", "after": after, "source": {"connector": "mysql", "db": "x", "table": "times"}})
        .to_string()
}

#[test]
fn integer_times_without_a_schema_follow_the_declared_precision() {
    let catalog = |name: &str| (name == "times").then(times);
    let micros = 1_709_296_496_123_000i64; // 2024-03-01T12:34:56.123Z
    let line = times_line(json!({
        "id": 1,
        "plain": micros,
        "ms": micros / 1000,
        "us": micros,
        "ns": micros * 1000 + 999,
        "tz": "2024-03-01T14:34:56.123+02:00",
        "t_ms": 45_296_123,
        "t": "12:34:56.123456",
    }));
    let Message::Change(ev) = parse_line(&line, &at(3), &catalog).unwrap() else {
        panic!("a change")
    };
    assert_eq!(
        ev.op,
        ChangeOp::Insert(vec![
            Value::Int(1),
            Value::Timestamp(micros),
            Value::Timestamp(micros),
            Value::Timestamp(micros),
            Value::Timestamp(micros),
            Value::Timestamp(micros),
            Value::Time(45_296_123_000),
            Value::Time(45_296_123_456),
        ])
    );
    // With the envelope the semantic type decides, whatever the declared precision.
    let fields = json!([
        {"type": "int64", "field": "id"},
        {"type": "int64", "name": TIMESTAMP_NS, "field": "ms"},
        {"type": "int64", "name": TIME_US, "field": "t_ms"}
    ]);
    let payload = json!({
        "op": "c",
        "after": {"id": 1, "ms": micros * 1000, "t_ms": 45_296_000_001i64},
        "source": {"connector": "mysql", "db": "x", "table": "times"},
    });
    let line = envelope(payload, fields);
    let Message::Change(ev) = parse_line(&line, &at(4), &catalog).unwrap() else {
        panic!("a change")
    };
    let ChangeOp::Insert(row) = ev.op else {
        panic!("an insert")
    };
    assert_eq!(
        (&row[2], &row[6]),
        (&Value::Timestamp(micros), &Value::Time(45_296_000_001))
    );
    // What cannot be read unambiguously is an error naming the line and column.
    for (after, column) in [
        (json!({"id": 1, "t": 86_400_000_001i64}), "t"),
        (json!({"id": 1, "t": "25:00:00"}), "t"),
        (json!({"id": 1, "tz": 1.5}), "tz"),
    ] {
        let e = parse_line(&times_line(after), &at(9), &catalog).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("events.json:9: table `times`, column `{column}`:")),
            "{e}"
        );
    }
    let fields = json!([{"type": "int64", "name": TIMESTAMP_MS, "field": "t"}]);
    let payload = json!({"op": "c", "after": {"id": 1, "t": 5}, "source": {"table": "times"}});
    let e = parse_line(&envelope(payload, fields), &at(10), &catalog).unwrap_err();
    assert!(e.to_string().contains("is not a time of day"), "{e}");
    assert!(precision_unit(Some(12)).is_err());
}

#[test]
fn decimal_strings_follow_decimal_handling() {
    // "9999" is a literal and also base64 (0xf7df7d = -532611): the setting decides.
    let line = event(
        "c",
        Json::Null,
        json!({"id": 1, "qty": 1, "price": "9999"}),
        None,
    )
    .to_string();
    let price = |mode: DecimalHandling| {
        let options = ParseOptions {
            decimal_handling: mode,
            ..Default::default()
        };
        parse_line_with(&line, &at(2), &catalog, &options).map(|m| match m {
            Message::Change(ChangeEvent {
                op: ChangeOp::Insert(row),
                ..
            }) => row[2].clone(),
            other => panic!("{other:?}"),
        })
    };
    assert_eq!(
        price(DecimalHandling::Precise).unwrap(),
        Value::Decimal(-532_611)
    );
    assert_eq!(
        price(DecimalHandling::String).unwrap(),
        Value::Decimal(999_900)
    );
    let e = price(DecimalHandling::Double).unwrap_err().to_string();
    assert!(
        e.starts_with("events.json:2: table `public.orders`, column `price`:")
            && e.contains("decimal_handling"),
        "{e}"
    );
    // With the envelope the schema decides, whatever the setting.
    let fields = json!([{"type": "bytes", "name": CONNECT_DECIMAL, "parameters": {"scale": "2"}, "field": "price"}]);
    let row = json!({"id": 1, "qty": 1, "price": "9999"});
    let line = envelope(event("c", Json::Null, row, None), fields);
    let options = ParseOptions {
        decimal_handling: DecimalHandling::String,
        ..Default::default()
    };
    let Message::Change(ev) = parse_line_with(&line, &at(3), &catalog, &options).unwrap() else {
        panic!("a change")
    };
    assert_eq!(ev.op, ChangeOp::Insert(order_row(1, 1, Some(-532_611))));
}

#[test]
fn lines_without_a_row_change_are_skipped() {
    let skipped = |line: &str| match parse(line, 5) {
        Ok(Message::Skipped { what, pos, .. }) => {
            assert_eq!(pos, at(5));
            Some(what)
        }
        _ => None,
    };
    for heartbeat in [
        r#"{"ts_ms":1700000000000}"#,
        r#"{"payload":{"ts_ms":1700000000000}}"#,
        r#"{"schema":{"type":"struct","name":"io.debezium.connector.common.Heartbeat","fields":[{"type":"int64","field":"ts_ms"}]},"payload":{"ts_ms":1700000000000}}"#,
    ] {
        assert_eq!(skipped(heartbeat), Some(Skipped::Heartbeat), "{heartbeat}");
    }
    let ddl = json!({
        "source": {"connector": "mysql", "db": "shop", "table": "orders"},
        "databaseName": "shop", "ddl": "ALTER TABLE orders ADD COLUMN x INT",
        "tableChanges": [{"type": "ALTER", "id": "\"shop\".\"orders\""}]
    });
    assert_eq!(skipped(&ddl.to_string()), Some(Skipped::SchemaChange));
    let message = json!({
        "op": "m", "ts_ms": 1,
        "source": {"connector": "postgresql", "db": "shop", "schema": "", "table": ""},
        "message": {"prefix": "audit", "content": "aGk="}
    });
    assert_eq!(skipped(&message.to_string()), Some(Skipped::LogicalMessage));
    // Not Debezium: still errors with the position.
    for bad in [
        r#"{"ts_ms":"soon"}"#,
        r#"{"ts_ms":1,"other":2}"#,
        r#"{"payload":{"ts_ms":1},"extra":1}"#,
        r#"{"op":"m"}"#,
    ] {
        let e = parse(bad, 6);
        if bad == r#"{"op":"m"}"# {
            // A logical message needs nothing else.
            assert!(matches!(e, Ok(Message::Skipped { .. })), "{bad}");
            continue;
        }
        let e = e.unwrap_err();
        assert_eq!(e.position(), &at(6), "{bad}");
    }
}

/// The DOM parse's answer for `line` at line 1, default options, as text to compare.
fn full(line: &str) -> String {
    format!(
        "{:?}",
        super::super::message::parse_full(line, &at(1), &catalog, &Default::default())
    )
}

/// The one-pass read's answer for `line` at line 1, default options, as text to compare with
/// [`full`]'s (`None` where it leaves the line to the full parse).
fn one_pass(line: &str) -> Option<String> {
    super::super::fast::parse_change(line, &at(1), &catalog, &ParseOptions::default())
        .map(|m| format!("{:?}", Ok::<_, DebeziumError>(m)))
}

/// The one-pass read takes the common shapes, and agrees with the DOM parse on each of them
/// and on the shapes it leaves to it.
#[test]
fn the_one_pass_read_agrees_with_the_full_parse() {
    let fast = one_pass;
    let row = json!({"id": 7, "qty": 2, "price": "1.25", "note": "caf\u{e9} \"x\" \\ \n", "created": 5, "day": 3});
    let mut taken = vec![
        event("c", Json::Null, row.clone(), Some(("t1", 1))).to_string(),
        event("r", Json::Null, row.clone(), None).to_string(),
        event("u", json!({"id": 6}), row.clone(), Some(("t1", 2))).to_string(),
        event("u", Json::Null, row.clone(), Some(("t1", 3))).to_string(),
        event("d", row.clone(), Json::Null, Some(("t1", 4))).to_string(),
        event("t", Json::Null, Json::Null, Some(("t1", 5))).to_string(),
        // MySQL: `db.table`; no connector; numbers written as strings; a table found bare.
        json!({"op": "c", "after": {"a": 1, "b": "a", "ok": true, "ratio": 0.5}, "source": {"db": "x", "table": "items"},
               "transaction": {"id": 9, "total_order": "1", "data_collection_order": "1"}})
        .to_string(),
    ];
    // A variable-scale decimal (an object), a null `transaction`, a text column written with
    // escapes only in part of it.
    taken.push(
        json!({"op": "c", "after": {"id": 3, "qty": 1, "price": {"scale": 1, "value": "BNI="}, "note": "a\tb"},
               "source": {"schema": "public", "table": "orders"}, "transaction": null})
        .to_string(),
    );
    // A repeated key outside the row image: the last one counts, as in a JSON map.
    taken.push(
        r#"{"op":"c","after":{"id":1,"qty":1},"source":{"schema":"public","table":"orders"},"op":"c"}"#
            .to_owned(),
    );
    // The scanner's own ground: spaces between tokens, numbers of every JSON form, escapes
    // and nesting in fields it skips, literals.
    let src = r#""source":{"schema":"public","table":"orders","extra":[1,{"k":"v\u0041"},[],{}],"n":null}"#;
    for line in [
        format!(r#" {{ "op" : "c" , "after" : {{ "id" : 1 , "qty" : 2 }} , {src} }} "#),
        format!(r#"{{"op":"c","after":{{"id":-7,"qty":0,"price":"-0.50"}},{src}}}"#),
        format!(r#"{{"op":"c","after":{{"id":123456789012345678,"qty":3}},{src}}}"#),
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},"ts_ms":1.5e3,"x":-0,"y":1E-2,{src}}}"#),
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},"x":[true,false,null,"a\"b"],{src}}}"#),
        format!(
            r#"{{"op":"c","after":{{"id":1,"qty":2,"note":"\u00e9\n"}},{src},"transaction":{{"id":"t\"1","total_order":1,"data_collection_order":1}}}}"#
        ),
    ] {
        taken.push(line);
    }
    for line in &taken {
        let got = fast(line).unwrap_or_else(|| panic!("the one-pass read left {line} alone"));
        assert_eq!(got, full(line), "{line}");
    }
    // Numbers the full parse reads otherwise than as short integers, or refuses: whatever the
    // one-pass read answers, it is the full parse's answer.
    for (id, qty) in [
        ("-0", "1"),
        ("1.0", "2"),
        ("12345678901234567890", "1"),
        ("9223372036854775807", "1"),
        ("1e400", "1"),
        ("01", "1"),
        ("1.", "1"),
        ("-", "1"),
        ("1", "2e0"),
        ("1", "+2"),
    ] {
        let line = format!(r#"{{"op":"c","after":{{"id":{id},"qty":{qty}}},{src}}}"#);
        if let Some(got) = fast(&line) {
            assert_eq!(got, full(&line), "{line}");
        }
    }
    let left = [
        envelope(event("c", Json::Null, row.clone(), None), orders_fields()),
        json!({"status": "BEGIN", "id": "t1"}).to_string(),
        event("m", Json::Null, Json::Null, Some(("t1", 1))).to_string(),
        // Errors: a missing key, a wrong type, an unknown table, an escaped key.
        event("c", Json::Null, json!({"qty": 1}), None).to_string(),
        event("c", Json::Null, json!({"id": "x", "qty": 1}), None).to_string(),
        event("c", Json::Null, json!({"id": 1, "qty": 1, "note": ["x"]}), None).to_string(),
        event("c", Json::Null, json!({"id": 1, "qty": 1, "price": "x1"}), None).to_string(),
        json!({"op": "c", "after": {"id": 1, "qty": 1}, "source": {"schema": "public", "table": "orders"},
               "transaction": "t1"})
        .to_string(),
        json!({"op": "c", "after": {"id": 1, "qty": 1}, "source": {"schema": "public", "table": "orders"},
               "transaction": {"id": "t1", "total_order": 1}})
        .to_string(),
        json!({"op": "c", "after": {"a": 1}, "source": {"table": "nope"}}).to_string(),
        r#"{"o\u0070":"c","after":{"id":1,"qty":1},"source":{"table":"orders","schema":"public"}}"#
            .to_owned(),
        String::new(),
        "null".to_owned(),
        // A column written twice (the DOM parse reads it as a map does: the last one counts).
        r#"{"op":"c","after":{"id":1,"qty":1,"id":2,"qty":3},"source":{"schema":"public","table":"orders"}}"#
            .to_owned(),
        r#"{"op":"c","after":{"id":1,"qty":1,"qty":3},"source":{"schema":"public","table":"orders"}}"#
            .to_owned(),
        // Malformed JSON the scanner must not take: a trailing comma, garbage after the
        // object, a bad literal, an unclosed string, a bad escape in a skipped field, an
        // unclosed array, a tab inside a string.
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},{src},}}"#),
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},{src}}} x"#),
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},"x":nul,{src}}}"#),
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},"x":"abc,{src}}}"#),
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},"x":"a\qb",{src}}}"#),
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},"x":[1,2,{src}}}"#),
        // A transaction id that is not a string or a number.
        format!(r#"{{"op":"c","after":{{"id":1,"qty":2}},{src},"transaction":{{"id":{{"a":1}},"total_order":1,"data_collection_order":1}}}}"#),
        format!("{{\"op\":\"c\",\"after\":{{\"id\":1,\"qty\":2,\"note\":\"a\tb\"}},{src}}}"),
    ];
    for line in &left {
        assert_eq!(fast(line), None, "{line}");
    }
    // ... and for a column written twice, the last one counts.
    let twice = r#"{"op":"c","after":{"id":1,"qty":1,"id":2,"qty":3},"source":{"schema":"public","table":"orders"}}"#;
    assert!(matches!(change(twice).op, ChangeOp::Insert(row) if row == order_row(2, 3, None)));
}

/// A `source` block read before is found again by its bytes, wherever it stands in the line and
/// among more blocks than a thread keeps; a block that differs in any byte is read anew.
#[test]
fn source_blocks_read_again_agree_with_the_full_parse() {
    let fast = one_pass;
    let block = |k: usize| {
        // The names move within the block as `k` grows: a field before them, of k digits.
        let pad = "7".repeat(k + 1);
        match k % 3 {
            0 => format!(r#"{{"n":{pad},"schema":"public","table":"orders"}}"#),
            1 => format!(
                r#"{{"connector":"postgresql","n":{pad},"table":"orders","schema":"public"}}"#
            ),
            _ => format!(r#"{{ "table" : "items" , "n":{pad}, "db" : "x" }}"#),
        }
    };
    for round in 0..3 {
        for k in 0..20 {
            let src = block(k);
            let after = match k % 3 {
                2 => r#"{"a":1,"b":"z","ok":true,"ratio":0.5}"#,
                _ => r#"{"id":1,"qty":2}"#,
            };
            for line in [
                format!(r#"{{"op":"c","source":{src},"after":{after}}}"#),
                format!(r#"{{"after":{after},"op":"r","ts_ms":{round},"source":{src}}}"#),
            ] {
                let got = fast(&line).unwrap_or_else(|| panic!("left alone: {line}"));
                assert_eq!(got, full(&line), "{line}");
            }
        }
    }
    // Blocks that never repeat (Debezium's carry each event's `ts_ms` and `lsn`): after enough
    // misses in a row the memory rests, and every line still reads as the full parse does,
    // the blocks that repeat afterwards too.
    let unique = (0..200).map(|k| {
        format!(
            r#"{{"connector":"postgresql","ts_ms":{k},"schema":"public","table":"orders","lsn":{}}}"#,
            k * 7
        )
    });
    for src in unique.chain((0..30).map(block)) {
        let after = if src.contains("items") {
            r#"{"a":1,"b":"z"}"#
        } else {
            r#"{"id":1,"qty":2}"#
        };
        let line = format!(r#"{{"op":"c","source":{src},"after":{after}}}"#);
        let got = fast(&line).unwrap_or_else(|| panic!("left alone: {line}"));
        assert_eq!(got, full(&line), "{line}");
    }
    // The same bytes up to a name that differs, or a block left open: read anew.
    fast(r#"{"op":"c","source":{"schema":"public","table":"orders"},"after":{"id":1,"qty":2}}"#)
        .unwrap();
    let other =
        r#"{"op":"c","source":{"schema":"public","table":"ordersx"},"after":{"id":1,"qty":2}}"#;
    assert_eq!(fast(other), None, "an unknown table");
    let open =
        r#"{"op":"c","source":{"schema":"public","table":"orders","after":{"id":1,"qty":2}}"#;
    assert_eq!(fast(open), None, "{open}");
}

/// BEGIN and END read in one pass agree with the DOM parse, which is left every other shape
/// and every error.
#[test]
fn markers_read_in_one_pass_agree_with_the_full_parse() {
    let fast = |line: &str| {
        super::super::fast::parse_marker(line, &at(1))
            .map(|m| format!("{:?}", Ok::<_, DebeziumError>(m)))
    };
    let taken = [
        r#"{"status":"BEGIN","id":"571","event_count":null,"data_collections":null}"#,
        r#"{"data_collections":null,"event_count":null,"id":"4457","status":"BEGIN","ts_ms":1}"#,
        r#"{"status":"BEGIN","id":571}"#,
        r#"{"status":"END","id":"571:3360","event_count":3,"data_collections":[{"data_collection":"public.orders","event_count":2},{"data_collection":"public.items","event_count":"1"}]}"#,
        r#"{"status":"END","id":"t","event_count":"0","data_collections":[]}"#,
        r#"{"status":"END","id":"t","event_count":2}"#,
        r#"{ "status" : "END" , "id" : "t" , "event_count" : 1 , "data_collections" : [ { "data_collection" : "a" , "event_count" : 1 , "x" : [ {} ] } ] } "#,
        r#"{"status":"BEGIN","id":"t","event_count":"x","extra":{"a":[1,"b\"c"]}}"#,
    ];
    for line in taken {
        let got = fast(line).unwrap_or_else(|| panic!("the one-pass read left {line} alone"));
        assert_eq!(got, full(line), "{line}");
    }
    let left = [
        // Not a marker, or an envelope.
        r#"{"op":"c","after":{"id":1,"qty":1},"source":{"table":"orders"}}"#,
        r#"{"schema":{},"payload":{"status":"BEGIN","id":"t"}}"#,
        r#"{"payload":{"status":"BEGIN","id":"t"}}"#,
        // Errors: no id, an id of another type, an unknown status, END without a count, bad
        // data collections.
        r#"{"status":"BEGIN"}"#,
        r#"{"status":"BEGIN","id":null}"#,
        r#"{"status":"BEGIN","id":{"a":1}}"#,
        r#"{"status":"COMMIT","id":"t"}"#,
        r#"{"status":1,"id":"t"}"#,
        r#"{"status":"END","id":"t"}"#,
        r#"{"status":"END","id":"t","event_count":-1}"#,
        r#"{"status":"END","id":"t","event_count":1,"data_collections":{}}"#,
        r#"{"status":"END","id":"t","event_count":1,"data_collections":[1]}"#,
        r#"{"status":"END","id":"t","event_count":1,"data_collections":[{"event_count":1}]}"#,
        r#"{"status":"END","id":"t","event_count":1,"data_collections":[{"data_collection":"a"}]}"#,
        // Keys written twice (the DOM parse keeps the last), escapes, malformed JSON, a tab.
        r#"{"status":"BEGIN","id":"a","id":"b"}"#,
        r#"{"status":"END","id":"t","event_count":1,"data_collections":[{"data_collection":"a","data_collection":"b","event_count":1}]}"#,
        r#"{"status":"BEG\u0049N","id":"t"}"#,
        r#"{"status":"END","id":"t","event_count":1,"data_collections":[{"data_collection":"\u0061","event_count":1}]}"#,
        r#"{"status":"BEGIN","id":"t",}"#,
        r#"{"status":"BEGIN","id":"t"} x"#,
        r#"{"status":"END","id":"t","event_count":1,"data_collections":[{"data_collection":"a","event_count":1}"#,
        "{\"status\":\"BEGIN\",\t\"id\":\"t\"}",
    ];
    for line in left {
        assert_eq!(fast(line), None, "{line}");
    }
    // What the full parse makes of some of them.
    assert_eq!(
        full(r#"{"status":"BEGIN","id":"a","id":"b"}"#),
        format!("{:?}", parse(r#"{"status":"BEGIN","id":"b"}"#, 1))
    );
    assert!(full(r#"{"status":"END","id":"t"}"#).contains("without an `event_count`"));
}

#[test]
fn shared_names_are_made_of_exactly_their_parts() {
    use crate::debezium::message::shared_name;
    let a = shared_name(&["public", ".", "orders"]);
    assert_eq!(&*a, "public.orders");
    // The same parts again: the same name, not a copy.
    assert!(Arc::ptr_eq(&a, &shared_name(&["public", ".", "orders"])));
    assert!(Arc::ptr_eq(&a, &shared_name(&["public.orders"])));
    // Prefixes, extensions and other splits of other names are other names.
    for (parts, name) in [
        (&["public", ".", "order"][..], "public.order"),
        (&["public", ".", "orders2"][..], "public.orders2"),
        (&["public", "orders"][..], "publicorders"),
        (&["pub", ".", "lic.orders"][..], "pub.lic.orders"),
        (&[""][..], ""),
    ] {
        let n = shared_name(parts);
        assert_eq!(&*n, name);
        assert!(!Arc::ptr_eq(&n, &a), "{name}");
    }
    // More names than a thread keeps: each is still right.
    for i in 0..200 {
        assert_eq!(&*shared_name(&["s", ".", &i.to_string()]), format!("s.{i}"));
    }
    assert_eq!(&*shared_name(&["public", ".", "orders"]), "public.orders");
}
