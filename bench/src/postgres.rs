//! A PostgreSQL server on loopback for tests and benchmarks: Debian's `postgresql` package
//! (`apt-get install postgresql`), a fresh cluster in a temporary folder with
//! `wal_level = logical`, driven with `psql`. Stopped (immediately) and removed when dropped.
//! As root the server runs as the `postgres` user, which the package creates.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    pub port: u16,
    as_root: bool,
}

/// The newest installed server's `bin` folder (`/usr/lib/postgresql/N/bin`), if any.
pub fn postgres_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, b)| b)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

impl PgServer {
    /// Initialises a cluster in a new temporary folder and starts it on a free port.
    /// `settings`: more `-c name=value` server settings.
    pub fn start(settings: &[&str]) -> Result<PgServer, String> {
        Self::start_with(settings, false)
    }

    /// [`PgServer::start`] with TLS on (`ssl = on`), with a self-signed certificate for
    /// `localhost` made by `openssl`.
    pub fn start_tls(settings: &[&str]) -> Result<PgServer, String> {
        Self::start_with(settings, true)
    }

    fn start_with(settings: &[&str], tls: bool) -> Result<PgServer, String> {
        let bin = postgres_bin().ok_or(
            "no PostgreSQL server: install one with `apt-get install postgresql` (Debian)",
        )?;
        // Below the ephemeral range: the port is free again when the server restarts.
        let port = crate::ports::free_port();
        let dir = std::env::temp_dir().join(format!("retina-pg-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let server = PgServer {
            bin,
            dir,
            port,
            as_root: is_root(),
        };
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c wal_level=logical \
             -c max_wal_senders=16 -c max_replication_slots=16",
            server.dir.display()
        );
        if tls {
            let (cert, key) = (server.dir.join("server.crt"), server.dir.join("server.key"));
            server.run(
                "openssl",
                &[
                    "req",
                    "-x509",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=localhost",
                    "-keyout",
                    &key.display().to_string(),
                    "-out",
                    &cert.display().to_string(),
                ],
                false,
            )?;
            server.run("chmod", &["600", &key.display().to_string()], false)?;
            options += &format!(
                " -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                cert.display(),
                key.display()
            );
        }
        if server.as_root {
            server.run(
                "chown",
                &["-R", "postgres", &server.dir.display().to_string()],
                false,
            )?;
        }
        let data = server.dir.join("data").display().to_string();
        server.run(
            &server.bin.join("initdb").display().to_string(),
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            true,
        )?;
        for s in settings {
            options += &format!(" -c {s}");
        }
        server.run(
            &server.bin.join("pg_ctl").display().to_string(),
            &[
                "-D",
                &data,
                "-l",
                &server.dir.join("server.log").display().to_string(),
                "-o",
                &options,
                "-w",
                "start",
            ],
            true,
        )?;
        Ok(server)
    }

    /// For tests: a server, or `None` (with a note) where none is installed; CI installs one
    /// (`.ci/run`), so there a missing server is a failure, not a skip.
    pub fn for_test() -> Option<PgServer> {
        Self::for_test_with(&[])
    }

    /// [`PgServer::for_test`] with more server settings.
    pub fn for_test_with(settings: &[&str]) -> Option<PgServer> {
        if postgres_bin().is_none() && std::env::var_os("CI").is_none() {
            eprintln!("skipped: no PostgreSQL server (apt-get install postgresql)");
            return None;
        }
        let all: Vec<&str> = ["fsync=off"].iter().chain(settings).copied().collect();
        Some(PgServer::start(&all).expect("a PostgreSQL server on loopback"))
    }

    fn run(&self, program: &str, args: &[&str], as_postgres: bool) -> Result<String, String> {
        let mut cmd = if as_postgres && self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", program]);
            c
        } else {
            Command::new(program)
        };
        let out = cmd
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "{program} {}: {}\n{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `psql` on database `db` with `args` and `sql` on its input; stops at the first error.
    fn psql_with(&self, db: &str, args: &[&str], sql: &str) -> Result<String, String> {
        let mut child = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args(["-d", db, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"])
            .args(args)
            // Neither a server that does not answer nor a statement that waits (on a lock, say)
            // holds a test up for long.
            .env("PGCONNECT_TIMEOUT", "30")
            .env("PGOPTIONS", "-c statement_timeout=300s")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("psql: {e}"))?;
        let mut input = child.stdin.take().expect("piped");
        let sql = sql.to_owned();
        let writer = std::thread::spawn(move || {
            let _ = input.write_all(sql.as_bytes());
        });
        let out = child.wait_with_output().map_err(|e| format!("psql: {e}"))?;
        let _ = writer.join();
        if !out.status.success() {
            return Err(format!(
                "psql: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `sql` (any number of statements) on database `db`; its output, one row per line,
    /// values separated by `|`.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        self.psql_with(db, &[], sql)
    }

    /// Rows of one query on `db` as CSV-free text: each row's values joined by `\x1f`.
    pub fn rows(&self, db: &str, query: &str) -> Result<Vec<Vec<String>>, String> {
        let out = self.psql_with(db, &["-F", "\x1f"], query)?;
        Ok(out
            .lines()
            .map(|l| l.split('\x1f').map(str::to_owned).collect())
            .collect())
    }

    /// Restarts the server (a fast shutdown: sessions are ended, as in a failover).
    pub fn restart(&self) -> Result<(), String> {
        let data = self.dir.join("data").display().to_string();
        let pg_ctl = self.bin.join("pg_ctl").display().to_string();
        // With its log file, as at the start: the server must not hold this process's pipes.
        let log = self.dir.join("server.log").display().to_string();
        self.run(
            &pg_ctl,
            &["-D", &data, "-l", &log, "-m", "fast", "-w", "restart"],
            true,
        )
        .map(|_| ())
    }

    /// The server's `bin` folder (`pgbench`, `psql`).
    pub fn bin(&self) -> &Path {
        &self.bin
    }

    /// A `postgres://` source URL for `db`, `publication` and `slot`.
    pub fn source_url(&self, db: &str, publication: &str, slot: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?publication={publication}&slot={slot}",
            self.port
        )
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let data = self.dir.join("data").display().to_string();
        let pg_ctl = self.bin.join("pg_ctl").display().to_string();
        let _ = self.run(
            &pg_ctl,
            &["-D", &data, "-m", "immediate", "-w", "stop"],
            true,
        );
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
