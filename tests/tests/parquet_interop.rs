//! A Parquet file written by storage is read back by the plain `parquet` reader (and by
//! pyarrow, another implementation), not through our code: the expected rows, the hidden
//! `_create_ts` column, its statistics and its encoding.

use std::fs::File;
use std::process::Command;

use arrow::datatypes::DataType;
use futures::executor::block_on;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::basic::Encoding;
use parquet::file::statistics::Statistics;
use retina_bench::ch::{OrderLines, orderline_schema};
use retina_storage::batch_rows;
use retina_storage::file::local_store;
use retina_storage::{CREATE_TS_COLUMN, RowOp, Shard, StorageConfig, TableOp, Timestamp, Value};

const ROWS_PER_TXN: usize = 13;

#[test]
fn combined_files_are_plain_parquet_with_create_ts() {
    let dir = tempfile::tempdir().unwrap();
    let store = local_store(dir.path()).unwrap();
    let config = StorageConfig {
        tile_rows: 256,
        block_rows: 512,
        row_group_rows: 1024,
        file_rows: 4096,
        zstd_level: 3,
    };
    let mut shard = Shard::new(0, config).unwrap();
    let schema = orderline_schema();
    let t = shard.add_table(schema.clone());
    let rows: Vec<Vec<Value>> = OrderLines::new(11, 3).take(4096 + 100).collect();
    for (i, chunk) in rows.chunks(ROWS_PER_TXN).enumerate() {
        let ops: Vec<_> = chunk
            .iter()
            .map(|r| TableOp {
                table: t,
                op: RowOp::Insert(r.clone()),
            })
            .collect();
        shard
            .apply(Timestamp::new(i as u64 + 2).unwrap(), &ops)
            .unwrap();
    }
    // Deletes live in memory, not in the file: the file keeps every row.
    let last = shard.applied_through().get();
    shard
        .apply(
            Timestamp::new(last + 1).unwrap(),
            &[TableOp {
                table: t,
                op: RowOp::Delete(rows[5].clone()),
            }],
        )
        .unwrap();
    block_on(shard.flush_and_combine(store.as_ref())).unwrap();

    let files: Vec<_> = std::fs::read_dir(dir.path().join("tables/orderline"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "parquet"))
        .collect();
    assert_eq!(files.len(), 1, "one combined file: {files:?}");
    let path = &files[0];

    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let arrow_schema = builder.schema().clone();
    let meta = builder.metadata().clone();
    let names: Vec<_> = arrow_schema
        .fields()
        .iter()
        .map(|f| f.name().as_str())
        .collect();
    assert_eq!(names.last(), Some(&CREATE_TS_COLUMN));
    assert_eq!(names.len(), schema.columns().len() + 1);
    assert_eq!(
        arrow_schema.field(names.len() - 1).data_type(),
        &DataType::Int64
    );
    assert_eq!(meta.num_row_groups(), 4);

    let ts_col = schema.create_ts_index();
    let mut expect_offset = 0usize;
    for rg in meta.row_groups() {
        let col = rg.column(ts_col);
        assert!(
            col.encodings().any(|e| e == Encoding::DELTA_BINARY_PACKED),
            "{:?}",
            col.encodings().collect::<Vec<_>>()
        );
        let Some(Statistics::Int64(s)) = col.statistics() else {
            panic!("no int64 statistics")
        };
        let n = rg.num_rows() as usize;
        assert_eq!(
            *s.min_opt().unwrap() as usize,
            expect_offset / ROWS_PER_TXN + 2
        );
        assert_eq!(
            *s.max_opt().unwrap() as usize,
            (expect_offset + n - 1) / ROWS_PER_TXN + 2
        );
        expect_offset += n;
    }

    let mut types: Vec<_> = schema.columns().iter().map(|c| c.ty).collect();
    types.push(retina_storage::ColumnType::Int64);
    let mut read = Vec::new();
    for batch in builder.build().unwrap() {
        read.extend(batch_rows(&batch.unwrap(), &types));
    }
    assert_eq!(read.len(), 4096);
    for (i, r) in read.iter().enumerate() {
        let mut expect = rows[i].clone();
        expect.push(Value::Int((i / ROWS_PER_TXN + 2) as i64));
        assert_eq!(r, &expect, "row {i}");
    }

    if retina_tests::pyarrow_available() {
        let script = r#"
import sys, pyarrow.parquet as pq
t = pq.read_table(sys.argv[1])
print(t.num_rows, t.column_names[-1], t.column("_create_ts").to_pylist()[-1],
      t.schema.field("ol_amount").type, sum(v.as_py() for v in t.column("ol_o_id")))
"#;
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let o_ids: i64 = rows[..4096]
            .iter()
            .map(|r| match r[0] {
                Value::Int(v) => v,
                _ => unreachable!(),
            })
            .sum();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!(
                "4096 _create_ts {} decimal128(6, 2) {o_ids}",
                4095 / ROWS_PER_TXN + 2
            )
        );
    } else {
        eprintln!("pyarrow is not installed here: skipped the second reader (CI runs it)");
    }
}
