//! The actors' messages as frames: what crosses from a leader's shard queue to the host's
//! shard ([`down`], [`ShardMsg`] from a frame), and from the host's shard to the leader's
//! coordinator ([`up`], [`CoordMsg`] from a frame).

use retina_storage::Hwm;

use super::wire::{Dec, Enc, Frame, Kind};
use crate::coordinator::CoordMsg;
use crate::shard::{ShardMsg, Watermarks};

/// The frame of a shard message for a remote shard (`None`: a message only a local actor gets,
/// which never reaches a remote shard's queue).
pub fn down(msg: &ShardMsg) -> Option<(Kind, Vec<u8>)> {
    let e = Enc::default();
    Some(match msg {
        ShardMsg::Checkpoint { id, ts } => (Kind::Checkpoint, e.u64(*id).u64(ts.get()).0),
        ShardMsg::Watermarks(w) => (
            Kind::Watermarks,
            e.u64(w.hwm.snapshot().get())
                .u64(w.lwm.get())
                .u64(w.retain_lwm.get())
                .u64(w.checkpoint_id)
                .0,
        ),
        ShardMsg::VisCheckpoint { query, snapshot } => {
            (Kind::VisCheckpoint, e.u64(*query).u64(snapshot.get()).0)
        }
        ShardMsg::DropVisCheckpoint { query } => (Kind::DropVisCheckpoint, e.u64(*query).0),
        ShardMsg::QueryBegun {
            query,
            snapshot,
            secret,
        } => (
            Kind::QueryBegun,
            e.u64(*query).u64(snapshot.get()).u64(*secret).0,
        ),
        ShardMsg::QueryEnded { query } => (Kind::QueryEnded, e.u64(*query).0),
        ShardMsg::Stop => (Kind::Stop, Vec::new()),
        _ => return None,
    })
}

/// The shard message a leader's frame carries (an `Apply` takes the frame's aligned body as
/// it is).
pub fn shard_msg(frame: Frame) -> Result<ShardMsg, String> {
    let mut d = Dec(&frame.body);
    Ok(match frame.kind {
        Kind::Apply => return Ok(ShardMsg::Apply(frame.body)),
        Kind::Checkpoint => ShardMsg::Checkpoint {
            id: d.u64("a checkpoint id")?,
            ts: d.ts("a checkpoint's timestamp")?,
        },
        Kind::Watermarks => ShardMsg::Watermarks(Watermarks {
            hwm: Hwm::after(d.ts("HWM")?).map_err(|e| format!("HWM: {e}"))?,
            lwm: d.ts("LWM")?,
            retain_lwm: d.ts("the retained LWM")?,
            checkpoint_id: d.u64("the checkpoint id")?,
        }),
        Kind::VisCheckpoint => ShardMsg::VisCheckpoint {
            query: d.u64("a query")?,
            snapshot: d.ts("a snapshot")?,
        },
        Kind::DropVisCheckpoint => ShardMsg::DropVisCheckpoint {
            query: d.u64("a query")?,
        },
        Kind::QueryBegun => ShardMsg::QueryBegun {
            query: d.u64("a query")?,
            snapshot: d.ts("a snapshot")?,
            secret: d.u64("a secret")?,
        },
        Kind::QueryEnded => ShardMsg::QueryEnded {
            query: d.u64("a query")?,
        },
        Kind::Stop => ShardMsg::Stop,
        other => return Err(format!("a {other:?} frame is not for a shard")),
    })
}

/// The frame of a shard's message to the coordinator, with the shard it is about (`None`: a
/// message no shard sends).
pub fn up(msg: &CoordMsg) -> Option<(Kind, u16, Vec<u8>)> {
    let e = Enc::default();
    Some(match msg {
        CoordMsg::Applied { shard, ts } => (Kind::Applied, *shard, e.u64(ts.get()).0),
        CoordMsg::Failed { error } => (Kind::Failed, 0, e.str(error).0),
        CoordMsg::ShardFailed { shard, ts, error } => {
            (Kind::ShardFailed, *shard, e.u64(ts.get()).str(error).0)
        }
        CoordMsg::CheckpointDone { id, shard, ok } => (
            Kind::CheckpointDone,
            *shard,
            e.u64(*id).u64(u64::from(*ok)).0,
        ),
        CoordMsg::FileAdded { table, file } => (
            Kind::FileAdded,
            file.shard,
            e.u64(u64::from(*table)).file(file).0,
        ),
        CoordMsg::FileReplaced {
            table,
            old,
            new,
            from,
        } => {
            let e = e.u64(u64::from(*table)).u64(old.0).u64(from.get());
            let (shard, e) = match new {
                Some(f) => (f.shard, e.u64(1).file(f)),
                None => (0, e.u64(0)),
            };
            (Kind::FileReplaced, shard, e.0)
        }
        CoordMsg::VisCheckpointDone { query, shard, ok } => (
            Kind::VisCheckpointDone,
            *shard,
            e.u64(*query).u64(u64::from(*ok)).0,
        ),
        _ => return None,
    })
}

/// What a host's frame says to the leader.
pub enum Up {
    /// The host may take `n` more batches.
    Credit(u64),
    /// A message for the coordinator.
    Coord(CoordMsg),
}

/// The coordinator message (or credit) a host's frame carries. `shard` is the shard the
/// connection runs: a frame about another is refused.
pub fn coord_msg(frame: &Frame, shard: u16) -> Result<Up, String> {
    let mut d = Dec(&frame.body);
    let table = |d: &mut Dec| {
        u32::try_from(d.u64("a table")?).map_err(|_| "a table id is out of range".to_owned())
    };
    let msg = match frame.kind {
        Kind::Credit => return Ok(Up::Credit(d.u64("a credit")?)),
        Kind::Applied => CoordMsg::Applied {
            shard,
            ts: d.ts("an applied timestamp")?,
        },
        Kind::Failed => CoordMsg::Failed {
            error: d.str("an error")?,
        },
        Kind::ShardFailed => CoordMsg::ShardFailed {
            shard,
            ts: d.ts("a failed timestamp")?,
            error: d.str("an error")?,
        },
        Kind::CheckpointDone => CoordMsg::CheckpointDone {
            id: d.u64("a checkpoint id")?,
            shard,
            ok: d.u64("a checkpoint's outcome")? != 0,
        },
        Kind::FileAdded => CoordMsg::FileAdded {
            table: table(&mut d)?,
            file: own_file(d.file()?, shard)?,
        },
        Kind::FileReplaced => {
            let table = table(&mut d)?;
            let old = retina_storage::FileId(d.u64("the replaced file")?);
            let from = d.ts("the replacement's first snapshot")?;
            let new = match d.u64("whether a file replaces it")? {
                0 => None,
                _ => Some(own_file(d.file()?, shard)?),
            };
            CoordMsg::FileReplaced {
                table,
                old,
                new,
                from,
            }
        }
        Kind::VisCheckpointDone => CoordMsg::VisCheckpointDone {
            query: d.u64("a query")?,
            shard,
            ok: d.u64("a checkpoint's outcome")? != 0,
        },
        other => return Err(format!("a {other:?} frame is not for the coordinator")),
    };
    Ok(Up::Coord(msg))
}

/// A file a shard reports must be its own.
fn own_file(
    f: crate::coordinator::PlanFile,
    shard: u16,
) -> Result<crate::coordinator::PlanFile, String> {
    if f.shard == shard {
        Ok(f)
    } else {
        Err(format!(
            "file {} is shard {}'s, not this connection's shard {shard}",
            f.file, f.shard
        ))
    }
}
