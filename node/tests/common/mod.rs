//! What the node's integration tests share.

use glommio::{LocalExecutorBuilder, Placement};

/// Runs `f` to completion on a glommio executor of its own (the client library's streams are
/// glommio's).
pub fn on_executor<T: Send + 'static, F: Future<Output = T> + 'static>(
    f: impl FnOnce() -> F + Send + 'static,
) -> T {
    LocalExecutorBuilder::new(Placement::Unbound)
        .io_memory(512 << 10)
        .spawn(f)
        .unwrap()
        .join()
        .unwrap()
}
