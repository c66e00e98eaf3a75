//! Property tests: random and mutated lines never panic, every error names its line, and
//! what came before a bad line is kept.

use super::*;
use proptest::prelude::*;

/// Well-formed lines of a few transactions (some Postgres `txId:LSN`), in order.
fn good_lines(txns: usize) -> Vec<String> {
    let mut out = Vec::new();
    for t in 0..txns {
        let id = format!("{}:{}", 500 + t, 1000 * t);
        out.push(json!({"status": "BEGIN", "id": id}).to_string());
        for k in 0..2u64 {
            let mut ev = event(
                "c",
                Json::Null,
                json!({"id": t as u64 * 10 + k, "qty": 1, "price": "1.25"}),
                None,
            );
            ev["transaction"] = json!({
                "id": format!("{}:{}", 500 + t, 1000 * t + 10 * (k + 1) as usize),
                "total_order": k + 1, "data_collection_order": k + 1
            });
            out.push(ev.to_string());
        }
        out.push(
            json!({"status": "END", "id": format!("{}:{}", 500 + t, 1000 * t + 99), "event_count": 2})
                .to_string(),
        );
    }
    out
}

#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    /// A value replaced by one of the wrong type.
    WrongType(&'static str, Json),
    HugeNumber,
    DeepNesting(usize),
    Bytes(Vec<u8>),
    Drop,
    Duplicate,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (0usize..400).prop_map(Mutation::Truncate),
        (
            prop_oneof![
                Just("id"),
                Just("qty"),
                Just("price"),
                Just("op"),
                Just("status"),
                Just("transaction"),
                Just("after")
            ],
            prop_oneof![
                Just(Json::Null),
                Just(json!(true)),
                Just(json!([1])),
                Just(json!({"a": 1})),
                Just(json!("x")),
                Just(json!(-1.5))
            ],
        )
            .prop_map(|(k, v)| Mutation::WrongType(k, v)),
        Just(Mutation::HugeNumber),
        (1usize..20_000).prop_map(Mutation::DeepNesting),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Mutation::Bytes),
        Just(Mutation::Drop),
        Just(Mutation::Duplicate),
    ]
}

/// Replaces key `k` wherever it is in `v`.
fn set_key(v: &mut Json, k: &str, to: &Json) {
    match v {
        Json::Object(m) => {
            if let Some(slot) = m.get_mut(k) {
                *slot = to.clone();
            }
            for (_, child) in m.iter_mut() {
                set_key(child, k, to);
            }
        }
        Json::Array(items) => items.iter_mut().for_each(|c| set_key(c, k, to)),
        _ => {}
    }
}

/// The mutated line (`None`: dropped), as bytes; the sink decodes UTF-8 itself.
fn mutate(line: &str, m: &Mutation) -> Vec<Vec<u8>> {
    match m {
        Mutation::Truncate(n) => {
            let cut = (*n).min(line.len());
            vec![line.as_bytes()[..cut].to_vec()]
        }
        Mutation::WrongType(k, v) => {
            let mut json: Json = serde_json::from_str(line).unwrap();
            set_key(&mut json, k, v);
            vec![json.to_string().into_bytes()]
        }
        Mutation::HugeNumber => vec![
            line.replacen("\"qty\":1", "\"qty\":1e400", 1)
                .replacen("\"id\":", "\"id\":123456789012345678901234567890", 1)
                .into_bytes(),
        ],
        Mutation::DeepNesting(depth) => {
            let mut s = String::from("{\"after\":");
            s.push_str(&"[".repeat(*depth));
            s.push_str(&"]".repeat(*depth));
            s.push('}');
            vec![s.into_bytes()]
        }
        Mutation::Bytes(b) => vec![b.clone()],
        Mutation::Drop => vec![],
        Mutation::Duplicate => vec![line.as_bytes().to_vec(), line.as_bytes().to_vec()],
    }
}

