//! The node: starts the actors on their cores and wires them, then hands out a [`NodeHandle`].
//!
//! - The coordinator ([`crate::coordinator`]) is an executor of its own, placed on core 0
//!   beside shard 0. It owns the timestamp allocator, HWM and LWM and persists them.
//! - Each shard ([`crate::shard`]) is a glommio executor pinned to its core. It owns a storage
//!   [`Shard`] and reads rkyv [`retina_protocol::OpBatch`]es in place; nothing else touches
//!   its state.
//! - Object-store I/O ([`crate::io`]) runs on a tokio runtime on its own thread; shards reach
//!   it over a bounded queue.
//! - The sink ([`crate::sink`]) and local readers call the [`NodeHandle`], which groups source
//!   transactions, takes their timestamps from the coordinator in one request (group begin),
//!   routes each operation to its shard and sends every shard its slice, ending in "applied
//!   through" (so HWM is a group commit).
//!
//! Every channel is bounded; a full shard queue blocks the sink, which stops reading the source.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};
use retina_storage::{Hwm, Timestamp};

use crate::catalog::Catalog;
use crate::cluster::store::ClusterState;
use crate::cluster::{Member, MetaStore, epoch_base};
use crate::coordinator::actor::{CONTROL_QUEUE, CoordinatorActor};
use crate::coordinator::{
    CoordMsg, CoordinatorState, SOURCE_STATE_FILE, StateFile, checkpoint_dir,
};
use crate::io::IoRequest;
use crate::lake::{Lake, LakeSpec};
use crate::settings::Settings;
use crate::shard::{ShardActor, ShardMsg, ShardSetup, Watermarks};
use crate::{datadir, recovery};

pub use crate::datadir::absolute_dir;
pub use crate::error::NodeError;
pub use crate::handle::NodeHandle;
pub use crate::status::{IoKind, NodeStatus, QueueProbe, ShardMemory};

/// Messages that may wait for the coordinator.
const COORD_QUEUE: usize = 1024;
/// io_uring buffer memory each executor registers (locked memory). Small, so a node runs under
/// a non-root user's default 8 MiB memlock limit; raise it when shards do DMA file I/O.
pub(crate) const EXECUTOR_IO_MEMORY: usize = 512 << 10;

/// What the node needs to start.
pub struct NodeOptions {
    pub data_dir: PathBuf,
    /// Where the Parquet objects go: `DATA_DIR/lake` (the default) or an S3 bucket, which
    /// then also keeps the checkpoints.
    pub lake: LakeSpec,
    pub catalog: Arc<Catalog>,
    pub settings: Settings,
    /// Where the coordinator's Cap'n Proto service listens (port 0: any free port); `None`
    /// serves no RPC.
    pub listen: Option<std::net::SocketAddr>,
    /// A socket bound to `listen` already, which the coordinator's service takes over (a
    /// standby's forwarder hands over its own: the port never lies free meanwhile, for a
    /// connection or another server to take, and a client that connects during the switch
    /// waits for the service); `None`: the service binds `listen`.
    pub listener: Option<std::net::TcpListener>,
    /// The token clients present at bootstrap; required beyond loopback.
    pub auth_token: Option<String>,
    /// Queries wait for the sink's [`NodeHandle::caught_up`] before they begin (a sink reads
    /// the source); else only until HWM is back where it was persisted.
    pub await_source: bool,
    /// This node's membership of a cluster, once it leads (`None`: a node on its own). The
    /// coordinator's state then lives in the cluster's metadata store, the node starts from
    /// the checkpoint recorded there, hands out timestamps only while its lease stands, and
    /// numbers its files and checkpoints from its epoch's base.
    pub cluster: Option<Arc<Member>>,
}

/// The I/O runtime until the I/O thread takes it: a start that fails before drops it without
/// blocking (dropping a runtime blocks, which panics inside another runtime's task).
struct RuntimeGuard(Option<tokio::runtime::Runtime>);

