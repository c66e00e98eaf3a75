//! Starting the sink actor and talking to it: [`spawn`] gives a [`SinkHandle`]; [`run_sink`]
//! is the same run on the caller's thread, for a source that ends.

use std::thread::JoinHandle;

use super::actor;
use super::msg::{SinkMsg, SinkReport};
use super::options::SinkOptions;
use crate::node::NodeHandle;

/// Messages a sink's inbox holds before a sender must wait (only [`SinkHandle::stop`] sends,
/// and never waits).
const INBOX_CAPACITY: usize = 4;

/// A running sink actor: its inbox and its thread.
///
/// The sink runs on a plain thread of its own (`retina-sink`), not on a core of the node: its
/// reads of a file or of stdin block. Dropping the handle does not stop it: it runs on to the
/// end of its source (never, for a followed file), as a detached thread would.
pub struct SinkHandle {
    inbox: flume::Sender<SinkMsg>,
    thread: JoinHandle<SinkReport>,
}

/// Starts a sink replaying `options.source` into `node` on a thread of its own; see
/// [`SinkHandle`].
pub fn spawn(node: NodeHandle, options: SinkOptions) -> std::io::Result<SinkHandle> {
    spawn_with(node, options, || {})
}

/// [`spawn`], calling `on_end` on the sink's thread once its run has ended (not if it
/// panicked), just before its report is ready for [`SinkHandle::join`].
pub fn spawn_with(
    node: NodeHandle,
    options: SinkOptions,
    on_end: impl FnOnce() + Send + 'static,
) -> std::io::Result<SinkHandle> {
    let (inbox, messages) = flume::bounded(INBOX_CAPACITY);
    let thread = std::thread::Builder::new()
        .name("retina-sink".into())
        .spawn(move || {
            let report = actor::run(&node, &options, &messages);
            on_end();
            report
        })?;
    Ok(SinkHandle { inbox, thread })
}

/// Runs a sink on this thread until its source ends or an error stops it, and says how it
/// ended: [`spawn`] and [`SinkHandle::join`] without a thread, for a source that ends (a
/// followed file never does, and nothing can stop this run).
pub fn run_sink(node: &NodeHandle, options: &SinkOptions) -> SinkReport {
    let (_, messages) = flume::bounded(1);
    actor::run(node, options, &messages)
}

impl SinkHandle {
    /// Asks the sink to stop before its next line ([`SinkMsg::Stop`]); does not wait. A sink
    /// blocked reading stdin sees it only once a line (or the end) comes.
    pub fn stop(&self) {
        // Full: a stop is already waiting. Disconnected: the run has ended.
        let _ = self.inbox.try_send(SinkMsg::Stop);
    }

    /// Whether the run has ended.
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the run to end and says how it ended (`Err`: the sink's thread panicked, with
    /// the panic's payload, as [`JoinHandle::join`] says).
    pub fn join(self) -> std::thread::Result<SinkReport> {
        self.thread.join()
    }

    /// [`SinkHandle::stop`], then [`SinkHandle::join`].
    pub fn stop_and_join(self) -> std::thread::Result<SinkReport> {
        self.stop();
        self.join()
    }
}
