//! The lake: where the Parquet objects go, and (when it is remote) where checkpoints are kept
//! so that a node on a new machine can recover from them.
//!
//! - [`LakeSpec::Local`] (the default): `DATA_DIR/lake` on local disk. Objects are fsynced
//!   (with the folders above them) before a shard hears they were written; checkpoints live in
//!   `DATA_DIR/checkpoints/` only.
//! - [`LakeSpec::S3`]: `s3://BUCKET/PREFIX` through `object_store`'s S3 client, configured the
//!   standard way from the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//!   `AWS_REGION`, `AWS_ENDPOINT`/`AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP`, ...) with explicit
//!   options on top, and retries with backoff on throttling, 5xx and connection errors. A
//!   completed PUT is durable. Checkpoints are also written to `PREFIX/checkpoints/<id>/`
//!   (see [`checkpoint_object`]), with their record object last.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{BackoffConfig, ObjectStore, ObjectStoreExt, RetryConfig};

use crate::error::NodeError;

/// Where the lake is, as `--lake` names it.
#[derive(Clone, Default)]
pub enum LakeSpec {
    /// `DATA_DIR/lake` on local disk.
    #[default]
    Local,
    /// An S3 bucket or an S3-compatible store.
    S3 {
        bucket: String,
        /// The key prefix every object of the lake is under, without leading or trailing `/`
        /// (empty: the bucket's root).
        prefix: String,
        /// `object_store` S3 settings (`AmazonS3ConfigKey` names, such as `aws_endpoint` or
        /// `aws_access_key_id`) applied over the environment's; tests pass their server's
        /// here rather than in the process environment.
        options: Vec<(String, String)>,
    },
    /// A store the embedding application built, rooted at the lake, and the URL readers
    /// reach it at (tests wrap an S3 client in a fault-injecting store). It is treated as a
    /// remote lake: nothing is fsynced, and checkpoints are kept in it.
    Store {
        store: Arc<dyn ObjectStore>,
        url: String,
    },
}

impl fmt::Debug for LakeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // Options may hold credentials: only their names.
            LakeSpec::S3 { options, .. } => write!(
                f,
                "{self} (settings: {:?})",
                options.iter().map(|(k, _)| k).collect::<Vec<_>>()
            ),
            _ => write!(f, "{self}"),
        }
    }
}

impl PartialEq for LakeSpec {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (LakeSpec::Local, LakeSpec::Local) => true,
            (
                LakeSpec::S3 {
                    bucket,
                    prefix,
                    options,
                },
                LakeSpec::S3 {
                    bucket: b,
                    prefix: p,
                    options: o,
                },
            ) => bucket == b && prefix == p && options == o,
            (LakeSpec::Store { store, url }, LakeSpec::Store { store: s, url: u }) => {
                Arc::ptr_eq(store, s) && url == u
            }
            _ => false,
        }
    }
}

impl LakeSpec {
    /// `s3://BUCKET[/PREFIX]` with `options` over the environment's settings.
    pub fn s3<K: Into<String>, V: Into<String>>(
        url: &str,
        options: impl IntoIterator<Item = (K, V)>,
    ) -> Result<LakeSpec, String> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| {
            format!(
                "--lake `{url}`: only s3://BUCKET/PREFIX is supported (leave --lake out for \
                 DATA_DIR/lake on local disk)"
            )
        })?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(format!(
                "--lake `{url}` names no bucket: use s3://BUCKET/PREFIX"
            ));
        }
        if !bucket
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        {
            return Err(format!(
                "--lake `{url}`: `{bucket}` is not a valid bucket name (lower-case letters, \
                 digits, `-` and `.`)"
            ));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|p| p == "." || p == "..")
            || prefix.contains("//")
            || ObjectPath::parse(prefix).is_err()
        {
            return Err(format!(
                "--lake `{url}`: `{prefix}` is not a valid key prefix"
            ));
        }
        let options = options
            .into_iter()
            .map(|(k, v)| (k.into(), v.into()))
            .collect::<Vec<(String, String)>>();
        for (k, _) in &options {
            AmazonS3ConfigKey::from_str(k)
                .map_err(|_| format!("--lake `{url}`: unknown S3 setting `{k}`"))?;
        }
        Ok(LakeSpec::S3 {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            options,
        })
    }

    /// Whether the lake is elsewhere than this machine's disk.
    pub fn is_remote(&self) -> bool {
        !matches!(self, LakeSpec::Local)
    }
}

impl FromStr for LakeSpec {
    type Err = String;

    /// `s3://BUCKET/PREFIX`, configured from the environment; `local` is `DATA_DIR/lake`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "local" {
            return Ok(LakeSpec::Local);
        }
        LakeSpec::s3(s, std::iter::empty::<(String, String)>())
    }
}

