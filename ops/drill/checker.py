"""The drill's history checker: Jepsen's queue anomalies over what the clients saw.

Pure: a history of operations and what the drain read go in, anomalies and figures come
out, so each anomaly is unit-tested on crafted histories (tests/unit/test_drill_checker.py).

An operation is one acknowledged-send attempt by the workload, with its own unique id in
the message key: invoked at `t0`, completed at `t1` with outcome

    ok       the broker acknowledged it at (queue, offset) -- of `group` when the workload
             spans several broker groups (through the name servers); None: the one group
    fail     certainly not stored (the client was told so)
    unknown  a timeout, a lost connection, or stored without the promised durability

Safety anomalies (any one fails the drill):
    lost          ok, but never read
    wrong_offset  ok at (q, o), but (q, o) holds another message or nothing
    duplicated    read more than once, and the client cannot explain it (an op whose every
                  attempt got a definite answer and that was retried zero times)
    unexpected    fail (certainly not stored), yet read
    reordered     A was acknowledged before B was invoked, both in queue q, yet B sits before A
    divergent     replicas disagree on the committed prefix (filled in from the log compare)
Informational: duplicates the client's retries explain; unknown ops that did / did not land.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import asdict, dataclass, field


@dataclass
class Op:
    id: int
    t0: float            # invocation, seconds since the drill started
    t1: float | None = None
    outcome: str = "pending"   # ok | fail | unknown
    queue: int | None = None
    offset: int | None = None
    attempts: int = 1
    possible_duplicate: bool = False
    error: str | None = None
    group: str | None = None   # the broker group that acknowledged it (None: the drill's one group)


@dataclass(frozen=True)
class Read:
    op_id: int | None    # None: a message the workload did not write
    queue: int
    offset: int
    group: str | None = None  # the broker group it was read from (None: the drill's one group)


@dataclass
class Result:
    ok: bool
    anomalies: dict = field(default_factory=dict)   # kind -> list of examples (bounded)
    counts: dict = field(default_factory=dict)      # kind -> how many
    figures: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


SAFETY = ("lost", "wrong_offset", "duplicated", "unexpected", "reordered", "divergent")
EXAMPLES_MAX = 20


def check(ops: list[Op], reads: list[Read], divergent: list[str] | None = None) -> Result:
    found: dict[str, list] = {k: [] for k in SAFETY}
    counts: dict[str, int] = defaultdict(int)

    def note(kind: str, example) -> None:
        counts[kind] += 1
        if len(found[kind]) < EXAMPLES_MAX:
            found[kind].append(example)

    by_id = {o.id: o for o in ops}
    seen: dict[int, list[Read]] = defaultdict(list)
    at: dict[tuple[str | None, int, int], Read] = {}
    for r in reads:
        at[(r.group, r.queue, r.offset)] = r
        if r.op_id is not None:
            seen[r.op_id].append(r)

    for o in ops:
        where = seen.get(o.id, [])
        if o.outcome == "ok":
            if not where:
                note("lost", _where(o, {"op": o.id, "queue": o.queue, "offset": o.offset}))
            r = at.get((o.group, o.queue, o.offset))
            if r is None or r.op_id != o.id:
                note("wrong_offset", _where(o, {"op": o.id, "queue": o.queue, "offset": o.offset,
                                                "holds": None if r is None else r.op_id}))
        elif o.outcome == "fail" and where:
            note("unexpected", {"op": o.id, "error": o.error, "read_at": [_at(r) for r in where]})
        if len(where) > 1:
            explained = o.attempts > 1 or o.possible_duplicate or o.outcome == "unknown"
            ex = {"op": o.id, "read_at": [_at(r) for r in where], "attempts": o.attempts}
            if explained:
                counts["duplicated_explained"] += 1
            else:
                note("duplicated", ex)
        if o.outcome == "unknown":
            counts["unknown_landed" if where else "unknown_absent"] += 1

    for ex in _reordered(ops, seen):
        note("reordered", ex)
    for d in divergent or []:
        note("divergent", d)
    unknown_ids = set(seen) - set(by_id)
    if unknown_ids:
        counts["foreign_reads"] = len(unknown_ids)

    anomalies = {k: v for k, v in found.items() if v}
    return Result(ok=not anomalies, anomalies=anomalies,
                  counts={k: counts.get(k, 0) for k in (*SAFETY, "duplicated_explained", "unknown_landed",
                                                        "unknown_absent", "foreign_reads")},
                  figures=figures(ops))


def _where(o: Op, example: dict) -> dict:
    return {**example, "group": o.group} if o.group is not None else example


def _at(r: Read) -> tuple:
    """Where a read was: (queue, offset), or (group, queue, offset) across groups."""
    return (r.queue, r.offset) if r.group is None else (r.group, r.queue, r.offset)


def _reordered(ops: list[Op], seen: dict[int, list[Read]]):
    """Pairs (A, B) in one queue (of one group) with A.t1 < B.t0 but B's first read before A's."""
    per_queue: dict[tuple[str | None, int], list[tuple[float, float, int, int]]] = defaultdict(list)
    for o in ops:
        if o.outcome == "ok" and seen.get(o.id):
            here = [r.offset for r in seen[o.id] if (r.group, r.queue) == (o.group, o.queue)]
            if here:
                per_queue[(o.group, o.queue)].append((o.t0, o.t1, min(here), o.id))
    for q, items in per_queue.items():
        # walk ops by invocation; keep the completed-before-invocation ones' highest position
        by_t1 = sorted(items, key=lambda x: x[1])
        t1s = [x[1] for x in by_t1]
        prefix_max: list[tuple[int, int]] = []  # (max position, its op) over by_t1[:i+1]
        best = (-1, -1)
        for x in by_t1:
            if x[2] > best[0]:
                best = (x[2], x[3])
            prefix_max.append(best)
        for t0, _, pos, oid in items:
            i = bisect.bisect_left(t1s, t0)  # ops with t1 < t0
            if i and prefix_max[i - 1][0] > pos:
                before_pos, before = prefix_max[i - 1]
                yield {**({"group": q[0]} if q[0] is not None else {}), "queue": q[1], "earlier_op": before,
                       "earlier_offset": before_pos, "later_op": oid, "later_offset": pos}


def longest_gap(times: list[float]) -> tuple[float, float | None]:
    """(the longest gap between consecutive sorted times, where it began)."""
    gap, gap_at = 0.0, None
    for a, b in zip(times, times[1:]):
        if b - a > gap:
            gap, gap_at = b - a, a
    return gap, gap_at


def figures(ops: list[Op]) -> dict:
    """Counts, latency percentiles and the longest gap between successful acknowledgements
    (across groups: also each group's acknowledgements and longest gap)."""
    done = [o for o in ops if o.t1 is not None]
    ok = sorted(o.t1 for o in done if o.outcome == "ok")
    lat = sorted((o.t1 - o.t0) * 1000 for o in done if o.outcome == "ok")
    gap, gap_at = longest_gap(ok)
    span = (max(o.t1 for o in done) - min(o.t0 for o in ops)) if done else 0.0

    def pct(p: float):
        return round(lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None

    out = {"ops": len(ops), "ok": len(ok), "failed": sum(o.outcome == "fail" for o in done),
            "unknown": sum(o.outcome == "unknown" for o in done),
            "pending": sum(o.t1 is None for o in ops),
            "acks_per_s": round(len(ok) / span, 1) if span > 0 else None,
            "latency_ms_p50": pct(0.50), "latency_ms_p99": pct(0.99), "latency_ms_max": pct(1.0),
            "longest_ack_gap_s": round(gap, 3), "longest_ack_gap_at_s": None if gap_at is None else round(gap_at, 3)}
    groups = sorted({o.group for o in done if o.outcome == "ok" and o.group is not None})
    if groups:
        by = {g: sorted(o.t1 for o in done if o.outcome == "ok" and o.group == g) for g in groups}
        out["ok_by_group"] = {g: len(t) for g, t in by.items()}
        out["longest_ack_gap_s_by_group"] = {g: round(longest_gap(t)[0], 3) for g, t in by.items()}
    return out
