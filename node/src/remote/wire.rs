//! The frames between a leader and a shard host, over one TCP connection per shard.
//!
//! A frame is an 8-byte header (body length `u32`, kind `u8`, a zero byte, and the shard `u16`,
//! little-endian) and its body. The header is read apart from the body so that the body lands
//! at the start of an aligned buffer: an `Apply` body is the archived
//! [`retina_protocol::OpBatch`] exactly as the sink encoded it, and the host's shard reads it
//! in place, as a local shard does. Every other body is a few fixed-width numbers and
//! length-prefixed strings ([`Enc`], [`Dec`]).

use std::io::{IoSlice, Read, Write};

use retina_storage::file::RowGroupInfo;
use retina_storage::{FileId, Timestamp};
use rkyv::util::AlignedVec;

use crate::coordinator::PlanFile;

/// The largest body a frame may have (a batch is bounded by the sink's byte limits far below).
pub const MAX_BODY: usize = 1 << 30;

/// What a frame is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    // Leader to host.
    Hello = 1,
    Apply = 2,
    Checkpoint = 3,
    Watermarks = 4,
    VisCheckpoint = 5,
    DropVisCheckpoint = 6,
    QueryBegun = 7,
    QueryEnded = 8,
    Stop = 9,
    // Host to leader.
    Ready = 20,
    Refused = 21,
    Credit = 22,
    Applied = 23,
    Failed = 24,
    ShardFailed = 25,
    CheckpointDone = 26,
    // 27 was QueryKnown: a begin no longer waits for the shards.
    FileAdded = 28,
    FileReplaced = 29,
    VisCheckpointDone = 30,
}

impl Kind {
    fn of(byte: u8) -> Option<Kind> {
        use Kind::*;
        Some(match byte {
            1 => Hello,
            2 => Apply,
            3 => Checkpoint,
            4 => Watermarks,
            5 => VisCheckpoint,
            6 => DropVisCheckpoint,
            7 => QueryBegun,
            8 => QueryEnded,
            9 => Stop,
            20 => Ready,
            21 => Refused,
            22 => Credit,
            23 => Applied,
            24 => Failed,
            25 => ShardFailed,
            26 => CheckpointDone,
            28 => FileAdded,
            29 => FileReplaced,
            30 => VisCheckpointDone,
            _ => return None,
        })
    }
}

/// One frame as read.
pub struct Frame {
    pub kind: Kind,
    pub shard: u16,
    pub body: AlignedVec,
}

/// Writes one frame: header and body together, without copying the body (a batch goes out
/// as the sink encoded it). Writers sharing a stream hold a lock around each frame.
pub fn write_frame(w: &mut impl Write, kind: Kind, shard: u16, body: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l as usize <= MAX_BODY)
        .ok_or_else(|| std::io::Error::other(format!("a frame of {} bytes", body.len())))?;
    let mut header = [0u8; 8];
    header[..4].copy_from_slice(&len.to_le_bytes());
    header[4] = kind as u8;
    header[6..].copy_from_slice(&shard.to_le_bytes());
    let sent = loop {
        match w.write_vectored(&[IoSlice::new(&header), IoSlice::new(body)]) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            other => break other?,
        }
    };
    match sent.checked_sub(header.len()) {
        None => {
            w.write_all(&header[sent..])?;
            w.write_all(body)
        }
        Some(of_body) => w.write_all(&body[of_body..]),
    }
}

/// Reads one frame; `None` at a clean end of the stream (before a header).
pub fn read_frame(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
    let mut header = [0u8; 8];
    let mut got = 0;
    while got < header.len() {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
    let kind = Kind::of(header[4]).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame kind {} is unknown", header[4]),
        )
    })?;
    if len > MAX_BODY {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes"),
        ));
    }
    let shard = u16::from_le_bytes([header[6], header[7]]);
    let mut body = AlignedVec::with_capacity(len);
    body.resize(len, 0);
    r.read_exact(&mut body)?;
    Ok(Some(Frame { kind, shard, body }))
}

/// A body being written.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn str(self, s: &str) -> Self {
        let mut e = self.u64(s.len() as u64);
        e.0.extend_from_slice(s.as_bytes());
        e
    }

    pub fn file(self, f: &PlanFile) -> Self {
        let mut e = self
            .u64(f.file.0)
            .str(f.path.as_ref())
            .u64(f.bytes)
            .u64(u64::from(f.shard))
            .u64(f.min_snapshot.get())
            .u64(f.superseded_from.map_or(0, Timestamp::get))
            .u64(f.row_groups.len() as u64);
        for g in &f.row_groups {
            e = e
                .u64(g.offset)
                .u64(g.rows)
                .u64(g.min_create_ts)
                .u64(g.max_create_ts);
        }
        e
    }
}

/// A body being read; every read names what it wanted when the body is short or wrong.
pub struct Dec<'a>(pub &'a [u8]);

