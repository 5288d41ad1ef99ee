"""A tiny deterministic Raft group for scenario tests: FIFO delivery, manual faults."""

import random

from replication.raft import messages as m
from replication.raft.core import HardState, RaftConfig
from replication.raft.memlog import MemLog
from replication.raft.node import RaftNode
from replication.raft.ready import Outbox, apply_ready, release


class Ports:
    """apply_ready's ports for one member: its MemLog (fsynced at once when asked), its hard
    state and commit index in the Group, the Group's FIFO queue as the network."""

    def __init__(self, g, i):
        self.g, self.i = g, i
        self.outbox = Outbox()

    def save_hard_state(self, hs):
        self.g.hard[self.i] = hs

    def reset_to(self, first):
        log = self.g.logs[self.i]
        log.reset_to(first[0])
        log.append([first])

    def truncate_from(self, index):
        assert index > self.g.commit[self.i], f"{self.i} cut committed entries"
        self.g.logs[self.i].truncate_from(index)

    def append(self, entries):
        self.g.logs[self.i].append(entries)

    def unsynced_mark(self):
        log = self.g.logs[self.i]
        return log.last_index() if log.last_index() > log.flushed else None

    def request_flush(self):
        log = self.g.logs[self.i]
        log.flush()
        release(self, log.flushed)

    def send(self, to, msg):
        g = self.g
        g.sent.append((self.i, to, msg))
        if frozenset((self.i, to)) not in g.cut and not (g.drop_if and g.drop_if(self.i, to, msg)):
            g.queue.append((self.i, to, msg))

    def role_changed(self, is_leader):
        pass

    def committed(self, index):
        self.g.commit[self.i] = index

    def append_noop(self):
        if not self.g.hold_noop:
            self.g.append(self.i, b"noop")


class Group:
    def __init__(self, n=3, seed=0, **cfg):
        self.ids = tuple("abcde"[:n])
        self.cfg = {"election_ticks": 10, "heartbeat_ticks": 3, "push_timeout_ticks": 20, **cfg}
        self.logs = {i: MemLog() for i in self.ids}
        self.hard = {i: HardState() for i in self.ids}
        self.commit = {i: -1 for i in self.ids}
        self.rng = random.Random(seed)
        self.nodes = {i: self._new(i) for i in self.ids}
        self.ports = {i: Ports(self, i) for i in self.ids}
        self.queue: list[tuple[str, str, object]] = []
        self.cut: set[frozenset] = set()
        self.down: set[str] = set()
        self.sent: list[tuple[str, str, object]] = []
        self.drop_if = None  # (src, to, msg) -> True: that message is lost
        self.hold_noop = False  # a new leader's no-op is held back (tests of the commit rule)

    def _new(self, i):
        return RaftNode(RaftConfig(i, self.ids, **self.cfg), self.logs[i], self.hard[i], self.commit[i],
                        random.Random(self.rng.getrandbits(32)))

    def process(self, i):
        apply_ready(self.nodes[i], self.ports[i])

    def append(self, i, data):
        node, log = self.nodes[i], self.logs[i]
        log.append([(log.last_index() + 1, node.term, data)])
        log.flush()
        node.local_appended(log.last_index())
        self.process(i)

    def deliver(self, limit=100_000):
        while self.queue and limit:
            src, to, msg = self.queue.pop(0)
            limit -= 1
            if to in self.down or frozenset((src, to)) in self.cut:
                continue
            self.nodes[to].step(msg)
            self.process(to)

    def tick(self, n=1):
        for _ in range(n):
            for i in self.ids:
                if i not in self.down:
                    self.nodes[i].tick()
                    self.process(i)
            self.deliver()

    def leader(self):
        leaders = [i for i in self.ids if i not in self.down and self.nodes[i].is_leader]
        assert len(leaders) <= 1, leaders
        return leaders[0] if leaders else None

    def until_leader(self, ticks=200):
        for _ in range(ticks):
            if self.leader():
                return self.leader()
            self.tick()
        raise AssertionError("no leader")

    def isolate(self, i):
        self.cut |= {frozenset((i, j)) for j in self.ids if j != i}

    def heal(self):
        self.cut.clear()

    def crash(self, i):
        self.down.add(i)
        self.logs[i].crash()

    def restart(self, i):
        self.down.discard(i)
        self.ports[i] = Ports(self, i)
        self.nodes[i] = self._new(i)

    def datas(self, i):
        return [e[2] for e in self.logs[i].items]

    def pushes_to(self, i, kind):
        return [msg for _, to, msg in self.sent if to == i and isinstance(msg, m.Push) and msg.type == kind]
