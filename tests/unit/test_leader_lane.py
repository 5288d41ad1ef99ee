"""The raft leader lanes (replication/raft/leader_lane.py: the pushes of what a send wrote,
and the followers' answers read in C) against the core's path they shortcut: two leaders,
one with the lanes and one without, take the same seeded stream of sends (one entry or
several), followers' answers (read on each follower's connection, whole or cut anywhere; in
order, out of order, lost, INCONSISTENT_STATE, probes answered), ticks (heartbeats, push
timeouts, the byte quota's window, pauses past the election timeout), new connections and
leadership transfers, and must send the same bytes to each follower, hold the same Progress
and core state, answer the same sends and leave byte-identical logs. A seed that fails is
printed; TIDELOG_LANE_SEEDS=N runs more of them."""

from __future__ import annotations

import dataclasses
import random
from unittest import mock
import time
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.protocol import frame as fr
from broker.protocol.codes import Req
from broker.store.commitlog import NewEntry
from replication.raft import leader_lane, wire
from replication.raft import messages as m
from replication.raft import driver as driver_mod
from tests.unit.lane_helpers import SMALL_INDEX, Conn, driver, read, run_seeds
from replication.raft.node import Role

PEERS = [{"id": f"n{k}", "address": f"127.0.0.{k + 1}:10911"} for k in range(3)]
TOPICS = ["orders", "τopic-ü", "t" * 127]
NOW_S = 1_700_000_000.0


def config(home: Path, use_lane: bool, seed: int | None) -> BrokerConfig:
    """Windows, timeouts and throttles the lane must step aside for (seed None: the defaults)."""
    if seed is None:
        return BrokerConfig(data_dir=home, mode="raft", node_id="n0", peers=PEERS, insecure=True,
                            listen="127.0.0.1:10911", raft_leader_lane=use_lane, **SMALL_INDEX)
    rng = random.Random(f"config {seed}")
    return BrokerConfig(data_dir=home, mode="raft", node_id="n0", peers=PEERS, insecure=True,
                        listen="127.0.0.1:10911", segment_bytes=64 * 1024, message_body_bytes_max=8 * 1024,
                        raft_leader_lane=use_lane, raft_push_timeout_ms=rng.choice([50, 80, 1000]),
                        raft_tick_ms=rng.choice([10, 50]), raft_heartbeat_interval_ms=30, raft_election_timeout_ms=300,
                        leadership_transfer_timeout_ms=60,
                        raft_max_pending_entries=rng.choice([3, 8, 1000]),
                        raft_peer_push_throttle_point_bytes=rng.choice([8192, 300 << 20, 300 << 20]),
                        raft_peer_push_quota_bytes_per_s=rng.choice([4096, 20 << 20]), **SMALL_INDEX)


class Link:
    """A PeerLink that keeps what it is given: each message's bytes, and how it came (an
    APPEND through send_append, which skips a push still queued; the rest send_encoded)."""

    def __init__(self):
        self.out: list[tuple[str, bytes]] = []

    def send(self, msg) -> None:  # (PeerLink.send)
        if isinstance(msg, m.Push) and msg.type == m.PushType.APPEND and msg.entries:
            self.send_append(wire.encode_parts(msg), msg.term, msg.entries[-1][0])
        else:
            self.send_encoded(wire.encode_parts(msg))

    def send_append(self, parts: tuple, term: int, last: int) -> None:
        raw = b"".join(parts)
        push = wire.decode(raw)  # what the follower reads, and what the link was told of it
        assert push.type == m.PushType.APPEND and push.term == term and push.entries[-1][0] == last
        self.out.append(("append", raw))

    def send_encoded(self, parts: tuple) -> None:
        self.out.append(("encoded", b"".join(parts)))

    def flush(self) -> None:
        pass


def frame(msg) -> bytes:
    return fr.encode(Req.RAFT, 0, wire.encode(msg), None, fr.FLAG_ONEWAY)


class Clock:
    """The driver's loop as its clock sees it (RaftDriver._clock runs the ticks due before
    each input, as when its tick loop slept through them)."""

    def __init__(self):
        self.t = 0.0

    def time(self) -> float:
        return self.t


