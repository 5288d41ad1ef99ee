"""The producer coalesces concurrent sends into batch frames (broker/client/accumulator.py,
broker/client/producer.py).

Three tiers: the pure accumulator (sticky queues, cuts, order; a Hypothesis property over
random hand-over sequences, replayable from the blob it prints), a real in-process broker
(frames counted, every message read back where its result says), and a small asyncio server
playing a broker that loses a batch after reading it (never stored=False for that)."""

from __future__ import annotations

import asyncio
import gc
import logging
import random

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import Consumer, Producer, SendError
from broker.client.accumulator import Accumulator, check_limits, limits_named
from broker.client.producer import ProducerBufferFull
from broker.client.connection import ClientConnection
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol import send as sp
from broker.protocol import topics as tp
from broker.protocol.codes import BadRequest, Code, Req
from broker.store import codec

from ..helpers import BrokerThread

# --- the accumulator: pure -----------------------------------------------------------------


def drain_queues(acc: Accumulator, queues: int = 4, live=None):
    return acc.drain(lambda topic: queues, live)


def test_a_sticky_batch_stays_on_one_queue_and_the_next_moves_on():
    acc = Accumulator(1 << 20, 1024, random.Random(7))
    for i in range(10):
        acc.add("t", None, 10, i)
    [b] = drain_queues(acc)
    assert b.items == list(range(10)) and b.sticky and b.size == 100
    for i in range(3):
        acc.add("t", None, 10, i)
    [b2] = drain_queues(acc)
    assert b2.queue_id == (b.queue_id + 1) % 4  # the next pass: the next queue
    assert acc.count == 0 and acc.bytes == 0


def test_cut_at_the_message_count_each_cut_on_the_next_queue():
    acc = Accumulator(1 << 20, 3, random.Random(1))
    for i in range(7):
        acc.add("t", None, 1, i)
    bs = drain_queues(acc, queues=8)
    assert [b.items for b in bs] == [[0, 1, 2], [3, 4, 5], [6]]
    q0 = bs[0].queue_id
    assert [b.queue_id for b in bs] == [q0, (q0 + 1) % 8, (q0 + 2) % 8]


def test_cut_at_bytes_and_a_message_bigger_than_a_batch_goes_alone():
    acc = Accumulator(100, 1024, random.Random(1))
    for i, size in enumerate([40, 40, 40, 150, 10]):
        acc.add("t", 0, size, i)
    bs = drain_queues(acc)
    assert [b.items for b in bs] == [[0, 1], [2], [3], [4]]
    assert [b.size for b in bs] == [80, 40, 150, 10]
    assert all(b.queue_id == 0 and not b.sticky for b in bs)


def test_explicit_queues_batch_per_queue_in_hand_over_order():
    acc = Accumulator(1 << 20, 1024, random.Random(3))
    for i, q in enumerate([2, 5, None, 2, None, 5, 2]):
        acc.add("t", q, 1, i)
    acc.add("u", 2, 1, "u0")  # same queue number, another topic: another batch
    bs = drain_queues(acc)
    by = {(b.topic, b.queue_id, b.sticky): b.items for b in bs}
    assert by[("t", 2, False)] == [0, 3, 6]
    assert by[("t", 5, False)] == [1, 5]
    assert [b.items for b in bs if b.sticky] == [[2, 4]]
    assert by[("u", 2, False)] == ["u0"]
    assert acc.topics() == []


def test_left_out_items_and_an_unknown_queue_count():
    acc = Accumulator(1 << 20, 1024, random.Random(3))
    for i in range(6):
        acc.add("t", None, 1, i)
    [b] = acc.drain(lambda topic: None, lambda item: item % 2 == 0)
    assert b.items == [0, 2, 4] and b.queue_id is None  # no route yet: the sender picks


