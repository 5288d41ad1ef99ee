"""What the client says when the broker is slow, gone or silent."""

import asyncio
import os
import time

import pytest
import uvloop

from broker.client import BrokerError, Consumer, Producer, SendError
from broker.client.connection import ClientConnection
from broker.client.errors import ConnectError
from broker.protocol.codes import Code
from ops.localbroker import LocalBroker, free_port

from ..helpers import BrokerThread, SilentOnce


def test_slow_fsync_gives_flush_disk_timeout_with_the_stored_result(tmp_path, monkeypatch):
    with BrokerThread(tmp_path / "b", flush="sync", sync_flush_timeout_ms=200) as b:
        with Producer([b.address]) as p:
            p.send("t", b"warm-up")
            real = os.fdatasync
            monkeypatch.setattr(os, "fdatasync", lambda fd: (time.sleep(0.6), real(fd)))
            with pytest.raises(SendError, match="FLUSH_DISK_TIMEOUT.*sync_flush_timeout_ms") as e:
                p.send("t", b"slow")
            assert e.value.stored is True and e.value.attempts == 1  # never retried
            stored_at = e.value.result
            monkeypatch.undo()
        with Consumer([b.address], "g", "t", queues=[stored_at.queue_id]) as c:
            got = []
            deadline = time.monotonic() + 10
            while not any(m.body == b"slow" for m in got) and time.monotonic() < deadline:
                got += c.poll(timeout_ms=300)
        m = next(m for m in got if m.body == b"slow")
        assert m.queue_offset == stored_at.queue_offset  # stored, where the error said


def test_nothing_listening_is_a_connect_error_at_once_never_system_error():
    ports = [free_port(), free_port()]
    # a long failover timeout: refused everywhere is final, it must not be waited out
    with Producer([f"127.0.0.1:{p}" for p in ports], failover_timeout_ms=60_000) as p:
        t0 = time.monotonic()
        with pytest.raises(ConnectError) as e:
            p.send("t", b"x")
        assert time.monotonic() - t0 < 15  # loose bound (shared CI); was the whole failover timeout
    err = e.value
    assert isinstance(err, SendError) and err.stored is False and err.attempts == 1
    assert err.code == Code.NOT_CONNECTED and err.refused
    assert str(err).startswith(f"cannot connect to 127.0.0.1:{ports[0]}: ") and str(ports[1]) in str(err)


def test_connect_timeouts_are_retried_until_the_failover_timeout(monkeypatch):
    # a host cut off for a moment times out rather than refusing: worth retrying
    async def timing_out(host, port, *a):
        raise ConnectError(f"cannot connect to {host}:{port}: timed out", refused=False)
    monkeypatch.setattr(ClientConnection, "open", staticmethod(timing_out))
    with Producer(["127.0.0.1:10911"], failover_timeout_ms=600) as p:
        with pytest.raises(SendError) as e:
            p.send("t", b"x")
    assert e.value.code == Code.NOT_CONNECTED and e.value.stored is False and e.value.attempts >= 2
    assert str(e.value) == "cannot connect to 127.0.0.1:10911: timed out"


def test_consuming_a_topic_that_does_not_exist_fails_at_once(tmp_path):
    with BrokerThread(tmp_path / "b") as b:
        with Consumer([b.address], "g", "nope") as c:
            with pytest.raises(BrokerError) as e:
                c.poll(timeout_ms=30_000)
            assert e.value.code == Code.TOPIC_NOT_EXIST and "topic 'nope' does not exist" in str(e.value)
            assert b.call(lambda: b.broker.groups.live("g", 0)) == []  # it left the group again
            with Producer([b.address]) as p:
                p.send("nope", b"now it does")  # auto-created
            got = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got = c.poll(timeout_ms=300)  # the next poll starts over
            assert [m.body for m in got] == [b"now it does"]


def test_bootstrap_list_fails_over_to_a_live_broker(tmp_path):
    with BrokerThread(tmp_path / "b") as b:
        with Producer([f"127.0.0.1:{free_port()}", b.address]) as p:
            assert p.send("t", b"x").queue_offset == 0


def test_broker_restart_between_sends_is_retried_transparently(tmp_path):
    lb = LocalBroker(tmp_path / "lb", segment_bytes=1 << 20, message_body_bytes_max=64 << 10)
    try:
        lb.start()
        with Producer([lb.address]) as p:
            p.send("t", b"before")
            lb.kill()
            lb.start()  # same port
            r = p.send("t", b"after")  # the dead connection is noticed and replaced
            assert r.index == 1  # stored right after "before"
    finally:
        lb.stop()


