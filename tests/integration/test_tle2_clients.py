"""The consumer and the admin client against a broker that writes record batches
(commitlog_format: 2, docs/design/batch-format.md): pulls from inside a batch, tag filters
and lookups give exactly the messages asked for; the same on format 1."""

import pytest

from broker.client import Admin, Consumer, Producer

from ..helpers import BrokerThread, poll_until


@pytest.fixture(params=[1, 2], ids=["tle1", "tle2"])
def broker(tmp_path, request):
    with BrokerThread(tmp_path / "b", commitlog_format=request.param) as b:
        b.format = request.param
        yield b


def test_a_consumer_starting_inside_a_batch_gets_exactly_from_there(broker):
    with Producer([broker.address]) as p:
        a = p.send_batch("t", [b"a%d" % i for i in range(6)], queue_id=0, tags="x")
        b = p.send_batch("t", [b"b%d" % i for i in range(5)], queue_id=0, tags="y")
    if broker.format == 2:  # one entry per batch: the index is shared
        assert len({r.index for r in a}) == 1 and len({r.index for r in b}) == 1
    with Consumer([broker.address], "g", "t", queues=[0], pull_batch_size=2) as c:
        assert c.assignment() == [0]
        c.seek(0, 4)
        got = poll_until(c, 7)
        assert [m.queue_offset for m in got] == list(range(4, 11))
        assert [m.body for m in got] == [b"a4", b"a5"] + [b"b%d" % i for i in range(5)]
        assert c.poll(timeout_ms=300) == []
        c.commit()
    if broker.format == 2:
        assert [m.batch_pos for m in got] == [4, 5, 0, 1, 2, 3, 4]


def test_a_tag_filtered_consumer_gets_only_matching_messages(broker):
    with Producer([broker.address]) as p:
        for k in range(4):
            p.send_batch("f", [b"%d-%d" % (k, i) for i in range(3)], queue_id=0, tags="x" if k % 2 else "y")
    with Consumer([broker.address], "g", "f", queues=[0], tags="x", pull_batch_size=1) as c:
        got = poll_until(c, 6)
        assert [m.queue_offset for m in got] == [3, 4, 5, 9, 10, 11] and {m.tags for m in got} == {"x"}
        assert c.poll(timeout_ms=300) == []
        c.commit()
    with Admin([broker.address]) as a:  # everything below 12 was fetched, none of it lost
        [q] = [q for q in a.describe_group("g")["queues"] if q["queue_id"] == 0]
        assert q["lag"] == 0


def test_lookups_pick_the_messages_of_a_batch(broker):
    with Producer([broker.address]) as p:
        rs = p.send_batch("q", [b"m%d" % i for i in range(5)], queue_id=0,
                          keys=["k0", "shared", "k2", "shared", "k4"])
        p.send("q", b"alone", key="shared", queue_id=0)
    with Admin([broker.address]) as a:
        m = a.query_by_id(rs[2].msg_id)
        assert (m.body, m.queue_offset, m.keys) == (b"m2", 2, ["k2"])
        assert [x.body for x in a.query_by_key("q", "shared")] == [b"m1", b"m3", b"alone"]
        assert [x.body for x in a.query_by_key("q", "shared", max_results=2)] == [b"m1", b"m3"]
        assert [x.body for x in a.query_by_key("q", "k4")] == [b"m4"]
        assert a.query_by_key("q", "nope") == []