def test_limits_no_batch_could_respect_are_refused():
    for bad in [(0, 10), (10, 0), (10, 65536), (1.5, 10)]:
        with pytest.raises(ValueError, match="batch_"):
            check_limits(*bad)
    with pytest.raises(ValueError, match="batch_messages_max"):
        Producer(["127.0.0.1:1"], batch_messages_max=70000)
    with pytest.raises(ValueError, match="linger_ms"):
        Producer(["127.0.0.1:1"], linger_ms=-1)


hand_over = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]),
                               st.one_of(st.none(), st.integers(0, 3)),
                               st.integers(0, 300)), max_size=200)


@settings(max_examples=300, deadline=None, print_blob=True)
@given(msgs=hand_over, bytes_max=st.integers(1, 1000), count_max=st.integers(1, 20),
       queues=st.integers(1, 5), seed=st.integers(0, 2**32 - 1), passes=st.integers(1, 3))
def test_every_message_in_exactly_one_batch_within_limits_in_order(msgs, bytes_max, count_max,
                                                                   queues, seed, passes):
    # the accumulator's Random is drawn too, so the printed blob replays the whole run
    acc = Accumulator(bytes_max, count_max, random.Random(seed))
    batches = []
    cut = len(msgs) // passes or 1
    for start in range(0, len(msgs), cut):  # several flushes: the sticky queue moves on
        for i in range(start, min(start + cut, len(msgs))):
            topic, q, size = msgs[i]
            acc.add(topic, q, size, i)
        batches += drain_queues(acc, queues)
    seen = [i for b in batches for i in b.items]
    assert sorted(seen) == list(range(len(msgs)))  # each exactly once
    per_queue: dict = {}
    last_sticky: dict = {}
    for b in batches:
        assert b.items and len(b.items) <= count_max
        assert b.size == sum(msgs[i][2] for i in b.items)
        assert b.size <= bytes_max or len(b.items) == 1
        assert all(msgs[i][0] == b.topic for i in b.items)
        if b.sticky:
            assert all(msgs[i][1] is None for i in b.items) and 0 <= b.queue_id < queues
            if b.topic in last_sticky:  # the next batch of a topic moves to the next queue
                assert b.queue_id == (last_sticky[b.topic] + 1) % queues
            last_sticky[b.topic] = b.queue_id
        else:
            assert all(msgs[i][1] == b.queue_id for i in b.items)
        per_queue.setdefault((b.topic, b.queue_id, b.sticky), []).extend(b.items)
    for key, items in per_queue.items():
        assert items == sorted(items), key  # hand-over order within a queue


# --- a real broker -------------------------------------------------------------------------


@pytest.fixture
def frames(monkeypatch):
    """How many requests of each code the client wrote."""
    counts: dict[int, int] = {}
    request = ClientConnection.request

    def counting(self, code, *a, **kw):
        counts[code] = counts.get(code, 0) + 1
        return request(self, code, *a, **kw)
    monkeypatch.setattr(ClientConnection, "request", counting)
    return counts


def read_back(address: str, topic: str, n: int) -> dict:
    """msg_id -> (queue_id, queue_offset, body) of every message of `topic`."""
    with Consumer([address], "check", topic) as c:
        got: dict = {}
        for _ in range(100):
            for m in c.poll(timeout_ms=300, max_messages=1000):
                got[m.msg_id] = (m.queue_id, m.queue_offset, m.body)
            if len(got) >= n:
                break
    return got


