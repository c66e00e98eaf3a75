//! Decode lanes: the file and stdin sources are read on a thread of their own and their lines
//! parsed on several threads at once, while the sink takes the results in source order.
//!
//! The reader cuts what it reads into chunks of whole lines and deals them out to the lanes in
//! turn; each lane parses every line of a chunk ([`super::parse_line`], a pure function of the
//! line, its position and the catalog) and hands the chunk on; the sink takes chunks from the
//! lanes in the same turn, so it sees every line, in order, with its parse already done. A bad
//! line is an error naming its file and line whichever lane parsed it, since the reader numbers
//! the lines. Memory is bounded: each lane holds at most [`LANE_QUEUE`] chunks waiting and as
//! many done, and a chunk is at most [`CHUNK_BYTES`] (or one line).
//!
//! Chunk buffers go round: the sink gives each chunk's bytes back ([`Lanes::give_back`]) and the
//! reader reads into them again, so replay touches the same memory over and over instead of
//! fresh pages (a page's first touch costs a fault and its zeroing).
//!
//! A line still being written (no newline yet at the end of a followed file) stays with the
//! reader until it is whole; at the end of a file read once, the last line counts without one.

use std::io::Read;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use flume::{Receiver, RecvTimeoutError, Sender};

use crate::debezium::{DebeziumError, Message, SourcePosition};

/// A chunk holds at most this many bytes (a longer line is a chunk of its own).
pub(super) const CHUNK_BYTES: usize = 1 << 20;
/// Chunks a lane holds waiting, and done, before the reader (or the lane) waits.
const LANE_QUEUE: usize = 2;

/// One line's parse.
pub(super) enum Parsed {
    Message(Result<Message, DebeziumError>),
    /// Not UTF-8 (a line is decoded only once whole).
    NotUtf8(std::str::Utf8Error),
}

/// One line of a chunk.
pub(super) struct Line {
    /// The line's bytes in the chunk, its newline included.
    pub(super) bytes: Range<usize>,
    /// The line without its line ending (empty where it is not UTF-8).
    pub(super) text: Range<usize>,
    pub(super) parsed: Parsed,
}

/// What the sink takes from the lanes, in source order.
pub(super) enum Decoded {
    /// Whole lines, parsed.
    Lines(Chunk),
    /// The reader has read everything there is for now; a followed source is looked at again.
    Idle,
    /// The source ended (not followed), or failed to read: the message.
    End(Option<String>),
}

/// Lines read together, and their parses.
pub(super) struct Chunk {
    bytes: ChunkBytes,
    lines: Vec<Line>,
}

/// A chunk's bytes: text when every line of it is UTF-8 (checked once, by the lane).
pub(super) enum ChunkBytes {
    Text(String),
    Bytes(Vec<u8>),
}

impl ChunkBytes {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            ChunkBytes::Text(s) => s.as_bytes(),
            ChunkBytes::Bytes(b) => b,
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            ChunkBytes::Text(s) => s.into_bytes(),
            ChunkBytes::Bytes(b) => b,
        }
    }
}

impl Chunk {
    /// Its bytes, and its lines (whose ranges index those bytes).
    pub(super) fn into_parts(self) -> (ChunkBytes, Vec<Line>) {
        (self.bytes, self.lines)
    }
}

impl Line {
    /// The line's text (without its line ending) in its chunk's `bytes`.
    pub(super) fn text<'a>(&self, bytes: &'a ChunkBytes) -> LineText<'a> {
        LineText {
            bytes,
            range: self.text.clone(),
        }
    }
}

/// A line's text, read only where it is asked for: the sink mostly needs a line's parse and
/// length, and its bytes, which a lane parsed on another core, would cost it a cache miss each.
pub(super) struct LineText<'a> {
    bytes: &'a ChunkBytes,
    range: Range<usize>,
}

impl<'a> LineText<'a> {
    /// Its length in bytes.
    pub(super) fn len(&self) -> usize {
        self.range.len()
    }

    /// The text (empty for a line that is not UTF-8).
    pub(super) fn get(&self) -> &'a str {
        match self.bytes {
            // Line ends are ASCII, so a line's range lies on character boundaries.
            ChunkBytes::Text(s) => &s[self.range.clone()],
            ChunkBytes::Bytes(b) => std::str::from_utf8(&b[self.range.clone()]).unwrap_or(""),
        }
    }
}

