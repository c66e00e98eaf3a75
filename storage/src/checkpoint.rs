//! A shard's checkpoint image: everything a shard holds as of one applied timestamp (its
//! tables' live index entries, row-id maps, file visibility folded at that timestamp, regular
//! files' row groups, and write buffers with their in-memory rows), and its byte encoding.
//!
//! The encoding is little-endian, length-prefixed, begins with a magic and a version, and ends
//! with an FNV-1a checksum of everything before it, so a torn or damaged file is refused rather
//! than restored. In-memory blocks travel as Arrow IPC streams.

use std::io::Cursor;

use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use arrow::record_batch::RecordBatch;

use crate::buffer::{BlockImage, BufferImage, VirtualFileImage};
use crate::error::{Result, StorageError};
use crate::file::RowGroupInfo;
use crate::index::{Extent, FileId, KeptRows, RowId};
use crate::ts::Timestamp;

const MAGIC: &[u8; 8] = b"RTNACKPT";
/// 2: extents of rewritten files carry their kept rows (version 1 images still load).
const VERSION: u32 = 2;

/// One shard as of `applied_through`.
pub struct ShardImage {
    pub shard: u16,
    pub applied_through: Timestamp,
    pub next_file_seq: u64,
    pub tables: Vec<TableImage>,
}

/// One table of a shard.
pub struct TableImage {
    pub name: String,
    /// Every live key with its row id.
    pub keys: Vec<(Vec<u8>, RowId)>,
    pub extents: Vec<(RowId, Extent)>,
    pub files: Vec<FileImage>,
    pub buffer: BufferImage,
}

/// One file's visibility at the image's timestamp and, once combined, its row groups.
pub struct FileImage {
    pub id: FileId,
    pub rows: u64,
    /// Deleted rows, bit i = row i.
    pub deleted: Vec<u64>,
    pub regular: Option<Vec<RowGroupInfo>>,
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn words(&mut self, w: &[u64]) {
        self.len(w.len());
        for x in w {
            self.u64(*x);
        }
    }
    fn batch(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut out = Vec::new();
        let mut w = StreamWriter::try_new(&mut out, &batch.schema())?;
        w.write(batch)?;
        w.finish()?;
        drop(w);
        self.bytes(&out);
        Ok(())
    }
}

struct Dec<'a> {
    what: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Dec<'a> {
    fn corrupt(&self, reason: impl Into<String>) -> StorageError {
        StorageError::Corrupt {
            what: self.what.into(),
            reason: format!("at byte {}: {}", self.at, reason.into()),
        }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.bytes.len() - self.at < n {
            return Err(self.corrupt(format!("{n} bytes past the end")));
        }
        let out = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn len(&mut self) -> Result<usize> {
        let n = self.u64()?;
        // No count can exceed the bytes left: refuse a damaged length before allocating.
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(self.corrupt(format!("a length of {n}")));
        }
        Ok(n as usize)
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.len()?;
        self.take(n)
    }
    fn words(&mut self) -> Result<Vec<u64>> {
        let n = self.len()?;
        (0..n).map(|_| self.u64()).collect()
    }
    fn ts(&mut self) -> Result<Timestamp> {
        let raw = self.u64()?;
        Timestamp::new(raw).map_err(|_| self.corrupt(format!("timestamp {raw}")))
    }
    fn batch(&mut self) -> Result<RecordBatch> {
        let bytes = self.bytes()?;
        let mut r = StreamReader::try_new(Cursor::new(bytes), None)?;
        let batch = r.next().ok_or_else(|| self.corrupt("an empty block"))??;
        Ok(batch)
    }
}

/// The bytes before the checksum of an encoding that begins with `magic`, once the checksum
/// matches.
fn checked_body<'a>(bytes: &'a [u8], magic: &[u8; 8], what: &str) -> Result<&'a [u8]> {
    let corrupt = |reason: &str| StorageError::Corrupt {
        what: what.into(),
        reason: reason.into(),
    };
    if bytes.len() < magic.len() + 12 || &bytes[..magic.len()] != magic {
        return Err(corrupt("bad magic: not this kind of file"));
    }
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    if fnv1a(body) != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
        return Err(corrupt(
            "the checksum does not match (a torn or damaged file)",
        ));
    }
    Ok(body)
}