impl Drop for RuntimeGuard {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A running node. Dropping it without [`Node::shutdown`] leaves its threads running.
pub struct Node {
    handle: NodeHandle,
    /// The data directory's lock, held while the node runs.
    _lock: std::fs::File,
    listening: Option<std::net::SocketAddr>,
    scan_addrs: crate::rpc::ScanAddrs,
    coordinator: Option<glommio::ExecutorJoinHandle<()>>,
    executors: Vec<glommio::ExecutorJoinHandle<()>>,
    /// The threads of the shards other members run ([`crate::remote::proxy`]).
    remote: Vec<std::thread::JoinHandle<()>>,
    /// A cluster's leader: starts those shards again, or moves them.
    rejoin: Option<Arc<crate::remote::Rejoiner>>,
    io_thread: Option<std::thread::JoinHandle<()>>,
    io: flume::Sender<IoRequest>,
}

impl Node {
    /// Starts the coordinator, the shards and the I/O thread over `options.data_dir`.
    pub fn start(mut options: NodeOptions) -> Result<Node, NodeError> {
        options.settings.validate()?;
        // Absolute once, here: glommio opens directories relative to no descriptor, so a
        // relative path fails there (EBADF) long after the start.
        options.data_dir =
            datadir::absolute_dir(&options.data_dir).map_err(|source| NodeError::DataDir {
                path: options.data_dir.clone(),
                source,
            })?;
        let settings = &options.settings;
        let shards = settings.shard_count();
        let lock = datadir::lock_data_dir(&options.data_dir)?;
        // The I/O thread's runtime, built here: the start reads a remote lake on it first.
        let rt = RuntimeGuard(Some(crate::io::io_runtime().map_err(|e| {
            NodeError::Executor {
                what: "the I/O runtime".into(),
                reason: e.to_string(),
            }
        })?));
        let rt_ref = rt.0.as_ref().expect("the runtime");
        let lake = Lake::open(&options.lake, &options.data_dir, rt_ref)?;
        let store = lake.store.clone();
        let store_url = lake.url.clone();
        let mut persisted = StateFile::new(&options.data_dir).load()?;
        datadir::check_lake(
            &options.data_dir,
            &options.lake.to_string(),
            persisted.checkpoint.is_some(),
        )?;
        let epoch = options.cluster.as_ref().map_or(0, |m| m.epoch());
        // What the cluster recorded is the commit point; a cluster that recorded nothing yet
        // starts from the lake, like a node on its own (say, one that joined a cluster).
        let in_cluster = match &options.cluster {
            Some(member) => {
                if !lake.is_remote() {
                    return Err(NodeError::Lake {
                        lake: lake.url.clone(),
                        reason: format!(
                            "the nodes of the cluster {} share a remote lake: give --lake \
                             s3://BUCKET/PREFIX",
                            member.spec()
                        ),
                    });
                }
                member.load_state_to_lead()?
            }
            None => None,
        };
        match in_cluster {
            Some(cluster) => recovery::adopt_cluster_checkpoint(
                &options.data_dir,
                &lake,
                rt_ref,
                &mut persisted,
                cluster,
            )?,
            None => {
                recovery::adopt_lake_checkpoint(&options.data_dir, &lake, rt_ref, &mut persisted)?
            }
        }
        datadir::check_catalog(
            &options.data_dir,
            &options.catalog,
            persisted.checkpoint.is_some(),
        )?;
        let recovered = recovery::recover(
            &options.data_dir,
            &options.catalog,
            settings,
            &persisted,
            &lake,
            rt_ref,
            epoch,
        )?;
        let resume_state: Arc<[u8]> = match persisted.checkpoint {
            Some(c) => {
                let path = checkpoint_dir(&options.data_dir, c.id).join(SOURCE_STATE_FILE);
                match std::fs::read(&path) {
                    Ok(b) => b.into(),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Arc::from([]),
                    Err(source) => return Err(NodeError::DataDir { path, source }),
                }
            }
            None => Arc::from([]),
        };
        let status = Arc::new(NodeStatus::new(shards));
        let resume_ts = persisted.checkpoint.map_or(Timestamp::GENESIS, |c| c.ts);
        status.hwm.store(
            Hwm::after(resume_ts)
                .expect("below the maximum")
                .get()
                .get(),
            Ordering::Release,
        );
        status.lwm.store(resume_ts.get(), Ordering::Release);
        status.retain_lwm.store(resume_ts.get(), Ordering::Release);
        if let Some(c) = persisted.checkpoint {
            status.checkpoint_id.store(c.id, Ordering::Release);
            status.checkpoint_ts.store(c.ts.get(), Ordering::Release);
            tracing::info!(
                "resuming from checkpoint {} at timestamp {} (source byte {}, line {})",
                c.id,
                c.ts,
                c.source.offset,
                c.source.line
            );
        }
        let files = recovery::plan_files(&recovered, &options.catalog, &lake, rt_ref)?;
        let mut recovered = recovered.into_iter();
        if let Some(member) = &options.cluster {
            member.report(status.clone());
            status.cluster_epoch.store(epoch, Ordering::Relaxed);
            let _ = status.lease.set(member.clock().clone());
        }
        let io_rt = rt_ref.handle().clone();
        // Checkpoints go to a remote lake too, uploaded on the I/O thread's runtime.
        let lake_checkpoints = lake.is_remote().then(|| crate::lake::LakeCheckpoints {
            store: store.clone(),
            rt: io_rt.clone(),
        });

        // Object-store I/O thread.
        let (io_tx, io_rx) = flume::bounded::<IoRequest>(crate::io::IO_QUEUE);
        let io_thread = {
            let store = store.clone();
            let config = settings.storage();
            let local: Option<Arc<std::path::Path>> = lake.local.clone().map(Into::into);
            let status = status.clone();
            let mut rt = rt;
            let rt = rt.0.take().expect("the runtime");
            std::thread::Builder::new()
                .name("retina-io".into())
                .spawn(move || crate::io::io_main(io_rx, rt, store, config, local, status))
                .map_err(|e| NodeError::Executor {
                    what: "the I/O thread".into(),
                    reason: e.to_string(),
                })?
        };

        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (coord_tx, coord_rx) = flume::bounded::<CoordMsg>(COORD_QUEUE);
        let mut executors = Vec::new();
        let spawn_err = |what: String| {
            move |e: glommio::GlommioError<()>| NodeError::Executor {
                what,
                reason: e.to_string(),
            }
        };

        // The coordinator's RPC listener, bound here so that a bad address fails the start.
        let mut listening = None;
        let listener_fd = match options.listen {
            Some(addr) => {
                crate::rpc::check_listen(addr, options.auth_token.as_deref()).map_err(
                    |reason| NodeError::Executor {
                        what: "the coordinator service".into(),
                        reason,
                    },
                )?;
                let listener = match options.listener.take() {
                    Some(bound) => crate::rpc::serve_listener(bound),
                    None => crate::rpc::bind_listener(addr),
                }
                .map_err(|e| NodeError::Executor {
                    what: format!("the coordinator service on {addr}"),
                    reason: e.to_string(),
                })?;
                listening = Some(listener.local_addr().map_err(|e| NodeError::Executor {
                    what: "the coordinator service".into(),
                    reason: e.to_string(),
                })?);
                // Owned until its executor takes it: a start that fails before closes it.
                Some(listener)
            }
            None => None,
        };

        // A cluster's leader places the shards over the members that run them, and connects
        // to each for its shards.
        let hello = crate::remote::Hello {
            epoch,
            shards,
            window: settings.shard_queue_batches as u64,
            checkpoints: settings.checkpoint_interval_ms > 0,
            checkpoint: persisted.checkpoint.map(|c| (c.id, c.ts)),
            generation: 0,
            catalog: options.catalog.describe(),
        };
        let placed = match &options.cluster {
            Some(member) => Some(crate::remote::place(member, shards, &hello)?),
            None => None,
        };
        let (mut remote, placement) = match placed {
            Some(p) => (p.connections, Some(p.placement)),
            None => (Vec::new(), None),
        };
        remote.resize_with(shards.into(), || None);

        // Each shard's scan service: the ports after the coordinator's (any free port when the
        // coordinator's is 0), on the same host; a remote shard's is on its member.
        let mut scan_listeners = Vec::new();
        let mut scan_addrs = Vec::new();
        if let Some(base) = listening {
            for id in 0..shards {
                if let Some(conn) = &remote[usize::from(id)] {
                    scan_addrs.push(conn.scan);
                    scan_listeners.push(None);
                    continue;
                }
                // The bound port of a service asked for on port 0 is not a base.
                let mut base = base;
                if options.listen.is_some_and(|l| l.port() == 0) {
                    base.set_port(0);
                }
                let addr =
                    crate::rpc::scan_addr(base, id).map_err(|reason| NodeError::Executor {
                        what: format!("the scan service of shard {id}"),
                        reason,
                    })?;
                let bind_err = |e: std::io::Error| NodeError::Executor {
                    what: format!("the scan service of shard {id} on {addr}"),
                    reason: e.to_string(),
                };
                let l = crate::rpc::bind_listener(addr).map_err(bind_err)?;
                scan_addrs.push(l.local_addr().map_err(bind_err)?);
                scan_listeners.push(Some(l));
            }
        } else {
            scan_listeners.resize_with(shards.into(), || None);
        }
        let mut scan_listeners = scan_listeners.into_iter();
        let scan_addrs: crate::rpc::ScanAddrs = Arc::new(std::sync::RwLock::new(scan_addrs));
        // A remote shard whose member is lost starts again on a live member, alone.
        let rejoin: Option<Arc<crate::remote::Rejoiner>> = match (&options.cluster, placement) {
            (Some(member), Some(placement)) => Some(Arc::new(crate::remote::Rejoiner::new(
                member.clone(),
                hello,
                placement,
                scan_addrs.clone(),
                settings.remote_redo_bytes > 0,
            ))),
            _ => None,
        };

        // Every shard's queues, created first: the coordinator sends to shards too. The data
        // queue bounds the batches in flight; the control queue is the coordinator's.
        // A batch taken per batch applied: a little slack per shard is enough.
        let batch_buffers = crate::handle::BatchBuffers::new(2 * usize::from(shards) + 2);
        let (shard_txs, mut shard_rxs): (Vec<_>, Vec<_>) = (0..shards)
            .map(|_| flume::bounded::<ShardMsg>(settings.shard_queue_batches))
            .unzip();
        let mut shard_rxs = shard_rxs.drain(..);
        let (control_txs, mut control_rxs): (Vec<_>, Vec<_>) = (0..shards)
            .map(|_| flume::bounded::<ShardMsg>(CONTROL_QUEUE))
            .unzip();
        let mut control_rxs = control_rxs.drain(..);
        let mut control_probes = (control_txs.iter().enumerate())
            .map(|(id, c)| QueueProbe::of(format!("shard-{id}-control"), c))
            .collect::<Vec<_>>()
            .into_iter();

        // Coordinator.
        let sequencer;
        {
            let file = StateFile::new(&options.data_dir);
            let store: Box<dyn MetaStore> = match &options.cluster {
                Some(member) => Box::new(ClusterState::new(file, member.clone())),
                None => Box::new(file),
            };
            let state = CoordinatorState::new(shards, persisted, options.await_source)
                .with_files(files)
                .with_checkpoint_ids_after(epoch_base(epoch));
            sequencer = state.sequencer();
            let actor = CoordinatorActor::new(
                state,
                store,
                options.data_dir.clone(),
                lake_checkpoints.clone(),
                status.clone(),
                control_txs,
                settings,
            );
            let own = coord_tx.clone();
            let tick = Duration::from_millis(settings.persist_interval_ms);
            let service = (
                coord_tx.clone(),
                options.catalog.clone(),
                options.auth_token.clone(),
                settings.query_lease_ms,
                scan_addrs.clone(),
                store_url.clone(),
            );
            executors.push(
                LocalExecutorBuilder::new(Placement::Fixed(0))
                    .name("retina-coordinator")
                    .io_memory(EXECUTOR_IO_MEMORY)
                    .spawn(move || async move {
                        // Canceled when the actor stops, which closes the listener: a node
                        // started again in this process can bind the port at once.
                        let listener_fd = listener_fd.map(std::os::fd::IntoRawFd::into_raw_fd);
                        let stop =
                            listener_fd.and_then(|fd| crate::rpc::ListenerStop::new(fd).ok());
                        let rpc = listener_fd.map(|fd| {
                            let (coord, catalog, token, lease_ms, endpoints, store_url) = service;
                            // SAFETY: the descriptor is a bound, non-blocking TCP listener whose
                            // ownership passed here from `into_raw_fd`.
                            let listener = unsafe {
                                <glommio::net::TcpListener as std::os::fd::FromRawFd>::from_raw_fd(
                                    fd,
                                )
                            };
                            glommio::spawn_local(crate::coordinator::service::serve(
                                listener, coord, catalog, token, lease_ms, endpoints, store_url,
                            ))
                        });
                        let ran = actor.run(coord_rx, own, tick).await;
                        if let Some(rpc) = rpc {
                            rpc.cancel().await;
                        }
                        drop(stop);
                        ran
                    })
                    .map_err(spawn_err("the coordinator".into()))?,
            );
        }
        let coordinator = executors.pop();

        let mut queues = vec![
            QueueProbe::of("coordinator".into(), &coord_tx),
            QueueProbe::of("io".into(), &io_tx),
        ];
        for (id, data) in shard_txs.iter().enumerate() {
            queues.push(QueueProbe::of(format!("shard-{id}-data"), data));
            queues.extend(control_probes.next());
        }
        let _ = status.queues.set(queues);

        // Shards.
        let watermarks = Watermarks::resumed(persisted.checkpoint.map_or(0, |c| c.id), resume_ts);
        let mut remote_threads = Vec::new();
        for id in 0..shards {
            let data = shard_rxs.next().expect("a queue per shard");
            let control = control_rxs.next().expect("a queue per shard");
            let restored = recovered.next();
            if let Some(conn) = remote[usize::from(id)].take() {
                // Its state is the member's, restored there from the same checkpoint.
                drop(restored);
                let _ = scan_listeners.next();
                let thread = crate::remote::proxy::spawn(
                    conn,
                    crate::remote::proxy::ProxySetup {
                        data,
                        control,
                        coord: coord_tx.clone(),
                        status: status.clone(),
                        window: settings.shard_queue_batches as u64,
                        from: persisted.checkpoint.map(|c| (c.id, c.ts)),
                        redo_bytes: usize::try_from(settings.remote_redo_bytes)
                            .unwrap_or(usize::MAX),
                        rejoin: rejoin.clone().map(|r| r as Arc<dyn crate::remote::Rejoin>),
                        moves: rejoin.as_ref().map(|r| r.mover(id)),
                    },
                )
                .map_err(|e| NodeError::Executor {
                    what: format!("the connection of shard {id}"),
                    reason: e.to_string(),
                })?;
                remote_threads.push(thread);
                continue;
            }
            let mut shard = match restored {
                Some(s) => s,
                None => recovery::empty_shard(id, settings, &options.catalog)?,
            };
            shard.skip_file_seq_to(epoch_base(epoch));
            let setup = ShardSetup {
                id,
                shards,
                shard,
                catalog: options.catalog.clone(),
                coord: coord_tx.clone(),
                io: io_tx.clone(),
                status: status.clone(),
                own: shard_txs[usize::from(id)].clone(),
                flush_interval: Duration::from_millis(settings.flush_interval_ms),
                gc_interval: Duration::from_millis(settings.gc_interval_ms),
                dead_fraction: settings.storage_gc_dead_fraction,
                data_dir: options.data_dir.clone(),
                lake_checkpoints: lake_checkpoints.clone(),
                checkpoints: settings.checkpoint_interval_ms > 0,
                watermarks,
                scan_listener: scan_listeners.next().flatten(),
                auth_token: options.auth_token.clone(),
                batch_buffers: Some(batch_buffers.clone()),
            };
            executors.push(
                LocalExecutorBuilder::new(Placement::Fixed(usize::from(id) % cores))
                    .name(&format!("retina-shard-{id}"))
                    .io_memory(EXECUTOR_IO_MEMORY)
                    .spawn(move || ShardActor::run(setup, control, data))
                    .map_err(spawn_err(format!("shard {id}")))?,
            );
        }

        Ok(Node {
            listening,
            scan_addrs,
            handle: NodeHandle {
                submit_order: Arc::new(Mutex::new(())),
                shards: shard_txs,
                coord: coord_tx,
                sequencer,
                catalog: options.catalog,
                status,
                store,
                io_rt,
                resume: persisted.checkpoint.map(|c| c.source),
                resume_state,
                decimal_handling: settings.decimal_handling,
                data_dir: options.data_dir.as_path().into(),
                lease: options.cluster.as_ref().map(|m| m.clock().clone()),
                batch_buffers,
            },
            _lock: lock,
            coordinator,
            executors,
            remote: remote_threads,
            rejoin,
            io_thread: Some(io_thread),
            io: io_tx,
        })
    }

