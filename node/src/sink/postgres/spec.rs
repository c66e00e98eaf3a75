//! `postgres://USER[:PASSWORD]@HOST[:PORT]/DB?publication=PUB&slot=SLOT[&sslmode=...]`: which
//! server, which publication, which replication slot. The password comes from the URL, else
//! `PGPASSWORD`, else the password file (`PGPASSFILE`, default `~/.pgpass`), as libpq does.

use std::fmt;
use std::path::{Path, PathBuf};

/// How the connection uses TLS (`sslmode=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP (the default).
    #[default]
    Disable,
    /// TLS without checking the server's certificate.
    Require,
    /// TLS, the certificate signed by a trusted CA (`sslrootcert=` or the web roots).
    VerifyCa,
    /// As `VerifyCa`, and the certificate names the host.
    VerifyFull,
}

/// A PostgreSQL source: a publication read through a pgoutput replication slot.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresSpec {
    pub user: String,
    /// From the URL; otherwise [`PostgresSpec::password`] looks further.
    pub url_password: Option<String>,
    pub host: String,
    pub port: u16,
    pub database: String,
    pub publication: String,
    pub slot: String,
    pub ssl: SslMode,
    /// CA certificates (PEM) for `verify-ca`/`verify-full`.
    pub ssl_root_cert: Option<PathBuf>,
}

/// The URL without its password.
impl fmt::Display for PostgresSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "postgres://{}@{}:{}/{}?publication={}&slot={}",
            self.user, self.host, self.port, self.database, self.publication, self.slot
        )
    }
}

/// Never prints the password.
impl fmt::Debug for PostgresSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Percent-decodes a URL part (`%40` is `@`).
fn decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("`{s}` has a bad %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("`{s}` is not UTF-8 once decoded"))
}

/// A slot name as Postgres accepts one: lower-case letters, digits and `_`, at most 63.
fn valid_slot(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl PostgresSpec {
    /// Parses a whole `postgres://` (or `postgresql://`) URL.
    pub fn parse(url: &str) -> Result<PostgresSpec, String> {
        let err = |why: String| format!("source `{}`: {why}", redact(url));
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| err("expected postgres://...".into()))?;
        let (authority_path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, database) = authority_path
            .split_once('/')
            .ok_or_else(|| err("no database (postgres://USER@HOST:PORT/DB?...)".into()))?;
        let (userinfo, hostport) = authority
            .rsplit_once('@')
            .ok_or_else(|| err("no user (postgres://USER@HOST:PORT/DB?...)".into()))?;
        let (user, url_password) = match userinfo.split_once(':') {
            Some((u, p)) => (decode(u).map_err(err)?, Some(decode(p).map_err(err)?)),
            None => (decode(userinfo).map_err(err)?, None),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => (
                h.trim_start_matches('[').trim_end_matches(']').to_owned(),
                p.parse::<u16>()
                    .map_err(|_| err(format!("port `{p}` is not a number")))?,
            ),
            _ => (hostport.to_owned(), 5432),
        };
        if user.is_empty() || host.is_empty() || database.is_empty() {
            return Err(err("user, host and database must not be empty".into()));
        }
        let (mut publication, mut slot, mut ssl, mut root) = (None, None, SslMode::Disable, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair
                .split_once('=')
                .ok_or_else(|| err(format!("`{pair}` is not KEY=VALUE")))?;
            let v = decode(v).map_err(err)?;
            match k {
                "publication" if !v.is_empty() => publication = Some(v),
                "slot" if valid_slot(&v) => slot = Some(v),
                "slot" => {
                    return Err(err(format!(
                        "slot `{v}`: a slot name is 1 to 63 lower-case letters, digits or `_`"
                    )));
                }
                "sslmode" => {
                    ssl = match v.as_str() {
                        "disable" => SslMode::Disable,
                        "require" => SslMode::Require,
                        "verify-ca" => SslMode::VerifyCa,
                        "verify-full" => SslMode::VerifyFull,
                        other => {
                            return Err(err(format!(
                                "sslmode `{other}` (expected disable, require, verify-ca or \
                                 verify-full)"
                            )));
                        }
                    }
                }
                "sslrootcert" if !v.is_empty() => root = Some(PathBuf::from(v)),
                _ => {
                    return Err(err(format!(
                        "unknown or empty parameter `{k}` (expected publication, slot, sslmode, \
                         sslrootcert)"
                    )));
                }
            }
        }
        Ok(PostgresSpec {
            user,
            url_password,
            host,
            port,
            database: decode(database).map_err(err)?,
            publication: publication.ok_or_else(|| err("no publication=".into()))?,
            slot: slot.ok_or_else(|| err("no slot=".into()))?,
            ssl,
            ssl_root_cert: root,
        })
    }

    /// The password: the URL's, else `PGPASSWORD`, else the password file's line for this
    /// host, port, database and user, else none (trust or peer authentication).
    pub fn password(&self) -> Result<String, String> {
        if let Some(p) = &self.url_password {
            return Ok(p.clone());
        }
        if let Ok(p) = std::env::var("PGPASSWORD") {
            return Ok(p);
        }
        let file = match std::env::var_os("PGPASSFILE") {
            Some(f) => PathBuf::from(f),
            None => match std::env::var_os("HOME") {
                Some(home) => Path::new(&home).join(".pgpass"),
                None => return Ok(String::new()),
            },
        };
        match std::fs::read_to_string(&file) {
            Ok(text) => Ok(
                pgpass_lookup(&text, &self.host, self.port, &self.database, &self.user)
                    .unwrap_or_default(),
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(format!("password file {}: {e}", file.display())),
        }
    }

    /// The replication client's settings (the slot need not exist yet).
    pub(crate) fn config(&self) -> Result<pgwire_replication::ReplicationConfig, String> {
        use pgwire_replication::{ReplicationConfig, TlsConfig};
        let tls = match self.ssl {
            SslMode::Disable => TlsConfig::disabled(),
            SslMode::Require => TlsConfig::require(),
            SslMode::VerifyCa => TlsConfig::verify_ca(self.ssl_root_cert.clone()),
            SslMode::VerifyFull => TlsConfig::verify_full(self.ssl_root_cert.clone()),
        };
        Ok(ReplicationConfig::new(
            self.host.clone(),
            self.user.clone(),
            self.password()?,
            self.database.clone(),
            self.slot.clone(),
            self.publication.clone(),
        )
        .with_port(self.port)
        .with_tls(tls)
        // Values are read as text: pin the settings their text depends on.
        .with_options(
            "-c DateStyle=ISO -c TimeZone=UTC -c extra_float_digits=3 -c IntervalStyle=postgres",
        )
        .with_application_name("retina"))
    }
}

/// `url` with its password replaced by `***`.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{}", &rest[userinfo.len() + 1..])
        }
        _ => url.to_owned(),
    }
}

