//! Writes a Debezium JSON stream (one message per line, as the file source reads it) into
//! Kafka in Debezium's own layout: BEGIN and END on the transaction topic, each change event
//! on `PREFIX.SCHEMA.TABLE` (`PREFIX.DATABASE.TABLE` without a schema) keyed by its primary
//! key (the JSON object of the key columns) and partitioned by a hash of it. What the
//! benchmarks and tests load into a broker, and a way to move a captured stream there.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rskafka::client::partition::{Compression, PartitionClient, UnknownTopicHandling};
use rskafka::record::Record;
use serde_json::Value as Json;

use super::fetch::Kafka;
use super::spec::KafkaSpec;
use crate::catalog::Catalog;

/// Records sent to one partition in one request.
const BATCH_RECORDS: usize = 2_000;

/// What [`produce_lines`] wrote.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProduceReport {
    /// Records per topic.
    pub topics: BTreeMap<String, u64>,
    /// Lines that are no BEGIN, END or change event (heartbeats, schema changes): not written.
    pub skipped: u64,
}

/// Writes `lines` into `spec`'s brokers in Debezium's layout (see the module), creating the
/// topics (the data topics with `partitions` partitions, the transaction topic with one) when
/// they do not exist. `catalog` gives each table's key columns.
pub fn produce_lines<'a>(
    spec: &KafkaSpec,
    catalog: &Catalog,
    partitions: i32,
    lines: impl IntoIterator<Item = &'a str>,
) -> Result<ProduceReport, String> {
    let kafka = Kafka::connect(spec)?;
    let mut existing: BTreeMap<String, i32> = kafka
        .topics()?
        .into_iter()
        .map(|(t, p)| (t, p.len() as i32))
        .collect();
    let mut report = ProduceReport::default();
    let mut pending: BTreeMap<(String, i32), Vec<Record>> = BTreeMap::new();
    let mut clients = BTreeMap::new();
    for (n, line) in lines.into_iter().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let at = || format!("line {}", n + 1);
        let json: Json =
            serde_json::from_str(line).map_err(|e| format!("{}: not JSON: {e}", at()))?;
        let payload = json.get("payload").unwrap_or(&json);
        let (topic, key) = if payload.get("status").and_then(Json::as_str).is_some() {
            (spec.transaction_topic.clone(), payload.get("id").map(Json::to_string))
        } else if let Some(source) = payload.get("source").filter(|_| payload.get("op").is_some()) {
            let table = source.get("table").and_then(Json::as_str);
            let ns = source
                .get("schema")
                .and_then(Json::as_str)
                .or_else(|| source.get("db").and_then(Json::as_str));
            let (Some(ns), Some(table)) = (ns, table) else {
                return Err(format!("{}: its source names no table", at()));
            };
            let collection = format!("{ns}.{table}");
            let key = catalog
                .resolve(&collection)
                .or_else(|| catalog.resolve(table))
                .and_then(|id| catalog.get(id))
                .and_then(|schema| {
                    let row = payload
                        .get("after")
                        .filter(|r| !r.is_null())
                        .or_else(|| payload.get("before"))?;
                    let key: serde_json::Map<String, Json> = schema
                        .primary_key()
                        .iter()
                        .map(|&c| {
                            let name = schema.columns()[c].name.clone();
                            let v = row.get(&name).cloned().unwrap_or(Json::Null);
                            (name, v)
                        })
                        .collect();
                    Some(Json::Object(key).to_string())
                });
            (format!("{}.{collection}", spec.topic_prefix), key)
        } else {
            report.skipped += 1;
            continue;
        };
        let count = if topic == spec.transaction_topic { 1 } else { partitions };
        if !existing.contains_key(&topic) {
            create_topic(&kafka, &topic, count)?;
            existing.insert(topic.clone(), count);
        }
        let partition = match &key {
            Some(k) if existing[&topic] > 1 => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                k.hash(&mut h);
                (h.finish() % existing[&topic] as u64) as i32
            }
            _ => 0,
        };
        *report.topics.entry(topic.clone()).or_default() += 1;
        let batch = pending.entry((topic.clone(), partition)).or_default();
        batch.push(Record {
            key: key.map(String::into_bytes),
            value: Some(line.as_bytes().to_vec()),
            headers: BTreeMap::new(),
            timestamp: now(),
        });
        if batch.len() >= BATCH_RECORDS {
            let batch = std::mem::take(batch);
            send(&kafka, &mut clients, &topic, partition, batch)?;
        }
    }
    for ((topic, partition), batch) in pending {
        send(&kafka, &mut clients, &topic, partition, batch)?;
    }
    Ok(report)
}

fn now() -> chrono::DateTime<chrono::Utc> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as i64;
    chrono::DateTime::from_timestamp_millis(ms).expect("now is a valid time")
}

fn create_topic(kafka: &Kafka, topic: &str, partitions: i32) -> Result<(), String> {
    let controller = kafka.controller()?;
    kafka.block_on(
        &format!("creating topic {topic}"),
        controller.create_topic(topic, partitions, 1, 30_000),
    )
}

fn send(
    kafka: &Kafka,
    clients: &mut BTreeMap<(String, i32), PartitionClient>,
    topic: &str,
    partition: i32,
    batch: Vec<Record>,
) -> Result<(), String> {
    if batch.is_empty() {
        return Ok(());
    }
    let what = format!("writing to {topic}/{partition}");
    let key = (topic.to_owned(), partition);
    if !clients.contains_key(&key) {
        let client = kafka.block_on(
            &what,
            kafka
                .client()
                .partition_client(topic, partition, UnknownTopicHandling::Retry),
        )?;
        clients.insert(key.clone(), client);
    }
    kafka.block_on(&what, clients[&key].produce(batch, Compression::NoCompression))?;
    Ok(())
}
