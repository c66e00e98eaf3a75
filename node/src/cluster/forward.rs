//! A standby's `--listen`: every connection is passed, byte for byte, to the coordinator service
//! of whichever member leads (the address its entry advertises), so clients may reach a cluster
//! through any member. It stops when this member takes the lead, and hands its socket over to
//! the coordinator's service: the port is never free for another socket to take meanwhile.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{ClusterSpec, Member};

/// How long connecting to the leader may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The forwarding listener; [`Forwarder::stop`] stops forwarding and hands the socket over
/// (connections in progress go on). Dropped, it closes the socket.
pub struct Forwarder {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Gives the socket back when it ends.
    thread: Option<std::thread::JoinHandle<TcpListener>>,
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
                .spawn(move || {
                    accept(&listener, &spec, &stop);
                    listener
                })?
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

    /// Stops forwarding and returns the listening socket, still bound: connections that
    /// arrive from now on wait in its queue for whoever accepts next (connections in progress
    /// go on). `None` if the accepting thread panicked, which closed it.
    pub fn stop(mut self) -> Option<TcpListener> {
        self.end()
    }

    fn end(&mut self) -> Option<TcpListener> {
        // Once only: the socket may have a new owner by the time this is dropped.
        let thread = self.thread.take()?;
        self.stop.store(true, Ordering::Release);
        // Wakes the accept, which closes what it accepts now (this connection, or a client's
        // that came just before it) and ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        thread.join().ok()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.end();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_forwarder_hands_over_its_socket_and_a_client_that_comes_meanwhile_waits() {
        let spec: ClusterSpec = "etcd://127.0.0.1:1/retina-test".parse().unwrap();
        let forwarder = Forwarder::start("127.0.0.1:0".parse().unwrap(), spec).unwrap();
        let addr = forwarder.addr();
        let listener = forwarder.stop().expect("the socket comes back");
        assert_eq!(listener.local_addr().unwrap(), addr);
        // Still bound and listening: nobody else takes the port, ...
        assert_eq!(
            TcpListener::bind(addr).unwrap_err().kind(),
            std::io::ErrorKind::AddrInUse
        );
        // ... and a client that connects before the next owner accepts is kept, not refused.
        let mut client = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).unwrap();
        client.write_all(b"bootstrap").unwrap();
        let listener = crate::rpc::serve_listener(listener).unwrap();
        listener.set_nonblocking(false).unwrap();
        let (mut served, _) = listener.accept().unwrap();
        let mut got = [0u8; 9];
        served.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"bootstrap");
    }
}
