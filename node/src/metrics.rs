//! Node status as Prometheus text over HTTP (`--metrics ADDR`): a small blocking server on its
//! own thread, reading the counters and gauges the actors keep in [`NodeStatus`].

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::status::NodeStatus;

/// Largest request head read before answering.
const MAX_REQUEST_BYTES: usize = 8 << 10;

/// Serves `/metrics` (any path) on `addr` until [`stop`], reading the status `status` gives
/// (a node restarted in the same process has a new one). Returns the bound address. Each
/// request is answered as it arrives (the thread blocks in `accept`).
pub fn serve(
    addr: SocketAddr,
    status: impl Fn() -> Arc<NodeStatus> + Send + 'static,
    stop: Arc<AtomicBool>,
) -> std::io::Result<(SocketAddr, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    let handle = std::thread::Builder::new()
        .name("retina-metrics".into())
        .spawn(move || {
            let mut rate = Rate::new(status().rows_applied.load(Ordering::Relaxed));
            loop {
                let accepted = listener.accept();
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                match accepted {
                    Ok((stream, _)) => {
                        let status = status();
                        rate.sample(status.rows_applied.load(Ordering::Relaxed));
                        let _ = answer(stream, &render(&status, rate.per_second));
                    }
                    Err(e) => {
                        tracing::warn!("metrics: {e}");
                        // Out of descriptors, say: do not spin.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            }
        })?;
    Ok((bound, handle))
}

/// Stops the server [`serve`] started on `bound` once `stop` is set: wakes its `accept`, and
/// waits for the thread.
pub fn stop(bound: SocketAddr, thread: std::thread::JoinHandle<()>) {
    let _ = TcpStream::connect(bound);
    let _ = thread.join();
}

/// Rows per second between scrapes (over at least a second).
struct Rate {
    at: Instant,
    rows: u64,
    per_second: f64,
}

impl Rate {
    fn new(rows: u64) -> Self {
        Rate {
            at: Instant::now(),
            rows,
            per_second: 0.0,
        }
    }

    fn sample(&mut self, rows: u64) {
        let dt = self.at.elapsed();
        if dt >= Duration::from_secs(1) {
            // A node restarted in the process counts from 0 again.
            self.per_second = rows.saturating_sub(self.rows) as f64 / dt.as_secs_f64();
            self.at = Instant::now();
            self.rows = rows;
        }
    }
}

fn answer(mut stream: TcpStream, body: &str) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// The Prometheus text exposition of the node's status.
pub fn render(s: &NodeStatus, rows_per_second: f64) -> String {
    let mut out = String::new();
    let load = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed).to_string();
    let flag = |b: bool| u8::from(b).to_string();
    let metrics: [(&str, &str, &str, String); 30] = [
        (
            "retina_hwm",
            "gauge",
            "High watermark: every transaction below it is visible.",
            load(&s.hwm),
        ),
        (
            "retina_lwm",
            "gauge",
            "Low watermark: no running query reads below it.",
            load(&s.lwm),
        ),
        (
            "retina_retain_lwm",
            "gauge",
            "No running query reads below it, long ones reading from visibility checkpoints included: retired objects wait for it.",
            load(&s.retain_lwm),
        ),
        (
            "retina_vis_checkpointed_queries",
            "gauge",
            "Long queries reading from a visibility checkpoint (they no longer hold LWM).",
            load(&s.vis_checkpoints),
        ),
        (
            "retina_gc_runs_total",
            "counter",
            "Memory GC runs, over all shards.",
            load(&s.gc_runs),
        ),
        (
            "retina_files_rewritten_total",
            "counter",
            "Regular files storage GC rewrote without their dead rows.",
            load(&s.files_rewritten),
        ),
        (
            "retina_transactions_submitted_total",
            "counter",
            "Source transactions handed to the shards.",
            load(&s.txns_submitted),
        ),
        (
            "retina_transactions_applied_total",
            "counter",
            "Source transactions visible (below HWM) since the node started.",
            load(&s.txns_applied),
        ),
        (
            "retina_rows_applied_total",
            "counter",
            "Row operations the shards in this process applied.",
            load(&s.rows_applied),
        ),
        (
            "retina_remote_batch_bytes_total",
            "counter",
            "Bytes of batches a cluster's leader sent to shards other members run.",
            load(&s.remote_batch_bytes),
        ),
        (
            "retina_shard_restarts_total",
            "counter",
            "Shards a cluster's leader started again on a live member after the member running \
             it was lost, while the other shards went on.",
            load(&s.shard_restarts),
        ),
        (
            "retina_rows_per_second",
            "gauge",
            "Rows applied per second over the last second.",
            format!("{rows_per_second:.1}"),
        ),
        (
            "retina_backlog_batches",
            "gauge",
            "Batches sent to shards and not yet applied.",
            load(&s.backlog_batches),
        ),
        (
            "retina_duplicates_skipped_total",
            "counter",
            "Source transactions skipped as already applied.",
            load(&s.duplicates_skipped),
        ),
        (
            "retina_dead_lettered_total",
            "counter",
            "Transactions written to the dead-letter file.",
            load(&s.dead_lettered),
        ),
        (
            "retina_heartbeats_skipped_total",
            "counter",
            "Debezium heartbeats read and skipped.",
            load(&s.heartbeats_skipped),
        ),
        (
            "retina_logical_messages_skipped_total",
            "counter",
            "Debezium logical decoding messages (op m) read and skipped.",
            load(&s.messages_skipped),
        ),
        (
            "retina_schema_changes_skipped_total",
            "counter",
            "Debezium schema change events read and skipped (the catalog DDL decides).",
            load(&s.schema_changes_skipped),
        ),
        (
            "retina_transaction_restarts_total",
            "counter",
            "Open transactions restarted by a repeated BEGIN (a redelivery after a partial one).",
            load(&s.txn_restarts),
        ),
        (
            "retina_running_queries",
            "gauge",
            "Queries holding a snapshot.",
            load(&s.running_queries),
        ),
        (
            "retina_checkpoint_id",
            "gauge",
            "The newest complete checkpoint (0: none); a restart resumes from it.",
            load(&s.checkpoint_id),
        ),
        (
            "retina_checkpoint_ts",
            "gauge",
            "The timestamp the newest complete checkpoint was taken at.",
            load(&s.checkpoint_ts),
        ),
        (
            "retina_replay_stopped",
            "gauge",
            "1 when an error stopped replay (see the log).",
            flag(s.error().is_some()),
        ),
        (
            "retina_source_done",
            "gauge",
            "1 when the source reached its end.",
            flag(s.source_done.load(Ordering::Relaxed)),
        ),
        (
            "retina_source_lag_records",
            "gauge",
            "Records the source holds that the sink has not read yet (Kafka: over all partitions).",
            load(&s.source_lag),
        ),
        (
            "retina_source_lag_wal_bytes",
            "gauge",
            "Postgres: bytes of WAL the server has written past the change the sink read last.",
            load(&s.source_lag_wal_bytes),
        ),
        (
            "retina_checkpoints_failed_total",
            "counter",
            "Checkpoints that failed (an image or record the lake or disk refused); each is put again.",
            load(&s.checkpoints_failed),
        ),
        (
            "retina_checkpoint_in_progress",
            "gauge",
            "1 while a checkpoint is on its way through the shards.",
            flag(s.checkpoint_in_progress.load(Ordering::Relaxed)),
        ),
        (
            "retina_cluster_epoch",
            "gauge",
            "A cluster's leader: the epoch of its leadership (0: a node on its own).",
            load(&s.cluster_epoch),
        ),
        (
            "retina_cluster_lease_seconds",
            "gauge",
            "A cluster's leader: how long its lease stands without another renewal; replay pauses at 0.",
            s.lease
                .get()
                .map_or(0.0, |l| l.remaining().as_secs_f64())
                .to_string(),
        ),
    ];
    for (name, kind, help, value) in metrics {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
    let _ = writeln!(
        out,
        "# HELP retina_io_in_flight Lake writes the I/O thread has in hand, by kind.\n\
         # TYPE retina_io_in_flight gauge"
    );
    for kind in crate::status::IoKind::ALL {
        let _ = writeln!(
            out,
            "retina_io_in_flight{{kind=\"{}\"}} {}",
            kind.name(),
            s.io_in_flight[kind as usize].load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP retina_queue_depth Messages waiting in each actor's queue.\n\
         # TYPE retina_queue_depth gauge"
    );
    let queues = s.queues.get().map_or(&[][..], |q| &q[..]);
    for q in queues {
        let _ = writeln!(
            out,
            "retina_queue_depth{{queue=\"{}\"}} {}",
            q.queue,
            q.depth()
        );
    }
    let _ = writeln!(
        out,
        "# HELP retina_queue_capacity Messages each actor's queue holds before senders wait.\n\
         # TYPE retina_queue_capacity gauge"
    );
    for q in queues {
        let _ = writeln!(
            out,
            "retina_queue_capacity{{queue=\"{}\"}} {}",
            q.queue, q.capacity
        );
    }
    let _ = writeln!(
        out,
        "# HELP retina_shard_applied_ts The timestamp each shard applied through, wherever it runs.\n# TYPE retina_shard_applied_ts gauge"
    );
    for (i, a) in s.shard_applied.iter().enumerate() {
        let _ = writeln!(
            out,
            "retina_shard_applied_ts{{shard=\"{i}\"}} {}",
            a.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(
        out,
        "# HELP retina_memory_bytes Memory by shard and structure.\n# TYPE retina_memory_bytes gauge"
    );
    for (i, m) in s.shard_memory.iter().enumerate() {
        for (structure, v) in [
            ("index", &m.index_bytes),
            ("write_buffer", &m.write_buffer_bytes),
            ("visibility", &m.visibility_bytes),
        ] {
            let _ = writeln!(
                out,
                "retina_memory_bytes{{shard=\"{i}\",structure=\"{structure}\"}} {}",
                v.load(Ordering::Relaxed)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::QueueProbe;

    #[test]
    fn every_actor_queue_shows_its_depth_and_capacity() {
        let status = NodeStatus::new(1);
        let (tx, rx) = flume::bounded::<u8>(8);
        for i in 0..3 {
            tx.send(i).unwrap();
        }
        let _ = status
            .queues
            .set(vec![QueueProbe::of("shard-0-data".into(), &tx)]);
        let text = render(&status, 0.0);
        assert!(
            text.contains("retina_queue_depth{queue=\"shard-0-data\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("retina_queue_capacity{queue=\"shard-0-data\"} 8"),
            "{text}"
        );
        // The probe keeps no sender: the queue closes with its last one.
        drop(tx);
        assert!(rx.recv().is_ok() && rx.is_disconnected());
        assert!(render(&status, 0.0).contains("retina_queue_depth{queue=\"shard-0-data\"} 0"));
    }
}
