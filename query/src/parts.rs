//! A Parquet scan whose partitions the connector made: [`OwnPartitionsExec`], and how write-buffer
//! objects are shared out among partitions by their bytes ([`balance`]).

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use datafusion::common::Statistics;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

/// A Parquet scan of files (or row groups of files) the connector shared out among its
/// partitions already, wrapped so that DataFusion's optimizer takes it as a leaf (its rules
/// change the children of every operator: the scan is not one of them). Two things DataFusion
/// would do to a bare scan it so leaves out:
/// - Where the connector's partitions are balanced, DataFusion does not split the
///   files again into byte ranges of equal size (`repartition_file_scans`), which knows
///   neither the row groups a partition reads of a file nor where they end: two objects of
///   almost the same size became three ranges, one of them a few hundred bytes that opened an
///   object and read nothing (about 0.25 ms of a 5 ms query). Where they are not, it does.
/// - The query's filters, which the scan prunes by already (its predicate), are not pushed
///   into it a second time (DataFusion conjoins them to the predicate again, doubling the
///   pruning work). Filters made while the query runs (a join's or a top-k's dynamic filters)
///   still are.
///
/// It shows as the scan it wraps (in `EXPLAIN`, with its metrics), and downcasts to it.
#[derive(Debug)]
pub(crate) struct OwnPartitionsExec {
    input: Arc<dyn ExecutionPlan>,
    parts: Parts,
}

/// Who made a scan's partitions.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Parts {
    /// The connector, balanced: they stay.
    Connector,
    /// The connector, not balanced: DataFusion may split its files.
    Unbalanced,
    /// DataFusion, splitting the connector's files.
    DataFusion,
}

impl OwnPartitionsExec {
    /// `balanced`: whether the partitions the connector made stay as they are.
    pub(crate) fn new(input: Arc<dyn ExecutionPlan>, balanced: bool) -> Self {
        let parts = match balanced {
            true => Parts::Connector,
            false => Parts::Unbalanced,
        };
        OwnPartitionsExec { input, parts }
    }

    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Arc<dyn ExecutionPlan> {
        Arc::new(OwnPartitionsExec {
            input,
            parts: self.parts,
        })
    }
}

impl DisplayAs for OwnPartitionsExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by = match self.parts {
            Parts::Connector => "connector",
            Parts::Unbalanced => "connector, unbalanced",
            Parts::DataFusion => "datafusion",
        };
        write!(f, "OwnPartitionsExec: partitions by {by}, ")?;
        self.input.fmt_as(t, f)
    }
}

impl ExecutionPlan for OwnPartitionsExec {
    fn name(&self) -> &str {
        "OwnPartitionsExec"
    }

    fn downcast_delegate(&self) -> Option<&dyn ExecutionPlan> {
        Some(self.input.as_ref())
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        Vec::new()
    }

    fn statistics_from_inputs(
        &self,
        input: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.input.statistics_from_inputs(input, args)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        self.input.metrics()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        self.input.apply_expressions(f)
    }

    fn repartitioned(
        &self,
        target_partitions: usize,
        config: &ConfigOptions,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        if self.parts != Parts::Unbalanced {
            return Ok(None);
        }
        Ok(self
            .input
            .repartitioned(target_partitions, config)?
            .map(|input| {
                Arc::new(OwnPartitionsExec {
                    input,
                    parts: Parts::DataFusion,
                }) as _
            }))
    }

    /// The query's filters stay above (see the type); dynamic filters go into the scan.
    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        match phase {
            FilterPushdownPhase::Pre => Ok(FilterPushdownPropagation::all_unsupported(
                child_pushdown_result,
            )),
            FilterPushdownPhase::Post => {
                let pushed = self.input.handle_child_pushdown_result(
                    phase,
                    child_pushdown_result,
                    config,
                )?;
                let updated = pushed.updated_node.map(|input| self.with_input(input));
                Ok(FilterPushdownPropagation {
                    filters: pushed.filters,
                    updated_node: updated,
                })
            }
        }
    }

    fn with_new_state(&self, state: Arc<dyn Any + Send + Sync>) -> Option<Arc<dyn ExecutionPlan>> {
        Some(self.with_input(self.input.with_new_state(state)?))
    }

    fn reset_state(self: Arc<Self>) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(self.with_input(self.input.clone().reset_state()?))
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        leaf(self, &children)
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }
}

/// A leaf operator given `children` to take: none, or an error naming it.
pub(crate) fn leaf(
    plan: Arc<dyn ExecutionPlan>,
    children: &[Arc<dyn ExecutionPlan>],
) -> Result<Arc<dyn ExecutionPlan>> {
    if !children.is_empty() {
        return Err(DataFusionError::Internal(format!(
            "{} has no input, given {}",
            plan.name(),
            children.len()
        )));
    }
    Ok(plan)
}

/// How far above an even share of the bytes a partition may be for the partitions to count as
/// balanced.
const BALANCED: f64 = 1.1;

/// Items of `bytes` each shared out among at most `parts` partitions, each item whole, the
/// largest first to the partition with the fewest bytes so far; with whether the partitions
/// are balanced (as many as asked, none more than [`BALANCED`] times an even share).
pub(crate) fn balance<T>(items: Vec<(u64, T)>, parts: usize) -> (Vec<Vec<T>>, bool) {
    let parts = parts.max(1);
    let total: u64 = items.iter().map(|(b, _)| b).sum();
    let mut items = items;
    items.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
    let mut groups: Vec<(u64, Vec<T>)> = (0..parts.min(items.len()))
        .map(|_| (0, Vec::new()))
        .collect();
    for (bytes, item) in items {
        let lightest = groups
            .iter_mut()
            .min_by_key(|(b, _)| *b)
            .expect("a partition per item at least");
        lightest.0 += bytes;
        lightest.1.push(item);
    }
    let even = total as f64 / parts as f64;
    let balanced = groups.len() == parts
        && groups
            .iter()
            .all(|(bytes, _)| *bytes as f64 <= even * BALANCED);
    (groups.into_iter().map(|(_, g)| g).collect(), balanced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_go_largest_first_to_the_lightest_partition_and_balance_is_told() {
        let (groups, balanced) = balance(vec![(100, 'a'), (101, 'b'), (5, 'c')], 2);
        assert_eq!(groups, [vec!['b'], vec!['a', 'c']]);
        assert!(balanced);
        // One item far larger than the others: whole items cannot balance it.
        let (groups, balanced) = balance(vec![(10, 'a'), (1, 'b'), (1, 'c')], 2);
        assert_eq!(groups, [vec!['a'], vec!['b', 'c']]);
        assert!(!balanced);
        // Fewer items than partitions: a partition each, not balanced.
        let (groups, balanced) = balance(vec![(10, 'a')], 2);
        assert_eq!(groups, [vec!['a']]);
        assert!(!balanced);
        let (groups, balanced) = balance(Vec::<(u64, char)>::new(), 2);
        assert!(groups.is_empty() && !balanced);
    }
}
