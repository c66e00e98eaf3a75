//! Reading Kafka: a tokio runtime on a thread of its own runs one fetch task per partition
//! (rskafka, explicit partition assignment: the node owns every partition of its topics, no
//! consumer group). Each task reads ahead into a small bounded queue of its own, so the sink
//! chooses which partitions to take from: one it does not take from stops fetching once its
//! queue is full.

use std::sync::Arc;
use std::time::Duration;

use rskafka::client::error::{Error, ProtocolError};
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::RecordAndOffset;

use super::spec::KafkaSpec;

/// Fetch responses a partition's task holds ahead of the sink.
const READ_AHEAD: usize = 4;
/// Most bytes one fetch asks for.
const FETCH_BYTES: i32 = 4 << 20;
/// How long the broker may hold a fetch while the partition has nothing new.
const FETCH_WAIT_MS: i32 = 50;
/// How long a request may take before the source gives up (rskafka retries until then).
const REQUEST_DEADLINE: Duration = Duration::from_secs(30);

/// What a partition's task hands the sink. Failures that may pass (a broker restarting, a
/// leader moving) are retried with backoff and logged; only lost records end the task.
pub enum Fetched {
    /// Records, and the partition's high watermark then.
    Records(Vec<RecordAndOffset>, i64),
    /// Fetching failed for good (the message names the partition).
    Failed(String),
}

/// One partition being read.
pub struct Partition {
    /// `topic/partition`: how checkpoints and errors name it.
    pub name: Arc<str>,
    pub rx: flume::Receiver<Fetched>,
    /// The high watermark when it was opened: the sink has caught up once it read that far.
    pub end_at_open: i64,
    /// The high watermark the last fetch saw.
    pub high: i64,
}

/// The connection to the brokers and the runtime its tasks run on.
pub struct Kafka {
    client: Arc<Client>,
    runtime: tokio::runtime::Handle,
    /// Dropped to stop the runtime's thread.
    _stop: flume::Sender<()>,
    /// Each fetch task's nudge when it queued a response.
    wake_tx: flume::Sender<()>,
    pub wake: flume::Receiver<()>,
}

