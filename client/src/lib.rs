//! A Rust client of Retina's query contract (`protocol/schema/retina.capnp`).
//!
//! - `calls`: the contract's calls as async functions on a glommio executor ([`coordinator`],
//!   [`begin`], [`plan`], [`bitmaps`], [`write_buffer`], [`end`] ...), and [`read`] /
//!   [`read_at`], which read a whole table at a snapshot with VFoR.
//! - [`Connection`]: the same calls from any thread or async runtime; its thread renews the
//!   leases of the queries it began.
//! - `types`: what the calls return, owned; `error`: [`ClientError`] and the node's typed
//!   [`Refusal`].
//!
//! The modules stack without a cycle: `types` and `error` import nothing of this crate,
//! `calls` imports them, `connection` imports all three.
//!
//! ```no_run
//! # async fn demo() -> Result<(), retina_client::ClientError> {
//! let conn = retina_client::Connection::connect("127.0.0.1:7400".parse().unwrap(), "")?;
//! let query = conn.begin().await?;
//! let plan = conn.plan(query.id, "public.orders").await?;
//! println!("{} files at snapshot {}", plan.files.len(), plan.snapshot);
//! conn.end(query.id).await?;
//! # Ok(()) }
//! ```

mod calls;
mod connection;
mod error;
mod types;

pub use calls::{
    MAX_REPLY_WORDS, begin, begin_and_plan, bitmap_words, bitmaps, bootstrap, coordinator, end,
    file_bitmap, file_bitmaps, plan, read, read_at, renew, scan_service, tables, write_buffer,
};
pub use connection::Connection;
pub use error::{ClientError, Refusal, describe};
pub use types::{
    BufferPart, PartData, PlanFile, QueryInfo, RowGroupBitmap, ScanPlan, TableInfo, TableRead,
};
