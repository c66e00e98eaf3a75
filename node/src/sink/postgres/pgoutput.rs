//! The pgoutput logical replication messages (protocol version 1), decoded from the bytes of
//! one `XLogData` message. Tuples stay borrowed from those bytes.

use std::fmt;

/// One column of a relation as the stream describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelColumn {
    /// Part of the replica identity (the key Postgres sends for updates and deletes).
    pub key: bool,
    pub name: String,
    pub type_oid: u32,
    pub type_modifier: i32,
}

/// A table as the stream describes it, sent before its first change in a session and again
/// after its definition changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relation {
    pub oid: u32,
    pub namespace: String,
    pub name: String,
    /// `d` (the primary key), `n` (nothing), `f` (every column), `i` (an index).
    pub replica_identity: u8,
    pub columns: Vec<RelColumn>,
}

/// A column's value in a tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Datum<'a> {
    Null,
    /// A TOASTed value the update did not change: Postgres does not send it again.
    Unchanged,
    Text(&'a [u8]),
    Binary(&'a [u8]),
}

/// Which old image an update or delete carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OldImage {
    /// `K`: the replica identity's columns (others null).
    Key,
    /// `O`: every column (`REPLICA IDENTITY FULL`).
    Full,
}

/// One decoded message.
#[derive(Clone, Debug, PartialEq)]
pub enum PgMessage<'a> {
    Begin {
        final_lsn: u64,
        commit_time: i64,
        xid: u32,
    },
    Commit {
        lsn: u64,
        end_lsn: u64,
        commit_time: i64,
    },
    Relation(Relation),
    Insert {
        rel: u32,
        new: Vec<Datum<'a>>,
    },
    Update {
        rel: u32,
        old: Option<(OldImage, Vec<Datum<'a>>)>,
        new: Vec<Datum<'a>>,
    },
    Delete {
        rel: u32,
        old: (OldImage, Vec<Datum<'a>>),
    },
    Truncate {
        rels: Vec<u32>,
        cascade: bool,
        restart_identity: bool,
    },
    /// `Y`, `O` or `M`: types, origins and logical messages, which replay does not use.
    Ignored(u8),
}

/// A message that cannot be decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pgoutput: {}", self.0)
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    what: char,
}

impl<'a> Reader<'a> {
    fn err(&self, why: &str) -> DecodeError {
        DecodeError(format!("message `{}`: {why}", self.what))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(self.err(&format!(
                "truncated (needs {n} more bytes, has {})",
                self.bytes.len()
            )));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn i16(&mut self) -> Result<i16, DecodeError> {
        Ok(i16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn i32(&mut self) -> Result<i32, DecodeError> {
        Ok(i32::from_be_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(self.i32()? as u32)
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let end = self
            .bytes
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.err("a string has no terminating zero"))?;
        let s = std::str::from_utf8(&self.bytes[..end])
            .map_err(|_| self.err("a name is not UTF-8"))?
            .to_owned();
        self.bytes = &self.bytes[end + 1..];
        Ok(s)
    }

    fn tuple(&mut self) -> Result<Vec<Datum<'a>>, DecodeError> {
        let n = self.i16()?;
        let mut out = Vec::with_capacity(n.max(0) as usize);
        for _ in 0..n {
            out.push(match self.u8()? {
                b'n' => Datum::Null,
                b'u' => Datum::Unchanged,
                kind @ (b't' | b'b') => {
                    let len = self.i32()?;
                    if len < 0 {
                        return Err(self.err("a value has a negative length"));
                    }
                    let bytes = self.take(len as usize)?;
                    if kind == b't' {
                        Datum::Text(bytes)
                    } else {
                        Datum::Binary(bytes)
                    }
                }
                other => {
                    return Err(self.err(&format!("unknown tuple value kind {:?}", other as char)));
                }
            });
        }
        Ok(out)
    }

    fn done(&self) -> Result<(), DecodeError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(self.err(&format!("{} bytes left over", self.bytes.len())))
        }
    }
}

