//! The source: where change events come from, opening it at the checkpoint's position, the
//! state the sink records with a checkpoint, and re-reading a span of it.

use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use super::kafka::KafkaSpec;
use super::postgres::PostgresSpec;

/// Where change events come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceSpec {
    File(PathBuf),
    Stdin,
    /// Debezium's topics on Kafka (`kafka://HOST:PORT,...?topic_prefix=PREFIX`).
    Kafka(KafkaSpec),
    /// A publication read through a logical replication slot
    /// (`postgres://USER@HOST:PORT/DB?publication=PUB&slot=SLOT`).
    Postgres(PostgresSpec),
}

impl FromStr for SourceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(rest) = s.strip_prefix("kafka://") {
            return KafkaSpec::parse(rest).map(SourceSpec::Kafka);
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return PostgresSpec::parse(s).map(SourceSpec::Postgres);
        }
        match s {
            "stdin" | "-" => Ok(SourceSpec::Stdin),
            _ => match s.strip_prefix("file:") {
                Some(p) if !p.is_empty() => Ok(SourceSpec::File(p.into())),
                _ => Err(format!(
                    "source `{s}`: expected `file:PATH`, `stdin`, \
                     `kafka://HOST:PORT[,...]?topic_prefix=PREFIX` or \
                     `postgres://USER@HOST:PORT/DB?publication=PUB&slot=SLOT`"
                )),
            },
        }
    }
}

/// The file's path, or `stdin`: how errors and the log name the source.
impl fmt::Display for SourceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SourceSpec::File(p) => write!(f, "{}", p.display()),
            SourceSpec::Stdin => f.write_str("stdin"),
            SourceSpec::Kafka(k) => k.fmt(f),
            SourceSpec::Postgres(p) => p.fmt(f),
        }
    }
}

/// A source opened at its resume position: its name, its reader, and its size then (files).
pub(super) type OpenedSource = (Arc<str>, Box<dyn Read + Send>, Option<u64>);

/// Opens `source` at byte `offset`: a file is read from that byte; stdin is read from its start
/// and that many bytes are skipped (it must be the same stream). Not for Kafka, which the
/// sink reads by partition.
pub(super) fn open(source: &SourceSpec, offset: u64) -> std::io::Result<OpenedSource> {
    match source {
        SourceSpec::Kafka(k) => Err(std::io::Error::other(format!("{k} is not a byte stream"))),
        SourceSpec::Postgres(p) => Err(std::io::Error::other(format!("{p} is not a byte stream"))),
        SourceSpec::Stdin => {
            let mut input = std::io::stdin();
            std::io::copy(&mut (&mut input).take(offset), &mut std::io::sink()).map(|skipped| {
                if skipped < offset {
                    tracing::warn!(
                        "stdin ended after {skipped} bytes, before the checkpoint's {offset}"
                    );
                }
                (
                    "stdin".into(),
                    Box::new(input) as Box<dyn Read + Send>,
                    None,
                )
            })
        }
        SourceSpec::File(p) => File::open(p).and_then(|mut f| {
            let size = f.metadata()?.len();
            f.seek(SeekFrom::Start(offset))?;
            Ok((
                p.display().to_string().into(),
                Box::new(f) as Box<dyn Read + Send>,
                Some(size),
            ))
        }),
    }
}

/// The lines of `path` between byte `begin` and byte `end`.
pub(super) fn read_span(path: &Path, begin: u64, end: u64) -> std::io::Result<Vec<String>> {
    let mut f = File::open(path)?;
    f.seek(SeekFrom::Start(begin))?;
    let mut bytes = Vec::new();
    f.take(end - begin).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// What the sink records with a checkpoint: the ids of the transactions applied last, so that
/// after a restart a redelivered one is recognised, whatever the source's position says.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct SourceState {
    /// Oldest first.
    pub(super) applied: Vec<String>,
    /// A Kafka source's partitions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) kafka: Option<KafkaState>,
    /// A Postgres source's position.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) postgres: Option<PostgresState>,
}

/// Where a Postgres source resumes: after the commit that ends at `lsn` (every transaction
/// committed before it is in the checkpoint), on `slot`.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct PostgresState {
    pub(super) slot: String,
    pub(super) lsn: u64,
}

/// Where a Kafka source resumes: each partition's (`topic/partition`) oldest offset still
/// needed, and the transactions handed over that have events at or after those offsets, with
/// where (a restart drops them).
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(super) struct KafkaState {
    pub(super) offsets: std::collections::BTreeMap<String, i64>,
    pub(super) handed: Vec<(String, Vec<(String, i64)>)>,
}

impl SourceState {
    pub(super) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("plain strings serialize")
    }

    /// The state in `bytes` (empty: none recorded).
    pub(super) fn decode(bytes: &[u8]) -> Result<Self, String> {
        if bytes.is_empty() {
            return Ok(SourceState::default());
        }
        serde_json::from_slice(bytes).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_parse() {
        assert_eq!("stdin".parse::<SourceSpec>(), Ok(SourceSpec::Stdin));
        assert_eq!(
            "file:/a/b.json".parse::<SourceSpec>(),
            Ok(SourceSpec::File("/a/b.json".into()))
        );
        assert!("kafka:x".parse::<SourceSpec>().is_err());
        assert!("file:".parse::<SourceSpec>().is_err());
        assert_eq!(
            SourceSpec::File("/a/b.json".into()).to_string(),
            "/a/b.json"
        );
        assert_eq!(SourceSpec::Stdin.to_string(), "stdin");
    }

    #[test]
    fn source_state_round_trips() {
        assert_eq!(SourceState::decode(b""), Ok(SourceState::default()));
        let state = SourceState {
            applied: vec!["571".into(), "t2".into()],
            kafka: None,
            postgres: None,
        };
        assert_eq!(SourceState::decode(&state.encode()), Ok(state));
        let state = SourceState {
            postgres: Some(PostgresState {
                slot: "s".into(),
                lsn: 22_228_232,
            }),
            ..Default::default()
        };
        assert_eq!(SourceState::decode(&state.encode()), Ok(state));
        assert!(SourceState::decode(b"{").is_err());
    }

    #[test]
    fn spans_are_read_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.json");
        std::fs::write(&path, "a\nbb\nccc\n").unwrap();
        assert_eq!(read_span(&path, 2, 9).unwrap(), ["bb", "ccc"]);
        assert_eq!(read_span(&path, 0, 2).unwrap(), ["a"]);
    }
}