class Leader:
    def __init__(self, home: Path, use_lane: bool, seed: int | None):
        cfg = config(home, use_lane, seed)
        self.store, self.d = driver(home, cfg)
        if seed is not None:  # (a push's entry bound, which BrokerConfig does not set)
            made, bound = self.d.raft_config, random.Random(f"bound {seed}").choice([2, 512])
            self.d.raft_config = lambda: dataclasses.replace(made(), push_batch_entries_max=bound)
        self.d._new_core()
        self.d.node.rng = random.Random(0)  # (both leaders' election timeouts alike)
        self.links = {pid: Link() for pid in self.d.links}
        self.d.links = self.links
        self.conns = {pid: Conn(pid) for pid in self.links}  # each follower's, to this leader
        self.outcomes: list = []
        self.d._loop = self.clock = Clock()
        self.d._next_tick_at = self.d._period

    def tick(self) -> None:
        self.later(1, run=True)

    def later(self, ticks: int, run: bool) -> None:
        """`ticks` pass; `run`: the tick loop wakes for them now, else the next input runs them."""
        for _ in range(ticks):
            self.clock.t += self.d._period
        if run:
            self.d._clock()

    def feed(self, msg) -> None:
        self.read(msg.src, frame(msg))

    def read(self, src: str, data: bytes) -> None:
        """As the broker reads `data` on `src`'s connection (the answers' lane first)."""
        read(self.d, self.conns[src], data)

    def send(self, items: list) -> None:
        k = len(self.outcomes)
        self.outcomes.append(None)

        def done(code, err, k=k):
            self.outcomes[k] = int(code)
            if k % 7 == 3:  # (a send's callback that fails: contained where the answer is read)
                raise RuntimeError("a send's callback failed (test)")
        try:
            self.d.leader_append(items, done)
        except Exception as e:  # (NotLeader: as the broker answers it)
            self.outcomes[k] = type(e).__name__

    def state(self) -> tuple:
        n = self.d.node
        lead = n.leading
        progress = None if lead is None else (lead.local_index, lead.transfer, dict(lead.progress))
        return (n.term, n.role, n.leader_id, n.commit_index, n._seq, progress, self.store.commitlog.tail,
                self.store.committed_index, list(self.outcomes), {p: list(k.out) for p, k in self.links.items()})

    def files(self) -> dict:
        home = Path(self.d.ports.data_dir)
        return {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*"))
                if p.is_file() and p.parent.name == "commitlog"}


class Followers:
    """Answers what the leader sent, from the plain leader's links (both leaders sent the same)."""

    def __init__(self, leader: Leader, rng: random.Random):
        self.leader = leader
        self.rng = rng
        self.read = {p: 0 for p in leader.links}  # messages of each link looked at
        self.unanswered: dict[str, list] = {p: [] for p in leader.links}

    def collect(self) -> None:
        for p, link in self.leader.links.items():
            for _, raw in link.out[self.read[p]:]:
                msg = wire.decode(raw)
                if isinstance(msg, m.Push):
                    self.unanswered[p].append(msg)
            self.read[p] = len(link.out)

    def answers(self) -> list:
        """Answers of one follower to what waits for it: all of it in order, or one (mostly
        the oldest); some lost."""
        self.collect()
        rng = self.rng
        peers = [p for p, q in self.unanswered.items() if q]
        if not peers:
            return []
        p = rng.choice(peers)
        q = self.unanswered[p]
        if rng.random() < 0.7:
            out = [self._answer(p, push) for push in q]
            q.clear()
        else:
            out = [self._answer(p, q.pop(0 if rng.random() < 0.8 else rng.randrange(len(q))))]
        return [a for a in out if a is not None]

    def all_held(self) -> list:
        """Every follower's answers to all that waits for it: each push held."""
        self.collect()
        out = [self._answer(p, push, perfect=True) for p, q in self.unanswered.items() for push in q]
        for q in self.unanswered.values():
            q.clear()
        return out

    def _answer(self, p: str, push: m.Push, perfect: bool = False) -> m.PushResponse | None:
        rng = self.rng
        if not perfect and rng.random() < 0.04:
            return None  # lost
        if push.type == m.PushType.APPEND:
            last = push.entries[-1][0]
            code = m.PushCode.SUCCESS if perfect or rng.random() < 0.97 else m.PushCode.INCONSISTENT_STATE
            # (begin and end: what the follower holds; only `index` counts for the leader)
            return m.PushResponse(p, push.term, push.type, code, last, rng.randint(0, 3),
                                  last + rng.choice([0, 0, 2]), push.seq)
        if push.type in m.PROBES:  # the follower holds what it is asked about
            index = push.entries[0][0]
            return m.PushResponse(p, push.term, push.type, m.PushCode.SUCCESS, index, 0, index, push.seq)
        return m.PushResponse(p, push.term, push.type, m.PushCode.SUCCESS, -1, 0, -1, push.seq)


