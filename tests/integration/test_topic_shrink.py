"""Shrinking a topic never hides unconsumed messages unless forced (the new user's report:
`topic create --queues 2 --update` on a 4-queue topic made half the messages unreadable). The
RocketMQ way works: write queues first, let the groups drain the rest, then read queues."""

import time

import pytest

from broker.client import Admin, Consumer, Producer
from broker.client.errors import BrokerError
from ops.cluster import LocalCluster

pytestmark = pytest.mark.slow


def drain(address: str, group: str, topic: str, want: int) -> int:
    got = 0
    with Consumer([address], group, topic) as c:
        deadline = time.monotonic() + 20
        while got < want and time.monotonic() < deadline:
            got += len(c.poll(timeout_ms=300, max_messages=want - got))
        c.commit()
    return got


def test_read_queues_shrink_only_once_drained(tmp_path):
    c = LocalCluster(tmp_path / "c")
    try:
        c.up(1, "standalone", "async", insecure=True)
        address = c.addresses[0]
        with Admin([address]) as a, Producer([address]) as p:
            a.create_topic("orders", 4)
            for i in range(40):
                p.send("orders", b"m%d" % i, queue_id=i % 4)
            with pytest.raises(BrokerError) as e:  # 20 messages in queues 2 and 3 would be lost to view
                a.create_topic("orders", 2, update=True)
            assert "would hide 20 unconsumed messages (queue 2: 10, queue 3: 10)" in str(e.value), e.value
            with pytest.raises(BrokerError) as e:  # fewer read than write queues: never, unforced
                a.create_topic("orders", 4, read_queues=2, update=True)
            assert "would reach no consumer" in str(e.value), e.value
            assert a.describe_topic("orders").read_queues == 4  # nothing changed
            # the two steps: writes stop going to queues 2 and 3, a group drains them, then they go
            assert a.create_topic("orders", 2, read_queues=4, update=True).read_queues == 4
            assert drain(address, "billing", "orders", 40) == 40
            info = a.create_topic("orders", 2, update=True)
            assert (info.write_queues, info.read_queues) == (2, 2)
            # a group that has not read queue 1 to its end stops a shrink to one queue; force passes
            p.send("orders", b"late", queue_id=1)
            with pytest.raises(BrokerError) as e:
                a.create_topic("orders", 1, update=True)
            assert "queue 1: 1)" in str(e.value), e.value
            assert a.create_topic("orders", 1, update=True, force=True).read_queues == 1
    finally:
        c.down()
