//! The object-store I/O thread: flushes write-buffer blocks, combines them into files,
//! rewrites files for storage GC and deletes retired objects, on a tokio runtime (object_store
//! needs one, with its I/O and time drivers: the S3 client's sockets and retry backoff).
//! Shards send it [`IoRequest`]s on a bounded queue and hear back by message; at most
//! [`IO_PARALLEL`] requests are in hand at once, so the queue bounds the work waiting.
//! Checkpoint uploads to a remote lake bypass the queue: they are spawned on the same runtime
//! ([`crate::lake::put_on`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use object_store::{ObjectStore, ObjectStoreExt};
use retina_storage::buffer::{CombineJob, FlushJob};
use retina_storage::file;
use retina_storage::{RewriteJob, TableId, TableSchema};

use crate::shard::ShardMsg;
use crate::status::{IoKind, NodeStatus};

/// I/O requests that may wait for the I/O thread before a shard's timer tick finds it full.
pub const IO_QUEUE: usize = 1024;
/// Requests the I/O thread works on at once (encoding Parquet is CPU work, on tokio's
/// blocking threads).
pub const IO_PARALLEL: usize = 16;

/// Messages to the object-store I/O thread.
pub enum IoRequest {
    Flush {
        schema: Arc<TableSchema>,
        table: TableId,
        job: FlushJob,
        reply: flume::Sender<ShardMsg>,
    },
    Combine {
        schema: Arc<TableSchema>,
        table: TableId,
        job: CombineJob,
        reply: flume::Sender<ShardMsg>,
    },
    Delete {
        paths: Vec<object_store::path::Path>,
    },
    Rewrite {
        schema: Arc<TableSchema>,
        table: TableId,
        job: RewriteJob,
        reply: flume::Sender<ShardMsg>,
    },
}

impl IoRequest {
    fn kind(&self) -> IoKind {
        match self {
            IoRequest::Flush { .. } => IoKind::Flush,
            IoRequest::Combine { .. } => IoKind::Combine,
            IoRequest::Rewrite { .. } => IoKind::Rewrite,
            IoRequest::Delete { .. } => IoKind::Delete,
        }
    }
}

/// The runtime the I/O thread drives: current-thread, with I/O and timers enabled.
pub fn io_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// The I/O thread's body: drives `rt` and serves `rx` until every sender is gone. `lake` is
/// the lake's local folder, whose objects are fsynced; `None` for a remote lake, where a
/// completed PUT is durable.
pub fn io_main(
    rx: flume::Receiver<IoRequest>,
    rt: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    config: retina_storage::StorageConfig,
    lake: Option<Arc<std::path::Path>>,
    status: Arc<NodeStatus>,
) {
    let lake = lake.map(|root| Arc::new(LocalLake::new(root)));
    let handle = rt.handle().clone();
    rt.block_on(async move {
        // A counting semaphore: a request takes a slot, and gives it back when done.
        let (take, give_back) = flume::bounded::<()>(IO_PARALLEL);
        while let Ok(req) = rx.recv_async().await {
            if take.send_async(()).await.is_err() {
                break;
            }
            let give_back = give_back.clone();
            let store = store.clone();
            let config = config.clone();
            let lake = lake.clone();
            let status = status.clone();
            let handle = handle.clone();
            let kind = req.kind() as usize;
            status.io_in_flight[kind].fetch_add(1, Ordering::Relaxed);
            // Encoding Parquet is CPU work: keep it off the thread that polls I/O. The job's
            // requests still need the runtime (its sockets and timers), which this thread
            // drives while the job waits here.
            tokio::task::spawn_blocking(move || {
                handle.block_on(handle_io(req, store.as_ref(), &config, lake.as_deref()));
                status.io_in_flight[kind].fetch_sub(1, Ordering::Relaxed);
                let _ = give_back.try_recv();
            });
        }
        // Every job still in hand finishes while this thread drives their requests.
        for _ in 0..IO_PARALLEL {
            let _ = take.send_async(()).await;
        }
    });
}

/// The lake's local folder, whose objects are fsynced, and the folders under it whose own
/// entries are known durable: a folder the store creates for an object (a table's, its
/// `buffer/`) is synced into its parent once, not again for every object after. The lake's
/// folders are never removed while the node runs, so an entry once durable stays so.
struct LocalLake {
    root: Arc<std::path::Path>,
    durable_dirs: std::sync::Mutex<std::collections::HashSet<std::path::PathBuf>>,
}

impl LocalLake {
    fn new(root: Arc<std::path::Path>) -> Self {
        LocalLake {
            root,
            durable_dirs: Default::default(),
        }
    }

