"""The expectation suites for the reconciled tables: what "good" means, one suite per table.

Every expectation carries a description, which is what a failed run prints (and what the
Data Docs show). Row-order-dependent expectations are avoided: per-node order questions are
window queries (`UnexpectedRowsExpectation`, the batch is `{batch}`).
"""

from __future__ import annotations

import great_expectations.expectations as gxe

LAG_PARAMETER = "lag_entries_max"

PER_NODE = "PARTITION BY cluster, `group`, node ORDER BY index"
# replica_entries has a row per message; the rows standing for a whole CommitLog entry (a
# batch's first record, a TLE1 entry, or an entry not read as messages: batch_pos NULL)
ENTRY_ROWS = "coalesce(batch_pos, 0) = 0"


def replica_entries() -> list:
    return [
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["cluster", "group", "node", "index", "batch_pos"],
            description="each replica holds each message of each index at most once (unique node, index, batch_pos)"),
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=(
                f"SELECT cluster, `group`, node, index, prev FROM (SELECT cluster, `group`, node, index, "
                f"LAG(index) OVER ({PER_NODE}) AS prev FROM {{batch}} WHERE {ENTRY_ROWS}) "
                "WHERE prev IS NOT NULL AND index <> prev + 1"),
            description="each replica's indexes are contiguous (no hole in its log)"),
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=(
                "SELECT cluster, `group`, node, index, batch_pos, prev FROM (SELECT cluster, `group`, node, index, "
                "batch_pos, LAG(batch_pos) OVER (PARTITION BY cluster, `group`, node, index ORDER BY batch_pos) "
                "AS prev FROM {batch} WHERE batch_pos IS NOT NULL) WHERE batch_pos <> coalesce(prev + 1, 0)"),
            description="each entry's messages are contiguous from batch_pos 0 (no message missing from a batch)"),
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=(
                f"SELECT cluster, `group`, node, index, term, prev_term FROM (SELECT cluster, `group`, node, index, "
                f"term, LAG(term) OVER ({PER_NODE}) AS prev_term FROM {{batch}} WHERE crc_ok AND {ENTRY_ROWS}) "
                "WHERE prev_term IS NOT NULL AND term < prev_term"),
            description="term never decreases along the index on any replica"),
        gxe.ExpectColumnValuesToBeInSet(
            column="crc_ok", value_set=[True],
            description="every entry's CRC is valid"),
    ]


def reconciled_log() -> list:
    return [
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["cluster", "group", "index"],
            description="one reconciled row per index (per CommitLog entry, however many messages it holds)"),
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=("SELECT cluster, `group`, index, status, replicas FROM {batch} "
                                   "WHERE committed AND status IN ('divergent', 'corrupt')"),
            description="no divergent or corrupt entry at or below the committed index"),
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=("SELECT cluster, `group`, index, status, replicas, lost_by FROM {batch} "
                                   "WHERE status = 'lost' OR size(lost_by) > 0"),
            description="no committed entry lost by a replica that had committed it "
                        "(at or below its own committed index, no longer in its log)"),
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=("SELECT cluster, `group`, index, status, replicas FROM {batch} "
                                   "WHERE NOT committed AND status = 'divergent'"),
            description="no divergent uncommitted tail (a deposed leader's entries not yet cut back)"),
    ]


def replica_summary() -> list:
    return [
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["cluster", "group", "node"],
            description="one summary row per replica"),
        gxe.ExpectColumnValuesToBeInSet(
            column="state", value_set=["ok"],
            description="every replica was collected and its log is readable"),
        gxe.ExpectColumnValuesToBeBetween(
            column="segment_problems", min_value=0, max_value=0,
            description="every segment reads to its end (no damaged framing, no truncated copy)"),
        gxe.ExpectColumnValuesToBeBetween(
            column="lag", min_value=0, max_value={"$PARAMETER": LAG_PARAMETER},
            description="no replica lags the longest log by more than lag_entries_max entries"),
        gxe.UnexpectedRowsExpectation(
            unexpected_rows_query=("SELECT cluster, `group`, node, end_index, node_committed_index, lag FROM {batch} "
                                   "WHERE state IN ('ok', 'empty') AND node_committed_index > lag + coalesce(end_index, -1)"),
            description="no replica committed entries beyond every replica's log (committed, yet no copy left)"),
    ]


SUITES = {"replica_entries": replica_entries, "reconciled_log": reconciled_log,
          "replica_summary": replica_summary}
