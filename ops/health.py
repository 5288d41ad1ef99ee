"""A group's health from its nodes' STATUS answers, and the one-line verdict gates use.

    (`lagging` names the nodes behind a degraded verdict)
    healthy   every node answers, one leader (raft) / master (master-slave), every follower
              or slave connected and within the spec's lag bound; standalone: its one node answers
    degraded  a leader/master serves writes, but a node is down, unreachable or behind
    down      no leader/master: the group does not take writes

`verdict()` is pure (rows in, verdict out) so tests can feed it crafted rows.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from broker.client import Admin, TidelogError
from infra.spec import ClusterSpec, NodePlan
from ops.security import credentials_for

RANK = {"healthy": 0, "degraded": 1, "down": 2}


def probe(address: str, timeout_ms: int = 2000, credentials=None) -> dict:
    """One node's STATUS, or why there is none (`credentials`: ops.security.credentials_for)."""
    try:
        with Admin([address], request_timeout_ms=timeout_ms, connect_timeout_ms=min(timeout_ms, 1000),
                   credentials=credentials) as a:
            st = a.status()
    except TidelogError as e:
        return {"state": "unreachable", "error": str(e)}
    return {"state": "up", **st}


def row_of(plan: NodePlan, st: dict) -> dict:
    """The fields `tidelog status` shows for one node."""
    row = {"id": plan.id, "group": plan.group.name, "host": plan.host, "address": plan.address,
           "state": st["state"]}
    if st["state"] != "up":
        row["error"] = st.get("error")
        return row
    repl = st.get("replication") or {}
    store = st.get("store") or {}
    row.update(role=st.get("role"), version=st.get("version"), protocol_version=st.get("protocol_version"),
               max_offset=store.get("max_offset", repl.get("max_offset")))
    # the whole answer too: status views show more of it (begin index, rates, epochs)
    row.update(replication=repl, store=store)
    if plan.group.mode == "raft":
        row.update(term=repl.get("term"), leader=repl.get("leader"), commit_index=repl.get("commit_index"),
                   end_index=repl.get("end_index"), followers=repl.get("followers"))
    elif plan.group.mode == "master-slave":
        row.update(epoch=repl.get("epoch"), master=repl.get("master"), connected=repl.get("connected"),
                   lag_bytes=repl.get("lag_bytes"), slaves=repl.get("slaves"),
                   in_sync_count=repl.get("in_sync_count"))
    return row


def verdict(mode: str, rows: list[dict], lag_entries_max: int, lag_bytes_max: int) -> dict:
    """{"verdict", "leader", "problems"} for one group's rows."""
    problems, bad = [], []
    up = [r for r in rows if r["state"] == "up"]
    for r in rows:
        if r["state"] != "up":
            bad.append(r["id"])
            problems.append(f"{r['id']} is {r['state']}" + (f" ({r['error']})" if r.get("error") else ""))
    lead_role = {"raft": "leader", "standalone": "standalone"}.get(mode, "master")
    leaders = [r for r in up if r.get("role") == lead_role]
    if mode == "raft" and len(leaders) > 1:  # a deposed leader that has not heard yet: take the newest
        leaders = [max(leaders, key=lambda r: r.get("term") or 0)]
    leader = leaders[0] if len(leaders) == 1 else None
    if leader is None:
        problems.append(f"no {lead_role}" if not leaders else f"{len(leaders)} nodes claim to be {lead_role}")
        return {"verdict": "down", "leader": None, "problems": problems, "lagging": bad}
    for r in up:
        if r is leader:
            continue
        n_before = len(problems)
        if mode == "raft":
            # the node's own view (it knows the leader, its log's end) and the leader's (what it
            # has acked): a just-restarted node looks caught up to a leader that has not noticed
            f = (leader.get("followers") or {}).get(r["id"])
            own = (leader.get("end_index") or 0) - (r.get("end_index") or 0)
            lag = max(f.get("lag") or 0, own) if f else None
            r["lag"] = lag
            if r.get("term") != leader.get("term"):
                problems.append(f"{r['id']} is at term {r.get('term')}, the leader at {leader.get('term')}")
            elif r.get("leader") != leader["id"]:
                problems.append(f"{r['id']} does not follow {leader['id']} yet")
            elif lag is None or lag > lag_entries_max:
                problems.append(f"{r['id']} lags the leader by {lag} entries (bound {lag_entries_max})")
        else:
            r["lag"] = r.get("lag_bytes")
            if not r.get("connected"):
                problems.append(f"{r['id']} is not connected to master {leader['id']}")
            elif r.get("master") != leader["id"]:
                problems.append(f"{r['id']} follows {r.get('master')}, not {leader['id']}")
            elif (r.get("lag_bytes") or 0) > lag_bytes_max:
                problems.append(f"{r['id']} lags the master by {r['lag_bytes']} bytes (bound {lag_bytes_max})")
        if len(problems) > n_before:
            bad.append(r["id"])
    return {"verdict": "degraded" if problems else "healthy", "leader": leader["id"], "problems": problems,
            "lagging": bad}


def status(spec: ClusterSpec, group: str | None = None, timeout_ms: int = 2000) -> dict:
    """Every node's row and each group's verdict; `verdict` is the worst group's."""
    plans = spec.nodes(group)
    with ThreadPoolExecutor(max_workers=min(16, len(plans))) as ex:
        creds = credentials_for(spec)
        answers = list(ex.map(lambda p: probe(p.address, timeout_ms, creds), plans))
    out = {"cluster": spec.name, "provider": spec.provider, "groups": []}
    for g in ([spec.group(group)] if group else spec.groups):
        rows = [row_of(p, st) for p, st in zip(plans, answers) if p.group.name == g.name]
        v = verdict(g.mode, rows, spec.health.lag_entries_max, spec.health.lag_bytes_max)
        out["groups"].append({"name": g.name, "mode": g.mode, **v, "nodes": rows})
    out["verdict"] = max((g["verdict"] for g in out["groups"]), key=RANK.__getitem__)
    return out


def wait_healthy(spec: ClusterSpec, timeout_s: float | None = None, group: str | None = None,
                 poll_s: float = 0.2) -> dict:
    """Poll until healthy; the last status (whatever its verdict) when time runs out."""
    deadline = time.monotonic() + (timeout_s if timeout_s is not None else spec.health.timeout_s)
    while True:
        st = status(spec, group)
        if st["verdict"] == "healthy" or time.monotonic() > deadline:
            return st
        time.sleep(poll_s)


def leader_of(spec: ClusterSpec, group: str | None = None, timeout_ms: int = 1000) -> NodePlan | None:
    st = status(spec, group, timeout_ms)
    g = st["groups"][0]
    return next((p for p in spec.nodes(g["name"]) if p.id == g["leader"]), None)