/// Decodes one pgoutput message.
pub fn decode(bytes: &[u8]) -> Result<PgMessage<'_>, DecodeError> {
    let Some((&tag, body)) = bytes.split_first() else {
        return Err(DecodeError("an empty message".into()));
    };
    let mut r = Reader {
        bytes: body,
        what: tag as char,
    };
    let msg = match tag {
        b'B' => PgMessage::Begin {
            final_lsn: r.i64()? as u64,
            commit_time: r.i64()?,
            xid: r.u32()?,
        },
        b'C' => {
            let _flags = r.u8()?;
            PgMessage::Commit {
                lsn: r.i64()? as u64,
                end_lsn: r.i64()? as u64,
                commit_time: r.i64()?,
            }
        }
        b'R' => {
            let oid = r.u32()?;
            let namespace = r.string()?;
            let name = r.string()?;
            let replica_identity = r.u8()?;
            let n = r.i16()?;
            let mut columns = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                let flags = r.u8()?;
                columns.push(RelColumn {
                    key: flags & 1 == 1,
                    name: r.string()?,
                    type_oid: r.u32()?,
                    type_modifier: r.i32()?,
                });
            }
            PgMessage::Relation(Relation {
                oid,
                // The catalog's schema: an empty namespace is `pg_catalog`.
                namespace: if namespace.is_empty() {
                    "pg_catalog".into()
                } else {
                    namespace
                },
                name,
                replica_identity,
                columns,
            })
        }
        b'I' => {
            let rel = r.u32()?;
            match r.u8()? {
                b'N' => PgMessage::Insert {
                    rel,
                    new: r.tuple()?,
                },
                other => return Err(r.err(&format!("expected N, got {:?}", other as char))),
            }
        }
        b'U' => {
            let rel = r.u32()?;
            let mut old = None;
            let mut kind = r.u8()?;
            if kind == b'K' || kind == b'O' {
                let image = if kind == b'K' {
                    OldImage::Key
                } else {
                    OldImage::Full
                };
                old = Some((image, r.tuple()?));
                kind = r.u8()?;
            }
            if kind != b'N' {
                return Err(r.err(&format!("expected K, O or N, got {:?}", kind as char)));
            }
            PgMessage::Update {
                rel,
                old,
                new: r.tuple()?,
            }
        }
        b'D' => {
            let rel = r.u32()?;
            let image = match r.u8()? {
                b'K' => OldImage::Key,
                b'O' => OldImage::Full,
                other => return Err(r.err(&format!("expected K or O, got {:?}", other as char))),
            };
            PgMessage::Delete {
                rel,
                old: (image, r.tuple()?),
            }
        }
        b'T' => {
            let n = r.i32()?;
            let options = r.u8()?;
            let mut rels = Vec::with_capacity(n.max(0) as usize);
            for _ in 0..n {
                rels.push(r.u32()?);
            }
            PgMessage::Truncate {
                rels,
                cascade: options & 1 == 1,
                restart_identity: options & 2 == 2,
            }
        }
        b'Y' | b'O' | b'M' => return Ok(PgMessage::Ignored(tag)),
        // Protocol version 2's streamed transactions are never asked for (proto_version 1).
        other => {
            return Err(DecodeError(format!(
                "unknown message type {:?} (byte {other})",
                other as char
            )));
        }
    };
    r.done()?;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Messages captured from PostgreSQL 15 (`pg_logical_slot_peek_binary_changes` with
    /// `proto_version '1'`), in stream order, for this session:
    ///
    /// ```sql
    /// create table t (id int primary key, name varchar(20), amount numeric(10,2), d date,
    ///   ts timestamp, tz timestamptz, b boolean, f double precision, big bigint, tm time);
    /// create table u (k1 int, k2 text, v text, primary key (k1, k2));
    /// begin; insert into t values (1, 'a''b', 12.50, '2024-02-29',
    ///   '2024-01-02 03:04:05.123456', '2024-01-02 03:04:05+02', true, 1.5, 9000000000,
    ///   '12:34:56.5'); insert into t (id) values (2); commit;
    /// update t set name = 'x' where id = 1;
    /// update t set id = 3 where id = 2;
    /// delete from t where id = 3;
    /// insert into u values (1, 'é', 'v');
    /// truncate t, u;
    /// ```
    const CAPTURED: &str = include_str!("pgoutput_captured.hex");

    fn captured() -> Vec<Vec<u8>> {
        CAPTURED
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| {
                (0..l.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&l[i..i + 2], 16).unwrap())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn captured_messages_decode() {
        let bytes = captured();
        let msgs: Vec<PgMessage> = bytes.iter().map(|b| decode(b).unwrap()).collect();
        let t = |s: &'static str| Datum::Text(s.as_bytes());
        assert_eq!(msgs.len(), 23);
        assert!(matches!(msgs[0], PgMessage::Begin { xid: 727, .. }));
        let PgMessage::Relation(rel) = &msgs[1] else {
            panic!("{:?}", msgs[1])
        };
        assert_eq!(
            (
                rel.namespace.as_str(),
                rel.name.as_str(),
                rel.replica_identity
            ),
            ("public", "t", b'd')
        );
        let names: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "id", "name", "amount", "d", "ts", "tz", "b", "f", "big", "tm"
            ]
        );
        assert!(rel.columns[0].key && !rel.columns[1].key);
        // int4, varchar(20) (typmod 24), numeric(10,2).
        assert_eq!(
            (rel.columns[0].type_oid, rel.columns[0].type_modifier),
            (23, -1)
        );
        assert_eq!(
            (rel.columns[1].type_oid, rel.columns[1].type_modifier),
            (1043, 24)
        );
        assert_eq!(rel.columns[2].type_oid, 1700);
        assert_eq!(
            msgs[2],
            PgMessage::Insert {
                rel: rel.oid,
                new: vec![
                    t("1"),
                    t("a'b"),
                    t("12.50"),
                    t("2024-02-29"),
                    t("2024-01-02 03:04:05.123456"),
                    t("2024-01-02 01:04:05+00"),
                    t("t"),
                    t("1.5"),
                    t("9000000000"),
                    t("12:34:56.5"),
                ]
            }
        );
        let mut nulls = vec![Datum::Null; 10];
        nulls[0] = t("2");
        assert_eq!(
            msgs[3],
            PgMessage::Insert {
                rel: rel.oid,
                new: nulls.clone()
            }
        );
        let PgMessage::Commit { lsn, end_lsn, .. } = msgs[4] else {
            panic!("{:?}", msgs[4])
        };
        let PgMessage::Begin { final_lsn, .. } = msgs[0] else {
            unreachable!()
        };
        assert_eq!(lsn, final_lsn);
        assert!(end_lsn > lsn);
        // An update keeping the key has no old image; one changing it has the old key.
        assert!(matches!(&msgs[6], PgMessage::Update { old: None, new, .. } if new[1] == t("x")));
        let mut old_key = vec![Datum::Null; 10];
        old_key[0] = t("2");
        let mut new_row = vec![Datum::Null; 10];
        new_row[0] = t("3");
        assert_eq!(
            msgs[9],
            PgMessage::Update {
                rel: rel.oid,
                old: Some((OldImage::Key, old_key)),
                new: new_row.clone()
            }
        );
        assert_eq!(
            msgs[12],
            PgMessage::Delete {
                rel: rel.oid,
                old: (OldImage::Key, new_row)
            }
        );
        let PgMessage::Relation(u) = &msgs[15] else {
            panic!("{:?}", msgs[15])
        };
        assert!(u.columns[0].key && u.columns[1].key && !u.columns[2].key);
        assert_eq!(
            msgs[16],
            PgMessage::Insert {
                rel: u.oid,
                new: vec![t("1"), t("é"), t("v")]
            }
        );
        assert_eq!(
            msgs[21],
            PgMessage::Truncate {
                rels: vec![rel.oid, u.oid],
                cascade: false,
                restart_identity: false
            }
        );
        assert!(matches!(msgs[22], PgMessage::Commit { .. }));
    }

    #[test]
    fn damaged_messages_are_errors() {
        let bytes = captured();
        let insert = &bytes[2];
        for cut in [1, 5, 8, insert.len() - 1] {
            let e = decode(&insert[..cut]).unwrap_err();
            assert!(e.to_string().contains("message `I`"), "{e}");
        }
        let mut longer = insert.clone();
        longer.push(0);
        assert!(decode(&longer).unwrap_err().0.contains("1 bytes left over"));
        assert!(decode(b"").is_err());
        assert!(
            decode(b"S\0\0\0\x01")
                .unwrap_err()
                .0
                .contains("unknown message type 'S'")
        );
        let mut bad_kind = bytes[3].clone();
        let at = bad_kind.len() - 1;
        bad_kind[at] = b'x';
        assert!(
            decode(&bad_kind)
                .unwrap_err()
                .0
                .contains("unknown tuple value kind")
        );
        assert_eq!(decode(b"Yanything").unwrap(), PgMessage::Ignored(b'Y'));
    }
}