impl fmt::Display for LakeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LakeSpec::Local => write!(f, "DATA_DIR/lake"),
            LakeSpec::S3 { bucket, prefix, .. } if prefix.is_empty() => {
                write!(f, "s3://{bucket}/")
            }
            LakeSpec::S3 { bucket, prefix, .. } => write!(f, "s3://{bucket}/{prefix}/"),
            LakeSpec::Store { url, .. } => write!(f, "{url}"),
        }
    }
}

/// Retries of S3 requests: on throttling (429, 503 SlowDown), other 5xx and connection
/// errors, with exponential backoff from 100 ms to 15 s, for at most 2 minutes or 10 retries
/// per request. A request that still fails fails its job (which the shard retries later) or,
/// for a checkpoint, that checkpoint.
pub fn retry_config() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(15),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: Duration::from_secs(120),
    }
}

/// An S3 client of `bucket` (not prefixed): the environment's settings, then `options`, and
/// [`retry_config`].
pub fn s3_bucket_store(
    bucket: &str,
    options: &[(String, String)],
) -> Result<object_store::aws::AmazonS3, String> {
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_retry(retry_config());
    for (k, v) in options {
        let key =
            AmazonS3ConfigKey::from_str(k).map_err(|_| format!("unknown S3 setting `{k}`"))?;
        builder = builder.with_config(key, v);
    }
    builder.build().map_err(|e| e.to_string())
}

/// An S3 client rooted at `prefix` of `bucket` ([`s3_bucket_store`] under a [`PrefixStore`]).
pub fn s3_lake_store(
    bucket: &str,
    prefix: &str,
    options: &[(String, String)],
) -> Result<Arc<dyn ObjectStore>, String> {
    let s3 = s3_bucket_store(bucket, options)?;
    Ok(if prefix.is_empty() {
        Arc::new(s3)
    } else {
        Arc::new(PrefixStore::new(s3, prefix))
    })
}

/// The lake a node writes: its store (rooted at the lake), the URL scan plans give readers,
/// and the local folder when it is on this machine.
#[derive(Clone)]
pub struct Lake {
    pub store: Arc<dyn ObjectStore>,
    /// `file:///abs/DATA_DIR/lake/` or `s3://BUCKET/PREFIX/`.
    pub url: String,
    /// The lake's folder when it is local (objects are fsynced there); `None` when remote.
    pub local: Option<PathBuf>,
}

impl Lake {
    pub fn is_remote(&self) -> bool {
        self.local.is_none()
    }

    /// Opens the lake `spec` names for a node on `data_dir`. A remote lake is checked once
    /// (a listing of its prefix on `rt`), so that a missing bucket, bad credentials or an
    /// unreachable endpoint fail the start with a message naming the lake.
    pub fn open(
        spec: &LakeSpec,
        data_dir: &Path,
        rt: &tokio::runtime::Runtime,
    ) -> Result<Lake, NodeError> {
        match spec {
            LakeSpec::Local => {
                let dir = data_dir.join("lake");
                let store = retina_storage::file::local_store(&dir)?;
                let url = crate::datadir::lake_url(&dir)?;
                Ok(Lake {
                    store,
                    url,
                    local: Some(dir),
                })
            }
            LakeSpec::S3 {
                bucket,
                prefix,
                options,
            } => {
                let err = |reason: String| NodeError::Lake {
                    lake: spec.to_string(),
                    reason,
                };
                let store = s3_lake_store(bucket, prefix, options).map_err(err)?;
                let probe = store.clone();
                let listed = rt.block_on(async move {
                    tokio::time::timeout(
                        Duration::from_secs(60),
                        probe.list_with_delimiter(Some(&ObjectPath::from("checkpoints"))),
                    )
                    .await
                });
                let no_key = std::env::var_os("AWS_ACCESS_KEY_ID").is_none()
                    && !options
                        .iter()
                        .any(|(k, _)| k == "aws_access_key_id" || k == "access_key_id");
                match listed {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) if no_key => {
                        return Err(err(format!(
                            "it cannot be listed, and no credentials are set (no \
                             AWS_ACCESS_KEY_ID, so the client asked instance metadata): {e}"
                        )));
                    }
                    Ok(Err(e)) => {
                        return Err(err(format!(
                            "it cannot be listed: {e} (is the bucket there, and are \
                             AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_REGION and \
                             AWS_ENDPOINT right?)"
                        )));
                    }
                    Err(_) => {
                        return Err(err(
                            "no answer within 60 s (check AWS_ENDPOINT and the credentials: \
                             without AWS_ACCESS_KEY_ID the client asks instance metadata)"
                                .into(),
                        ));
                    }
                }
                Ok(Lake {
                    store,
                    url: spec.to_string(),
                    local: None,
                })
            }
            LakeSpec::Store { store, url } => Ok(Lake {
                store: store.clone(),
                url: url.clone(),
                local: None,
            }),
        }
    }
}

