//! Checkpoint barriers as a sink puts them, whatever its source: every `checkpoint_interval`
//! after a group, one after everything submitted (unless one is there already), and a last one
//! when the run ends, waiting for one still on its way. A checkpoint that fails (an image the
//! lake refused during an outage, say) is put again: by the next barrier, and at the end by
//! the last one, which waits until one holding everything is complete.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::msg::SinkReport;
use super::options::SinkOptions;
use super::source::SourceState;
use crate::coordinator::SourceMark;
use crate::error::NodeError;
use crate::node::NodeHandle;

/// How long the last barrier of a run waits for a checkpoint holding everything to complete
/// (putting it again while the ones it puts fail).
pub(super) const LAST_CHECKPOINT_WAIT: Duration = Duration::from_secs(30);
/// How long it sleeps between looks at the checkpoint on its way.
const RETRY: Duration = Duration::from_millis(5);
/// The longest wait before a failed last checkpoint is put again.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Where and when the sink put its last checkpoint barrier.
pub(super) struct Barriers {
    /// Where the source stood at the last barrier that has not failed.
    at: SourceMark,
    /// Where it stood at the newest checkpoint known complete (at first: the one resumed from).
    complete_at: SourceMark,
    /// The checkpoint put last and where the source stood, until it completes or fails.
    pending: Option<(u64, SourceMark)>,
    last: Instant,
}

impl Barriers {
    /// Barriers of a run that resumed at `resume`.
    pub(super) fn new(resume: SourceMark) -> Self {
        Barriers {
            at: resume,
            complete_at: resume,
            pending: None,
            last: Instant::now(),
        }
    }

    /// Notes whether the checkpoint put last completed or failed; after a failure the next
    /// barrier puts it again.
    fn settle(&mut self, node: &NodeHandle) {
        let Some((id, mark)) = self.pending else {
            return;
        };
        let status = node.status();
        if status.checkpoint_id.load(Ordering::Acquire) >= id {
            self.complete_at = mark;
            self.pending = None;
        } else if status.checkpoint_failed_id.load(Ordering::Acquire) >= id {
            tracing::debug!("checkpoint {id} failed; the next barrier puts it again");
            self.at = self.complete_at;
            self.pending = None;
        }
    }

    /// Puts a barrier after a group if the checkpoint interval has passed since the last one;
    /// returns its checkpoint's id if it put one.
    pub(super) fn after_group(
        &mut self,
        node: &NodeHandle,
        options: &SinkOptions,
        submitted: SourceMark,
        state: impl FnOnce() -> SourceState,
        report: &mut SinkReport,
    ) -> Option<u64> {
        if options
            .checkpoint_interval
            .is_some_and(|every| self.last.elapsed() >= every)
        {
            return self.put(node, submitted, state, report);
        }
        None
    }

    /// Puts a barrier after everything submitted, taken at `submitted` with the sink's
    /// `state`, unless one is there already or one is still on its way; returns its
    /// checkpoint's id if it put one.
    pub(super) fn put(
        &mut self,
        node: &NodeHandle,
        submitted: SourceMark,
        state: impl FnOnce() -> SourceState,
        report: &mut SinkReport,
    ) -> Option<u64> {
        self.try_put(node, submitted, state, report)
            .unwrap_or_else(|e| {
                tracing::warn!("checkpoint barrier: {e}");
                None
            })
    }

    /// [`Self::put`], with the node's refusal (it stopped) as an error.
    fn try_put(
        &mut self,
        node: &NodeHandle,
        submitted: SourceMark,
        state: impl FnOnce() -> SourceState,
        report: &mut SinkReport,
    ) -> Result<Option<u64>, NodeError> {
        self.last = Instant::now();
        self.settle(node);
        if self.at == submitted {
            return Ok(None);
        }
        // One is still on its way: the next group tries again.
        let Some(id) = node.checkpoint(submitted, state().encode())? else {
            return Ok(None);
        };
        self.at = submitted;
        self.pending = Some((id, submitted));
        report.checkpoints += 1;
        Ok(Some(id))
    }

    /// A barrier after everything submitted, waiting for one still on its way to finish first
    /// and then for its own to complete, putting it again if it fails (while the node has no
    /// error, for `wait` at most); whether a checkpoint holding everything submitted is
    /// complete.
    pub(super) fn last(
        &mut self,
        node: &NodeHandle,
        submitted: SourceMark,
        mut state: impl FnMut() -> SourceState,
        report: &mut SinkReport,
        wait: Duration,
    ) -> bool {
        let start = Instant::now();
        let mut put = false;
        // After a failure (the lake refuses writes for a while, say), the next try waits.
        let mut backoff = RETRY;
        let mut next_try = start;
        loop {
            self.settle(node);
            if self.complete_at == submitted {
                return true;
            }
            if node.status().error().is_some() || start.elapsed() >= wait {
                break;
            }
            if self.at != submitted && Instant::now() >= next_try {
                if put {
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                next_try = Instant::now() + backoff;
                match self.try_put(node, submitted, &mut state, report) {
                    Ok(id) => put |= id.is_some(),
                    Err(e) => {
                        tracing::warn!("checkpoint barrier: {e}");
                        break;
                    }
                }
            }
            std::thread::sleep(RETRY);
        }
        tracing::warn!(
            "the last checkpoint barrier did not complete in {wait:?}: a restart replays from \
             checkpoint {}",
            node.status().checkpoint_id.load(Ordering::Acquire)
        );
        false
    }
}
