//! Tile and file visibility against a map of delete timestamps, across random deletes, folds
//! and reads at random timestamps.

use std::collections::BTreeMap;

use proptest::prelude::*;
use retina_storage::{FileVisibility, StorageError, TileVisibility, Timestamp};

#[derive(Clone, Debug)]
enum Op {
    /// Delete `offset` at the current ts plus `advance` (0 keeps the timestamp: one txn
    /// deleting several rows); `back` tries an older timestamp instead.
    Delete {
        offset: u32,
        advance: u64,
        back: bool,
    },
    /// Fold at `current - lag`.
    Fold { lag: u64 },
    /// Read at `current - lag`.
    Read { lag: u64 },
}

fn op(rows: u32) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..rows + 8, 0u64..3, proptest::bool::weighted(0.05))
            .prop_map(|(offset, advance, back)| Op::Delete { offset, advance, back }),
        1 => (0u64..20).prop_map(|lag| Op::Fold { lag }),
        3 => (0u64..30).prop_map(|lag| Op::Read { lag }),
    ]
}

fn ts(v: u64) -> Timestamp {
    Timestamp::new(v).unwrap()
}

/// The model: offset -> delete ts, plus the fold point.
#[derive(Default)]
struct Model {
    deletes: BTreeMap<u32, u64>,
    folded: u64,
    last: u64,
}

impl Model {
    fn bitmap(&self, at: u64, words: usize) -> Vec<u64> {
        let mut out = vec![0u64; words];
        for (&o, &d) in &self.deletes {
            if d <= at {
                out[o as usize / 64] |= 1 << (o % 64);
            }
        }
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn tile_matches_the_model(
        rows in prop_oneof![Just(64u32), Just(128), Just(256), Just(4096)],
        ops in proptest::collection::vec(op(256), 1..400),
    ) {
        let mut tile = TileVisibility::new(rows).unwrap();
        let mut m = Model::default();
        let mut now = 1u64;
        for op in ops {
            match op {
                Op::Delete { offset, advance, back } => {
                    let at = if back { now.saturating_sub(1).max(1) } else { now + advance };
                    let res = tile.delete(offset, ts(at));
                    let expect_err = offset >= rows
                        || at < m.last
                        || at <= m.folded
                        || m.deletes.contains_key(&offset);
                    prop_assert_eq!(res.is_err(), expect_err, "delete {} at {}: {:?}", offset, at, res);
                    if !expect_err {
                        m.deletes.insert(offset, at);
                        m.last = at;
                    }
                    now = now.max(at);
                }
                Op::Fold { lag } => {
                    let at = now.saturating_sub(lag).max(1);
                    tile.fold(ts(at));
                    m.folded = m.folded.max(at);
                    // Folding frees the entries at or below the fold point.
                    let pending = m.deletes.values().filter(|&&d| d > m.folded).count();
                    prop_assert_eq!(tile.pending_entries(), pending);
                }
                Op::Read { lag } => {
                    let at = now.saturating_sub(lag).max(1);
                    let mut out = vec![0; tile.words()];
                    match tile.bitmap_at(ts(at), &mut out) {
                        Ok(()) => {
                            prop_assert!(at >= m.folded);
                            prop_assert_eq!(out, m.bitmap(at, tile.words()));
                        }
                        Err(StorageError::SnapshotTooOld { .. }) => prop_assert!(at < m.folded),
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
            }
        }
        prop_assert_eq!(tile.deleted_rows() as usize, m.deletes.len());
    }

    #[test]
    fn file_ranges_match_the_model(
        rows in 1u64..700,
        deletes in proptest::collection::vec((0u64..700, 0u64..3), 0..300),
        start_word in 0u64..12,
        len in 0u64..700,
        read_lag in 0u64..40,
    ) {
        let mut file = FileVisibility::new(128).unwrap();
        file.extend_to(rows);
        let mut model = BTreeMap::new();
        let mut now = 1;
        for (offset, adv) in deletes {
            now += adv;
            let res = file.delete(offset, ts(now));
            prop_assert_eq!(res.is_ok(), offset < rows && !model.contains_key(&offset));
            if res.is_ok() {
                model.insert(offset, now);
            }
        }
        let at = now.saturating_sub(read_lag).max(1);
        let start = start_word * 64;
        let mut out = Vec::new();
        let res = file.bitmap_range(start, len, ts(at), &mut out);
        if start + len > rows {
            prop_assert!(res.is_err());
        } else {
            res.unwrap();
            let mut expect = vec![0u64; len.div_ceil(64) as usize];
            for (&o, &d) in model.range(start..start + len) {
                if d <= at {
                    let i = o - start;
                    expect[(i / 64) as usize] |= 1 << (i % 64);
                }
            }
            prop_assert_eq!(out, expect);
        }
    }
}
