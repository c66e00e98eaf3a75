//! Routing: which shard owns a row. `shard = hash(table, primary-key bytes) % shards`, with a
//! hash fixed by this file (FNV-1a, 64 bit), so routing never changes between builds or
//! restarts. The sink routes every row with it; a shard given its owner
//! ([`crate::Shard::set_owner`]) refuses a key that routes to another shard.

use crate::key::encode_key;
use crate::schema::TableSchema;
use crate::value::RowRef;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The stable routing hash of a table name and encoded primary key.
pub fn key_hash(table: &str, key: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    for &b in table.as_bytes().iter().chain(&[0xFF]).chain(key) {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    // FNV's low bits mix poorly; fold the high half in before the modulo.
    h ^ (h >> 32)
}

/// The shard, of `shards`, that owns the encoded primary key `key` of `table`.
pub fn shard_for_key(table: &str, key: &[u8], shards: u16) -> u16 {
    (key_hash(table, key) % u64::from(shards)) as u16
}

/// The shard, of `shards`, that owns `row`'s key (its key values checked against `schema`).
/// `scratch` is reused for the key bytes.
pub fn shard_of<R: RowRef + ?Sized>(
    schema: &TableSchema,
    row: &R,
    shards: u16,
    scratch: &mut Vec<u8>,
) -> u16 {
    scratch.clear();
    encode_key(schema, row, scratch);
    shard_for_key(schema.name(), scratch, shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fixed_and_spreads() {
        // Fixed values: changing the hash re-routes every existing table.
        assert_eq!(key_hash("t", &[0, 0, 0, 1]), 4_412_742_525_322_278_581);
        let mut counts = [0u32; 4];
        for k in 0u32..40_000 {
            counts[(key_hash("orderline", &k.to_be_bytes()) % 4) as usize] += 1;
        }
        for c in counts {
            assert!((9_000..11_000).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn a_key_goes_to_its_hash_modulo_the_shards() {
        let h = key_hash("t", &[0, 0, 0, 1]);
        for shards in [1u16, 2, 3, 8, 64] {
            assert_eq!(
                u64::from(shard_for_key("t", &[0, 0, 0, 1], shards)),
                h % u64::from(shards)
            );
        }
        assert_eq!(shard_for_key("t", &[0, 0, 0, 1], 1), 0);
    }
}
