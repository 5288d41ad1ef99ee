"""A seeded, single-threaded simulation of a Raft group, with checkers.

Each node's Ready is applied by ready.py's `apply_ready`, the broker driver's own order,
through `SimPorts`: a fake disk with a page cache and a group-commit flusher that runs at
random times (the driver's `flush: sync`: messages that vouch for writes wait for it, and
a leader counts its own appends only once fsynced), and a fake network.

The network delays, drops, duplicates, reorders and partitions messages. Storage faults: a
power loss keeps the fsynced log plus a random prefix of the rest (torn writes), and can
strike in the middle of a Ready (after its writes, before their fsync; or while the hard
state is being replaced); a kill -9 keeps the page cache; an fsync that fails stops the
node, which loses its power (the store's rule: a failed fsync is never taken as done).
Nodes restart from what they persisted. Clients append at whoever leads. After every step the checkers
look for: two leaders in one term; a committed entry that changes or disappears; an
acknowledged append missing from the committed log; a new leader missing committed
entries; logs that agree on (index, term) somewhere but differ before it; a leader that still
holds its read lease while a newer leader exists. At the end the
faults heal, and the group must elect a leader and commit everything within a bound.

With `lazy_ticks` each node sleeps through the ticks its core calls quiet and runs them
before its next input, as the broker's driver does; `lazy_ticks_differ` runs a seed both
ways: the two must be one run, message for message.

    python -m replication.raft.sim --seed 42 [--nodes 5] [--ticks 1500] [--verbose]
                                   [--lazy-ticks | --compare-lazy]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from dataclasses import dataclass, field

from collections import deque

from replication.raft import messages as m
from replication.raft.acks import PendingAcks
from replication.raft.core import HardState, RaftConfig
from replication.raft.memlog import MemLog
from replication.raft.node import RaftNode
from replication.raft.ready import Outbox, apply_ready, release

HEAL_TICKS = 1200  # after the faults stop, everything must be committed within this


class SafetyViolation(AssertionError):
    pass


class PowerLoss(Exception):
    """Raised from a port: the node lost its power (or its fsync failed) mid-Ready."""


@dataclass
class Faults:
    drop: float = 0.05
    duplicate: float = 0.02
    delay_max: int = 8  # ticks; random delays reorder messages
    crash: float = 0.002  # per node per tick: power loss (the page cache is gone)
    kill: float = 0.0005  # per node per tick: kill -9 (the page cache survives)
    restart: float = 0.02  # per down node per tick
    crash_mid_ready: float = 0.003  # per write: power loss before its fsync
    fsync_fail: float = 0.0005  # per fsync (log flush or hard-state replace): fatal
    flush: float = 0.5  # per tick: the flusher fsyncs what was requested
    partition: float = 0.003  # per tick: a random split
    heal: float = 0.01
    propose: float = 0.3
    transfer: float = 0.003  # per tick: ask the leader to hand over to a random follower


@dataclass
class SimNode:
    id: str
    log: MemLog = field(default_factory=MemLog)
    hard: HardState = field(default_factory=HardState)
    commit_persisted: int = -1
    node: RaftNode | None = None
    acks: PendingAcks = field(default_factory=PendingAcks)
    commit_checked: int = -1
    ports: SimPorts | None = None
    local_waiting: deque = field(default_factory=deque)  # leader: its appends awaiting fsync
    flush_requested: bool = False
    owed: int = 0  # lazy ticks: ticks slept through, to run before the next input
    quiet: int = 0  # lazy ticks: node.quiet_ticks() after its last input


class SimPorts:
    """apply_ready's ports for one simulated node (one process lifetime): the fake disk,
    the fake network, and the sim's bookkeeping for the checkers."""

    def __init__(self, sim: Sim, sn: SimNode):
        self.sim, self.sn = sim, sn
        self.outbox = Outbox()

    def _maybe_lose_power(self) -> None:
        if self.sim.rng.random() < self.sim.faults.crash_mid_ready:
            raise PowerLoss("power lost before the fsync")

    def save_hard_state(self, hs: HardState) -> None:
        # write_atomic: write a temporary file, fsync it, rename, fsync the directory; a
        # failure leaves the old file or (after the rename) possibly the new one
        rng, f = self.sim.rng, self.sim.faults
        if rng.random() < f.crash_mid_ready + f.fsync_fail:
            if rng.random() < 0.5:
                self.sn.hard = hs
            raise PowerLoss("the hard state's fsync failed or power was lost during it")
        self.sn.hard = hs

    def reset_to(self, first) -> None:
        self.sn.log.reset_to(first[0])
        self.sn.log.append([first])
        self._maybe_lose_power()

    def truncate_from(self, index: int) -> None:
        sn = self.sn
        if index <= sn.commit_persisted:
            raise SafetyViolation(f"{sn.id} told to truncate committed entries from {index}")
        sn.log.truncate_from(index)

    def append(self, entries) -> None:
        self.sn.log.append(entries)
        self._maybe_lose_power()

    def unsynced_mark(self) -> int | None:
        log = self.sn.log
        return log.last_index() if log.last_index() > log.flushed else None

    def request_flush(self) -> None:
        self.sn.flush_requested = True

    def send(self, to: str, msg) -> None:
        self.sim._send(self.sn.id, to, msg)

    def role_changed(self, is_leader: bool) -> None:
        if is_leader:
            self.sim._became_leader(self.sn)
        else:  # the driver's _role_changed: fail the waiting clients, forget local waits
            self.sn.acks.term_changed(None)
            self.sn.local_waiting.clear()

    def committed(self, index: int) -> None:
        sim, sn = self.sim, self.sn
        sim._check_commit(sn)
        sn.commit_persisted = index
        for token in sn.acks.committed(index, sn.node.term):
            i, term, data = token
            if sn.log.term_at(i) != term:
                raise SafetyViolation(f"acked {i} at {sn.id} but its entry changed")
            sim.acked[i] = (term, data)
            sim.stats["acked"] += 1

    def append_noop(self) -> None:
        self.sim._leader_append(self.sn, b"noop")


