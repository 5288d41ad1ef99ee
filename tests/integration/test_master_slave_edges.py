"""Master-slave edges on real processes: bad input on the HA port, reads from a slave,
metadata sync, and promotions that could lose data."""

import json
import socket
import time
from pathlib import Path

import pytest
import uvloop

from broker.client import Admin, Consumer, Producer, TidelogError
from broker.client.security import Credentials
from broker.client.connection import ClientConnection, parse_bootstrap
from broker.protocol import offsets as op
from broker.protocol import pull as pp
from broker.protocol import jsonbody
from broker.protocol.codes import Code, Req
from ops.cluster import LocalCluster
from replication.master_slave import wire
from tests.helpers import poll_until

pytestmark = pytest.mark.slow

FAST = dict(segment_bytes=1 << 20, message_body_bytes_max=64 << 10, ha_heartbeat_interval_ms=200,
            ha_housekeeping_interval_ms=1500, slave_ack_timeout_ms=1000, metadata_sync_interval_ms=300,
            ha_probe_interval_ms=300, checkpoint_interval_ms=200)


@pytest.fixture
def pair(tmp_path, request):
    """A SYNC master and its slave (secure, unless the test is marked `plain`: insecure, plain TCP)."""
    c = LocalCluster(tmp_path / "pair")
    c.up(2, "master-slave", "async", ha_replication="sync", insecure=request.node.get_closest_marker("plain") is not None,
         **FAST)
    try:
        assert c.wait_healthy()["verdict"] == "healthy"
        yield c
    finally:
        c.down()


