//! What a restart finds in the data directory, and what it keeps: the shards restored from the
//! newest complete checkpoint, the lake objects it reads (and no others), and the scan plans'
//! file lists rebuilt from it.
//!
//! With a remote lake, the lake holds every complete checkpoint too ([`crate::lake`]): a
//! checkpoint there is complete once its record object exists, and the newest complete one
//! is the one with the highest id. [`adopt_lake_checkpoint`] runs first: when the lake's
//! newest checkpoint is newer than the data directory's (a new machine with an empty data
//! directory, or a crash between the lake's record and the local state file), its images,
//! source state and catalog are copied into the data directory and its record becomes the
//! local one. Recovery then goes on as for a local lake.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use retina_storage::{Shard, TableId, TableSchema, Timestamp};

use crate::catalog::Catalog;
use crate::coordinator::{
    Persisted, PlanFile, PlanFiles, SOURCE_STATE_FILE, StateFile, checkpoint_dir,
};
use crate::error::NodeError;
use crate::lake::{CATALOG_OBJECT, Lake, RECORD_OBJECT, checkpoint_object, delete_checkpoint};
use crate::settings::Settings;

/// The newest complete checkpoint in a remote lake (the highest id with a record object) and
/// the persisted state its record holds.
pub async fn newest_lake_checkpoint(
    store: &dyn ObjectStore,
    lake: &str,
) -> Result<Option<Persisted>, NodeError> {
    let err = |reason: String| NodeError::Lake {
        lake: lake.to_owned(),
        reason,
    };
    let mut ids = lake_checkpoint_ids(store).await.map_err(err)?;
    ids.sort_unstable_by(|a, b| b.cmp(a));
    for id in ids {
        let path = checkpoint_object(id, RECORD_OBJECT);
        let bytes = match store.get(&path).await {
            Ok(r) => r
                .bytes()
                .await
                .map_err(|e| err(format!("reading {path}: {e}")))?,
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(err(format!("reading {path}: {e}"))),
        };
        let named = PathBuf::from(format!("{lake}{path}"));
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| err(format!("{path} is not UTF-8 text")))?;
        let p = StateFile::decode(&text, &named)?;
        match p.checkpoint {
            Some(c) if c.id == id => return Ok(Some(p)),
            _ => {
                return Err(err(format!(
                    "{path} does not hold checkpoint {id}'s record"
                )));
            }
        }
    }
    Ok(None)
}

/// The ids of the checkpoint folders in the lake (complete or not).
async fn lake_checkpoint_ids(store: &dyn ObjectStore) -> Result<Vec<u64>, String> {
    let listed = store
        .list_with_delimiter(Some(&ObjectPath::from("checkpoints")))
        .await
        .map_err(|e| format!("listing checkpoints/: {e}"))?;
    Ok(listed
        .common_prefixes
        .iter()
        .filter_map(|p| p.filename().and_then(|n| n.parse().ok()))
        .collect())
}

/// Makes the data directory's checkpoint the lake's newest complete one when that is newer
/// (see the module's notes); refuses a data directory whose checkpoint the lake does not hold
/// (it was written with another lake). Local lakes: nothing to do.
pub fn adopt_lake_checkpoint(
    data_dir: &Path,
    lake: &Lake,
    rt: &tokio::runtime::Runtime,
    persisted: &mut Persisted,
) -> Result<(), NodeError> {
    if !lake.is_remote() {
        return Ok(());
    }
    let err = |reason: String| NodeError::Lake {
        lake: lake.url.clone(),
        reason,
    };
    let store = lake.store.clone();
    let url = lake.url.clone();
    let in_lake = rt.block_on(async move { newest_lake_checkpoint(store.as_ref(), &url).await })?;
    let local = persisted.checkpoint;
    let newest = match (local, in_lake.and_then(|p| p.checkpoint.map(|c| (p, c)))) {
        (None, None) => return Ok(()),
        (Some(l), None) => {
            return Err(err(format!(
                "it holds no checkpoint, but {} has checkpoint {}: was the data directory                  written with another --lake?",
                data_dir.display(),
                l.id
            )));
        }
        (Some(l), Some((_, c))) if l.id > c.id || (l.id == c.id && l != c) => {
            return Err(err(format!(
                "its newest checkpoint is {} ({:?}), but {} has checkpoint {} ({:?}): was                  the data directory written with another --lake?",
                c.id,
                c,
                data_dir.display(),
                l.id,
                l
            )));
        }
        (Some(l), Some((_, c))) if l.id == c.id => return Ok(()),
        (_, Some(newest)) => newest,
    };
    let (lake_persisted, record) = newest;
    tracing::info!(
        "recovering from checkpoint {} of the lake {} (the data directory has {})",
        record.id,
        lake.url,
        local.map_or("none".to_owned(), |l| format!("checkpoint {}", l.id))
    );
    fetch_checkpoint(data_dir, lake, rt, persisted, lake_persisted.hwm, record)
}

