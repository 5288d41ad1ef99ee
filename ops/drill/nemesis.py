"""Nemeses: the faults a drill injects, each with its heal.

Single faults:

    kill-leader       kill -9 the leader (master); heal: start it again on the same build
    kill-random       kill -9 a random node; heal: start it again
    pause-leader      SIGSTOP the leader; heal: SIGCONT
    partition-leader  the leader cannot reach the other members, nor they it (clients still
                      reach it); heal: the network is whole again
    isolate-random    a random node is cut off from everyone, clients included; heal: reconnect
    mixed             each fault window picks one of the above at random; in about half of the
                      windows (seeded) a second one overlaps it, injected before the first heals

Sequences (combined faults, several steps inside one fault window, each step with its undo):

    isolated-restart      SIGSTOP every slave (follower); the master (leader) stores a tail
                          nobody copies; kill -9 it; SIGCONT the others; master-slave: promote
                          the best slave, raft: wait for the new leader; it acknowledges more;
                          SIGSTOP the others again; restart the old master/leader in isolation
                          (a network partition where the provider can fault a stopped node, and
                          its peers paused); heal: everyone resumed, the network whole
    partition-then-kill   partition the leader from the others; master-slave: promote the best
                          slave, raft: wait for the majority's leader; kill -9 that new leader
                          (a random majority node when none came); heal: restart, reconnect
    kill-during-transfer  start a leadership transfer to a random other node (raft:
                          transfer-leader; master-slave: a switchover promotion while the master
                          is up) and kill -9 the leader or the target (seeded) mid-transfer;
                          master-slave with no master left: promote the best slave; heal: restart

Name-server faults (a spec with a namesrv section; the workload sends through the name
servers to every group, the broker faults hit the drill's target group):

    kill-namesrv             kill -9 every name server; the workload must go on sending to the
                             routes its clients know; heal: start them again (all at once)
    kill-namesrv-and-leader  kill -9 every name server, then (after a tenth of the window) kill -9
                             the target group's leader; raft: wait for the new leader, master-slave:
                             promote the best slave; clients must find the new leader from the
                             member addresses they know; heal: restart the old leader, then the
                             name servers (all at once)

Every step is recorded in the fault's `steps` (the drill report's fault timeline) with the
time it began and ended (`at_s`, `done_s`, seconds since the drill started). Undo actions are kept on a stack as steps succeed and all run at heal, the latest
first, even when a step or another undo failed (a failed step ends the sequence early; its
error is in the timeline).

Targets are chosen with the drill's seeded Random, so a run can be replayed with --seed.

Master-slave groups have no election: when a fault takes the master away, the drill plays the
failover an operator or controller would run (`--failover promote`, the default): after
`promote_after_s` it promotes the most caught-up slave (`tidelog admin promote`, refused
unless that slave was in sync — a refusal is reported, never forced). On heal the old master
finds the newer epoch and rejoins as a slave, cut back to the fork point. Sequences play that
failover themselves, at the step the scenario names.
"""

from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from broker.client import Admin, TidelogError
from infra.spec import NodePlan
from ops.security import credentials_for
from ops import health
from ops.nodes import NodeOps

KINDS = ("kill-leader", "kill-random", "pause-leader", "partition-leader", "isolate-random")
SEQUENCES = ("isolated-restart", "partition-then-kill", "kill-during-transfer")
NAMESRV = ("kill-namesrv", "kill-namesrv-and-leader")  # sequences too; they need the name servers' ops
NAMES = (*KINDS, "mixed", *SEQUENCES, *NAMESRV)
NAMESRV_RESTART = "restart name servers"  # the heal step that starts every killed name server again
NETWORK = ("partition-leader", "isolate-random")  # mixed overlaps at most one: they share the switch
TOLD = ("promote", "wait for a new leader", "transfer result", "partition")  # details the summary shows


class NemesisError(RuntimeError):
    pass


class StepFailed(NemesisError):
    pass


@dataclass
class Fault:
    kind: str
    node: str
    detail: str = ""
    undo: list = field(default_factory=list)  # (label, callable), run latest first by heal()
    steps: list = field(default_factory=list)  # {"at_s", "step", "node", "detail"[, "error"]}
    nodes: list = field(default_factory=list)  # every node a step acted on
    failover: dict | None = None  # the promotion a sequence ran (master-slave)
    handles_failover: bool = False  # the sequence promotes itself: the drill must not
    error: str | None = None  # the step that failed, if one did


