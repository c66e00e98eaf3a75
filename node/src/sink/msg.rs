//! What goes into the sink actor (its inbox's messages) and what comes out of it (the report
//! of its run).

/// A message to a running sink ([`super::SinkHandle`]).
#[derive(Debug)]
pub enum SinkMsg {
    /// End the run before the next line is read, as the end of the source would: the
    /// transactions read whole are handed over (and checkpointed, with a checkpoint interval);
    /// one the stop cuts is not, and a restart reads it again.
    Stop,
}

/// A run's inbox, read without waiting: once a [`SinkMsg::Stop`] arrived it stays asked, and
/// once no sender is left it is not read again.
pub(super) struct Inbox<'a> {
    rx: &'a flume::Receiver<SinkMsg>,
    open: bool,
    stopping: bool,
}

impl<'a> Inbox<'a> {
    pub(super) fn new(rx: &'a flume::Receiver<SinkMsg>) -> Self {
        Inbox {
            rx,
            open: true,
            stopping: false,
        }
    }

    /// Whether a [`SinkMsg::Stop`] arrived (now or before).
    pub(super) fn stop_asked(&mut self) -> bool {
        if self.stopping {
            return true;
        }
        if !self.open {
            return false;
        }
        match self.rx.try_recv() {
            Ok(SinkMsg::Stop) => {
                self.stopping = true;
                true
            }
            Err(flume::TryRecvError::Empty) => false,
            Err(flume::TryRecvError::Disconnected) => {
                self.open = false;
                false
            }
        }
    }
}

/// How a sink run ended.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SinkReport {
    pub lines: u64,
    pub transactions: u64,
    pub dead_lettered: u64,
    pub duplicates_skipped: u64,
    /// The timestamp of the last transaction handed to the node.
    pub last_ts: Option<u64>,
    /// The error that stopped replay, if one did.
    pub stopped_by: Option<String>,
    /// Checkpoint barriers put into the shards' streams.
    pub checkpoints: u64,
    /// With `--on-error skip`, a shard refused a transaction (a duplicate key, a missing row):
    /// it is in the dead-letter file, and the node must restart from its checkpoint and run
    /// the sink again, which then skips it (the shards applied other transactions after it
    /// that may have read what it half wrote). Says which one.
    pub restart: Option<String>,
}
