"""The Producer: send messages, each acknowledged by the broker's flush policy.

Retries (`retry_times_when_send_failed`, RocketMQ's default 2; finding a new leader after a
failover does not count, it is bounded by `failover_timeout_ms`):
- certainly not stored (connect failure, not sent, SYSTEM_BUSY, DISK_FULL, NOT_LEADER...):
  retried, after a short back-off; but when every address refused the connection the send
  fails at once with SendConnectError (a SendError and a ConnectError, code NOT_CONNECTED,
  stored=False), and one that keeps failing to connect fails so after `failover_timeout_ms`;
- stored but not confirmed durable (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT,
  SLAVE_NOT_AVAILABLE): never retried, raised as SendError(stored=True) with the result;
- unknown (a timeout, the connection broke after the request was written, TERM_CHANGED,
  SYSTEM_ERROR or any code not known to mean "not stored"): retried with the same msg_id only
  if `retry_when_outcome_unknown` (default True), and the result then says
  `possible_duplicate=True`; otherwise SendError(stored=None).
A retry never changes the message's msg_id, so any duplicate is recognisable downstream.
The `stored` of a SendError covers every attempt, not the last one (settle()): False only if
every attempt certainly stored nothing; once one attempt's outcome is unknown, a later refusal
(a refused reconnect, NOT_LEADER until the failover timeout, retries used up) says nothing
about it, so stored=None. A cancelled send raises CancelledError and claims nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import time
from typing import NamedTuple

from broker.client.base import ClientBase, Session
from broker.client.errors import (BrokerError, ConnectError, NotSent, SendConnectError, SendError,
                                  TidelogError)
from broker.protocol import frame as fr
from broker.protocol import send as sp
from broker.protocol import topics as tp
from broker.protocol.codes import NOT_STORED, RETRIABLE, STORED_NOT_CONFIRMED, Code, Req
from broker.store import codec

ROUTE_TTL_S = 30.0
RETRY_BACKOFF_S = 0.05
TOPICS_CACHED_MAX = 4096  # encoded topic names kept


class SendResult(NamedTuple):
    msg_id: str  # 32 hex characters
    topic: str
    queue_id: int
    queue_offset: int
    phys_offset: int
    index: int
    store_ts_ms: int
    attempts: int = 1
    possible_duplicate: bool = False  # an earlier attempt's outcome was unknown


# What one attempt says about the message (attempt_said, code_said); settle() turns the
# attempts of one send into the `stored` its SendError reports.
NOT_STORED_SAID = "not stored"
UNKNOWN = "unknown"
STORED = "stored"


def attempt_said(e: Exception, sent: bool) -> str:
    """An attempt that ended in a client-side error. Before the request was handed to a
    connection (route lookup, connect), or NotSent (lost before it was written): nothing was
    stored. After (a timeout, a connection lost once it was written): unknown."""
    if not sent or isinstance(e, (NotSent, ConnectError)):
        return NOT_STORED_SAID
    return UNKNOWN


def code_said(code: int) -> str:
    """An attempt the broker answered with `code` (not SUCCESS)."""
    if code in STORED_NOT_CONFIRMED:
        return STORED
    if code in NOT_STORED:
        return NOT_STORED_SAID
    return UNKNOWN  # OUTCOME_UNKNOWN, SYSTEM_ERROR, a code this client does not know


def settle(said) -> bool | None:
    """The send's `stored`: True if any attempt stored it, False only if every attempt
    certainly did not, else None (unknown)."""
    if STORED in said:
        return True
    if UNKNOWN in said:
        return None
    return False


class MessageIds:
    """Unique 16-byte ids: 8 random bytes per producer + a counter."""

    def __init__(self):
        self._prefix = os.urandom(8)
        self._count = itertools.count(int(time.time() * 1000) << 16)
        self._pack = struct.Struct(">Q").pack

    def next(self) -> bytes:
        return self._prefix + self._pack(next(self._count) & 0xFFFFFFFFFFFFFFFF)


class Producer(ClientBase):
    def __init__(self, bootstrap, *, send_timeout_ms: int = 3000,
                 retry_times_when_send_failed: int = 2, retry_when_outcome_unknown: bool = True,
                 failover_timeout_ms: int = 5000, **kw):
        # bootstrap: any member(s) of the broker group; a raft group's followers point to
        # the leader (NOT_LEADER), which this producer then follows by itself
        super().__init__(bootstrap, request_timeout_ms=send_timeout_ms, **kw)
        self.failover_s = failover_timeout_ms / 1000
        self.retries = retry_times_when_send_failed
        self.retry_unknown = retry_when_outcome_unknown
        self.ids = MessageIds()
        self._routes: dict[str, tuple[float, tp.Route]] = {}
        self._rr: dict[str, itertools.count] = {}
        self._topic_bytes: dict[str, bytes] = {}

    # --- routing ---------------------------------------------------------------------------

    async def _route(self, s: Session, topic: str, refresh: bool = False) -> tp.Route:
        cached = self._routes.get(topic)
        if cached is not None and not refresh and time.monotonic() - cached[0] < ROUTE_TTL_S:
            return cached[1]
        route = await s.call_json(Req.GET_ROUTE, tp.TopicName(topic), tp.Route)
        self._routes[topic] = (time.monotonic(), route)
        return route

    def _pick_queue(self, topic: str, route: tp.Route) -> int:
        rr = self._rr.get(topic)
        if rr is None:
            rr = self._rr[topic] = itertools.count(int.from_bytes(os.urandom(2), "big"))
        return next(rr) % route.write_queues

    def _checked_topic(self, topic: str) -> bytes:
        """The topic's UTF-8 bytes, refused before anything is sent if the wire or the store
        cannot take it (FieldLimitError, a ValueError: e.g. over TOPIC_BYTES_MAX bytes);
        checked once per topic (cached)."""
        tb = self._topic_bytes.get(topic)
        if tb is not None:
            return tb
        if not isinstance(topic, str):
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        tb = topic.encode()
        sp.check_topic(tb)
        if len(self._topic_bytes) < TOPICS_CACHED_MAX:
            self._topic_bytes[topic] = tb
        return tb

    # --- async API -------------------------------------------------------------------------

    async def send_async(self, topic: str, body: bytes, key=None, tags: str | None = None,
                         properties: dict | None = None, queue_id: int | None = None,
                         flags: int = 0) -> SendResult:
        """Send one message and wait for its acknowledgement."""
        tb = self._checked_topic(topic)
        props = codec.message_properties(key, tags, properties) if (key or tags or properties) else b""
        msg_id = self.ids.next()
        s = self._session()

        def build(qid: int) -> tuple:
            return sp.encode_request_parts(sp.SendRequest(topic, qid, flags, int(time.time() * 1000),
                                                          msg_id, props, body), tb)

        # fast path: route and connection known, first attempt succeeds
        first = None
        cached, conn = self._routes.get(topic), s.conn
        if cached is not None and conn is not None and not conn.closed \
                and time.monotonic() - cached[0] < ROUTE_TTL_S:
            qid = self._pick_queue(topic, cached[1]) if queue_id is None else queue_id
            try:
                f = await conn.request(Req.SEND, build(qid), self.request_timeout_s)
            except TidelogError as e:
                f = e
            if type(f) is fr.Frame and f.code == Code.SUCCESS:
                r = sp.decode_response(f.body)
                return SendResult(msg_id.hex(), topic, r.queue_id, r.queue_offset, r.phys_offset,
                                  r.index, r.store_ts_ms)
            first = (f, conn, True)
        f, attempts, unknown = await self._with_retries(s, topic, queue_id, Req.SEND, build, first)
        r = sp.decode_response(f.body)
        return SendResult(msg_id.hex(), topic, r.queue_id, r.queue_offset, r.phys_offset, r.index,
                          r.store_ts_ms, attempts, unknown)

    async def send_batch_async(self, topic: str, bodies: list[bytes], queue_id: int | None = None,
                               keys: list | None = None, tags: str | None = None) -> list[SendResult]:
        """Send messages to one queue as one write: all are stored, or none."""
        self._checked_topic(topic)
        if not bodies:
            return []
        ids = [self.ids.next() for _ in bodies]
        props = [codec.message_properties(keys[i] if keys else None, tags) for i in range(len(bodies))]
        s = self._session()

        def build(qid: int) -> bytes:
            now = int(time.time() * 1000)
            return sp.encode_batch_request(sp.SendBatchRequest(
                topic, qid, [sp.BatchMessage(0, now, ids[i], props[i], b) for i, b in enumerate(bodies)]))

        f, attempts, unknown = await self._with_retries(s, topic, queue_id, Req.SEND_BATCH, build)
        r = sp.decode_batch_response(f.body)
        return [SendResult(ids[i].hex(), topic, r.queue_id, r.first_queue_offset + i, r.phys_offsets[i],
                           r.first_index + i, r.store_ts_ms, attempts, unknown) for i in range(len(bodies))]

    async def send_oneway_async(self, topic: str, body: bytes, key=None, tags: str | None = None,
                                properties: dict | None = None, queue_id: int | None = None) -> str:
        """Fire and forget: no acknowledgement, no retry. Returns the msg_id."""
        self._checked_topic(topic)
        s = self._session()
        route = await self._route(s, topic)
        qid = self._pick_queue(topic, route) if queue_id is None else queue_id
        msg_id = self.ids.next()
        props = codec.message_properties(key, tags, properties) if (key or tags or properties) else b""
        conn = await s.connection()
        conn.oneway(Req.SEND, sp.encode_request(
            sp.SendRequest(topic, qid, 0, int(time.time() * 1000), msg_id, props, body)))
        return msg_id.hex()

    async def _attempt(self, s: Session, topic: str, queue_id: int | None, code: int, build,
                       refresh: bool):
        """One try: (the answering Frame or the exception, the connection or None, whether the
        request itself was handed to a connection: before that, nothing can have been stored)."""
        conn = None
        try:
            route = await self._route(s, topic, refresh)
            qid = self._pick_queue(topic, route) if queue_id is None else queue_id
            conn = await s.connection()
            body = build(qid)
        except TidelogError as e:
            return e, conn, False
        try:
            return await conn.request(code, body, self.request_timeout_s), conn, True
        except TidelogError as e:
            return e, conn, True

    async def _with_retries(self, s: Session, topic: str, queue_id: int | None, code: int, build,
                            first=None):
        """Try until an answer settles it (see the module docstring); `first` is the outcome of
        an attempt already made. Finding the leader (NOT_LEADER, a dead leader's refused
        connection) does not use up retries: it is bounded by `failover_timeout_ms`.
        Every error raised says stored=settle(what every attempt said), never more."""
        attempts, failures, refresh = 0, 0, False
        said: set[str] = set()
        deadline = time.monotonic() + self.failover_s
        while True:
            attempts += 1
            if first is not None:
                (outcome, conn, sent), first = first, None
            else:
                outcome, conn, sent = await self._attempt(s, topic, queue_id, code, build, refresh)
            if not isinstance(outcome, fr.Frame):
                e = outcome
                said.add(attempt_said(e, sent))
                if sent and not isinstance(e, NotSent):  # a timeout, or lost after writing
                    s.drop(conn)  # lost, or silent (a hung broker): the next try reconnects
                    failures += 1
                    if failures > self.retries or not self.retry_unknown:
                        raise SendError(Code.SYSTEM_ERROR, f"outcome unknown (may be stored): {e}",
                                        stored=settle(said), attempts=attempts) from None
                    continue
                if isinstance(e, BrokerError):  # from the route lookup
                    raise SendError(e.code, str(e), stored=settle(said), attempts=attempts) from None
                if isinstance(e, (ConnectError, NotSent)):  # this attempt certainly stored nothing
                    if conn is not None:
                        s.drop(conn)
                    # every address refused: nothing listens there, waiting will not help (a
                    # raft group that lost its leader still has members answering NOT_LEADER)
                    if getattr(e, "refused", False) or time.monotonic() > deadline:
                        raise SendConnectError(e, attempts, stored=settle(said)) from None
                    await asyncio.sleep(RETRY_BACKOFF_S * min(attempts, 4))
                    continue
                # the route lookup timed out or lost its connection: the send was not written
                failures += 1
                if failures > self.retries or time.monotonic() > deadline:
                    raise SendError(Code.SYSTEM_ERROR, f"route lookup failed: {e}",
                                    stored=settle(said), attempts=attempts) from None
                await asyncio.sleep(RETRY_BACKOFF_S * failures)
                continue
            f = outcome
            fc = f.code
            if fc == Code.SUCCESS:
                return f, attempts, UNKNOWN in said
            err = f.headers.get("error", "")
            if fc in STORED_NOT_CONFIRMED:
                result = sp.decode_response(f.body) if code == Req.SEND and len(f.body) else None
                raise SendError(fc, err, stored=True, result=result, attempts=attempts)
            said.add(code_said(fc))
            if fc in (Code.NOT_LEADER, Code.LEADER_TRANSFERRING):
                s.follow(f, conn)  # a raft group member that does not lead: go to the leader
                if time.monotonic() > deadline:
                    raise SendError(fc, f"no leader found in failover_timeout_ms: {err}",
                                    stored=settle(said), attempts=attempts)
                await asyncio.sleep(RETRY_BACKOFF_S * min(attempts, 4))
                continue
            failures += 1
            if fc not in NOT_STORED:  # e.g. the leader lost leadership before a quorum acked
                if failures > self.retries or not self.retry_unknown:
                    raise SendError(fc, f"outcome unknown (may be stored): {err}",
                                    stored=settle(said), attempts=attempts)
                continue
            retriable = fc in RETRIABLE or (fc in (Code.QUEUE_ID_INVALID, Code.TOPIC_NOT_EXIST) and not refresh)
            if not retriable or failures > self.retries:
                raise SendError(fc, err, stored=settle(said), attempts=attempts)
            refresh = fc in (Code.QUEUE_ID_INVALID, Code.TOPIC_NOT_EXIST)
            await asyncio.sleep(RETRY_BACKOFF_S * failures)

    # --- blocking API ----------------------------------------------------------------------

    def send(self, topic: str, body: bytes, key=None, tags: str | None = None,
             properties: dict | None = None, queue_id: int | None = None, flags: int = 0) -> SendResult:
        return self._run(self.send_async(topic, body, key, tags, properties, queue_id, flags))

    def send_batch(self, topic: str, bodies: list[bytes], queue_id: int | None = None,
                   keys: list | None = None, tags: str | None = None) -> list[SendResult]:
        return self._run(self.send_batch_async(topic, bodies, queue_id, keys, tags))

    def send_oneway(self, topic: str, body: bytes, key=None, tags: str | None = None,
                    properties: dict | None = None, queue_id: int | None = None) -> str:
        return self._run(self.send_oneway_async(topic, body, key, tags, properties, queue_id))

