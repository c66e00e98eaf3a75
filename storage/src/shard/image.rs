//! Checkpoint images of a shard: [`Shard::checkpoint`] takes one, [`Shard::from_image`]
//! restores it.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{FileEntry, Shard, TableState};
use crate::buffer::WriteBuffer;
use crate::checkpoint::{FileImage, ShardImage, TableImage};
use crate::config::StorageConfig;
use crate::error::{Result, StorageError};
use crate::index::{PrimaryIndex, RowIdMap};
use crate::schema::TableSchema;
use crate::visibility::FileVisibility;

use super::plan::Plan;

impl Shard {
    /// The shard as of its applied timestamp, for checkpoint `id` (ids grow): what
    /// [`Self::from_image`] restores. The image holds each file's deleted rows at the applied
    /// timestamp only (older deletes are not told apart), since no query after a restart reads
    /// below it; the shard itself is not folded. Objects retired from now on stay until a later
    /// checkpoint is complete (see [`Self::take_deletable`]).
    pub fn checkpoint(&mut self, id: u64) -> Result<ShardImage> {
        assert!(id > self.last_checkpoint, "checkpoint ids grow");
        let at = self.applied_through;
        let mut tables = Vec::with_capacity(self.tables.len());
        for t in &self.tables {
            let mut files = Vec::with_capacity(t.files.len());
            for (&fid, f) in t.files.iter().filter(|(_, f)| f.superseded.is_none()) {
                let mut deleted = Vec::new();
                f.visibility
                    .bitmap_range(0, f.visibility.rows(), at, &mut deleted)?;
                files.push(FileImage {
                    id: fid,
                    rows: f.visibility.rows(),
                    deleted,
                    regular: f.regular.clone(),
                });
            }
            tables.push(TableImage {
                name: t.schema.name().to_owned(),
                keys: t
                    .index
                    .iter_latest()
                    .filter_map(|(k, r)| r.map(|r| (k.to_vec(), r)))
                    .collect(),
                extents: t.row_ids.iter().map(|(r, x)| (r, x.clone())).collect(),
                files,
                buffer: t.buffer.image(),
            });
        }
        self.last_checkpoint = id;
        Ok(ShardImage {
            shard: self.id,
            applied_through: at,
            next_file_seq: self.next_file_seq,
            tables,
        })
    }

    /// The shard a checkpoint image holds, with `schemas` as its tables in order (the
    /// catalog's, which must be the checkpoint's). `checkpoint` is the image's id.
    pub fn from_image(
        config: StorageConfig,
        schemas: &[Arc<TableSchema>],
        image: ShardImage,
        checkpoint: u64,
    ) -> Result<Self> {
        config.validate()?;
        let corrupt = |reason: String| StorageError::Corrupt {
            what: format!("the checkpoint of shard {}", image.shard),
            reason,
        };
        let names: Vec<&str> = image.tables.iter().map(|t| t.name.as_str()).collect();
        let want: Vec<&str> = schemas.iter().map(|s| s.name()).collect();
        if names != want {
            return Err(corrupt(format!(
                "it holds tables {names:?}, the schema has {want:?}; start with the schema it \
                 was taken with, or from an empty data directory"
            )));
        }
        let at = image.applied_through;
        let mut shard = Shard {
            id: image.shard,
            config,
            tables: Vec::with_capacity(schemas.len()),
            next_file_seq: image.next_file_seq,
            applied_through: at,
            last_checkpoint: checkpoint,
            owner: None,
            plan: Plan::default(),
        };
        for (t, schema) in image.tables.into_iter().zip(schemas) {
            let mut index = PrimaryIndex::new();
            for (k, r) in &t.keys {
                index.put(k, at, *r)?;
            }
            let mut row_ids = RowIdMap::new();
            for (first, x) in t.extents {
                row_ids.map(first, x);
            }
            let mut files = BTreeMap::new();
            for f in t.files {
                let visibility =
                    FileVisibility::from_bitmap(shard.config.tile_rows, f.rows, &f.deleted, at)?;
                files.insert(f.id, FileEntry::new(visibility, f.regular));
            }
            let buffer = WriteBuffer::from_image(schema.clone(), &shard.config, t.buffer)?;
            for vf in buffer.files() {
                if files
                    .get(&vf.id())
                    .is_none_or(|f| f.visibility.rows() != vf.rows())
                {
                    return Err(corrupt(format!(
                        "virtual file {} of `{}` has no visibility of its rows",
                        vf.id(),
                        schema.name()
                    )));
                }
            }
            shard.tables.push(TableState {
                schema: schema.clone(),
                index,
                row_ids,
                buffer,
                files,
                retired: Vec::new(),
            });
        }
        Ok(shard)
    }
}
