//! etcd's v3 API through its JSON gateway: `POST /v3/<service>/<method>` with the request as
//! JSON (keys and values base64, 64-bit integers as strings), over plain HTTP/1.1, one
//! connection per request. Every etcd since 3.3 serves it on its client URLs, so a node needs
//! no gRPC stack (nor `protoc` to build one).
//!
//! Requests go to the endpoint that answered last, and to the others in turn when it does not.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

/// How long connecting to one endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long one request may take once connected.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read (a listing of every node of a cluster is a few KiB).
const MAX_RESPONSE: u64 = 16 << 20;

/// The etcd members of one cluster.
pub struct Gateway {
    /// `HOST:PORT` of each member.
    endpoints: Vec<String>,
    /// The one that answered last.
    preferred: AtomicUsize,
}

/// A key and its value, as a range or a transaction returns them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kv {
    pub key: String,
    pub value: String,
    pub lease: i64,
}

impl Gateway {
    /// `endpoints`: `http://HOST:PORT` each.
    pub fn new(endpoints: &[String]) -> Self {
        Gateway {
            endpoints: endpoints
                .iter()
                .map(|e| e.strip_prefix("http://").unwrap_or(e).to_owned())
                .collect(),
            preferred: AtomicUsize::new(0),
        }
    }

    /// Calls `path` (`/v3/kv/range`, ...) with `body`; the answer, or why no endpoint gave one.
    pub fn call(&self, path: &str, body: &Value) -> Result<Value, String> {
        let body = body.to_string();
        let first = self.preferred.load(Ordering::Relaxed);
        let mut errors = Vec::new();
        for i in 0..self.endpoints.len() {
            let at = (first + i) % self.endpoints.len();
            let endpoint = &self.endpoints[at];
            match post(endpoint, path, &body) {
                Ok(v) => {
                    self.preferred.store(at, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) => errors.push(format!("{endpoint}: {e}")),
            }
        }
        Err(errors.join("; "))
    }

    /// The keys from `key` (with `prefix`: every key starting with it).
    pub fn range(&self, key: &str, prefix: bool) -> Result<Vec<Kv>, String> {
        let mut req = json!({ "key": b64(key) });
        if prefix {
            req["range_end"] = Value::String(STANDARD.encode(prefix_end(key.as_bytes())));
        }
        kvs(&self.call("/v3/kv/range", &req)?)
    }

    /// A transaction: `success` if every comparison holds, else `failure`. Whether they held,
    /// and the answers of the operations that ran.
    pub fn txn(
        &self,
        compare: Vec<Value>,
        success: Vec<Value>,
        failure: Vec<Value>,
    ) -> Result<(bool, Vec<Value>), String> {
        let got = self.call(
            "/v3/kv/txn",
            &json!({ "compare": compare, "success": success, "failure": failure }),
        )?;
        // Fields at their default value are left out: no `succeeded` is false.
        let succeeded = got["succeeded"].as_bool().unwrap_or(false);
        let responses = got["responses"].as_array().cloned().unwrap_or_default();
        Ok((succeeded, responses))
    }

    /// A new lease of `ttl` seconds: its id.
    pub fn grant(&self, ttl: i64) -> Result<i64, String> {
        let got = self.call("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))?;
        match int(&got["ID"]) {
            0 => Err(format!("no lease id in {got}")),
            id => Ok(id),
        }
    }

    /// Renews `lease`: the seconds it now has (0: it expired).
    pub fn keep_alive(&self, lease: i64) -> Result<i64, String> {
        let got = self.call("/v3/lease/keepalive", &json!({ "ID": lease.to_string() }))?;
        // An expired lease is answered with its id and no TTL; anything else is no answer.
        if int(&got["result"]["ID"]) != lease {
            return Err(format!("/v3/lease/keepalive: unexpected answer {got}"));
        }
        Ok(int(&got["result"]["TTL"]))
    }

    /// The seconds `lease` has left (negative: it expired), and the seconds it was granted.
    pub fn time_to_live(&self, lease: i64) -> Result<(i64, i64), String> {
        let got = self.call("/v3/lease/timetolive", &json!({ "ID": lease.to_string() }))?;
        Ok((int(&got["TTL"]), int(&got["grantedTTL"])))
    }

    /// Revokes `lease`, deleting every key under it.
    pub fn revoke(&self, lease: i64) -> Result<(), String> {
        self.call("/v3/lease/revoke", &json!({ "ID": lease.to_string() }))
            .map(drop)
    }
}

/// The key after every key starting with `prefix` (etcd's `range_end` for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

fn b64(s: &str) -> String {
    STANDARD.encode(s.as_bytes())
}

/// A 64-bit integer the gateway wrote as a string (or a number); 0 when left out.
fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

fn text(v: &Value, what: &str) -> Result<String, String> {
    let raw = match v.as_str() {
        Some(s) => STANDARD
            .decode(s)
            .map_err(|e| format!("{what} `{s}` is not base64: {e}"))?,
        None => Vec::new(),
    };
    String::from_utf8(raw).map_err(|e| {
        format!(
            "{what} `{}` is not UTF-8",
            String::from_utf8_lossy(e.as_bytes())
        )
    })
}

/// The key-values of a range answer.
pub fn kvs(range: &Value) -> Result<Vec<Kv>, String> {
    let Some(kvs) = range["kvs"].as_array() else {
        return Ok(Vec::new());
    };
    kvs.iter()
        .map(|kv| {
            let key = text(&kv["key"], "a key")?;
            Ok(Kv {
                value: text(&kv["value"], &format!("the value of {key}"))?,
                key,
                lease: int(&kv["lease"]),
            })
        })
        .collect()
}

/// The key-values of a transaction's operation answer that was a range.
pub fn range_response(op: &Value) -> Result<Vec<Kv>, String> {
    kvs(&op["response_range"])
}

/// Compares `key`'s create revision with `rev` (0: the key does not exist).
pub fn cmp_create(key: &str, rev: i64) -> Value {
    json!({ "target": "CREATE", "key": b64(key), "result": "EQUAL", "create_revision": rev.to_string() })
}

/// Compares `key`'s last modification revision with `rev` (0: the key does not exist).
pub fn cmp_mod(key: &str, rev: i64) -> Value {
    json!({ "target": "MOD", "key": b64(key), "result": "EQUAL", "mod_revision": rev.to_string() })
}

/// Compares `key`'s value with `value`.
pub fn cmp_value(key: &str, value: &str) -> Value {
    json!({ "target": "VALUE", "key": b64(key), "result": "EQUAL", "value": b64(value) })
}

/// Compares the lease `key` is under with `lease`.
pub fn cmp_lease(key: &str, lease: i64) -> Value {
    json!({ "target": "LEASE", "key": b64(key), "result": "EQUAL", "lease": lease.to_string() })
}

/// Puts `value` at `key`, under `lease` if any.
pub fn put(key: &str, value: &str, lease: Option<i64>) -> Value {
    let mut p = json!({ "key": b64(key), "value": b64(value) });
    if let Some(l) = lease {
        p["lease"] = Value::String(l.to_string());
    }
    json!({ "request_put": p })
}

/// Reads `key`.
pub fn range(key: &str) -> Value {
    json!({ "request_range": { "key": b64(key) } })
}

/// Reads every key starting with `prefix`.
pub fn range_prefix(prefix: &str) -> Value {
    json!({ "request_range": {
        "key": b64(prefix),
        "range_end": STANDARD.encode(prefix_end(prefix.as_bytes())),
    } })
}

/// The revision a key was last modified at, from a range answer's raw JSON.
pub fn mod_revision(range: &Value) -> i64 {
    range["kvs"]
        .as_array()
        .and_then(|k| k.first())
        .map_or(0, |kv| int(&kv["mod_revision"]))
}

/// One request on a connection of its own: the JSON answer of a 200, else an error with
/// etcd's message.
fn post(endpoint: &str, path: &str, body: &str) -> Result<Value, String> {
    let addrs = endpoint
        .to_socket_addrs()
        .map_err(|e| format!("resolving: {e}"))?;
    let mut stream = None;
    let mut last = String::from("no address");
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = e.to_string(),
        }
    }
    let mut s = stream.ok_or(last)?;
    let io = |e: std::io::Error| e.to_string();
    s.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(REQUEST_TIMEOUT)).map_err(io)?;
    let _ = s.set_nodelay(true);
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {endpoint}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(io)?;
    let mut raw = Vec::new();
    s.take(MAX_RESPONSE).read_to_end(&mut raw).map_err(io)?;
    let (status, body) = parse_response(&raw)?;
    let answer: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("{path}: HTTP {status}, not JSON ({e})"))?;
    if status != 200 {
        // Unary calls answer `{"error": "...", "message": "..."}`, streaming ones
        // `{"error": {"message": "..."}}`.
        let says = answer["message"]
            .as_str()
            .or(answer["error"]["message"].as_str())
            .or(answer["error"].as_str())
            .unwrap_or("no message");
        return Err(format!("{path}: HTTP {status}: {says}"));
    }
    Ok(answer)
}