impl ShardImage {
    pub fn encode(&self) -> Result<Vec<u8>> {
        self.encode_as(VERSION)
    }

    /// The encoding of `version` (an older one only for tests: it cannot hold kept rows).
    fn encode_as(&self, version: u32) -> Result<Vec<u8>> {
        let mut e = Enc(Vec::with_capacity(1 << 16));
        e.0.extend_from_slice(MAGIC);
        e.u32(version);
        e.u32(u32::from(self.shard));
        e.u64(self.applied_through.get());
        e.u64(self.next_file_seq);
        e.len(self.tables.len());
        for t in &self.tables {
            e.bytes(t.name.as_bytes());
            e.len(t.keys.len());
            for (k, r) in &t.keys {
                e.bytes(k);
                e.u64(r.0);
            }
            e.len(t.extents.len());
            for (first, x) in &t.extents {
                e.u64(first.0);
                e.u64(x.file.0);
                e.u64(x.offset);
                e.u64(x.rows);
                match &x.kept {
                    _ if version < 2 => assert!(x.kept.is_none(), "version 1 has no kept rows"),
                    None => e.u8(0),
                    Some(k) => {
                        e.u8(1);
                        e.words(k.bits());
                    }
                }
            }
            e.len(t.files.len());
            for f in &t.files {
                e.u64(f.id.0);
                e.u64(f.rows);
                e.words(&f.deleted);
                match &f.regular {
                    None => e.u8(0),
                    Some(groups) => {
                        e.u8(1);
                        e.len(groups.len());
                        for g in groups {
                            e.u64(g.offset);
                            e.u64(g.rows);
                            e.u64(g.min_create_ts);
                            e.u64(g.max_create_ts);
                        }
                    }
                }
            }
            e.u64(t.buffer.next_row);
            e.len(t.buffer.files.len());
            for f in &t.buffer.files {
                e.u64(f.id.0);
                e.u64(f.first_row.0);
                e.u64(f.rows);
                e.u64(f.capacity);
                e.len(f.sealed.len());
                for b in &f.sealed {
                    match b {
                        BlockImage::Flushed => e.u8(0),
                        BlockImage::Memory(batch) => {
                            e.u8(1);
                            e.batch(batch)?;
                        }
                    }
                }
                match &f.active {
                    None => e.u8(0),
                    Some(batch) => {
                        e.u8(1);
                        e.batch(batch)?;
                    }
                }
            }
        }
        let sum = fnv1a(&e.0);
        e.u64(sum);
        Ok(e.0)
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        let body = checked_body(bytes, MAGIC, "a shard checkpoint")?;
        let mut d = Dec {
            what: "a shard checkpoint",
            bytes: body,
            at: MAGIC.len(),
        };
        let version = d.u32()?;
        if !(1..=VERSION).contains(&version) {
            return Err(d.corrupt(format!(
                "version {version}, this build reads 1 to {VERSION}"
            )));
        }
        let shard = d.u32()?;
        let shard = u16::try_from(shard).map_err(|_| d.corrupt(format!("shard {shard}")))?;
        let applied_through = d.ts()?;
        let next_file_seq = d.u64()?;
        let mut tables = Vec::new();
        for _ in 0..d.len()? {
            let name = String::from_utf8(d.bytes()?.to_vec())
                .map_err(|_| d.corrupt("a table name that is not UTF-8"))?;
            let mut keys = Vec::new();
            for _ in 0..d.len()? {
                let k = d.bytes()?.to_vec();
                keys.push((k, RowId(d.u64()?)));
            }
            let mut extents = Vec::new();
            for _ in 0..d.len()? {
                let first = RowId(d.u64()?);
                let file = FileId(d.u64()?);
                let offset = d.u64()?;
                let rows = d.u64()?;
                let tag = if version >= 2 { d.u8()? } else { 0 };
                let kept = match tag {
                    0 => None,
                    1 => Some(std::sync::Arc::new(
                        KeptRows::new(rows, d.words()?).map_err(|e| d.corrupt(e.to_string()))?,
                    )),
                    t => return Err(d.corrupt(format!("extent tag {t}"))),
                };
                let x = Extent {
                    file,
                    offset,
                    rows,
                    kept,
                };
                extents.push((first, x));
            }
            let mut files = Vec::new();
            for _ in 0..d.len()? {
                let id = FileId(d.u64()?);
                let rows = d.u64()?;
                let deleted = d.words()?;
                let regular = match d.u8()? {
                    0 => None,
                    1 => {
                        let mut groups = Vec::new();
                        for _ in 0..d.len()? {
                            groups.push(RowGroupInfo {
                                offset: d.u64()?,
                                rows: d.u64()?,
                                min_create_ts: d.u64()?,
                                max_create_ts: d.u64()?,
                            });
                        }
                        Some(groups)
                    }
                    t => return Err(d.corrupt(format!("file tag {t}"))),
                };
                files.push(FileImage {
                    id,
                    rows,
                    deleted,
                    regular,
                });
            }
            let next_row = d.u64()?;
            let mut vfiles = Vec::new();
            for _ in 0..d.len()? {
                let id = FileId(d.u64()?);
                let first_row = RowId(d.u64()?);
                let rows = d.u64()?;
                let capacity = d.u64()?;
                let mut sealed = Vec::new();
                for _ in 0..d.len()? {
                    sealed.push(match d.u8()? {
                        0 => BlockImage::Flushed,
                        1 => BlockImage::Memory(d.batch()?),
                        t => return Err(d.corrupt(format!("block tag {t}"))),
                    });
                }
                let active = match d.u8()? {
                    0 => None,
                    1 => Some(d.batch()?),
                    t => return Err(d.corrupt(format!("active-block tag {t}"))),
                };
                vfiles.push(VirtualFileImage {
                    id,
                    first_row,
                    rows,
                    capacity,
                    sealed,
                    active,
                });
            }
            tables.push(TableImage {
                name,
                keys,
                extents,
                files,
                buffer: BufferImage {
                    next_row,
                    files: vfiles,
                },
            });
        }
        if d.at != body.len() {
            return Err(d.corrupt("trailing bytes"));
        }
        Ok(ShardImage {
            shard,
            applied_through,
            next_file_seq,
            tables,
        })
    }
}

