"""`tidelog deploy|start|stop`: get a spec's name servers and broker groups running on its hosts.

With a `namesrv` section the name servers start first (each waited until it answers
GET_CLUSTER_INFO), then the groups as below, then a route gate: every name server lists every
group with the leader the group's own STATUS reports. `stop` stops the groups first, then the
name servers (a clean stop unregisters from them); `start` the reverse.

Deploy converges: install the build on every host that lacks it (in parallel), write each
node's config, start the nodes that are not running, then wait until every group is healthy.
A node already running the wanted build with the wanted config is left alone, so deploying
again to a healthy cluster changes nothing. A running node on another build or config is not
restarted behind the operator's back: the report says so and points at `tidelog upgrade`
(which rolls one node at a time behind health gates).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from infra import providers
from infra.spec import ClusterSpec
from ops import health
from ops.build import Artifact, artifact
from ops.nodes import NodeOps, install
from ops.security import ClusterSecurity


class DeployError(RuntimeError):
    def __init__(self, message: str, report: dict | None = None):
        super().__init__(message)
        self.report = report or {}


def resolve(spec: ClusterSpec, version: str | None = None) -> Artifact:
    return artifact(version or spec.version, spec.wheels_dir, in_place_ok=spec.provider == "local")


def node_ops(spec: ClusterSpec, provider, group: str | None = None) -> list[NodeOps]:
    """The broker nodes' ops (of one group, or all)."""
    hosts = provider.hosts()
    return [NodeOps(p, hosts[p.host], fault_injection=spec.provider == "local") for p in spec.nodes(group)]


def namesrv_ops(spec: ClusterSpec, provider) -> list[NodeOps]:
    """The name servers' ops (none without a namesrv section)."""
    plans = spec.namesrvs()
    hosts = provider.hosts() if plans else {}
    return [NodeOps(p, hosts[p.host]) for p in plans]


def _targets(ops: list[NodeOps], node: str | None) -> list[NodeOps]:
    # a broker node by id or host; a name server by its id only (its host may hold brokers too)
    return [o for o in ops if node is None or node == o.plan.id or (o.kind == "broker" and node == o.plan.host)]


def _parallel(fn, items: list) -> list:
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(items))) as ex:
        return list(ex.map(fn, items))


def install_everywhere(spec: ClusterSpec, provider, art: Artifact, host_names=None) -> list[str]:
    """Install `art` on the hosts (all by default) in parallel; the hosts that needed it."""
    hosts = provider.hosts()
    names = sorted(host_names or hosts)
    # provider local: every host is this machine, so hosts whose install dir is one path share
    # it (`tidelog cluster up` gives them one): install there once, not several times at once
    # (concurrent copies and venvs into one directory break each other)
    lanes: dict[str, list[str]] = {}
    for n in names:
        lanes.setdefault(spec.install_dir_of(n) if spec.provider == "local" else n, []).append(n)

    def lane(ns: list[str]) -> list[bool]:
        return [install(hosts[n], spec.install_dir_of(n), art, spec.python) for n in ns]

    with ThreadPoolExecutor(max_workers=min(8, len(lanes))) as ex:
        did = dict(zip((n for ns in lanes.values() for n in ns),
                       (d for ds in ex.map(lane, lanes.values()) for d in ds)))
    return [n for n in names if did[n]]


