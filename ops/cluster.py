"""A local broker group on loopback: the embedded default (`tidelog cluster up|status|down`).

Each node is its own process (ops.localbroker), detached from the command that started it;
`cluster.json` in the cluster's directory records the mode, every node's id, address, data
directory and pid, so later commands (and other processes) find and stop them by pid.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from broker.client import Admin, TidelogError
from ops.localbroker import LocalBroker, free_ports, pid_alive, stop_pid

DEFAULT_DIR = Path(os.environ.get("TIDELOG_CLUSTER_DIR", "~/.tidelog/cluster")).expanduser()
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    pass


@dataclass
class NodeInfo:
    id: str
    address: str
    data_dir: str
    pid: int | None = None
    ha_address: str | None = None  # master-slave: where its HA port listens


class LocalCluster:
    def __init__(self, directory: Path = DEFAULT_DIR):
        self.dir = Path(directory).expanduser().resolve()
        self.mode = "standalone"
        self.nodes: list[NodeInfo] = []
        self.brokers: dict[str, LocalBroker] = {}  # nodes this process started

    # --- state ---------------------------------------------------------------------------------

    @property
    def state_path(self) -> Path:
        return self.dir / STATE_FILE

    def load(self) -> LocalCluster:
        try:
            d = json.loads(self.state_path.read_text())
        except FileNotFoundError:
            raise ClusterError(f"no cluster in {self.dir} (start one with `tidelog cluster up`)") from None
        self.mode = d["mode"]
        self.nodes = [NodeInfo(**n) for n in d["nodes"]]
        return self

    def save(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"mode": self.mode, "nodes": [n.__dict__ for n in self.nodes]}, indent=1))
        tmp.replace(self.state_path)

    def running(self) -> list[NodeInfo]:
        return [n for n in self.nodes if n.pid and pid_alive(n.pid)]

    @property
    def addresses(self) -> list[str]:
        return [n.address for n in self.nodes]

    # --- up / down -------------------------------------------------------------------------------

    def up(self, nodes: int, mode: str, flush: str = "async", fresh: bool = False,
           **config) -> LocalCluster:
        if self.state_path.exists():
            self.load()
            if self.running():
                raise ClusterError(f"a cluster is already running in {self.dir}: "
                                   f"`tidelog cluster down` first")
            if fresh or self.mode != mode or len(self.nodes) != nodes:
                shutil.rmtree(self.dir)
                self.nodes = []
        if mode == "standalone" and nodes != 1:
            raise ClusterError("mode standalone runs one node (--nodes 1)")
        if mode in ("raft", "master-slave") and nodes < 1:
            raise ClusterError(f"a {mode} group needs at least one node")
        self.mode = mode
        if not self.nodes:
            ports = free_ports(2 * nodes if mode == "master-slave" else nodes)
            self.nodes = [NodeInfo(f"n{i}", f"127.0.0.1:{ports[i]}", str(self.dir / f"n{i}"))
                          for i in range(nodes)]
            if mode == "master-slave":
                for i, n in enumerate(self.nodes):
                    n.ha_address = f"127.0.0.1:{ports[nodes + i]}"
        # a local group: 64 MiB segments unless told otherwise (not the 1 GiB production default)
        base = {"mode": mode, "flush": flush, "segment_bytes": 64 << 20, **config}
        if mode == "raft":
            base["peers"] = [{"id": n.id, "address": n.address} for n in self.nodes]
        if mode == "master-slave":
            base["peers"] = [{"id": n.id, "address": n.address, "ha_address": n.ha_address}
                             for n in self.nodes]
            base.setdefault("in_sync_replicas", min(2, nodes))
        for n in self.nodes:
            cfg = dict(base, broker_name=n.id)
            if mode in ("raft", "master-slave"):
                cfg["node_id"] = n.id
            if mode == "master-slave":
                cfg["role"] = "master" if n is self.nodes[0] else "slave"
            host, port = n.address.rsplit(":", 1)
            b = LocalBroker(Path(n.data_dir), host=host, port=int(port), **cfg)
            self.brokers[n.id] = b
        try:
            for n in self.nodes:
                n.pid = self.brokers[n.id].start().pid
        finally:
            self.save()
        return self

    def down(self) -> list[str]:
        """Stop every node by its recorded pid; the ids that had to be killed."""
        killed = [n.id for n in self.running() if stop_pid(n.pid)]
        for n in self.nodes:
            n.pid = None
        self.save()
        return killed

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        n = self.node(node_id)
        if n.pid:
            os.kill(n.pid, sig)

    def restart(self, node_id: str) -> None:
        n = self.node(node_id)
        b = self.brokers.get(node_id) or self._attach(n)
        if n.pid and pid_alive(n.pid):
            stop_pid(n.pid)
        n.pid = b.start().pid
        self.save()

    def _attach(self, n: NodeInfo) -> LocalBroker:
        host, port = n.address.rsplit(":", 1)
        b = LocalBroker.from_existing(Path(n.data_dir), host, int(port))
        self.brokers[n.id] = b
        return b

    def node(self, node_id: str) -> NodeInfo:
        for n in self.nodes:
            if n.id == node_id:
                return n
        raise ClusterError(f"no node {node_id!r} (nodes: {[n.id for n in self.nodes]})")

    # --- status ------------------------------------------------------------------------------------

    def status(self) -> dict:
        out = {"mode": self.mode, "dir": str(self.dir), "nodes": []}
        for n in self.nodes:
            row = {"id": n.id, "address": n.address, "pid": n.pid, "data_dir": n.data_dir}
            if not (n.pid and pid_alive(n.pid)):
                row["state"] = "down"
            else:
                try:
                    with Admin([n.address], request_timeout_ms=2000, connect_timeout_ms=1000) as a:
                        st = a.status()
                    row.update(state="up", role=st["role"], version=st["version"], store=st["store"],
                               replication=st.get("replication", {}))
                except TidelogError as e:
                    row.update(state="unreachable", error=str(e))
            out["nodes"].append(row)
        leaders = [r["id"] for r in out["nodes"] if r.get("role") in ("leader", "master")]
        out["leader"] = leaders[0] if len(leaders) == 1 else None
        up = sum(r["state"] == "up" for r in out["nodes"])
        healthy = up == len(self.nodes) and (self.mode == "standalone" or out["leader"])
        if healthy and self.mode == "master-slave":  # and every slave copies from the master
            healthy = all(r["replication"].get("connected") for r in out["nodes"] if r["role"] == "slave")
        out["verdict"] = "healthy" if healthy else "down" if up == 0 else "degraded"
        return out

    def wait_healthy(self, timeout_s: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            st = self.status()
            if st["verdict"] == "healthy" or time.monotonic() > deadline:
                return st
            time.sleep(0.1)

    def wait_for_leader(self, timeout_s: float = 15.0, exclude: str | None = None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for n in self.running():
                if n.id == exclude:
                    continue
                try:
                    with Admin([n.address], request_timeout_ms=1000, connect_timeout_ms=500) as a:
                        if a.status()["role"] in ("leader", "master"):
                            return n.id
                except TidelogError:
                    pass
            time.sleep(0.05)
        raise ClusterError(f"no leader within {timeout_s}s")