def test_256_sends_in_one_pass_travel_in_one_batch_and_read_back(tmp_path, frames):
    with BrokerThread(tmp_path / "b") as b:
        async def run():
            async with Producer([b.address]) as p:
                await p.send_async("t", b"warm-up")  # route and connection: the fast path
                frames.clear()
                futs = [p.send_nowait("t", b"m%d" % i, key=f"k{i}") for i in range(256)]
                more = [p.send_nowait("t", b"q%d" % i, queue_id=1) for i in range(10)]
                return await asyncio.gather(*futs), await asyncio.gather(*more)
        results, pinned = uvloop.run(run())
        assert frames == {Req.SEND_ZONE: 2}, frames  # one sticky batch, one for queue 1
        assert b.broker.stats_sent == 1 + 256 + 10
        q = results[0].queue_id
        assert [r.queue_id for r in results] == [q] * 256  # sticky: one queue for the batch
        assert [r.queue_offset for r in results] == list(range(results[0].queue_offset,
                                                                results[0].queue_offset + 256))
        assert len({r.msg_id for r in results}) == 256 and not any(r.possible_duplicate for r in results)
        assert {r.queue_id for r in pinned} == {1}
        got = read_back(b.address, "t", 267)
        for i, r in enumerate(results):
            assert got[r.msg_id] == (r.queue_id, r.queue_offset, b"m%d" % i)
        for i, r in enumerate(pinned):
            assert got[r.msg_id] == (1, r.queue_offset, b"q%d" % i)
        per_queue: dict = {}
        for body_of, rs in ((b"m%d", results), (b"q%d", pinned)):
            for i, r in enumerate(rs):
                per_queue.setdefault(r.queue_id, []).append((r.queue_offset, body_of % i))
        for q, sent in per_queue.items():  # send order = stored order, queue by queue
            stored = sorted((off, body) for qid, off, body in got.values() if qid == q)
            assert [body for _, body in sorted(sent)] == [body for _, body in stored
                                                         if body in {x for _, x in sent}]


def test_gathered_send_async_coalesces_and_a_lone_message_is_a_send(tmp_path, frames):
    with BrokerThread(tmp_path / "b") as b:
        async def run():
            async with Producer([b.address]) as p:
                first = await asyncio.gather(*(p.send_async("g", b"%d" % i) for i in range(100)))
                lone = await p.send_async("g", b"alone")
                return first, lone
        first, lone = uvloop.run(run())
        # the first pass waited for the route: still one batch
        assert frames.get(Req.SEND_ZONE) == 1 and frames.get(Req.SEND) == 1, frames
        assert len({r.queue_id for r in first}) == 1 and lone.msg_id not in {r.msg_id for r in first}
        assert [r.queue_offset for r in first] == list(range(first[0].queue_offset,
                                                              first[0].queue_offset + 100))


def test_a_topic_that_does_not_exist_fails_every_message_not_stored(tmp_path):
    with BrokerThread(tmp_path / "b", auto_create_topic_enable=False) as b:
        async def run():
            async with Producer([b.address]) as p:
                futs = [p.send_nowait("nope", b"%d" % i) for i in range(20)]
                return await asyncio.gather(*futs, return_exceptions=True)
        errs = uvloop.run(run())
        assert all(isinstance(e, SendError) for e in errs), errs
        assert {(e.code, e.stored) for e in errs} == {(Code.TOPIC_NOT_EXIST, False)}
        assert len({id(e) for e in errs}) == 20  # one exception per future


def test_a_message_over_the_broker_limit_fails_alone(tmp_path, frames):
    # the client does not know message_body_bytes_max (256 KiB here): the batch is refused as
    # MESSAGE_TOO_LARGE, stored nothing, and goes again in halves: [0 1 2] [3 4 5] -> [3] [4 5]
    with BrokerThread(tmp_path / "b") as b:
        async def run():
            async with Producer([b.address]) as p:
                await p.send_async("big", b"warm-up")
                futs = [p.send_nowait("big", b"x" * (300 << 10) if i == 3 else b"%d" % i) for i in range(6)]
                return await asyncio.gather(*futs, return_exceptions=True)
        out = uvloop.run(run())
        big = out.pop(3)
        assert isinstance(big, SendError) and big.code == Code.MESSAGE_TOO_LARGE and big.stored is False
        assert len({r.queue_id for r in out}) == 1, out  # on the batch's queue, in order
        assert [r.queue_offset for r in out] == list(range(out[0].queue_offset, out[0].queue_offset + 5))
        assert b.broker.stats_sent == 1 + 5
        assert frames[Req.SEND_ZONE] == 4 and frames[Req.SEND] == 1 + 1, frames


