//! A member's side of remote shards: it listens on its `--peer` address, and for each
//! connection a leader opens it runs the shard the hello names, on a glommio executor of its
//! own, exactly as a leader runs a local shard. The shard starts from the checkpoint the
//! hello names (its image fetched from the lake) and reports to the leader's coordinator over
//! the connection. A hello of a later leadership ends every session of an earlier one, and one
//! of an earlier leadership is refused: a deposed leader cannot drive a shard the new one runs.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use object_store::{ObjectStore, ObjectStoreExt};
use retina_storage::{Shard, Timestamp};

use super::msg::{shard_msg, up};
use super::wire::{Enc, Hello, Kind, read_frame, write_frame};
use crate::catalog::Catalog;
use crate::cluster::{MAX_GENERATION, generation_base};
use crate::coordinator::actor::CONTROL_QUEUE;
use crate::coordinator::{CoordMsg, checkpoint_dir};
use crate::error::NodeError;
use crate::io::IoRequest;
use crate::lake::{Lake, LakeCheckpoints, LakeSpec, checkpoint_object};
use crate::settings::Settings;
use crate::shard::{ShardActor, ShardMsg, ShardSetup, Watermarks};
use crate::status::NodeStatus;

/// How long a leader has to send its hello once connected.
const HELLO_WITHIN: Duration = Duration::from_secs(10);

/// What a member needs to run shards for a leader.
pub struct HostOptions {
    /// Where leaders connect; shard `k`'s scan service listens on the next ports (`port + 1 +
    /// k`; any free port when it is 0), on the same address, which clients must reach too.
    pub peer: SocketAddr,
    pub data_dir: PathBuf,
    /// The cluster's lake (on S3): the shards start from its checkpoints and write to it.
    pub lake: LakeSpec,
    pub catalog: Arc<Catalog>,
    pub settings: Settings,
    /// The token the shards' scan services ask of clients.
    pub auth_token: Option<String>,
}

/// A member serving remote shards; [`Host::stop`] ends every session.
pub struct Host {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<std::thread::JoinHandle<()>>,
    io_thread: Option<std::thread::JoinHandle<()>>,
}

struct Shared {
    options: HostOptions,
    store: Arc<dyn ObjectStore>,
    lake: String,
    rt: tokio::runtime::Handle,
    io: Mutex<Option<flume::Sender<IoRequest>>>,
    sessions: Mutex<Sessions>,
    stop: AtomicBool,
    /// What the shards this member runs report (one status for every session of a cluster's
    /// shard count), for its metrics.
    status: HostStatus,
}

impl Shared {
    /// Runs a lake request on the I/O runtime and waits for it.
    fn on_io<T: Send + 'static>(
        &self,
        request: impl std::future::Future<Output = object_store::Result<T>> + Send + 'static,
    ) -> Result<T, String> {
        futures::executor::block_on(self.rt.spawn(request))
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }
}

/// The status a member's shards report to, once a leader started one ([`Host::status`]).
pub type HostStatus = Arc<Mutex<Option<Arc<NodeStatus>>>>;

#[derive(Default)]
struct Sessions {
    /// The newest leadership a hello came from: older ones are refused.
    epoch: u64,
    running: Vec<Running>,
    /// The id of the next session admitted.
    next: u64,
}

/// A shard a session runs: its connection (shut down to end it), and a receiver that is
/// closed once it ended.
struct Running {
    /// This session's own id: a session that ended forgets itself, never a newer one of
    /// the same shard.
    id: u64,
    shard: u16,
    epoch: u64,
    stream: TcpStream,
    ended: flume::Receiver<()>,
}