class Group:
    """What sequences need of the group beyond processes and the network (the drill gives the
    real one; tests give fakes). `mode`: raft | master-slave | standalone."""

    mode = "raft"

    def leader(self) -> str | None:
        raise NotImplementedError

    def wait_leader(self, not_node: str | None, timeout_s: float) -> str | None:
        """The first leader other than `not_node` seen within `timeout_s`, else None."""
        raise NotImplementedError

    def failover(self, old_master: str) -> dict:
        """Master-slave: promote the best slave ({"node", "report"} or {"refused"})."""
        raise NotImplementedError

    def transfer(self, leader: str, target: str) -> dict:
        """Move leadership from `leader` to `target` (raft: transfer-leader, returns once
        started; master-slave: a switchover promotion, returns when done)."""
        raise NotImplementedError


class Nemesis:
    def __init__(self, name: str, ops: dict[str, NodeOps], faults, rng: random.Random,
                 leader_of, group: Group | None = None, window_s: float = 4.0,
                 promote_after_s: float = 1.0, failover: bool = True, clock=None, sleep=time.sleep,
                 on_step=lambda step: None, namesrv: dict[str, NodeOps] | None = None):
        if name not in NAMES:
            raise NemesisError(f"unknown nemesis {name!r} (one of: {', '.join(NAMES)})")
        self.name, self.ops, self.faults, self.rng, self.leader_of = name, ops, faults, rng, leader_of
        self.namesrv = namesrv or {}  # the name servers' ops, by id (kill-namesrv...)
        self.group, self.window_s, self.promote_after_s = group, window_s, promote_after_s
        self.do_failover = failover
        t0 = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - t0)
        self.sleep = sleep
        self.on_step = on_step  # each step's record once it ran (the drill logs it as it happens)
        if name in SEQUENCES + NAMESRV[1:] and group is None:
            raise NemesisError(f"nemesis {name} needs the group's controls")
        if name in NAMESRV and not self.namesrv:
            raise NemesisError(f"nemesis {name} needs name servers: the cluster spec has no namesrv section")

    @property
    def mode(self) -> str:
        return self.group.mode if self.group is not None else "raft"

    # --- steps ---------------------------------------------------------------------------------

    def _step(self, f: Fault, step: str, node: str | None, action, undo=None, label: str = "",
              undo_first: bool = False, describe=None):
        """Run one step, record it; push `undo` (latest first at heal) once it succeeded, or
        before it runs with `undo_first` (a network fault half made still needs its heal).
        `describe(result)`: (the node it turned out to concern, or None; the detail)."""
        rec = {"at_s": round(self.clock(), 3), "step": step, "node": node}
        f.steps.append(rec)
        if node is not None and node not in f.nodes:
            f.nodes.append(node)
        if undo is not None and undo_first:
            f.undo.append((label or f"undo {step} {node or ''}".strip(), undo))
        try:
            out = action()
        except Exception as e:  # noqa: BLE001 - recorded; the undos pushed so far still run
            rec["done_s"] = round(self.clock(), 3)
            rec["error"] = f"{type(e).__name__}: {e}"
            f.error = f.error or f"{step} {node or ''}: {rec['error']}".replace("  ", " ")
            self.on_step(rec)
            raise StepFailed(rec["error"]) from e
        rec["done_s"] = round(self.clock(), 3)  # at_s: when the step began
        if describe is not None:
            who, rec["detail"] = describe(out)
            rec["node"] = who or node
        elif isinstance(out, str):
            rec["detail"] = out
        if undo is not None and not undo_first:
            f.undo.append((label or f"undo {step} {node or ''}".strip(), undo))
        self.on_step(rec)
        return out

    def _resolve(self, f: Fault, label: str) -> None:
        """A later step did what an undo would have (a restart, a resume): drop that undo."""
        f.undo[:] = [(lbl, u) for lbl, u in f.undo if lbl != label]

    def _hold(self, share: float) -> None:
        self.sleep(max(0.0, share * self.window_s))

    def _kill(self, f: Fault, o: NodeOps):
        build = o.build()
        node = o.plan.id

        def act():
            pid = o.signal("KILL")
            act.pid = pid
            return f"kill -9 pid {pid}"

        def undo():
            o.wait_gone(act.pid)
            if o.pid() is None:
                o.start(build)
        self._step(f, "kill -9", node, act, undo, label=f"restart {node}")
        return build

    def _restart(self, f: Fault, o: NodeOps, build: str, why: str = "") -> None:
        """Start a node a step killed: its pending restart undo becomes this step."""
        node = o.plan.id
        pending = [u for lbl, u in f.undo if lbl == f"restart {node}"]
        self._resolve(f, f"restart {node}")

        def act():
            for u in pending:  # waits for the killed pid to be gone, starts the node
                u()
            if not pending:
                o.start(build)
            return f"started pid {o.pid()}" + (f" ({why})" if why else "")
        self._step(f, "start", node, act, lambda: None if o.pid() is not None else o.start(build),
                   label=f"restart {node}", undo_first=True)
        self._resolve(f, f"restart {node}")  # it runs: nothing left to undo

    def _pause(self, f: Fault, o: NodeOps) -> None:
        self._step(f, "SIGSTOP", o.plan.id, lambda: f"SIGSTOP pid {o.signal('STOP')}",
                   lambda: o.signal("CONT"), label=f"resume {o.plan.id}")

    def _resume(self, f: Fault, o: NodeOps) -> None:
        self._resolve(f, f"resume {o.plan.id}")
        self._step(f, "SIGCONT", o.plan.id, lambda: f"SIGCONT pid {o.signal('CONT')}")

    def _partition(self, f: Fault, plan: NodePlan, others: list[NodePlan], label: str = "heal network"):
        self._step(f, "partition", plan.id, lambda: (self.faults.partition(plan, others),
                                                     f"{plan.id} cut off from {[o.id for o in others]}")[1],
                   self.faults.heal, label=label, undo_first=True)

    def _failover(self, f: Fault, old_master: str) -> str | None:
        """Master-slave: promote the best slave (after the detection time); the new master."""
        if not self.do_failover:
            return None
        self.sleep(self.promote_after_s)
        fo = self._step(f, "promote", None, lambda: self.group.failover(old_master),
                        describe=lambda fo: (fo.get("node"), f"refused: {fo['refused']}" if "refused" in fo else
                                             promoted(fo["node"], fo["report"])))
        f.failover = fo
        return None if "refused" in fo else fo["node"]

    def _new_leader(self, f: Fault, old: str | None) -> str | None:
        """After the leader went away: master-slave promotes, raft waits for an election."""
        if self.mode == "master-slave":
            return self._failover(f, old)
        if self.mode != "raft":
            return None
        return self._step(f, "wait for a new leader", None,
                          lambda: self.group.wait_leader(old, max(2.0, self.window_s)),
                          describe=lambda who: (who, f"leader {who}" if who else "no new leader"))

    def _leader(self) -> NodeOps:
        leader = self.leader_of()
        if leader is None:
            raise NemesisError("no leader to target")
        return self.ops[leader]

    def _others(self, node: str) -> list[NodeOps]:
        return [self.ops[n] for n in sorted(self.ops) if n != node]

    # --- inject / heal ---------------------------------------------------------------------------

    def _target(self, kind: str, spare: list[str] = ()) -> NodeOps:
        """The fault's node; never one in `spare` (hit already by an overlapping fault): a
        leader fault whose leader is spared, or gone, hits a random other node instead."""
        if kind.endswith("-leader"):
            leader = self.leader_of_safe(None) if spare else None
            if not spare:
                return self._leader()
            if leader is not None and leader not in spare:
                return self.ops[leader]
        return self.ops[self.rng.choice([n for n in sorted(self.ops) if n not in spare])]

    def inject(self) -> Fault:
        if self.name in SEQUENCES + NAMESRV:
            return self._sequence(self.name)
        kind = self.rng.choice(KINDS) if self.name == "mixed" else self.name
        if self.name == "mixed" and self.rng.random() < 0.5:
            second = self.rng.choice([k for k in KINDS if not (k in NETWORK and kind in NETWORK)])
            return self._sequence("overlap", kind, second)
        return self._single(kind)

    def _single(self, kind: str, f: Fault | None = None) -> Fault:
        target = self._target(kind, f.nodes if f is not None else [])
        plan: NodePlan = target.plan
        if f is None:
            f = Fault(kind, plan.id)
        if kind.startswith("kill-"):
            self._kill(f, target)
        elif kind == "pause-leader":
            self._pause(f, target)
        elif kind == "partition-leader":
            self._partition(f, plan, [o.plan for o in self._others(plan.id)])
        elif kind == "isolate-random":
            self._step(f, "isolate", plan.id, lambda: (self.faults.isolate(plan), f"{plan.id} cut off from everyone")[1],
                       self.faults.heal, label="heal network", undo_first=True)
        f.detail = f.detail or f.steps[-1].get("detail", "")
        return f

    def _sequence(self, name: str, *args) -> Fault:
        f = Fault(name, "?", handles_failover=True)
        try:
            getattr(self, "_seq_" + name.replace("-", "_"))(f, *args)
        except StepFailed:
            pass  # recorded in f.steps/f.error; heal runs every undo pushed so far
        f.detail = "; ".join(f"+{s['at_s'] - f.steps[0]['at_s']:.1f}s {s['step']}"
                             + (f" {s['node']}" if s.get("node") else "")
                             + (f" ({s['detail']})" if s.get("detail") and s["step"] in TOLD else "")
                             + (f" FAILED ({s['error']})" if s.get("error") else "")
                             for s in f.steps)
        return f

    def heal(self, f: Fault) -> list[str]:
        """Run every undo, the latest first, whatever fails; the errors (also in f.steps)."""
        errors = []
        while f.undo:
            label, undo = f.undo.pop()
            rec = {"at_s": round(self.clock(), 3), "step": "heal", "node": None, "detail": label}
            f.steps.append(rec)
            try:
                undo()
            except Exception as e:  # noqa: BLE001 - the other undos must run all the same
                rec["error"] = f"{type(e).__name__}: {e}"
                errors.append(f"{label}: {rec['error']}")
            rec["done_s"] = round(self.clock(), 3)
            self.on_step(rec)
        return errors

    def leader_of_safe(self, fallback: str | None) -> str | None:
        try:
            return self.leader_of()
        except Exception:  # noqa: BLE001 - no answer: as good as no leader
            return fallback

    # --- the sequences ---------------------------------------------------------------------------

    def _seq_overlap(self, f: Fault, first: str, second: str) -> None:
        """mixed: `first`, then `second` before `first` heals (master-slave: a promotion when
        either took the master away, as the drill does for a single fault)."""
        f.kind = first
        leader = self.leader_of()
        self._single(first, f)
        f.node = f.steps[0]["node"]
        f.steps[0]["fault"] = first
        f.detail = ""
        if self.mode == "master-slave" and f.node == leader:
            leader = self._failover(f, f.node)
        self._hold(0.3)
        n = len(f.steps)
        self._single(second, f)  # on another node than the first
        f.steps[n]["overlaps"] = first
        f.steps[n]["fault"] = second
        hit = f.steps[n]["node"]
        if self.mode == "master-slave" and leader is not None and hit == leader:
            self._failover(f, hit)

    def _seq_isolated_restart(self, f: Fault) -> None:
        old = self._leader()
        f.node = old.plan.id
        others = self._others(old.plan.id)
        for o in others:
            self._pause(f, o)
        self._hold(0.15)  # the old master/leader stores a tail nobody copies
        build = self._kill(f, old)
        for o in others:
            self._resume(f, o)
        self._new_leader(f, old.plan.id)
        self._hold(0.25)  # the new master/leader acknowledges more
        try:  # cut off by the network before it starts, where the provider can fault a stopped node
            self._partition(f, old.plan, [o.plan for o in others])
        except StepFailed:
            f.error = None
            f.steps[-1]["detail"] = "not possible on this provider for a stopped node: its paused peers isolate it"
            f.steps[-1]["skipped"] = f.steps[-1].pop("error")
        for o in others:  # the heal resumes them first, then makes the network whole
            self._pause(f, o)
        self._restart(f, old, build, "isolated")
        self._hold(0.25)  # the old master/leader runs alone on its tail; heal resumes everyone

    def _seq_partition_then_kill(self, f: Fault) -> None:
        old = self._leader()
        f.node = old.plan.id
        others = self._others(old.plan.id)
        self._partition(f, old.plan, [o.plan for o in others])
        new = self._new_leader(f, old.plan.id)
        self._hold(0.2)
        victim = self.ops[new] if new in self.ops and new != old.plan.id else self.rng.choice(others)
        self._kill(f, victim)
        self._hold(0.3)

    def _kill_namesrvs(self, f: Fault) -> None:
        """kill -9 each name server (a step each); one undo restarts every one that is down, all
        at once (a start waits until the process serves: one after another, the outage would
        last as many start-ups)."""
        ids = sorted(self.namesrv)
        builds = {nid: self.namesrv[nid].build() for nid in ids}
        killed: dict[str, int] = {}

        def restart_all():
            def one(nid: str) -> None:
                o = self.namesrv[nid]
                if nid in killed:
                    o.wait_gone(killed[nid])
                if o.pid() is None:
                    o.start(builds[nid])
            with ThreadPoolExecutor(max_workers=len(ids)) as ex:
                for fut in [ex.submit(one, nid) for nid in ids]:
                    fut.result()  # the first failure is the undo's error; every start was tried
        f.undo.append((NAMESRV_RESTART, restart_all))  # before the kills: one that fails still needs it
        for nid in ids:
            o = self.namesrv[nid]

            def act(o=o, nid=nid):
                killed[nid] = o.signal("KILL")
                return f"kill -9 pid {killed[nid]}"
            self._step(f, "kill -9", nid, act)

    def _seq_kill_namesrv(self, f: Fault) -> None:
        """Every name server down for the window; the brokers are left alone."""
        f.node = ",".join(sorted(self.namesrv))
        f.handles_failover = False  # no broker is touched: nothing to fail over
        self._kill_namesrvs(f)

    def _seq_kill_namesrv_and_leader(self, f: Fault) -> None:
        """Every name server down, then the group's leader: the new leader must be found from
        the member addresses the clients know (the name servers cannot tell them)."""
        old = self._leader()
        f.node = old.plan.id  # the fault's node is the leader: the drill times the new one
        self._kill_namesrvs(f)
        self._hold(0.1)  # sends to known routes go on without the name servers
        self._kill(f, old)
        self._new_leader(f, old.plan.id)

    def _seq_kill_during_transfer(self, f: Fault) -> None:
        old = self._leader()
        f.node = old.plan.id
        target = self.rng.choice(self._others(old.plan.id))
        victim = self.rng.choice([old, target])
        delay = self.rng.uniform(0.0, 0.05)  # a switchover or a TimeoutNow takes tens of ms
        result: dict = {}

        def transfer():
            try:
                result["ok"] = self.group.transfer(old.plan.id, target.plan.id)
            except Exception as e:  # noqa: BLE001 - the kill may well break it: reported
                result["error"] = f"{type(e).__name__}: {e}"

        th = threading.Thread(target=transfer, name="nemesis-transfer", daemon=True)
        self._step(f, "transfer leadership", target.plan.id,
                   lambda: (th.start(), f"{old.plan.id} -> {target.plan.id}")[1])
        self.sleep(delay)
        self._kill(f, victim)
        th.join(timeout=max(5.0, self.window_s))
        def outcome() -> str:
            if th.is_alive():
                return "still running"
            if "error" in result:
                return result["error"]
            ok = result.get("ok") or {}
            if "report" in ok:
                return promoted(ok["promoted"], ok["report"])
            return f"started {ok.get('started', '')}".strip()
        self._step(f, "transfer result", target.plan.id, outcome)
        if self.mode == "master-slave":
            now = self.leader_of_safe(None)
            if now is None or now == victim.plan.id:
                self._failover(f, victim.plan.id)
        self._hold(0.3)


