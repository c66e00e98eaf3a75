//! Writes a Debezium JSON stream (one message per line, as the file source reads it) into
//! Kafka in Debezium's own layout: BEGIN and END on the transaction topic, each change event
//! on `PREFIX.SCHEMA.TABLE` (`PREFIX.DATABASE.TABLE` without a schema) keyed by its primary
//! key (the JSON object of the key columns) and partitioned by a hash of it. What the
//! benchmarks and tests load into a broker, and a way to move a captured stream there.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
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
    catalog: &Arc<Catalog>,
    partitions: i32,
    lines: impl IntoIterator<Item = &'a str>,
) -> Result<ProduceReport, String> {
    let mut producer = Producer::connect(spec, catalog.clone(), partitions)?;
    producer.send(lines)?;
    Ok(producer.report)
}

/// A connection writing Debezium JSON lines into Kafka in Debezium's layout; see
/// [`produce_lines`].
pub struct Producer {
    kafka: Kafka,
    spec: KafkaSpec,
    catalog: Arc<Catalog>,
    partitions: i32,
    /// Topics and their partition counts.
    existing: BTreeMap<String, i32>,
    clients: BTreeMap<(String, i32), PartitionClient>,
    /// What was written so far.
    pub report: ProduceReport,
    /// Follow each delete with a tombstone (a null value with its key), as Debezium does by
    /// default (`tombstones.on.delete`).
    pub tombstones: bool,
}

impl Producer {
    pub fn connect(
        spec: &KafkaSpec,
        catalog: Arc<Catalog>,
        partitions: i32,
    ) -> Result<Self, String> {
        let kafka = Kafka::connect(spec)?;
        let existing = kafka
            .topics()?
            .into_iter()
            .map(|(t, p)| (t, p.len() as i32))
            .collect();
        Ok(Producer {
            kafka,
            spec: spec.clone(),
            catalog,
            partitions,
            existing,
            clients: BTreeMap::new(),
            report: ProduceReport::default(),
            tombstones: false,
        })
    }

    /// Writes `lines`, in order within each partition, and waits until the brokers have them.
    pub fn send<'l>(&mut self, lines: impl IntoIterator<Item = &'l str>) -> Result<(), String> {
        let mut pending: BTreeMap<(String, i32), Vec<Record>> = BTreeMap::new();
        for (n, line) in lines.into_iter().enumerate() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            let Some((topic, key, delete)) = self
                .place(line)
                .map_err(|e| format!("line {}: {e}", n + 1))?
            else {
                self.report.skipped += 1;
                continue;
            };
            let count = if topic == self.spec.transaction_topic {
                1
            } else {
                self.partitions
            };
            if !self.existing.contains_key(&topic) {
                let controller = self.kafka.controller()?;
                self.kafka.block_on(
                    &format!("creating topic {topic}"),
                    controller.create_topic(&topic, count, 1, 30_000),
                )?;
                self.existing.insert(topic.clone(), count);
            }
            let partition = match &key {
                Some(k) if self.existing[&topic] > 1 => {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    k.hash(&mut h);
                    (h.finish() % self.existing[&topic] as u64) as i32
                }
                _ => 0,
            };
            *self.report.topics.entry(topic.clone()).or_default() += 1;
            let batch = pending.entry((topic.clone(), partition)).or_default();
            let key = key.map(String::into_bytes);
            if delete && self.tombstones {
                batch.push(Record {
                    key: key.clone(),
                    value: Some(line.as_bytes().to_vec()),
                    headers: BTreeMap::new(),
                    timestamp: now(),
                });
                batch.push(Record {
                    key,
                    value: None,
                    headers: BTreeMap::new(),
                    timestamp: now(),
                });
            } else {
                batch.push(Record {
                    key,
                    value: Some(line.as_bytes().to_vec()),
                    headers: BTreeMap::new(),
                    timestamp: now(),
                });
            }
            if batch.len() >= BATCH_RECORDS {
                let batch = std::mem::take(batch);
                self.write(&topic, partition, batch)?;
            }
        }
        self.write_all(pending)
    }

    /// The topic of `line`, its key (the transaction id on the transaction topic, the key
    /// columns' JSON object on a table's) and whether it is a delete, or `None` for a line that
    /// is neither.
    #[allow(clippy::type_complexity)]
    fn place(&self, line: &str) -> Result<Option<(String, Option<String>, bool)>, String> {
        let json: Json = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
        let payload = json.get("payload").unwrap_or(&json);
        if payload.get("status").and_then(Json::as_str).is_some() {
            return Ok(Some((
                self.spec.transaction_topic.clone(),
                payload.get("id").map(Json::to_string),
                false,
            )));
        }
        let Some(source) = payload
            .get("source")
            .filter(|_| payload.get("op").is_some())
        else {
            return Ok(None);
        };
        let table = source.get("table").and_then(Json::as_str);
        let ns = source
            .get("schema")
            .and_then(Json::as_str)
            .or_else(|| source.get("db").and_then(Json::as_str));
        let (Some(ns), Some(table)) = (ns, table) else {
            return Err("its source names no table".into());
        };
        let collection = format!("{ns}.{table}");
        let catalog = &self.catalog;
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
        let delete = payload.get("op").and_then(Json::as_str) == Some("d");
        Ok(Some((
            format!("{}.{collection}", self.spec.topic_prefix),
            key,
            delete,
        )))
    }

    fn write(&mut self, topic: &str, partition: i32, batch: Vec<Record>) -> Result<(), String> {
        self.write_all(BTreeMap::from([((topic.to_owned(), partition), batch)]))
    }

    /// Writes every partition's batch, the partitions at once (one request each).
    fn write_all(&mut self, batches: BTreeMap<(String, i32), Vec<Record>>) -> Result<(), String> {
        for (topic, partition) in batches.keys() {
            let key = (topic.clone(), *partition);
            if !self.clients.contains_key(&key) {
                let client = self.kafka.block_on(
                    &format!("writing to {topic}/{partition}"),
                    self.kafka.client().partition_client(
                        topic,
                        *partition,
                        UnknownTopicHandling::Retry,
                    ),
                )?;
                self.clients.insert(key, client);
            }
        }
        let clients = &self.clients;
        let writes = batches
            .into_iter()
            .filter(|(_, batch)| !batch.is_empty())
            .map(|(key, batch)| async move {
                clients[&key]
                    .produce(batch, Compression::NoCompression)
                    .await
                    .map_err(|e| format!("writing to {}/{}: {e}", key.0, key.1))
            });
        self.kafka
            .block_on("writing to Kafka", futures::future::try_join_all(writes))?;
        Ok(())
    }
}

fn now() -> chrono::DateTime<chrono::Utc> {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis() as i64;
    chrono::DateTime::from_timestamp_millis(ms).expect("now is a valid time")
}
