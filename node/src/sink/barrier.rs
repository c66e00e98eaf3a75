//! Checkpoint barriers as a sink puts them, whatever its source: every `checkpoint_interval`
//! after a group, one after everything submitted (unless one is there already), and a last one
//! when the run ends, waiting for one still on its way.

use std::time::{Duration, Instant};

use super::msg::SinkReport;
use super::options::SinkOptions;
use super::source::SourceState;
use crate::coordinator::SourceMark;
use crate::node::NodeHandle;

/// How long the last barrier waits for an earlier one to finish.
const FINAL_WAIT: Duration = Duration::from_secs(10);
/// How long it sleeps between tries.
const RETRY: Duration = Duration::from_millis(5);

/// Where and when the sink put its last checkpoint barrier.
pub(super) struct Barriers {
    /// Where the source stood at the last one.
    at: SourceMark,
    last: Instant,
}

impl Barriers {
    /// Barriers of a run that resumed at `resume`.
    pub(super) fn new(resume: SourceMark) -> Self {
        Barriers {
            at: resume,
            last: Instant::now(),
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
        self.last = Instant::now();
        if self.at == submitted {
            return None;
        }
        match node.checkpoint(submitted, state().encode()) {
            Ok(Some(id)) => {
                self.at = submitted;
                report.checkpoints += 1;
                Some(id)
            }
            // One is still on its way; the next group tries again.
            Ok(None) => None,
            Err(e) => {
                tracing::warn!("checkpoint barrier: {e}");
                None
            }
        }
    }

    /// A barrier after everything submitted, waiting for one still on its way to finish first
    /// (while the node has no error); returns its checkpoint's id if it put one.
    pub(super) fn last(
        &mut self,
        node: &NodeHandle,
        submitted: SourceMark,
        mut state: impl FnMut() -> SourceState,
        report: &mut SinkReport,
    ) -> Option<u64> {
        let start = Instant::now();
        let mut put = None;
        while self.at != submitted
            && node.status().error().is_none()
            && start.elapsed() < FINAL_WAIT
        {
            put = self.put(node, submitted, &mut state, report).or(put);
            if self.at != submitted {
                std::thread::sleep(RETRY);
            }
        }
        put
    }
}
