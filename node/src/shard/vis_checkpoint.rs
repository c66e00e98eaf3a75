//! Long queries' visibility checkpoints on one shard, owned by the shard's core. When a query
//! has run longer than `long_query_ms`, the coordinator asks every shard to write the query's
//! bitmaps at its snapshot to `DATA_DIR/vis/` (about one bit per row, direct I/O, fsynced);
//! once every shard has, LWM moves past the query and memory GC goes on. A bitmap request that
//! GC left behind is answered from the file, loaded once. The files go when the query ends,
//! and at startup (no query survives a restart).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use retina_storage::{Shard, Timestamp, VisibilityImage};

use crate::coordinator::QueryId;

/// Where the visibility checkpoints of `data_dir` live.
pub fn vis_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("vis")
}

struct Entry {
    snapshot: Timestamp,
    path: PathBuf,
    /// Loaded the first time memory GC had folded past the snapshot.
    image: Option<Rc<VisibilityImage>>,
}

/// One shard's visibility checkpoints, by query.
pub struct VisCheckpoints {
    dir: PathBuf,
    shard: u16,
    entries: HashMap<QueryId, Entry>,
}

impl VisCheckpoints {
    pub fn new(data_dir: &Path, shard: u16) -> Self {
        VisCheckpoints {
            dir: vis_dir(data_dir),
            shard,
            entries: HashMap::new(),
        }
    }

    /// Writes query `query`'s bitmaps at `snapshot` durably; the error says what failed.
    pub async fn write(
        &mut self,
        shard: &Shard,
        query: QueryId,
        snapshot: Timestamp,
    ) -> Result<(), String> {
        let path = self
            .dir
            .join(format!("q{query:016}-shard{}.vis", self.shard));
        let image = shard
            .visibility_image(snapshot)
            .map_err(|e| format!("the bitmaps at {snapshot}: {e}"))?;
        crate::durable::write_file(&path, &image.encode())
            .await
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        self.entries.insert(
            query,
            Entry {
                snapshot,
                path,
                image: None,
            },
        );
        Ok(())
    }

    /// The query ended: its file goes.
    pub fn remove(&mut self, query: QueryId) {
        if let Some(e) = self.entries.remove(&query)
            && let Err(err) = std::fs::remove_file(&e.path)
        {
            tracing::warn!("removing {}: {err}", e.path.display());
        }
    }

    /// The image of a checkpointed query reading at `snapshot`, loaded on first use; `None` if
    /// no such query has one (or its file cannot be read, which is logged: the query then
    /// gets "snapshot too old", never wrong rows).
    pub fn image(&mut self, snapshot: Timestamp) -> Option<Rc<VisibilityImage>> {
        let entry = self.entries.values_mut().find(|e| e.snapshot == snapshot)?;
        if entry.image.is_none() {
            // Read with a plain read: a rare, small load, and glommio's DMA reads need the
            // disk probe glommio runs at start (see ops/README.md).
            let loaded = std::fs::read(&entry.path)
                .map_err(|e| e.to_string())
                .and_then(|b| VisibilityImage::decode(&b).map_err(|e| e.to_string()));
            match loaded {
                Ok(image) if image.snapshot == snapshot => entry.image = Some(Rc::new(image)),
                Ok(image) => {
                    tracing::error!(
                        "{} holds snapshot {}, expected {snapshot}",
                        entry.path.display(),
                        image.snapshot
                    );
                    return None;
                }
                Err(e) => {
                    tracing::error!("loading {}: {e}", entry.path.display());
                    return None;
                }
            }
        }
        entry.image.clone()
    }

    /// Bytes of the images loaded.
    pub fn memory_bytes(&self) -> usize {
        self.entries
            .values()
            .filter_map(|e| e.image.as_ref().map(|i| i.memory_bytes()))
            .sum()
    }
}
