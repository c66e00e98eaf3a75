//! The dead-letter file: one JSON record per transaction that could not be replayed (with
//! `--on-error skip`), where it ends in the source, and recognising where a bad transaction
//! being skipped ends.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

/// A transaction that cannot be replayed, as its dead-letter record says.
pub(super) struct DeadLetter {
    pub(super) position: String,
    pub(super) transaction: Option<String>,
    pub(super) reason: String,
    pub(super) lines: Vec<String>,
    /// Bytes of `lines`; past `max_txn_bytes` lines are no longer kept.
    pub(super) bytes: u64,
    /// Lines were left out (the transaction was too large to keep whole).
    pub(super) truncated: bool,
}

impl DeadLetter {
    pub(super) fn push(&mut self, line: &str, max_bytes: u64) {
        self.bytes = self.bytes.saturating_add(line.len() as u64);
        if self.bytes <= max_bytes {
            self.lines.push(line.to_owned());
        } else {
            self.truncated = true;
        }
    }

    /// Appends the record, ending at byte `offset` of the source, to the file at `path` and
    /// syncs it.
    pub(super) fn append_to(&self, path: &Path, offset: u64) -> std::io::Result<()> {
        let json = serde_json::json!({
            "position": self.position,
            "offset": offset,
            "transaction": self.transaction,
            "reason": self.reason,
            "lines": self.lines,
            "lines_left_out": self.truncated,
        });
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| {
                writeln!(f, "{json}")?;
                f.sync_data()
            })
    }
}

/// Writes `record`, ending at source position `offset`, to the dead-letter file at `path` and
/// counts it (in `report` and the node's status), unless the run before a restart wrote it
/// (it is in `before`, and leaves it). `Err`: the file could not be written.
pub(super) fn write_once(
    record: &DeadLetter,
    offset: u64,
    path: &Path,
    before: &mut BTreeSet<u64>,
    node: &crate::node::NodeHandle,
    report: &mut super::msg::SinkReport,
) -> Result<(), String> {
    if before.remove(&offset) {
        // Written by the run before a restart; the transaction is skipped again.
        return Ok(());
    }
    record
        .append_to(path, offset)
        .map_err(|e| format!("dead-letter file {}: {e}", path.display()))?;
    report.dead_lettered += 1;
    node.status()
        .dead_lettered
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The dead-letter file as a restart finds it: where each record in `path` ends in the source,
/// for those past `from` (records of older versions, without an offset, are left alone).
pub(super) fn dead_letter_offsets(path: &Path, from: u64) -> Result<BTreeSet<u64>, String> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(format!("dead-letter file {}: {e}", path.display())),
    };
    let mut out = BTreeSet::new();
    for line in BufReader::new(file).lines() {
        let line = line.map_err(|e| format!("dead-letter file {}: {e}", path.display()))?;
        // A record torn by a crash is written again.
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if let Some(offset) = v.get("offset").and_then(serde_json::Value::as_u64)
            && offset > from
        {
            out.insert(offset);
        }
    }
    Ok(out)
}

/// The transaction marker `line` is, if any: `("BEGIN" | "END", id)`, bare or in an envelope.
pub(super) fn marker(line: &str) -> Option<(&'static str, String)> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let v = v.get("payload").filter(|p| p.is_object()).unwrap_or(&v);
    let status = match v.get("status")?.as_str()? {
        "BEGIN" => "BEGIN",
        "END" => "END",
        _ => return None,
    };
    let id = match v.get("id")? {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Number(n) => n.to_string(),
        _ => return None,
    };
    Some((status, id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_are_recognised() {
        let end = |id: &str| Some(("END", id.to_owned()));
        assert_eq!(
            marker(r#"{"status":"END","id":"7","event_count":1}"#),
            end("7")
        );
        assert_eq!(
            marker(r#"{"schema":{},"payload":{"status":"END","id":7}}"#),
            end("7")
        );
        assert_eq!(
            marker(r#"{"status":"BEGIN","id":"7"}"#),
            Some(("BEGIN", "7".into()))
        );
        assert_eq!(marker(r#"{"op":"c"}"#), None);
        assert_eq!(marker("not json"), None);
    }

    #[test]
    fn records_say_where_they_end_in_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead.jsonl");
        assert_eq!(dead_letter_offsets(&path, 0), Ok(BTreeSet::new()));
        let mut record = DeadLetter {
            position: "in.json:3".into(),
            transaction: Some("t1".into()),
            reason: "bad".into(),
            lines: vec![],
            bytes: 0,
            truncated: false,
        };
        record.push("line one", 10);
        record.push("line two", 10);
        assert_eq!((record.lines.len(), record.truncated), (1, true));
        record.append_to(&path, 40).unwrap();
        record.append_to(&path, 90).unwrap();
        // A torn record and one of an older version, without an offset, are left alone.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        writeln!(f, "{{\"position\":\"in.json:9\"}}\n{{\"torn").unwrap();
        assert_eq!(dead_letter_offsets(&path, 0), Ok(BTreeSet::from([40, 90])));
        assert_eq!(dead_letter_offsets(&path, 40), Ok(BTreeSet::from([90])));
        let text = std::fs::read_to_string(&path).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(
            first,
            serde_json::json!({
                "position": "in.json:3", "offset": 40, "transaction": "t1", "reason": "bad",
                "lines": ["line one"], "lines_left_out": true,
            })
        );
    }
}