class Sim:
    def __init__(self, seed: int, n_nodes: int = 3, ticks: int = 1500, faults: Faults | None = None,
                 verbose: bool = False, cfg_overrides: dict | None = None, lazy_ticks: bool = False):
        self.seed = seed
        # lazy_ticks: each node sleeps through its quiet ticks (RaftNode.quiet_ticks) and runs
        # them before its next input, as the driver does; with quiet_ticks right, a run is the
        # same run as with a tick per step (self.trace records every message sent)
        self.lazy_ticks = lazy_ticks
        self.trace: list | None = None
        self.rng = random.Random(seed)
        self.ticks = ticks
        if faults is None:  # vary the network per seed: sometimes slow and duplicating
            faults = Faults(delay_max=self.rng.choice((4, 8, 8, 30)),
                            duplicate=self.rng.choice((0.02, 0.02, 0.1)),
                            flush=self.rng.choice((1.0, 0.5, 0.2, 0.05)))
        self.faults = faults
        self.verbose = verbose
        self.ids = tuple("n%d" % i for i in range(n_nodes))
        # the safety rules must hold whatever the options: some seeds run without pre-vote
        # or check-quorum, whose absence makes elections more adversarial
        self.cfg_overrides = {"election_ticks": 20, "heartbeat_ticks": 5, "push_timeout_ticks": 40,
                              "max_pending_entries": 64, "push_batch_entries_max": 8,
                              "transfer_timeout_ticks": 80, "pre_vote": self.rng.random() < 0.7,
                              "check_quorum": self.rng.random() < 0.7, **(cfg_overrides or {})}
        self.nodes = {i: SimNode(i) for i in self.ids}
        self.now = 0
        self.net: list = []  # heap of (deliver tick, seq, to, msg)
        self._net_seq = 0
        self._fifo_floor: dict[tuple[str, str], int] = {}  # (src, to) -> a TimeoutNow's delivery tick
        self.blocked: set[tuple[str, str]] = set()
        self.leaders: dict[int, str] = {}  # term -> leader
        self.committed: dict[int, tuple[int, bytes]] = {}  # index -> (term, data)
        self.acked: dict[int, tuple[int, bytes]] = {}  # client appends acknowledged
        self._data = 0
        self.stats = {"crashes": 0, "elections": 0, "acked": 0, "partitions": 0, "transfers": 0,
                      "kills": 0, "mid_ready": 0, "fsync_failures": 0, "entries_lost": 0, "torn": 0}
        for sn in self.nodes.values():
            self._start(sn)

    # --- nodes ---------------------------------------------------------------------------------

    def _start(self, sn: SimNode) -> None:
        # the store's recovery: the committed index is at most what the log still holds
        sn.commit_persisted = min(sn.commit_persisted, sn.log.last_index())
        cfg = RaftConfig(sn.id, self.ids, **self.cfg_overrides)
        sn.node = RaftNode(cfg, sn.log, sn.hard, sn.commit_persisted,
                           random.Random(self.rng.getrandbits(32)))
        sn.acks = PendingAcks()
        sn.ports = SimPorts(self, sn)
        sn.local_waiting.clear()
        sn.flush_requested = False
        sn.owed = sn.quiet = 0
        sn.commit_checked = min(sn.commit_checked, sn.commit_persisted)

    def _crash(self, sn: SimNode, power: bool = True, why: str = "crashes") -> None:
        unsynced = sn.log.unsynced()
        lost = sn.log.crash(self.rng) if power else 0
        if not power:
            sn.log.flush()  # kill -9: the page cache reaches the disk anyway
            self.stats["kills"] += 1
        self.stats["entries_lost"] += lost
        self.stats["torn"] += 0 < lost < unsynced
        self.log(f"{sn.id} {why} (log {sn.log.last_index()}, {lost} unsynced entries lost)")
        sn.node = None
        sn.ports = None
        sn.acks = PendingAcks()
        self.stats["crashes"] += 1

    def _process(self, sn: SimNode) -> None:
        """The driver: apply the Ready in ready.py's order through this node's ports."""
        try:
            apply_ready(sn.node, sn.ports)
        except PowerLoss as e:
            self.stats["mid_ready"] += 1
            self._crash(sn, why=f"loses power mid-Ready ({e})")
            return
        if self.lazy_ticks:
            sn.quiet = sn.node.quiet_ticks()

    def _clock(self, sn: SimNode) -> None:
        """Lazy ticks: run the ticks `sn` slept through (the driver's _clock)."""
        while sn.owed and sn.node is not None:
            sn.owed -= 1
            sn.node.tick()
            self._process(sn)

    def _flusher(self, sn: SimNode) -> None:
        """The group-commit flusher fsyncs and reports (the driver's on_flushed)."""
        sn.flush_requested = False
        if self.rng.random() < self.faults.fsync_fail:
            self.stats["fsync_failures"] += 1
            return self._crash(sn, why="stops: an fsync failed")
        self._clock(sn)
        if sn.node is None:
            return
        sn.log.flush()
        release(sn.ports, sn.log.flushed)
        last = None
        while sn.local_waiting and sn.local_waiting[0] <= sn.log.flushed:
            last = sn.local_waiting.popleft()
        if last is not None:
            sn.node.local_appended(last)
            self._process(sn)

    def _leader_append(self, sn: SimNode, data: bytes, client: bool = False) -> None:
        """The driver's leader_append under flush: sync: counted once fsynced."""
        self._clock(sn)  # (the driver's leader_append runs the ticks it owes first, then checks)
        node = sn.node
        if node is None or not node.accepting_writes:
            return
        index = sn.log.last_index() + 1
        sn.log.append([(index, node.term, data)])
        if client:
            sn.acks.add(index, node.term, self.now + 10**9, (index, node.term, data))
        sn.local_waiting.append(index)
        sn.flush_requested = True
        if self.lazy_ticks:
            sn.quiet = node.quiet_ticks()  # an entry to push: the next tick does

    def _became_leader(self, sn: SimNode) -> None:
        term = sn.node.term
        self.stats["elections"] += 1
        self.log(f"{sn.id} leads term {term} (log {sn.log.last_index()})")
        other = self.leaders.setdefault(term, sn.id)
        if other != sn.id:
            raise SafetyViolation(f"two leaders in term {term}: {other} and {sn.id}")
        for index, (t, data) in self.committed.items():
            if sn.log.term_at(index) != t:
                raise SafetyViolation(f"new leader {sn.id} (term {term}) lacks committed entry {index}")

    def _check_commit(self, sn: SimNode) -> None:
        c = sn.node.commit_index
        for i in range(max(sn.commit_checked + 1, sn.log.begin_index()), c + 1):
            e = sn.log.term_at(i)
            if e is None:
                raise SafetyViolation(f"{sn.id} commits {c} but does not hold {i}")
            entry = (e, sn.log.items[i - sn.log.begin][2])
            seen = self.committed.setdefault(i, entry)
            if seen != entry:
                raise SafetyViolation(f"committed entry {i} differs: {seen} vs {entry} at {sn.id}")
        sn.commit_checked = max(sn.commit_checked, c)

    # --- network -------------------------------------------------------------------------------

    def _send(self, src: str, to: str, msg) -> None:
        f = self.faults
        if self.trace is not None:
            self.trace.append((self.now, src, to, repr(msg)))
        if (src, to) in self.blocked or self.rng.random() < f.drop:
            return
        # Messages are delayed, reordered and duplicated -- except that nothing sent after a
        # TimeoutNow on the same link overtakes it, and it is never duplicated: the peer links
        # are TCP streams (a reconnect loses what the old stream held, it never replays it),
        # and the leader's read lease relies on that order (leader.py)
        timeout_now = isinstance(msg, m.TimeoutNow)
        copies = 2 if not timeout_now and self.rng.random() < f.duplicate else 1
        floor = self._fifo_floor.get((src, to), 0)
        for _ in range(copies):
            self._net_seq += 1
            at = max(floor, self.now + 1 + (self.rng.randrange(f.delay_max) if f.delay_max else 0))
            heapq.heappush(self.net, (at, self._net_seq, to, msg))
            if timeout_now:
                self._fifo_floor[(src, to)] = at

    def _deliver(self) -> None:
        while self.net and self.net[0][0] <= self.now:
            _, _, to, msg = heapq.heappop(self.net)
            sn = self.nodes[to]
            if sn.node is None:
                continue
            self._clock(sn)
            if sn.node is None:
                continue
            sn.node.step(msg)
            self._process(sn)

    # --- the run -------------------------------------------------------------------------------

    def log(self, text: str) -> None:
        if self.verbose:
            print(f"[{self.now:5d}] {text}")

    def _faults_step(self) -> None:
        f, rng = self.faults, self.rng
        for sn in self.nodes.values():
            if sn.node is not None and rng.random() < f.crash:
                self._crash(sn)
            elif sn.node is not None and rng.random() < f.kill:
                self._crash(sn, power=False, why="is killed")
            elif sn.node is None and rng.random() < f.restart:
                self.log(f"{sn.id} restarts (log {sn.log.last_index()}, term {sn.hard.term})")
                self._start(sn)
        if rng.random() < f.partition:
            side = set(rng.sample(self.ids, rng.randrange(1, len(self.ids))))
            self.blocked = {(a, b) for a in self.ids for b in self.ids if (a in side) != (b in side)}
            self.stats["partitions"] += 1
            self.log(f"partition {sorted(side)} | {sorted(set(self.ids) - side)}")
        elif self.blocked and rng.random() < f.heal:
            self.blocked = set()
            self.log("partition healed")
        if rng.random() < f.transfer:
            leader = next((sn for sn in self.nodes.values() if sn.node is not None and sn.node.is_leader), None)
            if leader is not None:
                target = rng.choice([i for i in self.ids if i != leader.id])
                self._clock(leader)
                if leader.node is None or not leader.node.is_leader:
                    return
                err = leader.node.transfer_leader(target)
                self.log(f"transfer {leader.id} -> {target}: {err or 'started'}")
                self.stats["transfers"] += err is None
                self._process(leader)

    def _propose(self) -> None:
        for sn in self.nodes.values():
            if sn.node is not None and sn.node.accepting_writes and self.rng.random() < self.faults.propose:
                self._data += 1
                self._leader_append(sn, b"c%d" % self._data, client=True)

    def step(self, faults: bool) -> None:
        self.now += 1
        if faults:
            self._faults_step()
        self._propose()
        for sn in self.nodes.values():
            if sn.node is None:
                continue
            if not self.lazy_ticks:
                sn.node.tick()
                self._process(sn)
                continue
            sn.owed += 1
            if sn.owed > sn.quiet:  # this tick may do something: run it (and those before it)
                self._clock(sn)
        self._deliver()
        for sn in self.nodes.values():
            if sn.node is not None and sn.flush_requested and self.rng.random() < self.faults.flush:
                self._flusher(sn)
        self._check_lease()
        if self.now % 50 == 0:
            self._check_logs()

    def _check_lease(self) -> None:
        """A leader serves reads only while no newer leader can exist (leader.py's lease)."""
        leaders = [sn.node for sn in self.nodes.values() if sn.node is not None and sn.node.is_leader]
        owed = {sn.id: sn.owed for sn in self.nodes.values()}
        for a in leaders:
            # (a lazy leader's clock is behind by the ticks it owes: its lease as it will
            # be once it runs them, as the driver runs them before it serves a read)
            held = a.now + owed[a.id] < a.leading.lease_end_tick() if self.lazy_ticks else a.read_lease_held
            if held and any(b.term > a.term for b in leaders):
                newer = max(leaders, key=lambda b: b.term)
                raise SafetyViolation(f"{a.id} holds a read lease in term {a.term} while {newer.id} "
                                      f"leads term {newer.term}")

    def _check_logs(self) -> None:
        """Log matching: if two logs hold the same (index, term), they agree up to it."""
        logs = [sn.log for sn in self.nodes.values()]
        for a in range(len(logs)):
            for b in range(a + 1, len(logs)):
                la, lb = logs[a], logs[b]
                lo, hi = max(la.begin, lb.begin), min(la.last_index(), lb.last_index())
                diverged = False
                for i in range(lo, hi + 1):
                    ea, eb = la.items[i - la.begin], lb.items[i - lb.begin]
                    if ea == eb:
                        if diverged:
                            raise SafetyViolation(f"logs agree at {i} after differing before it")
                    else:
                        diverged = True

    def run(self) -> dict:
        for _ in range(self.ticks):
            self.step(faults=True)
        # heal: everyone up, reliable network, then everything acked and proposed commits
        self.blocked = set()
        self.faults = Faults(drop=0, duplicate=0, delay_max=2, crash=0, kill=0, restart=0,
                             crash_mid_ready=0, fsync_fail=0, flush=self.faults.flush,
                             partition=0, heal=0, propose=0, transfer=0)
        for sn in self.nodes.values():
            if sn.node is None:
                self._start(sn)
        self.log("healed")
        for _ in range(HEAL_TICKS):
            self.step(faults=False)
            leader = next((sn for sn in self.nodes.values() if sn.node.is_leader), None)
            if leader is not None and all(
                    sn.node.commit_index == leader.log.last_index() == sn.log.last_index()
                    for sn in self.nodes.values()):
                break
        else:
            states = {i: sn.node.status() for i, sn in self.nodes.items()}
            raise SafetyViolation(f"no progress {HEAL_TICKS} ticks after healing: {states}")
        self._check_logs()
        logs = {i: sn.log.items for i, sn in self.nodes.items()}
        if len({tuple(v) for v in logs.values()}) != 1:
            raise SafetyViolation("logs differ after healing")
        for index, entry in self.acked.items():
            if self.committed.get(index) != entry:
                raise SafetyViolation(f"acknowledged append {index} is not in the committed log")
        self.stats["ticks"] = self.now
        self.stats["log_length"] = leader.log.last_index() + 1
        return self.stats