/// Makes the data directory's checkpoint the one a cluster recorded, `cluster` (its state in
/// the metadata store, the commit point): fetched from the lake unless the data directory
/// holds it already. A checkpoint of the data directory that the cluster did not record (one
/// whose commit failed) is not used: it is removed with every other at the start.
pub fn adopt_cluster_checkpoint(
    data_dir: &Path,
    lake: &Lake,
    rt: &tokio::runtime::Runtime,
    persisted: &mut Persisted,
    cluster: Persisted,
) -> Result<(), NodeError> {
    let local = persisted.checkpoint;
    let hwm = persisted.hwm.max(cluster.hwm);
    // Shards that ran on other members wrote their images to the lake only.
    let images_missing = |record: &crate::coordinator::CheckpointRecord| {
        (0..record.shards).any(|n| {
            !checkpoint_dir(data_dir, record.id)
                .join(format!("shard-{n}.ckpt"))
                .exists()
        })
    };
    match cluster.checkpoint {
        Some(record) if local != Some(record) || images_missing(&record) => {
            tracing::info!(
                "recovering from checkpoint {} recorded by the cluster, from the lake {} (the \
                 data directory has {})",
                record.id,
                lake.url,
                local.map_or("none".to_owned(), |l| format!("checkpoint {}", l.id))
            );
            fetch_checkpoint(data_dir, lake, rt, persisted, hwm, record)
        }
        checkpoint => {
            let adopted = Persisted { hwm, checkpoint };
            if adopted != *persisted {
                crate::datadir::write_durably(
                    &data_dir.join("coordinator.state"),
                    &StateFile::encode(&adopted),
                )?;
                *persisted = adopted;
            }
            Ok(())
        }
    }
}

/// Fetches checkpoint `record`'s shard images, source state and catalog from the lake into
/// the data directory, and makes it the data directory's checkpoint (with HWM `hwm`).
fn fetch_checkpoint(
    data_dir: &Path,
    lake: &Lake,
    rt: &tokio::runtime::Runtime,
    persisted: &mut Persisted,
    hwm: retina_storage::Hwm,
    record: crate::coordinator::CheckpointRecord,
) -> Result<(), NodeError> {
    let err = |reason: String| NodeError::Lake {
        lake: lake.url.clone(),
        reason,
    };
    let dir = checkpoint_dir(data_dir, record.id);
    std::fs::create_dir_all(&dir).map_err(|source| NodeError::DataDir {
        path: dir.clone(),
        source,
    })?;
    let mut names: Vec<String> = (0..record.shards)
        .map(|n| format!("shard-{n}.ckpt"))
        .collect();
    names.push(SOURCE_STATE_FILE.to_owned());
    for name in names {
        let bytes = fetch(lake, rt, checkpoint_object(record.id, &name)).map_err(err)?;
        if let Some(bytes) = bytes {
            crate::datadir::write_durably(&dir.join(&name), &bytes)?;
        }
    }
    // The catalog the checkpoint's images were laid out with: the start compares it with
    // the one it was given.
    if let Some(bytes) =
        fetch(lake, rt, checkpoint_object(record.id, CATALOG_OBJECT)).map_err(err)?
    {
        crate::datadir::write_durably(&data_dir.join("catalog.txt"), &bytes)?;
    }
    let adopted = Persisted {
        hwm: persisted.hwm.max(hwm),
        checkpoint: Some(record),
    };
    crate::datadir::write_durably(
        &data_dir.join("coordinator.state"),
        &StateFile::encode(&adopted),
    )?;
    *persisted = adopted;
    Ok(())
}

