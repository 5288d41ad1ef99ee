"""What a collection directory holds, read on the driver: which clusters, which nodes (and
which could not be collected), each node's segment files and committed index. Only file names
and small metadata files are read here; segment contents are read by the Spark tasks.

Accepted layouts: DIR/<cluster>/<node>/ (what `tidelog collect --out DIR` writes) or
DIR = one cluster's directory (it holds collect.json, or node directories).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from broker.store import checkpoint
from broker.store.logreader import segments


@dataclass
class NodeInput:
    id: str
    group: str
    mode: str | None
    dir: Path | None
    state: str  # ok | missing | empty | unreadable
    error: str | None = None
    committed_index: int = -1
    segments: list = field(default_factory=list)  # (path, base offset)


@dataclass
class ClusterInput:
    name: str
    dir: Path
    nodes: list[NodeInput]

    def groups(self) -> dict[str, list[NodeInput]]:
        out: dict[str, list[NodeInput]] = {}
        for n in self.nodes:
            out.setdefault(n.group, []).append(n)
        return out


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _is_node_dir(d: Path) -> bool:
    return (d / "commitlog").is_dir() or (d / "node.json").exists() or (d / "checkpoint").exists()


def _is_cluster_dir(d: Path) -> bool:
    return (d / "collect.json").exists() or any(_is_node_dir(c) for c in d.iterdir() if c.is_dir())


def own_committed_index(d: Path, info: dict | None = None) -> int:
    """The highest index the node in `d` itself knew committed, the most any of its collected
    files says (node.json's commit_index / committed_index, its checkpoint); -1 for none. Its
    store never lets it pass its own log's end: entries up to it that the log lacks were lost."""
    info = _json(d / "node.json") if info is None else info
    cp = checkpoint.read(d / "checkpoint")
    known = [info.get(k) for k in ("commit_index", "committed_index")] + [cp.committed_index if cp else None]
    return max([int(v) for v in known if v is not None] + [-1])


def read_node(d: Path, listed: dict) -> NodeInput:
    info = {**listed, **_json(d / "node.json")}
    n = NodeInput(d.name, str(info.get("group") or "g0"), info.get("mode"), d, "ok")
    n.committed_index = own_committed_index(d, info)
    try:
        n.segments = [(p, int(p.name)) for p in segments(d)]
    except OSError as e:
        n.state, n.error = "unreadable", f"{type(e).__name__}: {e}"
        return n
    if not (d / "commitlog").is_dir():
        n.state, n.error = "unreadable", "no commitlog directory"
    elif not n.segments:
        n.state, n.error = "empty", "no segment files"
    return n


def read_cluster(d: Path) -> ClusterInput:
    meta = _json(d / "collect.json")
    listed = {n["id"]: n for n in meta.get("nodes", []) if "id" in n}
    nodes = []
    for child in sorted(p for p in d.iterdir() if p.is_dir()):
        if _is_node_dir(child) or child.name in listed:
            nodes.append(read_node(child, listed.get(child.name, {})))
    seen = {n.id for n in nodes}
    for nid, info in sorted(listed.items()):
        if nid not in seen:
            why = info.get("error") or "its directory is not in the collection"
            nodes.append(NodeInput(nid, str(info.get("group") or "g0"), info.get("mode"), None, "missing", why))
    return ClusterInput(str(meta.get("cluster") or d.name), d, nodes)


def discover(logs: Path) -> list[ClusterInput]:
    logs = Path(logs)
    if not logs.is_dir():
        raise FileNotFoundError(f"no collection directory {logs} (tidelog collect --out writes one)")
    if (logs / "collect.json").exists() or any(_is_node_dir(c) for c in logs.iterdir() if c.is_dir()):
        found = [read_cluster(logs)]
    else:
        found = [read_cluster(c) for c in sorted(logs.iterdir()) if c.is_dir() and _is_cluster_dir(c)]
    found = [c for c in found if c.nodes]
    if not found:
        raise FileNotFoundError(f"{logs} holds no collected cluster (<cluster>/<node>/commitlog/)")
    return found
