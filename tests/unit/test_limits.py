"""Connection bounds without sockets (issue 14): the read buffer follows the bytes that arrive,
not a header's claim; a frame's deadline runs from its first byte; connections are counted
in all and per source address (broker/limits.py, FrameReader in broker/protocol/frame.py)."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace

from broker.config import from_dict
from broker.connection import CHEAP_CODES, COSTLY_FRAME_COST
from broker.limits import ConnectionLimits
from broker.protocol import frame as fr
from broker.protocol.codes import Req

from ..helpers import raw_header

MiB = 1 << 20


def feed(r: fr.FrameReader, data: bytes, now: float = 0.0) -> list:
    got = []
    while data:
        view = r.get_buffer(-1)
        n = min(len(view), len(data))
        view[:n] = data[:n]
        r.fill(n, now)
        got += [(f.corr_id, bytes(f.body)) for f in r.frames()]
        data = data[n:]
    return got


def test_a_16_mib_header_allocates_nothing_for_the_bytes_it_claims():
    tracemalloc.start()
    r = fr.FrameReader(16 * MiB + 100)  # capacity 1 MiB
    for chunk in (raw_header(16 * MiB), b"x"):
        view = r.get_buffer(-1)
        view[:len(chunk)] = chunk
        assert r.buffer_updated(len(chunk)) == []
    r.get_buffer(-1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak <= MiB + (64 << 10), peak  # was: 17 MiB (the header's claim, allocated at once)


def test_a_connection_buffer_starts_small_and_a_header_does_not_grow_it():
    tracemalloc.start()
    r = fr.FrameReader(16 * MiB + 100, initial=fr.READ_MIN)
    feed(r, raw_header(16 * MiB) + b"x")
    feed(r, b"y" * 1000)
    r.get_buffer(-1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r.allocated == fr.READ_MIN and peak <= 2 * fr.READ_MIN, (r.allocated, peak)


def test_the_buffer_grows_by_doubling_as_a_big_frame_arrives():
    body = bytes(range(256)) * (4 * MiB // 256)
    wire = fr.encode(Req.SEND, 9, body)
    r = fr.FrameReader(8 * MiB, initial=fr.READ_MIN)
    sizes, pos = [], 0
    while pos < len(wire):
        view = r.get_buffer(-1)
        n = min(len(view), 40_000, len(wire) - pos)
        view[:n] = wire[pos:pos + n]
        r.fill(n)
        pos += n
        got = r.frames()
        sizes.append(r.allocated)
        # never ahead of the bytes by more than 2x (or of the 1 MiB a busy connection reads into)
        assert r.allocated <= max(2 * pos + fr.READ_MIN, MiB)
    assert [(f.corr_id, bytes(f.body)) for f in got] == [(9, body)]
    assert len(r.get_buffer(-1)) <= MiB  # back to at most capacity once the big frame is gone
    assert len(set(sizes)) >= 5 and max(sizes) < 8 * MiB  # it went there in steps


def test_frames_stop_at_the_budget_and_the_rest_stays_in_the_buffer():
    pulls = b"".join(fr.encode(Req.PULL, i, b"p" * 28) for i in range(10))
    sends = b"".join(fr.encode(Req.SEND, 100 + i, b"s") for i in range(10))
    r = fr.FrameReader(initial=fr.READ_MIN, cheap_codes=CHEAP_CODES, costly=COSTLY_FRAME_COST)
    view = r.get_buffer(-1)
    view[:len(pulls + sends)] = pulls + sends
    r.fill(len(pulls + sends), 5.0)
    chunks = []
    while True:
        chunks.append([f.corr_id for f in r.frames(4 * COSTLY_FRAME_COST)])  # 4 PULLs a time
        if not r.more:
            break
        assert r.partial_since is None  # whole frames waiting are not a late frame
    assert chunks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, *range(100, 110)]]
    assert r.partial_since is None and r.allocated == fr.READ_MIN


def test_the_frame_deadline_runs_from_the_first_byte_not_the_last():
    r = fr.FrameReader(initial=fr.READ_MIN)
    whole = fr.encode(Req.SEND, 1, b"b" * 100)
    assert feed(r, whole[:10], now=1.0) == [] and r.partial_since == 1.0
    assert feed(r, whole[10:20], now=2.0) == [] and r.partial_since == 1.0  # trickling: no reset
    r.postpone(0.5)  # the broker paused reading for 0.5 s: not the peer's lateness
    assert r.partial_since == 1.5
    # the frame completes and the next begins in the same read: its clock starts there
    assert feed(r, whole[20:] + whole[:3], now=3.0) == [(1, b"b" * 100)] and r.partial_since == 3.0
    assert feed(r, whole[3:], now=4.0) == [(1, b"b" * 100)] and r.partial_since is None


class conn:
    def __init__(self, source: str, port: int):
        self.source, self.peer = source, f"{source}:{port}"


def test_limits_count_in_all_and_per_source():
    lim = ConnectionLimits(from_dict({"data_dir": "/tmp/x", "connections_max": 5,
                                      "connections_per_source_max": 3}))
    a = [conn("10.0.0.1", p) for p in range(4)]
    assert [lim.admit(c) for c in a[:3]] == [None] * 3
    why = lim.admit(a[3])
    assert "connections_per_source_max=3" in why and "10.0.0.1" in why
    b = [conn("10.0.0.2", p) for p in range(3)]
    assert lim.admit(b[0]) is None and lim.admit(b[1]) is None
    assert "connections_max=5" in lim.admit(b[2])
    lim.release(a[3])  # refused: never counted, so not released either
    assert lim.open == 5 and lim.per_source == {"10.0.0.1": 3, "10.0.0.2": 2}
    lim.release(a[0])
    lim.release(a[0])  # twice: counted once
    assert lim.admit(b[2]) is None
    assert lim.per_source == {"10.0.0.1": 2, "10.0.0.2": 3} and lim.refused_total == 2
    for c in a[1:3] + b:
        lim.release(c)
    assert lim.open == 0 and lim.per_source == {}


def test_refusals_are_logged_once_a_second_not_once_each(caplog):
    lim = ConnectionLimits(from_dict({"data_dir": "/tmp/x", "connections_per_source_max": 1}))
    assert lim.admit(conn("10.0.0.9", 1)) is None
    with caplog.at_level("WARNING", logger="broker.limits"):
        for p in range(2, 1002):
            assert lim.admit(conn("10.0.0.9", p)) is not None
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "refused 1 connection" in lines[0]
        lim.sweep([], now=1e9)  # the sweep reports what the rate limit held back
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2 and "refused 999 connection(s)" in lines[1] and "(1000 in all)" in lines[1]


class FakeConn:
    def __init__(self, secure=False, partial_since=None, paused=False, principal=None):
        self.decoder = SimpleNamespace(partial_since=partial_since)
        self.reading_paused = paused
        self.principal, self.member = principal, None
        self.opened_at = self.last_active = 100.0
        self.inflight = 0
        self.closed = False
        self.peer = "10.0.0.1:5"
        self.broker = SimpleNamespace(config=SimpleNamespace(secure=secure))
        self.how = None
        self.log = SimpleNamespace(info=lambda *a: None)

    def abort(self):
        self.closed, self.how = True, "abort"

    def close(self):
        self.closed, self.how = True, "close"


def test_sweep_closes_late_frames_late_auth_and_idle_connections():
    lim = ConnectionLimits(from_dict({"data_dir": "/tmp/x", "frame_deadline_ms": 2000,
                                      "auth_deadline_ms": 3000, "connection_idle_timeout_ms": 60_000}))
    late = FakeConn(partial_since=100.0, principal="u")
    in_time = FakeConn(partial_since=100.5, principal="u")
    paused = FakeConn(partial_since=100.0, paused=True, principal="u")  # we stopped reading it
    no_auth_secure = FakeConn(secure=True)
    no_auth_insecure = FakeConn(secure=False)
    authed = FakeConn(secure=True, principal="u")
    conns = [late, in_time, paused, no_auth_secure, no_auth_insecure, authed]
    lim.sweep(conns, now=102.2)
    assert [c.how for c in conns] == ["abort", None, None, None, None, None]
    lim.sweep(conns, now=103.5)
    assert [c.how for c in conns] == ["abort", "abort", None, "abort", None, None]
    lim.sweep(conns, now=170.0)
    assert [c.how for c in conns] == ["abort", "abort", "close", "abort", "close", "close"]


def test_reads_that_fill_the_buffer_grow_it_to_capacity():
    r = fr.FrameReader(initial=fr.READ_MIN, capacity=MiB)
    wire = fr.encode(Req.SEND, 1, b"z" * 1000) * 8000
    sizes, pos, n_frames = [], 0, 0
    for _ in range(8):  # a busy peer: every read fills what it is offered
        view = r.get_buffer(-1)
        sizes.append(len(view))
        view[:] = wire[pos:pos + len(view)]
        pos += len(view)
        r.fill(len(view))
        n_frames += len(r.frames())
    assert r.error is None and n_frames == pos // 1016
    assert sizes[0] == fr.READ_MIN and max(sizes) > MiB // 2 and r.allocated == MiB
