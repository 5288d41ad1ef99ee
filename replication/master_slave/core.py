"""One master-slave node as a pure state machine: everything the node decides, and in what
order its decisions must reach the disk and the network.

It holds the node's role state (role, whom it follows, the highest epoch heard of, its epoch
list, the master's epoch list from the last WELCOME, why a restarting master may not lead
yet, how far behind it was when it lost its master, the switchover fence) and, while it
is master, its MasterCore (admission, acknowledgements, silence: master.py). Each event --
start, a probe's views, an HA_ROLE follow or fence, a HELLO, a WELCOME, streamed entries, a
lost master, a tick, a promotion's steps -- updates that state through the pure rules
(roles.py, epochs.py) and returns the effects to carry out, in order:

    SaveRole / SaveEpochs   write role.json / epochs.json (atomically, fsynced)
    Truncate / Reset        cut the log at an offset / drop it and start over at an offset
    StepDown                stop being master: answer its waiting sends TERM_CHANGED, drop
                            its slaves, keep the watermark consumers saw
    StopLink / StartLink    close the HA link to the master / open one (None: find one)
    Lead                    start leading an epoch (its MasterCore exists already): the
                            watermark, the %EPOCH% marker, the first progress
    RoleChanged             tell the broker (client routes, status)

No sockets, files, clocks or tasks: the asyncio driver (driver.py) does the I/O and feeds
the results in; the seeded simulation (sim.py) drives the same class over its model nodes.
The rules are called through the `roles` module (roles.restart_decision, ...) so that the
simulation's mutation tests can swap one out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replication.master_slave import roles
from replication.master_slave.epochs import EpochList, Plan, sync_plan
from replication.master_slave.master import MasterConfig, MasterCore
from replication.master_slave.roles import MASTER, SLAVE, PromotionFacts, View
from replication.master_slave.state import RoleState

FENCES_MAX = 16  # switchovers fencing one master at once (each holds one fence id)


class Refused(Exception):
    """The core refuses an event (an HA_ROLE request, a WELCOME); the text says why."""


# --- effects -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SaveRole:
    state: RoleState


@dataclass(frozen=True)
class SaveEpochs:
    epochs: tuple  # ((epoch, start), ...)


@dataclass(frozen=True)
class Truncate:
    offset: int


@dataclass(frozen=True)
class Reset:
    start: int
    old_epochs: tuple  # the epochs the dropped log had (for the log message)


@dataclass(frozen=True)
class StepDown:
    waiting: tuple  # tokens of the sends that were waiting for replicas


@dataclass(frozen=True)
class StopLink:
    pass


@dataclass(frozen=True)
class StartLink:
    master: str | None


@dataclass(frozen=True)
class Lead:
    epoch: int
    start: int


@dataclass(frozen=True)
class RoleChanged:
    pass


@dataclass
class Decision:
    """What a restarting master does: "follow" (arg: the node), "record" (arg: the epoch to
    have the members record, then `restart_recorded`), "open" (arg: the epoch, led now) or
    "wait" (arg: why); `first` is True when this reason to wait is new."""
    what: str
    arg: object
    effects: list = field(default_factory=list)
    first: bool = False


@dataclass(frozen=True)
class HelloRefusal:
    error: str
    master: str | None = None  # the master this node knows of
    probe: bool = False  # the slave heard of a newer epoch: probe now


def _snapshot(epochs: EpochList) -> tuple:
    return tuple(tuple(e) for e in epochs.entries)


class NodeCore:
    def __init__(self, me: str, members, mcfg: MasterConfig):
        self.me = me
        self.members = tuple(members)  # every member's id, this node's included
        self.mcfg = mcfg
        self.role = SLAVE
        self.master: str | None = None
        self.epoch_seen = 0
        self.epochs = EpochList()
        self.master_epochs = EpochList()  # the master's, from the last WELCOME
        self.restart_pending: str | None = None  # was master; why it may not open an epoch yet
        self.lag_at_loss: int | None = None
        # the switchovers' fences: fence id -> when it lapses (ms); each promoter lifts only
        # its own, so one that gives up cannot lift the fence another one still relies on
        self.fences: dict[str | None, int] = {}
        self.mcore: MasterCore | None = None
        self.promoting = False  # telling the members of a new epoch, before leading it
        self.promotions = 0

    # --- state -------------------------------------------------------------------------------

    def fenced(self) -> bool:
        """Refusing writes for a switchover: until every fence is lifted, or (one lapsed)
        until `fence_lapsed` has stepped down."""
        return self.role == MASTER and bool(self.fences)

    def view(self, end: int) -> View:
        return View(self.me, self.role, self.epochs.last_epoch, self.epoch_seen, self.master, end,
                    self.fenced())

    def lag(self, master_end: int | None, durable: int) -> int | None:
        """How far behind its master this node is (`master_end`: None when not connected)."""
        return self.lag_at_loss if master_end is None else max(0, master_end - durable)

    # --- start and roles -----------------------------------------------------------------------

    def start(self, st: RoleState, epochs: EpochList) -> list:
        """The node starts with its role file and its (reconciled) epoch list. A node that
        was master then asks `restart_step` what to do; a slave follows its master."""
        self.epochs = epochs
        self.epoch_seen = max(st.epoch_seen, epochs.last_epoch)
        if st.role == MASTER:
            self.restart_pending = "not decided yet"
            return []
        return self.follow(st.master if st.master != self.me else None)

    def follow(self, master: str | None) -> list:
        """Become a slave of `master` (None: a slave looking for its master)."""
        out: list = []
        if self.mcore is not None:
            out.append(StepDown(tuple(self.mcore.fail_all())))
            self.mcore = None
        out.append(StopLink())
        self.role, self.master = SLAVE, master
        self.fences.clear()
        if master is not None:
            self.restart_pending = None
        if self.restart_pending is None:  # a waiting master keeps its role on disk
            out.append(SaveRole(RoleState(SLAVE, master, self.epoch_seen)))
        out.append(StartLink(master))
        out.append(RoleChanged())
        return out

    def lead(self, epoch: int, end: int, durable: int, visible: int, now_ms: int) -> list:
        """Become master of `epoch`, its log ending at `end` (durable up to `durable`;
        consumers saw up to `visible`)."""
        out: list = [StopLink()]
        self.role, self.master, self.epoch_seen = MASTER, self.me, epoch
        self.restart_pending = None
        self.fences.clear()
        self.epochs.open(epoch, end)
        out.append(SaveEpochs(_snapshot(self.epochs)))
        out.append(SaveRole(RoleState(MASTER, self.me, epoch)))
        self.mcore = MasterCore(self.mcfg, end, durable, visible)
        self.mcore.now_ms = now_ms
        out.append(Lead(epoch, end))
        out.append(RoleChanged())
        return out

    def restart_step(self, views: list[View], end: int) -> Decision:
        """A node that was master when it stopped, at start and at each probe while it waits
        (roles.restart_decision)."""
        me = View(self.me, MASTER, self.epochs.last_epoch, self.epoch_seen, self.me, end)
        what, arg = roles.restart_decision(me, views, len(self.members))
        if what == "follow":
            self.restart_pending = None
            self._heard(views, arg)
            return Decision("follow", arg, self.follow(arg))
        if what == "open":
            return Decision("record", arg)
        return self._wait(arg)

    def restart_recorded(self, epoch: int, recorded: int, end: int, durable: int, visible: int,
                         now_ms: int) -> Decision:
        """`recorded` members (this node included) recorded the epoch `restart_step` chose."""
        need = roles.restart_quorum(len(self.members))
        if recorded < need:
            return self._wait(f"only {recorded} of the {need} members needed (this node included) "
                              f"recorded epoch {epoch}")
        self.restart_pending = None
        self.epoch_seen = max(self.epoch_seen, epoch)
        return Decision("open", epoch, self.lead(epoch, end, durable, visible, now_ms))

    def _wait(self, why: str) -> Decision:
        first = self.restart_pending != why
        self.restart_pending = why
        return Decision("wait", why, self.follow(None) if first else [], first)

    def on_views(self, views: list[View], end: int, now_ms: int = 0) -> tuple[str | None, list]:
        """A probe's views (not while a restart is pending): (the master to follow now, or
        None; effects). A master that hears of a newer epoch whose master does not answer
        (roles.promoted_elsewhere) stops taking writes, keeping its role on disk, and from
        then on asks as a restarting master does (restart_step): it follows that master once
        it answers, or opens an epoch when the rules let it (its master may never have led)."""
        me = self.view(end)
        target = roles.whom_to_follow(me, views)
        if target is None:
            named = roles.promoted_elsewhere(me, views)
            if named is None or named[0] not in self.members:
                return None, []
            self.restart_pending = (
                f"a member names {named[0]} master of epoch {named[1]}, newer than this master's "
                f"{me.epoch}, and {named[0]} does not answer as master" if named[0] != self.me else
                f"a member recorded this node as master of epoch {named[1]}, which it never led (its "
                f"promotion died before it led): it leads again above that epoch, or follows a newer master")
            return None, self.follow(None)
        if target not in self.members or target == self.me:
            return None, []
        self._heard(views, target)
        return target, self.follow(target)

    def _heard(self, views: list[View], master: str) -> None:
        """Following `master`, found by a probe: its epoch counts as heard of at once (not
        only at its WELCOME), so that promoting this node never reuses that epoch."""
        v = next((v for v in views if v.node == master), None)
        if v is not None and v.role == MASTER:
            self.epoch_seen = max(self.epoch_seen, v.epoch)

    def on_follow(self, master: str, epoch: int, takes_over: int | None = None) -> list:
        """HA_ROLE follow: record `master` as the master of `epoch` (roles.accepts_follow).
        How far behind its old master this node was says nothing about the new one, which
        may lead and (ASYNC) acknowledge alone before this node ever copies from it: until
        it does, this node has "never copied" from its master (roles.promotion_problems)."""
        if master not in self.members or master == self.me:
            raise Refused(f"cannot follow {master!r}")
        if not roles.accepts_follow(self.epoch_seen, self.master, epoch, master, takes_over):
            raise Refused(f"epoch {epoch} is older than {self.epoch_seen}, known here"
                          if epoch < self.epoch_seen else f"epoch {epoch} already has master {self.master} here"
                          if epoch == self.epoch_seen else f"epoch {self.epoch_seen} began after the "
                          f"switchover fenced the master of epoch {takes_over}")
        self.epoch_seen = epoch
        if self.role == MASTER or self.master != master:
            self.lag_at_loss = None
            return self.follow(master)
        return [SaveRole(RoleState(SLAVE, master, epoch))]

    def on_switch(self, master: str) -> list:
        """A refusing node named another master: follow it (if still a slave of another)."""
        if self.role == SLAVE and self.master != master:
            self.lag_at_loss = None  # (as in on_follow)
            return self.follow(master)
        return []

    # --- promotion -------------------------------------------------------------------------------

    def fence(self, ms: int, now_ms: int, fence_id: str | None = None) -> None:
        """HA_ROLE fence: refuse writes for `ms`; 0 lifts the fence (the promoting node gave
        up before it recorded any epoch). `fence_id` names the switchover: 0 lifts only that
        fence, and the master stays fenced while another switchover's is on (two operators,
        or a retry, promoting two slaves at once: one giving up must not let the master take
        writes that the other, catching up only to the end it was told, never holds).
        None: a promoter of a build before fence ids."""
        if self.role != MASTER:
            raise Refused(f"{self.me} is not the master")
        if not ms:
            self.fences.pop(fence_id, None)
        elif fence_id in self.fences or len(self.fences) < FENCES_MAX:
            self.fences[fence_id] = now_ms + ms
        else:
            raise Refused(f"{self.me} is fenced by {len(self.fences)} switchovers already")

    def failover_problems(self, views: list[View], down: list[str], end: int, lag: int | None,
                          live_master: str | None = None) -> list[str]:
        """Why promoting this node while its master is down could lose acknowledged sends."""
        c = self.mcfg
        acks = (c.min_in_sync_replicas if c.auto_degrade else c.in_sync_replicas) - 1
        problems = roles.promotion_problems(PromotionFacts(
            self.view(end), views, down, lag, c.fallbehind_max_bytes, c.sync, acks))
        if live_master is not None:
            problems.append(f"{live_master} is still master: it will be made to follow "
                            "and lose what this node does not have")
        return problems

    def failover_loss(self, views: list[View], down: list[str], end: int, lag: int | None,
                      forced: bool = False) -> roles.AsyncLoss | None:
        """What promoting this node while its master is down may lose of the acknowledged
        sends its replication mode promised to keep (roles.async_loss; None: nothing)."""
        c = self.mcfg  # (a self-fence of fewer replicas may miss this promotion's quorum: no bound)
        fenced = c.async_fence_replicas >= roles.restart_quorum(len(self.members))
        fence = c.fallbehind_max_bytes + c.append_bytes_max if fenced else None
        return roles.async_loss(PromotionFacts(self.view(end), views, down, lag, c.fallbehind_max_bytes,
                                               c.sync, 0, fence), forced)

    def new_epoch(self, views: list[View], end: int) -> int:
        return roles.new_epoch(self.view(end), views)

    def promotion_shortfall(self, epoch: int, recorded: int) -> str | None:
        """None if enough members recorded a promotion's epoch, else why not."""
        need = roles.promotion_quorum(len(self.members))
        if recorded >= need:
            return None
        return (f"only {recorded} of the {need} members needed (this node included) recorded "
                f"epoch {epoch}: a master restarting apart from them could reuse it")

    def promoted(self, epoch: int, end: int, durable: int, visible: int, now_ms: int) -> list:
        self.epoch_seen = max(self.epoch_seen, epoch)
        self.promotions += 1
        return self.lead(epoch, end, durable, visible, now_ms)

    # --- the HA handshake ------------------------------------------------------------------------

    def refuse_hello(self, node: str, epoch_seen: int, blocked: bool = False) -> HelloRefusal | None:
        """Why this node does not stream its log to `node` (None: it does)."""
        if node not in self.members or node == self.me:
            return HelloRefusal(f"{node!r} is not a member of this group")
        if blocked:
            return HelloRefusal(f"fault injection: {self.me} drops traffic with {node}")
        if self.role != MASTER:
            return HelloRefusal(f"{self.me} is not the master" + (
                " yet (a promotion is under way)" if self.promoting else ""),
                None if self.promoting else self.master)
        if epoch_seen > self.epochs.last_epoch:  # someone newer exists: find out now
            return HelloRefusal(f"{node} has seen epoch {epoch_seen}, newer than this master's "
                                f"{self.epochs.last_epoch}", probe=True)
        return None

    def plan_for(self, theirs: EpochList, their_min: int, their_end: int, my_min: int,
                 my_first_entry: int, my_end: int) -> Plan:
        return sync_plan(theirs, their_min, their_end, self.epochs, my_min, my_first_entry, my_end)

    def on_welcome(self, master: str, epoch: int, epochs, start: int, truncate_to: int | None,
                   reset: bool) -> list:
        """The master's WELCOME: what to cut, what to record (then the log must end at
        `start`)."""
        if epoch < self.epoch_seen:
            raise Refused(f"{master} is master of epoch {epoch}, but epoch {self.epoch_seen} "
                          "exists: it is out of date")
        self.master_epochs = EpochList(epochs)
        out: list = []
        if epoch > self.epoch_seen:
            self.epoch_seen = epoch
            out.append(SaveRole(RoleState(SLAVE, master, epoch)))
        if reset:
            out.append(Reset(start, _snapshot(self.epochs)))
            self.epochs = EpochList()
            out.append(SaveEpochs(()))
        elif truncate_to is not None:
            out.append(Truncate(truncate_to))
            self.epochs.truncate(truncate_to)
            out.append(SaveEpochs(_snapshot(self.epochs)))
        return out

    def knows_term(self, term: int) -> bool:
        """Whether an entry of `term` opens no new epoch here."""
        return term <= (self.epochs.last_epoch if self.epochs.entries else -1)

    def on_entries(self, entries) -> list:
        """Entries streamed from the master, as (term, start offset) in log order, before
        they are appended: the epochs they open (SaveEpochs once they are in the log)."""
        changed = False
        for term, pos in entries:
            if not self.knows_term(term):
                start = self.master_epochs.start_of(term)
                self.epochs.open(term, pos if start is None else start)
                changed = True
        return [SaveEpochs(_snapshot(self.epochs))] if changed else []

    def on_master_lost(self, master: str, lag: int | None) -> None:
        """The link to `master` broke `lag` bytes behind it (None: never welcomed). A link
        to a master this node no longer follows (stopped by a switch) says nothing."""
        if lag is not None and master == self.master:
            self.lag_at_loss = lag

    # --- time --------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> tuple[list, list[str], bool]:
        """(sends that timed out, slaves gone silent, whether a fence has lapsed: then call
        `fence_lapsed`, in the driver under the same lock as every other role change)."""
        if self.mcore is None:
            return [], [], False
        expired, silent = self.mcore.tick(now_ms)
        return expired, silent, self._lapsed(now_ms)

    def _lapsed(self, now_ms: int) -> bool:
        return self.fenced() and now_ms >= min(self.fences.values())

    def fence_lapsed(self, now_ms: int) -> list:
        """A fence that lapsed (nobody lifted it, no new master was announced here) means the
        switchover's outcome is unknown: the promoted node may lead a new epoch that enough
        members recorded, and this master, cut off from them, would go on acknowledging sends
        with the slaves left on its side, sends the new epoch never holds. So it stops being
        master, keeping its role on disk, and takes writes again only as a restarting master
        would (restart_step: follow the newer master, or have a quorum record a new epoch).
        It stays fenced (no writes) until this runs. [] if the fence is gone meanwhile (lifted,
        or a follow made it a slave)."""
        if not self._lapsed(now_ms):
            return []
        self.restart_pending = ("a switchover fenced this master and did not complete: it asks "
                                "the members before it takes writes again")
        return self.follow(None)
