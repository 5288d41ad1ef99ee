"""`tidelog collect`: copy every node's CommitLog segments and checkpoint into
`DIR/<cluster>/<node>/` (SFTP for remote hosts), for the reconcile job and drill checks.

Each node directory also gets `node.json`: the node's group, mode, role and indexes at
collection time (the reconcile job reads the group's committed index from there). A node
that cannot be reached is recorded in `collect.json` with the reason, never a crash: a
missing replica is exactly what the reconcile job must report. With name servers, collect.json
also keeps their view at collection time (`namesrv`: per name server, per group the leader it
routed to), beside each group's own STATUS: a route that disagreed is there to see.
"""

from __future__ import annotations

import json
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra import providers
from infra.hosts import HostError
from infra.spec import ClusterSpec, NodePlan
from ops.security import credentials_for
from ops import health

FILES = ("checkpoint", "raft_state.json")


class NothingToCollect(RuntimeError):
    """The node's data directory holds no CommitLog: it was never deployed or started."""


def collect_node(host, plan: NodePlan, dest: Path, st: dict) -> dict:
    if dest.exists():
        shutil.rmtree(dest)  # never leave an earlier collection's files looking current
    entries = host.listdir(plan.data_dir)
    if not any(name == "commitlog" and is_dir for name, is_dir, _ in entries):
        raise NothingToCollect(f"no CommitLog in {plan.data_dir} on {plan.host} (never deployed or started there?)")
    dest.mkdir(parents=True)
    copied = 0
    # The checkpoint first, then the log: on a live node the log only grows past what the
    # checkpoint (and the status probe, taken before) call committed. Copied the other way
    # round, a checkpoint written meanwhile could name entries the copied log lacks, and the
    # reconcile job would call them lost.
    for name, is_dir, size in entries:
        if name in FILES and not is_dir:
            host.get(f"{plan.data_dir}/{name}", dest / name)
            copied += size
    for name, is_dir, size in entries:
        if name in ("commitlog", "ha") and is_dir:
            copied += host.get_tree(f"{plan.data_dir}/{name}", dest / name)
    info = {"id": plan.id, "group": plan.group.name, "mode": plan.group.mode, "host": plan.host,
            "address": plan.address, "collected_at": time.time(), "bytes": copied,
            "state": st.get("state"), "role": st.get("role"), "version": st.get("version")}
    repl = st.get("replication") or {}
    for k in ("term", "commit_index", "begin_index", "end_index", "epoch", "confirm_offset"):
        if k in repl:
            info[k] = repl[k]
    store = st.get("store") or {}
    if "committed_index" in store:  # both modes: the highest index this node knows committed
        info["committed_index"] = store["committed_index"]
    (dest / "node.json").write_text(json.dumps(info, indent=1))
    return info


def collect(spec: ClusterSpec, out: Path, group: str | None = None, provider=None,
            on_node=lambda info: None) -> dict:
    """Every node's copy (`on_node(info)` as each one finishes); `missing` lists the nodes
    that could not be collected and `collect.json` says why."""
    p = provider or providers.get(spec)
    hosts = p.hosts()
    plans = spec.nodes(group)
    base = Path(out) / spec.name

    def one(plan: NodePlan) -> dict:
        st = health.probe(plan.address, 2000, credentials_for(spec))
        try:
            info = collect_node(hosts[plan.host], plan, base / plan.id, st)
        except NothingToCollect as e:
            info = {"id": plan.id, "group": plan.group.name, "error": str(e)}
        except (HostError, OSError) as e:
            info = {"id": plan.id, "group": plan.group.name, "error": f"{type(e).__name__}: {e}"}
        on_node(info)
        return info

    with ThreadPoolExecutor(max_workers=min(8, len(plans))) as ex:
        nodes = list(ex.map(one, plans))
    summary = {"cluster": spec.name, "dir": str(base), "collected_at": time.time(), "nodes": nodes,
               "bytes": sum(n.get("bytes", 0) for n in nodes),
               "missing": [n["id"] for n in nodes if "error" in n]}
    if spec.namesrv is not None and group is None:
        st = health.status(spec)
        summary["groups"] = {g["name"]: {"verdict": g["verdict"], "leader": g["leader"]} for g in st["groups"]}
        summary["namesrv"] = st["namesrv"]
    base.mkdir(parents=True, exist_ok=True)
    (base / "collect.json").write_text(json.dumps(summary, indent=1))
    return summary
