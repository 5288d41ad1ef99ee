"""The checkers of the master-slave simulation (sim.py; a mixin of its Sim, reading the Sim's
nodes, acknowledgements and leads).

What is acknowledged and what may be lost:
- SYNC: nothing acknowledged is ever lost. Every promotion the rules allow is clean.
- ASYNC: an acknowledged send may be lost, but only by a promotion that did not call itself
  clean (a failover with the master unreachable, roles.async_loss), and no more of them
  than that promotion said may be lost, when it gave a bound (a master that fences itself).

Each lost send is blamed on one lead: the first, in the order they happened, of an epoch
newer than the send's whose log at that moment lacked it -- the promotion that left it out,
or the one an old master went on acknowledging past (a partitioned ASYNC master). A clean
lead is checked at once (it must hold every acknowledged send not already blamed on an
earlier lead); the counts against the bounds at the end, on what the settled group lost.

A node that follows a master by its own probe (restart_step, on_views) must follow one that
leads, or led, the epoch it follows it for: following a node that never became master (its
promotion recorded the epoch and died before it led) leaves the group without a master
until an operator acts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from replication.master_slave.roles import MASTER

if TYPE_CHECKING:
    from replication.master_slave.roles import AsyncLoss
    from replication.master_slave.sim import Node


class SafetyViolation(AssertionError):
    pass


@dataclass
class LeadRecord:
    epoch: int
    node: str
    tick: int
    have: set  # the message ids in its log when it began to lead
    loss: AsyncLoss | None  # None: a clean lead (nothing acknowledged may be missing)
    blamed: list = field(default_factory=list)  # acknowledged sends it lost


class Checks:
    """Sim's checkers (see the module doc)."""

    def fail(self, why: str) -> None:
        raise SafetyViolation(f"seed {self.seed}, tick {self.now}: {why}")

    def _lead(self, n: Node, epoch: int) -> None:
        if self.owner.get(epoch, n.id) != n.id:
            self.fail(f"{n.id} leads epoch {epoch}, which {self.owner[epoch]} led")
        self.owner[epoch] = n.id
        loss = self.verdicts.pop(n.id, None)  # (set by the operator's failover; else clean)
        have = {m for _, m in n.log}
        rec = LeadRecord(epoch, n.id, self.now, have, loss)
        missing = [m for m in self.acked if m not in have and self._blame(m) is None]
        if missing and loss is None:
            self.fail(f"{n.id} leads epoch {epoch} without acknowledged {missing[:5]} ({len(missing)})")
        self.leads.append(rec)
        self._close_all(n)
        n.log.append((epoch, f"E{epoch}"))  # the %EPOCH% marker
        self._local(n)
        self.log(f"{n.id} leads epoch {epoch} from offset {len(n.log) - 1}"
                 + ("" if loss is None else f" (UNCLEAN: {loss.text()})"))

    def _blame(self, m: str) -> LeadRecord | None:
        """The first lead of an epoch newer than `m`'s whose log lacked it (see the module doc)."""
        e = self.sent_in[m]
        return next((r for r in self.leads if r.epoch > e and m not in r.have), None)

    def _check_losses(self, have: set) -> None:
        """The settled group holds `have`: every acknowledged send it lost is blamed on an
        unclean promotion, and no promotion lost more than it said it may."""
        lost = [m for m in self.acked if m not in have]
        for m in lost:
            r = self._blame(m)
            if r is None:
                self.fail(f"acknowledged {m} (epoch {self.sent_in[m]}) lost, and no lead of a newer epoch lacked it")
            r.blamed.append(m)
        for r in self.leads:
            if r.blamed and r.loss is None:
                self.fail(f"{len(r.blamed)} acknowledged sends lost: {r.blamed[:5]}, by the lead of epoch "
                          f"{r.epoch} by {r.node} (tick {r.tick}), which was called clean")
            if r.blamed and r.loss.bytes_max is not None and len(r.blamed) > r.loss.bytes_max:
                self.fail(f"{len(r.blamed)} acknowledged sends lost by the lead of epoch {r.epoch} by "
                          f"{r.node} (tick {r.tick}), which said at most {r.loss.bytes_max} may be: "
                          f"{r.blamed[:5]}")
        self.lost = len(lost)

    def _followed(self, n: Node, target: str, views) -> None:
        """`n` follows `target` by its own probe: remember for which epoch (see the module doc)."""
        own = next((v for v in views if v.node == target and v.role == MASTER), None)
        named = [v.epoch_seen for v in views if v.master == target and v.node != target]
        epoch = own.epoch if own is not None else max(named, default=None)
        self.follows.append((self.now, n.id, target, epoch))

    def _check_follows(self) -> None:
        for tick, who, target, epoch in self.follows:
            if epoch is None or self.owner.get(epoch) != target:
                self.fail(f"{who} followed {target} at tick {tick} as the master of epoch {epoch}, which "
                          f"{target} never led: a node followed one that never became master")

    def _check_logs(self) -> None:
        nodes = list(self.nodes.values())
        for a in nodes:
            for e, start in (a.core.epochs.entries if a.up else ()):  # a restart reconciles
                if e > 0 and not (0 <= start <= len(a.log)):
                    self.fail(f"{a.id}'s epoch {e} starts past its log")
            for b in nodes:
                if a.id >= b.id:
                    continue
                for i, (x, y) in enumerate(zip(a.log, b.log)):
                    if x[0] == y[0] and x != y:
                        self.fail(f"{a.id} and {b.id} hold different entries of epoch {x[0]} at {i}: {x} {y}")
