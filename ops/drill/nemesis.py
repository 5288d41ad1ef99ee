"""Nemeses: the faults a drill injects, each with its heal.

    kill-leader       kill -9 the leader (master); heal: start it again on the same build
    kill-random       kill -9 a random node; heal: start it again
    pause-leader      SIGSTOP the leader; heal: SIGCONT
    partition-leader  the leader cannot reach the other members, nor they it (clients still
                      reach it); heal: the network is whole again
    isolate-random    a random node is cut off from everyone, clients included; heal: reconnect
    mixed             each fault window picks one of the above at random

Targets are chosen with the drill's seeded Random, so a run can be replayed with --seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from infra.spec import NodePlan
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