/// Parses one line at its position.
pub(super) type Parse =
    Arc<dyn Fn(&str, &SourcePosition) -> Result<Message, DebeziumError> + Send + Sync>;

/// What the reader deals out: `count` whole lines (the last may lack its newline at the end of
/// a file), numbered after `first_line`, or an event.
enum Work {
    Lines {
        bytes: Vec<u8>,
        first_line: u64,
        count: usize,
    },
    Idle,
    End(Option<String>),
}

/// The lanes, from the sink's side: [`Lanes::next`] gives what comes next in the source.
pub(super) struct Lanes {
    outputs: Vec<Receiver<Decoded>>,
    turn: usize,
    /// Chunk buffers for the reader to read into again.
    spare: Sender<Vec<u8>>,
}

impl Lanes {
    /// Starts the reader on `input` (the source named `name`, its lines numbered after
    /// `lines_before`), cutting chunks of at most `chunk_bytes`, and `lanes` threads that
    /// parse each line with `parse`.
    pub(super) fn start(
        parse: Parse,
        name: Arc<str>,
        input: Box<dyn Read + Send>,
        lines_before: u64,
        follow: bool,
        lanes: usize,
        chunk_bytes: usize,
    ) -> Lanes {
        let lanes = lanes.max(1);
        // Enough for every chunk that can be in flight: queued at and done by each lane, one
        // with the sink, one being read.
        let (spare, spares) = flume::bounded(2 * LANE_QUEUE * lanes + 2);
        let mut inputs = Vec::with_capacity(lanes);
        let mut outputs = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let (work_tx, work_rx) = flume::bounded::<Work>(LANE_QUEUE);
            let (done_tx, done_rx) = flume::bounded::<Decoded>(LANE_QUEUE);
            let parse = parse.clone();
            let name = name.clone();
            std::thread::Builder::new()
                .name(format!("retina-decode-{lane}"))
                .spawn(move || decode(&*parse, &name, &work_rx, &done_tx))
                .expect("spawning a decode lane");
            inputs.push(work_tx);
            outputs.push(done_rx);
        }
        std::thread::Builder::new()
            .name("retina-source".into())
            .spawn(move || {
                let chunk_bytes = chunk_bytes.max(1);
                let buffer = || {
                    spares.try_recv().map_or_else(
                        |_| Vec::with_capacity(chunk_bytes),
                        |mut b: Vec<u8>| {
                            b.clear();
                            b
                        },
                    )
                };
                read(input, lines_before, follow, chunk_bytes, &inputs, buffer)
            })
            .expect("spawning the source reader");
        Lanes {
            outputs,
            turn: 0,
            spare,
        }
    }

    /// Hands a chunk's bytes back, once its lines are done with, for the reader to read into.
    pub(super) fn give_back(&self, bytes: ChunkBytes) {
        let _ = self.spare.try_send(bytes.into_vec());
    }

    /// What comes next, waiting at most `wait` (`None`: nothing yet). After [`Decoded::End`]
    /// nothing comes.
    pub(super) fn next(&mut self, wait: Duration) -> Option<Decoded> {
        let lane = &self.outputs[self.turn];
        let decoded = if wait.is_zero() {
            lane.try_recv().ok()?
        } else {
            match lane.recv_timeout(wait) {
                Ok(d) => d,
                Err(RecvTimeoutError::Timeout) => return None,
                // A lane ends only after passing the end on, or when a thread panicked.
                Err(RecvTimeoutError::Disconnected) => {
                    Decoded::End(Some("a decode lane stopped unexpectedly".into()))
                }
            }
        };
        self.turn = (self.turn + 1) % self.outputs.len();
        Some(decoded)
    }
}

