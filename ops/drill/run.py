"""`tidelog drill`: workload + nemesis + heal + drain + history check + replica compare.

    healthy? ── workload starts ── calm ── fault ── hold ── heal ── healthy again ── calm ── ...
            ── workload stops ── drain every queue ── every replica caught up ── collect logs
            ── check ── report

A monitor thread samples the group's status every `MONITOR_S` for the leader timeline (time
to a new leader, leader changes in the plot). Figures: time to a new leader, the longest gap
between acknowledgements (the unavailability window), failed/unknown counts, recovery time
(heal → healthy). The run fails (`ok: false`) on any safety anomaly.

A spec with name servers (a `namesrv` section): the topic is created on every group through
them, the workload sends through them (ClusterProducer) to every group, and the drain reads
each group directly; the broker nemeses hit the target group (`group`, default the first),
the name-server ones (kill-namesrv...) every name server. "Healthy" is then the whole
cluster's verdict: every group, and every name server routing each group to its leader. The
name-server outages' figures are in each fault's `namesrv_outage` (ops/drill/outage.py); a
workload that stopped while they were down is a liveness failure (`liveness.ok` false: the
DAG task fails; `ok` stays the safety verdict).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

from broker.client import Admin
from infra import providers
from infra.spec import ClusterSpec
from ops.security import credentials_for
from ops import health
from ops.collect import collect
from ops.deploy import namesrv_ops, node_ops
from ops.drill import outage
from ops.drill import report as rep
from ops.drill.checker import check, longest_gap
from ops.drill.nemesis import KINDS, NAMESRV, Group, Nemesis, promote_best_slave, promoted
from ops.drill.kafka_workload import KafkaWorkload
from ops.drill.workload import TOPIC_QUEUES, Workload, drain, ensure_topic
from ops.replicas import compare
from ops.upgrade import ClusterDown, require_running

MONITOR_S = 0.2
CATCH_UP_S = 30.0  # after the drain, for every replica to hold its leader's whole log


class DrillError(RuntimeError):
    pass


class DrillClusterDown(DrillError, ClusterDown):
    """The group does not run at all: the drill did not start."""


class Monitor(threading.Thread):
    """Samples the group's leader; records (t, leader) whenever it changes."""

    def __init__(self, spec: ClusterSpec, group: str, t_start: float, on_sample=lambda t: None):
        super().__init__(name="drill-monitor", daemon=True)
        self.spec, self.group, self.t_start = spec, group, t_start
        self.on_sample = on_sample  # (seconds since the start) after every sample
        self.changes: list[tuple[float, str | None]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        last = object()
        while not self.stop_event.is_set():
            t = time.monotonic() - self.t_start
            try:
                leader = health.status(self.spec, self.group, timeout_ms=500)["groups"][0]["leader"]
            except Exception:  # noqa: BLE001 - a sample lost is a sample, not a dead monitor
                leader = None
            if leader != last:
                self.changes.append((round(t, 3), leader))
                last = leader
            self.on_sample(t)
            self.stop_event.wait(MONITOR_S)

    def first_leader_after(self, t: float, not_node: str | None) -> float | None:
        for ct, leader in self.changes:
            if ct >= t and leader is not None and leader != not_node:
                return ct
        return None


class DrillGroup(Group):
    """The group's controls the nemesis sequences use: its leader, failover, transfer."""

    def __init__(self, spec: ClusterSpec, group: str):
        self.spec, self.name = spec, group
        self.mode = spec.group(group).mode

    def leader(self) -> str | None:
        return health.status(self.spec, self.name, 1000)["groups"][0]["leader"]

    def wait_leader(self, not_node: str | None, timeout_s: float) -> str | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                leader = self.leader()
            except Exception:  # noqa: BLE001 - no answer yet
                leader = None
            if leader is not None and leader != not_node:
                return leader
            time.sleep(0.1)
        return None

    def failover(self, old_master: str) -> dict:
        return promote_best_slave(self.spec, self.name, old_master)

    def transfer(self, leader: str, target: str) -> dict:
        plans = {n.id: n for n in self.spec.nodes(self.name)}
        with Admin([plans[leader].address], request_timeout_ms=15_000, credentials=credentials_for(self.spec)) as a:
            if self.mode == "raft":
                a.transfer_leader(target)
                return {"started": f"{leader} -> {target}"}
            return {"promoted": target, "report": a.promote(target)}  # a switchover: the master is up


def problems_of(st: dict) -> list[str]:
    """Every problem a status names: each group's, and the name servers'."""
    return [p for g in st["groups"] for p in g["problems"]] + (st.get("namesrv") or {}).get("problems", [])


def make_topic(spec: ClusterSpec, topic: str, creds) -> list[str]:
    """The drill's topic, created through the name servers on every group of the spec (waits
    until each name server routes it); the groups, sorted."""
    from broker.client.cluster import create_topic
    from broker.client.errors import TidelogError

    try:
        made = create_topic(spec.namesrv_addresses, topic, TOPIC_QUEUES, groups=[x.name for x in spec.groups],
                            credentials=creds)
    except (ValueError, TidelogError) as e:  # a group the name servers do not know; none answering
        raise DrillError(f"topic {topic} could not be created through the name servers: {e}") from None
    failed = {g: r for g, r in made.items() if isinstance(r, Exception)}
    if failed:
        raise DrillError(f"topic {topic} could not be created on every group: "
                         + "; ".join(f"{g}: {e}" for g, e in sorted(failed.items())))
    return sorted(made)


WORKLOADS = ("native", "kafka")  # the clients a drill can send with

def drill(spec: ClusterSpec, nemesis: str, duration_s: float, rate: float, report_dir: Path,
          group: str | None = None, seed: int | None = None, fault_s: float | None = None,
          calm_s: float | None = None, provider=None, log=lambda m: None,
          failover: str = "promote", promote_after_s: float = 1.0,
          on_progress=lambda elapsed_s, acks: None, workload: str = "native") -> dict:
    """`on_progress(seconds of the workload so far, acknowledged sends so far)` about every
    MONITOR_S while the workload runs. `workload`: "native" (the Python client) or "kafka"
    (librdkafka through the Kafka listeners: ops/drill/kafka_workload.py)."""
    g = spec.group(group)
    via_namesrv = spec.namesrv is not None
    if workload not in WORKLOADS:
        raise DrillError(f"workload {workload!r}: one of {', '.join(WORKLOADS)}")
    if workload == "kafka" and via_namesrv:
        raise DrillError("workload kafka drills one group: the spec has name servers (a Kafka workload "
                         "across groups is not checked yet); use --workload native")
    if nemesis in NAMESRV and not via_namesrv:
        raise DrillError(f"nemesis {nemesis} kills the name servers: the spec {spec.name} has no namesrv section")
    scope = None if via_namesrv else g.name  # what must be healthy: the whole cluster with name servers
    seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
    rng = random.Random(seed)
    fault_s = fault_s if fault_s is not None else min(8.0, max(2.0, duration_s / 4))
    calm_s = calm_s if calm_s is not None else min(5.0, max(1.0, duration_s / 8))
    p = provider or providers.get(spec)
    ops = {o.plan.id: o for o in node_ops(spec, p, g.name)}
    ns_ops = {o.plan.id: o for o in namesrv_ops(spec, p)} if via_namesrv else {}
    require_running(spec, g.name, DrillClusterDown)
    st = health.wait_healthy(spec, group=scope)
    if st["verdict"] != "healthy":
        raise DrillError(f"the {'cluster' if via_namesrv else 'group'} is {st['verdict']} before the drill: "
                         + "; ".join(problems_of(st)))
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{seed % 10000:04d}"
    report_dir = Path(report_dir) / run_id
    bootstrap = [n.address for n in spec.nodes(g.name)]
    topic = f"drill-{run_id}"
    creds = credentials_for(spec)
    if via_namesrv:
        groups = make_topic(spec, topic, creds)
    else:
        ensure_topic(bootstrap, topic, credentials=creds)
        groups = [g.name]
    log(f"drill {run_id}: nemesis {nemesis}, {duration_s}s at {rate}/s, seed {seed} "
        f"(replay: --seed {seed}); report in {report_dir}")
    if via_namesrv:
        log(f"  workload through the name servers {', '.join(spec.namesrv_addresses)} to groups "
            f"{', '.join(groups)}; broker faults hit group {g.name}")

    faults = p.faults()
    t_start = time.monotonic()
    now = lambda: time.monotonic() - t_start  # noqa: E731

    def log_step(s: dict) -> None:
        log(f"  {s['at_s']:6.1f}s   {s['step']}" + (f" {s['node']}" if s.get("node") else "")
            + (f" ({s['detail']})" if s.get("detail") else "") + (f" FAILED: {s['error']}" if "error" in s else ""))

    grp = DrillGroup(spec, g.name)
    nem = Nemesis(nemesis, ops, faults, rng, grp.leader, group=grp, window_s=fault_s,
                  promote_after_s=min(promote_after_s, fault_s), failover=failover == "promote", clock=now,
                  on_step=log_step if nemesis not in KINDS else lambda s: None,  # one-step faults: one line below
                  namesrv=ns_ops)
    wl = (KafkaWorkload(bootstrap, topic, run_id, rate, credentials=creds) if workload == "kafka" else
          Workload(bootstrap, topic, run_id, rate, credentials=creds,
                   namesrv=spec.namesrv_addresses if via_namesrv else None))
    mon = Monitor(spec, g.name, t_start, lambda t: on_progress(min(t, duration_s), wl.acked))
    mon.start()
    wl.start(t_start)
    events: list[dict] = []
    try:
        time.sleep(calm_s)
        while now() + fault_s < duration_s:
            leader = health.status(spec, g.name, 1000)["groups"][0]["leader"]
            at = now()
            if nemesis not in KINDS:
                log(f"  {at:6.1f}s fault window ({nemesis}):")
            f = nem.inject()
            ev = {"kind": f.kind, "node": f.node, "detail": f.detail, "at_s": round(at, 3),
                  "leader_before": leader, "steps": f.steps}
            events.append(ev)
            if nemesis in KINDS:  # one step (a sequence's steps are logged as they run)
                log(f"  {at:6.1f}s fault: {f.kind} {f.node} ({f.detail})")
            if f.error:
                ev["error"] = f.error
                log(f"  ! the sequence stopped at a failed step: {f.error}")
            if f.failover is not None:
                ev["failover"] = f.failover
            if (not f.handles_failover and failover == "promote" and g.mode == "master-slave"
                    and f.node == leader):
                time.sleep(max(0.0, min(promote_after_s, fault_s) - (now() - at)))
                ev["failover"] = fo = promote_best_slave(spec, g.name, f.node)
                f.steps.append({"at_s": round(now(), 3), "step": "promote", "node": fo.get("node"),
                                "detail": promoted(fo["node"], fo["report"])
                                if "report" in fo else f"refused: {fo['refused']}"})
                log(f"  {now():6.1f}s failover: {f.steps[-1]['detail']}")
            time.sleep(max(0.0, fault_s - (now() - at)))
            # the heal itself takes time (a killed broker's restart: seconds on a loaded box):
            # heal_s is how long undoing the fault took; recovery counts from when it was done
            ev["heal_began_s"] = round(now(), 3)
            for err in nem.heal(f):
                log(f"  ! heal: {err}")
            ev["nodes"] = f.nodes
            ev["healed_at_s"] = round(now(), 3)
            ev["heal_s"] = round(ev["healed_at_s"] - ev["heal_began_s"], 3)
            st = health.wait_healthy(spec, group=scope)
            ev["healthy_at_s"] = round(now(), 3)
            ev["recovery_s"] = round(ev["healthy_at_s"] - ev["healed_at_s"], 3)
            ev["verdict_after"] = st["verdict"]
            log(f"  {ev['healed_at_s']:6.1f}s healed (the heal took {ev['heal_s']}s); {st['verdict']} after "
                f"{ev['recovery_s']}s"
                + ("" if st["verdict"] == "healthy" else f": {'; '.join(problems_of(st))}"))
            if st["verdict"] != "healthy":
                break
            time.sleep(min(calm_s, max(0.0, duration_s - now())))
        time.sleep(max(0.0, duration_s - now()))
    finally:
        wl.stop()
        faults.heal()
        for o in [*ops.values(), *ns_ops.values()]:  # nothing left paused or down by an interrupted run
            try:
                if o.pid() is None:
                    o.start(o.build())
                else:
                    o.signal("CONT")
            except Exception as e:  # noqa: BLE001 - reported below through health
                log(f"  restoring {o.plan.id}: {e}")
    mon.stop_event.set()
    mon.join()
    if wl.error is not None:
        raise DrillError(f"the workload crashed: {type(wl.error).__name__}: {wl.error}")
    final = health.wait_healthy(spec, group=scope)
    for ev in events:
        gone = ev["leader_before"] if ev["node"] == ev["leader_before"] else None
        since = killed_at(ev) if ev["kind"] == "kill-namesrv-and-leader" else ev["at_s"]
        t = mon.first_leader_after(since, gone) if gone else None
        ev["time_to_new_leader_s"] = round(t - since, 3) if t is not None else None
    for ev in events:  # the unavailability the fault caused: fault to first ack, between acks, to healthy
        acks = [o.t1 for o in wl.ops if o.outcome == "ok" and ev["at_s"] <= o.t1 <= ev["healthy_at_s"]]
        ev["longest_ack_gap_s"] = round(longest_gap(sorted([ev["at_s"], ev["healthy_at_s"], *acks]))[0], 3)
    liveness = namesrv_outages(events, wl.ops, sorted(ns_ops), g.name, mon, log)

    drain_problems: list[str] = []
    reads = []
    for name in groups:  # each group directly: the drain proves nothing through the name servers
        reads += drain([n.address for n in spec.nodes(name)], topic, run_id, problems=drain_problems,
                       credentials=creds, group=name if via_namesrv else None)
    for d in drain_problems:
        log(f"  ! {d}")
    # every replica holds its leader's whole log before the logs are compared: "healthy" allows
    # a bounded lag, and a restarted follower may still hold a suffix its new leader has not cut
    t_wait = time.monotonic()
    wait_s = CATCH_UP_S if final["verdict"] == "healthy" else 0  # not healthy: said already, no wait
    caught_up, behind = health.wait_caught_up(spec, wait_s, scope)
    fig_catch_up_s = round(time.monotonic() - t_wait, 3)
    for node, why in sorted(behind.items()):
        when = (f"{wait_s:g}s after the workload stopped" if wait_s else
                f"when the workload stopped (the group was {final['verdict']}: no wait)")
        liveness.append(f"{node} had not caught up with its leader {when}: {why}")
        log(f"  ! {liveness[-1]}")
    logs = collect(spec, report_dir / "logs", scope, p)
    divergent = []
    for gs in caught_up["groups"]:  # each group's replicas agree on its committed prefix
        committed = None
        if gs["mode"] == "raft":
            leader_row = next((r for r in gs["nodes"] if r["id"] == gs["leader"]), None)
            committed = leader_row.get("commit_index") if leader_row else None
        ids = {r["id"] for r in gs["nodes"]}
        divergent += compare({n["id"]: Path(logs["dir"]) / n["id"] for n in logs["nodes"]
                              if "error" not in n and n["id"] in ids}, committed, frozenset(behind))
    divergent += [f"{n}: logs not collected" for n in logs["missing"]]
    result = check(wl.ops, reads, divergent)
    fig = result.figures
    leader_times = [e["time_to_new_leader_s"] for e in events if e["time_to_new_leader_s"] is not None]
    recov = [e["recovery_s"] for e in events if "recovery_s" in e]
    heals = [e["heal_s"] for e in events if "heal_s" in e]
    fig.update(faults=len(events), time_to_new_leader_s_max=max(leader_times, default=None),
               longest_ack_gap_in_faults_s=max((e["longest_ack_gap_s"] for e in events
                                                if "longest_ack_gap_s" in e), default=None),
               recovery_s_max=max(recov, default=None), heal_s_max=max(heals, default=None),
               leader_changes=len(mon.changes) - 1,
               final_verdict=final["verdict"], reads=len(reads), catch_up_s=fig_catch_up_s)
    outages = [e["namesrv_outage"] for e in events if "namesrv_outage" in e]
    if outages:
        fig["namesrv_down_s_max"] = max(o["namesrv_down_s"] for o in outages)
        fig["longest_ack_gap_without_namesrv_s"] = max(o["longest_ack_gap_s"] for o in outages)
        fig["acks_without_namesrv"] = sum(o["acks"] for o in outages)
    report = {"run_id": run_id, "cluster": spec.name, "group": g.name, "mode": g.mode,
              "provider": spec.provider, "nemesis": nemesis, "seed": seed, "duration_s": duration_s,
              "rate": rate, "fault_s": fault_s, "calm_s": calm_s, "topic": topic,
              "ok": result.ok,  # safety; `liveness` says whether sends stopped where they must not
              "workload": {"via": "namesrv" if via_namesrv else "group", "groups": groups,
                           "namesrv": spec.namesrv_addresses if via_namesrv else [],
                           "client": getattr(wl, "client", "tidelog")},
              "failover": failover if g.mode == "master-slave" else None,
              "figures": fig, "counts": result.counts, "anomalies": result.anomalies,
              "liveness": {"ok": not liveness, "problems": liveness}, "faults": events,
              "leader_changes": mon.changes, "drain_problems": drain_problems, "report_dir": str(report_dir),
              "plot": str(report_dir / "drill.png"), "replay": f"--seed {seed}"}
    rep.write_json(report_dir / "report.json", report)
    rep.write_json(report_dir / "history.json", {"ops": [o.__dict__ for o in wl.ops],
                                                  "reads": [r.__dict__ for r in reads]})
    where = f"{spec.name}/{g.name}" + (f" (workload on {'+'.join(groups)} via name servers)" if via_namesrv else "")
    verdict = "SAFETY VIOLATION" if not result.ok else "LIVENESS FAILURE" if liveness else "OK"
    rep.plot(report_dir / "drill.png", wl.ops, events, mon.changes,
             f"{where}: {nemesis}, {rate:g}/s, seed {seed} — {verdict}")
    return report


def killed_at(ev: dict) -> float:
    """When the fault's node was killed (kill-namesrv-and-leader kills it after the name
    servers: its time to a new leader counts from there)."""
    return next((s["at_s"] for s in ev["steps"] if s["step"] == "kill -9" and s.get("node") == ev["node"]),
                ev["at_s"])


def namesrv_outages(events: list[dict], ops, namesrv_ids: list[str], target: str, mon: Monitor,
                    log) -> list[str]:
    """Each fault that had every name server down gets `namesrv_outage` (ops/drill/outage.py);
    the liveness problems of them all."""
    problems = []
    for ev in events:
        w = outage.window(ev["steps"], namesrv_ids)
        if w is None:
            continue
        start, end = w[0], w[1] if w[1] is not None else ev["healed_at_s"]
        new_at = None
        if ev["kind"] == "kill-namesrv-and-leader" and ev["node"] == ev["leader_before"]:
            t = mon.first_leader_after(killed_at(ev), ev["node"])
            new_at = t if t is not None and t < end else None
        fig = outage.figures(ops, start, end, target if ev["kind"] == "kill-namesrv-and-leader" else None, new_at)
        ev["namesrv_outage"] = fig
        found = outage.problems(ev["kind"], fig)
        ev["liveness_problems"] = found
        problems += found
        log(f"  name servers down {fig['namesrv_down_at_s']}s-{fig['namesrv_back_at_s']}s: {fig['acks']} sends "
            f"acknowledged ({', '.join(f'{k} {v}' for k, v in sorted(fig['acks_by_group'].items()))}), longest "
            f"gap {fig['longest_ack_gap_s']}s"
            + (f"; {target} from its new leader: {fig['target_acks_after_new_leader']}"
               if fig.get("new_leader_at_s") is not None else "") + (f"; {fig['note']}" if "note" in fig else ""))
        for pr in found:
            log(f"  ! {pr}")
    return problems
