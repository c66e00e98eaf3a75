//! A standby's `--listen`: every connection is passed, byte for byte, to the coordinator service
//! of whichever member leads (the address its entry advertises), so clients may reach a cluster
//! through any member. It stops when this member takes the lead, which then binds the port
//! itself.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{ClusterSpec, Member};

/// How long connecting to the leader may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The forwarding listener; [`Forwarder::stop`] closes it (connections in progress go on).
pub struct Forwarder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    /// Listens on `listen` and forwards each connection to the leader of `spec`.
    pub fn start(listen: SocketAddr, spec: ClusterSpec) -> std::io::Result<Forwarder> {
        let listener = TcpListener::bind(listen)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("retina-forward".into())
                .spawn(move || accept(&listener, &spec, &stop))?
        };
        tracing::info!("standby: connections to {addr} go to the leader's coordinator service");
        Ok(Forwarder {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes the listener, so that the port is free (connections in progress go on).
    pub fn stop(mut self) {
        self.close();
    }

    fn close(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wakes the accept.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.close();
    }
}

fn accept(listener: &TcpListener, spec: &ClusterSpec, stop: &AtomicBool) {
    for client in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(client) = client else { continue };
        let spec = spec.clone();
        let _ = std::thread::Builder::new()
            .name("retina-forward-conn".into())
            .spawn(move || {
                if let Err(e) = forward(client, &spec) {
                    tracing::warn!("standby: forwarding a connection to the leader: {e}");
                }
            });
    }
}

/// Passes `client`'s bytes to the leader's coordinator service and back until either side
/// closes.
fn forward(client: TcpStream, spec: &ClusterSpec) -> Result<(), String> {
    let leader = Member::leader_address(spec)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no member leads {spec} now"))?;
    let addr = leader
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("the leader advertises `{leader}`, not HOST:PORT"))?;
    let upstream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .map_err(|e| format!("connecting to the leader at {addr}: {e}"))?;
    let _ = upstream.set_nodelay(true);
    let _ = client.set_nodelay(true);
    let (mut client_in, mut up_out) = (
        client.try_clone().map_err(|e| e.to_string())?,
        upstream.try_clone().map_err(|e| e.to_string())?,
    );
    let (mut up_in, mut client_out) = (upstream, client);
    let there = std::thread::Builder::new()
        .name("retina-forward-up".into())
        .spawn(move || pipe(&mut client_in, &mut up_out))
        .map_err(|e| e.to_string())?;
    pipe(&mut up_in, &mut client_out);
    let _ = there.join();
    Ok(())
}

/// Copies `from` to `to` until `from` ends, then ends `to`'s writing side.
fn pipe(from: &mut TcpStream, to: &mut TcpStream) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}