/// A lane: parses each chunk's lines, passes events on.
fn decode(
    parse: &(dyn Fn(&str, &SourcePosition) -> Result<Message, DebeziumError> + Send + Sync),
    name: &Arc<str>,
    work: &Receiver<Work>,
    done: &Sender<Decoded>,
) {
    for w in work.iter() {
        // A name of the chunk's own: its lines' positions count references to it, and sharing
        // one among the lanes and the sink would bounce its count between their cores.
        let name: Arc<str> = Arc::from(&**name);
        let decoded = match w {
            Work::Idle => Decoded::Idle,
            Work::End(e) => Decoded::End(e),
            Work::Lines {
                bytes,
                first_line,
                count,
            } => {
                // One check of the whole chunk; line by line only where it fails.
                let bytes = match String::from_utf8(bytes) {
                    Ok(text) => ChunkBytes::Text(text),
                    Err(e) => ChunkBytes::Bytes(e.into_bytes()),
                };
                let all = bytes.bytes();
                let mut lines = Vec::with_capacity(count);
                let mut start = 0;
                let mut number = first_line;
                while start < all.len() {
                    let end =
                        memchr::memchr(b'\n', &all[start..]).map_or(all.len(), |i| start + i + 1);
                    number += 1;
                    let raw = &all[start..end];
                    let checked = match &bytes {
                        ChunkBytes::Text(s) => Ok(&s[start..end]),
                        ChunkBytes::Bytes(_) => std::str::from_utf8(raw),
                    };
                    let (text, parsed) = match checked {
                        Ok(s) => {
                            let trimmed = s.trim_end_matches(['\n', '\r']);
                            let pos = SourcePosition::new(name.clone(), number);
                            (
                                start..start + trimmed.len(),
                                Parsed::Message(parse(trimmed, &pos)),
                            )
                        }
                        Err(e) => (start..start, Parsed::NotUtf8(e)),
                    };
                    lines.push(Line {
                        bytes: start..end,
                        text,
                        parsed,
                    });
                    start = end;
                }
                Decoded::Lines(Chunk { bytes, lines })
            }
        };
        if done.send(decoded).is_err() {
            return;
        }
    }
}