def test_bad_input_is_refused_at_call_time(tmp_path):
    async def run():
        p = Producer(["127.0.0.1:1"])
        with pytest.raises(ValueError, match="topic"):
            p.send_nowait("x" * 300, b"b")
        with pytest.raises(TypeError, match="body"):
            p.send_nowait("t", "not bytes")
        with pytest.raises(ValueError, match="flags"):
            p.send_nowait("t", b"b", flags=-1)
        with pytest.raises(ValueError, match="topic"):
            await p.send_async("", b"b")
        await p.aclose()
    uvloop.run(run())
    with pytest.raises(RuntimeError):  # no running loop
        Producer(["127.0.0.1:1"]).send_nowait("t", b"b")


def test_cancelled_before_the_batch_is_left_out_after_it_does_not_break_others(tmp_path, frames):
    with BrokerThread(tmp_path / "b") as b:
        async def run():
            async with Producer([b.address]) as p:
                await p.send_async("c", b"warm-up", queue_id=0)
                futs = [p.send_nowait("c", b"%d" % i, queue_id=0) for i in range(5)]
                futs[2].cancel()  # before the flush: never sent
                await asyncio.sleep(0)  # the flush: the batch is written
                futs[3].cancel()  # sent: the message stays, the others get their results
                rest = await asyncio.gather(*futs, return_exceptions=True)
                return rest
        rest = uvloop.run(run())
        assert [type(r).__name__ for r in rest] == ["SendResult", "SendResult", "CancelledError",
                                                     "CancelledError", "SendResult"]
        assert [rest[i].queue_offset for i in (0, 1, 4)] == [1, 2, 4]
        assert b.broker.stats_sent == 1 + 4
        got = read_back(b.address, "c", 5)
        assert sorted(body for _, _, body in got.values()) == [b"0", b"1", b"3", b"4", b"warm-up"]


def test_linger_coalesces_passes_and_close_flushes_or_fails_what_waits(tmp_path, frames):
    with BrokerThread(tmp_path / "b") as b:
        async def run():
            p = Producer([b.address], linger_ms=50)
            await p.send_async("l", b"warm-up")
            frames.clear()
            futs = []
            for i in range(5):  # five passes within the linger: one batch
                futs.append(p.send_nowait("l", b"%d" % i))
                await asyncio.sleep(0)
            waiting = [p.send_nowait("l", b"at close %d" % i) for i in range(3)]
            await p.aclose()  # sends what waits, returns once every outcome is in
            assert all(f.done() for f in futs + waiting)
            return [f.result() for f in futs + waiting]

        rs = uvloop.run(run())
        assert frames == {Req.SEND_ZONE: 1}, frames
        assert [r.queue_offset for r in rs] == list(range(rs[0].queue_offset, rs[0].queue_offset + 8))

        async def closed_before_the_flush():
            p = Producer([b.address], linger_ms=10_000)
            futs = [p.send_nowait("l", b"never") for _ in range(3)]
            p.close()  # the blocking close: this loop's session closes, nothing was sent
            return await asyncio.gather(*futs, return_exceptions=True)
        errs = uvloop.run(closed_before_the_flush())
        assert all(isinstance(e, SendError) and e.stored is False and e.code == Code.NOT_CONNECTED
                   for e in errs), errs


def test_blocking_api_still_works(tmp_path):
    with BrokerThread(tmp_path / "b") as b, Producer([b.address]) as p:
        r = p.send("bl", b"one", queue_id=0)
        rs = p.send_batch("bl", [b"two", b"three"], queue_id=0)
        assert [r.queue_offset] + [x.queue_offset for x in rs] == [0, 1, 2]


# --- a broker that loses a batch after reading it ------------------------------------------


def as_batch(code, body) -> sp.SendBatchRequest:
    """A SEND_BATCH or SEND_ZONE request body (bytes, or the parts a client writes) decoded."""
    body = b"".join(body) if type(body) is tuple else body
    if code == Req.SEND_BATCH:
        return sp.decode_batch_request(body)
    z = sp.decode_zone_request(body)
    return sp.SendBatchRequest(z.topic, z.queue_id, [sp.BatchMessage(e.flags, e.born_ts_ms, e.msg_id, e.properties,
                                                                     e.body) for e in z.entries()])


