//! Dropping deleted rows from a tagged scan: [`LiveRowsExec`] reads each batch's file index
//! and row numbers (the scan's last two columns), takes the rows' bits from their file's
//! bitmap, and passes on the live rows without the two columns. One copy of the rows a batch
//! keeps, none of a batch without deleted rows; batches are not merged again (a `FilterExec`
//! would copy every row a second time to refill them).

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{AsArray, BooleanArray};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer};
use datafusion::arrow::compute::filter_record_batch;
use datafusion::arrow::datatypes::{Int64Type, SchemaRef, UInt32Type};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::projection::ProjectionMapping;
use datafusion::physical_expr::{Partitioning, PhysicalExpr};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

/// The live rows of a tagged scan: its column `at` is each row's file (an index into
/// `bitmaps`), column `at + 1` the row's number in that file; the output is the columns before
/// `at`, rows whose bit is set dropped.
#[derive(Debug)]
pub(crate) struct LiveRowsExec {
    input: Arc<dyn ExecutionPlan>,
    bitmaps: Arc<Vec<Vec<u64>>>,
    at: usize,
    cache: Arc<PlanProperties>,
}

impl LiveRowsExec {
    pub(crate) fn try_new(
        input: Arc<dyn ExecutionPlan>,
        bitmaps: Arc<Vec<Vec<u64>>>,
        at: usize,
    ) -> Result<LiveRowsExec> {
        let columns = input.schema().fields().len();
        if columns != at + 2 {
            return Err(DataFusionError::Internal(format!(
                "a tagged scan of {at} columns has {columns} columns, not {}",
                at + 2
            )));
        }
        let kept: Vec<usize> = (0..at).collect();
        let schema: SchemaRef = Arc::new(input.schema().project(&kept)?);
        let props = input.properties();
        // Rows keep their order, so the input's orderings of the kept columns hold.
        let mapping = ProjectionMapping::from_indices(&kept, &input.schema())?;
        let cache = Arc::new(PlanProperties::new(
            props.eq_properties.project(&mapping, schema),
            Partitioning::UnknownPartitioning(props.partitioning.partition_count()),
            props.emission_type,
            props.boundedness,
        ));
        Ok(LiveRowsExec {
            input,
            bitmaps,
            at,
            cache,
        })
    }
}

impl DisplayAs for LiveRowsExec {
    fn fmt_as(&self, _: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LiveRowsExec: files={}", self.bitmaps.len())
    }
}

impl ExecutionPlan for LiveRowsExec {
    fn name(&self) -> &str {
        "LiveRowsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn apply_expressions(
        &self,
        _: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return Err(DataFusionError::Internal(format!(
                "LiveRowsExec has one input, given {}",
                children.len()
            )));
        }
        Ok(Arc::new(LiveRowsExec::try_new(
            children.swap_remove(0),
            self.bitmaps.clone(),
            self.at,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let bitmaps = self.bitmaps.clone();
        let at = self.at;
        let kept: Vec<usize> = (0..at).collect();
        let input = self.input.execute(partition, context)?;
        let schema = self.cache.eq_properties.schema().clone();
        let live = input.map(move |batch| live_batch(&batch?, &bitmaps, &kept));
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, live)))
    }
}

/// `batch`'s live rows, without its two tag columns: the columns `kept` (every column before
/// the tags, which are at `kept.len()`).
fn live_batch(batch: &RecordBatch, bitmaps: &[Vec<u64>], kept: &[usize]) -> Result<RecordBatch> {
    let at = kept.len();
    let tag = |i: usize| {
        DataFusionError::Internal(format!(
            "column {i} of a tagged scan is {}",
            batch.column(i).data_type()
        ))
    };
    let files = batch
        .column(at)
        .as_primitive_opt::<UInt32Type>()
        .ok_or_else(|| tag(at))?;
    let rows = batch
        .column(at + 1)
        .as_primitive_opt::<Int64Type>()
        .ok_or_else(|| tag(at + 1))?;
    let live = live_rows(bitmaps, files.values(), rows.values());
    let data = batch.project(kept)?;
    if live.count_set_bits() == live.len() {
        return Ok(data);
    }
    Ok(filter_record_batch(&data, &BooleanArray::new(live, None))?)
}

