"""The raft follower lane (replication/raft/lane.py, broker/store/_zonewalk.c follower_pushes)
against the Python path it shortcuts: two followers, one reading with the lane and one
without, are fed the same seeded byte streams -- steady appends, and mixed in: resent and
reordered pushes, gaps, new terms, another sender, probes, commit-only pushes, damaged bytes
anywhere, frames cut across reads at random points, segment rolls -- and must answer the
same, hold the same state and leave byte-identical segments and position files. A seed that
fails is printed; TIDELOG_LANE_SEEDS=N runs more of them."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from broker.protocol import frame as fr
from broker.protocol.codes import Req
from broker.store import codec_batch
from broker.store.message_store import MessageStore
from replication.raft import lane, wire
from replication.raft import messages as m
from tests.unit.lane_helpers import SMALL_INDEX, Conn, driver, read, run_seeds
from replication.raft.storelog import StoreLog

pytestmark = pytest.mark.skipif(lane.follower_pushes is None, reason="the C fast paths are not built")

SEGMENT = 64 * 1024 + 48 * 1024  # small: a run rolls segments several times
PEERS = [{"id": f"n{k}", "address": f"127.0.0.{k + 1}:10911"} for k in range(3)]
TOPICS = ["orders", "τopic-ü", "t" * 127]


def config(home: Path, node: str, use_lane: bool) -> BrokerConfig:
    return BrokerConfig(data_dir=home, mode="raft", node_id=node, peers=PEERS, insecure=True,
                        listen=next(p["address"] for p in PEERS if p["id"] == node),
                        segment_bytes=SEGMENT, message_body_bytes_max=8 * 1024, batch_bytes_max=16 * 1024,
                        frame_bytes_max=1 << 20, pull_bytes_max=256 * 1024, raft_follower_lane=use_lane,
                        **SMALL_INDEX)


class Follower:
    def __init__(self, home: Path, use_lane: bool):
        cfg = config(home, "n1", use_lane)
        self.store, self.d = driver(home, cfg)
        self.d._new_core()
        self.sent: list = []
        self.d._send = self._send
        self.d._send_encoded = self._send_encoded
        self.d.after_input = lambda: None
        self.conn = Conn("n0")  # (the driver puts the lane on it at its first RAFT frame)

    def _send(self, to: str, msg) -> None:
        """RaftDriver._send: what would go to `to`."""
        self.sent.append((to, msg))

    def _send_encoded(self, to: str, parts: tuple) -> None:
        """RaftDriver._send_encoded: an answer the lane encoded itself, as the peer decodes
        it (and it must be the bytes the encoder makes of that)."""
        msg = wire.decode(b"".join(parts))
        assert b"".join(parts) == wire.encode(msg), (msg, parts)
        self.sent.append((to, msg))

    def feed(self, data: bytes) -> None:
        read(self.d, self.conn, data)

    def state(self) -> tuple:
        n, cl = self.d.node, self.store.commitlog
        fol = n.following
        return (n.term, n.role, n.leader_id, n.voted_for, n.commit_index, n.election_elapsed, n.heard_leader_tick,
                fol.verified, fol.last_seq, fol.probe_seq, sorted(fol.buffer), cl.tail, self.store.committed_index)

    def files(self) -> tuple:
        """The log's bytes: the position records and every file under the store's commitlog
        directory (segments are written at once; position records may wait in memory)."""
        cl = self.store.commitlog
        pos = cl.positions
        records = pos.read(pos.first, pos.count - pos.first) if pos.count > pos.first else b""
        home = Path(self.d.ports.data_dir)
        segments = {str(p.relative_to(home)): p.read_bytes() for p in sorted(home.rglob("*"))
                    if p.is_file() and p.parent.name == "commitlog"}
        assert segments or cl.tail.offset == 0
        return pos.first, pos.count, bytes(records), segments


class Leader:
    """Makes the entries a leader would (a CommitLog of the same segment size) and the pushes."""

    def __init__(self, home: Path, rng: random.Random):
        self.store = MessageStore(home, config(home, "n0", False).store_options())
        self.store.open()
        self.log = StoreLog(self.store.commitlog)
        self.rng = rng
        self.term = 1
        self.seq = 0
        self.qoff = 0

    def grow(self, k: int) -> None:
        rng = self.rng
        zones, bases = [], []
        for _ in range(k):
            n = rng.randint(1, 3)
            recs = [codec_batch.BatchRecord(0, 1_700_000_000_000, rng.randbytes(16),
                                            b"" if rng.random() < 0.5 else b"KEYS\x01k%d" % rng.randint(0, 9),
                                            rng.randbytes(rng.choice([0, 1, 100, 1000, 3000])))
                    for _ in range(n)]
            zones.append(codec_batch.encode_zone(rng.choice(TOPICS), rng.randint(0, 7), recs))
            bases.append(self.qoff)
            self.qoff += n
        self.store.commitlog.append_batches_as_leader(zones, bases, self.term, 1_700_000_000_000)

    def last(self) -> int:
        return self.log.last_index()

    def frame(self, kind: m.PushType, lo: int = 0, n: int = 0, commit: int | None = None,
              term: int | None = None, src: str = "n0", seq: int | None = None) -> bytes:
        entries = tuple((i, t, bytes(d)) for i, t, d in self.log.entries(lo, n, 1 << 20)) if n else ()
        if kind in m.PROBES and not entries:
            entries = ((lo, self.log.term_at(lo) or 0, b""),)
        if seq is None:
            self.seq += 1
            seq = self.seq
        push = m.Push(src, self.term if term is None else term, kind,
                      self.last() if commit is None else commit, entries, seq)
        return fr.encode(Req.RAFT, 0, wire.encode(push), None, fr.FLAG_ONEWAY)


ENTRY_AT = fr.HEADER_SIZE + 12 + 21 + 20  # the first entry of a push from "n0" (wire.py)


def refit(frame: bytes, rng: random.Random) -> bytes:
    """`frame` with one byte of its first entry changed and both CRCs recomputed: only the
    entry's framing, its topic's UTF-8, its index, term, offset or size can refuse it."""
    raw = bytearray(frame)
    e = memoryview(raw)[ENTRY_AT:]
    k = rng.choice([rng.randrange(len(e)), rng.randrange(12, codec_batch.BATCH_TOPIC_AT + 4)])
    e[k] ^= 1 << rng.randrange(8) if rng.random() < 0.7 else 0xFF
    if not 8 <= k < 12:
        n = len(raw) - ENTRY_AT
        struct.pack_into(">I", e, 52, zlib.crc32(e[56:n]))
        struct.pack_into(">I", e, 8, zlib.crc32(e[12:56]))
    return bytes(raw)


def scenario(tmp_path: Path, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    leader = Leader(tmp_path / "leader", rng)
    a, b = Follower(tmp_path / "plain", False), Follower(tmp_path / "lane", True)
    sent_upto = -1  # the follower was sent entries up to here (steady state)
    frames = 0
    for step in range(rng.randint(20, 60)):
        batch = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            r = rng.random()
            if r < 0.55 or leader.last() <= sent_upto + 1:  # steady: the next entries
                if leader.last() <= sent_upto + 4:
                    leader.grow(rng.randint(1, 6))
                n = rng.randint(1, min(4, leader.last() - sent_upto))
                batch.append(leader.frame(m.PushType.APPEND, sent_upto + 1, n,
                                          commit=rng.randint(-1, sent_upto + n + 3)))
                sent_upto += n
            elif r < 0.62 and sent_upto >= 0:  # a resent (old) push
                lo = rng.randint(0, sent_upto)
                batch.append(leader.frame(m.PushType.APPEND, lo, rng.randint(1, sent_upto - lo + 1),
                                          seq=rng.randint(0, leader.seq)))
            elif r < 0.68:  # ahead of a gap (later filled by the steady pushes)
                lo = sent_upto + 2
                if leader.last() < lo:
                    leader.grow(3)
                batch.append(leader.frame(m.PushType.APPEND, lo, 1))
            elif r < 0.74:
                batch.append(leader.frame(m.PushType.COMMIT, commit=rng.randint(-1, sent_upto)))
            elif r < 0.78 and sent_upto >= 0:
                batch.append(leader.frame(m.PushType.COMPARE, rng.randint(0, sent_upto)))
            elif r < 0.82:  # a stranger's push (the same term)
                batch.append(leader.frame(m.PushType.APPEND, sent_upto + 1, 1, src="n2"))
            elif r < 0.85:  # a new term from the same leader (its entries keep their term)
                leader.term += 1
                batch.append(leader.frame(m.PushType.COMMIT))
            elif r < 0.88:  # an older term
                batch.append(leader.frame(m.PushType.APPEND, sent_upto + 1, 1, term=max(0, leader.term - 1)))
            elif r < 0.91:  # a damaged entry whose CRCs were made to fit (a leader that lies)
                if leader.last() <= sent_upto + 1:
                    leader.grow(2)
                batch.append(refit(leader.frame(m.PushType.APPEND, sent_upto + 1, 1), rng))
            elif r < 0.96:  # a damaged push: one byte anywhere in it
                if leader.last() <= sent_upto + 1:
                    leader.grow(2)
                raw = bytearray(leader.frame(m.PushType.APPEND, sent_upto + 1, 1))
                k = rng.randrange(fr.HEADER_SIZE, len(raw))  # (a damaged frame header ends the stream)
                raw[k] ^= 1 << rng.randrange(8)
                batch.append(bytes(raw))
            else:  # the steady push again (a duplicate)
                n = min(2, sent_upto + 1)
                if n:
                    batch.append(leader.frame(m.PushType.APPEND, sent_upto + 1 - n, n))
        data = b"".join(batch)
        frames += len(batch)
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.choice([0, 0, 1, 3]))))
        for lo, hi in zip([0] + cuts, cuts + [len(data)]):
            a.feed(data[lo:hi])
            b.feed(data[lo:hi])
            assert b.sent == a.sent, f"seed {seed} step {step}: different answers"
            assert b.state() == a.state(), f"seed {seed} step {step}: different state"
        node = a.d.node
        end = node.log.last_index()
        if node.following.verified < end and end >= 0 and rng.random() < 0.8:
            # what the leader does on INCONSISTENT_STATE: compare at the follower's end
            probe = leader.frame(m.PushType.COMPARE, end)
            a.feed(probe)
            b.feed(probe)
            assert b.sent == a.sent and b.state() == a.state(), f"seed {seed} step {step}: after a probe"
        if rng.random() < 0.15:  # the follower fell behind (a probe would follow): resend from its end
            sent_upto = a.d.node.log.last_index()
        for f in (a, b):  # time passes (what the lane must note of a push: when it was heard)
            f.d.node.now += 1
    assert b.files() == a.files(), f"seed {seed}: the files differ"
    assert b.d.lane_on, f"seed {seed}: the lane failed and turned itself off"
    return b.d.lane_pushes, frames


def test_the_lane_answers_and_writes_what_the_python_path_does(tmp_path):
    taken, total = run_seeds(scenario, tmp_path, "raft lane", 60)
    print(f"the lane took {taken} of {total} pushes")
    assert taken >= total // 8, f"the lane took {taken} of {total} pushes: it is hardly exercised"


def test_a_write_that_fails_in_the_lane_answers_nothing_and_restarts_the_core(tmp_path):
    """A full disk under the lane: as on the Python path, the push is not answered, the core
    restarts from the disk (it must be compared again before it takes appends), and once the
    disk has room the follower catches up through the probe and the lane again."""
    from broker.store.files import DiskFull
    leader = Leader(tmp_path / "leader", random.Random(7))
    a, b = Follower(tmp_path / "plain", False), Follower(tmp_path / "lane", True)
    leader.grow(8)
    both = lambda data: (a.feed(data), b.feed(data))  # noqa: E731
    both(leader.frame(m.PushType.APPEND, 0, 2))
    both(leader.frame(m.PushType.APPEND, 2, 2))
    assert b.d.lane_pushes == 1 and b.sent == a.sent and b.state() == a.state()
    cores = (a.d.node, b.d.node)
    for f in (a, b):  # the next segment write fails once, as on a full disk
        cl = f.store.commitlog
        real = cl._write_placed

        def full_once(*args, cl=cl, real=real):
            cl._write_placed = real
            raise DiskFull(28, "No space left on device (test)")
        cl._write_placed = full_once
    answered = len(a.sent)
    both(leader.frame(m.PushType.APPEND, 4, 2))
    assert len(a.sent) == len(b.sent) == answered, "a push whose write failed was answered"
    assert a.d.node is not cores[0] and b.d.node is not cores[1], "the core did not restart"
    assert b.state() == a.state() and b.store.commitlog.tail.next_index == 4
    assert b.conn.decoder.lane is None and b.d.lane_on  # (off for the connection, not for good)
    both(leader.frame(m.PushType.APPEND, 4, 2))  # unverified after the restart: compare first
    assert a.sent[-1][1].code == b.sent[-1][1].code == m.PushCode.INCONSISTENT_STATE
    both(leader.frame(m.PushType.COMPARE, 3))  # (through Python, whose handler puts the lane back)
    both(leader.frame(m.PushType.APPEND, 4, 2))
    both(leader.frame(m.PushType.APPEND, 6, 2))
    assert b.sent == a.sent and b.state() == a.state() and b.files() == a.files()
    assert b.store.commitlog.tail.next_index == 8 and b.d.lane_pushes == 3 and b.d.lane_on


def test_the_driver_puts_the_lane_on_a_connection_that_carries_raft_frames(tmp_path):
    for use_lane in (True, False):
        f = Follower(tmp_path / str(use_lane), use_lane)
        conn = Conn("n0")
        frame = fr.Frame(1, fr.FLAG_ONEWAY, Req.RAFT, 0, {}, memoryview(wire.encode(
            m.Push("n0", 1, m.PushType.COMMIT, -1, (), 1))))
        f.d.handlers()[Req.RAFT](conn, frame)
        assert isinstance(conn.decoder.lane, lane.FollowerLane) == use_lane
        assert f.d.node.leader_id == "n0"  # (and the frame itself went the Python way)


def test_a_bug_in_the_lane_turns_it_off_and_the_python_path_reads_the_frames(tmp_path, monkeypatch):
    leader = Leader(tmp_path / "leader", random.Random(3))
    a, b = Follower(tmp_path / "plain", False), Follower(tmp_path / "lane", True)
    leader.grow(4)
    first = leader.frame(m.PushType.APPEND, 0, 1)
    for f in (a, b):
        f.feed(first)

    def broken(*args):
        raise RuntimeError("a bug")
    monkeypatch.setattr(lane, "follower_pushes", broken)
    data = leader.frame(m.PushType.APPEND, 1, 2)
    a.feed(data)
    b.feed(data)
    assert b.sent == a.sent and b.state() == a.state() and b.d.lane_pushes == 0
    assert not b.d.lane_on and b.conn.decoder.lane is None
    conn = Conn("n0")  # and no connection gets it again
    b.d.handlers()[Req.RAFT](conn, fr.Frame(1, fr.FLAG_ONEWAY, Req.RAFT, 0, {}, memoryview(data)[fr.HEADER_SIZE:]))
    assert conn.decoder.lane is None