impl Dec<'_> {
    pub fn u64(&mut self, what: &str) -> Result<u64, String> {
        let (head, rest) = self
            .0
            .split_first_chunk::<8>()
            .ok_or_else(|| format!("the frame ends before {what}"))?;
        self.0 = rest;
        Ok(u64::from_le_bytes(*head))
    }

    pub fn ts(&mut self, what: &str) -> Result<Timestamp, String> {
        let raw = self.u64(what)?;
        Timestamp::new(raw).map_err(|e| format!("{what}: {e}"))
    }

    pub fn str(&mut self, what: &str) -> Result<String, String> {
        let len = usize::try_from(self.u64(what)?).map_err(|_| format!("{what} is too long"))?;
        if len > self.0.len() {
            return Err(format!("the frame ends inside {what}"));
        }
        let (s, rest) = self.0.split_at(len);
        self.0 = rest;
        String::from_utf8(s.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    pub fn file(&mut self) -> Result<PlanFile, String> {
        let file = FileId(self.u64("a file id")?);
        let path = self.str("a file's path")?;
        let bytes = self.u64("a file's size")?;
        let shard = u16::try_from(self.u64("a file's shard")?)
            .map_err(|_| "a file's shard is out of range".to_owned())?;
        let min_snapshot = self.ts("a file's first snapshot")?;
        let superseded_from = match self.u64("a file's last snapshot")? {
            0 => None,
            raw => Some(Timestamp::new(raw).map_err(|e| format!("a file's last snapshot: {e}"))?),
        };
        let groups = self.u64("a file's row groups")?;
        if groups > self.0.len() as u64 / 32 {
            return Err("the frame ends inside a file's row groups".into());
        }
        let mut row_groups = Vec::with_capacity(groups as usize);
        for _ in 0..groups {
            row_groups.push(RowGroupInfo {
                offset: self.u64("a row group")?,
                rows: self.u64("a row group")?,
                min_create_ts: self.u64("a row group")?,
                max_create_ts: self.u64("a row group")?,
            });
        }
        Ok(PlanFile {
            file,
            path: object_store::path::Path::from(path),
            bytes,
            shard,
            row_groups,
            min_snapshot,
            superseded_from,
        })
    }
}

/// What a leader tells a host first: run shard `shard` of `shards` for leadership `epoch`,
/// from checkpoint `checkpoint` (none: an empty shard), with these tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub epoch: u64,
    pub shards: u16,
    /// Batches the leader may send before the host grants more (credit).
    pub window: u64,
    /// Whether the leader takes checkpoints (then an object goes only once a complete
    /// checkpoint does not read it).
    pub checkpoints: bool,
    /// The checkpoint's id and timestamp.
    pub checkpoint: Option<(u64, Timestamp)>,
    /// How many times the leader started this shard again in this leadership, after the
    /// member that ran it was lost ([`crate::remote::proxy`]): 0 at placement. Each
    /// generation numbers its files from a base of its own ([`generation_base`]), so a
    /// restarted shard never names an object as the lost run of it may have.
    pub generation: u32,
    /// The catalog's description ([`crate::catalog::Catalog::describe`]): a host whose
    /// tables differ refuses.
    pub catalog: String,
}

impl Hello {
    pub fn encode(&self) -> Vec<u8> {
        let (id, ts) = self.checkpoint.map_or((0, 0), |(id, ts)| (id, ts.get()));
        Enc::default()
            .u64(self.epoch)
            .u64(u64::from(self.shards))
            .u64(self.window)
            .u64(u64::from(self.checkpoints))
            .u64(id)
            .u64(ts)
            .u64(u64::from(self.generation))
            .str(&self.catalog)
            .0
    }

    pub fn decode(body: &[u8]) -> Result<Hello, String> {
        let mut d = Dec(body);
        let epoch = d.u64("the epoch")?;
        let shards =
            u16::try_from(d.u64("the shards")?).map_err(|_| "too many shards".to_owned())?;
        let window = d.u64("the window")?;
        let checkpoints = d.u64("whether the leader takes checkpoints")? != 0;
        let id = d.u64("the checkpoint")?;
        let ts = d.u64("the checkpoint's timestamp")?;
        let generation = u32::try_from(d.u64("the generation")?)
            .map_err(|_| "the generation does not fit 32 bits".to_owned())?;
        let checkpoint = match id {
            0 => None,
            id => Some((
                id,
                Timestamp::new(ts).map_err(|e| format!("the checkpoint's timestamp: {e}"))?,
            )),
        };
        Ok(Hello {
            epoch,
            shards,
            window,
            checkpoints,
            checkpoint,
            generation,
            catalog: d.str("the catalog")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_bodies_read_back() {
        let hello = Hello {
            epoch: 3,
            shards: 4,
            window: 64,
            checkpoints: true,
            checkpoint: Some(((3 << 32) + 1, Timestamp::new(99).unwrap())),
            generation: 2,
            catalog: "t(id BIGINT)".into(),
        };
        let file = PlanFile {
            file: FileId(7),
            path: "tables/t/0000000000000007.parquet".into(),
            bytes: 1234,
            shard: 2,
            row_groups: vec![RowGroupInfo {
                offset: 0,
                rows: 10,
                min_create_ts: 3,
                max_create_ts: 9,
            }],
            min_snapshot: Timestamp::GENESIS,
            superseded_from: Some(Timestamp::new(40).unwrap()),
        };
        let mut stream = Vec::new();
        write_frame(&mut stream, Kind::Hello, 2, &hello.encode()).unwrap();
        write_frame(
            &mut stream,
            Kind::FileAdded,
            2,
            &Enc::default().file(&file).0,
        )
        .unwrap();
        let mut r = &stream[..];
        let f = read_frame(&mut r).unwrap().unwrap();
        assert_eq!((f.kind, f.shard), (Kind::Hello, 2));
        assert_eq!(Hello::decode(&f.body).unwrap(), hello);
        let f = read_frame(&mut r).unwrap().unwrap();
        assert_eq!(f.kind, Kind::FileAdded);
        let back = Dec(&f.body).file().unwrap();
        assert_eq!(
            (
                back.file,
                back.path,
                back.bytes,
                back.row_groups,
                back.superseded_from
            ),
            (
                file.file,
                file.path,
                file.bytes,
                file.row_groups,
                file.superseded_from
            )
        );
        assert!(read_frame(&mut r).unwrap().is_none());
        // A short body names what it lacked; a cut frame is an error, not an end.
        assert!(Hello::decode(&[1, 2]).unwrap_err().contains("the epoch"));
        assert!(read_frame(&mut &stream[..5]).is_err());
    }
}
