"""A real broker on loopback: send, pull, offsets, topics, lookups, long polling, groups."""

import asyncio
import time

import pytest
import uvloop

from broker.client import Admin, BrokerError, Consumer, Producer, SendError
from broker.protocol import frame as fr
from broker.protocol import pull as pp
from broker.protocol.codes import Code, Req

from ..helpers import BrokerThread, RawClient


@pytest.fixture
def broker(tmp_path):
    with BrokerThread(tmp_path / "b") as b:
        yield b


def test_send_pull_commit_and_resume(broker):
    with Producer([broker.address]) as p:
        sent = [p.send("orders", b"m%03d" % i, key=f"k{i}", tags="t") for i in range(60)]
    assert {r.queue_id for r in sent} == {0, 1, 2, 3}  # round-robin over the 4 default queues
    with Consumer([broker.address], "g1", "orders", auto_commit=False) as c:
        got = []
        while len(got) < 30:
            got += c.poll(timeout_ms=2000, max_messages=30 - len(got))
        c.commit()
    with Consumer([broker.address], "g1", "orders") as c:  # resumes after the committed 30
        rest = []
        deadline = time.monotonic() + 10
        while len(rest) < 30 and time.monotonic() < deadline:
            rest += c.poll(timeout_ms=500)
    ids = [m.msg_id for m in got + rest]
    assert sorted(ids) == sorted(r.msg_id for r in sent) and len(set(ids)) == 60
    by_queue = {}
    for m in got + rest:
        by_queue.setdefault(m.queue_id, []).append(m.queue_offset)
    assert all(offs == list(range(len(offs))) for offs in by_queue.values())
    m = next(m for m in got + rest if m.msg_id == sent[5].msg_id)
    assert (m.body, m.keys, m.tags) == (b"m005", ["k5"], "t")


def test_topic_admin_and_errors(tmp_path):
    with BrokerThread(tmp_path / "b", auto_create_topic_enable=False) as b, Admin([b.address]) as a:
        info = a.create_topic("pay", 3)
        assert (info.write_queues, info.read_queues) == (3, 3)
        with pytest.raises(BrokerError, match="TOPIC_EXISTS"):
            a.create_topic("pay", 3)
        with pytest.raises(BrokerError, match="BAD_REQUEST.*bad topic name"):
            a.create_topic("no spaces allowed", 3)
        a.create_topic("ro", 1, perm=4)
        assert a.list_topics() == ["pay", "ro"]
        with pytest.raises(BrokerError, match="TOPIC_NOT_EXIST"):
            a.describe_topic("nope")
        with Producer([b.address], retry_times_when_send_failed=0) as p:
            with pytest.raises(SendError, match="TOPIC_NOT_EXIST") as e:
                p.send("nope", b"x")
            assert e.value.stored is False
            with pytest.raises(SendError, match="NO_PERMISSION"):
                p.send("ro", b"x")
            with pytest.raises(SendError, match="QUEUE_ID_INVALID"):
                p.send("pay", b"x", queue_id=7)
            with pytest.raises(SendError, match="MESSAGE_TOO_LARGE"):
                p.send("pay", b"x" * (256 << 10 + 1))
            r = p.send("pay", b"fine")  # the connection is still good
        assert a.describe_topic("pay").queues[r.queue_id].max_offset == 1
        st = a.status()
        assert st["store"]["next_index"] == 1 and st["role"] == "standalone"


def test_batch_send_is_one_write(broker):
    with Producer([broker.address]) as p:
        rs = p.send_batch("b", [b"a", b"b", b"c"], queue_id=1, keys=["x", "y", "z"])
    assert [r.queue_offset for r in rs] == [0, 1, 2]
    # one record batch: one entry, its index and offset shared by its messages
    assert [r.index for r in rs] == [rs[0].index] * 3 and len({r.phys_offset for r in rs}) == 1
    with Admin([broker.address]) as a:
        assert [m.body for m in a.query_by_key("b", "y")] == [b"b"]


def test_lookup_by_key_and_id(broker):
    with Producer([broker.address]) as p:
        r = p.send("orders", b"payload", key=["order-9", "customer-3"])
        p.send("orders", b"other", key="order-10")
    with Admin([broker.address]) as a:
        assert [m.body for m in a.query_by_key("orders", "customer-3")] == [b"payload"]
        assert a.query_by_key("orders", "order-404") == []
        m = a.query_by_id(r.msg_id)
        assert m.body == b"payload" and m.queue_offset == r.queue_offset
        assert a.query_by_id("00" * 16) is None
        with pytest.raises(BrokerError, match="BAD_REQUEST.*hex"):
            a.query_by_id("zz")


