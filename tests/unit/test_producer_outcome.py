"""A failed send's `stored` covers every attempt: False only if each one certainly stored
nothing; once an attempt's outcome is unknown, later refusals do not make it "not stored".

Real sockets (a small asyncio server playing a broker that dies mid-send) for the paths a
black-box churn run hit, and a Hypothesis property over scripted attempt sequences for the
retry loop's decision."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import producer as prod
from broker.client.connection import ClientConnection
from broker.client.errors import (BrokerError, ConnectError, ConnectionLost, NotSent, RequestTimeout,
                                  SendError)
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol import send as sp
from broker.protocol import topics as tp
from broker.protocol.codes import NOT_STORED, STORED_NOT_CONFIRMED, Code, Req


class FakeBroker(asyncio.Protocol):
    """Answers GET_ROUTE (unless `route` is False); what it does with a SEND is `on_send`."""

    def __init__(self, server_box: list, on_send, route: bool = True):
        self.box, self.on_send, self.route = server_box, on_send, route

    def connection_made(self, t):
        self.t, self.dec = t, fr.FrameDecoder()

    def data_received(self, data):
        for f in self.dec.feed(data):
            if f.code == Req.GET_ROUTE:
                if not self.route:
                    self.box[0].close()  # never answers; and from now on nothing listens
                    continue
                body = jsonbody.encode(tp.Route("t", 1, 1, 6, True))
                self.t.write(fr.encode_response(Code.SUCCESS, f.corr_id, body))
            elif f.code == Req.SEND:
                self.on_send(self, f)


def send_through(on_send, route: bool = True, **producer_kw) -> SendError:
    """One send to a FakeBroker; the SendError it ends with."""
    async def run():
        box: list = []
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: FakeBroker(box, on_send, route), "127.0.0.1", 0)
        box.append(server)
        port = server.sockets[0].getsockname()[1]
        p = prod.Producer([f"127.0.0.1:{port}"], **{"send_timeout_ms": 300, **producer_kw})
        try:
            with pytest.raises(SendError) as e:
                await p.send_async("t", b"x", queue_id=0)
            return e.value
        finally:
            await p.aclose()
            server.close()
    return uvloop.run(run())


def read_then_vanish(broker: FakeBroker, f) -> None:
    """The broker read the SEND (and may have stored it), then died: no answer, and nothing
    listens any more (every reconnect is refused)."""
    broker.box[0].close()
    broker.t.close()


def test_send_read_then_broker_gone_and_refusing_is_unknown():
    err = send_through(read_then_vanish, failover_timeout_ms=60_000)
    assert err.stored is None, (err, err.stored)
    assert "outcome unknown (may be stored)" in str(err)


def test_send_read_then_reconnects_time_out_until_the_deadline_is_unknown():
    async def timing_out(host, port, *a):
        raise ConnectError(f"cannot connect to {host}:{port}: timed out", refused=False)
    patcher = mock.patch.object(ClientConnection, "open", staticmethod(timing_out))

    def vanish_then_time_out(broker, f):
        patcher.start()  # from now on every connect times out: retried until the deadline
        broker.t.close()
    try:
        err = send_through(vanish_then_time_out, failover_timeout_ms=600)
    finally:
        patcher.stop()
    assert err.code == Code.NOT_CONNECTED and err.attempts >= 3
    assert err.stored is None, (err, err.stored)


def test_system_error_answer_is_unknown_never_not_stored():
    # the broker answers SYSTEM_ERROR when its send path failed, possibly after storing
    def system_error(broker, f):
        broker.t.write(fr.encode_response(Code.SYSTEM_ERROR, f.corr_id, headers={"error": "boom"}))
    err = send_through(system_error, retry_when_outcome_unknown=False)
    assert err.code == Code.SYSTEM_ERROR and err.stored is None, (err, err.stored)
    err = send_through(system_error, retry_times_when_send_failed=1)
    assert err.stored is None and err.attempts == 2


def test_a_route_lookup_that_times_out_sent_nothing():
    # GET_ROUTE unanswered, then refused: the SEND was never written, so it is certainly not stored
    err = send_through(None, route=False, failover_timeout_ms=60_000)
    assert err.stored is False, (err, err.stored)


def test_flush_slave_timeout_says_stored():
    def flush_slave_timeout(broker, f):
        body = sp.encode_response(sp.SendResponse(0, 7, 0, 7, 1))
        broker.t.write(fr.encode_response(Code.FLUSH_SLAVE_TIMEOUT, f.corr_id, body))
    err = send_through(flush_slave_timeout)
    assert err.stored is True and err.result.queue_offset == 7 and err.attempts == 1


# --- the retry loop's decision, over scripted attempt sequences ---------------------------

CODES = [c for c in Code if c not in (Code.SUCCESS, Code.NOT_CONNECTED)] + [99]  # 99: unknown
EXCS = {"not_sent": NotSent, "connect": ConnectError, "lost": ConnectionLost,
        "timeout": RequestTimeout, "broker": lambda m: BrokerError(Code.TOPIC_NOT_EXIST, m)}

step = st.one_of(
    st.tuples(st.just("frame"), st.sampled_from(CODES)),
    st.tuples(st.just("exc"), st.sampled_from(sorted(EXCS)), st.booleans()),
)


def oracle(step) -> str:
    """The rule, stated independently of the producer's helpers."""
    if step[0] == "frame":
        if step[1] in STORED_NOT_CONFIRMED:
            return "stored"
        return "not stored" if step[1] in NOT_STORED else "unknown"
    _, kind, sent = step
    if kind in ("not_sent", "connect", "broker") or not sent:
        return "not stored"
    return "unknown"


