"""A group's health from its nodes' STATUS answers, and the one-line verdict gates use.

    (`lagging` names the nodes behind a degraded verdict)
    healthy   every node answers, one leader (raft) / master (master-slave), every follower
              or slave connected and within the spec's lag bound; standalone: its one node answers
    degraded  a leader/master serves writes, but a node is down, unreachable or behind
    down      the group does not take writes: no leader/master, or a SYNC master with fewer
              replicas in sync than it requires (it answers sends SLAVE_NOT_AVAILABLE)

With name servers (the spec's `namesrv` section) `status` adds their view: per name server
reachable or not and, per group, the leader it routes to (with term, nodes, seconds since the
leader's last registration). A name server that is unreachable, misses a group, or shows a
leader other than the one the group's own STATUS reports makes the verdict degraded
(`namesrv_verdict`: the groups still take writes, but clients would be routed wrong).

`verdict()` and `namesrv_verdict()` are pure (rows in, verdict out) so tests can feed them
crafted rows.
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
    repl = leader.get("replication") or {}
    if mode == "master-slave" and repl.get("ha_replication") == "sync" and \
            (repl.get("in_sync_count") or 0) < (repl.get("required_replicas") or 0):
        problems.insert(0, f"master {leader['id']} refuses writes: {repl.get('in_sync_count')} of the "
                           f"{repl.get('required_replicas')} replicas it requires are in sync (SYNC replication)")
        return {"verdict": "down", "leader": leader["id"], "problems": problems, "lagging": bad}
    return {"verdict": "degraded" if problems else "healthy", "leader": leader["id"], "problems": problems,
            "lagging": bad}


def probe_namesrv(address: str, timeout_ms: int = 2000, credentials=None) -> dict:
    """One name server's GET_CLUSTER_INFO, or why there is none."""
    from broker.client.cluster import NameServers

    try:
        with NameServers([address], request_timeout_ms=timeout_ms, connect_timeout_ms=min(timeout_ms, 1000),
                         credentials=credentials) as n:
            info = n.cluster_info_sync()
    except TidelogError as e:
        return {"state": "unreachable", "error": str(e)}
    return {"state": "up", "info": info}


def namesrv_row(plan: NodePlan, answer: dict) -> dict:
    """What `tidelog status` shows for one name server: per group the leader it routes to."""
    row = {"id": plan.id, "host": plan.host, "address": plan.address, "state": answer["state"]}
    if answer["state"] != "up":
        row["error"] = answer.get("error")
        return row
    groups = {}
    for g in answer["info"].groups:
        lead = next((n for n in g.nodes if n.node_id == g.leader_id), None)
        groups[g.broker_name] = {"leader_id": g.leader_id, "leader": g.leader, "term": g.term,
                                 "nodes": len(g.nodes), "followers": len(g.nodes) - (lead is not None),
                                 "age_s": None if lead is None else round(lead.age_ms / 1000, 1)}
    row["groups"] = groups
    return row


def namesrv_verdict(rows: list[dict], groups: list[dict]) -> dict:
    """{"verdict", "problems"}: each name server must list each group (rows of `status`'s
    groups: name, leader id, nodes) with the leader the group's own STATUS reports."""
    problems = []
    for r in rows:
        if r["state"] != "up":
            problems.append(f"name server {r['id']} is {r['state']}" + (f" ({r['error']})" if r.get("error") else ""))
            continue
        for g in groups:
            seen = r["groups"].get(g["name"])
            own = next((n for n in g["nodes"] if n["id"] == g.get("leader")), None)
            if seen is None:
                problems.append(f"name server {r['id']} does not list group {g['name']}")
            elif own is not None and seen["leader"] != own["address"]:
                problems.append(f"name server {r['id']} routes group {g['name']} to "
                                f"{seen['leader_id'] or 'no leader'} ({seen['leader']}), the group's STATUS "
                                f"says {own['id']} ({own['address']})")
    return {"verdict": "degraded" if problems else "healthy", "problems": problems}


def namesrv_status(spec: ClusterSpec, groups: list[dict], timeout_ms: int = 2000) -> dict:
    plans = spec.namesrvs()
    creds = credentials_for(spec)
    with ThreadPoolExecutor(max_workers=min(16, len(plans))) as ex:
        answers = list(ex.map(lambda p: probe_namesrv(p.address, timeout_ms, creds), plans))
    rows = [namesrv_row(p, a) for p, a in zip(plans, answers)]
    return {"servers": rows, **namesrv_verdict(rows, groups)}


