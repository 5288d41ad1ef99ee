"""`tidelog upgrade --to V`: a rolling upgrade, one node at a time, behind health gates.

    pre-check   the group is healthy (every node up, caught up within the spec's lag bound)
    install     the new build on every host, side by side with the old (nothing stops yet)
    followers   one at a time: stop, start on the new build, wait until healthy again
    leader      move leadership to a caught-up follower (raft: leadership transfer;
                master-slave: promotion of an in-sync slave), then upgrade it like a follower

Any failed gate stops the roll where it is (the cluster keeps serving: at most one node is
ever down) and the report says where and why. `rollback()` (or `--rollback` after a failure)
returns the upgraded nodes to the build each ran before, by the same one-at-a-time procedure.
The roll's progress is kept in `<state dir>/upgrade.json`, so a later `tidelog upgrade
--rollback` knows what to undo.

A spec with several groups or name servers, rolled with no group named, is rolled whole:

    name servers  one at a time: restart on the new build, then the route gate -- every name
                  server lists every group with the leader the group's STATUS reports (the
                  brokers re-register on reconnect) -- before the next one goes down, so a
                  client always finds a name server with complete routes
    groups        one after another, each by the procedure above, then the route gate again
                  (its new leader is what every name server hands out)

Mixed builds run side by side during the roll: frames carry a protocol version, and a node
accepts every version from MIN_VERSION to its own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from broker.client import Admin, TidelogError
from infra import providers
from infra.spec import ClusterSpec
from ops.security import ClusterSecurity, credentials_for
from ops import health
from ops.deploy import install_everywhere, namesrv_ops, node_ops, resolve
from ops.nodes import NodeError, NodeOps


PROBE_TIMEOUT_MS = 1000  # the quick look before a roll or a drill: a stopped node refuses at once


class UpgradeError(RuntimeError):
    def __init__(self, message: str, report: dict):
        super().__init__(message)
        self.report = report


class ClusterDown(UpgradeError):
    """No node of the group answers: nothing runs there (never deployed, or stopped). An
    UpgradeError, so callers that handle a stopped roll handle this too."""

    def __init__(self, cluster: str, problems: list[str]):
        super().__init__(f"{cluster} is down: {'; '.join(problems)}; start it with tidelog deploy",
                         {"cluster": cluster, "verdict": "down", "problems": problems, "upgraded": []})


def require_running(spec: ClusterSpec, group: str | None = None, error=ClusterDown) -> dict:
    """One quick status probe before a workload starts: a group none of whose nodes answers
    fails at once (`error`, a ClusterDown) instead of waiting out the health gate's timeout;
    a running group, even degraded or electing, is left to the gates. Returns its status."""
    g = health.status(spec, spec.group(group).name, PROBE_TIMEOUT_MS)["groups"][0]
    if not any(row["state"] == "up" for row in g["nodes"]):
        raise error(spec.name, g["problems"][:len(g["nodes"])])
    return g


def _state_path(spec: ClusterSpec) -> Path:
    return spec.state / "upgrade.json"


def _save(spec: ClusterSpec, state: dict) -> None:
    spec.state.mkdir(parents=True, exist_ok=True)
    tmp = _state_path(spec).with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(_state_path(spec))


class Roll:
    def __init__(self, spec: ClusterSpec, group: str | None, provider, log, on_node=lambda node, what: None):
        self.spec, self.g = spec, spec.group(group)
        self.on_node = on_node  # (node id, what happened) once per node done, for progress
        self.p = provider or providers.get(spec)
        self.ops = {o.plan.id: o for o in node_ops(spec, self.p, self.g.name)}
        self.log = log
        self.steps: list[dict] = []

    def gate(self, what: str, tolerate: frozenset = frozenset()) -> dict:
        """Wait until healthy; a rollback tolerates the nodes it is about to fix being down."""
        deadline = time.monotonic() + self.spec.health.timeout_s
        while True:
            st = health.status(self.spec, self.g.name)
            g = st["groups"][0]
            if st["verdict"] == "healthy" or (st["verdict"] == "degraded" and set(g["lagging"]) <= tolerate):
                return g
            if time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if st["verdict"] != "healthy":
            raise _GateFailed(f"{what}: the group is {st['verdict']} after {self.spec.health.timeout_s}s: "
                              + "; ".join(g["problems"]))
        return g

    def restart_on(self, o: NodeOps, build: str, tolerate: frozenset = frozenset()) -> dict:
        t0 = time.monotonic()
        before = o.build()
        o.stop()
        t_down = time.monotonic()
        o.write_config(rotate_cert=True)  # a new certificate with every restart: rotation
        try:
            pid = o.start(build)
        except NodeError as e:
            raise _GateFailed(f"{o.plan.id} did not start on {build}: {e}") from None
        t_up = time.monotonic()
        self.gate(f"after restarting {o.plan.id} on {build}", tolerate)
        step = {"node": o.plan.id, "from": before, "to": build, "pid": pid,
                "down_s": round(t_up - t_down, 3), "caught_up_s": round(time.monotonic() - t_up, 3),
                "total_s": round(time.monotonic() - t0, 3)}
        self.steps.append(step)
        self.log(f"  {o.plan.id}: {before} -> {build} (down {step['down_s']}s, caught up in "
                 f"{step['caught_up_s']}s)")
        return step

    def move_leadership(self, leader: str, g: dict) -> str:
        """Hand leadership to the most caught-up other node; the new leader's id."""
        others = [r for r in g["nodes"] if r["id"] != leader and r["state"] == "up"]
        if not others:
            raise _GateFailed(f"no other node to take over from {leader}")
        target = min(others, key=lambda r: r.get("lag") or 0)["id"]
        lo = self.ops[leader]
        with Admin([lo.plan.address], request_timeout_ms=10_000, credentials=credentials_for(self.spec)) as a:
            try:
                if self.g.mode == "raft":
                    a.transfer_leader(target)
                else:
                    a.promote(target)  # refused unless target is in sync
            except TidelogError as e:
                raise _GateFailed(f"moving leadership from {leader} to {target} failed: {e}") from None
        deadline = time.monotonic() + self.spec.health.timeout_s
        while time.monotonic() < deadline:
            st = health.status(self.spec, self.g.name, 1000)["groups"][0]
            if st["leader"] == target:
                self.log(f"  leadership moved {leader} -> {target}")
                self.steps.append({"leadership": {"from": leader, "to": target}})
                return target
            time.sleep(0.1)
        raise _GateFailed(f"{target} did not become the leader within {self.spec.health.timeout_s}s")

    def roll(self, targets: dict[str, str], tolerate_down: bool = False):
        """Move each node to targets[node] (a build name): followers first, the leader last.
        Yields each node just before it is restarted (so it counts as touched even if its
        restart then fails a gate)."""
        remaining = [n for n in sorted(targets)]
        while remaining:
            g = self.gate("pre-check" if not self.steps else "before the next node",
                          frozenset(remaining) if tolerate_down else frozenset())
            leader = g["leader"]
            broken = [n for n in remaining if n in g["lagging"]]  # a rollback fixes these first
            node = broken[0] if broken else next((n for n in remaining if n != leader), remaining[0])
            remaining.remove(node)
            o = self.ops[node]
            if o.build() == targets[node] and o.pid() is not None:
                self.log(f"  {node}: already on {targets[node]}")
                self.on_node(node, f"already on {targets[node]}")
                continue
            if node == leader and len(self.ops) > 1:
                self.move_leadership(leader, g)
            yield node
            self.restart_on(o, targets[node], frozenset(remaining) if tolerate_down else frozenset())
            self.on_node(node, f"on {targets[node]}")