/// Feeds `lines` as the sink does (UTF-8 decoded per line); returns the transactions
/// emitted, checking each error names its line.
fn replay(lines: &[Vec<u8>], asm: &mut TxnAssembler) -> Result<Vec<String>, TestCaseError> {
    let mut emitted = Vec::new();
    for (i, bytes) in lines.iter().enumerate() {
        let pos = SourcePosition::new("events.json", i as u64 + 1);
        let result = match std::str::from_utf8(bytes) {
            Ok(text) => {
                let parsed = parse_line(text, &pos, &catalog);
                // The one-pass read of common events agrees with the DOM parse on every line.
                let full =
                    super::super::message::parse_full(text, &pos, &catalog, &Default::default());
                prop_assert_eq!(format!("{parsed:?}"), format!("{full:?}"));
                parsed.and_then(|m| asm.push(m))
            }
            Err(e) => Err(DebeziumError::Malformed {
                pos: pos.clone(),
                reason: format!("not UTF-8: {e}"),
            }),
        };
        match result {
            Ok(Some(txn)) => {
                asm.mark_applied(&txn.id, &txn.end);
                emitted.push(txn.id);
            }
            Ok(None) => {}
            Err(e) => {
                prop_assert_eq!(e.position(), &pos);
                let prefix = format!("events.json:{}: ", i + 1);
                prop_assert!(e.to_string().starts_with(&prefix), "{}", e);
            }
        }
    }
    Ok(emitted)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn mutated_streams_never_panic_and_keep_what_came_before(
        txns in 1usize..5,
        at in any::<prop::sample::Index>(),
        m in mutation(),
    ) {
        let lines = good_lines(txns);
        let bad = at.index(lines.len());
        let mut fed: Vec<Vec<u8>> = lines[..bad].iter().map(|l| l.clone().into_bytes()).collect();
        // Transactions complete before the mutated line.
        let mut clean = TxnAssembler::new(TxnMode::Metadata);
        let before = replay(&fed, &mut clean)?;
        fed.extend(mutate(&lines[bad], &m));
        fed.extend(lines[bad + 1..].iter().map(|l| l.clone().into_bytes()));
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        let emitted = replay(&fed, &mut asm)?;
        prop_assert_eq!(&emitted[..before.len()], &before[..], "nothing accepted is lost");
        // Every transaction but the one with the bad line still arrives.
        prop_assert!(emitted.len() + 1 >= txns, "{:?} {:?}", m, emitted);
        prop_assert!(emitted.len() <= txns);
    }

    #[test]
    fn random_lines_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        replay(&[bytes], &mut asm)?;
    }

    #[test]
    fn random_json_never_panics(v in json_value()) {
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        for line in [v.to_string(), json!({"payload": v.clone()}).to_string(), json!({"op": "c", "after": v.clone(), "source": {"table": "items"}}).to_string()] {
            replay(&[line.into_bytes()], &mut asm)?;
        }
    }

    #[test]
    fn interleaved_transactions_are_errors_not_mixtures(
        split in 1usize..3,
    ) {
        // A second transaction's events inside the first: the first is broken, the
        // second's END has no BEGIN; nothing half-applied comes out.
        let a = good_lines(1);
        let b: Vec<String> = good_lines(2)[4..].to_vec();
        let mut lines: Vec<Vec<u8>> = a[..split].iter().map(|l| l.clone().into_bytes()).collect();
        lines.extend(b[1..3].iter().map(|l| l.clone().into_bytes()));
        lines.extend(a[split..].iter().map(|l| l.clone().into_bytes()));
        let mut asm = TxnAssembler::new(TxnMode::Metadata);
        let emitted = replay(&lines, &mut asm)?;
        prop_assert!(emitted.is_empty(), "{:?}", emitted);
    }
}

fn json_value() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "[a-z0-9:=+/ .-]{0,12}".prop_map(Json::String),
        prop_oneof![
            Just("c"),
            Just("r"),
            Just("u"),
            Just("d"),
            Just("t"),
            Just("m"),
            Just("BEGIN"),
            Just("END")
        ]
        .prop_map(|s| Json::String(s.into())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Json::Array),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("op".to_owned()),
                    Just("status".to_owned()),
                    Just("id".to_owned()),
                    Just("after".to_owned()),
                    Just("before".to_owned()),
                    Just("source".to_owned()),
                    Just("table".to_owned()),
                    Just("transaction".to_owned()),
                    Just("ts_ms".to_owned()),
                    Just("event_count".to_owned()),
                    Just("data_collections".to_owned()),
                    Just("qty".to_owned()),
                    Just("a".to_owned()),
                    Just("b".to_owned()),
                ],
                inner,
                0..6,
            )
            .prop_map(|m| Json::Object(m.into_iter().collect())),
        ]
    })
}