/// Whether each row (`files[i]`, `rows[i]`) is live: its bit in its file's bitmap is clear.
/// A batch of consecutive rows of one file, which is what the Parquet reader gives, takes its
/// bits as they lie in the bitmap, 64 at a time; any other batch is looked up row by row.
pub(crate) fn live_rows(bitmaps: &[Vec<u64>], files: &[u32], rows: &[i64]) -> BooleanBuffer {
    let n = rows.len();
    if let (Some(&file), Some(&first)) = (files.first(), rows.first()) {
        let bitmap = &bitmaps[file as usize];
        let one_run = files.iter().all(|&f| f == file)
            && rows.iter().zip(first..).all(|(&r, expected)| r == expected);
        if one_run && first >= 0 && (first as u64 + n as u64).div_ceil(64) <= bitmap.len() as u64 {
            let first = first as usize;
            let words = &bitmap[first / 64..(first + n).div_ceil(64)];
            let deleted = BooleanBuffer::new(Buffer::from_slice_ref(words), first % 64, n);
            return !&deleted;
        }
    }
    BooleanBuffer::collect_bool(n, |i| {
        let r = rows[i] as u64;
        bitmaps[files[i] as usize]
            .get((r / 64) as usize)
            .is_none_or(|w| w >> (r % 64) & 1 == 0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_rows_are_the_clear_bits_of_each_rows_file() {
        let bitmaps = vec![
            vec![0b1011, 1 << 63 | 1, u64::MAX],
            vec![0, 1 << 2],
            vec![1 << 4],
        ];
        let expect = |files: &[u32], rows: &[i64]| -> Vec<bool> {
            files
                .iter()
                .zip(rows)
                .map(|(&f, &r)| {
                    let r = r as u64;
                    bitmaps[f as usize]
                        .get((r / 64) as usize)
                        .is_none_or(|w| w >> (r % 64) & 1 == 0)
                })
                .collect()
        };
        let check = |files: &[u32], rows: &[i64]| {
            let got: Vec<bool> = live_rows(&bitmaps, files, rows).iter().collect();
            assert_eq!(got, expect(files, rows), "{files:?} {rows:?}");
        };
        // Runs of one file, at every offset and length inside its bitmap.
        for first in 0..150i64 {
            for n in [0usize, 1, 2, 5, 63, 64, 65, 100] {
                let rows: Vec<i64> = (first..first + n as i64).collect();
                if rows.last().is_some_and(|&r| r >= 192) {
                    continue;
                }
                check(&vec![0; n], &rows);
            }
        }
        // A run past the end of a short bitmap, rows out of order, two files in one batch.
        check(&[2; 70], &(0..70).collect::<Vec<_>>());
        check(&[1, 1, 1], &[66, 2, 65]);
        check(&[0, 1, 1, 2], &[0, 66, 67, 4]);
    }

    #[test]
    fn a_batch_keeps_its_live_rows_without_the_tags() {
        use datafusion::arrow::array::{Int32Array, Int64Array, UInt32Array};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let schema = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Int32, false),
            Field::new("_file", DataType::UInt32, false),
            Field::new("_row", DataType::Int64, false),
        ]));
        let batch = |rows: Vec<i64>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![
                    Arc::new(Int32Array::from_iter_values(rows.iter().map(|&r| r as i32))),
                    Arc::new(UInt32Array::from(vec![1; rows.len()])),
                    Arc::new(Int64Array::from(rows)),
                ],
            )
            .unwrap()
        };
        let bitmaps = vec![vec![u64::MAX], vec![1 << 3 | 1 << 5]];
        let out = live_batch(&batch((2..8).collect()), &bitmaps, &[0]).unwrap();
        assert_eq!(out.num_columns(), 1);
        let v: Vec<i32> = out
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int32Type>()
            .values()
            .to_vec();
        assert_eq!(v, vec![2, 4, 6, 7]);
        // No deleted row: the batch as it is.
        let out = live_batch(&batch(vec![6, 7, 8]), &bitmaps, &[0]).unwrap();
        assert_eq!(out.num_rows(), 3);
    }
}
