//! What a restart finds in the data directory, and what it keeps: the shards restored from the
//! newest complete checkpoint, the lake objects it reads (and no others), and the scan plans'
//! file lists rebuilt from it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use retina_storage::{Shard, TableId, TableSchema, Timestamp};

use crate::catalog::Catalog;
use crate::coordinator::{Persisted, PlanFile, PlanFiles, checkpoint_dir};
use crate::error::NodeError;
use crate::settings::Settings;

/// What a restart finds in the data directory: each shard restored from the newest complete
/// checkpoint (none without one), every lake object that checkpoint does not read removed
/// (files written after it, or by a run that never checkpointed), and every other checkpoint
/// removed (incomplete ones).
pub fn recover(
    data_dir: &Path,
    catalog: &Catalog,
    settings: &Settings,
    persisted: &Persisted,
    lake: &Path,
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
            let image =
                retina_storage::ShardImage::decode(&bytes).map_err(|e| err(e.to_string()))?;
            if image.shard != id || image.applied_through != c.ts {
                return Err(err(format!(
                    "it holds shard {} at {}, the record says shard {id} at {}",
                    image.shard, image.applied_through, c.ts
                )));
            }
            let shard = Shard::from_image(settings.storage(), &schemas, image, c.id)
                .map_err(|e| err(e.to_string()))?;
            restored.push(shard);
        }
    }
    let keep: HashSet<PathBuf> = restored
        .iter()
        .flat_map(|s| s.objects())
        .map(|p| lake.join(p.as_ref()))
        .collect();
    let mut removed = 0usize;
    remove_unreferenced(&lake.join("tables"), &keep, &mut removed).map_err(|source| {
        NodeError::DataDir {
            path: lake.to_owned(),
            source,
        }
    })?;
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
    lake: &Path,
) -> Result<PlanFiles, NodeError> {
    let mut files = PlanFiles::default();
    for shard in recovered {
        for t in 0..catalog.tables().len() as TableId {
            let schema = catalog.get(t).expect("a catalog table");
            for (file, row_groups) in shard.regular_files(t)? {
                let path = retina_storage::buffer::file_path(schema.name(), file);
                let bytes = std::fs::metadata(lake.join(path.as_ref()))
                    .map(|m| m.len())
                    .map_err(|source| NodeError::DataDir {
                        path: lake.join(path.as_ref()),
                        source,
                    })?;
                files.add(
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
                );
            }
        }
    }
    Ok(files)
}
