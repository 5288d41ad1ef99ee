"""A local broker group on loopback: the embedded default (`tidelog cluster up|status|down`);
with `groups`/`namesrv`, several groups (g0, g1, ...) behind name servers.

A thin layer over the platform path. `up` writes a cluster spec (provider local) into the
cluster's directory and deploys it with ops.deploy, as `tidelog deploy` would; status is
ops.health.status; start, stop and signals go through ops.nodes. A node is found by what
runs (NodeOps.pid: the pid in its broker.json, alive, and its command line names the node's
config, read here from /proc: relative to the process's working directory, through symlinks),
so a node restarted by hand is seen and stopped like any other.

    DIR/cluster.yaml              the spec: `tidelog status|stop|start --spec DIR/cluster.yaml` work too
    DIR/nodes/<id>/broker.yaml    a node's config (`tidelog broker start --config` takes it)
    DIR/nodes/<id>/broker.log     its log; console.log: the process's own output
    DIR/nodes/<id>/data/          its store; data/broker.json: pid and port once it listens
    DIR/nodes/ns-<host>/          a name server: namesrv.yaml, namesrv.log, namesrv.pid

One group of N nodes runs on hosts n0..n{N-1} (node ids n0, n1, ...); G groups of N nodes each
on hosts n0..n{G*N-1}, group gi on its own N hosts (node ids gi-nK); K name servers on hosts
n0..n{K-1}, port NAMESRV_PORT (ids ns-n0, ...).

Every cluster gets a /24 of its own inside 127.0.0.0/8 (127.a.b.11, .12, ... with a != 0, so
never the example specs' 127.0.0.x), chosen where the group's ports are free on every node's
address: several clusters, tests and the examples run side by side on the usual ports.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from infra import providers
from infra import spec as specs
from ops import deploy, health
from ops.localbroker import pid_alive, port_free
from ops.nodes import NodeOps, read_pid

DEFAULT_DIR = Path(os.environ.get("TIDELOG_CLUSTER_DIR", "~/.tidelog/cluster")).expanduser()
SPEC_FILE = "cluster.yaml"
PORT = 10911                     # HA port: PORT + 1 (master-slave)
NAMESRV_PORT = 9876
SUBNET_TRIES = 64                # random /24s probed for free ports before giving up
SEGMENT_BYTES = 64 << 20         # a local group's segments, not the 1 GiB production default


class ClusterError(RuntimeError):
    pass


def config_args(cmdline: list[str]) -> list[str]:
    """The paths a `tidelog broker start` command line names as its config."""
    out = [b for a, b in zip(cmdline, cmdline[1:]) if a in ("--config", "-c")]
    return out + [a.split("=", 1)[1] for a in cmdline if a.startswith("--config=")]


class LocalNodeOps(NodeOps):
    """NodeOps on this machine. Its pid check reads /proc itself and takes the config path as the
    process saw it (relative to its working directory, through symlinks): a node restarted by
    hand from inside the cluster's directory (`tidelog broker start --config nodes/n0/broker.yaml`)
    is found, and stopped, like one started by deploy."""

    def pid(self) -> int | None:
        try:
            pid = read_pid(Path(self.pid_file).read_text())
            if pid is None:
                return None
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except (OSError, ValueError, KeyError, TypeError):
            return None
        want = Path(self.config_path).resolve()
        named = any(Path(cwd, c).resolve() == want for c in config_args(cmdline))
        return pid if named and pid_alive(pid) else None


class Node:
    """One node as tools and tests see it: where it lives, and its pid if it runs now."""

    def __init__(self, ops: NodeOps):
        self.ops = ops
        p = ops.plan
        self.id, self.address, self.ha_address, self.kind = p.id, p.address, p.ha_address, p.kind
        self.home, self.data_dir = p.home, p.data_dir
        self.config_path = p.config_file

    @property
    def pid(self) -> int | None:
        return self.ops.pid()

    def __repr__(self) -> str:
        return f"Node({self.id}@{self.address})"


def free_subnet(hosts: int, ports: list[int]) -> str:
    rng = random.Random()
    for _ in range(SUBNET_TRIES):
        net = f"127.{rng.randrange(1, 255)}.{rng.randrange(256)}"
        if all(port_free(f"{net}.{11 + i}", p) for i in range(hosts) for p in ports):
            return f"{net}.0/24"
    raise ClusterError(f"no loopback /24 with ports {ports} free after {SUBNET_TRIES} tries")


def cluster_name(directory: Path) -> str:
    """The name of the cluster `cluster up` makes in `directory` (its brokers are <name>-g0...,
    `collect` and the warehouse's partitions use it): "local" for the default directory, else
    the directory's own name, so that two local clusters reconciled on one day do not replace
    each other's partitions."""
    if Path(directory).expanduser().resolve() == DEFAULT_DIR.expanduser().resolve():
        return "local"
    name = re.sub(r"[^a-z0-9-]+", "-", Path(directory).name.lower()).strip("-")[:31].strip("-")
    return name or "local"


class LocalCluster:
    def __init__(self, directory: Path = DEFAULT_DIR):
        self.dir = Path(directory).expanduser().resolve()
        self._spec: specs.ClusterSpec | None = None

    # --- the spec ------------------------------------------------------------------------------

    @property
    def spec_path(self) -> Path:
        return self.dir / SPEC_FILE

    @property
    def spec(self) -> specs.ClusterSpec:
        if self._spec is None:
            if not self.spec_path.exists():
                raise ClusterError(f"no cluster in {self.dir} (start one with tidelog cluster up)")
            try:
                self._spec = specs.load(self.spec_path)
            except specs.SpecError as e:
                raise ClusterError(str(e)) from None
        return self._spec

    def load(self) -> LocalCluster:
        """Read the cluster's spec (ClusterError when there is none)."""
        _ = self.spec
        return self

    @property
    def mode(self) -> str:
        return self.spec.groups[0].mode

    def _write_spec(self, nodes: int, mode: str, flush: str, subnet: str, config: dict,
                    insecure: bool = False, groups: int = 1, namesrv: int = 0, name: str | None = None) -> None:
        name = name or cluster_name(self.dir)
        made = []
        for gi in range(groups):
            group = {"name": f"g{gi}", "mode": mode, "flush": flush,
                     "hosts": [f"n{gi * nodes + i}" for i in range(nodes)],
                     "port": PORT, "config": {"segment_bytes": SEGMENT_BYTES, **config}}
            if "ha_replication" in config:  # the broker field's name; the spec's is `replication`
                group["replication"] = group["config"].pop("ha_replication")
            made.append(group)
        hosts = [f"n{i}" for i in range(max(groups * nodes, namesrv))]
        data = {"name": name, "provider": "local", "version": "current", "state_dir": str(self.dir),
                "install_dir": str(self.dir), "network": {"subnet": subnet},
                "hosts": [{"name": h} for h in hosts], "groups": made}
        if namesrv:
            data["namesrv"] = {"hosts": hosts[:namesrv], "port": NAMESRV_PORT}
        if insecure:
            data["security"] = {"insecure": True}
        try:
            spec = specs.from_dict(data, f"cluster in {self.dir}")
        except specs.SpecError as e:
            raise ClusterError(str(e)) from None
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.spec_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(data, sort_keys=False))
        tmp.replace(self.spec_path)
        self._spec = spec

    # --- nodes ---------------------------------------------------------------------------------

    def _ops(self) -> list[LocalNodeOps]:
        return [LocalNodeOps(o.plan, o.host, o.fault_injection)
                for o in deploy.node_ops(self.spec, providers.get(self.spec))]

    def _namesrv_ops(self) -> list[LocalNodeOps]:
        return [LocalNodeOps(o.plan, o.host) for o in deploy.namesrv_ops(self.spec, providers.get(self.spec))]

    @property
    def nodes(self) -> list[Node]:
        """The broker nodes (of every group)."""
        return [Node(o) for o in self._ops()]

    @property
    def namesrvs(self) -> list[Node]:
        """The name servers (none unless `up(namesrv=K)`)."""
        return [Node(o) for o in self._namesrv_ops()]

    @property
    def namesrv_addresses(self) -> list[str]:
        return self.spec.namesrv_addresses

    def node(self, node_id: str) -> Node:
        try:
            plan = self.spec.node(node_id)
        except specs.SpecError as e:
            raise ClusterError(str(e)) from None
        return next(n for n in self.nodes if n.id == plan.id)

    @property
    def credentials_file(self) -> Path | None:
        """The admin user's credentials (TIDELOG_CREDENTIALS), None when insecure."""
        from ops.security import ClusterSecurity
        sec = ClusterSecurity(self.spec)
        return None if sec.insecure else sec.credentials_file()

    @property
    def addresses(self) -> list[str]:
        return [p.address for p in self.spec.nodes()]

    def running(self) -> list[Node]:
        """The broker nodes and name servers that run now."""
        return [n for n in self.nodes + self.namesrvs if n.pid is not None]

    # --- up / down -------------------------------------------------------------------------------

    def up(self, nodes: int, mode: str, flush: str = "async", fresh: bool = False, wait: bool = False,
           log=lambda msg: None, insecure: bool = False, groups: int = 1, namesrv: int = 0,
           **config) -> LocalCluster:
        """Write the spec and deploy it; `wait`: until healthy (deploy's health gate, and with
        name servers its route gate). Security is on (TLS, the admin user: `credentials_file`)
        unless `insecure`. `groups` groups of `nodes` nodes each; `namesrv` name servers."""
        if mode == "standalone" and nodes != 1:
            raise ClusterError("mode standalone runs one node (--nodes 1)")
        if nodes < 1:
            raise ClusterError(f"a {mode} group needs at least one node")
        if groups < 1:
            raise ClusterError(f"--groups {groups}: at least one group")
        if not 0 <= namesrv <= 9:
            raise ClusterError(f"--namesrv {namesrv}: 0 to 9 name servers")
        subnet = name = None
        if self.spec_path.exists():
            old = self.spec
            if old.provider != "local" or old.state != self.dir:
                raise ClusterError(f"{self.spec_path} is not the spec of a cluster that `tidelog cluster up` made "
                                   f"here: nothing touched; pick another --data-dir")
            if self.running():
                raise ClusterError(f"a cluster is already running in {self.dir}: `tidelog cluster down` first")
            if (fresh or old.groups[0].mode != mode or len(old.groups) != groups
                    or len(old.groups[0].hosts) != nodes or len(old.namesrvs()) != namesrv):
                # ours only, never the directory; the runtime ACL changes kept here went with the nodes' data
                for made in ("nodes", self.spec_path.name, "inventory.json", "security/acl.json"):
                    target = self.dir / made
                    shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
            else:  # the same group again: its data stays where it was, on the same addresses
                subnet, name = old.network.subnet, old.name  # (and its brokers' names)
        self._spec = None
        ports = ([PORT, PORT + 1] if mode == "master-slave" else [PORT]) + [NAMESRV_PORT] * bool(namesrv)
        subnet = subnet or free_subnet(max(nodes * groups, namesrv), ports)
        self._write_spec(nodes, mode, flush, subnet, config, insecure, groups, namesrv, name)
        provider = providers.get(self.spec)
        provider.up()
        try:
            deploy.deploy(self.spec, provider=provider, wait=wait, log=log)
        except RuntimeError as e:  # DeployError, NodeError: whatever did start keeps running
            raise ClusterError(f"{e}\n(see `tidelog cluster status --data-dir {self.dir}`; "
                               f"`tidelog cluster down --data-dir {self.dir}` stops what runs)") from None
        return self

    def down(self) -> list[str]:
        """Stop every node that runs (however it was started), then the name servers; the ids
        it stopped."""
        out = []
        for ops in (self._ops(), self._namesrv_ops()):
            if not ops:
                continue
            with ThreadPoolExecutor(max_workers=len(ops)) as ex:
                stopped = list(ex.map(lambda o: o.stop(), ops))
            out += [o.plan.id for o, s in zip(ops, stopped) if s]
        return out

    def kill(self, node_id: str, sig: int = signal.SIGKILL) -> None:
        """Signal a node: kill -9 by default (the bench times failover from here: no waiting),
        SIGSTOP/SIGCONT for a hang."""
        pid = self.node(node_id).pid
        if pid is None:
            raise ClusterError(f"{node_id} is not running")
        os.kill(pid, sig)

    def restart(self, node_id: str) -> None:
        """Stop the node if it runs, start it again on the build it ran."""
        o = self.node(node_id).ops
        o.stop()
        o.start(o.build() or deploy.resolve(self.spec).name)

    # --- status ------------------------------------------------------------------------------------

    def health(self, timeout_ms: int = 2000) -> dict:
        """ops.health.status, each row with the node's pid (None: not running, "stopped")."""
        pids = {n.id: n.pid for n in self.nodes + self.namesrvs}
        st = health.status(self.spec, timeout_ms=timeout_ms,
                           stopped=frozenset(n for n, pid in pids.items() if pid is None))
        st["dir"] = str(self.dir)
        for g in st["groups"]:
            for row in g["nodes"]:
                row["pid"] = pids.get(row["id"])
        for row in (st.get("namesrv") or {}).get("servers", []):
            row["pid"] = pids.get(row["id"])
        return st

    def status(self) -> dict:
        """health() with the one group's fields on top: mode, leader, problems, nodes."""
        creds = self.credentials_file
        return {**flat(self.health()), "credentials": str(creds) if creds else None}

    def wait_healthy(self, timeout_s: float = 20.0) -> dict:
        return flat(health.wait_healthy(self.spec, timeout_s))

    def wait_for_leader(self, timeout_s: float = 15.0, exclude: str | None = None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leader = health.status(self.spec, timeout_ms=1000)["groups"][0]["leader"]
            if leader is not None and leader != exclude:
                return leader
            time.sleep(0.05)
        raise ClusterError(f"no leader within {timeout_s}s")


def flat(st: dict) -> dict:
    g = st["groups"][0]
    return {**st, "mode": g["mode"], "leader": g["leader"], "problems": g["problems"], "nodes": g["nodes"]}