/// The status and body of an HTTP/1.1 response read to its end (`Content-Length`, chunked,
/// or until the connection closed).
fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer has no end of headers")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| "the headers are not UTF-8")?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no HTTP status in `{head}`"))?;
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    };
    let body = &raw[split + 4..];
    let body = if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        dechunk(body)?
    } else if let Some(n) = header("content-length").and_then(|n| n.parse::<usize>().ok()) {
        body.get(..n).ok_or("the answer ended early")?.to_vec()
    } else {
        body.to_vec()
    };
    Ok((status, body))
}

/// The body of a chunked response.
fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk has no size line")?;
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|l| usize::from_str_radix(l.split(';').next()?.trim(), 16).ok())
            .ok_or("a chunk size is not hexadecimal")?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(body.get(..size).ok_or("a chunk ended early")?);
        body = body.get(size + 2..).ok_or("a chunk ended early")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_after_every_key_starting_with_it() {
        assert_eq!(prefix_end(b"p/nodes/"), b"p/nodes0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    #[test]
    fn reads_plain_and_chunked_answers() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(parse_response(plain).unwrap(), (200, b"{}".to_vec()));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                        4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(
            parse_response(chunked).unwrap(),
            (200, b"{\"a\":1}".to_vec())
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\n").is_err());
        let short = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\nab";
        assert!(parse_response(short).is_err());
    }

    #[test]
    fn reads_key_values_with_defaults_left_out() {
        let v: Value = serde_json::from_str(
            r#"{"kvs":[{"key":"YQ==","value":"Yg==","lease":"7","mod_revision":"3"},{"key":"Yw=="}],"count":"2"}"#,
        )
        .unwrap();
        assert_eq!(
            kvs(&v).unwrap(),
            [
                Kv {
                    key: "a".into(),
                    value: "b".into(),
                    lease: 7
                },
                Kv {
                    key: "c".into(),
                    value: String::new(),
                    lease: 0
                }
            ]
        );
        assert_eq!(mod_revision(&v), 3);
        assert_eq!(kvs(&json!({})).unwrap(), []);
    }
}
