//! The leader's side of a remote shard: a connection to the member that runs it, and two
//! threads. The writer takes the shard's queues as a local shard would (its control queue
//! first) and sends each message as a frame; a batch waits for credit, which the host grants
//! as its shard's queue takes batches, so a slow remote shard holds back the sink as a local
//! one does. The reader hands the shard's messages to the coordinator. A connection that ends
//! before the leader stopped the shard fails the node ([`NodeStatus::host_lost`]): HWM stays
//! where the shard left it, and the leader starts again from the newest checkpoint.

use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::msg::{Up, coord_msg, down};
use super::wire::{Hello, Kind, read_frame, write_frame};
use crate::coordinator::CoordMsg;
use crate::shard::ShardMsg;
use crate::status::NodeStatus;

/// How long a host may take to answer a hello (it fetches the shard's checkpoint image).
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A connection to the member that runs shard `shard`, which answered that it does.
pub struct Connected {
    pub shard: u16,
    pub node: String,
    pub peer: String,
    /// Where the shard's scan service listens.
    pub scan: SocketAddr,
    stream: TcpStream,
}

/// Asks `node` at `peer` to run `shard` as `hello` says; what it answered.
pub fn connect(shard: u16, node: &str, peer: &str, hello: &Hello) -> Result<Connected, String> {
    let addr = peer
        .to_socket_addrs()
        .map_err(|e| format!("resolving {peer}: {e}"))?
        .next()
        .ok_or_else(|| format!("{peer} resolves to no address"))?;
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| format!("connecting to {peer}: {e}"))?;
    let _ = stream.set_nodelay(true);
    write_frame(&mut stream, Kind::Hello, shard, &hello.encode())
        .map_err(|e| format!("writing to {peer}: {e}"))?;
    stream
        .set_read_timeout(Some(READY_WITHIN))
        .map_err(|e| e.to_string())?;
    let answer = read_frame(&mut stream)
        .map_err(|e| format!("reading from {peer}: {e}"))?
        .ok_or_else(|| format!("{peer} closed the connection"))?;
    let mut d = super::wire::Dec(&answer.body);
    match answer.kind {
        Kind::Ready => {
            let scan = d.str("the scan service's address")?;
            let scan = scan
                .parse()
                .map_err(|_| format!("{peer} named `{scan}` as its scan service"))?;
            stream.set_read_timeout(None).map_err(|e| e.to_string())?;
            Ok(Connected {
                shard,
                node: node.to_owned(),
                peer: peer.to_owned(),
                scan,
                stream,
            })
        }
        Kind::Refused => Err(format!("node {node} refused: {}", d.str("a reason")?)),
        other => Err(format!("{peer} answered with a {other:?} frame")),
    }
}

