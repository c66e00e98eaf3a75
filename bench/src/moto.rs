//! A real S3 server for tests and benchmarks: moto's (`moto_server`, from PyPI's
//! `moto[server]`), started on a free loopback port below the ephemeral range and killed when
//! dropped. Callers pass its settings to a node explicitly ([`Moto::env`]), never through their
//! own environment, which parallel tests share.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `moto_server`, killed on drop.
pub struct Moto {
    child: Child,
    pub addr: SocketAddr,
}

/// Whether `moto_server` can be started. CI installs it (`.ci/run`), so there a missing one is
/// a failure, not a skip; elsewhere the test prints a note and passes.
pub fn moto_available() -> bool {
    crate::server_available(
        "moto_server",
        "--help",
        "python3 -m pip install 'moto[server]'",
    )
}

impl Moto {
    /// Starts `moto_server` on a free loopback port and waits until it answers; `None` (after a
    /// note) where it is not installed outside CI.
    pub fn start() -> Option<Moto> {
        if !moto_available() {
            return None;
        }
        for _ in 0..5 {
            let port = crate::ports::free_port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let child = Command::new("moto_server")
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting moto_server");
            let mut moto = Moto { child, addr };
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(30) {
                if let Ok(Some(_)) = moto.child.try_wait() {
                    break; // the port was taken meanwhile: try another
                }
                if moto.request("GET", "/").is_ok() {
                    return Some(moto);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        panic!("moto_server did not start");
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// One plain HTTP/1.1 request without a body; the status code.
    fn request(&self, method: &str, path: &str) -> std::io::Result<u16> {
        let mut s = TcpStream::connect_timeout(&self.addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            self.addr
        )?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        out.split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no HTTP status in `{out}`")))
    }

    /// Creates bucket `name`.
    pub fn create_bucket(&self, name: &str) {
        let status = self.request("PUT", &format!("/{name}")).unwrap();
        assert_eq!(status, 200, "creating bucket {name}");
    }

    /// The S3 settings of this server, as `object_store` names them.
    pub fn options(&self) -> Vec<(String, String)> {
        [
            ("aws_endpoint", self.endpoint()),
            ("aws_allow_http", "true".into()),
            ("aws_access_key_id", "test".into()),
            ("aws_secret_access_key", "test".into()),
            ("aws_region", "us-east-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The environment variables that point a `retina` process at this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT", self.endpoint()),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_ACCESS_KEY_ID", "test".into()),
            ("AWS_SECRET_ACCESS_KEY", "test".into()),
            ("AWS_REGION", "us-east-1".into()),
        ]
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
