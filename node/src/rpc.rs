//! What every Cap'n Proto port of the node shares (`protocol/schema/retina.capnp`): the
//! bootstrap that checks the auth token and hands out the port's service, the accept loop with
//! its limits on connections and messages, and the limits the services apply to arguments.
//! The services themselves are the coordinator's ([`crate::coordinator::service`]) and each
//! shard's ([`crate::shard::scan_service`]).

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

use capnp_rpc::{RpcSystem, twoparty};
use futures::AsyncReadExt;
use retina_protocol::retina_capnp::{bootstrap, coordinator, scan_service};

/// Largest message a client may send, in 8-byte words (Cap'n Proto's traversal limit): every
/// request fits in far less (the largest, 65,536 known files, is 512 KiB); a connection that
/// sends more is closed.
const TRAVERSAL_LIMIT_WORDS: usize = 1 << 20;
/// Deepest nesting a message may have.
const NESTING_LIMIT: i32 = 64;
/// Connections one port serves at once; further ones are closed as they come.
pub const MAX_CONNECTIONS: usize = 1024;
/// Row groups one `bitmaps` or `fileBitmaps` call may name.
pub use retina_protocol::query::MAX_ROW_GROUPS_PER_CALL;
/// Known files one `writeBuffer` call may list.
pub const MAX_KNOWN_FILES: u32 = 65_536;
/// Bytes of a table name `scanPlan` accepts.
pub const MAX_TABLE_NAME_BYTES: usize = 1024;
/// Bytes of Arrow data in one memory part: a larger block goes out as several parts (each far
/// below Cap'n Proto's 512 MiB limit on one `Data`).
pub const MAX_PART_BYTES: usize = 16 << 20;

/// A call's answer when the actor behind the service is gone.
pub fn stopped() -> capnp::Error {
    capnp::Error::disconnected("the node is stopping".into())
}

/// Whether a node may listen on `addr` without a token: only on loopback.
pub fn check_listen(addr: SocketAddr, auth_token: Option<&str>) -> Result<(), String> {
    if addr.ip().is_loopback() || auth_token.is_some_and(|t| !t.is_empty()) {
        Ok(())
    } else {
        Err(format!(
            "listening on {addr}, beyond loopback, needs --auth-token: clients then present it"
        ))
    }
}

/// What a port serves: the coordinator, or one shard's scan service.
pub enum Service {
    Coordinator(coordinator::Client),
    Scan(scan_service::Client),
}

/// Every port's bootstrap: checks the token, hands out the port's service, and answers a
/// request for the other service with a typed `wrongService`.
pub struct Bootstrap {
    pub service: Service,
    pub auth_token: Option<String>,
}

/// Whether `presented` is the node's token (any token when the node has none). Compared in
/// full, whatever the first difference, so timing says nothing.
fn token_matches(expected: Option<&str>, presented: &str) -> bool {
    match expected {
        None => true,
        Some(t) => {
            t.len() == presented.len()
                && t.bytes()
                    .zip(presented.bytes())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
        }
    }
}

impl bootstrap::Server for Bootstrap {
    fn coordinator(
        self: Rc<Self>,
        params: bootstrap::CoordinatorParams,
        mut results: bootstrap::CoordinatorResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let outcome = (|| {
            let token = params.get()?.get_auth_token()?.to_str()?;
            let mut result = results.get().init_result();
            match &self.service {
                _ if !token_matches(self.auth_token.as_deref(), token) => {
                    result.init_error().set_unauthorized(())
                }
                Service::Coordinator(c) => result.set_ok(c.clone()),
                Service::Scan(_) => result.init_error().set_wrong_service(
                    "this is a shard's scan-service port; the coordinator has its own",
                ),
            }
            Ok(())
        })();
        std::future::ready(outcome)
    }

    fn scan_service(
        self: Rc<Self>,
        params: bootstrap::ScanServiceParams,
        mut results: bootstrap::ScanServiceResults,
    ) -> impl Future<Output = Result<(), capnp::Error>> + 'static {
        let outcome = (|| {
            let token = params.get()?.get_auth_token()?.to_str()?;
            let mut result = results.get().init_result();
            match &self.service {
                _ if !token_matches(self.auth_token.as_deref(), token) => {
                    result.init_error().set_unauthorized(())
                }
                Service::Scan(s) => result.set_ok(s.clone()),
                Service::Coordinator(_) => result.init_error().set_wrong_service(
                    "this is the coordinator's port; scan services listen on each shard's",
                ),
            }
            Ok(())
        })();
        std::future::ready(outcome)
    }
}

/// Each shard's scan-service address, by shard, as scan plans name them: a remote shard that
/// starts again on another member moves it.
pub type ScanAddrs = std::sync::Arc<std::sync::RwLock<Vec<SocketAddr>>>;