class _GateFailed(Exception):
    pass


def upgrade(spec: ClusterSpec, to: str, group: str | None = None, rollback_on_failure: bool = False,
            provider=None, log=lambda m: None, workload_rate: float = 0.0,
            on_node=lambda node, what: None) -> dict:
    """Roll the group to `to` (no group, on a spec with several groups or name servers: the
    whole cluster, see the module doc). With `workload_rate`, acknowledged sends run through
    the roll (spread over the groups rolled) and the report's `workload` says whether any was
    lost and the longest gap between acks."""
    whole = whole_cluster(spec, group)
    groups = [g.name for g in spec.groups] if whole else [spec.group(group).name]
    for g in groups:
        require_running(spec, g)
    ClusterSecurity(spec).ensure()
    run = ((lambda: _upgrade_cluster(spec, to, rollback_on_failure, provider, log, on_node)) if whole else
           (lambda: _upgrade(spec, to, group, rollback_on_failure, provider, log, on_node)))
    if workload_rate <= 0:
        return run()
    from ops.drill.checker import check
    from ops.drill.workload import Workload, drain, ensure_topic

    run_id = time.strftime("upgrade-%Y%m%d-%H%M%S")
    creds = credentials_for(spec)
    via_namesrv = whole and spec.namesrv is not None
    if via_namesrv:  # through the name servers, to every group: a roll must not break routing
        from ops.drill.run import DrillError, make_topic
        try:
            make_topic(spec, run_id, creds)
        except DrillError as e:
            raise UpgradeError(f"the upgrade's workload could not start: {e}", {"cluster": spec.name}) from None
        loads = [(None, Workload([n.address for n in spec.nodes(groups[0])], run_id, run_id, workload_rate,
                                 credentials=creds, namesrv=spec.namesrv_addresses))]
    else:  # no name servers: each group its own workload, at an equal share of the rate
        loads = []
        for g in groups:
            bootstrap = [n.address for n in spec.nodes(g)]
            ensure_topic(bootstrap, run_id, credentials=creds)
            loads.append((g, Workload(bootstrap, run_id, f"{run_id}-{g}", workload_rate / len(groups),
                                      credentials=creds)))

    def checked() -> dict:
        errors = [f"{type(wl.error).__name__}: {wl.error}" for _, wl in loads if wl.error is not None]
        if errors:
            return {"safe": False, "error": "; ".join(errors)}
        each = {}
        for g, wl in loads:
            reads, problems = [], []
            # each group directly, as the drill's drain: proves nothing through the name servers
            for name in (groups if g is None else [g]):
                reads += drain([n.address for n in spec.nodes(name)], run_id, wl.run_id, problems=problems,
                               credentials=creds, group=name if via_namesrv else None)
            result = check(wl.ops, reads)
            each[g] = {"safe": result.ok and not problems, "topic": run_id, **result.figures,
                       "counts": result.counts, "anomalies": result.anomalies, "drain_problems": problems}
        if len(each) == 1:
            return next(iter(each.values()))
        rows = list(each.values())  # several groups, no name servers: summed, each group's own under `groups`
        out = {"safe": all(r["safe"] for r in rows), "topic": run_id, "groups": each,
               "longest_ack_gap_s": max(r.get("longest_ack_gap_s") or 0 for r in rows),
               "counts": {"lost": sum(r["counts"].get("lost", 0) for r in rows)}}
        for k in ("ops", "ok", "failed", "unknown"):
            out[k] = sum(r.get(k) or 0 for r in rows)
        out["ok_by_group"] = {g: r.get("ok") for g, r in each.items()}
        return out

    for _, wl in loads:
        wl.start(time.monotonic())
    try:
        report = run()
    except UpgradeError as e:
        for _, wl in loads:
            wl.stop()
        e.report["workload"] = checked()
        raise
    time.sleep(1.0)  # acks after the last restart, so a gap at the very end would show
    for _, wl in loads:
        wl.stop()
    report["workload"] = checked()
    return report


