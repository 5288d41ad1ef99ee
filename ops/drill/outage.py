"""What the workload did while every name server was down (kill-namesrv, kill-namesrv-and-leader).

Pure: a fault's step timeline and the operations go in, the outage's figures and the
liveness problems come out (tests/unit/test_drill_outage.py).

The outage is the time every name server was down: from the end of the last name server's
kill -9 to the end of the heal that starts them again (all at once: they serve again; they
may still be in their start-up grace, answering no route until the brokers re-register,
which is no outage of the data path). Within it:

    acks                 sends acknowledged (by any group)
    longest_ack_gap_s    the longest time without an acknowledgement, the window's edges
                         included (a workload that stopped at once shows the whole window)
    acks_by_group        per group
    target_acks_after_new_leader
                         kill-namesrv-and-leader: sends to the target group invoked after its new
                         leader was seen and acknowledged before a name server came back: the
                         clients found the new leader from the member addresses they knew

Liveness (the issue's "killing every name server must not stop sends to known routes"): the
drill fails when the outage saw no acknowledgement, when its longest gap passes
KNOWN_ROUTES_GAP_MAX_S (kill-namesrv: no broker was touched, nothing should wait), or when
after kill-namesrv-and-leader the target group acknowledged nothing from its new leader before
the name servers came back although the new leader was up for FIND_LEADER_GRACE_S of it.
"""

from __future__ import annotations

from ops.drill.checker import Op, longest_gap
from ops.drill.nemesis import NAMESRV_RESTART

KNOWN_ROUTES_GAP_MAX_S = 2.0  # ~ a send timeout: no broker is down, no send should wait longer
FIND_LEADER_GRACE_S = 2.0  # the new leader up this long with the name servers down: found, or a finding


def window(steps: list[dict], namesrv_ids: list[str]) -> tuple[float, float | None] | None:
    """(every name server down since, the first back at, or None if none came back), or None
    when the fault never had every name server down."""
    kills = {s["node"]: s["done_s"] for s in steps
             if s["step"] == "kill -9" and s.get("node") in namesrv_ids and "error" not in s}
    if not namesrv_ids or set(kills) != set(namesrv_ids):
        return None
    start = max(kills.values())
    labels = {NAMESRV_RESTART} | {f"restart {n}" for n in namesrv_ids}
    back = [s["done_s"] for s in steps if "done_s" in s and s["done_s"] >= start and "error" not in s and (
        (s["step"] == "heal" and s.get("detail") in labels) or (s["step"] == "start" and s.get("node") in namesrv_ids))]
    return start, min(back) if back else None


def figures(ops: list[Op], start: float, end: float, target_group: str | None = None,
            new_leader_at: float | None = None) -> dict:
    acked = [o for o in ops if o.outcome == "ok" and o.t1 is not None and start <= o.t1 <= end]
    gap, gap_at = longest_gap(sorted([start, end] + [o.t1 for o in acked]))
    by: dict[str, int] = {}
    for o in acked:
        by[o.group or "-"] = by.get(o.group or "-", 0) + 1
    out = {"namesrv_down_at_s": round(start, 3), "namesrv_back_at_s": round(end, 3),
           "namesrv_down_s": round(end - start, 3), "acks": len(acked), "acks_by_group": by,
           "longest_ack_gap_s": round(gap, 3), "longest_ack_gap_at_s": None if gap_at is None else round(gap_at, 3)}
    if target_group is not None:
        out["target_group"] = target_group
        out["new_leader_at_s"] = None if new_leader_at is None else round(new_leader_at, 3)
        out["target_acks_after_new_leader"] = (
            None if new_leader_at is None else
            sum(o.group == target_group and o.t0 >= new_leader_at for o in acked))
        if new_leader_at is None:
            out["note"] = (f"group {target_group} had no new leader while the name servers were down: "
                           "finding one without them was not tested (a longer --fault-s would)")
    return out


def problems(kind: str, fig: dict) -> list[str]:
    """Liveness problems of one name-server outage (see the module docstring)."""
    out = []
    down = fig["namesrv_down_s"]
    if fig["acks"] == 0:
        out.append(f"{kind}: no send was acknowledged in the {down}s every name server was down "
                   "(sends to known routes must go on)")
    elif kind == "kill-namesrv" and fig["longest_ack_gap_s"] > KNOWN_ROUTES_GAP_MAX_S:
        out.append(f"{kind}: no acknowledgement for {fig['longest_ack_gap_s']}s (from "
                   f"{fig['longest_ack_gap_at_s']}s) while every name server was down (bound "
                   f"{KNOWN_ROUTES_GAP_MAX_S}s with every broker up)")
    if kind == "kill-namesrv-and-leader":
        at, found = fig.get("new_leader_at_s"), fig.get("target_acks_after_new_leader")
        if at is not None and not found and fig["namesrv_back_at_s"] - at >= FIND_LEADER_GRACE_S:
            out.append(f"{kind}: group {fig['target_group']} had a new leader from {at}s, yet acknowledged no "
                       f"send invoked after it before a name server came back at {fig['namesrv_back_at_s']}s: "
                       "clients did not find the new leader from the member addresses they knew")
    return out