    pub fn handle(&self) -> &NodeHandle {
        &self.handle
    }

    /// A cluster's leader: gives members that run no shard shards from members that run more,
    /// without stopping the others; false where that cannot place every such member (see
    /// [`crate::remote::Rejoiner::rebalance`]), or on a node that is no cluster's leader.
    pub fn rebalance(&self) -> bool {
        self.rejoin.as_ref().is_some_and(|r| r.rebalance())
    }

    /// Where each shard's scan service listens, by shard (empty without `listen`).
    pub fn scan_addrs(&self) -> Vec<std::net::SocketAddr> {
        self.scan_addrs.read().expect("scan addresses").clone()
    }

    /// Where the coordinator's Cap'n Proto service listens, if it does.
    pub fn coordinator_addr(&self) -> Option<std::net::SocketAddr> {
        self.listening
    }

    /// Stops every actor after what was sent before, persists the coordinator, and waits.
    /// The shards stop first, so the coordinator records a checkpoint they finished.
    pub fn shutdown(mut self) {
        for s in &self.handle.shards {
            let _ = s.send(ShardMsg::Stop);
        }
        for e in self.executors.drain(..) {
            let _ = e.join();
        }
        // A remote shard's connection ends once its member stopped the shard.
        for t in self.remote.drain(..) {
            let _ = t.join();
        }
        let (tx, rx) = flume::bounded(1);
        if self.handle.coord.send(CoordMsg::Stop { reply: tx }).is_ok() {
            let _ = rx.recv();
        }
        if let Some(c) = self.coordinator.take() {
            let _ = c.join();
        }
        drop(self.io);
        if let Some(t) = self.io_thread.take() {
            let _ = t.join();
        }
    }
}