const VIS_MAGIC: &[u8; 8] = b"RTNAVISC";
const VIS_VERSION: u32 = 1;

/// A long query's visibility checkpoint on one shard: every file's deleted rows at the
/// query's snapshot (one bit per row). Once it is written, memory GC may fold past the
/// snapshot; the query's bitmaps then come from here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisibilityImage {
    pub shard: u16,
    pub snapshot: Timestamp,
    /// Each file's rows when the image was taken and its deleted rows (bit i = row i).
    pub files: std::collections::BTreeMap<FileId, (u64, Vec<u64>)>,
}

impl VisibilityImage {
    /// Rows `start .. start + len` of `file` deleted at the snapshot, into `out` (as
    /// [`crate::FileVisibility::bitmap_range`]). Rows the image does not hold were created
    /// after it, so after the snapshot: not deleted there.
    pub fn bitmap_range(&self, file: FileId, start: u64, len: u64, out: &mut Vec<u64>) {
        assert_eq!(start % 64, 0, "bitmap ranges start at a word boundary");
        out.clear();
        out.resize(len.div_ceil(64) as usize, 0);
        if let Some((rows, words)) = self.files.get(&file) {
            let first = (start / 64) as usize;
            let upto = (start + len).min(*rows).div_ceil(64) as usize;
            if upto > first {
                out[..upto - first].copy_from_slice(&words[first..upto]);
            }
            if !len.is_multiple_of(64)
                && let Some(last) = out.last_mut()
            {
                *last &= (1u64 << (len % 64)) - 1;
            }
        }
    }