impl Kafka {
    pub fn connect(spec: &KafkaSpec) -> Result<Kafka, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("a tokio runtime for Kafka: {e}"))?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = flume::bounded::<()>(1);
        std::thread::Builder::new()
            .name("retina-kafka".into())
            .spawn(move || {
                runtime.block_on(async move { while stopped.recv_async().await.is_ok() {} })
            })
            .map_err(|e| format!("the Kafka thread: {e}"))?;
        let brokers = spec.brokers.clone();
        let client = handle
            .block_on(async {
                tokio::time::timeout(REQUEST_DEADLINE, ClientBuilder::new(brokers).build()).await
            })
            .map_err(|_| format!("{spec}: no broker answered within {REQUEST_DEADLINE:?}"))?
            .map_err(|e| format!("{spec}: {e}"))?;
        let (wake_tx, wake) = flume::bounded(1);
        Ok(Kafka {
            client: Arc::new(client),
            runtime: handle,
            _stop: stop,
            wake_tx,
            wake,
        })
    }

    /// Runs `f` to completion on the runtime, giving up after [`REQUEST_DEADLINE`].
    pub fn block_on<T, E: std::fmt::Display>(
        &self,
        what: &str,
        f: impl Future<Output = Result<T, E>>,
    ) -> Result<T, String> {
        self.runtime
            .block_on(async { tokio::time::timeout(REQUEST_DEADLINE, f).await })
            .map_err(|_| format!("{what}: no answer within {REQUEST_DEADLINE:?}"))?
            .map_err(|e| format!("{what}: {e}"))
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn controller(&self) -> Result<rskafka::client::controller::ControllerClient, String> {
        self.client
            .controller_client()
            .map_err(|e| format!("the Kafka controller: {e}"))
    }

    /// Every topic's partitions, by name.
    pub fn topics(&self) -> Result<Vec<(String, Vec<i32>)>, String> {
        let topics = self.block_on("listing Kafka topics", self.client.list_topics())?;
        Ok(topics
            .into_iter()
            .map(|t| (t.name, t.partitions.into_iter().collect()))
            .collect())
    }

    async fn partition_client(
        &self,
        topic: &str,
        partition: i32,
    ) -> Result<PartitionClient, String> {
        self.client
            .partition_client(topic, partition, UnknownTopicHandling::Retry)
            .await
            .map_err(|e| format!("{topic}/{partition}: {e}"))
    }

    /// Opens `topic/partition` at `offset` (`None`: its earliest) and starts its fetch task.
    pub fn open(
        &self,
        topic: &str,
        partition: i32,
        offset: Option<i64>,
    ) -> Result<(Partition, i64), String> {
        let name: Arc<str> = format!("{topic}/{partition}").into();
        let client = self.block_on(&name, self.partition_client(topic, partition))?;
        let earliest = self.block_on(&name, client.get_offset(OffsetAt::Earliest))?;
        let latest = self.block_on(&name, client.get_offset(OffsetAt::Latest))?;
        let start = offset.unwrap_or(earliest);
        if start < earliest {
            return Err(format!(
                "{name}: the checkpoint resumes at offset {start}, but the partition begins at \
                 {earliest} now (retention deleted what the node still needs): replay from a new \
                 data directory, or keep the topics longer"
            ));
        }
        let (tx, rx) = flume::bounded(READ_AHEAD);
        let wake = self.wake_tx.clone();
        let task_name = name.clone();
        self.runtime
            .spawn(fetch_task(client, start, tx, wake, task_name));
        Ok((
            Partition {
                name,
                rx,
                end_at_open: latest,
                high: latest,
            },
            start,
        ))
    }
}

async fn fetch_task(
    client: PartitionClient,
    mut offset: i64,
    tx: flume::Sender<Fetched>,
    wake: flume::Sender<()>,
    name: Arc<str>,
) {
    let mut failures = 0u32;
    loop {
        let fetched = tokio::time::timeout(
            REQUEST_DEADLINE,
            client.fetch_records(offset, 1..FETCH_BYTES, FETCH_WAIT_MS),
        )
        .await;
        let msg = match fetched {
            Ok(Ok((records, _))) if records.is_empty() => {
                failures = 0;
                continue;
            }
            Ok(Ok((records, high))) => {
                failures = 0;
                offset = records.last().expect("not empty").offset + 1;
                Fetched::Records(records, high)
            }
            // Records the node still needs are gone: no retry brings them back.
            Ok(Err(Error::ServerError {
                protocol_error: ProtocolError::OffsetOutOfRange,
                ..
            })) => Fetched::Failed(format!(
                "{name}: offset {offset} is out of the partition's range (retention deleted \
                 records the node still needs, or the topic was recreated)"
            )),
            // A broker restarting, a leader moving, the network: retried, with a warning.
            Ok(Err(e)) => {
                retry(&name, offset, &e.to_string(), &mut failures).await;
                continue;
            }
            Err(_) => {
                let why = format!("no answer within {REQUEST_DEADLINE:?}");
                retry(&name, offset, &why, &mut failures).await;
                continue;
            }
        };
        let failed = matches!(msg, Fetched::Failed(_));
        if tx.send_async(msg).await.is_err() || failed {
            let _ = wake.try_send(());
            return;
        }
        let _ = wake.try_send(());
    }
}

/// Waits before fetching again after a failure: 100 ms, doubling up to 10 s.
async fn retry(name: &str, offset: i64, why: &str, failures: &mut u32) {
    *failures += 1;
    let wait = Duration::from_millis(100 << (*failures - 1).min(7)).min(Duration::from_secs(10));
    tracing::warn!("{name}: fetching from offset {offset} failed ({why}); again in {wait:?}");
    tokio::time::sleep(wait).await;
}