def whole_cluster(spec: ClusterSpec, group: str | None) -> bool:
    """No group named on a spec with several groups or name servers: the roll covers them all."""
    return group is None and (len(spec.groups) > 1 or spec.namesrv is not None)


def _upgrade(spec: ClusterSpec, to: str, group: str | None, rollback_on_failure: bool, provider,
             log, on_node) -> dict:
    r = Roll(spec, group, provider, log, on_node)
    art = resolve(spec, to)
    report = {"cluster": spec.name, "group": r.g.name, "to": art.name, "steps": r.steps, "upgraded": []}
    previous = {n: o.build() for n, o in r.ops.items()}
    state = {"group": r.g.name, "to": art.name, "previous": previous, "upgraded": report["upgraded"],
             "status": "in-progress", "started_at": time.time()}
    try:
        r.gate("pre-check")
        log(f"installing {art.name} on {', '.join(sorted({o.plan.host for o in r.ops.values()}))}")
        report["installed_on"] = install_everywhere(spec, r.p, art, sorted({o.plan.host for o in r.ops.values()}))
        _save(spec, state)
        for node in r.roll({n: art.name for n in r.ops}):
            report["upgraded"].append(node)
            _save(spec, state)
    except _GateFailed as e:
        state["status"] = report["status"] = "failed"
        report["stopped_at"] = str(e)
        report["verdict"] = health.status(spec, r.g.name)["verdict"]
        _save(spec, state)
        log(f"  stopped: {e} (the group is {report['verdict']})")
        if rollback_on_failure and report["upgraded"]:
            report["rollback"] = rollback(spec, group, r.p, log)
        raise UpgradeError(f"upgrade stopped: {e}", report) from None
    state["status"] = report["status"] = "done"
    _save(spec, state)
    report["versions"] = {row["id"]: row.get("version") for row in
                          health.status(spec, r.g.name)["groups"][0]["nodes"]}
    return report