def lazy_ticks_differ(seed: int, nodes: int, ticks: int = 1500) -> str | None:
    """Run `seed` with a tick per step and with lazy ticks: where the two runs part (the
    first message sent differently, or their outcomes), or None when they are one run."""
    runs = []
    for lazy in (False, True):
        sim = Sim(seed, nodes, ticks, lazy_ticks=lazy)
        sim.trace = []
        try:
            outcome = sim.run()
        except SafetyViolation as e:
            outcome = f"violation: {e}"
        runs.append((sim.trace, outcome))
    (eager, eager_out), (lazy, lazy_out) = runs
    for k, (a, b) in enumerate(zip(eager, lazy)):
        if a != b:
            return f"message {k}: a tick per step sends {a}, lazy ticks send {b}"
    if len(eager) != len(lazy) or eager_out != lazy_out:
        return f"{len(eager)} vs {len(lazy)} messages; outcomes {eager_out} vs {lazy_out}"
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=1500)
    ap.add_argument("--verbose", "-v", action="store_true")
    ap.add_argument("--lazy-ticks", action="store_true",
                    help="nodes sleep through their quiet ticks, as the broker's driver does")
    ap.add_argument("--compare-lazy", action="store_true",
                    help="run the seed both ways and say where the runs part (they must not)")
    a = ap.parse_args(argv)
    if a.compare_lazy:
        diff = lazy_ticks_differ(a.seed, a.nodes, a.ticks)
        print(f"seed {a.seed}: " + (f"DIFFERENT: {diff}" if diff else "the same run both ways"))
        return 1 if diff else 0
    try:
        stats = Sim(a.seed, a.nodes, a.ticks, verbose=a.verbose, lazy_ticks=a.lazy_ticks).run()
    except SafetyViolation as e:
        print(f"seed {a.seed}: VIOLATION: {e}")
        return 1
    print(f"seed {a.seed}: ok {stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
