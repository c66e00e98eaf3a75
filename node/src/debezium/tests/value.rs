//! Value conversions: booleans, integers, floats, decimals, dates, timestamps, times.

use super::*;
use crate::debezium::value::*;
use base64::Engine as _;

fn no_field() -> FieldType<'static> {
    FieldType::default()
}

fn named(name: &'static str) -> FieldType<'static> {
    FieldType {
        name: Some(name),
        ..FieldType::default()
    }
}

/// [`convert`] into a nullable column of type `ty` with no declared precision.
fn conv(ty: ColumnType, v: &Json, field: FieldType<'_>) -> Result<Value, String> {
    convert(
        &ColumnDef::new("c", ty, true),
        v,
        field,
        &ParseOptions::default(),
    )
}

#[test]
fn booleans_integers_floats() {
    assert_eq!(to_bool(&json!(true)), Ok(true));
    assert_eq!(to_bool(&json!(0)), Ok(false));
    assert!(to_bool(&json!(2)).is_err());
    assert!(to_bool(&json!("true")).is_err());
    assert_eq!(to_int(&json!(-42)), Ok(-42));
    assert_eq!(to_int(&json!(i64::MIN)), Ok(i64::MIN));
    assert!(
        to_int(&json!(u64::MAX))
            .unwrap_err()
            .contains("does not fit in bigint")
    );
    assert!(to_int(&json!(1.5)).is_err());
    assert!(to_int(&json!("1")).is_err());
    assert_eq!(to_float(&json!(-1.25)), Ok(-1.25));
    assert_eq!(to_float(&json!(3)), Ok(3.0));
    assert!(to_float(&json!("NaN")).unwrap().is_nan());
    assert_eq!(to_float(&json!("-Infinity")), Ok(f64::NEG_INFINITY));
    assert!(to_float(&json!("1.5")).is_err());
    assert_eq!(
        conv(ColumnType::Utf8, &json!("héllo"), no_field()),
        Ok(Value::Utf8("héllo".into()))
    );
    assert_eq!(
        conv(ColumnType::Int32, &Json::Null, no_field()),
        Ok(Value::Null)
    );
}

#[test]
fn decimal_literals() {
    assert_eq!(parse_decimal("123.45", 2), Ok(12345));
    assert_eq!(parse_decimal("-0.5", 2), Ok(-50));
    assert_eq!(parse_decimal("+7", 3), Ok(7000));
    assert_eq!(parse_decimal(".5", 1), Ok(5));
    assert_eq!(parse_decimal("5.", 1), Ok(50));
    assert_eq!(parse_decimal("0", 0), Ok(0));
    assert_eq!(parse_decimal("-0.000", 2), Ok(0));
    // Extra fractional digits are fine when they are zeros, an error otherwise.
    assert_eq!(parse_decimal("1.2300", 2), Ok(123));
    assert!(
        parse_decimal("1.234", 2)
            .unwrap_err()
            .contains("does not fit at scale 2")
    );
    assert_eq!(parse_decimal("1.5e-3", 4), Ok(15));
    assert_eq!(parse_decimal("1E+3", 0), Ok(1000));
    assert_eq!(parse_decimal("1e21", 0), Ok(1_000_000_000_000_000_000_000));
    assert_eq!(parse_decimal(&format!("1.{}", "0".repeat(60)), 2), Ok(100));
    assert_eq!(
        parse_decimal("99999999999999999999999999999999999999", 0),
        Ok(10i128.pow(38) - 1)
    );
    assert!(parse_decimal("999999999999999999999999999999999999999", 0).is_err());
    assert!(parse_decimal("1e40", 0).is_err());
    assert!(parse_decimal("1e-99999", 2).is_err());
    for bad in [
        "", "-", ".", "1.2.3", "1,5", "abc", "1e", " 1", "--1", "1e5.5",
    ] {
        assert!(parse_decimal(bad, 2).is_err(), "{bad:?}");
    }
}

#[test]
fn decimal_bytes_and_numbers() {
    let enc = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    assert_eq!(decode_unscaled("MDk="), Ok(12345));
    assert_eq!(decode_unscaled("z8c="), Ok(-12345));
    assert_eq!(decode_unscaled(&enc(&[0xff])), Ok(-1));
    assert_eq!(decode_unscaled(&enc(&[0x00, 0x80])), Ok(128));
    assert_eq!(
        decode_unscaled(&enc(&i128::MIN.to_be_bytes())),
        Ok(i128::MIN)
    );
    // 17 bytes: fine when the first is sign extension.
    let mut long = vec![0xff];
    long.extend_from_slice(&(-5i128).to_be_bytes());
    assert_eq!(decode_unscaled(&enc(&long)), Ok(-5));
    let mut too_long = vec![0x01];
    too_long.extend_from_slice(&[0; 16]);
    assert!(decode_unscaled(&enc(&too_long)).is_err());
    assert!(decode_unscaled("").is_err());
    assert!(decode_unscaled("!!").is_err());

    // Connect Decimal at the envelope's scale (a string or a number), rescaled exactly to
    // the column's.
    let (scale_1, scale_4) = (json!("1"), json!(4));
    let decimal = |scale: &Json| {
        let f = FieldType {
            connect: Some("bytes"),
            name: Some(CONNECT_DECIMAL),
            scale: Some(scale),
        };
        to_decimal(&json!("MDk="), 2, f, DecimalHandling::String)
    };
    assert_eq!(decimal(&scale_1), Ok(123450));
    assert!(
        decimal(&scale_4)
            .unwrap_err()
            .contains("more fractional digits")
    );
    assert!(decimal(&json!("x")).unwrap_err().contains("not an integer"));
    assert_eq!(decimal(&json!("-1")), Ok(12_345_000));
    assert!(decimal(&json!(i64::MIN)).is_err());

    // decimal.handling.mode=double: through the number's decimal text.
    assert_eq!(
        to_decimal(&json!(123.45), 2, no_field(), DecimalHandling::Double),
        Ok(12345)
    );
    assert_eq!(
        to_decimal(&json!(-0.1), 3, no_field(), DecimalHandling::Double),
        Ok(-100)
    );
    assert_eq!(
        to_decimal(&json!(42), 2, no_field(), DecimalHandling::Double),
        Ok(4200)
    );
    assert!(to_decimal(&json!(0.1 + 0.2), 2, no_field(), DecimalHandling::Double).is_err());
    // decimal.handling.mode=string.
    let string_mode = DecimalHandling::String;
    assert_eq!(
        to_decimal(&json!("-0.5"), 2, no_field(), string_mode),
        Ok(-50)
    );
    // decimal.handling.mode=precise: bytes at the column's scale.
    let precise = DecimalHandling::Precise;
    assert_eq!(
        to_decimal(&json!("z8c="), 2, no_field(), precise),
        Ok(-12345)
    );
    let e = to_decimal(&json!("1.2.3"), 2, no_field(), string_mode).unwrap_err();
    assert!(e.contains("is not a decimal number"), "{e}");
    assert!(to_decimal(&json!("1.2.3"), 2, no_field(), precise).is_err());
    // An envelope that says `string` never reads bytes; one that says `bytes` always does.
    let string = FieldType {
        connect: Some("string"),
        ..FieldType::default()
    };
    assert!(to_decimal(&json!("z8c="), 2, string, precise).is_err());
    let bytes = FieldType {
        connect: Some("bytes"),
        ..FieldType::default()
    };
    assert_eq!(
        to_decimal(&json!("MTI="), 2, bytes, string_mode),
        Ok(0x3132)
    );
    // io.debezium.data.VariableScaleDecimal.
    assert!(
        to_decimal(
            &json!({"scale": 3, "value": "MDk="}),
            2,
            no_field(),
            DecimalHandling::Double
        )
        .is_err()
    );
    assert_eq!(
        to_decimal(
            &json!({"scale": 1, "value": "MDk="}),
            2,
            no_field(),
            DecimalHandling::Double
        ),
        Ok(123450)
    );
    assert!(
        to_decimal(
            &json!({"value": "MDk="}),
            2,
            no_field(),
            DecimalHandling::Double
        )
        .is_err()
    );
    assert!(to_decimal(&json!(true), 2, no_field(), DecimalHandling::Double).is_err());
    assert_eq!(rescale(-1230, 3, 2), Ok(-123));
    assert!(rescale(i128::MAX, 0, 2).is_err());
    assert_eq!(rescale(0, 60, 2), Ok(0));
}

#[test]
fn integer_times() {
    let ts = |v: i64, name: Option<&'static str>| to_timestamp(&json!(v), name, None);
    assert_eq!(
        ts(1_700_000_000_123, Some(TIMESTAMP_MS)),
        Ok(1_700_000_000_123_000)
    );
    assert_eq!(
        ts(1_700_000_000_123, Some(CONNECT_TIMESTAMP_MS)),
        Ok(1_700_000_000_123_000)
    );
    assert_eq!(
        ts(1_700_000_000_123_456, Some(TIMESTAMP_US)),
        Ok(1_700_000_000_123_456)
    );
    // A bare integer (no envelope) is microseconds.
    assert_eq!(ts(1_700_000_000_123_456, None), Ok(1_700_000_000_123_456));
    assert_eq!(
        ts(1_700_000_000_123_456_789, Some(TIMESTAMP_NS)),
        Ok(1_700_000_000_123_456)
    );
    // Nanoseconds round toward negative infinity.
    assert_eq!(ts(-1, Some(TIMESTAMP_NS)), Ok(-1));
    assert_eq!(ts(-1_001, Some(TIMESTAMP_NS)), Ok(-2));
    assert_eq!(ts(-1_000, Some(TIMESTAMP_NS)), Ok(-1));
    assert_eq!(ts(-86_400_000, Some(TIMESTAMP_MS)), Ok(-MICROS_PER_DAY));
    assert!(ts(i64::MAX, Some(TIMESTAMP_MS)).is_err());
    // Times of day into a timestamp column are on 1970-01-01.
    assert_eq!(ts(45_296_000_000, Some(TIME_US)), Ok(45_296_000_000));
    assert_eq!(ts(45_296_000, Some(TIME_MS)), Ok(45_296_000_000));
    assert_eq!(ts(45_296_000_000_123, Some(TIME_NS)), Ok(45_296_000_000));
    assert_eq!(ts(2, Some(DATE)), Ok(2 * MICROS_PER_DAY));
    assert!(ts(1, Some("io.debezium.time.Year")).is_err());
    assert!(to_timestamp(&json!(1.5), None, None).is_err());
    assert!(to_timestamp(&json!(true), None, None).is_err());
    // Into an integer column a time of day stays as is.
    assert_eq!(
        conv(ColumnType::Int64, &json!(45_296_000_000i64), named(TIME_US)),
        Ok(Value::Int(45_296_000_000))
    );
    assert_eq!(
        conv(
            ColumnType::Timestamp,
            &json!(45_296_000_000i64),
            named(TIME_US)
        ),
        Ok(Value::Timestamp(45_296_000_000))
    );
}

#[test]
fn dates() {
    assert_eq!(to_date(&json!(19783), Some(DATE)), Ok(19783));
    assert_eq!(to_date(&json!(19783), None), Ok(19783));
    assert_eq!(to_date(&json!(-719_162), Some(CONNECT_DATE)), Ok(-719_162));
    assert_eq!(to_date(&json!("2024-03-01"), None), Ok(19783));
    assert_eq!(to_date(&json!("1969-12-31"), None), Ok(-1));
    assert_eq!(to_date(&json!("0001-01-01"), None), Ok(-719_162));
    // A timestamp at midnight is a date (Oracle DATE); elsewhere it is not.
    assert_eq!(to_date(&json!(-86_400_000), Some(TIMESTAMP_MS)), Ok(-1));
    assert!(to_date(&json!(1), Some(TIMESTAMP_MS)).is_err());
    assert!(to_date(&json!(0), Some(TIME_US)).is_err());
    assert!(to_date(&json!(1i64 << 40), None).is_err());
    assert!(to_date(&json!("2024-02-30"), None).is_err());
    assert!(to_date(&json!("01/03/2024"), None).is_err());
    assert!(to_date(&json!(true), None).is_err());
}

#[test]
fn timestamp_strings() {
    let base = 1_709_296_496_000_000; // 2024-03-01T12:34:56Z
    let cases = [
        ("2024-03-01T12:34:56Z", base),
        ("2024-03-01T12:34:56.789Z", base + 789_000),
        ("2024-03-01T12:34:56.123456789Z", base + 123_456),
        ("2024-03-01T14:34:56+02:00", base),
        ("2024-03-01T07:04:56.5-05:30", base + 500_000),
        ("2024-03-01 14:34:56+02:00", base),
        ("2024-03-01T14:34:56+0200", base),
        ("2024-03-01T14:34:56+02", base),
        ("2024-03-01 12:34:56", base),
        ("2024-03-01 12:34:56.000001", base + 1),
        ("2024-03-01T12:34:56", base),
        ("2024-03-01", base - 45_296_000_000),
        ("1969-12-31T23:59:59.9999995Z", -1),
        ("1970-01-01T00:00:00Z", 0),
    ];
    for (text, micros) in cases {
        assert_eq!(parse_timestamp(text), Ok(micros), "{text}");
    }
    for bad in [
        "",
        "infinity",
        "2024-03-01T25:00:00Z",
        "12:34:56",
        "2024-03-01X12:34:56",
    ] {
        let e = parse_timestamp(bad).unwrap_err();
        assert!(e.contains("is not a timestamp"), "{bad}: {e}");
    }
    assert_eq!(
        conv(
            ColumnType::Timestamp,
            &json!("2024-03-01T12:34:56Z"),
            named("io.debezium.time.ZonedTimestamp")
        ),
        Ok(Value::Timestamp(base))
    );
}
