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
    key_hash_from(table_seed(table), key)
}

/// The routing hash's state after a table's name: the same for every key of the table, so
/// [`TableSchema`] keeps it ([`TableSchema::route_seed`]) and a row hashes its key alone.
pub fn table_seed(table: &str) -> u64 {
    fnv(FNV_OFFSET, table.as_bytes().iter().chain(&[0xFF]))
}

/// [`key_hash`] from a table's [`table_seed`].
fn key_hash_from(seed: u64, key: &[u8]) -> u64 {
    let h = fnv(seed, key);
    // FNV's low bits mix poorly; fold the high half in before the modulo.
    h ^ (h >> 32)
}

fn fnv<'a>(mut h: u64, bytes: impl IntoIterator<Item = &'a u8>) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// The shard, of `shards`, that owns the encoded primary key `key` of `table`.
pub fn shard_for_key(table: &str, key: &[u8], shards: u16) -> u16 {
    (key_hash(table, key) % u64::from(shards)) as u16
}

/// [`shard_for_key`] of a key of `schema`'s table.
pub fn shard_for_table_key(schema: &TableSchema, key: &[u8], shards: u16) -> u16 {
    (key_hash_from(schema.route_seed(), key) % u64::from(shards)) as u16
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
    shard_for_table_key(schema, scratch, shards)
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

    #[test]
    fn a_schema_routes_its_keys_as_its_name_does() {
        use crate::schema::{ColumnDef, ColumnType};
        let schema = TableSchema::new(
            "orderline",
            vec![ColumnDef::new("k", ColumnType::Int64, false)],
            &["k"],
        )
        .unwrap();
        for k in 0u64..1_000 {
            let key = k.to_be_bytes();
            for shards in [1u16, 2, 3, 16] {
                assert_eq!(
                    shard_for_table_key(&schema, &key, shards),
                    shard_for_key("orderline", &key, shards)
                );
            }
        }
        assert_ne!(
            schema.route_seed(),
            TableSchema::new(
                "t",
                vec![ColumnDef::new("k", ColumnType::Int64, false)],
                &["k"]
            )
            .unwrap()
            .route_seed()
        );
    }
}