/// Runs the proxy of a connected remote shard until it is stopped or the connection ends.
pub fn spawn(
    conn: Connected,
    data: flume::Receiver<ShardMsg>,
    control: flume::Receiver<ShardMsg>,
    coord: flume::Sender<CoordMsg>,
    status: Arc<NodeStatus>,
    window: u64,
) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
    let (credit_tx, credits) = flume::unbounded::<u64>();
    let stopping = Arc::new(AtomicBool::new(false));
    let name = format!("shard {} on node {} ({})", conn.shard, conn.node, conn.peer);
    let reader = {
        let mut stream = conn.stream.try_clone()?;
        let (stopping, status, name) = (stopping.clone(), status.clone(), name.clone());
        let shard = conn.shard;
        std::thread::Builder::new()
            .name(format!("retina-remote-{shard}-in"))
            .spawn(move || {
                let why = loop {
                    let frame = match read_frame(&mut stream) {
                        Ok(Some(f)) => f,
                        Ok(None) => break "the connection closed".to_owned(),
                        Err(e) => break e.to_string(),
                    };
                    match coord_msg(&frame, shard) {
                        Ok(Up::Credit(n)) => drop(credit_tx.send(n)),
                        Ok(Up::Coord(msg)) => {
                            if coord.send(msg).is_err() {
                                return;
                            }
                        }
                        Err(e) => break format!("an unreadable frame: {e}"),
                    }
                };
                if !stopping.load(Ordering::Acquire) {
                    status.host_lost.store(true, Ordering::Release);
                    status.fail(format!(
                        "{name}: {why}; HWM stays where the shard left it, and the leader \
                         starts again from the newest checkpoint"
                    ));
                }
                let _ = stream.shutdown(std::net::Shutdown::Both);
                // Dropping the credit sender wakes the writer, which lets the queues go.
            })?
    };
    let writer = {
        let mut stream = conn.stream;
        let shard = conn.shard;
        std::thread::Builder::new()
            .name(format!("retina-remote-{shard}-out"))
            .spawn(move || {
                let mut out = Writer {
                    stream: &mut stream,
                    shard,
                    name: &name,
                    status: &status,
                };
                let mut credit = window;
                let mut control_open = true;
                // A batch taken from the data queue that waits for credit: nothing behind it
                // on that queue goes first.
                let mut pending: Option<ShardMsg> = None;
                loop {
                    while let Ok(n) = credits.try_recv() {
                        credit += n;
                    }
                    if control_open {
                        match control.try_recv() {
                            Ok(m) => {
                                if !out.send(m) {
                                    break;
                                }
                                continue;
                            }
                            Err(flume::TryRecvError::Disconnected) => control_open = false,
                            Err(flume::TryRecvError::Empty) => {}
                        }
                    }
                    if pending.is_none() {
                        pending = data.try_recv().ok();
                    }
                    match pending.take() {
                        Some(ShardMsg::Apply(bytes)) if credit > 0 => {
                            credit -= 1;
                            out.status.backlog_batches.fetch_sub(1, Ordering::Relaxed);
                            (out.status.remote_batch_bytes)
                                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                            if !out.frame(Kind::Apply, &bytes) {
                                break;
                            }
                            continue;
                        }
                        Some(m @ ShardMsg::Apply(_)) => pending = Some(m),
                        Some(ShardMsg::Stop) => {
                            stopping.store(true, Ordering::Release);
                            out.send(ShardMsg::Stop);
                            break;
                        }
                        Some(m) => {
                            if !out.send(m) {
                                break;
                            }
                            continue;
                        }
                        None => {}
                    }
                    // Nothing to send now: wait for a message, or for credit.
                    let mut sel = flume::Selector::new().recv(&credits, |r| match r {
                        Ok(n) => Wake::Credit(n),
                        Err(_) => Wake::Closed,
                    });
                    if control_open {
                        sel = sel.recv(&control, |r| match r {
                            Ok(m) => Wake::Control(m),
                            Err(_) => Wake::ControlClosed,
                        });
                    }
                    if pending.is_none() {
                        sel = sel.recv(&data, |r| match r {
                            Ok(m) => Wake::Data(m),
                            Err(_) => Wake::Closed,
                        });
                    }
                    match sel.wait() {
                        Wake::Credit(n) => credit += n,
                        Wake::Control(m) => {
                            if !out.send(m) {
                                break;
                            }
                        }
                        Wake::ControlClosed => control_open = false,
                        Wake::Data(m) => pending = Some(m),
                        Wake::Closed => break,
                    }
                }
                // Reads of a remote shard's memory wait on no one once the queues go.
            })?
    };
    Ok(vec![reader, writer])
}

enum Wake {
    Credit(u64),
    Control(ShardMsg),
    ControlClosed,
    Data(ShardMsg),
    Closed,
}

/// The writer's end of the connection.
struct Writer<'a> {
    stream: &'a mut TcpStream,
    shard: u16,
    name: &'a str,
    status: &'a NodeStatus,
}

impl Writer<'_> {
    /// Sends `msg` (not a batch); false once the connection is gone.
    fn send(&mut self, msg: ShardMsg) -> bool {
        match down(&msg) {
            Some((kind, body)) => self.frame(kind, &body),
            None => {
                self.refuse(msg);
                true
            }
        }
    }

    fn frame(&mut self, kind: Kind, body: &[u8]) -> bool {
        write_frame(self.stream, kind, self.shard, body).is_ok()
    }

    /// A read of the shard's memory: a remote shard serves those through its scan service.
    fn refuse(&self, msg: ShardMsg) {
        let error = || {
            retina_storage::StorageError::Config(format!(
                "{} runs remotely: read it through its scan service",
                self.name
            ))
        };
        match msg {
            ShardMsg::Snapshot { reply, .. } => drop(reply.send(Err(error()))),
            ShardMsg::Bitmaps { reply, .. } => drop(reply.send(Err(error()))),
            _ => tracing::debug!("{}: a local message was not sent", self.name),
        }
    }
}