/// Where shard `shard`'s scan service listens beside a service on `base`: the port `shard + 1`
/// after `base`'s, on the same address (any free port when `base`'s is 0).
pub fn scan_addr(base: SocketAddr, shard: u16) -> Result<SocketAddr, String> {
    let mut addr = base;
    if base.port() != 0 {
        let port = u32::from(base.port()) + 1 + u32::from(shard);
        addr.set_port(u16::try_from(port).map_err(|_| {
            format!("shard {shard}'s scan service would be on port {port}: choose a lower port")
        })?);
    }
    Ok(addr)
}

/// A listener on `addr` for a Cap'n Proto service: bound, non-blocking, and with room for
/// [`MAX_CONNECTIONS`] connections waiting to be accepted (the standard library's 128 turns a
/// burst of clients, hundreds of query workers connecting at once, into resets).
pub fn bind_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    serve_listener(std::net::TcpListener::bind(addr)?)
}

/// As [`bind_listener`], for a socket bound already (a standby's forwarder hands its own over
/// when the member takes the lead, so that the port is never free for another to take).
pub fn serve_listener(listener: std::net::TcpListener) -> std::io::Result<std::net::TcpListener> {
    listener.set_nonblocking(true)?;
    // SAFETY: `listen` again on a listening socket this value owns only changes its backlog.
    let backlog = i32::try_from(MAX_CONNECTIONS).unwrap_or(i32::MAX);
    if unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(&listener), backlog) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(listener)
}

/// Stops a listener whose descriptor a glommio task owns, when that task is canceled: glommio
/// closes a dropped listener through its ring, which an executor that is ending may never get
/// to, so the port would stay taken and a node started again in this process could not bind
/// it. This holds a duplicate of the descriptor and shuts the socket down (it stops listening).
pub struct ListenerStop(std::os::fd::RawFd);

impl ListenerStop {
    /// A stop for the listener `fd` (before its ownership passes to the task).
    pub fn new(fd: std::os::fd::RawFd) -> std::io::Result<Self> {
        // SAFETY: dup of a descriptor this process owns; the copy is closed in `drop`.
        let copy = unsafe { libc::dup(fd) };
        if copy < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ListenerStop(copy))
    }
}

impl Drop for ListenerStop {
    fn drop(&mut self) {
        // SAFETY: the duplicate is this value's own; shutting a listening socket down takes
        // it out of the listening state for every descriptor of it.
        unsafe {
            libc::shutdown(self.0, libc::SHUT_RDWR);
            libc::close(self.0);
        }
    }
}

/// The descriptors of the accept loop's open connections; shut down when it is dropped.
#[derive(Default)]
struct LiveConnections(Rc<std::cell::RefCell<std::collections::HashSet<std::os::fd::RawFd>>>);

impl Drop for LiveConnections {
    fn drop(&mut self) {
        for &fd in self.0.borrow().iter() {
            // SAFETY: a connection's socket that is still open (its task removes it when it
            // ends); shutting it down ends it for the client without closing the descriptor,
            // which the connection's task still owns.
            unsafe {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
    }
}

/// Called once when a connection ends.
pub type OnClose = Option<Box<dyn FnOnce()>>;

/// Serves each accepted connection with the bootstrap `make` returns for it (and calls its
/// `OnClose` when it ends), at most [`MAX_CONNECTIONS`] at once.
pub async fn accept_loop(
    listener: glommio::net::TcpListener,
    mut make: impl FnMut() -> (bootstrap::Client, OnClose),
    what: &'static str,
) {
    let open = Rc::new(Cell::new(0usize));
    // Connections still open when this loop is dropped (its task canceled as the node stops)
    // are shut down: their tasks are detached and may never run again, and a client must see
    // the connection end rather than wait on it.
    let live = LiveConnections::default();
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("{what}: accept: {e}");
                continue;
            }
        };
        if open.get() >= MAX_CONNECTIONS {
            tracing::warn!("{what}: {MAX_CONNECTIONS} connections are open: closing a new one");
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        live.0.borrow_mut().insert(fd);
        let (reader, writer) = stream.split();
        let mut options = capnp::message::ReaderOptions::new();
        options.traversal_limit_in_words(Some(TRAVERSAL_LIMIT_WORDS));
        options.nesting_limit(NESTING_LIMIT);
        let network = twoparty::VatNetwork::new(
            futures::io::BufReader::with_capacity(retina_protocol::query::RPC_BUFFER_BYTES, reader),
            futures::io::BufWriter::with_capacity(retina_protocol::query::RPC_BUFFER_BYTES, writer),
            capnp_rpc::rpc_twoparty_capnp::Side::Server,
            options,
        );
        let (bootstrap, on_close) = make();
        let system = RpcSystem::new(Box::new(network), Some(bootstrap.client));
        open.set(open.get() + 1);
        let open = open.clone();
        let live = live.0.clone();
        glommio::spawn_local(async move {
            if let Err(e) = system.await {
                tracing::debug!("{what}: a connection ended: {e}");
            }
            live.borrow_mut().remove(&fd);
            open.set(open.get() - 1);
            if let Some(f) = on_close {
                f();
            }
        })
        .detach();
    }
}