/// The object of checkpoint `id` named `name` in the lake: `checkpoints/<id>/<name>`, beside
/// `tables/`. A checkpoint is complete in the lake once its [`RECORD_OBJECT`] exists, which is
/// written after every other object of it.
pub fn checkpoint_object(id: u64, name: &str) -> ObjectPath {
    ObjectPath::from(format!("checkpoints/{id:016}/{name}"))
}

/// The catalog description (`catalog.txt`) the checkpoint's images were laid out with.
pub const CATALOG_OBJECT: &str = "catalog.txt";

/// The object that makes a checkpoint complete in the lake: the coordinator's record, in the
/// `coordinator.state` format.
pub const RECORD_OBJECT: &str = "record";

/// What the coordinator and the shards need to write checkpoints to a remote lake: the store
/// and the I/O thread's runtime, on which the uploads run (the actors await them from
/// glommio).
#[derive(Clone)]
pub struct LakeCheckpoints {
    pub store: Arc<dyn ObjectStore>,
    pub rt: tokio::runtime::Handle,
}

impl LakeCheckpoints {
    /// Puts checkpoint `id`'s object `name`.
    pub async fn put(&self, id: u64, name: &str, bytes: Bytes) -> Result<(), String> {
        put_on(&self.rt, &self.store, checkpoint_object(id, name), bytes).await
    }

    /// Deletes every object of checkpoint `id`, its record first.
    pub async fn delete(&self, id: u64) -> Result<(), String> {
        let store = self.store.clone();
        self.rt
            .spawn(async move { delete_checkpoint(store.as_ref(), id).await })
            .await
            .map_err(|e| e.to_string())?
    }
}

/// Puts `bytes` at `path` on the tokio runtime `rt` (object_store's S3 client needs one) and
/// waits for it from any executor.
pub async fn put_on(
    rt: &tokio::runtime::Handle,
    store: &Arc<dyn ObjectStore>,
    path: ObjectPath,
    bytes: Bytes,
) -> Result<(), String> {
    let store = store.clone();
    let what = path.to_string();
    rt.spawn(async move { retina_storage::file::put_object(store.as_ref(), &path, bytes).await })
        .await
        .map_err(|e| format!("putting {what}: {e}"))?
        .map_err(|e| format!("putting {what}: {e}"))
}

/// Deletes every object of checkpoint `id` from the lake, its record first (so that a
/// checkpoint half deleted is never taken for a complete one).
pub async fn delete_checkpoint(store: &dyn ObjectStore, id: u64) -> Result<(), String> {
    use futures::TryStreamExt;
    let record = checkpoint_object(id, RECORD_OBJECT);
    match store.delete(&record).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
        Err(e) => return Err(format!("deleting {record}: {e}")),
    }
    let prefix = ObjectPath::from(format!("checkpoints/{id:016}"));
    let objects: Vec<_> = store
        .list(Some(&prefix))
        .try_collect()
        .await
        .map_err(|e| format!("listing {prefix}: {e}"))?;
    for o in objects {
        match store.delete(&o.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(format!("deleting {}: {e}", o.location)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lake_urls_parse_or_say_what_is_wrong() {
        let s: LakeSpec = "s3://bucket/a/b/".parse().unwrap();
        assert_eq!(
            s,
            LakeSpec::S3 {
                bucket: "bucket".into(),
                prefix: "a/b".into(),
                options: vec![]
            }
        );
        assert_eq!(s.to_string(), "s3://bucket/a/b/");
        let s: LakeSpec = "s3://bucket".parse().unwrap();
        assert_eq!(s.to_string(), "s3://bucket/");
        assert!(s.is_remote());
        assert_eq!("local".parse::<LakeSpec>().unwrap(), LakeSpec::Local);
        let e = "gs://bucket/x".parse::<LakeSpec>().unwrap_err();
        assert!(e.contains("only s3://"), "{e}");
        let e = "s3:///x".parse::<LakeSpec>().unwrap_err();
        assert!(e.contains("names no bucket"), "{e}");
        let e = "s3://Bad_Bucket/x".parse::<LakeSpec>().unwrap_err();
        assert!(e.contains("not a valid bucket name"), "{e}");
        let e = "s3://b/x/../y".parse::<LakeSpec>().unwrap_err();
        assert!(e.contains("not a valid key prefix"), "{e}");
        let e = LakeSpec::s3("s3://b/x", [("aws_nonsense", "1")]).unwrap_err();
        assert!(e.contains("unknown S3 setting `aws_nonsense`"), "{e}");
        assert_eq!(
            checkpoint_object(3, RECORD_OBJECT).as_ref(),
            "checkpoints/0000000000000003/record"
        );
    }
}
