//! Durable local files, written with direct I/O on io_uring (glommio DMA files) from the core
//! that owns them: a temporary file written and fsynced, renamed over the target, and the
//! folder fsynced, so a reader after a crash finds the old file or the new one, whole.

use std::path::Path;

use futures::AsyncWriteExt;
use glommio::io::{DmaFile, DmaStreamWriterBuilder};

/// Bytes a DMA stream writer buffers before it writes.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Replaces `path` with `bytes` durably. Must run on a glommio executor.
pub async fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other(format!("{} has no folder", path.display())))?;
    let tmp = path.with_extension("tmp");
    let file = DmaFile::create(&tmp).await?;
    let mut w = DmaStreamWriterBuilder::new(file)
        .with_buffer_size(WRITE_BUFFER_BYTES.min(bytes.len().max(4096)))
        .build();
    w.write_all(bytes).await?;
    // Closing pads the last block, truncates to the real length and fsyncs.
    w.close().await?;
    glommio::io::rename(&tmp, path).await?;
    glommio::io::Directory::open(dir).await?.sync().await?;
    Ok(())
}

/// Makes the entries of folder `dir` durable (blocking; for code off the executors).
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let p = path.clone();
        glommio::LocalExecutorBuilder::default()
            .io_memory(512 << 10)
            .spawn(move || async move {
                let big: Vec<u8> = (0..3_000_001u32).map(|i| (i % 251) as u8).collect();
                write_file(&p, &big).await.unwrap();
                assert_eq!(std::fs::read(&p).unwrap(), big);
                write_file(&p, b"short").await.unwrap();
                assert_eq!(std::fs::read(&p).unwrap(), b"short");
                let err = write_file(Path::new("/nonexistent/dir/f"), b"x").await;
                assert!(err.is_err());
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(!dir.path().join("f.tmp").exists());
    }
}