def wait_for(cond, timeout_s=10.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ha_exchange(address, payload: bytes, timeout_s=5.0) -> bytes:
    """Send raw bytes to an HA port; everything it answers until it closes (or times out)."""
    host, port = parse_bootstrap([address])[0]
    with socket.create_connection((host, port), timeout=timeout_s) as s:
        s.sendall(payload)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except socket.timeout:
            out += b"<open>"
    return out


@pytest.mark.plain
def test_bad_input_on_the_ha_port_is_refused_and_the_master_serves_on(pair):
    """The HA handshake's own checks, on plain TCP (insecure: true) so raw bytes reach them; with
    security on TLS refuses all of this first (tests/integration/test_forged_frames.py)."""
    ha = pair.node("n0").ha_address
    assert ha_exchange(ha, b"\xff" * 64) == b""  # a garbled handshake: closed
    assert ha_exchange(ha, (1 << 30).to_bytes(4, "big")) == b""  # an oversized one
    hello = wire.Hello("intruder", [], 0, 0, 0)
    w, _ = wire.decode_handshake(ha_exchange(ha, wire.encode_handshake(hello)), wire.Welcome)
    assert "not a member" in w.error
    ahead = wire.Hello("n1", [[1, 0]], 0, 0, 99)  # a slave that heard of a newer epoch
    w, _ = wire.decode_handshake(ha_exchange(ha, wire.encode_handshake(ahead)), wire.Welcome)
    assert "newer than this master's" in w.error
    with Producer(pair.addresses) as p:
        for i in range(20):
            p.send("t", b"after-%d" % i)  # SYNC: the real slave still acknowledges
    with Admin([pair.node("n0").address]) as a:
        st = a.status()["replication"]
        assert st["role"] == "master" and st["in_sync_count"] == 2
        with pytest.raises(TidelogError, match="BAD_REQUEST"):
            uvloop.run(a._direct(pair.node("n0").address, Req.HA_ROLE, {"action": "dance"}, 3000))


def test_reads_from_a_slave_and_metadata_sync(pair):
    master, slave = pair.node("n0").address, pair.node("n1").address
    with Admin([master]) as a:
        a.create_topic("r", 2)
    with Producer([master]) as p:
        for i in range(100):
            p.send("r", b"r-%03d" % i, queue_id=i % 2)

    async def raw(address, code, body, headers=None):
        host, port = parse_bootstrap([address])[0]
        conn = await ClientConnection.open(host, port, 2.0, credentials=Credentials.resolve())  # TIDELOG_CREDENTIALS
        try:
            return await conn.request(code, body, 3.0, headers)
        finally:
            conn.close()

    pull = pp.encode_request(pp.PullRequest("r", 0, 0, 100, 1 << 20, 0))
    wait_for(lambda: json.loads(Path(pair.node("n1").data_dir, "config", "topics.json").read_text())
             ["topics"][0]["name"] == "r" if Path(pair.node("n1").data_dir, "config", "topics.json").exists()
             else False, what="the topic config on the slave")
    f = uvloop.run(raw(slave, Req.PULL, pull))
    assert f.code == Code.NOT_LEADER and f.headers["leader"] == master
    f = uvloop.run(raw(slave, Req.PULL, pull, {"read_from": "slave"}))
    assert f.code == Code.SUCCESS and pp.decode_response(f.body).count == 50

    with Consumer([master], "g", "r", read_from_slave=True, auto_commit=False) as c:
        got = []
        while len(got) < 100:
            batch = c.poll(timeout_ms=3000)
            assert batch, f"read only {len(got)} of 100 from the slave"
            got += batch
        c.commit()
        pulled_from = {s.slave_conn.address for s in c._sessions.values() if s.slave_conn is not None}
    assert sorted(m.body for m in got) == [b"r-%03d" % i for i in range(100)]
    assert pulled_from == {slave}
    offsets = Path(pair.node("n1").data_dir, "config", "consumer_offsets.json")
    wait_for(lambda: offsets.exists() and json.loads(offsets.read_text())["offsets"].get("g", {}).get("r")
             == {"0": 50, "1": 50}, what="the group's offsets on the slave")

    pair.kill("n0")  # the master is gone: the slave serves reads and the group by itself
    wait_for(lambda: uvloop.run(raw(slave, Req.PULL, pull)).code == Code.SUCCESS, what="slave reads")
    q = uvloop.run(raw(slave, Req.QUERY_OFFSET, jsonbody.encode(op.QueryOffsets("g", "r", [0, 1]))))
    assert q.code == Code.SUCCESS and jsonbody.decode(op.Offsets, q.body).offsets == {0: 50, 1: 50}
    f = uvloop.run(raw(slave, Req.COMMIT_OFFSET, jsonbody.encode(op.CommitOffsets("g", "r", {0: 60}))))
    assert f.code == Code.SUCCESS
    with Producer([slave], failover_timeout_ms=500) as p:
        with pytest.raises(TidelogError, match="NOT_LEADER"):
            p.send("r", b"nowhere")


def test_promotion_that_could_lose_acknowledged_messages_needs_force(tmp_path):
    c = LocalCluster(tmp_path / "three")
    try:
        c.up(3, "master-slave", "async", ha_replication="sync", **FAST)
        assert c.wait_healthy()["verdict"] == "healthy"
        with Producer(c.addresses) as p:
            for i in range(50):
                p.send("t", b"x-%d" % i)
        c.kill("n0")
        c.kill("n2")  # it may hold acknowledged messages n1 lacks (one slave ack per send)
        with Admin([c.node("n1").address]) as a:
            wait_for(lambda: not a.status()["replication"]["connected"], what="n1 to see its master gone")
            with pytest.raises(TidelogError, match="unreachable n2 may hold acknowledged messages"):
                a.promote("n1")
            assert a.status()["role"] == "slave"  # nothing changed
            rep = a.promote("n1", force=True)
            assert not rep["clean"] and rep["problems"] and rep["epoch"] == 2
            assert a.status()["role"] == "master"
    finally:
        c.down()


def test_silent_peers_are_dropped_after_housekeeping(pair):
    """A paused slave keeps its TCP connection but stops reporting: the master drops it
    after ha_housekeeping_interval_ms (sends then get SLAVE_NOT_AVAILABLE at once); a paused
    master stops streaming: the slave drops it likewise. Both come back by themselves."""
    master, slave = pair.node("n0").address, pair.node("n1").address
    import signal
    with Admin([master]) as a, Producer([master], retry_times_when_send_failed=0) as p:
        p.send("t", b"before")
        pair.kill("n1", signal.SIGSTOP)
        try:
            wait_for(lambda: a.status()["replication"]["slave_count"] == 0, 6, "the master to drop n1")
            t0 = time.monotonic()
            with pytest.raises(TidelogError, match="SLAVE_NOT_AVAILABLE") as e:
                p.send("t", b"refused")
            assert e.value.stored is False and time.monotonic() - t0 < 0.5  # at once, not stored
        finally:
            pair.kill("n1", signal.SIGCONT)
        wait_for(lambda: a.status()["replication"]["in_sync_count"] == 2, 10, "n1 back in sync")
        p.send("t", b"after")
    with Admin([slave]) as b:
        pair.kill("n0", signal.SIGSTOP)
        try:
            wait_for(lambda: not b.status()["replication"]["connected"], 6, "the slave to drop n0")
        finally:
            pair.kill("n0", signal.SIGCONT)
        wait_for(lambda: b.status()["replication"]["connected"], 10, "n1 to reconnect")


def test_auto_degrade_keeps_taking_sends_without_slaves(tmp_path):
    c = LocalCluster(tmp_path / "degrade")
    try:
        c.up(2, "master-slave", "async", ha_replication="sync", ha_auto_degrade=True, **FAST)
        assert c.wait_healthy()["verdict"] == "healthy"
        c.kill("n1")
        with Admin([c.node("n0").address]) as a, Producer([c.node("n0").address]) as p:
            wait_for(lambda: a.status()["replication"]["slave_count"] == 0, 5, "n1 to be gone")
            r = p.send("t", b"alone")  # min_in_sync_replicas=1: the master alone suffices
            st = a.status()["replication"]
            assert r.queue_offset == 0 and st["required_replicas"] == 1
    finally:
        c.down()


def test_a_fence_that_lapses_makes_the_master_ask_the_members_before_it_takes_writes(pair):
    """A switchover fences the master, then its promoter vanishes: when the fence lapses the
    master does not simply take writes again in its epoch (a new master may lead a newer one
    that enough members recorded, and the sends it acknowledged there would be lost); it
    steps down, has the members record a new epoch, and leads that. Nothing acknowledged
    before is lost."""
    master = pair.node("n0").address
    with Producer(pair.addresses) as p:
        for i in range(10):
            p.send("f", b"before-%d" % i)
    with Admin([master]) as a:
        epoch = a.status()["replication"]["epoch"]
        f = uvloop.run(a._direct(master, Req.HA_ROLE, {"action": "fence", "ms": 1500}, 3000))
        assert json.loads(bytes(f.body))["epoch"] == epoch
        with Producer([master], failover_timeout_ms=300) as p:
            with pytest.raises(TidelogError, match="LEADER_TRANSFERRING|NOT_LEADER"):
                p.send("f", b"while-fenced")
        wait_for(lambda: a.status()["replication"]["epoch"] > epoch and a.status()["replication"]["role"] == "master",
                 timeout_s=20, what="the master to lead a new epoch after its fence lapsed")
        st = a.status()["replication"]
        assert not st["fenced"] and st["waiting_to_lead"] is None, st
        wait_for(lambda: a.status()["replication"]["in_sync_count"] == 2, what="the slave back in sync")
    with Producer(pair.addresses) as p:
        for i in range(10):
            p.send("f", b"after-%d" % i)
    with Consumer(pair.addresses, "g-fence", "f", auto_commit=False) as c:
        got = poll_until(c, 20, 20, 1000, max_messages=100)
    assert sorted(m.body for m in got) == sorted([b"before-%d" % i for i in range(10)] +
                                                 [b"after-%d" % i for i in range(10)])


def test_a_switchover_that_gives_up_lifts_only_its_own_fence(pair):
    """Two switchovers fence the master at once; the first gives up and lifts its fence: the
    master still refuses writes (the second may still take over, caught up only to the end it
    was told), until the second lifts its own. A lift naming no fence (an older build's)
    lifts neither."""
    master = pair.node("n0").address

    def fence(ms, fence_id=None):
        body = {"action": "fence", "ms": ms, **({"fence_id": fence_id} if fence_id else {})}
        f = uvloop.run(a._direct(master, Req.HA_ROLE, body, 3000))
        assert f.code == 0, f

    with Admin([master]) as a, Producer([master], failover_timeout_ms=300) as p:
        p.send("g", b"before")
        fence(60_000, "n1:first")
        fence(60_000, "n1:second")
        fence(0, "n1:first")
        fence(0)
        assert a.status()["replication"]["fenced"]
        with pytest.raises(TidelogError, match="LEADER_TRANSFERRING|NOT_LEADER"):
            p.send("g", b"while-the-second-is-on")
        fence(0, "n1:second")
        assert not a.status()["replication"]["fenced"]
        p.send("g", b"after")  # taken again