    /// Bytes the image takes in memory once loaded.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self
                .files
                .values()
                .map(|(_, w)| 48 + w.len() * 8)
                .sum::<usize>()
    }

    pub fn encode(&self) -> Vec<u8> {
        let words: usize = self.files.values().map(|(_, w)| w.len()).sum();
        let mut e = Enc(Vec::with_capacity(64 + words * 8 + self.files.len() * 24));
        e.0.extend_from_slice(VIS_MAGIC);
        e.u32(VIS_VERSION);
        e.u32(u32::from(self.shard));
        e.u64(self.snapshot.get());
        e.len(self.files.len());
        for (id, (rows, deleted)) in &self.files {
            e.u64(id.0);
            e.u64(*rows);
            e.words(deleted);
        }
        let sum = fnv1a(&e.0);
        e.u64(sum);
        e.0
    }

    pub fn decode(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "a visibility checkpoint";
        let body = checked_body(bytes, VIS_MAGIC, WHAT)?;
        let mut d = Dec {
            what: WHAT,
            bytes: body,
            at: VIS_MAGIC.len(),
        };
        let version = d.u32()?;
        if version != VIS_VERSION {
            return Err(d.corrupt(format!("version {version}, this build reads {VIS_VERSION}")));
        }
        let shard = d.u32()?;
        let shard = u16::try_from(shard).map_err(|_| d.corrupt(format!("shard {shard}")))?;
        let snapshot = d.ts()?;
        let mut files = std::collections::BTreeMap::new();
        for _ in 0..d.len()? {
            let id = FileId(d.u64()?);
            let rows = d.u64()?;
            let deleted = d.words()?;
            if deleted.len() != rows.div_ceil(64) as usize {
                return Err(d.corrupt(format!("{} words for {rows} rows", deleted.len())));
            }
            files.insert(id, (rows, deleted));
        }
        if d.at != body.len() {
            return Err(d.corrupt("trailing bytes"));
        }
        Ok(VisibilityImage {
            shard,
            snapshot,
            files,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_of_the_previous_version_still_load() {
        let image = |kept: Option<KeptRows>| ShardImage {
            shard: 3,
            applied_through: Timestamp::new(9).unwrap(),
            next_file_seq: 2,
            tables: vec![TableImage {
                name: "t".into(),
                keys: vec![(b"k".to_vec(), RowId(4))],
                extents: vec![(
                    RowId(0),
                    Extent {
                        file: FileId::new(3, 1),
                        offset: 0,
                        rows: 64,
                        kept: kept.map(std::sync::Arc::new),
                    },
                )],
                files: Vec::new(),
                buffer: BufferImage {
                    next_row: 64,
                    files: Vec::new(),
                },
            }],
        };
        let old = image(None).encode_as(1).unwrap();
        let back = ShardImage::decode(&old).unwrap();
        assert_eq!(back.tables[0].extents, image(None).tables[0].extents);
        assert_eq!(back.tables[0].keys, image(None).tables[0].keys);
        let sparse = image(Some(KeptRows::new(64, vec![0b1011]).unwrap()));
        let back = ShardImage::decode(&sparse.encode().unwrap()).unwrap();
        assert_eq!(back.tables[0].extents, sparse.tables[0].extents);
    }

    #[test]
    fn visibility_images_round_trip_and_answer_ranges() {
        let mut files = std::collections::BTreeMap::new();
        files.insert(FileId::new(1, 3), (130, vec![0b1010, u64::MAX, 0b11]));
        let image = VisibilityImage {
            shard: 1,
            snapshot: Timestamp::new(77).unwrap(),
            files,
        };
        let bytes = image.encode();
        assert_eq!(VisibilityImage::decode(&bytes).unwrap(), image);
        let mut torn = bytes.clone();
        torn.truncate(bytes.len() - 3);
        assert!(VisibilityImage::decode(&torn).is_err());
        let mut flipped = bytes;
        flipped[30] ^= 1;
        assert!(VisibilityImage::decode(&flipped).is_err());

        let mut out = Vec::new();
        image.bitmap_range(FileId::new(1, 3), 64, 100, &mut out);
        assert_eq!(
            out,
            vec![u64::MAX, 0b11],
            "rows past the image are not deleted"
        );
        image.bitmap_range(FileId::new(1, 3), 0, 3, &mut out);
        assert_eq!(out, vec![0b010]);
        image.bitmap_range(FileId::new(1, 9), 0, 64, &mut out);
        assert_eq!(out, vec![0], "a file started after the image");
    }
}