impl Host {
    /// Opens the lake, starts the I/O thread and listens on `options.peer`.
    pub fn start(mut options: HostOptions) -> Result<Host, NodeError> {
        options.data_dir = crate::datadir::absolute_dir(&options.data_dir).map_err(|source| {
            NodeError::DataDir {
                path: options.data_dir.clone(),
                source,
            }
        })?;
        let executor_err = |what: &str| {
            let what = what.to_owned();
            move |e: std::io::Error| NodeError::Executor {
                what,
                reason: e.to_string(),
            }
        };
        // No query survives a session, so neither does a visibility checkpoint.
        let vis = crate::shard::vis_checkpoint::vis_dir(&options.data_dir);
        let _ = std::fs::remove_dir_all(&vis);
        std::fs::create_dir_all(&vis).map_err(|source| NodeError::DataDir {
            path: vis.clone(),
            source,
        })?;
        let rt = crate::io::io_runtime().map_err(executor_err("the I/O runtime"))?;
        let lake = Lake::open(&options.lake, &options.data_dir, &rt)?;
        if !lake.is_remote() {
            return Err(NodeError::Lake {
                lake: lake.url.clone(),
                reason: "a member that runs shards for a leader shares its lake: give --lake \
                         s3://BUCKET/PREFIX"
                    .into(),
            });
        }
        let listener = TcpListener::bind(options.peer)
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .map_err(executor_err(&format!("the shard host on {}", options.peer)))?;
        let addr = listener
            .local_addr()
            .map_err(executor_err("the shard host"))?;
        let (io_tx, io_rx) = flume::bounded::<IoRequest>(crate::io::IO_QUEUE);
        let handle = rt.handle().clone();
        let io_thread = {
            let (store, config) = (lake.store.clone(), options.settings.storage());
            let status = Arc::new(NodeStatus::new(0));
            std::thread::Builder::new()
                .name("retina-io".into())
                .spawn(move || crate::io::io_main(io_rx, rt, store, config, None, status))
                .map_err(executor_err("the I/O thread"))?
        };
        let shared = Arc::new(Shared {
            options,
            store: lake.store.clone(),
            lake: lake.url.clone(),
            rt: handle,
            io: Mutex::new(Some(io_tx)),
            sessions: Mutex::new(Sessions::default()),
            stop: AtomicBool::new(false),
            status: HostStatus::default(),
        });
        let accept = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("retina-host".into())
                .spawn(move || accept(&listener, &shared))
                .map_err(executor_err("the shard host"))?
        };
        tracing::info!("running shards for the cluster's leader on {addr}");
        Ok(Host {
            addr,
            shared,
            accept: Some(accept),
            io_thread: Some(io_thread),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What its shards report: rows applied, memory, backlog, the HWM the leader last sent.
    pub fn status(&self) -> HostStatus {
        self.shared.status.clone()
    }

    /// Stops listening, ends every session (each shard stops after what it received) and
    /// waits for them.
    pub fn stop(mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        let running = std::mem::take(&mut self.shared.sessions.lock().expect("sessions").running);
        end_sessions(running);
        self.shared.io.lock().expect("io").take();
        if let Some(t) = self.io_thread.take() {
            let _ = t.join();
        }
    }
}

/// Ends `running`'s sessions and waits until they did.
fn end_sessions(running: Vec<Running>) {
    for r in &running {
        let _ = r.stream.shutdown(std::net::Shutdown::Both);
    }
    for r in running {
        let _ = r.ended.recv();
    }
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((stream, from)) => {
                let shared = shared.clone();
                let spawned = std::thread::Builder::new()
                    .name("retina-host-session".into())
                    .spawn(move || {
                        if let Err(e) = session(stream, &shared) {
                            tracing::warn!("a shard session with {from}: {e}");
                        }
                    });
                if let Err(e) = spawned {
                    tracing::warn!("a shard session with {from}: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                tracing::warn!("accepting a leader's connection: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// One leader's connection for one shard: the hello, the shard's run, and its end.
fn session(mut stream: TcpStream, shared: &Arc<Shared>) -> Result<(), String> {
    stream.set_nonblocking(false).map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    stream
        .set_read_timeout(Some(HELLO_WITHIN))
        .map_err(|e| e.to_string())?;
    let frame = read_frame(&mut stream)
        .map_err(|e| format!("reading the hello: {e}"))?
        .ok_or("the connection closed before its hello")?;
    if frame.kind != Kind::Hello {
        return Err(format!("a {:?} frame came before the hello", frame.kind));
    }
    let shard = frame.shard;
    let hello = Hello::decode(&frame.body)?;
    stream.set_read_timeout(None).map_err(|e| e.to_string())?;
    let refuse = |stream: &mut TcpStream, reason: String| {
        let _ = write_frame(stream, Kind::Refused, shard, &Enc::default().str(&reason).0);
        Err(format!("shard {shard}: refused: {reason}"))
    };
    let (ended_tx, ended) = flume::bounded::<()>(0);
    let id = match admit(shared, shard, &hello, &stream, ended) {
        Ok(id) => id,
        Err(reason) => return refuse(&mut stream, reason),
    };
    let started = start_shard(shared, shard, &hello);
    let started = match started {
        Ok(s) => s,
        Err(reason) => {
            forget(shared, id);
            return refuse(&mut stream, reason);
        }
    };
    let ran = run(stream, shared, shard, &hello, started);
    forget(shared, id);
    drop(ended_tx);
    ran
}

/// Admits a session of shard `shard` for `hello`'s leadership: ends the sessions of earlier
/// leaderships and any other of the same shard first. Returns the session's id.
fn admit(
    shared: &Shared,
    shard: u16,
    hello: &Hello,
    stream: &TcpStream,
    ended: flume::Receiver<()>,
) -> Result<u64, String> {
    if hello.generation > MAX_GENERATION {
        return Err(format!(
            "generation {} of shard {shard} is past the last ({MAX_GENERATION})",
            hello.generation
        ));
    }
    if shard >= hello.shards {
        return Err(format!("shard {shard} of {} does not exist", hello.shards));
    }
    let ours = shared.options.catalog.describe();
    if hello.catalog != ours {
        return Err(format!(
            "the leader's tables differ from this node's (--schema): the leader has\n{}\nthis \
             node has\n{ours}",
            hello.catalog
        ));
    }
    let stream = stream.try_clone().map_err(|e| e.to_string())?;
    let (id, before) = {
        let mut s = shared.sessions.lock().expect("sessions");
        if hello.epoch < s.epoch {
            return Err(format!(
                "leadership {} is older than leadership {}, which this node serves now",
                hello.epoch, s.epoch
            ));
        }
        s.epoch = hello.epoch;
        let (end, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut s.running)
            .into_iter()
            .partition(|r| r.epoch < hello.epoch || r.shard == shard);
        s.running = keep;
        let id = s.next;
        s.next += 1;
        s.running.push(Running {
            id,
            shard,
            epoch: hello.epoch,
            stream,
            ended,
        });
        (id, end)
    };
    end_sessions(before);
    Ok(id)
}

/// Session `id` ended.
fn forget(shared: &Shared, id: u64) {
    let mut s = shared.sessions.lock().expect("sessions");
    s.running.retain(|r| r.id != id);
}

struct Queues {
    data: flume::Sender<ShardMsg>,
    control: flume::Sender<ShardMsg>,
    coord: flume::Receiver<CoordMsg>,
    status: Arc<NodeStatus>,
}

/// What a started shard's session runs.
struct Started {
    executor: glommio::ExecutorJoinHandle<()>,
    queues: Queues,
    /// Its scan service's address.
    scan: SocketAddr,
    /// What a shard started again reports first: its restored files ([`restored_files`]).
    files: Vec<CoordMsg>,
}

/// Restores the shard, binds its scan service and starts its executor.
fn start_shard(shared: &Shared, shard: u16, hello: &Hello) -> Result<Started, String> {
    let options = &shared.options;
    let mut state = restore(shared, shard, hello)?;
    state.skip_file_seq_to(generation_base(hello.epoch, hello.generation));
    let files = if hello.generation > 0 {
        restored_files(shared, &state)?
    } else {
        Vec::new()
    };
    let scan_listener = bind_scan(options.peer, shard)?;
    let scan = scan_listener.local_addr().map_err(|e| e.to_string())?;
    let window = usize::try_from(hello.window).unwrap_or(usize::MAX).max(1);
    let (data, data_rx) = flume::bounded::<ShardMsg>(window);
    let (control, control_rx) = flume::bounded::<ShardMsg>(CONTROL_QUEUE);
    let (coord_tx, coord) = flume::bounded::<CoordMsg>(1024);
    let status = {
        let mut current = shared.status.lock().expect("status");
        match current.as_ref() {
            Some(s) if s.shard_memory.len() == usize::from(hello.shards) => s.clone(),
            _ => current
                .insert(Arc::new(NodeStatus::new(hello.shards)))
                .clone(),
        }
    };
    let io = shared
        .io
        .lock()
        .expect("io")
        .clone()
        .ok_or("the node is stopping")?;
    let settings = &options.settings;
    let setup = ShardSetup {
        id: shard,
        shards: hello.shards,
        shard: state,
        catalog: options.catalog.clone(),
        coord: coord_tx,
        io,
        status: status.clone(),
        own: data.clone(),
        flush_interval: Duration::from_millis(settings.flush_interval_ms),
        gc_interval: Duration::from_millis(settings.gc_interval_ms),
        dead_fraction: settings.storage_gc_dead_fraction,
        data_dir: options.data_dir.clone(),
        lake_checkpoints: Some(LakeCheckpoints {
            store: shared.store.clone(),
            rt: shared.rt.clone(),
        }),
        checkpoints: hello.checkpoints,
        watermarks: hello
            .checkpoint
            .map_or(Watermarks::resumed(0, Timestamp::GENESIS), |(id, ts)| {
                Watermarks::resumed(id, ts)
            }),
        scan_listener: Some(scan_listener),
        auth_token: options.auth_token.clone(),
        // Batches come off the connection: their buffers go with it.
        batch_buffers: None,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let executor = LocalExecutorBuilder::new(Placement::Fixed(usize::from(shard) % cores))
        .name(&format!("retina-shard-{shard}"))
        .io_memory(crate::node::EXECUTOR_IO_MEMORY)
        .spawn(move || ShardActor::run(setup, control_rx, data_rx))
        .map_err(|e| format!("starting shard {shard}: {e}"))?;
    Ok(Started {
        executor,
        queues: Queues {
            data,
            control,
            coord,
            status,
        },
        scan,
        files,
    })
}

/// The regular files of a shard started again from a checkpoint: the leader dropped its lost
/// run's from the scan plans, and lists these (then those the shard combines) instead.
fn restored_files(shared: &Shared, state: &Shard) -> Result<Vec<CoordMsg>, String> {
    let size = |path: &object_store::path::Path| {
        let (store, p) = (shared.store.clone(), path.clone());
        shared
            .on_io(async move { store.head(&p).await.map(|m| m.size) })
            .map_err(|e| NodeError::Lake {
                lake: shared.lake.clone(),
                reason: format!("{path}, which the checkpoint reads: {e}"),
            })
    };
    let files = crate::recovery::shard_plan_files(state, &shared.options.catalog, size)
        .map_err(|e| e.to_string())?;
    Ok(files
        .into_iter()
        .map(|(table, file)| CoordMsg::FileAdded { table, file })
        .collect())
}

/// Shard `shard` as `hello`'s checkpoint left it (its image fetched from the lake), or empty.
fn restore(shared: &Shared, shard: u16, hello: &Hello) -> Result<Shard, String> {
    let options = &shared.options;
    let Some((id, ts)) = hello.checkpoint else {
        return crate::recovery::empty_shard(shard, &options.settings, &options.catalog)
            .map_err(|e| e.to_string());
    };
    let path = checkpoint_object(id, &format!("shard-{shard}.ckpt"));
    let named = format!("{}{path}", shared.lake);
    let store = shared.store.clone();
    let bytes = shared
        .on_io(async move { store.get(&path).await?.bytes().await })
        .map_err(|e| format!("reading {named}: {e}"))?;
    crate::recovery::restore_shard(
        &bytes,
        shard,
        id,
        ts,
        &options.settings,
        options.catalog.tables(),
    )
    .map_err(|e| format!("{named}: {e}"))
}

/// Shard `shard`'s scan service, on the port `shard + 1` after the peer port (any free port
/// when that is 0). A session of the shard that just ended may hold it for a moment.
fn bind_scan(peer: SocketAddr, shard: u16) -> Result<std::net::TcpListener, String> {
    let addr = crate::rpc::scan_addr(peer, shard)?;
    let mut tries = 0;
    loop {
        match crate::rpc::bind_listener(addr) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse && tries < 50 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(format!("shard {shard}'s scan service on {addr}: {e}")),
        }
    }
}

/// Serves the session: the leader's frames to the shard's queues (a batch granting credit back
/// once its queue took it), the shard's messages to the leader. Ends when the leader stops the
/// shard or the connection ends; the shard stops after what it received.
fn run(
    stream: TcpStream,
    shared: &Shared,
    shard: u16,
    hello: &Hello,
    started: Started,
) -> Result<(), String> {
    let Started {
        executor,
        queues,
        scan,
        files,
    } = started;
    let out = Arc::new(Mutex::new(stream.try_clone().map_err(|e| e.to_string())?));
    let send = |kind: Kind, body: &[u8]| {
        let mut s = out.lock().expect("stream");
        write_frame(&mut *s, kind, shard, body)
    };
    let Queues {
        data,
        control,
        coord,
        status,
    } = queues;
    let ready = send(Kind::Ready, &Enc::default().str(&scan.to_string()).0).and_then(|()| {
        files.iter().try_for_each(|msg| match up(msg) {
            Some((kind, about, body)) => {
                let mut s = out.lock().expect("stream");
                write_frame(&mut *s, kind, about, &body)
            }
            None => Ok(()),
        })
    });
    let uplink = {
        let out = out.clone();
        std::thread::Builder::new()
            .name(format!("retina-host-{shard}-up"))
            .spawn(move || {
                // Ends once the shard (the only sender left) stopped.
                for msg in coord.iter() {
                    if let Some((kind, about, body)) = up(&msg) {
                        let mut s = out.lock().expect("stream");
                        if write_frame(&mut *s, kind, about, &body).is_err() {
                            break;
                        }
                    }
                }
            })
            .map_err(|e| e.to_string())?
    };
    tracing::info!(
        "running shard {shard} of {} for leadership {} (from {}), scan service on {scan}",
        hello.shards,
        hello.epoch,
        hello
            .checkpoint
            .map_or("an empty shard".to_owned(), |(id, ts)| format!(
                "checkpoint {id} at {ts}"
            ))
    );
    let mut reader = stream;
    let mut images = Images::new(&shared.options.data_dir, shard);
    let why = match ready {
        Err(e) => Some(e.to_string()),
        Ok(()) => loop {
            let frame = match read_frame(&mut reader) {
                Ok(Some(f)) => f,
                Ok(None) => break Some("the leader closed the connection".into()),
                Err(e) => break Some(e.to_string()),
            };
            let msg = match shard_msg(frame) {
                Ok(m) => m,
                Err(e) => break Some(format!("an unreadable frame: {e}")),
            };
            match msg {
                ShardMsg::Stop => break None,
                ShardMsg::Apply(_) => {
                    status.backlog_batches.fetch_add(1, Ordering::Relaxed);
                    if data.send(msg).is_err() {
                        break Some("the shard stopped".into());
                    }
                    if let Err(e) = send(Kind::Credit, &Enc::default().u64(1).0) {
                        break Some(e.to_string());
                    }
                }
                ShardMsg::Checkpoint { id, .. } => {
                    if let Err(e) = images.prepare(id) {
                        break Some(e);
                    }
                    if data.send(msg).is_err() {
                        break Some("the shard stopped".into());
                    }
                }
                _ => {
                    if let ShardMsg::Watermarks(w) = &msg {
                        status.hwm.store(w.hwm.get().get(), Ordering::Relaxed);
                    }
                    if control.send(msg).is_err() {
                        break Some("the shard stopped".into());
                    }
                }
            }
        },
    };
    if let Some(why) = &why {
        tracing::warn!(
            "shard {shard} (leadership {}): {why}; it stops",
            hello.epoch
        );
    }
    let _ = data.send(ShardMsg::Stop);
    let _ = executor.join();
    drop((data, control));
    let _ = uplink.join();
    let _ = out
        .lock()
        .expect("stream")
        .shutdown(std::net::Shutdown::Both);
    tracing::info!("shard {shard} (leadership {}) stopped", hello.epoch);
    Ok(())
}

/// This shard's checkpoint images in the data directory: the leader keeps checkpoints in the
/// lake, so the host keeps only its newest two images locally.
struct Images {
    data_dir: PathBuf,
    shard: u16,
    written: Vec<u64>,
}

impl Images {
    fn new(data_dir: &Path, shard: u16) -> Self {
        Images {
            data_dir: data_dir.to_owned(),
            shard,
            written: Vec::new(),
        }
    }

    /// Makes checkpoint `id`'s folder and drops this shard's images older than the last one.
    fn prepare(&mut self, id: u64) -> Result<(), String> {
        let dir = checkpoint_dir(&self.data_dir, id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        self.written.push(id);
        while self.written.len() > 2 {
            let old = self.written.remove(0);
            let dir = checkpoint_dir(&self.data_dir, old);
            let _ = std::fs::remove_file(dir.join(format!("shard-{}.ckpt", self.shard)));
            // Gone once no other shard's image is left in it.
            let _ = std::fs::remove_dir(&dir);
        }
        Ok(())
    }
}
