//! A real etcd server for tests and benchmarks (Debian's `etcd-server`): one member on loopback ports below
//! the ephemeral range, with a temporary data directory. It can be stopped and started again on
//! the same ports and data (an outage), and is killed when dropped.

use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped) `etcd`.
pub struct Etcd {
    child: Option<Child>,
    pub client: SocketAddr,
    peer: SocketAddr,
    dir: tempfile::TempDir,
}

/// Whether `etcd` can be started. CI installs it (`.ci/run`), so there a missing one is a
/// failure, not a skip; elsewhere the test prints a note and passes.
pub fn etcd_available() -> bool {
    crate::server_available("etcd", "--version", "apt-get install etcd-server")
}

impl Etcd {
    /// Starts etcd and waits until it answers; `None` (after a note) where it is not installed
    /// outside CI.
    pub fn start() -> Option<Etcd> {
        if !etcd_available() {
            return None;
        }
        let ports = crate::ports::free_ports(2);
        let mut etcd = Etcd {
            child: None,
            client: SocketAddr::from(([127, 0, 0, 1], ports)),
            peer: SocketAddr::from(([127, 0, 0, 1], ports + 1)),
            dir: tempfile::tempdir().unwrap(),
        };
        etcd.resume();
        Some(etcd)
    }

    /// The data directory.
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts the stopped server again, on the same ports and data, and waits until it
    /// answers.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let client = format!("http://{}", self.client);
        let peer = format!("http://{}", self.peer);
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .arg("--data-dir")
            .arg(self.data())
            .args(["--name", "default"])
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting etcd");
        self.child = Some(child);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(30) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("etcd exited ({status}): {}", self.log());
            }
            if self.healthy() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("etcd did not answer in 30 s: {}", self.log());
    }

    /// Whether `/health` says the member is healthy.
    fn healthy(&self) -> bool {
        use std::io::{Read, Write};
        let Ok(mut s) = TcpStream::connect_timeout(&self.client, Duration::from_secs(1)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let asked = write!(
            s,
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            self.client
        );
        let mut out = String::new();
        asked.is_ok() && s.read_to_string(&mut out).is_ok() && out.contains("\"health\":\"true\"")
    }

    /// Kills the server (its data stays, for [`Self::resume`]).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `etcd://127.0.0.1:PORT/PREFIX`, for `--cluster`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.client)
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
    }
}