/// The reader: reads the source, deals whole lines out to the lanes in turn, at most
/// `chunk_bytes` of them at a time (a longer line alone).
fn read(
    mut input: Box<dyn Read + Send>,
    lines_before: u64,
    follow: bool,
    chunk_bytes: usize,
    lanes: &[Sender<Work>],
    mut buffer: impl FnMut() -> Vec<u8>,
) {
    let mut turn = 0;
    let mut deal = |w: Work| -> bool {
        let ok = lanes[turn].send(w).is_ok();
        turn = (turn + 1) % lanes.len();
        ok
    };
    let mut line = lines_before;
    // Bytes read and not yet dealt: at most a partial line between reads.
    let mut pending = buffer();
    let mut idle = false;
    loop {
        // Read up to a chunk's worth past what is pending (more only for a line that long).
        let len = pending.len();
        let want = if len < chunk_bytes {
            chunk_bytes - len
        } else {
            chunk_bytes.max(len)
        };
        pending.resize(len + want, 0);
        let n = match input.read(&mut pending[len..]) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
            Err(e) => {
                deal(Work::End(Some(format!("reading the source: {e}"))));
                return;
            }
        };
        pending.truncate(len + n);
        if n == 0 {
            if !follow {
                // The last line counts without a newline.
                if !pending.is_empty() {
                    let bytes = std::mem::take(&mut pending);
                    let count = memchr::memchr_iter(b'\n', &bytes).count() + 1;
                    if !deal(Work::Lines {
                        bytes,
                        first_line: line,
                        count,
                    }) {
                        return;
                    }
                }
                deal(Work::End(None));
                return;
            }
            if !idle {
                idle = true;
                if !deal(Work::Idle) {
                    return;
                }
            }
            // Whether the sink is still there: a lane's input closes when it is gone.
            if lanes.iter().all(Sender::is_disconnected) {
                return;
            }
            std::thread::sleep(super::actor::FOLLOW_POLL);
            continue;
        }
        idle = false;
        // Deal what ends with a newline; keep the partial line after it.
        let Some(last) = memchr::memrchr(b'\n', &pending[len..]) else {
            continue;
        };
        let mut rest = buffer();
        rest.extend_from_slice(&pending[len + last + 1..]);
        pending.truncate(len + last + 1);
        let whole = std::mem::replace(&mut pending, rest);
        let count = memchr::memchr_iter(b'\n', &whole).count();
        let first_line = line;
        line += count as u64;
        if !deal(Work::Lines {
            bytes: whole,
            first_line,
            count,
        }) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;

    /// Hands out the pieces it was given one `read` at a time, then nothing (end of input).
    struct Pieces(VecDeque<Vec<u8>>);

    impl Read for Pieces {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let Some(mut piece) = self.0.pop_front() else {
                return Ok(0);
            };
            let n = piece.len().min(buf.len());
            buf[..n].copy_from_slice(&piece[..n]);
            if n < piece.len() {
                self.0.push_front(piece.split_off(n));
            }
            Ok(n)
        }
    }

    /// A "parse" that keeps the line's text and position, so order and numbering show.
    fn echo() -> Parse {
        Arc::new(|line: &str, pos: &SourcePosition| {
            if line == "bad" {
                return Err(DebeziumError::Malformed {
                    pos: pos.clone(),
                    reason: "bad".into(),
                });
            }
            Ok(Message::Begin {
                id: line.to_owned(),
                pos: pos.clone(),
            })
        })
    }

    /// Every line the sink would see: (line number, text or error), until the end or `idle`
    /// idle signals.
    fn drain(lanes: &mut Lanes, stop_after_idle: usize) -> (Vec<(u64, String)>, Option<String>) {
        let mut seen = Vec::new();
        let mut idles = 0;
        loop {
            match lanes
                .next(Duration::from_secs(5))
                .expect("the lanes answer")
            {
                Decoded::Lines(chunk) => {
                    let (bytes, lines) = chunk.into_parts();
                    for line in lines {
                        let text = line.text(&bytes).get().to_owned();
                        seen.push(match line.parsed {
                            Parsed::Message(Ok(Message::Begin { id, pos })) => {
                                assert_eq!(id, text);
                                (pos.line, id)
                            }
                            Parsed::Message(Err(e)) => (e.position().line, format!("error: {e}")),
                            Parsed::Message(Ok(other)) => panic!("unexpected {other:?}"),
                            Parsed::NotUtf8(_) => (0, "not UTF-8".into()),
                        });
                    }
                }
                Decoded::Idle => {
                    idles += 1;
                    if idles == stop_after_idle {
                        return (seen, None);
                    }
                }
                Decoded::End(e) => return (seen, e),
            }
        }
    }

    #[test]
    fn lines_come_in_source_order_with_their_numbers_whichever_lane_parsed_them() {
        let mut text = Vec::new();
        let mut expected = Vec::new();
        for i in 1..=500u64 {
            let line = match i {
                17 => "bad".to_owned(),
                40 => String::new(),
                // Long lines: chunks of one line, longer than the chunk size.
                99 | 100 => "x".repeat(300),
                _ => format!("line {i}"),
            };
            text.extend_from_slice(line.as_bytes());
            text.extend_from_slice(if i % 7 == 0 { b"\r\n" } else { b"\n" });
            let seen = if line == "bad" {
                format!("error: in.json:{i}: bad")
            } else {
                line
            };
            expected.push((i + 10, seen));
        }
        // The last line without its newline, and a line that is not UTF-8 before it.
        text.extend_from_slice(b"\xff\xfe\n");
        text.extend_from_slice(b"last");
        // Reads cut at odd places, mid-line included.
        let pieces: VecDeque<Vec<u8>> = text.chunks(37).map(<[u8]>::to_vec).collect();
        for lanes in [1, 3] {
            let mut l = Lanes::start(
                echo(),
                "in.json".into(),
                Box::new(Pieces(pieces.clone())),
                10,
                false,
                lanes,
                64,
            );
            let (seen, end) = drain(&mut l, 0);
            assert_eq!(end, None);
            let (last, rest) = seen.split_last().unwrap();
            let (not_utf8, rest) = rest.split_last().unwrap();
            for (got, want) in rest.iter().zip(&expected) {
                assert_eq!(got.0, want.0, "line numbers with {lanes} lanes");
                if want.1.starts_with("error") {
                    assert!(got.1.contains("bad"), "{got:?}");
                } else {
                    assert_eq!(got.1, want.1);
                }
            }
            assert_eq!(rest.len(), expected.len());
            assert_eq!(not_utf8.1, "not UTF-8");
            assert_eq!(last, &(512, "last".to_owned()));
        }
    }

    #[test]
    fn a_followed_source_keeps_a_partial_line_until_it_is_whole() {
        // `Pieces` ends after its pieces, which a follower reads as "nothing more yet".
        let pieces = VecDeque::from([b"one\ntw".to_vec()]);
        let mut l = Lanes::start(
            echo(),
            "in.json".into(),
            Box::new(Pieces(pieces)),
            0,
            true,
            2,
            1 << 10,
        );
        let (seen, end) = drain(&mut l, 1);
        assert_eq!(end, None);
        assert_eq!(seen, vec![(1, "one".to_owned())]);
        // Nothing more comes while the line stays partial.
        assert!(l.next(Duration::from_millis(50)).is_none());
    }
}
