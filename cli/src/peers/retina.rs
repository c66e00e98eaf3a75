//! Retina as measured by `retina bench peers`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::record_batch::RecordBatch;
use futures::TryStreamExt;
use retina_bench::workload::Txn;
use retina_node::catalog::Catalog;
use retina_node::node::Node;
use retina_node::settings::Settings;

use super::target::{Reader, Target, dir_bytes, first_row_ints};
use crate::measure::local_node;

/// Retina: an embedded node; the queries go through the Cap'n Proto query path and the
/// DataFusion connector (`Retina::sql`).
pub(super) struct RetinaTarget {
    data_dir: std::path::PathBuf,
    node: Option<Node>,
    last: u64,
}

impl RetinaTarget {
    pub(super) fn start(
        dir: &Path,
        catalog: Arc<Catalog>,
        shards: Option<u16>,
    ) -> anyhow::Result<Self> {
        let mut settings = Settings::default();
        if let Some(shards) = shards {
            settings.shards = shards;
        }
        let node = local_node(dir.join("data"), catalog, settings, true)?;
        Ok(RetinaTarget {
            data_dir: dir.join("data"),
            node: Some(node),
            last: 0,
        })
    }

    fn node(&self) -> &Node {
        self.node.as_ref().expect("the node runs until dropped")
    }

    fn wait(&self) -> anyhow::Result<()> {
        let h = self.node().handle();
        anyhow::ensure!(
            h.wait_visible(self.last, Duration::from_secs(600)),
            "replay did not make transaction {} visible: {:?}",
            self.last,
            self.node().handle().status().error()
        );
        Ok(())
    }
}

impl Target for RetinaTarget {
    fn load(&mut self, txns: &[Txn]) -> anyhow::Result<()> {
        for group in txns.chunks(1024) {
            self.last = *self.node().handle().submit(group)?.end();
        }
        self.wait()
    }

    fn apply(&mut self, txns: Vec<Txn>) -> anyhow::Result<()> {
        self.last = *self.node().handle().submit(&txns)?.end();
        Ok(())
    }

    fn finish(&mut self) -> anyhow::Result<()> {
        self.wait()
    }

    fn reader(&self) -> anyhow::Result<Box<dyn Reader>> {
        let addr = self.node().coordinator_addr().expect("listening");
        // One worker per core, as Delta Lake's reader has: DataFusion runs a scan's partitions
        // in parallel only where the runtime has the threads.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let retina = runtime.block_on(async { retina_query::Retina::connect(addr, "") })?;
        Ok(Box::new(RetinaReader { runtime, retina }))
    }

    fn disk_bytes(&self) -> u64 {
        dir_bytes(&self.data_dir)
    }
}

impl Drop for RetinaTarget {
    fn drop(&mut self) {
        if let Some(node) = self.node.take() {
            node.shutdown();
        }
    }
}

struct RetinaReader {
    runtime: tokio::runtime::Runtime,
    retina: retina_query::Retina,
}

impl RetinaReader {
    /// One statement in a query of its own, the scan plans of the tables it names taken with
    /// the begin (one round trip), as a client of the connector that runs single statements
    /// would.
    fn collect(&mut self, sql: &str) -> anyhow::Result<Vec<RecordBatch>> {
        Ok(self
            .runtime
            .block_on(async { self.retina.sql(sql).await?.1.try_collect().await })?)
    }
}

impl Reader for RetinaReader {
    fn ints(&mut self, sql: &str) -> anyhow::Result<Vec<Option<i64>>> {
        first_row_ints(&self.collect(sql)?)
    }

    fn rows(&mut self, sql: &str) -> anyhow::Result<usize> {
        Ok(self.collect(sql)?.iter().map(|b| b.num_rows()).sum())
    }
}
