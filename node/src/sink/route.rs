//! Routing: which shard owns a row. `shard = hash(table, primary-key bytes) % shards`, with a
//! hash fixed by this file (FNV-1a, 64 bit), so routing never changes between builds or
//! restarts. Only the sink routes; each shard asserts that the keys it gets are its own.

use retina_storage::TableSchema;
use retina_storage::key::encode_key;
use retina_storage::value::RowRef;

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

/// The shard that owns `row`'s key (its key values checked against `schema`). `scratch` is
/// reused for the key bytes.
pub fn shard_of<R: RowRef + ?Sized>(
    schema: &TableSchema,
    row: &R,
    shards: u16,
    scratch: &mut Vec<u8>,
) -> u16 {
    scratch.clear();
    encode_key(schema, row, scratch);
    (key_hash(schema.name(), scratch) % u64::from(shards)) as u16
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
}
