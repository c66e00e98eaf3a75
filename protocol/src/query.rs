//! Conversions between the storage engine's types and the Cap'n Proto query contract
//! (`schema/retina.capnp`): table schemas, typed errors and their texts.

use std::sync::Arc;

use retina_storage::{ColumnDef, ColumnType, StorageError, TableSchema};

use crate::retina_capnp::{self as rc, ColumnType as ct};

/// Row groups one `bitmaps` or `fileBitmaps` call may name, all files together (the contract's
/// bound; duplicates count).
pub const MAX_ROW_GROUPS_PER_CALL: u32 = 65_536;

/// Tables one `beginQueryAndPlan` may ask plans of (the contract's bound).
pub const MAX_PLANS_PER_BEGIN: u32 = 256;

/// The read and write buffers of each side of an RPC connection: a message is read in a few
/// receives and written in one send (unbuffered, each segment and its table is a receive or a
/// send of its own, and a round trip several wake-ups of each side's executor).
pub const RPC_BUFFER_BYTES: usize = 64 << 10;

/// Writes `schema` (with its catalog id) into a `Table` builder.
pub fn write_table(mut b: rc::table::Builder<'_>, id: u32, schema: &TableSchema) {
    b.set_id(id);
    b.set_name(schema.name());
    let mut cols = b.reborrow().init_columns(schema.columns().len() as u32);
    for (i, c) in schema.columns().iter().enumerate() {
        let mut col = cols.reborrow().get(i as u32);
        col.set_name(&c.name);
        col.set_nullable(c.nullable);
        let ty = match c.ty {
            ColumnType::Boolean => ct::Boolean,
            ColumnType::Int32 => ct::Int32,
            ColumnType::Int64 => ct::Int64,
            ColumnType::Float32 => ct::Float32,
            ColumnType::Float64 => ct::Float64,
            ColumnType::Decimal { precision, scale } => {
                col.set_precision(precision);
                col.set_scale(scale);
                ct::Decimal
            }
            ColumnType::Utf8 => ct::Utf8,
            ColumnType::Date => ct::Date,
            ColumnType::Timestamp => ct::Timestamp,
            ColumnType::Time => ct::Time,
            ColumnType::TimestampTz => ct::TimestampTz,
        };
        col.set_type(ty);
    }
    let mut pk = b.init_primary_key(schema.primary_key().len() as u32);
    for (i, &c) in schema.primary_key().iter().enumerate() {
        pk.set(i as u32, c as u16);
    }
}

/// Reads a `Table` back into its catalog id and schema.
pub fn read_table(r: rc::table::Reader<'_>) -> capnp::Result<(u32, Arc<TableSchema>)> {
    let mut columns = Vec::new();
    for c in r.get_columns()? {
        let ty = match c.get_type()? {
            ct::Boolean => ColumnType::Boolean,
            ct::Int32 => ColumnType::Int32,
            ct::Int64 => ColumnType::Int64,
            ct::Float32 => ColumnType::Float32,
            ct::Float64 => ColumnType::Float64,
            ct::Decimal => ColumnType::Decimal {
                precision: c.get_precision(),
                scale: c.get_scale(),
            },
            ct::Utf8 => ColumnType::Utf8,
            ct::Date => ColumnType::Date,
            ct::Timestamp => ColumnType::Timestamp,
            ct::Time => ColumnType::Time,
            ct::TimestampTz => ColumnType::TimestampTz,
        };
        columns.push(ColumnDef::new(
            c.get_name()?.to_str()?,
            ty,
            c.get_nullable(),
        ));
    }
    let names: Vec<String> = r
        .get_primary_key()?
        .iter()
        .map(|i| {
            columns
                .get(usize::from(i))
                .map(|c| c.name.clone())
                .ok_or_else(|| {
                    capnp::Error::failed(format!("primary-key column {i} is not a column"))
                })
        })
        .collect::<capnp::Result<_>>()?;
    let pk: Vec<&str> = names.iter().map(String::as_str).collect();
    let schema = TableSchema::new(r.get_name()?.to_str()?, columns, &pk)
        .map_err(|e| capnp::Error::failed(e.to_string()))?;
    Ok((r.get_id(), schema))
}