def test_a_key_lookup_answer_stays_within_pull_bytes_max(tmp_path):
    """Matches in many large batches: the answer holds whole entries up to pull_bytes_max
    (at least one), not every match's batch (which could pass a client's frame limit)."""
    with BrokerThread(tmp_path / "b", pull_bytes_max=64 << 10, frame_bytes_max=256 << 10,
                      batch_bytes_max=128 << 10, message_body_bytes_max=64 << 10) as b:
        with Producer([b.address]) as p:
            for i in range(5):  # 5 batches of ~40 KiB, each holding one message with the key
                p.send_batch("big", [b"x" * 8000] * 4 + [b"hit %d" % i], queue_id=0,
                             keys=[None] * 4 + ["dup"])
        with Admin([b.address]) as a:
            got = a.query_by_key("big", "dup", max_results=10)
        assert 1 <= len(got) < 5 and all(m.body.startswith(b"hit") for m in got)


def test_long_poll_returns_when_a_message_arrives(broker):
    with Producer([broker.address]) as p:
        p.send("lp", b"first", queue_id=0)
    raw = RawClient(broker.port)
    req = pp.encode_request(pp.PullRequest("lp", 0, 1, 10, 1 << 20, 5000))
    t0 = time.monotonic()
    raw.send(fr.encode(Req.PULL, 3, req))
    time.sleep(0.3)
    with Producer([broker.address]) as p:
        p.send("lp", b"second", queue_id=0)
    f = raw.read_frame()
    waited = time.monotonic() - t0
    r = pp.decode_response(f.body)
    assert f.code == Code.SUCCESS and r.count == 1 and r.next_offset == 2
    assert 0.25 < waited < 4  # answered by the arrival, not the 5 s timeout
    raw.send(fr.encode(Req.PULL, 4, pp.encode_request(pp.PullRequest("lp", 0, 2, 10, 1 << 20, 300))))
    f = raw.read_frame()
    assert f.code == Code.PULL_NOT_FOUND
    raw.close()


def test_offset_out_of_range_moves_the_consumer(broker):
    with Producer([broker.address]) as p:
        for i in range(3):
            p.send("oor", b"%d" % i, queue_id=0)
    raw = RawClient(broker.port)
    raw.send(fr.encode(Req.PULL, 1, pp.encode_request(pp.PullRequest("oor", 0, 99, 10, 1 << 20, 0))))
    f = raw.read_frame()
    assert f.code == Code.PULL_OFFSET_MOVED and pp.decode_response(f.body).next_offset == 3
    raw.close()


def test_group_shares_queues_and_takes_over(broker):
    with Admin([broker.address]) as a:
        a.create_topic("shared", 4)
    async def run():
        c1 = Consumer([broker.address], "g", "shared", heartbeat_interval_ms=200, client_id="c1")
        c2 = Consumer([broker.address], "g", "shared", heartbeat_interval_ms=200, client_id="c2")
        await c1.poll_async(10)
        await c2.poll_async(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            a1, a2 = await c1.assignment_async(), await c2.assignment_async()
            if a1 == [0, 1] and a2 == [2, 3]:
                break
            await asyncio.sleep(0.1)
        assert (a1, a2) == ([0, 1], [2, 3])
        await c2.aclose()  # leaves the group: c1 takes everything
        deadline = time.monotonic() + 5
        while await c1.assignment_async() != [0, 1, 2, 3] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert await c1.assignment_async() == [0, 1, 2, 3]
        await c1.aclose()
    uvloop.run(run())


def test_blocking_call_inside_event_loop_is_refused(broker):
    async def run():
        p = Producer([broker.address])
        with pytest.raises(RuntimeError, match="send_async"):
            p.send("x", b"y")
        r = await p.send_async("x", b"y")
        await p.aclose()
        return r
    assert uvloop.run(run()).queue_offset == 0


def test_oneway_send_is_stored_without_an_answer(broker):
    with Producer([broker.address]) as p:
        mid = p.send_oneway("ow", b"fire and forget", queue_id=0)
        p.send("ow", b"acked", queue_id=0)  # same connection, after the oneway frame
    with Admin([broker.address]) as a:
        assert a.query_by_id(mid).body == b"fire and forget"
        assert a.describe_topic("ow").queues[0].max_offset == 2


def test_damaged_indexing_stops_dispatch_but_sends_are_stored_and_status_says_why(broker):
    """The dispatcher raises DamagedConsumeQueue where it used to spin forever (a position
    that is not an entry): the broker keeps serving, stores sends, stops indexing once (no
    busy retry) and names the reason in STATUS; a restart rebuilds the queues."""
    from broker.store.message_store import DamagedConsumeQueue

    b = broker.broker
    real = b.store.dispatch
    calls = []

    def damaged(*a, **kw):
        calls.append(1)
        raise DamagedConsumeQueue("no entry at offset 123 (below 456): a test")

    b.store.dispatch = damaged
    try:
        with Producer([broker.address]) as p:
            r = p.send("orders", b"still stored")
            p.send("orders", b"and this")
        with Admin([broker.address]) as a:
            st = a.status()
        assert "no entry at offset 123" in st["store"]["dispatch_error"]
        assert r.queue_offset == 0 and len(calls) == 1  # tried once, not in a loop
    finally:
        b.store.dispatch = real
