//! A real S3 server for tests: moto's (`moto_server`, from PyPI's `moto[server]`), started on a
//! free loopback port and killed when dropped. Tests pass its settings to the node and the
//! connector explicitly (never through the process environment, which parallel tests share).

use std::sync::Arc;

use object_store::ObjectStore;
use retina_node::lake::LakeSpec;

/// A running `moto_server` ([`retina_bench::moto::Moto`]), killed on drop, with the S3 clients
/// and lakes of the node that tests need.
pub struct Moto(retina_bench::moto::Moto);

impl std::ops::Deref for Moto {
    type Target = retina_bench::moto::Moto;

    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Moto {
    /// Starts `moto_server` and waits until it answers; `None` (after a note) where it is not
    /// installed outside CI.
    pub fn start() -> Option<Moto> {
        retina_bench::moto::Moto::start().map(Moto)
    }

    /// A lake at `s3://bucket/prefix` on this server.
    pub fn lake(&self, bucket: &str, prefix: &str) -> LakeSpec {
        LakeSpec::s3(&format!("s3://{bucket}/{prefix}"), self.options()).unwrap()
    }

    /// An S3 client of `bucket` on this server (not prefixed).
    pub fn bucket_store(&self, bucket: &str) -> Arc<dyn ObjectStore> {
        Arc::new(retina_node::lake::s3_bucket_store(bucket, &self.options()).unwrap())
    }
}

/// Every object key under `prefix` in `store`, sorted, listed on a runtime of its own (on a
/// thread of its own, so that callers inside another runtime may call it too).
pub fn keys(store: &Arc<dyn ObjectStore>, prefix: &str) -> Vec<String> {
    use futures::TryStreamExt;
    let store = store.clone();
    let prefix = object_store::path::Path::from(prefix);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut out: Vec<String> = rt
            .block_on(async move { store.list(Some(&prefix)).try_collect::<Vec<_>>().await })
            .unwrap()
            .into_iter()
            .map(|o| o.location.to_string())
            .collect();
        out.sort();
        out
    })
    .join()
    .unwrap()
}