    /// Makes the object at `path` durable: its data, its entry in its folder, and the entries
    /// of the folders above it up to the lake that are not known durable yet (the store may
    /// have just created them). A checkpoint may refer to it once the shard hears it was
    /// written, and the checkpoint is fsynced.
    fn sync_object(&self, path: &object_store::path::Path) -> Result<(), String> {
        let file = self.root.join(path.as_ref());
        let err = |e: std::io::Error| format!("syncing {}: {e}", file.display());
        std::fs::File::open(&file)
            .and_then(|f| f.sync_all())
            .map_err(err)?;
        let Some(mut dir) = file.parent() else {
            return Ok(());
        };
        crate::durable::sync_dir(dir).map_err(err)?;
        // Up the tree while a folder's own entry is not known durable: sync its parent.
        while dir != &*self.root && !self.known_durable(dir) {
            let Some(parent) = dir.parent() else { break };
            crate::durable::sync_dir(parent).map_err(err)?;
            self.durable_dirs
                .lock()
                .expect("the durable folders")
                .insert(dir.to_path_buf());
            dir = parent;
        }
        Ok(())
    }

    fn known_durable(&self, dir: &std::path::Path) -> bool {
        self.durable_dirs
            .lock()
            .expect("the durable folders")
            .contains(dir)
    }
}

/// Makes a written object durable: on a local lake see [`LocalLake::sync_object`]; on a
/// remote lake (`None`) a completed PUT is durable already.
fn sync_object(lake: Option<&LocalLake>, path: &object_store::path::Path) -> Result<(), String> {
    lake.map_or(Ok(()), |lake| lake.sync_object(path))
}

async fn handle_io(
    req: IoRequest,
    store: &dyn ObjectStore,
    config: &retina_storage::StorageConfig,
    lake: Option<&LocalLake>,
) {
    match req {
        IoRequest::Flush {
            schema,
            table,
            job,
            reply,
        } => {
            let result = file::flush_block(store, &schema, config, &job)
                .await
                .map_err(|e| e.to_string())
                .and_then(|bytes| sync_object(lake, &job.path).map(|()| bytes));
            let _ = reply
                .send_async(ShardMsg::Flushed {
                    table,
                    block: job.block,
                    result,
                })
                .await;
        }
        IoRequest::Combine {
            schema,
            table,
            job,
            reply,
        } => {
            let result = file::combine_blocks(store, &schema, config, &job)
                .await
                .map_err(|e| e.to_string())
                .and_then(|f| sync_object(lake, &job.target).map(|()| f));
            let _ = reply
                .send_async(ShardMsg::Combined { table, job, result })
                .await;
        }
        IoRequest::Rewrite {
            schema,
            table,
            job,
            reply,
        } => {
            // A rewrite that keeps no row writes no object: nothing to sync.
            let result = file::rewrite_file(store, &schema, config, &job)
                .await
                .map_err(|e| e.to_string())
                .and_then(|f| {
                    if f.groups.is_empty() {
                        Ok(f)
                    } else {
                        sync_object(lake, &job.target).map(|()| f)
                    }
                });
            let _ = reply
                .send_async(ShardMsg::Rewritten { table, job, result })
                .await;
        }
        IoRequest::Delete { paths } => {
            for p in paths {
                if let Err(e) = store.delete(&p).await {
                    tracing::warn!("deleting retired object {p}: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_synced_into_its_parent_once_and_a_missing_object_fails_naming_it() {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        let lake = LocalLake::new(root.as_path().into());
        let put = |name: &str| {
            let file = root.join(name);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, b"object").unwrap();
            object_store::path::Path::from(name)
        };
        let known = |lake: &LocalLake| {
            let mut dirs: Vec<_> = lake
                .durable_dirs
                .lock()
                .unwrap()
                .iter()
                .map(|d| {
                    d.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            dirs.sort();
            dirs
        };
        // The first object makes every folder above it durable, up to the lake.
        sync_object(Some(&lake), &put("tables/t/buffer/a.parquet")).unwrap();
        assert_eq!(known(&lake), ["tables", "tables/t", "tables/t/buffer"]);
        // Objects after it sync their folder; only a new folder's entry is synced above it.
        sync_object(Some(&lake), &put("tables/t/buffer/b.parquet")).unwrap();
        sync_object(Some(&lake), &put("tables/t/f.parquet")).unwrap();
        assert_eq!(known(&lake), ["tables", "tables/t", "tables/t/buffer"]);
        sync_object(Some(&lake), &put("tables/u/buffer/a.parquet")).unwrap();
        assert_eq!(
            known(&lake),
            [
                "tables",
                "tables/t",
                "tables/t/buffer",
                "tables/u",
                "tables/u/buffer"
            ]
        );
        // An object at the lake's top syncs the lake's folder alone.
        sync_object(Some(&lake), &put("top.parquet")).unwrap();
        assert_eq!(known(&lake).len(), 5);
        // A remote lake syncs nothing; a missing local object is an error naming it.
        sync_object(None, &"nowhere.parquet".into()).unwrap();
        let err = sync_object(Some(&lake), &"tables/t/missing.parquet".into()).unwrap_err();
        assert!(err.contains("tables/t/missing.parquet"), "{err}");
    }
}
