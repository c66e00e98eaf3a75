//! The leader's side of a remote shard: a connection to the member that runs it, and a thread
//! that serves the shard's queues as a local shard would (its control queue first), sending
//! each message as a frame; a batch waits for credit, which the host grants as its shard's
//! queue takes batches, so a slow remote shard holds back the sink as a local one does. A
//! reader thread per connection hands the shard's messages to the coordinator.
//!
//! The proxy keeps every batch and checkpoint barrier it sent since the newest complete
//! checkpoint ([`Redo`]). When the connection ends while the leader runs (the member died or
//! was cut off), the shard starts again without stopping the others: HWM stays where the
//! shard left it, the proxy asks [`Rejoin`] for a new run of the shard (on the same member once
//! it is back, else on another live member) from that checkpoint, tells the coordinator
//! ([`CoordMsg::ShardRestarted`]), and sends it what came after the checkpoint again: the same
//! bytes, so the same timestamps. The coordinator ends the queries running then; queries that
//! begin meanwhile are answered once the new run has applied through their snapshot. Only when the batches since the checkpoint were more
//! than the proxy keeps (`remote_redo_bytes`), or no member can run the shard, does the
//! connection's end fail the node ([`NodeStatus::host_lost`]); the leader then starts every shard again from the
//! checkpoint.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use retina_storage::Timestamp;
use rkyv::util::AlignedVec;

use super::msg::{Up, coord_msg, down};
use super::wire::{Hello, Kind, read_frame, write_frame};
use crate::cluster::MAX_GENERATION;
use crate::coordinator::CoordMsg;
use crate::shard::{ShardMsg, Watermarks};
use crate::status::NodeStatus;

/// How long a host may take to answer a hello (it fetches the shard's checkpoint image).
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How often a proxy whose shard was lost asks for a new run of it.
const REJOIN_EVERY: Duration = Duration::from_millis(100);

/// A connection to the member that runs shard `shard`, which answered that it does.
pub struct Connected {
    pub shard: u16,
    pub node: String,
    pub peer: String,
    /// Where the shard's scan service listens.
    pub scan: SocketAddr,
    /// The checkpoint the run started from.
    pub from: Option<(u64, Timestamp)>,
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
                from: hello.checkpoint,
                stream,
            })
        }
        Kind::Refused => Err(format!("node {node} refused: {}", d.str("a reason")?)),
        other => Err(format!("{peer} answered with a {other:?} frame")),
    }
}

/// Finds a new run for a shard whose member was lost.
pub trait Rejoin: Send + Sync {
    /// Connects a new run of `shard`, generation `generation`, from checkpoint `from` (`None`:
    /// an empty shard): `Ok(None)` while no member can take it yet (asked again shortly),
    /// `Err` once none will (the node fails, and the leader starts every shard again).
    fn rejoin(
        &self,
        shard: u16,
        generation: u32,
        from: Option<(u64, Timestamp)>,
    ) -> Result<Option<Connected>, String>;

    /// A move of `shard` asked for could not start (the proxy keeps too little to start a new
    /// run): it stays where it runs.
    fn stays(&self, shard: u16);
}

/// What the proxy of one remote shard works with.
pub struct ProxySetup {
    pub data: flume::Receiver<ShardMsg>,
    pub control: flume::Receiver<ShardMsg>,
    pub coord: flume::Sender<CoordMsg>,
    pub status: Arc<NodeStatus>,
    /// Batches the leader may send before the host grants more.
    pub window: u64,
    /// The checkpoint the shard started from.
    pub from: Option<(u64, Timestamp)>,
    /// The most bytes of batches kept to start the shard again (`remote_redo_bytes`).
    pub redo_bytes: usize,
    /// How to start the shard again once its member is lost (`None`: the node fails).
    pub rejoin: Option<Arc<dyn Rejoin>>,
    /// Asks the proxy to hand the shard over to a new run (which [`Rejoin`] places): the
    /// current run stops after what it was sent, and the new one starts as after a loss.
    pub moves: Option<flume::Receiver<()>>,
}

/// Runs the proxy of a connected remote shard until the node stops it, or its member is lost
/// for good.
pub fn spawn(conn: Connected, setup: ProxySetup) -> std::io::Result<std::thread::JoinHandle<()>> {
    let shard = conn.shard;
    std::thread::Builder::new()
        .name(format!("retina-remote-{shard}"))
        .spawn(move || {
            let mut proxy = Proxy {
                shard,
                redo: Redo::new(setup.from, setup.redo_bytes),
                watermarks: None,
                generation: 0,
                link: None,
                setup,
            };
            match proxy.open(conn) {
                Ok(()) => proxy.run(),
                Err(e) => proxy.lost(e.to_string()),
            }
        })
}