/// The password of the first line of a `.pgpass` text that matches (`*` matches anything;
/// `\:` and `\\` are escapes).
fn pgpass_lookup(text: &str, host: &str, port: u16, db: &str, user: &str) -> Option<String> {
    let port = port.to_string();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut fields = Vec::with_capacity(5);
        let mut field = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => field.extend(chars.next()),
                ':' if fields.len() < 4 => fields.push(std::mem::take(&mut field)),
                c => field.push(c),
            }
        }
        fields.push(field);
        if fields.len() != 5 {
            continue;
        }
        let matches = |pattern: &str, value: &str| pattern == "*" || pattern == value;
        let host_matches = matches(&fields[0], host)
            || (fields[0] == "localhost" && (host == "127.0.0.1" || host == "::1"));
        if host_matches
            && matches(&fields[1], &port)
            && matches(&fields[2], db)
            && matches(&fields[3], user)
        {
            return Some(fields.pop().expect("five fields"));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse() {
        let s = PostgresSpec::parse(
            "postgres://rep:p%40ss@127.0.0.1:5433/shop?publication=all_tables&slot=retina_1",
        )
        .unwrap();
        assert_eq!(
            (
                s.user.as_str(),
                s.url_password.as_deref(),
                s.host.as_str(),
                s.port
            ),
            ("rep", Some("p@ss"), "127.0.0.1", 5433)
        );
        assert_eq!(
            (s.database.as_str(), s.publication.as_str(), s.slot.as_str()),
            ("shop", "all_tables", "retina_1")
        );
        assert_eq!(s.ssl, SslMode::Disable);
        // The password never shows.
        assert_eq!(
            s.to_string(),
            "postgres://rep@127.0.0.1:5433/shop?publication=all_tables&slot=retina_1"
        );
        let s = PostgresSpec::parse(
            "postgresql://u@db.example/x?slot=s&publication=p&sslmode=verify-full&sslrootcert=/ca.pem",
        )
        .unwrap();
        assert_eq!((s.port, s.ssl), (5432, SslMode::VerifyFull));
        assert_eq!(s.ssl_root_cert, Some(PathBuf::from("/ca.pem")));
        for (bad, says) in [
            ("postgres://u@h/db?slot=s", "no publication"),
            ("postgres://u@h/db?publication=p", "no slot"),
            (
                "postgres://u@h/db?publication=p&slot=Bad-Name",
                "slot `Bad-Name`",
            ),
            ("postgres://u@h:x/db?publication=p&slot=s", "port `x`"),
            ("postgres://h/db?publication=p&slot=s", "no user"),
            ("postgres://u@h?publication=p&slot=s", "no database"),
            (
                "postgres://u@h/db?publication=p&slot=s&sslmode=prefer",
                "sslmode `prefer`",
            ),
            (
                "postgres://u@h/db?publication=p&slot=s&x=1",
                "unknown or empty parameter `x`",
            ),
            ("postgres://u:secret@h/db?slot=s", "u:***@h/db"),
        ] {
            let e = PostgresSpec::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
            assert!(!e.contains("secret"), "{e}");
        }
    }

    #[test]
    fn password_files_are_read_as_libpq_does() {
        let text = "# comment\n\
                    other:*:*:*:no\n\
                    localhost:5433:shop:rep:first\n\
                    *:*:*:rep:pa\\:ss\\\\\n";
        assert_eq!(
            pgpass_lookup(text, "127.0.0.1", 5433, "shop", "rep").as_deref(),
            Some("first")
        );
        assert_eq!(
            pgpass_lookup(text, "db", 5432, "x", "rep").as_deref(),
            Some("pa:ss\\")
        );
        assert_eq!(pgpass_lookup(text, "db", 5432, "x", "other"), None);
    }
}
