"""Do the replicas of a group agree on their committed prefix? Compared entry by entry with
the store's one codec (broker/store/logreader.py), TLE1 entries and TLE2 record batches alike:
index, term, physical offset, size, where its messages go and the CRC of its content. A
replica that no longer holds entries at or below its own committed index (its checkpoint /
node.json) lost them: the reconcile job's `lost` rule.
"""

from __future__ import annotations

from pathlib import Path

from broker.store.logreader import iter_batches
from spark_jobs.inputs import own_committed_index


def digest(directory: Path) -> tuple[dict[int, tuple], str | None]:
    """index -> (term, phys_offset, size, topic, queue_id, base_queue_offset, count, content
    CRC) for a node's log, and why reading stopped early (a corrupt entry), if it did.

    The CRC is the entry's: a TLE1 entry's one CRC, a TLE2 batch's head CRC (which covers
    its placement, store time and records_crc, so every byte of the batch): read, not
    computed, and checked by the walk. Digests are only compared between replicas of one group,
    which hold equal entries byte for byte."""
    end: list = []
    out = {}
    for h, topic in iter_batches(directory, end):
        out[h.index] = (h.term, h.phys_offset, h.size, topic, h.queue_id, h.base_queue_offset, h.count,
                        h.crc)
    return out, end[0].reason if end else None


def lost_committed(log: dict[int, tuple], committed_index: int) -> list[int]:
    """Indexes from the log's first (older ones may be gone by retention) up to the node's own
    committed index that it does not hold; an empty log lost everything up to that index."""
    begin = min(log) if log else 0
    return [i for i in range(begin, committed_index + 1) if i not in log]


def compare(dirs: dict[str, Path], upto_index: int | None, behind: frozenset[str] = frozenset()) -> list[str]:
    """Disagreements at or below `upto_index` (None: the shortest log's end), worded. A node
    in `behind` has not caught up with its leader (ops.health.behind): its log past its own
    committed index may still hold a suffix the leader has yet to cut, so it is compared
    only up to that index."""
    logs, problems, stopped = {}, [], set()
    for node, d in sorted(dirs.items()):
        logs[node], why = digest(d)
        if why:
            problems.append(f"{node}: its log stops early: {why}")
            stopped.add(node)  # what follows the damage was not read: not known lost
    if not logs:
        return problems
    limit = upto_index if upto_index is not None else min((max(v) if v else 0) for v in logs.values())
    ref_node = max(logs, key=lambda n: len(logs[n]))
    ref = logs[ref_node]
    for node, log in logs.items():
        lost = [] if node in stopped else lost_committed(log, own_committed_index(dirs[node]))
        if lost:
            problems.append(f"{node} lost {len(lost)} entries it had committed, from {lost[0]} "
                            f"(its committed index {own_committed_index(dirs[node])}, its log ends at "
                            f"{max(log) if log else 'nothing'})")
        if node == ref_node:
            continue
        upto = min(limit, own_committed_index(dirs[node])) if node in behind else limit
        bad = [i for i in log if i <= upto and i in ref and log[i] != ref[i]]
        if bad:
            i = bad[0]
            problems.append(f"{node} and {ref_node} disagree at {len(bad)} committed indexes from {i}: "
                            f"{node} has term {log[i][0]} offset {log[i][1]}, {ref_node} term {ref[i][0]} "
                            f"offset {ref[i][1]}")
    return problems