class FakeSession:
    closed = False  # (ProducerSession's: no attempt after close)

    def drop(self, conn):
        pass

    def follow(self, f, conn):
        pass


@settings(max_examples=400, deadline=None, print_blob=True)
@given(script=st.lists(step, max_size=12), success_at_end=st.booleans(),
       retries=st.integers(0, 3), retry_unknown=st.booleans(), failover_ms=st.sampled_from([0, 60_000]))
def test_stored_is_false_only_if_every_attempt_stored_nothing(script, success_at_end, retries,
                                                              retry_unknown, failover_ms):
    # failover_ms=0: every deadline (NOT_LEADER, connect timeouts) has passed at once
    used: list = []

    async def attempt(s, topic, queue_id, code, build, refresh):
        i = len(used)
        st_ = script[i] if i < len(script) else (("ok",) if success_at_end else ("exc", "refused", False))
        used.append(st_)
        if st_[0] == "ok":
            return fr.Frame(1, 1, Code.SUCCESS, 0, {}, b""), None, True
        if st_[0] == "frame":
            return fr.Frame(1, 1, st_[1], 0, {"error": "scripted"}, b""), None, True
        _, kind, sent = st_
        if kind == "refused":
            return ConnectError("cannot connect: refused", refused=True), None, False
        e = EXCS[kind]("scripted")
        return e, None, sent and kind not in ("connect", "broker")

    async def run():
        p = prod.Producer(["127.0.0.1:1"], retry_times_when_send_failed=retries,
                          retry_when_outcome_unknown=retry_unknown, failover_timeout_ms=failover_ms)
        p._attempt = attempt
        with mock.patch.object(prod, "RETRY_BACKOFF_S", 0):
            return await p._with_retries(FakeSession(), "t", 0, Req.SEND, None)

    try:
        f, attempts, possible_duplicate = uvloop.run(run())
    except SendError as e:
        said = {oracle(s) for s in used if s[0] != "exc" or s[1] != "refused"}
        want = True if "stored" in said else None if "unknown" in said else False
        assert e.stored is want, (used, e, e.stored)
        assert e.attempts == len(used)
    else:
        assert f.code == Code.SUCCESS and used[-1] == ("ok",)
        assert possible_duplicate == any(oracle(s) == "unknown" for s in used[:-1])
        assert attempts == len(used)