def test_unknown_outcome_is_retried_with_the_same_id_and_flagged():
    async def run(retry: bool):
        SilentOnce.sends = 0
        server = await asyncio.get_running_loop().create_server(SilentOnce, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        p = Producer([f"127.0.0.1:{port}"], send_timeout_ms=300, retry_when_outcome_unknown=retry)
        try:
            return await p.send_async("t", b"x")
        finally:
            await p.aclose()
            server.close()

    r = uvloop.run(run(True))
    assert r.possible_duplicate and r.attempts == 2
    with pytest.raises(SendError, match="outcome unknown") as e:
        uvloop.run(run(False))
    assert e.value.stored is None


def test_consumer_reports_a_dead_broker_and_recovers(tmp_path):
    lb = LocalBroker(tmp_path / "lb", segment_bytes=1 << 20, message_body_bytes_max=64 << 10)
    try:
        lb.start()
        with Producer([lb.address]) as p:
            p.send("t", b"one", queue_id=0)
        with Consumer([lb.address], "g", "t", queues=[0]) as c:
            assert [m.body for m in c.poll(timeout_ms=3000)] == [b"one"]
            lb.kill()
            assert c.poll(timeout_ms=300) == []  # no crash, just nothing
            lb.start()
            with Producer([lb.address]) as p:
                p.send("t", b"two", queue_id=0)
            got = []
            deadline = time.monotonic() + 10
            while not got and time.monotonic() < deadline:
                got = c.poll(timeout_ms=300)
            assert [m.body for m in got] == [b"two"]
    finally:
        lb.stop()


def test_connect_error_names_every_address():
    ports = [free_port(), free_port()]
    async def run():
        from broker.client.base import ClientBase, Session
        s = Session(ClientBase([f"127.0.0.1:{ports[0]}", f"127.0.0.1:{ports[1]}"], connect_timeout_ms=300))
        await s.connection()
    with pytest.raises(ConnectError) as e:
        uvloop.run(run())
    assert str(ports[0]) in str(e.value) and str(ports[1]) in str(e.value)


class CuttingProxy:
    """A TCP proxy in front of a real broker that, once armed, forwards the next request to the
    broker, then drops the client's connection without the answer and stops listening: the
    broker died after reading (and maybe storing) a send, and refuses every reconnect."""

    def __init__(self, upstream: str):
        import socket
        import threading

        self.upstream = upstream.rsplit(":", 1)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.armed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            broker = socket.create_connection((self.upstream[0], int(self.upstream[1])))
            threading.Thread(target=self._pump, args=(broker, client, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(client, broker, True), daemon=True).start()

    def _pump(self, src, dst, requests: bool):
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if not requests and self.armed.is_set():
                continue                 # the answer never leaves the dying broker
            dst.sendall(data)
            if requests and self.armed.is_set():
                time.sleep(0.2)          # the broker reads and stores it
                self.listener.close()    # ... and is gone: reconnects are refused
                break
        for s in (src, dst):
            s.close()


def test_a_send_lost_in_flight_then_refused_is_unknown_never_not_stored(tmp_path):
    """Attempt 1 reaches the broker, which stores it, and the connection breaks before the
    answer; every reconnect is refused. The refusal says nothing about attempt 1: the send's
    outcome is unknown (stored=None), never 'not stored' -- it is in the log."""
    with BrokerThread(tmp_path / "b") as b:
        proxy = CuttingProxy(b.address)
        with Producer([proxy.address], failover_timeout_ms=60_000) as p:
            p.send("t", b"warm-up", queue_id=0)   # the route is known; the next frame is the send
            proxy.armed.set()
            with pytest.raises(SendError) as e:
                p.send("t", b"in flight", queue_id=0)
        assert e.value.stored is None, (e.value, e.value.stored)
        assert "outcome unknown (may be stored)" in str(e.value) and "cannot connect" in str(e.value)
        with Consumer([b.address], "g", "t", queues=[0]) as c:
            got, deadline = [], time.monotonic() + 10
            while not any(m.body == b"in flight" for m in got) and time.monotonic() < deadline:
                got += c.poll(timeout_ms=300)
        assert any(m.body == b"in flight" for m in got)   # stored=False would have been a lie