/// A live connection to a run of the shard.
struct Link {
    name: String,
    stream: TcpStream,
    credit: u64,
    credits: flume::Receiver<u64>,
    /// Why the connection ended, from its reader.
    ended: flume::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Link {
    /// Sends a frame; false once the connection is gone (then shut down, so that its reader
    /// ends at once).
    fn frame(&mut self, kind: Kind, shard: u16, body: &[u8]) -> bool {
        let sent = write_frame(&mut self.stream, kind, shard, body).is_ok();
        if !sent {
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
        }
        sent
    }

    /// Ends the connection and waits for its reader.
    fn close(mut self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

struct Proxy {
    shard: u16,
    setup: ProxySetup,
    redo: Redo,
    /// The newest watermarks the coordinator sent.
    watermarks: Option<Watermarks>,
    generation: u32,
    link: Option<Link>,
}

enum Wake {
    Credit(u64),
    Ended(String),
    Control(ShardMsg),
    ControlClosed,
    Data(ShardMsg),
    Closed,
    Rejoined(Result<Option<Connected>, String>),
    Move,
    Timeout,
}

impl Proxy {
    /// Starts serving `conn`: a reader hands its frames to the coordinator.
    fn open(&mut self, conn: Connected) -> std::io::Result<()> {
        let name = format!("shard {} on node {} ({})", conn.shard, conn.node, conn.peer);
        let (credit_tx, credits) = flume::unbounded::<u64>();
        let (ended_tx, ended) = flume::bounded::<String>(1);
        let mut stream = conn.stream.try_clone()?;
        let coord = self.setup.coord.clone();
        let shard = self.shard;
        let reader = std::thread::Builder::new()
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
                                break "the coordinator stopped".to_owned();
                            }
                        }
                        Err(e) => break format!("an unreadable frame: {e}"),
                    }
                };
                let _ = stream.shutdown(std::net::Shutdown::Both);
                let _ = ended_tx.send(why);
            })?;
        self.link = Some(Link {
            name,
            stream: conn.stream,
            credit: self.setup.window,
            credits,
            ended,
            reader: Some(reader),
        });
        Ok(())
    }

    /// Serves the shard's queues until the node stops it.
    fn run(&mut self) {
        let mut control_open = true;
        let mut rejoining: Option<flume::Receiver<Result<Option<Connected>, String>>> = None;
        let mut next_try = Instant::now();
        loop {
            // The connection's state first: credit, or its end.
            if let Some(link) = &mut self.link {
                while let Ok(n) = link.credits.try_recv() {
                    link.credit += n;
                }
                if let Ok(why) = link.ended.try_recv() {
                    if !self.connection_ended(why) {
                        return;
                    }
                    next_try = Instant::now();
                    continue;
                }
            }
            if control_open {
                match self.setup.control.try_recv() {
                    Ok(m) => {
                        self.on_control(m);
                        continue;
                    }
                    Err(flume::TryRecvError::Disconnected) => control_open = false,
                    Err(flume::TryRecvError::Empty) => {}
                }
            }
            if self.send_next() {
                continue;
            }
            if self.wants_data() {
                match self.setup.data.try_recv() {
                    Ok(m) => {
                        if !self.on_data(m) {
                            return;
                        }
                        continue;
                    }
                    Err(flume::TryRecvError::Disconnected) => return self.close(),
                    Err(flume::TryRecvError::Empty) => {}
                }
            }
            if self.link.is_none() && rejoining.is_none() && Instant::now() >= next_try {
                rejoining = Some(self.ask_rejoin());
            }
            // Nothing to do now: wait for something that can change that.
            let wake = {
                let mut sel = flume::Selector::new();
                if let Some(link) = &self.link {
                    sel = sel
                        .recv(&link.credits, |r| r.map_or(Wake::Timeout, Wake::Credit))
                        .recv(&link.ended, |r| {
                            Wake::Ended(r.unwrap_or_else(|_| "its reader ended".into()))
                        });
                }
                if let Some(r) = &rejoining {
                    sel = sel.recv(r, |r| {
                        Wake::Rejoined(r.unwrap_or_else(|_| Err("the rejoin ended".into())))
                    });
                }
                if control_open {
                    sel = sel.recv(&self.setup.control, |r| {
                        r.map_or(Wake::ControlClosed, Wake::Control)
                    });
                }
                if self.wants_data() {
                    sel = sel.recv(&self.setup.data, |r| r.map_or(Wake::Closed, Wake::Data));
                }
                if let Some(moves) = &self.setup.moves {
                    sel = sel.recv(moves, |r| r.map_or(Wake::Timeout, |()| Wake::Move));
                }
                if self.link.is_none() && rejoining.is_none() {
                    sel.wait_deadline(next_try).unwrap_or(Wake::Timeout)
                } else {
                    sel.wait()
                }
            };
            match wake {
                Wake::Credit(n) => {
                    if let Some(link) = &mut self.link {
                        link.credit += n;
                    }
                }
                Wake::Ended(why) => {
                    if !self.connection_ended(why) {
                        return;
                    }
                    next_try = Instant::now();
                }
                Wake::Control(m) => self.on_control(m),
                Wake::ControlClosed => control_open = false,
                Wake::Data(m) => {
                    if !self.on_data(m) {
                        return;
                    }
                }
                Wake::Closed => return self.close(),
                Wake::Rejoined(result) => {
                    rejoining = None;
                    next_try = Instant::now() + REJOIN_EVERY;
                    match result {
                        Ok(Some(conn)) => {
                            if let Err(e) = self.resume(conn) {
                                tracing::warn!("shard {}: {e}", self.shard);
                            }
                        }
                        Ok(None) => {}
                        Err(e) => return self.lost(e),
                    }
                }
                Wake::Move => {
                    if self.hand_over() {
                        next_try = Instant::now();
                    }
                }
                Wake::Timeout => {}
            }
        }
    }

    /// Stops the current run so that a new one starts where [`Rejoin`] places it; false if
    /// there is no run to stop, or a new one could not start from what the proxy keeps.
    fn hand_over(&mut self) -> bool {
        let rejoin = self
            .setup
            .rejoin
            .clone()
            .expect("a proxy asked to move has a rejoin");
        if self.link.is_none() {
            // Lost already: the next rejoin places it.
            return false;
        }
        if !self.redo.whole || self.generation >= MAX_GENERATION {
            tracing::warn!(
                "shard {} stays where it runs: a new run of it could not start from what its \
                 proxy keeps",
                self.shard
            );
            rejoin.stays(self.shard);
            return false;
        }
        tracing::info!(
            "shard {}: its run stops after what it was sent, to start again on another member",
            self.shard
        );
        self.close();
        self.setup
            .status
            .shard_restarts
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Whether to take the next message off the data queue: one at a time while connected
    /// (a batch waits there for credit, nothing behind it goes first); while the shard has no
    /// run, every one, so the other shards go on meanwhile (past what the redo log may hold,
    /// the node fails: see [`Self::on_data`]).
    fn wants_data(&self) -> bool {
        self.link.is_none() || self.redo.unsent() == 0
    }

    /// Sends the next batch or barrier the run lacks, if there is credit; false if none went.
    fn send_next(&mut self) -> bool {
        let Some(link) = &mut self.link else {
            return false;
        };
        let Some(item) = self.redo.next_unsent() else {
            return false;
        };
        let sent = match item {
            Item::Apply(bytes) => {
                if link.credit == 0 {
                    return false;
                }
                link.credit -= 1;
                (self.setup.status.remote_batch_bytes)
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                link.frame(Kind::Apply, self.shard, bytes)
            }
            Item::Checkpoint(id, ts) => {
                let msg = ShardMsg::Checkpoint { id: *id, ts: *ts };
                let (kind, body) = down(&msg).expect("a barrier goes to a remote shard");
                link.frame(kind, self.shard, &body)
            }
        };
        if sent {
            self.redo.mark_sent();
        }
        // A failed write: the reader sees the connection end.
        true
    }

    /// A message off the data queue; false once the proxy stops.
    fn on_data(&mut self, msg: ShardMsg) -> bool {
        match msg {
            ShardMsg::Apply(bytes) => {
                let status = &self.setup.status;
                status.backlog_batches.fetch_sub(1, Ordering::Relaxed);
                self.redo.push(Item::Apply(bytes));
                if self.link.is_none() && self.redo.bytes > self.redo.limit {
                    self.lost(format!(
                        "shard {}: no member ran it again before the batches kept for it \
                         outgrew remote_redo_bytes ({} bytes)",
                        self.shard, self.redo.limit
                    ));
                    return false;
                }
            }
            ShardMsg::Checkpoint { id, ts } => self.redo.push(Item::Checkpoint(id, ts)),
            ShardMsg::Stop => {
                self.close();
                return false;
            }
            other => self.on_control(other),
        }
        true
    }

    /// A message off the control queue (or one the shard's memory answers).
    fn on_control(&mut self, msg: ShardMsg) {
        match &msg {
            ShardMsg::Watermarks(w) => {
                self.watermarks = Some(*w);
                self.redo.complete(w.checkpoint_id, self.link.is_some());
            }
            ShardMsg::Snapshot { .. } | ShardMsg::Bitmaps { .. } => return self.refuse(msg),
            _ => {}
        }
        let Some(link) = &mut self.link else {
            // No run of the shard now: a visibility checkpoint it cannot write is failed (the
            // query holds LWM as any other). The coordinator ends every query once a new run
            // starts (a begin waiting for this shard is refused then), and sends the new run
            // the queries begun after.
            if let ShardMsg::VisCheckpoint { query, .. } = msg {
                let _ = self.setup.coord.send(CoordMsg::VisCheckpointDone {
                    query,
                    shard: self.shard,
                    ok: false,
                });
            }
            return;
        };
        let msg = match msg {
            // Objects a run deletes once a checkpoint that does not read them is complete: a
            // new run knows only the checkpoints it passed (its own images).
            ShardMsg::Watermarks(mut w) => {
                w.checkpoint_id = w.checkpoint_id.min(self.redo.newest_sent_checkpoint());
                ShardMsg::Watermarks(w)
            }
            m => m,
        };
        match down(&msg) {
            Some((kind, body)) => drop(link.frame(kind, self.shard, &body)),
            None => tracing::debug!("{}: a local message was not sent", link.name),
        }
    }

    /// A read of the shard's memory: a remote shard serves those through its scan service.
    fn refuse(&self, msg: ShardMsg) {
        let error = || {
            retina_storage::StorageError::Config(format!(
                "shard {} runs on another member: read it through its scan service",
                self.shard
            ))
        };
        match msg {
            ShardMsg::Snapshot { reply, .. } => drop(reply.send(Err(error()))),
            ShardMsg::Bitmaps { reply, .. } => drop(reply.send(Err(error()))),
            _ => {}
        }
    }

    /// The connection ended on its own: the shard starts again elsewhere if it can (true),
    /// else the node fails (false).
    fn connection_ended(&mut self, why: String) -> bool {
        let link = self.link.take().expect("a connection ended");
        let name = link.name.clone();
        link.close();
        let why = format!("{name}: {why}");
        if self.setup.rejoin.is_none() {
            self.lost(why);
            return false;
        }
        if !self.redo.whole {
            self.lost(if self.redo.limit == 0 {
                format!("{why}; remote_redo_bytes is 0, so no shard starts again alone")
            } else {
                format!(
                    "{why}; the batches since the last complete checkpoint were more than the \
                     {} bytes a proxy keeps (remote_redo_bytes)",
                    self.redo.limit
                )
            });
            return false;
        }
        if self.generation >= MAX_GENERATION {
            self.lost(format!(
                "{why}; the shard was started again {MAX_GENERATION} times in this leadership"
            ));
            return false;
        }
        tracing::warn!(
            "{why}; HWM stays where the shard left it while it starts again from {} on a live \
             member",
            self.redo
                .from
                .map_or("an empty shard".to_owned(), |(id, ts)| format!(
                    "checkpoint {id} at {ts}"
                ))
        );
        self.setup
            .status
            .shard_restarts
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Asks for a new run of the shard on a thread of its own (it may wait for a member to
    /// fetch the checkpoint's image), while the proxy goes on serving the queues.
    fn ask_rejoin(&self) -> flume::Receiver<Result<Option<Connected>, String>> {
        let (tx, rx) = flume::bounded(1);
        let rejoin = self.setup.rejoin.clone().expect("a proxy that rejoins");
        let (shard, generation, from) = (self.shard, self.generation + 1, self.redo.from);
        let spawned = std::thread::Builder::new()
            .name(format!("retina-rejoin-{shard}"))
            .spawn(move || drop(tx.send(rejoin.rejoin(shard, generation, from))));
        if let Err(e) = spawned {
            tracing::warn!("shard {shard}: starting a rejoin: {e}");
        }
        rx
    }

    /// A new run of the shard answered: it hears what it lacks, from the checkpoint it started
    /// from on. One that started from an older checkpoint than the redo log now does (one
    /// completed while it was asked for) is let go, and a new one asked for.
    fn resume(&mut self, conn: Connected) -> std::io::Result<()> {
        // Even a run let go takes a generation: it may have written files.
        self.generation += 1;
        if conn.from != self.redo.from {
            tracing::info!(
                "shard {}: a newer checkpoint completed while node {} started it; asking again",
                self.shard,
                conn.node
            );
            return Ok(());
        }
        tracing::info!(
            "shard {} runs again on node {} ({}), generation {}; sending it what came after \
             its checkpoint",
            self.shard,
            conn.node,
            conn.peer,
            self.generation
        );
        // Before any report of the new run: the coordinator forgets the lost run's files.
        let _ = self
            .setup
            .coord
            .send(CoordMsg::ShardRestarted { shard: self.shard });
        self.open(conn)?;
        self.redo.rewind();
        if let Some(w) = self.watermarks {
            self.on_control(ShardMsg::Watermarks(w));
        }
        Ok(())
    }

    /// The node stops the shard: the run stops after what it was sent.
    fn close(&mut self) {
        if let Some(mut link) = self.link.take() {
            let (kind, body) = down(&ShardMsg::Stop).expect("a stop goes to a remote shard");
            link.frame(kind, self.shard, &body);
            // The host closes the connection once its shard stopped.
            let _ = link.ended.recv_timeout(Duration::from_secs(30));
            link.close();
        }
    }

    /// The shard cannot run anywhere from here: the node fails, HWM stays where the shard left
    /// it, and the leader starts again from the newest checkpoint.
    fn lost(&mut self, why: String) {
        let status = &self.setup.status;
        status.host_lost.store(true, Ordering::Release);
        status.fail(format!(
            "{why}; HWM stays where the shard left it, and the leader starts again from the \
             newest checkpoint"
        ));
        // Dropping the queues lets their senders go.
    }
}

/// What a proxy sent its shard, or will: batches and checkpoint barriers.
enum Item {
    Apply(AlignedVec),
    Checkpoint(u64, Timestamp),
}

/// The batches and barriers since the newest complete checkpoint the shard's run passed: a
/// new run of the shard starts from that checkpoint and is sent them again.
struct Redo {
    /// The checkpoint a new run starts from (`None`: an empty shard).
    from: Option<(u64, Timestamp)>,
    items: VecDeque<Item>,
    /// How many of `items` the current run was sent.
    sent: usize,
    /// The batches' bytes in `items`.
    bytes: usize,
    /// Whether `items` hold everything after `from` (not once more than `limit` was sent since
    /// it; again once a later checkpoint completes).
    whole: bool,
    /// The most bytes of batches kept.
    limit: usize,
    /// The newest checkpoint complete.
    complete: u64,
}

impl Redo {
    fn new(from: Option<(u64, Timestamp)>, limit: usize) -> Self {
        Redo {
            from,
            items: VecDeque::new(),
            sent: 0,
            bytes: 0,
            whole: limit > 0,
            limit,
            complete: from.map_or(0, |(id, _)| id),
        }
    }

    fn unsent(&self) -> usize {
        self.items.len() - self.sent
    }

    fn next_unsent(&self) -> Option<&Item> {
        self.items.get(self.sent)
    }

    fn push(&mut self, item: Item) {
        if let Item::Apply(b) = &item {
            self.bytes += b.len();
        }
        self.items.push_back(item);
    }

    /// The next item went to the run.
    fn mark_sent(&mut self) {
        self.sent += 1;
        if let Some(Item::Checkpoint(id, _)) = self.items.get(self.sent - 1)
            && *id <= self.complete
        {
            self.trim(true);
        }
        if self.bytes > self.limit {
            // Too much to keep: a new run could not start from `from` any more.
            self.drop_front(self.sent);
            self.whole = false;
        }
    }

    /// The newest checkpoint the current run was sent the barrier of, or started from.
    fn newest_sent_checkpoint(&self) -> u64 {
        self.items
            .range(..self.sent)
            .rev()
            .find_map(|i| match i {
                Item::Checkpoint(id, _) => Some(*id),
                Item::Apply(_) => None,
            })
            .unwrap_or_else(|| self.from.map_or(0, |(id, _)| id))
    }

    /// Checkpoint `id` (and every one before) is complete: its images are durable, so a new
    /// run can start from it. With `connected`, only barriers the current run was sent count
    /// (it may not have reached the others); without, every one does.
    fn complete(&mut self, id: u64, connected: bool) {
        self.complete = self.complete.max(id);
        self.trim(connected);
    }

    /// Drops what comes before the newest complete checkpoint's barrier.
    fn trim(&mut self, connected: bool) {
        let limit = if connected {
            self.sent
        } else {
            self.items.len()
        };
        let newest = self
            .items
            .range(..limit)
            .enumerate()
            .rev()
            .find_map(|(i, item)| match item {
                // Exactly the complete one: an earlier barrier may be of a checkpoint that
                // failed, whose images are gone.
                Item::Checkpoint(id, ts) if *id == self.complete => Some((i, *id, *ts)),
                _ => None,
            });
        if let Some((i, id, ts)) = newest {
            self.drop_front(i + 1);
            self.from = Some((id, ts));
            self.whole = self.limit > 0;
        }
    }

    fn drop_front(&mut self, n: usize) {
        for item in self.items.drain(..n) {
            if let Item::Apply(b) = item {
                self.bytes -= b.len();
            }
        }
        self.sent -= n.min(self.sent);
    }

    /// A new run starts from `from`: everything after it goes again.
    fn rewind(&mut self) {
        self.sent = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(n: usize) -> Item {
        let mut v = AlignedVec::new();
        v.extend_from_slice(&vec![0u8; n]);
        Item::Apply(v)
    }

    fn ts(v: u64) -> Timestamp {
        Timestamp::new(v).unwrap()
    }

    #[test]
    fn the_redo_log_keeps_what_came_after_the_newest_complete_checkpoint() {
        let mut r = Redo::new(Some((1, ts(10))), 1 << 20);
        r.push(batch(100));
        r.push(Item::Checkpoint(2, ts(20)));
        r.push(batch(50));
        for _ in 0..3 {
            r.mark_sent();
        }
        assert_eq!(
            (r.items.len(), r.bytes, r.newest_sent_checkpoint()),
            (3, 150, 2)
        );
        // Checkpoint 2 completes: a new run starts from it, with the batch after it.
        r.complete(2, true);
        assert_eq!(r.from, Some((2, ts(20))));
        assert_eq!((r.items.len(), r.bytes, r.sent), (1, 50, 1));
        // A barrier the run was not yet sent does not count while it runs...
        r.push(Item::Checkpoint(3, ts(30)));
        r.complete(3, true);
        assert_eq!(r.from, Some((2, ts(20))));
        // ...and does once it was sent (or while no run is connected).
        r.mark_sent();
        assert_eq!((r.from, r.items.len(), r.sent), (Some((3, ts(30))), 0, 0));
        // A barrier of a checkpoint that failed (4) is never a start: its images are gone.
        r.push(Item::Checkpoint(4, ts(40)));
        r.push(Item::Checkpoint(5, ts(50)));
        r.mark_sent();
        r.complete(5, false);
        assert_eq!((r.from, r.items.len()), (Some((5, ts(50))), 0));
        r.push(Item::Checkpoint(6, ts(60)));
        r.mark_sent();
        r.complete(7, true);
        assert_eq!((r.from, r.items.len()), (Some((5, ts(50))), 1));
        r.drop_front(1);
        r.push(batch(10));
        r.push(batch(20));
        r.mark_sent();
        r.rewind();
        assert_eq!((r.unsent(), r.bytes), (2, 30));
        assert!(r.whole);
    }

    #[test]
    fn a_redo_log_past_its_limit_cannot_start_a_run_until_the_next_checkpoint() {
        // A proxy that keeps nothing never starts its shard alone.
        let mut none = Redo::new(None, 0);
        none.push(Item::Checkpoint(1, ts(5)));
        none.mark_sent();
        none.complete(1, true);
        assert!(!none.whole);
        let mut r = Redo::new(None, 1000);
        r.push(batch(1000));
        r.push(batch(10));
        r.mark_sent();
        r.mark_sent();
        // The first send went past the limit: what was sent before it is dropped.
        assert!(!r.whole);
        assert_eq!((r.items.len(), r.bytes), (1, 10));
        r.push(Item::Checkpoint(1, ts(5)));
        r.push(batch(10));
        r.mark_sent();
        r.mark_sent();
        r.complete(1, true);
        assert!(r.whole);
        assert_eq!((r.from, r.items.len()), (Some((1, ts(5))), 1));
    }
}