class BatchBroker(asyncio.Protocol):
    """Answers GET_ROUTE; a SEND_BATCH or SEND_ZONE goes to `on_batch(self, frame, request)`. `seen` keeps
    every batch's msg_ids."""

    seen: list = []
    conns: list = []  # every connection the producer opened

    def __init__(self, on_batch):
        self.on_batch = on_batch

    def connection_made(self, t):
        self.t, self.dec = t, fr.FrameDecoder()
        self.gone = asyncio.get_running_loop().create_future()
        BatchBroker.conns.append(self)

    def connection_lost(self, exc):
        self.gone.set_result(None)

    def data_received(self, data):
        for f in self.dec.feed(data):
            if f.code == Req.GET_ROUTE:
                body = jsonbody.encode(tp.Route("t", 1, 1, 6, True))
                self.t.write(fr.encode_response(Code.SUCCESS, f.corr_id, body))
            elif f.code in (Req.SEND_BATCH, Req.SEND_ZONE):
                r = as_batch(f.code, f.body)
                BatchBroker.seen.append([m.msg_id.hex() for m in r.messages])
                self.on_batch(self, f, r)
            elif f.code == Req.SEND:  # a lone message: stored at queue offset 7
                body = sp.encode_response(sp.SendResponse(0, 7, 107, 8, 1))
                self.t.write(fr.encode_response(Code.SUCCESS, f.corr_id, body))

    def answer(self, f, r, code=Code.SUCCESS, offset=0):
        n = len(r.messages)
        body = sp.encode_batch_response(sp.SendBatchResponse(r.queue_id, offset, offset, 1,
                                                              list(range(100, 100 + n))))
        self.t.write(fr.encode_response(code, f.corr_id, body, {"error": "scripted"} if code else None))


def through(on_batch, n: int = 8, **kw) -> list:
    """n messages handed over in one pass to a BatchBroker; their outcomes."""
    BatchBroker.seen = []

    async def run():
        server = await asyncio.get_running_loop().create_server(lambda: BatchBroker(on_batch), "127.0.0.1", 0)
        p = Producer([f"127.0.0.1:{server.sockets[0].getsockname()[1]}"],
                     **{"send_timeout_ms": 500, **kw})
        try:
            futs = [p.send_nowait("t", b"%d" % i) for i in range(n)]
            return await asyncio.gather(*futs, return_exceptions=True)
        finally:
            await p.aclose()
            server.close()
    return uvloop.run(run())


def test_a_batch_lost_after_writing_is_retried_with_the_same_ids():
    def lose_first(broker, f, r):
        if len(BatchBroker.seen) == 1:
            broker.t.close()  # read (maybe stored), then the connection dies
        else:
            broker.answer(f, r, offset=40)
    out = through(lose_first)
    assert len(BatchBroker.seen) == 2 and BatchBroker.seen[0] == BatchBroker.seen[1]
    assert [r.msg_id for r in out] == BatchBroker.seen[0]
    assert all(r.possible_duplicate and r.attempts == 2 for r in out)
    assert [r.queue_offset for r in out] == list(range(40, 48))
    assert [r.phys_offset for r in out] == list(range(100, 108))


def test_a_batch_lost_after_writing_without_retry_is_unknown_never_not_stored():
    out = through(lambda broker, f, r: broker.t.close(), retry_when_outcome_unknown=False)
    assert all(isinstance(e, SendError) and e.stored is None for e in out), out
    assert len({e.code for e in out}) == 1 and len(BatchBroker.seen) == 1

    def silent(broker, f, r):  # read, never answered: a timeout each time
        pass
    out = through(silent, retry_times_when_send_failed=1)
    assert all(isinstance(e, SendError) and e.stored is None and e.attempts == 2 for e in out), out