/// Writes a storage error as the contract's typed `Error`.
pub fn write_error(mut b: rc::error::Builder<'_>, e: &StorageError) {
    match e {
        StorageError::SnapshotTooOld { requested, oldest } => {
            let mut g = b.init_snapshot_too_old();
            g.set_requested(requested.get());
            g.set_oldest(oldest.get());
        }
        StorageError::SnapshotInFuture {
            requested,
            applied_through,
        } => {
            let mut g = b.init_snapshot_in_future();
            g.set_requested(requested.get());
            g.set_applied_through(applied_through.get());
        }
        StorageError::UnknownTable(id) => b.set_unknown_table(format!("table id {id}")),
        other => b.set_internal(other.to_string()),
    }
}

/// The text of the contract's `catchingUp` error: the node is at `snapshot` and queries wait for
/// `target` (0: not known yet, what the source held when the node started). The node's refusal
/// and the client's say the same.
pub fn catching_up(snapshot: u64, target: u64) -> String {
    let waits = match target {
        0 => "what the source held when it started".to_owned(),
        t => format!("snapshot {t}"),
    };
    format!(
        "the node is catching up with its source: it is at snapshot {snapshot}, queries wait \
         for {waits}; try again shortly"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use retina_storage::Timestamp;

    fn schema() -> Arc<TableSchema> {
        TableSchema::new(
            "public.orders",
            vec![
                ColumnDef::new("id", ColumnType::Int64, false),
                ColumnDef::new(
                    "amount",
                    ColumnType::Decimal {
                        precision: 12,
                        scale: 2,
                    },
                    true,
                ),
                ColumnDef::new("at", ColumnType::Timestamp, true),
                ColumnDef::new("note", ColumnType::Utf8, true),
                ColumnDef::new("opens", ColumnType::Time, true),
                ColumnDef::new("seen", ColumnType::TimestampTz, true),
            ],
            &["id"],
        )
        .unwrap()
    }

    #[test]
    fn a_scan_plan_round_trips() {
        let mut message = capnp::message::Builder::new_default();
        {
            let mut result = message.init_root::<rc::scan_plan_result::Builder>();
            let mut plan = result.reborrow().init_ok();
            plan.set_snapshot(42);
            write_table(plan.reborrow().init_table(), 3, &schema());
            let mut files = plan.reborrow().init_files(1);
            let mut f = files.reborrow().get(0);
            f.set_file_id(7);
            f.set_path("tables/public.orders/0000000000000007.parquet");
            let mut owner = f.reborrow().init_owner();
            owner.set_shard(1);
            owner.set_address("127.0.0.1:7402");
            let mut rgs = f.init_row_groups(1);
            let mut rg = rgs.reborrow().get(0);
            rg.set_rows(65_536);
            rg.set_min_create_ts(2);
            rg.set_max_create_ts(40);
        }
        let mut bytes = Vec::new();
        capnp::serialize::write_message(&mut bytes, &message).unwrap();
        let reader = capnp::serialize::read_message(&mut &bytes[..], Default::default()).unwrap();
        let result = reader.get_root::<rc::scan_plan_result::Reader>().unwrap();
        let rc::scan_plan_result::Which::Ok(plan) = result.which().unwrap() else {
            panic!("an ok result");
        };
        let plan = plan.unwrap();
        assert_eq!(plan.get_snapshot(), 42);
        let (id, table) = read_table(plan.get_table().unwrap()).unwrap();
        assert_eq!(id, 3);
        assert_eq!(table.columns(), schema().columns());
        assert_eq!(table.primary_key(), &[0]);
        let f = plan.get_files().unwrap().get(0);
        assert_eq!(
            f.get_owner()
                .unwrap()
                .get_address()
                .unwrap()
                .to_str()
                .unwrap(),
            "127.0.0.1:7402"
        );
        assert_eq!(f.get_row_groups().unwrap().get(0).get_max_create_ts(), 40);
    }

    #[test]
    fn errors_are_typed() {
        let mut message = capnp::message::Builder::new_default();
        let e = StorageError::SnapshotTooOld {
            requested: Timestamp::new(5).unwrap(),
            oldest: Timestamp::new(9).unwrap(),
        };
        write_error(message.init_root::<rc::error::Builder>(), &e);
        let r = message.get_root_as_reader::<rc::error::Reader>().unwrap();
        match r.which().unwrap() {
            rc::error::Which::SnapshotTooOld(g) => {
                assert_eq!((g.get_requested(), g.get_oldest()), (5, 9));
            }
            _ => panic!("a typed snapshotTooOld"),
        }
    }
}