def elect(a: Leader, b: Leader) -> None:
    """Both campaign now and win: each vote request is granted by the peer it went to."""
    granted = set()
    for _ in range(50):
        if a.d.node.role is Role.LEADER:
            break
        for x in (a, b):
            n = x.d.node
            if n.role is not Role.CANDIDATE:  # (a follower, or a pre-candidate whose requests were dropped)
                n.election_timeout = min(n.election_timeout, n.election_elapsed + 1)
            x.tick()
        for peer, link in a.links.items():
            reqs = [msg for msg in (wire.decode(raw) for _, raw in link.out) if isinstance(msg, m.VoteRequest)]
            if reqs and (peer, reqs[-1].term, reqs[-1].pre_vote) not in granted:
                req = reqs[-1]
                granted.add((peer, req.term, req.pre_vote))
                for x in (a, b):
                    x.feed(m.VoteResponse(peer, req.term, True, req.pre_vote))
    assert a.d.node.role is b.d.node.role is Role.LEADER


def items(rng: random.Random) -> list:
    return [NewEntry(rng.choice(TOPICS[:2]) if rng.random() < 0.7 else TOPICS[2], rng.randrange(4), 0,
                     int(NOW_S * 1000), rng.randbytes(16), b"" if rng.random() < 0.6 else b"KEYS\x01k",
                     rng.randbytes(rng.choice([0, 10, 1000, 3000])))
            for _ in range(rng.choice([1, 1, 1, 2, 4]))]


def scenario(tmp_path: Path, seed: int) -> tuple[int, int, int]:
    rng = random.Random(seed)
    a, b = Leader(tmp_path / "plain", False, seed), Leader(tmp_path / "lane", True, seed)
    if rng.random() < 0.5:  # with TLS: each connection's member is the one its certificate proves
        with mock.patch.object(BrokerConfig, "secure", new=property(lambda self: True)):
            for x in (a, b):
                for pid, conn in x.conns.items():
                    conn.member = pid
            return run(a, b, rng, seed)
    return run(a, b, rng, seed)


def run(a: Leader, b: Leader, rng: random.Random, seed: int) -> tuple[int, int, int]:
    elect(a, b)
    fol = Followers(a, rng)
    sends = 0
    for step in range(rng.randint(60, 160)):
        r = rng.random()
        if r < 0.4:
            batch = items(rng)
            sends += 1
            a.send(batch)
            b.send(batch)
        elif r < 0.78:
            for _ in range(rng.choice([1, 2, 2])):  # (mostly both followers: W=1's steady state)
                answers = fol.answers()
                if rng.random() < 0.1:  # now and then another's on the same connection (a
                    answers += fol.answers()  # relay, an impostor without TLS): one sender a take
                if not answers:
                    continue
                data = b"".join(map(frame, answers))  # (read at once or cut anywhere, on one of
                # the senders' connections: with TLS the others' are impostors there)
                src = rng.choice([x.src for x in answers])
                cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.choice([0, 0, 1, 3]))))
                for lo, hi in zip([0] + cuts, cuts + [len(data)]):
                    a.read(src, data[lo:hi])
                    b.read(src, data[lo:hi])
        elif r < 0.93:  # time passes: mostly a few ticks, now and then a pause past the quota's
            # window (a second) and the election timeout (the leader steps down, and is elected
            # again); the tick loop runs them now, or the next input does
            k = rng.randint(1, 4) if rng.random() < 0.9 else rng.randint(20, 120)
            run_now = rng.random() < 0.5
            a.later(k, run_now)
            b.later(k, run_now)
            if a.d.node.role is not Role.LEADER or rng.random() < 0.1:
                for x in (a, b):
                    x.d._clock()
                    x.d.ports.faults.set((), False)
                if a.d.node.role is not Role.LEADER:
                    elect(a, b)
        elif r < 0.95:  # a drill's faults: a follower cut off, the node isolated from clients
            drop = rng.sample(sorted(a.links), rng.choice([0, 0, 1]))
            isolated = rng.random() < 0.3
            for x in (a, b):
                x.d.ports.faults.set(drop, isolated)
        elif r < 0.993:
            peer = rng.choice(list(a.links))
            a.d._link_up(peer)
            b.d._link_up(peer)
        elif a.d.node.role is Role.LEADER:
            target = rng.choice(list(a.links))
            assert a.d.transfer_leader(target) == b.d.transfer_leader(target)
        assert b.state() == a.state(), f"seed {seed} step {step}: the leaders differ"
    assert b.files() == a.files(), f"seed {seed}: the logs differ"
    assert b.d.leader_lane is not None, f"seed {seed}: the lane failed and turned itself off"
    return b.d.leader_lane_pushes, sends, b.d.leader_lane_answers


