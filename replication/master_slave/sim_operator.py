"""The operator and the nemeses of the master-slave simulation (sim.py; a mixin of its Sim,
working on the Sim's nodes, network and clock): switchovers in two steps, as promotion.py runs
them (and, with `overlap`, often and overlapping, each with its own fence id), promotions when
no master has been seen for a while (never forced; with `failover_crash`, killed now and then
between recording the epoch and leading), the random faults and the scripted sequences."""

from __future__ import annotations

from typing import TYPE_CHECKING

from replication.master_slave import core as C
from replication.master_slave import roles
from replication.master_slave.epochs import EpochList
from replication.master_slave.roles import MASTER, SLAVE

if TYPE_CHECKING:
    from replication.master_slave.sim import Node

FENCE = 40  # ticks a switchover fences the master for (leadership_transfer_timeout_ms)
OVERLAP_SWITCHOVER = 0.01  # the switchover rate of a run with overlapping switchovers
PROMOTE_AFTER = 40  # the operator promotes after this long without a master


class Operator:
    """Sim's `tidelog admin promote` and scripted sequences."""

    def _promote(self, n: Node) -> str | None:
        """`tidelog admin promote` (a failover, never forced): None, or why it was refused."""
        views, down = self._views(n)
        if any(v.role == MASTER for v in views):
            return "a master answers"
        core = n.core
        lag = core.lag(n.master_end if n.link is not None and n.welcomed else None, n.synced)
        problems = core.failover_problems(views, down, len(n.log), lag)
        if problems:
            return "; ".join(problems)
        loss = core.failover_loss(views, down, len(n.log), lag)  # the verdict: None is clean
        epoch = core.new_epoch(views, len(n.log))
        why = core.promotion_shortfall(epoch, self._record(n, views, epoch))
        if why is None and self.faults.failover_crash and not self.healing and \
                self.rng.random() < self.faults.failover_crash:
            self._down(n, power=False)
            return f"killed after recording epoch {epoch}, before it leads"
        if why is None:
            self.verdicts[n.id] = loss  # (sim_checks: what its lead may lose)
            self._apply(n, core.promoted(epoch, len(n.log), n.synced, 0, self.now))
        return why

    # --- faults and the promotions' record ----------------------------------------------------

    def _faults_step(self) -> None:
        f, rng = self.faults, self.rng
        for n in self.nodes.values():
            if n.up:
                if rng.random() < f.kill:
                    self._down(n, power=False)
                elif rng.random() < f.power:
                    self._down(n, power=True)
                elif not n.paused and rng.random() < f.pause:
                    n.paused = True
                    self.log(f"{n.id} paused")
                elif n.paused and rng.random() < f.resume:
                    n.paused = False
                    self.log(f"{n.id} resumed")
            elif rng.random() < f.restart:
                self._start(n)
        master = next((n.id for n in self.nodes.values() if n.leads), None) if f.isolate_master else None
        if master is not None and rng.random() < f.isolate_master:
            self.blocked = {frozenset((master, b)) for b in self.ids if b != master}
            self.log(f"partition [{master!r}] | the rest (the master cut off)")
        elif rng.random() < f.partition:
            side = {i for i in self.ids if rng.random() < 0.5}
            self.blocked = {frozenset((a, b)) for a in side for b in self.ids if b not in side}
            self.log(f"partition {sorted(side)} | {sorted(set(self.ids) - side)}")
        elif self.blocked and rng.random() < f.heal:
            self.blocked = set()
            self.log("partition healed")

    def _record(self, n: Node, views, epoch: int, takes_over: int | None = None) -> int:
        """HA_ROLE follow to every member `n` reaches: how many recorded it (`n` included)."""
        recorded = 1
        for v in views:
            o = self.nodes[v.node]
            if not o.up or o.paused or self._cut(n.id, o.id):
                continue  # (a switchover's views are from before its fence)
            try:
                effects = o.core.on_follow(n.id, epoch, takes_over)
            except C.Refused:
                continue
            self._apply(o, effects)
            recorded += 1
        return recorded

    def _scripted(self) -> None:
        """Run the seed's scripted sequence once (see the module doc)."""
        if not self.script:
            master = next((n for n in self.nodes.values() if n.leads and not n.paused), None)
            if master is None or self.now < 200:
                return
            slaves = [n for n in self.nodes.values() if n is not master]
            t = self.now
            if self.faults.scripted == "lagging-failover":
                lag, rest = slaves[0], slaves[1:]
                self.script = [
                    (t, lambda: setattr(lag, "paused", True)),
                    (t + 150, lambda: [self._down(x, power=False) for x in [master, *rest]]),
                    (t + 151, lambda: setattr(lag, "paused", False)),
                    (t + 400, lambda: [self._start(x) for x in [master, *rest] if not x.up]),
                ]
                self.log(f"script: lagging failover to {lag.id}")
                return
            self.script = [
                (t, lambda: [setattr(s, "paused", True) for s in slaves]),
                (t + 80, lambda: self._down(master, power=False)),
                (t + 81, lambda: [setattr(s, "paused", False) for s in slaves]),
                (t + 200, lambda: [setattr(s, "paused", True) for s in slaves]),
                (t + 201, lambda: self._start(master)),
                (t + 400, lambda: [setattr(s, "paused", False) for s in slaves]),
            ]
            self.log(f"script: restart {master.id} in isolation")
        while self.script and self.script[0] is not None and self.script[0][0] <= self.now:
            _, act = self.script.pop(0)
            act()
            if not self.script:
                self.script = [None]  # done

    def _switchover(self, master: Node, n: Node) -> None:
        """`tidelog admin promote` of slave `n` while `master` is up, as promotion.py runs it,
        in two steps. Now: the master is fenced (it must answer `n`'s probe: else this is a
        failover) for FENCE ticks. Later (after up to 1.5 x FENCE: catching up and asking the
        members can outlast the fence; a paused `n` resumes later still): `n` must hold the
        master's log as it was when fenced (else the switchover is refused and the fence
        lifted), the new epoch is recorded by the members `n` still reaches (the master steps
        down to follow it), then `n` leads -- unless it is killed between recording the epoch
        and leading (half the time): everyone then follows a master that never opened its
        epoch, and the operator's failover must still find a slave it may promote. A partition
        in between leaves the master fenced and told nothing: its fence lapses."""
        views, _ = self._views(n)
        if not any(v.node == master.id for v in views):
            # promotion.py fences the master it sees in its probe's views; one it cannot reach
            # (a partition between them) makes this a failover, under the failover rules
            why = self._promote(n)
            self.log(f"operator promotes {n.id} (cut off from master {master.id}): "
                     + ("done" if why is None else f"refused: {why}"))
            return
        self._fence_ids += 1
        fence_id = f"{n.id}:{self._fence_ids}"
        master.core.fence(FENCE, self.now, fence_id)
        due = self.now + self.rng.randint(1, FENCE * 3 // 2)
        theirs = EpochList(master.core.epochs.to_list())  # (the fence's answer: end, epoch, epochs)
        self.switching.append((due, master, n, len(master.log), theirs, views, fence_id))
        self.log(f"operator switches over to {n.id}: {master.id} fenced at offset {len(master.log)} ({fence_id})")

    def _switchover_end(self, sw: tuple) -> None:
        due, master, n, end, theirs, views, fence_id = sw
        fenced = theirs.last_epoch
        self.switching.remove(sw)
        if n.paused:
            self.switching.append((due + 1, *sw[1:]))
            return
        if not n.up or n.core.role != SLAVE or n.core.restart_pending is not None:
            return  # the promoting node is gone: the master's fence lapses
        if not roles.holds_log_of(n.core.epochs, n.synced, theirs, end) or \
                roles.seen_since_fence(n.core.epoch_seen, fenced):  # (promotion._take_over_from)
            if master.up and not master.paused and not self._cut(n.id, master.id) and master.core.role == MASTER:
                master.core.fence(0, self.now, fence_id)
            self.log(f"switchover to {n.id} refused: it holds {n.synced} of {end}, has seen epoch "
                     f"{n.core.epoch_seen} (fenced: {fenced}); fence lifted")
            return
        epoch = n.core.new_epoch(views, len(n.log))
        recorded = self._record(n, views, epoch, fenced)
        if not self.healing and self.rng.random() < 0.5:  # (the heal stops faults)
            self.log(f"switchover to {n.id} (epoch {epoch}, recorded by {recorded}): killed before it leads")
            self._down(n, power=False)
        elif n.core.promotion_shortfall(epoch, recorded) is None:
            self.log(f"switchover to {n.id} (epoch {epoch}, recorded by {recorded})")
            self._apply(n, n.core.promoted(epoch, len(n.log), n.synced, 0, self.now))

    def _operator(self) -> None:
        ups = [n for n in self.nodes.values() if n.up and not n.paused]
        masters = [n for n in ups if n.leads]
        if masters:
            self.last_master_seen = self.now
            slaves = [n for n in ups if n.core.role == SLAVE and n.core.master == masters[0].id]
            busy = {sw[2].id for sw in self.switching}  # (a promoter runs one promotion at a time)
            slaves = [n for n in slaves if n.id not in busy]
            if slaves and not self.healing and \
                    (not self.switching or (self.faults.overlap and self.rng.random() < self.faults.overlap)) \
                    and self.rng.random() < self.faults.switchover:
                self._switchover(masters[0], self.rng.choice(slaves))
            return
        if self.now - self.last_master_seen < PROMOTE_AFTER or not ups:
            return
        slaves = [n for n in ups if n.core.role == SLAVE]
        if not slaves:
            return
        if self.rng.random() < 0.5:
            best = max(slaves, key=lambda n: (n.core.epochs.last_epoch, len(n.log), n.id))
        else:
            best = self.rng.choice(slaves)
        why = self._promote(best)
        self.log(f"operator promotes {best.id}: " + ("done" if why is None else f"refused: {why}"))
        self.last_master_seen = self.now  # try again later