def promoted(node: str, report: dict) -> str:
    """A promotion's step detail, with its verdict: an unclean one (forced, or ASYNC with the
    master unreachable) says that acknowledged messages may be lost, and how many bytes at
    most when its report bounds them."""
    out = f"promoted {node} (epoch {report.get('epoch')})"
    if report.get("clean", True):
        return out
    loss = report.get("may_lose") or {}
    bound = (f"up to {loss['bytes_max']} bytes" if loss.get("bytes_max") is not None
             else "no bound" if loss else "forced past: " + "; ".join(report.get("problems") or []))
    return f"{out}, UNCLEAN: acknowledged messages may be lost ({bound})"


def promote_best_slave(spec, group: str, old_master: str) -> dict:
    """Promote the up slave holding the newest log (its last epoch, then its end); {"node",
    "report"} or {"refused"}."""
    rows = health.status(spec, group, 1000)["groups"][0]["nodes"]
    slaves = [r for r in rows if r["state"] == "up" and r["id"] != old_master and r.get("role") == "slave"]
    if not slaves:
        return {"refused": f"no slave answers to take over from {old_master}"}
    best = max(slaves, key=lambda r: (r.get("epoch") or 0, r.get("max_offset") or 0, r["id"]))
    try:
        with Admin([best["address"]], request_timeout_ms=15_000, credentials=credentials_for(spec)) as a:
            return {"node": best["id"], "report": a.promote(best["id"])}
    except TidelogError as e:
        return {"node": best["id"], "refused": str(e)}
