"""Nemeses: the faults a drill injects, each with its heal.

    kill-leader       kill -9 the leader (master); heal: start it again on the same build
    kill-random       kill -9 a random node; heal: start it again
    pause-leader      SIGSTOP the leader; heal: SIGCONT
    partition-leader  the leader cannot reach the other members, nor they it (clients still
                      reach it); heal: the network is whole again
    isolate-random    a random node is cut off from everyone, clients included; heal: reconnect
    mixed             each fault window picks one of the above at random

Targets are chosen with the drill's seeded Random, so a run can be replayed with --seed.

Master-slave groups have no election: when a fault takes the master away, the drill plays the
failover an operator or controller would run (`--failover promote`, the default): after
`promote_after_s` it promotes the most caught-up slave (`tidelog admin promote`, refused
unless that slave was in sync — a refusal is reported, never forced). On heal the old master
finds the newer epoch and rejoins as a slave, cut back to the fork point.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from broker.client import Admin, TidelogError
from infra.spec import NodePlan
from ops import health
from ops.nodes import NodeOps

KINDS = ("kill-leader", "kill-random", "pause-leader", "partition-leader", "isolate-random")
NAMES = (*KINDS, "mixed")


class NemesisError(RuntimeError):
    pass


@dataclass
class Fault:
    kind: str
    node: str
    detail: str = ""
    undo: list = field(default_factory=list)  # callables, run in order by heal()


class Nemesis:
    def __init__(self, name: str, ops: dict[str, NodeOps], faults, rng: random.Random,
                 leader_of):
        if name not in NAMES:
            raise NemesisError(f"unknown nemesis {name!r} (one of: {', '.join(NAMES)})")
        self.name, self.ops, self.faults, self.rng, self.leader_of = name, ops, faults, rng, leader_of

    def _target(self, kind: str) -> NodeOps:
        if kind.endswith("-leader"):
            leader = self.leader_of()
            if leader is None:
                raise NemesisError("no leader to target")
            return self.ops[leader]
        return self.ops[self.rng.choice(sorted(self.ops))]

    def inject(self) -> Fault:
        kind = self.rng.choice(KINDS) if self.name == "mixed" else self.name
        target = self._target(kind)
        plan: NodePlan = target.plan
        f = Fault(kind, plan.id)
        if kind.startswith("kill-"):
            build = target.build()
            pid = target.signal("KILL")
            f.detail = f"kill -9 pid {pid}"
            f.undo.append(lambda: (target.wait_gone(pid), target.start(build)))
        elif kind == "pause-leader":
            pid = target.signal("STOP")
            f.detail = f"SIGSTOP pid {pid}"
            f.undo.append(lambda: target.signal("CONT"))
        elif kind == "partition-leader":
            others = [o.plan for o in self.ops.values() if o.plan.id != plan.id]
            self.faults.partition(plan, others)
            f.detail = f"{plan.id} cut off from {[o.id for o in others]}"
            f.undo.append(self.faults.heal)
        elif kind == "isolate-random":
            self.faults.isolate(plan)
            f.detail = f"{plan.id} cut off from everyone"
            f.undo.append(self.faults.heal)
        return f

    @staticmethod
    def heal(f: Fault) -> None:
        for undo in f.undo:
            undo()


def promote_best_slave(spec, group: str, old_master: str) -> dict:
    """Promote the up slave holding the most of the log; {"node", "report"} or {"refused"}."""
    rows = health.status(spec, group, 1000)["groups"][0]["nodes"]
    slaves = [r for r in rows if r["state"] == "up" and r["id"] != old_master and r.get("role") == "slave"]
    if not slaves:
        return {"refused": f"no slave answers to take over from {old_master}"}
    best = max(slaves, key=lambda r: (r.get("max_offset") or 0, r["id"]))
    try:
        with Admin([best["address"]], request_timeout_ms=15_000) as a:
            return {"node": best["id"], "report": a.promote(best["id"])}
    except TidelogError as e:
        return {"node": best["id"], "refused": str(e)}