def deploy(spec: ClusterSpec, version: str | None = None, provider=None, wait: bool = True,
           log=lambda msg: None, on_node=lambda node, what: None) -> dict:
    """`on_node(node id, what happened)` once per node, as each is settled (for progress)."""
    p = provider or providers.get(spec)
    art = resolve(spec, version)
    log(f"build {art.name}" + (f" ({art.wheel.name})" if art.wheel else " (this tree, in place)"))
    sec = ClusterSecurity(spec)
    sec.ensure()
    log("security: insecure (no TLS, no authentication)" if sec.insecure else
        f"security: TLS from the cluster CA, SCRAM users; admin credentials in {sec.credentials_file()}")
    installed = install_everywhere(spec, p, art)
    if installed:
        log(f"installed on {', '.join(installed)}")
    report = {"cluster": spec.name, "build": art.name, "installed_on": installed, "nodes": {},
              "credentials": None if sec.insecure else str(sec.credentials_file())}
    def settle(all_ops: list[NodeOps]) -> list[NodeOps]:
        """Record the running ones; write the configs of the others: the ones to start."""
        todo = []
        for ops in all_ops:
            pid = ops.pid()
            if pid is not None:
                same_build, same_config = ops.build() == art.name, ops.config_current()
                if same_build and same_config:
                    report["nodes"][ops.plan.id] = "unchanged"
                else:
                    why = "another build" if not same_build else "another config"
                    report["nodes"][ops.plan.id] = (f"running {ops.build()} with {why}: not touched "
                                                    f"(`tidelog upgrade` rolls it safely)")
                on_node(ops.plan.id, report["nodes"][ops.plan.id])
                continue
            ops.write_config()
            todo.append(ops)
        return todo

    def start_one(o: NodeOps) -> int:
        pid = o.start(art.name)
        on_node(o.plan.id, f"started (pid {pid})")
        return pid

    def start_all(todo: list[NodeOps]) -> None:
        for ops, pid in zip(todo, _parallel(start_one, todo)):
            report["nodes"][ops.plan.id] = f"started (pid {pid})"
            log(f"{ops.plan.id} started on {ops.plan.host} ({ops.plan.address}), pid {pid}")

    # name servers first: the brokers register with them as they start
    ns_todo = settle(namesrv_ops(spec, p))
    start_all(ns_todo)
    if wait and spec.namesrv is not None:
        silent = health.wait_namesrv_answering(spec)
        if silent:
            raise DeployError(f"name servers not answering GET_CLUSTER_INFO after {spec.health.timeout_s}s: "
                              + "; ".join(silent), report)
    # a group needs a quorum up to elect: start a group's nodes together
    todo = settle(node_ops(spec, p))
    start_all(todo)
    report["changed"] = bool(installed or todo or ns_todo)
    if wait:
        st = health.wait_healthy(spec, namesrv=False)
        report["status"] = st
        if st["verdict"] != "healthy":
            problems = "; ".join(q for g in st["groups"] for q in g["problems"])
            raise DeployError(f"the cluster is {st['verdict']} after {spec.health.timeout_s}s: {problems}", report)
        if spec.namesrv is not None:  # the route gate
            st = health.wait_healthy(spec)
            report["status"] = st
            if st["verdict"] != "healthy":
                problems = "; ".join([*(q for g in st["groups"] for q in g["problems"]),
                                      *st["namesrv"]["problems"]])
                raise DeployError(f"route gate: the name servers do not route every group to its leader after "
                                  f"{spec.health.timeout_s}s: {problems}", report)
            log("route gate: every name server routes every group to its leader")
    return report


def stop(spec: ClusterSpec, node: str | None = None, provider=None) -> dict:
    """Stop the groups' nodes, then the name servers (or the one `node`)."""
    p = provider or providers.get(spec)
    brokers, names = _targets(node_ops(spec, p), node), _targets(namesrv_ops(spec, p), node)
    if not brokers and not names:
        raise DeployError(f"no node {node!r} in the spec")
    out = {}
    for targets in (brokers, names):
        stopped = _parallel(lambda o: o.stop(), targets)
        out.update({o.plan.id: "stopped" if s else "was not running" for o, s in zip(targets, stopped)})
    return out


def start(spec: ClusterSpec, node: str | None = None, provider=None, wait: bool = True) -> dict:
    """Start stopped nodes on the build they last ran (or the spec's, for a node never started)."""
    p = provider or providers.get(spec)
    # name servers first: started brokers register at once
    targets = _targets(namesrv_ops(spec, p), node) + _targets(node_ops(spec, p), node)
    if not targets:
        raise DeployError(f"no node {node!r} in the spec")
    out = {}
    todo = []
    for o in targets:
        if o.pid() is not None:
            out[o.plan.id] = "already running"
        else:
            todo.append(o)
    default = None
    if todo:
        ClusterSecurity(spec).ensure()
    for o in todo:
        b = o.build()
        if b is None:
            default = default or resolve(spec)
            install_everywhere(spec, p, default, [o.plan.host])
            o.write_config()
            b = default.name
        out[o.plan.id] = b
    ns_todo = [o for o in todo if o.kind == "namesrv"]
    todo = ns_todo + [o for o in todo if o.kind == "broker"]
    pids = _parallel(lambda o: o.start(out[o.plan.id]), ns_todo)
    pids += _parallel(lambda o: o.start(out[o.plan.id]), todo[len(ns_todo):])
    for o, pid in zip(todo, pids):
        out[o.plan.id] = f"started {out[o.plan.id]} (pid {pid})"
    if wait and todo:
        st = health.wait_healthy(spec)
        out["verdict"] = st["verdict"]
    return out