def test_failure_codes_reach_every_message_of_the_batch():
    out = through(lambda broker, f, r: broker.answer(f, r, Code.SYSTEM_ERROR),
                  retry_times_when_send_failed=0)
    assert all(isinstance(e, SendError) and e.code == Code.SYSTEM_ERROR and e.stored is None for e in out)

    out = through(lambda broker, f, r: broker.answer(f, r, Code.FLUSH_SLAVE_TIMEOUT, offset=7))
    assert all(e.code == Code.FLUSH_SLAVE_TIMEOUT and e.stored is True for e in out)
    assert [e.result.queue_offset for e in out] == list(range(7, 15))  # each knows where it is
    assert len(BatchBroker.seen) == 1  # stored: never retried

    out = through(lambda broker, f, r: broker.answer(f, r, Code.NO_PERMISSION))
    assert all(e.code == Code.NO_PERMISSION and e.stored is False for e in out)


def test_a_full_batch_does_not_wait_for_the_linger(tmp_path, frames):
    with BrokerThread(tmp_path / "b") as b:
        async def run():
            async with Producer([b.address], linger_ms=60_000, batch_messages_max=4) as p:
                futs = [p.send_nowait("f", b"%d" % i, queue_id=0) for i in range(8)]
                return await asyncio.wait_for(asyncio.gather(*futs), 5)
        rs = uvloop.run(run())
        assert [r.queue_offset for r in rs] == list(range(8))
        assert frames[Req.SEND_ZONE] == 2, frames


# --- review fixes: close from another thread, the buffer bound, split resends, bad answers ---


