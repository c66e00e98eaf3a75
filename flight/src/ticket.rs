//! The tickets this service hands out: which query, which of its endpoints, and the query's
//! secret, so that a ticket cannot be forged by guessing a query's number.

use bytes::{BufMut, Bytes, BytesMut};

/// What a Retina ticket starts with.
const MAGIC: &[u8] = b"retina-flight/1:";
const LEN: usize = MAGIC.len() + 8 + 8 + 4;

/// One endpoint of one Flight query.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct QueryTicket {
    pub query: u64,
    pub secret: u64,
    pub endpoint: u32,
}

impl QueryTicket {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(LEN);
        b.put_slice(MAGIC);
        b.put_u64_le(self.query);
        b.put_u64_le(self.secret);
        b.put_u32_le(self.endpoint);
        b.freeze()
    }

    /// `None` when `bytes` is not a Retina ticket at all (a Flight SQL command, say); an error
    /// when it claims to be one and is malformed.
    pub fn decode(bytes: &[u8]) -> Option<Result<QueryTicket, String>> {
        let rest = bytes.strip_prefix(MAGIC)?;
        if bytes.len() != LEN {
            return Some(Err(format!(
                "a malformed Retina ticket: {} bytes, expected {LEN}",
                bytes.len()
            )));
        }
        let u64_at = |i: usize| u64::from_le_bytes(rest[i..i + 8].try_into().expect("8 bytes"));
        Some(Ok(QueryTicket {
            query: u64_at(0),
            secret: u64_at(8),
            endpoint: u32::from_le_bytes(rest[16..20].try_into().expect("4 bytes")),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_reads_back_and_other_bytes_are_not_tickets() {
        let t = QueryTicket {
            query: 7,
            secret: u64::MAX - 3,
            endpoint: 12,
        };
        assert_eq!(QueryTicket::decode(&t.encode()), Some(Ok(t)));
        assert_eq!(QueryTicket::decode(b"SELECT 1"), None);
        assert_eq!(QueryTicket::decode(b""), None);
        let mut short = t.encode().to_vec();
        short.pop();
        assert!(QueryTicket::decode(&short).unwrap().is_err());
    }
}
