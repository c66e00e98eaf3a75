//! The regular files of each table as scan plans list them: what the shards reported combining
//! and storage GC replacing, and which of them a query at a snapshot reads.

use std::collections::{BTreeMap, HashMap};

use retina_storage::file::RowGroupInfo;
use retina_storage::{FileId, TableId, Timestamp};

/// A regular file as scan plans list it.
#[derive(Clone, Debug)]
pub struct PlanFile {
    pub file: FileId,
    pub path: object_store::path::Path,
    pub bytes: u64,
    /// The shard that owns the file's visibility.
    pub shard: u16,
    pub row_groups: Vec<RowGroupInfo>,
    /// A file storage GC wrote serves snapshots from its rewrite's safe timestamp on.
    pub min_snapshot: Timestamp,
    /// Set once storage GC replaced the file: snapshots from here on read the replacement.
    pub superseded_from: Option<Timestamp>,
}

impl PlanFile {
    /// Whether a query at `snapshot` reads this file (and not its predecessor or successor).
    pub fn serves(&self, snapshot: Timestamp) -> bool {
        self.min_snapshot <= snapshot && self.superseded_from.is_none_or(|t| snapshot < t)
    }
}

/// Every table's regular files, by file id.
#[derive(Default, Debug)]
pub struct PlanFiles {
    tables: HashMap<TableId, BTreeMap<FileId, PlanFile>>,
}

impl PlanFiles {
    /// A shard combined (or, after a restart, holds) `file` of `table`: later plans list it.
    pub fn add(&mut self, table: TableId, file: PlanFile) {
        self.tables
            .entry(table)
            .or_default()
            .insert(file.file, file);
    }

    /// Storage GC replaced `old` with `new` (none when no row survived): plans at snapshots
    /// from `from` on list the new one instead.
    pub fn replace(&mut self, table: TableId, old: FileId, new: Option<PlanFile>, from: Timestamp) {
        let files = self.tables.entry(table).or_default();
        if let Some(f) = files.get_mut(&old) {
            f.superseded_from = Some(from);
        }
        if let Some(new) = new {
            files.insert(new.file, new);
        }
    }

    /// Shard `shard` starts again from a checkpoint: the files it lists from now on are the
    /// ones its new run reports (its restored image's, then those it combines).
    pub fn drop_shard(&mut self, shard: u16) {
        for files in self.tables.values_mut() {
            files.retain(|_, f| f.shard != shard);
        }
    }

    /// The files of `table` a query at `snapshot` reads.
    pub fn plan(&self, table: TableId, snapshot: Timestamp) -> Vec<PlanFile> {
        self.tables
            .get(&table)
            .map(|f| f.values().filter(|f| f.serves(snapshot)).cloned().collect())
            .unwrap_or_default()
    }

    /// Files storage GC replaced leave the plans once no query may read them (`oldest`: the
    /// oldest snapshot any running query reads).
    pub fn retire(&mut self, oldest: Timestamp) {
        for files in self.tables.values_mut() {
            files.retain(|_, f| f.superseded_from.is_none_or(|t| t > oldest));
        }
    }

    /// Panics unless every listed file is consistent: keyed by its own id, and superseded
    /// no earlier than the snapshot it starts serving at.
    pub fn check_invariants(&self) {
        for files in self.tables.values() {
            for (id, f) in files {
                assert_eq!(*id, f.file, "a plan file is listed under its own id");
                assert!(
                    f.superseded_from.is_none_or(|t| t >= f.min_snapshot),
                    "file {id} is superseded from {:?}, before it serves ({})",
                    f.superseded_from,
                    f.min_snapshot
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(v: u64) -> Timestamp {
        Timestamp::new(v).unwrap()
    }

    fn file(id: u64, min: u64) -> PlanFile {
        PlanFile {
            file: FileId(id),
            path: object_store::path::Path::from(format!("f{id}")),
            bytes: 1,
            shard: 0,
            row_groups: Vec::new(),
            min_snapshot: ts(min),
            superseded_from: None,
        }
    }

    #[test]
    fn a_replaced_file_serves_older_snapshots_until_no_query_reads_them() {
        let mut p = PlanFiles::default();
        p.add(0, file(1, 1));
        p.replace(0, FileId(1), Some(file(2, 10)), ts(10));
        p.check_invariants();
        let ids = |p: &PlanFiles, s| p.plan(0, ts(s)).iter().map(|f| f.file).collect::<Vec<_>>();
        assert_eq!(ids(&p, 9), [FileId(1)]);
        assert_eq!(ids(&p, 10), [FileId(2)]);
        assert!(p.plan(1, ts(10)).is_empty(), "another table lists nothing");
        p.retire(ts(9));
        assert_eq!(ids(&p, 9), [FileId(1)], "a query at 9 may still read it");
        p.retire(ts(10));
        assert!(ids(&p, 9).is_empty(), "gone once the oldest query reads 10");
        assert_eq!(ids(&p, 10), [FileId(2)]);
    }

    #[test]
    fn a_file_replaced_by_nothing_leaves_later_plans() {
        let mut p = PlanFiles::default();
        p.add(3, file(7, 1));
        p.replace(3, FileId(7), None, ts(5));
        assert_eq!(p.plan(3, ts(4)).len(), 1);
        assert!(p.plan(3, ts(5)).is_empty());
    }
}
