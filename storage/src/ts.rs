//! Timestamps, watermarks and the visibility rule: the one place that says which row version
//! a snapshot sees.
//!
//! Every mirror transaction gets a [`Timestamp`] from the coordinator. Timestamps are never 0 and
//! fit in 52 bits, because tile visibility packs a 12-bit row offset beside each delete timestamp.
//! [`Timestamp::GENESIS`] (1) is the initial state: bulk-loaded rows carry it as their create
//! timestamp, so the first replayed transaction gets 2 and a snapshot is always a valid timestamp.

use std::fmt;
use std::num::NonZeroU64;

use crate::error::StorageError;

/// A mirror transaction's timestamp, or a snapshot a query reads at. Never 0, at most 2^52 - 1.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(NonZeroU64);

impl Timestamp {
    /// The largest timestamp that fits beside a 12-bit offset in a visibility entry.
    pub const MAX_RAW: u64 = (1 << 52) - 1;
    /// The initial state of every table; bulk-loaded rows are created at it.
    pub const GENESIS: Timestamp = Timestamp(NonZeroU64::MIN);
    pub const MAX: Timestamp = Timestamp(NonZeroU64::new(Self::MAX_RAW).unwrap());

    /// A timestamp from its raw value; 0 and values above [`Self::MAX_RAW`] are errors.
    pub fn new(raw: u64) -> Result<Self, StorageError> {
        match NonZeroU64::new(raw) {
            Some(nz) if raw <= Self::MAX_RAW => Ok(Timestamp(nz)),
            _ => Err(StorageError::InvalidTimestamp { raw }),
        }
    }

    #[inline]
    pub const fn get(self) -> u64 {
        self.0.get()
    }

    /// The next timestamp, or an error once the 52-bit space is exhausted.
    pub fn next(self) -> Result<Self, StorageError> {
        Self::new(self.get() + 1)
    }

    /// The previous timestamp, saturating at [`Self::GENESIS`].
    pub fn prev_or_genesis(self) -> Self {
        Self::new(self.get() - 1).unwrap_or(Self::GENESIS)
    }
}

impl fmt::Debug for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ts{}", self.get())
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.get())
    }
}

/// High watermark: every transaction below it is replayed and visible. Queries read at
/// `HWM - 1`, writes run at or above it.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Hwm(Timestamp);

impl Hwm {
    /// Nothing but the genesis state is visible.
    pub const INITIAL: Hwm = Hwm(Timestamp(NonZeroU64::new(2).unwrap()));

    /// The HWM after every transaction up to and including `applied_through` is visible.
    pub fn after(applied_through: Timestamp) -> Result<Self, StorageError> {
        applied_through.next().map(Hwm)
    }

    pub fn get(self) -> Timestamp {
        self.0
    }

    /// The snapshot a query that begins now reads at.
    pub fn snapshot(self) -> Timestamp {
        self.0.prev_or_genesis()
    }

    /// Moves the watermark forward; a watermark never moves backwards.
    pub fn advance(&mut self, to: Hwm) -> Result<(), StorageError> {
        if to < *self {
            return Err(StorageError::WatermarkBackwards {
                kind: "HWM",
                from: self.0,
                to: to.0,
            });
        }
        *self = to;
        Ok(())
    }
}

/// Low watermark: every query reading below it has finished, so versions only visible below
/// it may be garbage collected.
#[derive(Copy, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Lwm(Timestamp);

impl Lwm {
    pub const INITIAL: Lwm = Lwm(Timestamp::GENESIS);

    pub fn new(ts: Timestamp) -> Self {
        Lwm(ts)
    }

    pub fn get(self) -> Timestamp {
        self.0
    }

    /// Moves the watermark forward; a watermark never moves backwards.
    pub fn advance(&mut self, to: Lwm) -> Result<(), StorageError> {
        if to < *self {
            return Err(StorageError::WatermarkBackwards {
                kind: "LWM",
                from: self.0,
                to: to.0,
            });
        }
        *self = to;
        Ok(())
    }

    /// The newest timestamp garbage collection may fold to: no running query reads below the
    /// LWM, and nothing at or above the HWM is committed yet.
    pub fn safe_gc_ts(self, hwm: Hwm) -> Timestamp {
        self.0.min(hwm.snapshot())
    }
}

/// The visibility rule of watermark MVCC, on raw timestamp values: a row version created at
/// `create_ts` and deleted at `delete_ts` (0 = never deleted) is visible to `snapshot` iff it
/// was created at or before the snapshot and not deleted at or before it.
///
/// Every visibility decision in the engine, scalar or vectorized, is this function.
#[inline(always)]
pub fn is_visible(create_ts: u64, deleted_at_snapshot: bool, snapshot: u64) -> bool {
    create_ts <= snapshot && !deleted_at_snapshot
}

/// Whether a delete at `delete_ts` has happened as seen from `snapshot`.
#[inline(always)]
pub fn is_deleted(delete_ts: u64, snapshot: u64) -> bool {
    delete_ts != 0 && delete_ts <= snapshot
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_never_zero_and_fit_in_52_bits() {
        assert!(Timestamp::new(0).is_err());
        assert!(Timestamp::new(1 << 52).is_err());
        assert_eq!(Timestamp::new(Timestamp::MAX_RAW).unwrap(), Timestamp::MAX);
        assert!(Timestamp::MAX.next().is_err());
    }

    #[test]
    fn watermarks_never_move_backwards() {
        let mut hwm = Hwm::after(Timestamp::new(10).unwrap()).unwrap();
        assert_eq!(hwm.snapshot().get(), 10);
        assert!(hwm.advance(Hwm::INITIAL).is_err());
        assert_eq!(hwm.snapshot().get(), 10);
        let mut lwm = Lwm::new(Timestamp::new(5).unwrap());
        assert!(lwm.advance(Lwm::INITIAL).is_err());
        assert_eq!(lwm.safe_gc_ts(hwm).get(), 5);
        assert_eq!(
            Lwm::new(Timestamp::new(50).unwrap()).safe_gc_ts(hwm).get(),
            10
        );
    }

    #[test]
    fn the_rule() {
        assert!(is_visible(3, is_deleted(0, 5), 5));
        assert!(!is_visible(6, is_deleted(0, 5), 5));
        assert!(!is_visible(3, is_deleted(5, 5), 5));
        assert!(is_visible(3, is_deleted(6, 5), 5));
    }
}