async def batch_broker(on_batch):
    BatchBroker.seen, BatchBroker.conns = [], []
    server = await asyncio.get_running_loop().create_server(lambda: BatchBroker(on_batch), "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


def test_close_from_another_thread_fails_what_waits_and_resends_nothing():
    # close() cannot wait on a user's loop: in-flight batches fail (stored unknown: written),
    # waiting ones fail (stored=False); no reconnect, no resend, no connection left open
    async def run():
        read = asyncio.Event()
        server, address = await batch_broker(lambda broker, f, r: read.set())  # never answered
        p = Producer([address], linger_ms=100, send_timeout_ms=500)
        inflight = [p.send_nowait("t", b"%d" % i) for i in range(8)]
        await read.wait()
        waiting = [p.send_nowait("t", b"w%d" % i) for i in range(3)]  # lingering: not sent yet
        await asyncio.get_running_loop().run_in_executor(None, p.close)
        out = await asyncio.wait_for(asyncio.gather(*inflight, *waiting, return_exceptions=True), 5)
        await asyncio.wait_for(asyncio.gather(*(c.gone for c in BatchBroker.conns)), 5)
        server.close()
        return out
    out = uvloop.run(run())
    assert all(isinstance(e, SendError) and e.code == Code.NOT_CONNECTED for e in out), out
    assert [e.stored for e in out] == [None] * 8 + [False] * 3
    assert len(BatchBroker.seen) == 1 and len(BatchBroker.conns) == 1  # nothing resent


def test_buffer_bytes_max_refuses_send_nowait_and_send_async_waits_for_room():
    held: list = []

    def hold(broker, f, r):
        held.append((broker, f, r))

    async def refused():  # nothing is answered: send_nowait refuses, send_async gives up
        server, address = await batch_broker(hold)
        p = Producer([address], buffer_bytes_max=1000, send_timeout_ms=300)
        futs = [p.send_nowait("t", b"x" * 100) for _ in range(7)]  # 7 * 134 bytes
        with pytest.raises(ProducerBufferFull) as now:
            p.send_nowait("t", b"x" * 100)
        with pytest.raises(ProducerBufferFull) as waited:
            await p.send_async("t", b"x" * 100)  # no room within send_timeout_ms
        for c in BatchBroker.conns:
            c.t.close()
        await asyncio.gather(*futs, return_exceptions=True)
        await p.aclose()
        server.close()
        return now.value, waited.value
    now, waited = uvloop.run(refused())
    for e in (now, waited):
        assert isinstance(e, SendError) and e.stored is False and e.code == Code.SYSTEM_BUSY
    assert "buffer_bytes_max=1000" in str(now) and "send_timeout_ms" in str(waited)

    async def room():  # the answer frees room: the waiting send_async goes on
        read = asyncio.Event()
        held.clear()
        server, address = await batch_broker(lambda *a: (hold(*a), read.set()))
        p = Producer([address], buffer_bytes_max=1000)
        futs = [p.send_nowait("t", b"x" * 100) for _ in range(7)]
        late = asyncio.ensure_future(p.send_async("t", b"y" * 100))
        await read.wait()
        assert not late.done()
        broker, f, r = held.pop()
        broker.answer(f, r)
        out = await asyncio.wait_for(asyncio.gather(*futs, late), 5)
        await p.aclose()
        server.close()
        return out
    out = uvloop.run(room())
    assert [r.queue_offset for r in out] == list(range(8))  # the late one alone: a SEND
    assert len(BatchBroker.seen) == 1


@pytest.fixture
def batch_sizes(monkeypatch):
    """(code, messages) of every request the client wrote, in order."""
    log: list = []
    request = ClientConnection.request

    def logging_request(self, code, body, *a, **kw):
        n = len(as_batch(code, body).messages) if code in (Req.SEND_BATCH, Req.SEND_ZONE) else 1
        log.append((code, n))
        return request(self, code, body, *a, **kw)
    monkeypatch.setattr(ClientConnection, "request", logging_request)
    return log


def test_a_broker_with_smaller_batch_limits_gets_halves_in_order_and_then_smaller_batches(tmp_path,
                                                                                          batch_sizes):
    assert limits_named("batch of 9 messages exceeds batch_messages_max=8") == {"batch_messages_max": 8}
    with BrokerThread(tmp_path / "b", batch_messages_max=8) as b:
        async def run():
            async with Producer([b.address]) as p:
                await p.send_async("s", b"warm-up")
                batch_sizes.clear()
                first = await asyncio.gather(*(p.send_nowait("s", b"%d" % i) for i in range(32)))
                mark = len(batch_sizes)
                futs = []
                for k in range(1, 8):  # seven more passes, each flushed on its own
                    futs += [p.send_nowait("s", b"%d" % i) for i in range(32 * k, 32 * k + 32)]
                    await asyncio.sleep(0)
                return first + list(await asyncio.gather(*futs)), mark
        results, mark = uvloop.run(run())
        B = Req.SEND_ZONE  # refused 32, its halves in order (16 refused: 8, 8; 16: 8, 8)
        assert batch_sizes[:mark] == [(B, 32), (B, 16), (B, 8), (B, 8), (B, 16), (B, 8), (B, 8)]
        assert batch_sizes[mark:] and all(n <= 8 for _, n in batch_sizes[mark:]), batch_sizes[mark:]
        assert len(results) == 256 and b.broker.stats_sent == 1 + 256
        per_queue: dict = {}
        for r in results:  # in send order
            per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
        for q, offsets in per_queue.items():
            assert offsets == sorted(offsets), q


def test_a_stored_answer_that_does_not_decode_is_stored_true_and_nothing_escapes(caplog):
    caplog.set_level(logging.ERROR)

    def garbage(broker, f, r):
        broker.t.write(fr.encode_response(Code.FLUSH_SLAVE_TIMEOUT, f.corr_id, b"garbage", {"error": "x"}))
    out = through(garbage)
    gc.collect()  # an unretrieved task exception is logged when the task is collected
    assert all(isinstance(e, SendError) and e.stored is True and e.code == Code.FLUSH_SLAVE_TIMEOUT
               and e.result is None and "does not decode" in str(e) for e in out), out
    assert len(BatchBroker.seen) == 1  # stored: never retried
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()], caplog.text


