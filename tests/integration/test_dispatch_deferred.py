"""The dispatch (ConsumeQueues, key index) is deferred after a send's answer
(Broker.schedule_dispatch), yet nobody can see a message missing: a PULL without long
polling and a query by message id sent right after each acknowledgement find it, on a raft
leader, a SYNC master (answered when its slave reports) and a standalone broker; a long poll
parked before the send gets it at once."""

import asyncio
import time

import pytest
import uvloop

from broker.client import Admin, Producer
from broker.client.connection import ClientConnection, parse_bootstrap
from broker.protocol import frame as fr
from broker.protocol import pull as pp
from broker.protocol.codes import Code, Req
from ops.cluster import LocalCluster

pytestmark = pytest.mark.slow

ROUNDS = 60


async def pull(conn: ClientConnection, topic: str, queue_id: int, offset: int, suspend_ms: int = 0):
    f = await conn.request(Req.PULL, pp.encode_request(pp.PullRequest(topic, queue_id, offset, 32, 1 << 20,
                                                                      suspend_ms)), 10.0)
    return f.code, pp.decode_response(f.body) if f.body else None


async def read_right_after_each_ack(address: str, topic: str) -> None:
    host, port = parse_bootstrap([address])[0]
    p = Producer([address])
    a = Admin([address])
    conn = await ClientConnection.open(host, port, 5.0)
    try:
        for i in range(ROUNDS):
            r = await p.send_async(topic, b"m%d" % i, queue_id=i % 2)
            code, resp = await pull(conn, topic, r.queue_id, r.queue_offset)
            assert code == Code.SUCCESS and resp.count >= 1, (i, code, resp)
            assert resp.max_offset == r.queue_offset + 1, (i, resp)
            if i % 10 == 0:  # the key index too (a query is another request that reads)
                found = await a.query_by_id_async(r.msg_id)
                assert found is not None and found.body == b"m%d" % i, i
        # a long poll parked before the send is answered as soon as the send commits
        waiting = asyncio.ensure_future(pull(conn, topic, 0, ROUNDS // 2 + ROUNDS % 2, suspend_ms=5000))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        t0 = time.monotonic()
        await p.send_async(topic, b"late", queue_id=0)
        code, resp = await asyncio.wait_for(waiting, 5)
        assert code == Code.SUCCESS and resp.count == 1, (code, resp)
        assert time.monotonic() - t0 < 1.0
    finally:
        conn.close()
        await p.aclose()
        await a.aclose()


@pytest.mark.parametrize("mode,nodes", [("raft", 3), ("master-slave", 2), ("standalone", 1)])
def test_a_message_is_readable_right_after_its_ack(tmp_path, mode, nodes):
    c = LocalCluster(tmp_path / "c")
    try:
        extra = {"ha_replication": "sync"} if mode == "master-slave" else {}
        c.up(nodes, mode, "async", insecure=True, **extra)  # a raw connection below: plain TCP
        if mode == "master-slave":
            assert c.wait_healthy()["verdict"] == "healthy"  # the slave is in sync: sends wait for it
        leader = c.node(c.wait_for_leader()).address if mode != "standalone" else c.addresses[0]
        with Admin([leader]) as a:
            a.create_topic("rw", 2)
        uvloop.run(read_right_after_each_ack(leader, "rw"))
    finally:
        c.down()