@pytest.fixture
def fixed_entropy(monkeypatch):
    """The same store times and no-op msg ids on both leaders (the entries' bytes compare)."""
    monkeypatch.setattr(time, "time", lambda: NOW_S)
    monkeypatch.setattr(driver_mod.os, "urandom", lambda n: b"\x07" * n)


def test_the_lane_pushes_what_the_core_pushes(tmp_path, fixed_entropy):
    pushed, total, answered = run_seeds(scenario, tmp_path, "leader lane", 40)
    print(f"the leader lane pushed {pushed} of {total} sends and took {answered} answers")
    assert pushed >= total // 5, f"the lane pushed {pushed} of {total} sends: it is hardly exercised"
    if leader_lane.leader_answers is not None:  # the answers' half is C only (TIDELOG_NO_C_EXT: the core reads them)
        assert answered >= total // 2, f"the lane took {answered} answers to {total} sends: it is hardly exercised"
    else:
        assert answered == 0


@pytest.mark.parametrize("where", ["encoding", "the second push", "reading answers"])
def test_a_bug_in_the_lane_turns_it_off_and_the_core_pushes_the_rest(tmp_path, fixed_entropy, monkeypatch, where):
    """A failure inside a leader lane (a bug): both are off for good, and the core's path
    pushes what the lane did not, or reads the answers -- the same bytes and state as a leader
    that never had the lanes."""
    a, b = Leader(tmp_path / "plain", False, None), Leader(tmp_path / "lane", True, None)
    elect(a, b)
    fol = Followers(a, random.Random(3))
    for _ in range(3):  # probes, the no-op, their answers: the steady state
        for answer in fol.all_held():
            a.feed(answer)
            b.feed(answer)
    batch = items(random.Random(5))
    a.send(batch)
    b.send(batch)
    assert b.d.leader_lane_pushes == 1 and b.state() == a.state()
    for answer in fol.all_held():
        a.feed(answer)
        b.feed(answer)
    if where == "reading answers":
        if leader_lane.leader_answers is None:
            pytest.skip("the answers' half of the lane is C only (not built, or TIDELOG_NO_C_EXT)")

        def broken(*args):
            raise RuntimeError("a bug")
        monkeypatch.setattr(leader_lane, "leader_answers", broken)
    elif where == "encoding":
        class Broken:
            def pack(self, *args):
                raise RuntimeError("a bug")
        monkeypatch.setattr(leader_lane.wire, "PUSH", Broken())
    else:
        real, calls = b.d._send_append, []

        def second_fails(*args):
            calls.append(args)
            if len(calls) == 2:
                raise RuntimeError("a bug")
            real(*args)
        b.d._send_append = second_fails
    batch = items(random.Random(6))
    a.send(batch)
    b.send(batch)
    assert b.state() == a.state(), "the core did not push what the lane did not"
    for answer in fol.all_held():  # and the group goes on: the send commits on both
        a.feed(answer)
        b.feed(answer)
    assert b.d.leader_lane is None, "the lane is still on after failing"
    assert b.state() == a.state() and b.outcomes == a.outcomes == [0, 0]
    assert all(c.decoder.lane is None for c in b.conns.values())