def test_a_broker_without_send_zone_gets_send_batch_and_nothing_is_lost():
    """A broker from before SEND_ZONE answers REQUEST_CODE_NOT_SUPPORTED (nothing stored):
    the batch goes again as SEND_BATCH, with the same ids, counted as one attempt."""
    codes = []

    def old_broker(broker, f, r):
        codes.append(f.code)
        if f.code == Req.SEND_ZONE:
            broker.t.write(fr.encode_response(Code.REQUEST_CODE_NOT_SUPPORTED, f.corr_id, b"",
                                              {"error": "request code 12 is not supported"}))
        else:
            broker.answer(f, r, offset=3)
    out = through(old_broker)
    assert codes == [Req.SEND_ZONE, Req.SEND_BATCH], codes
    assert BatchBroker.seen[0] == BatchBroker.seen[1] == [r.msg_id for r in out]
    assert [r.queue_offset for r in out] == list(range(3, 11))
    assert all(r.attempts == 1 and not r.possible_duplicate for r in out), out


def test_a_send_zone_is_the_records_the_store_keeps():
    """The zone a producer writes is byte for byte the producer's part of a TLE2 entry: its
    CRC is the batch's records_crc, and the broker's decoder refuses any damage."""
    from broker.client.outcomes import Handed
    from broker.store import codec_batch
    items = [Handed(None, bytes([i]) * 16, i, codec.message_properties(keys=[f"k{i}"]) if i % 2 else b"",
                    b"body %d" % i) for i in range(5)]
    crc, zone = sp.encode_zone_request(b"orders", 3, 1234, items)
    z = sp.decode_zone_request(crc + zone)
    assert (z.topic, z.queue_id, z.count, z.records_crc) == ("orders", 3, 5, int.from_bytes(crc, "big"))
    raw = codec_batch.encode_head(9, 2, 0, 0, 5, z.records_crc, len(zone)) + zone
    assert [(m.msg_id, m.flags, m.born_ts_ms, m.properties, m.body) for m in codec.iter_messages(raw)] == \
        [(h.msg_id, h.flags, 1234, h.props, h.body) for h in items]
    for bad in (crc + zone[:-1], bytes(4) + zone, crc + zone + b"x", crc[:3]):
        with pytest.raises(BadRequest):
            sp.decode_zone_request(bad)


@settings(max_examples=25, deadline=None)
@given(script=st.lists(st.sampled_from(["ok", "busy", "lost", "too_large", "stored_not_confirmed"]),
                       min_size=1, max_size=6),
       cancel=st.sets(st.integers(0, 11), max_size=4))
def test_every_byte_handed_over_is_released_whatever_the_outcome(script, cancel):
    """buffer_bytes_max counts per batch: after every outcome (answers, retries, refusals,
    halves, lost connections, cancelled sends) nothing is left counted, so the bound never
    shrinks for good."""
    answers = iter(script)

    def scripted(broker, f, r):
        what = next(answers, "ok")
        if what == "lost":
            broker.t.close()
        elif what == "busy":
            broker.answer(f, r, Code.SYSTEM_BUSY)
        elif what == "too_large":
            broker.t.write(fr.encode_response(Code.MESSAGE_TOO_LARGE, f.corr_id, b"",
                                              {"error": "exceeds batch_messages_max=3"}))
        elif what == "stored_not_confirmed":
            broker.answer(f, r, Code.FLUSH_SLAVE_TIMEOUT)
        else:
            broker.answer(f, r)

    async def run():
        BatchBroker.seen = []
        server, address = await batch_broker(scripted)
        p = Producer([address], send_timeout_ms=500, buffer_bytes_max=1 << 20)
        futs = [p.send_nowait("t", b"x" * 10) for _ in range(12)]
        for i in cancel:
            futs[i].cancel()
        await asyncio.gather(*futs, return_exceptions=True)
        s = p._session()
        while s.inflight:  # the tasks settle after their futures
            await asyncio.wait(list(s.inflight))
        left = s.buffered
        await p.aclose()
        server.close()
        return left
    assert uvloop.run(run()) == 0
