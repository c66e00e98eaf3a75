//! The data directory: made absolute, locked against a second node, and tied to the catalog
//! it was written with; and the `file://` URL of its lake.

use std::path::{Path, PathBuf};

use crate::catalog::Catalog;
use crate::error::NodeError;

/// Takes the data directory's exclusive lock (`DATA_DIR/lock`, holding the owner's pid), so
/// that a second node on the same directory is refused instead of corrupting it.
pub fn lock_data_dir(dir: &Path) -> Result<std::fs::File, NodeError> {
    use std::io::{Read, Seek, Write};
    let path = dir.join("lock");
    let io = |source| NodeError::DataDir {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut owner = String::new();
            let _ = file.read_to_string(&mut owner);
            return Err(NodeError::Locked {
                path: dir.to_owned(),
                owner: owner.trim().to_owned(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    writeln!(file, "pid {}", std::process::id()).map_err(io)?;
    Ok(file)
}

/// The catalog the data directory was written with (`DATA_DIR/catalog.txt`) must be the one
/// the node starts with: a checkpoint's rows are laid out by it. The first start records it.
pub fn check_catalog(dir: &Path, catalog: &Catalog, has_checkpoint: bool) -> Result<(), NodeError> {
    let path = dir.join("catalog.txt");
    let now = catalog.describe();
    match std::fs::read_to_string(&path) {
        Ok(before) if before == now => Ok(()),
        Ok(before) if has_checkpoint => {
            let changed: Vec<String> = now
                .lines()
                .zip(before.lines().chain(std::iter::repeat("(none)")))
                .filter(|(n, b)| n != b)
                .map(|(n, b)| format!("was `{b}`, is now `{n}`"))
                .chain(
                    before
                        .lines()
                        .skip(now.lines().count())
                        .map(|b| format!("`{b}` was removed")),
                )
                .collect();
            Err(NodeError::CatalogChanged {
                path: dir.to_owned(),
                changes: changed.join("; "),
            })
        }
        // No checkpoint reads the old layout: the new catalog replaces it.
        Ok(_) => write_durably(&path, now.as_bytes()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => write_durably(&path, now.as_bytes()),
        Err(source) => Err(NodeError::DataDir { path, source }),
    }
}

/// The lake the data directory's checkpoints read (`DATA_DIR/lake.txt`: `DATA_DIR/lake` or
/// `s3://BUCKET/PREFIX/`) must be the one the node starts with, once a checkpoint exists. A
/// data directory from before `lake.txt` had a local lake.
pub fn check_lake(dir: &Path, lake: &str, has_checkpoint: bool) -> Result<(), NodeError> {
    let path = dir.join("lake.txt");
    let before = match std::fs::read_to_string(&path) {
        Ok(b) => Some(b.trim().to_owned()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            has_checkpoint.then(|| crate::lake::LakeSpec::Local.to_string())
        }
        Err(source) => return Err(NodeError::DataDir { path, source }),
    };
    match before {
        Some(b) if b == lake => {
            if path.exists() {
                Ok(())
            } else {
                write_durably(&path, format!("{lake}\n").as_bytes())
            }
        }
        Some(b) if has_checkpoint => Err(NodeError::Lake {
            lake: lake.to_owned(),
            reason: format!(
                "{} was written with the lake {b} (its checkpoint reads that one): start with \
                 that lake, or from an empty data directory",
                dir.display()
            ),
        }),
        _ => write_durably(&path, format!("{lake}\n").as_bytes()),
    }
}

/// Replaces `path` with `bytes` with blocking calls: a temporary file, fsync, rename, fsync
/// of the folder.
pub fn write_durably(path: &Path, bytes: &[u8]) -> Result<(), NodeError> {
    let io = |source| NodeError::DataDir {
        path: path.to_owned(),
        source,
    };
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io)?;
    std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io)?;
    std::fs::rename(&tmp, path).map_err(io)?;
    crate::durable::sync_dir(path.parent().expect("a file in the data directory")).map_err(io)
}

/// `dir`, created if missing, as an absolute path (not resolving symbolic links, so the
/// path the user gave stays recognisable in messages).
pub fn absolute_dir(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::path::absolute(dir)
}

/// The `file://` URL of the lake directory, which scan plans give readers.
pub fn lake_url(lake: &Path) -> Result<String, NodeError> {
    let abs = lake.canonicalize().map_err(|source| NodeError::DataDir {
        path: lake.to_owned(),
        source,
    })?;
    let text = abs.to_str().ok_or_else(|| NodeError::DataDir {
        path: lake.to_owned(),
        source: std::io::Error::other("the data directory's path is not UTF-8"),
    })?;
    Ok(format!("file://{}/", text.trim_end_matches('/')))
}