def _poll_until(check, timeout_s: float, poll_s: float):
    """Call `check()` -> (done, result) every `poll_s` until it is done or `timeout_s` ran out;
    the last result either way."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, result = check()
        if done or time.monotonic() > deadline:
            return result
        time.sleep(poll_s)


def wait_namesrv_answering(spec: ClusterSpec, timeout_s: float | None = None, poll_s: float = 0.2) -> list[str]:
    """Wait until every name server answers GET_CLUSTER_INFO; what is still silent at the end."""
    creds = credentials_for(spec)
    left = spec.namesrvs()

    def check():
        nonlocal left
        answers = [(p, probe_namesrv(p.address, 2000, creds)) for p in left]
        left = [p for p, a in answers if a["state"] != "up"]
        return not left, [f"{p.id} ({a.get('error')})" for p, a in answers if a["state"] != "up"]
    return _poll_until(check, timeout_s if timeout_s is not None else spec.health.timeout_s, poll_s)


def status(spec: ClusterSpec, group: str | None = None, timeout_ms: int = 2000, namesrv: bool = True,
           stopped: frozenset = frozenset()) -> dict:
    """Every node's row and each group's verdict; `verdict` is the worst group's (and, for the
    whole cluster with name servers and `namesrv`, the name servers' view: `namesrv`).
    `stopped`: nodes known to have no process (a local cluster's pid files): state "stopped",
    not probed."""
    plans = spec.nodes(group)
    with ThreadPoolExecutor(max_workers=min(16, len(plans))) as ex:
        creds = credentials_for(spec)
        answers = list(ex.map(lambda p: {"state": "stopped", "error": "no process"} if p.id in stopped
                              else probe(p.address, timeout_ms, creds), plans))
    out = {"cluster": spec.name, "provider": spec.provider, "groups": []}
    for g in ([spec.group(group)] if group else spec.groups):
        rows = [row_of(p, st) for p, st in zip(plans, answers) if p.group.name == g.name]
        v = verdict(g.mode, rows, spec.health.lag_entries_max, spec.health.lag_bytes_max)
        out["groups"].append({"name": g.name, "mode": g.mode, **v, "nodes": rows})
    verdicts = [g["verdict"] for g in out["groups"]]
    if namesrv and group is None and spec.namesrv is not None:
        out["namesrv"] = namesrv_status(spec, out["groups"], timeout_ms)
        verdicts.append(out["namesrv"]["verdict"])
    out["verdict"] = max(verdicts, key=RANK.__getitem__)
    return out


def wait_healthy(spec: ClusterSpec, timeout_s: float | None = None, group: str | None = None,
                 poll_s: float = 0.2, namesrv: bool = True) -> dict:
    """Poll until healthy; the last status (whatever its verdict) when time runs out."""
    def check():
        st = status(spec, group, namesrv=namesrv)
        return st["verdict"] == "healthy", st
    return _poll_until(check, timeout_s if timeout_s is not None else spec.health.timeout_s, poll_s)


def behind(group: dict) -> dict[str, str]:
    """A group's nodes that do not hold all of its leader's (master's) log yet, with why: the
    leader's own view of each raft follower (in APPEND with nothing left to send), a slave's
    byte lag. Healthy allows a bounded lag; a drill compares logs only once this is empty
    (a restarted follower may still hold a suffix its new leader has not cut). `group` is one
    of `status`'s groups."""
    leader = next((r for r in group["nodes"] if r["id"] == group.get("leader")), None)
    if leader is None:
        return {r["id"]: "no leader" for r in group["nodes"]}
    out = {}
    for r in group["nodes"]:
        if r is leader:
            continue
        if r["state"] != "up":
            out[r["id"]] = r["state"]
        elif group["mode"] == "raft":
            f = (leader.get("followers") or {}).get(r["id"])
            if f is None or f.get("state") != "append" or f.get("lag"):
                out[r["id"]] = (f"the leader {leader['id']} sees it in {f.get('state')} with {f.get('lag')} "
                                f"entries to send" if f else f"the leader {leader['id']} does not list it")
        elif group["mode"] == "master-slave" and (not r.get("connected") or r.get("lag_bytes")):
            out[r["id"]] = (f"{r.get('lag_bytes')} bytes behind the master" if r.get("connected")
                            else "not connected to the master")
    return out


def wait_caught_up(spec: ClusterSpec, timeout_s: float, group: str | None = None,
                   poll_s: float = 0.1) -> tuple[dict, dict[str, str]]:
    """Poll until no node is `behind`: the last status and who is still behind (empty when
    everyone caught up in time)."""
    def check():
        st = status(spec, group, namesrv=False)
        late = {n: why for g in st["groups"] for n, why in behind(g).items()}
        return not late, (st, late)
    return _poll_until(check, timeout_s, poll_s)


def leader_of(spec: ClusterSpec, group: str | None = None, timeout_ms: int = 1000) -> NodePlan | None:
    st = status(spec, group, timeout_ms)
    g = st["groups"][0]
    return next((p for p in spec.nodes(g["name"]) if p.id == g["leader"]), None)