def rollback(spec: ClusterSpec, group: str | None = None, provider=None, log=lambda m: None,
             on_node=lambda node, what: None) -> dict:
    """Return the nodes the last roll upgraded to the builds they ran before it."""
    try:
        state = json.loads(_state_path(spec).read_text())
    except FileNotFoundError:
        raise UpgradeError("nothing to roll back: no upgrade recorded for this cluster",
                           {"cluster": spec.name}) from None
    if state.get("scope") == "cluster":
        if group is not None:  # half of it undone would leave upgrade.json saying all of it was
            raise UpgradeError(f"the last roll covered the whole cluster: roll it back whole (no --group "
                               f"{group})", {"cluster": spec.name})
        return _rollback_cluster(spec, state, provider or providers.get(spec), log, on_node)
    r = Roll(spec, group or state["group"], provider, log, on_node)
    targets = {n: state["previous"][n] for n in state["upgraded"] if n in r.ops and state["previous"].get(n)}
    report = {"cluster": spec.name, "group": r.g.name, "rolled_back": [], "steps": r.steps}
    log(f"rolling back {sorted(targets)} to their previous builds")

    def work() -> None:
        for node in r.roll(targets, tolerate_down=True):
            report["rolled_back"].append(node)
    return _rolled_back(spec, state, report, work)


def _rolled_back(spec: ClusterSpec, state: dict, report: dict, work) -> dict:
    """Run a rollback's `work`; a failed gate stops it with the report saying where."""
    try:
        work()
    except _GateFailed as e:
        report["stopped_at"] = str(e)
        raise UpgradeError(f"rollback stopped: {e}", report) from None
    state["status"] = "rolled-back"
    _save(spec, state)
    return report


# ---- the whole cluster: name servers, then group by group ------------------------------------

def cluster_gate(spec: ClusterSpec, what: str, tolerate: frozenset = frozenset()) -> dict:
    """Wait (health.timeout_s) until every group is healthy and every name server routes every
    group to its leader: the route gate. `tolerate`: nodes a rollback is about to fix."""
    deadline = time.monotonic() + spec.health.timeout_s
    while True:
        st = health.status(spec)
        lagging = {n for g in st["groups"] for n in g.get("lagging", [])}
        ns_ok = st.get("namesrv", {}).get("verdict", "healthy") == "healthy"
        # (a group with a leader is down only as a SYNC master short of in-sync slaves: the
        # tolerated nodes, when they are all it lacks)
        if st["verdict"] == "healthy" or (tolerate and ns_ok and lagging <= tolerate
                                          and all(g["verdict"] != "down" or g.get("leader") is not None
                                                  for g in st["groups"])):
            return st
        if time.monotonic() > deadline:
            problems = [q for g in st["groups"] for q in g["problems"]] + st.get("namesrv", {}).get("problems", [])
            raise _GateFailed(f"{what}: the cluster is {st['verdict']} after {spec.health.timeout_s}s: "
                              + "; ".join(problems))
        time.sleep(0.2)


def _restart_namesrv(spec: ClusterSpec, o: NodeOps, build: str, steps: list, log,
                     tolerate: frozenset = frozenset()) -> None:
    t0 = time.monotonic()
    before = o.build()
    o.stop()
    t_down = time.monotonic()
    o.write_config(rotate_cert=True)
    try:
        o.start(build)
    except NodeError as e:
        raise _GateFailed(f"{o.plan.id} did not start on {build}: {e}") from None
    t_up = time.monotonic()
    cluster_gate(spec, f"route gate after restarting name server {o.plan.id} on {build}", tolerate)
    step = {"node": o.plan.id, "kind": "namesrv", "from": before, "to": build,
            "down_s": round(t_up - t_down, 3), "routes_refilled_s": round(time.monotonic() - t_up, 3),
            "total_s": round(time.monotonic() - t0, 3)}
    steps.append(step)
    log(f"  {o.plan.id}: {before} -> {build} (down {step['down_s']}s, every group's route back in "
        f"{step['routes_refilled_s']}s)")


def _versions(spec: ClusterSpec, namesrvs: list[NodeOps]) -> dict:
    st = health.status(spec)
    out = {row["id"]: row.get("version") for g in st["groups"] for row in g["nodes"]}
    for o in namesrvs:  # a build is <version>-<build id> (ops.build.Artifact.name)
        b = o.build()
        out[o.plan.id] = b and b.rsplit("-", 1)[0]
    return out