/// The object at `path` of the lake (`None` if there is none), fetched on `rt`.
fn fetch(
    lake: &Lake,
    rt: &tokio::runtime::Runtime,
    path: ObjectPath,
) -> Result<Option<bytes::Bytes>, String> {
    let store = lake.store.clone();
    rt.block_on(async move {
        match store.get(&path).await {
            Ok(r) => r
                .bytes()
                .await
                .map(Some)
                .map_err(|e| format!("reading {path}: {e}")),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(format!("reading {path}: {e}")),
        }
    })
}

/// What a restart finds in the data directory: each shard restored from the newest complete
/// checkpoint (none without one), every lake object that checkpoint does not read removed
/// (files written after it, or by a run that never checkpointed), and every other checkpoint
/// removed (incomplete ones). In a cluster, objects and checkpoints of a later leadership
/// than `epoch` stay: a node deposed while it started must not delete what its successor
/// wrote (see [`crate::cluster`]).
pub fn recover(
    data_dir: &Path,
    catalog: &Catalog,
    settings: &Settings,
    persisted: &Persisted,
    lake: &Lake,
    rt: &tokio::runtime::Runtime,
    epoch: u64,
) -> Result<Vec<Shard>, NodeError> {
    let shards = settings.shard_count();
    let mut restored = Vec::new();
    if let Some(c) = persisted.checkpoint {
        if c.shards != shards {
            return Err(NodeError::Checkpoint {
                path: checkpoint_dir(data_dir, c.id),
                reason: format!(
                    "it was taken with {} shards, this node runs {shards}: start with --shards {}",
                    c.shards, c.shards
                ),
            });
        }
        let schemas: Vec<Arc<TableSchema>> = catalog.tables().to_vec();
        for id in 0..shards {
            let path = checkpoint_dir(data_dir, c.id).join(format!("shard-{id}.ckpt"));
            let err = |reason: String| NodeError::Checkpoint {
                path: path.clone(),
                reason,
            };
            let bytes = std::fs::read(&path).map_err(|e| err(e.to_string()))?;
            restored.push(restore_shard(&bytes, id, c.id, c.ts, settings, &schemas).map_err(err)?);
        }
    }
    let mut removed = 0usize;
    match &lake.local {
        Some(dir) => {
            let keep: HashSet<PathBuf> = restored
                .iter()
                .flat_map(|s| s.objects())
                .map(|p| dir.join(p.as_ref()))
                .collect();
            remove_unreferenced(&dir.join("tables"), &keep, &mut removed).map_err(|source| {
                NodeError::DataDir {
                    path: dir.to_owned(),
                    source,
                }
            })?;
        }
        None => {
            let keep: HashSet<ObjectPath> = restored.iter().flat_map(|s| s.objects()).collect();
            let store = lake.store.clone();
            let current = persisted.checkpoint.map(|c| c.id);
            removed = rt
                .block_on(
                    async move { clean_remote_lake(store.as_ref(), &keep, current, epoch).await },
                )
                .map_err(|reason| NodeError::Lake {
                    lake: lake.url.clone(),
                    reason,
                })?;
        }
    }
    if removed > 0 {
        tracing::info!("removed {removed} lake objects no checkpoint refers to");
    }
    // No query survives a restart, so neither does a visibility checkpoint.
    let vis = crate::shard::vis_checkpoint::vis_dir(data_dir);
    let _ = std::fs::remove_dir_all(&vis);
    std::fs::create_dir_all(&vis).map_err(|source| NodeError::DataDir {
        path: vis.clone(),
        source,
    })?;
    let checkpoints = data_dir.join("checkpoints");
    if let Ok(entries) = std::fs::read_dir(&checkpoints) {
        let current = persisted.checkpoint.map(|c| checkpoint_dir(data_dir, c.id));
        for e in entries.flatten() {
            if Some(e.path()) != current {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(restored)
}

/// Shard `id` from `bytes`, its image of checkpoint `checkpoint` taken at `ts`.
pub fn restore_shard(
    bytes: &[u8],
    id: u16,
    checkpoint: u64,
    ts: Timestamp,
    settings: &Settings,
    schemas: &[Arc<TableSchema>],
) -> Result<Shard, String> {
    let image = retina_storage::ShardImage::decode(bytes).map_err(|e| e.to_string())?;
    if image.shard != id || image.applied_through != ts {
        return Err(format!(
            "it holds shard {} at {}, the record says shard {id} at {ts}",
            image.shard, image.applied_through
        ));
    }
    Shard::from_image(settings.storage(), schemas, image, checkpoint).map_err(|e| e.to_string())
}

/// Shard `id` as no transaction left it: the catalog's tables, empty.
pub fn empty_shard(id: u16, settings: &Settings, catalog: &Catalog) -> Result<Shard, NodeError> {
    let mut s = Shard::new(id, settings.storage())?;
    for t in catalog.tables() {
        s.add_table(t.clone());
    }
    Ok(s)
}

/// In a remote lake, deletes every object under `tables/` that is not in `keep`, and every
/// checkpoint but `current` (incomplete ones, and older ones a crash left). Returns how many
/// table objects went.
async fn clean_remote_lake(
    store: &dyn ObjectStore,
    keep: &HashSet<ObjectPath>,
    current: Option<u64>,
    epoch: u64,
) -> Result<usize, String> {
    let objects: Vec<_> = store
        .list(Some(&ObjectPath::from("tables")))
        .try_collect()
        .await
        .map_err(|e| format!("listing tables/: {e}"))?;
    let mut removed = 0;
    for o in objects {
        let later = o
            .location
            .filename()
            .and_then(object_file_id)
            .is_some_and(|id| crate::cluster::file_epoch(id) > epoch);
        if !keep.contains(&o.location) && !later {
            match store.delete(&o.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => removed += 1,
                Err(e) => return Err(format!("deleting {}: {e}", o.location)),
            }
        }
    }
    for id in lake_checkpoint_ids(store).await? {
        if Some(id) != current && crate::cluster::checkpoint_epoch(id) <= epoch {
            delete_checkpoint(store, id).await?;
        }
    }
    Ok(removed)
}

/// The file id a table object is named after (`<id>.parquet`, `<id>-<block>.parquet` for a
/// write-buffer block, `<id>-<block>-<blocks>.parquet` for a segment; see
/// [`retina_storage::buffer::file_path`]).
fn object_file_id(name: &str) -> Option<retina_storage::FileId> {
    let hex = name.get(..16)?;
    u64::from_str_radix(hex, 16)
        .ok()
        .map(retina_storage::FileId)
}

fn remove_unreferenced(
    dir: &Path,
    keep: &HashSet<PathBuf>,
    removed: &mut usize,
) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        let path = e.path();
        if e.file_type()?.is_dir() {
            remove_unreferenced(&path, keep, removed)?;
        } else if !keep.contains(&path) {
            std::fs::remove_file(&path)?;
            *removed += 1;
        }
    }
    Ok(())
}

/// The regular files of the restored shards, as scan plans list them.
pub fn plan_files(
    recovered: &[Shard],
    catalog: &Catalog,
    lake: &Lake,
    rt: &tokio::runtime::Runtime,
) -> Result<PlanFiles, NodeError> {
    let mut files = PlanFiles::default();
    for shard in recovered {
        for (t, file) in shard_plan_files(shard, catalog, |path| object_size(lake, rt, path))? {
            files.add(t, file);
        }
    }
    Ok(files)
}

/// The regular files `shard` holds, by table, as scan plans list them (`size`: the size of
/// the lake object at a path).
pub fn shard_plan_files(
    shard: &Shard,
    catalog: &Catalog,
    mut size: impl FnMut(&ObjectPath) -> Result<u64, NodeError>,
) -> Result<Vec<(TableId, PlanFile)>, NodeError> {
    let mut files = Vec::new();
    for t in 0..catalog.tables().len() as TableId {
        let schema = catalog.get(t).expect("a catalog table");
        for (file, row_groups) in shard.regular_files(t)? {
            let path = retina_storage::buffer::file_path(schema.name(), file);
            let bytes = size(&path)?;
            files.push((
                t,
                PlanFile {
                    file,
                    path,
                    bytes,
                    shard: shard.id(),
                    row_groups,
                    min_snapshot: Timestamp::GENESIS,
                    superseded_from: None,
                },
            ));
        }
    }
    Ok(files)
}

/// The size of the lake object at `path`: from the file system for a local lake, else a HEAD
/// request.
fn object_size(
    lake: &Lake,
    rt: &tokio::runtime::Runtime,
    path: &ObjectPath,
) -> Result<u64, NodeError> {
    match &lake.local {
        Some(dir) => std::fs::metadata(dir.join(path.as_ref()))
            .map(|m| m.len())
            .map_err(|source| NodeError::DataDir {
                path: dir.join(path.as_ref()),
                source,
            }),
        None => {
            let store = lake.store.clone();
            let p = path.clone();
            rt.block_on(async move { store.head(&p).await })
                .map(|m| m.size)
                .map_err(|e| NodeError::Lake {
                    lake: lake.url.clone(),
                    reason: format!("{path}, which checkpoint reads: {e}"),
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use object_store::path::Path as ObjectPath;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
    use retina_storage::FileId;
    use retina_storage::buffer::{BlockId, block_path, file_path};

    use super::{clean_remote_lake, object_file_id};
    use crate::cluster::epoch_base;
    use crate::lake::{RECORD_OBJECT, checkpoint_object};

    #[test]
    fn objects_are_named_after_their_file() {
        let file = FileId::new(3, epoch_base(2) + 7);
        let block = BlockId { file, index: 4 };
        for path in [file_path("t", file), block_path("t", block)] {
            assert_eq!(
                object_file_id(path.filename().unwrap()),
                Some(file),
                "{path}"
            );
        }
        assert_eq!(object_file_id("notes.txt"), None);
    }

    /// A node starting at epoch 1 cleans what it does not read of epochs up to its own, and
    /// leaves a later leader's objects and checkpoints alone.
    #[test]
    fn cleaning_leaves_a_later_epoch_alone() {
        let store = InMemory::new();
        let own = FileId::new(0, epoch_base(1) + 5);
        let kept = FileId::new(0, epoch_base(1) + 6);
        let later = FileId::new(1, epoch_base(2) + 1);
        let objects = [
            file_path("t", own),
            file_path("t", kept),
            file_path("t", later),
            block_path(
                "t",
                BlockId {
                    file: later,
                    index: 0,
                },
            ),
            checkpoint_object(epoch_base(1) + 3, RECORD_OBJECT),
            checkpoint_object(epoch_base(1) + 4, RECORD_OBJECT),
            checkpoint_object(epoch_base(2) + 1, RECORD_OBJECT),
        ];
        let left = futures::executor::block_on(async {
            for o in &objects {
                store.put(o, PutPayload::from_static(b"x")).await.unwrap();
            }
            let keep: HashSet<ObjectPath> = [file_path("t", kept)].into();
            let removed = clean_remote_lake(&store, &keep, Some(epoch_base(1) + 3), 1)
                .await
                .unwrap();
            assert_eq!(removed, 1);
            let mut left: Vec<String> = store
                .list(None)
                .map_ok(|o| o.location.to_string())
                .try_collect()
                .await
                .unwrap();
            left.sort();
            left
        });
        let mut expected: Vec<String> = [1, 2, 3, 4, 6]
            .iter()
            .map(|&i| objects[i].to_string())
            .collect();
        expected.sort();
        assert_eq!(left, expected);
    }
}