def _upgrade_cluster(spec: ClusterSpec, to: str, rollback_on_failure: bool, provider, log, on_node) -> dict:
    p = provider or providers.get(spec)
    art = resolve(spec, to)
    names = namesrv_ops(spec, p)
    rolls = [Roll(spec, g.name, p, log, on_node) for g in spec.groups]
    steps: list[dict] = []
    for r in rolls:
        r.steps = steps
    report = {"cluster": spec.name, "group": "all", "groups": [g.name for g in spec.groups],
              "namesrvs": [o.plan.id for o in names], "to": art.name, "steps": steps, "upgraded": []}
    previous = {o.plan.id: o.build() for o in names}
    previous.update({n: o.build() for r in rolls for n, o in r.ops.items()})
    state = {"scope": "cluster", "group": None, "to": art.name, "previous": previous,
             "upgraded": report["upgraded"], "status": "in-progress", "started_at": time.time()}
    try:
        cluster_gate(spec, "pre-check")
        hosts = sorted({o.plan.host for o in names} | {o.plan.host for r in rolls for o in r.ops.values()})
        log(f"installing {art.name} on {', '.join(hosts)}")
        report["installed_on"] = install_everywhere(spec, p, art, hosts)
        _save(spec, state)

        def roll_namesrvs() -> None:
            for o in names:
                if o.build() == art.name and o.pid() is not None:
                    log(f"  {o.plan.id}: already on {art.name}")
                    on_node(o.plan.id, f"already on {art.name}")
                    continue
                report["upgraded"].append(o.plan.id)
                _save(spec, state)
                _restart_namesrv(spec, o, art.name, steps, log)
                on_node(o.plan.id, f"on {art.name}")

        # name servers first (a client always finds one with complete routes), unless a broker's
        # certificate names no group yet: a name server of this build would refuse it, so the
        # groups go first then (each restart re-issues its nodes' certificates with the group)
        sec = ClusterSecurity(spec)
        groups_first = bool(names) and any(sec.names_no_group(o.plan) for r in rolls for o in r.ops.values())
        report["order"] = "groups, then name servers" if groups_first else "name servers, then groups"
        if groups_first:
            log("broker certificates from before groups were named: the groups first, then the name servers")
        else:
            roll_namesrvs()
        for r in rolls:
            log(f"group {r.g.name}:")
            for node in r.roll({n: art.name for n in r.ops}):
                report["upgraded"].append(node)
                _save(spec, state)
            cluster_gate(spec, f"route gate after group {r.g.name}")
        if groups_first:
            roll_namesrvs()
    except _GateFailed as e:
        state["status"] = report["status"] = "failed"
        report["stopped_at"] = str(e)
        report["verdict"] = health.status(spec)["verdict"]
        _save(spec, state)
        log(f"  stopped: {e} (the cluster is {report['verdict']})")
        if rollback_on_failure and report["upgraded"]:
            report["rollback"] = _rollback_cluster(spec, state, p, log, on_node)
        raise UpgradeError(f"upgrade stopped: {e}", report) from None
    state["status"] = report["status"] = "done"
    _save(spec, state)
    report["versions"] = _versions(spec, names)
    return report


def _rollback_cluster(spec: ClusterSpec, state: dict, p, log, on_node) -> dict:
    """Undo a whole-cluster roll: the name servers it restarted, then each group's nodes."""
    names = [o for o in namesrv_ops(spec, p) if o.plan.id in state["upgraded"]]
    rolls = [Roll(spec, g.name, p, log, on_node) for g in spec.groups]
    steps: list[dict] = []
    report = {"cluster": spec.name, "group": "all", "rolled_back": [], "steps": steps}
    broker_targets = [{n: state["previous"][n] for n in state["upgraded"]
                       if n in r.ops and state["previous"].get(n)} for r in rolls]
    down = frozenset(n for t in broker_targets for n in t)
    log(f"rolling back {sorted([o.plan.id for o in names] + list(down))} to their previous builds")

    def work() -> None:
        for o in names:
            build = state["previous"].get(o.plan.id)
            if not build or (o.build() == build and o.pid() is not None):
                continue
            report["rolled_back"].append(o.plan.id)
            _restart_namesrv(spec, o, build, steps, log, tolerate=down)
        for r, targets in zip(rolls, broker_targets):
            r.steps = steps
            for node in r.roll(targets, tolerate_down=True):
                report["rolled_back"].append(node)
    return _rolled_back(spec, state, report, work)
