"""The Producer: send messages, each acknowledged by the broker's flush policy.

Batching (RocketMQ's ProduceAccumulator, Kafka's accumulator): `send_nowait` hands a message
over and returns a future at once; `send_async` awaits that future. Every message handed over
in one event-loop pass (or within `linger_ms`, when above 0) leaves in one flush, grouped by
broker/client/accumulator.py: one frame per (topic, queue), cut at `batch_messages_max`
messages and `batch_bytes_max` bytes. A message with no queue_id goes to the topic's sticky
queue: a whole batch on one queue, the next batch on the next. A batch of one message is a
plain SEND; two or more are one SEND_ZONE (a record batch as the broker's CommitLog keeps
it, its CRC computed here, the broker storing it as received; SEND_BATCH to a broker from
before SEND_ZONE), stored as one write. For users:
- each message keeps its own msg_id and gets its own result: its queue offset, index and
  physical offset within the batch's consecutive run;
- a batch is acknowledged all or nothing: its messages share one outcome (the same code,
  `stored`, attempts and possible_duplicate); a retry resends the whole batch with the same
  msg_ids, so delivery stays at-least-once, as for a single message;
- within one queue, a producer's messages are stored in the order they were handed over,
  except that a retried batch may land after batches sent after it (as any retry may);
- a batch the broker refuses as MESSAGE_TOO_LARGE stored nothing: it is split in halves, sent
  one after the other (recursively, on its queue, in order), so only a message over the
  broker's message_body_bytes_max fails (alone: MESSAGE_TOO_LARGE, stored=False); when the
  refusal names the broker's batch_messages_max / batch_bytes_max below this producer's, the
  producer keeps the smaller limit and cuts its later batches to it. Batches for a queue
  whose earlier batch is being retried or split wait for it, so the queue's order holds;
- bounded: messages handed over and not yet answered may hold `buffer_bytes_max` bytes
  (Kafka's buffer.memory; as a batch counts them, per event loop). Past it, send_nowait
  raises ProducerBufferFull at once (a SendError, code SYSTEM_BUSY, stored=False) and
  send_async waits for room, at most send_timeout_ms, then raises it. A message alone
  bigger than the bound is taken when nothing else waits;
- a send cancelled before its batch is built is left out; once sent, cancelling its future
  does not take the message back;
- aclose() (on the loop the producer is used from) and close() (for the blocking API's own
  loop) send what waits and wait for every outcome. close() cannot wait on another thread's
  loop: a session on a user's loop is closed there, and then no connection is opened and no
  retry sent: a message waiting for its batch fails with SendError(NOT_CONNECTED,
  stored=False), one in flight with SendError(NOT_CONNECTED, stored=settle(its attempts):
  None once it was written).

Retries (`retry_times_when_send_failed`, RocketMQ's default 2; finding a new leader after a
failover does not count, it is bounded by `failover_timeout_ms`):
- certainly not stored (connect failure, not sent, SYSTEM_BUSY, DISK_FULL, NOT_LEADER,
  SLAVE_NOT_AVAILABLE...):
  retried, after a short back-off; but when every address refused the connection the send
  fails at once with SendConnectError (a SendError and a ConnectError, code NOT_CONNECTED,
  stored=False), and one that keeps failing to connect fails so after `failover_timeout_ms`;
  a broker with security on that closes a plain connection before answering fails it at once
  with SendAuthenticationError (code AUTH_FAILED; its error a TLSRequired naming the credentials);
- stored but not confirmed durable (FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT): never retried,
  raised as SendError(stored=True) with the result (result None, and the error says so, when
  the answer's body does not decode);
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
import random
import time
from functools import partial

from broker.client.accumulator import Accumulator, Batch, check_limits, limits_named
from broker.client.base import ClientBase, Session
from broker.client.connection import PLAIN_TO_TLS_HINT
from broker.client.errors import (BrokerError, ConnectError, ConnectionLost, NotSent, SendConnectError,
                                  SendError, TidelogError, TLSRequired)
from broker.client.outcomes import (UNKNOWN, Handed, MessageIds, ProducerBufferFull,  # noqa: F401
                                    SendResult, attempt_said, bug_error, closed_error, code_said,
                                    fail as _fail, resolve, settle)
from broker.protocol import frame as fr
from broker.protocol import send as sp
from broker.protocol import topics as tp
from broker.protocol.codes import (NOT_STORED, RETRIABLE, STORED_NOT_CONFIRMED, BadRequest, Code, Req,
                                   FieldLimitError, check_int)
from broker.store import codec

ROUTE_TTL_S = 30.0
RETRY_BACKOFF_S = 0.05
TOPICS_CACHED_MAX = 4096  # encoded topic names kept
LINGER_MS_DEFAULT = 0  # flush what is ready at the end of the loop pass, wait for nothing more
BATCH_BYTES_MAX_DEFAULT = 1 << 20  # under the broker's default batch_bytes_max (4 MiB)
BATCH_MESSAGES_MAX_DEFAULT = 1024  # the broker's default batch_messages_max
BUFFER_BYTES_MAX_DEFAULT = 32 << 20  # Kafka's buffer.memory default
# What a message adds to a SEND_BATCH besides its properties and body (broker/protocol/send.py:
# flags u32 | born_ts_ms u64 | msg_id 16 | props_len u16 | body_len u32)
BATCH_MESSAGE_HEAD_BYTES = 34


def _waiting(h: Handed) -> bool:
    return not h.fut.done()  # a future cancelled before its batch is built: left out


class ProducerSession(Session):
    """A producer's connection on one event loop, with the messages waiting for its next flush."""

    def __init__(self, client: Producer):
        super().__init__(client)
        self.loop = asyncio.get_running_loop()
        self.acc = Accumulator(client.batch_bytes_max, client.batch_messages_max, random.Random())
        self.handle: asyncio.Handle | None = None  # the flush scheduled for what waits
        self.lingering = False  # that flush waits linger_ms (not merely the end of this pass)
        self.preparing = False  # a task is finding a route or a connection; it flushes after
        self.inflight: set = set()  # requests and tasks of batches without their outcome yet
        self.tails: dict[tuple[str, int], asyncio.Task] = {}  # (topic, queue) -> its retry/split
        self.buffer_max = client.buffer_bytes_max
        self.outstanding = 0  # bytes of the batches that left the accumulator, not yet settled
        self.room: list[asyncio.Future] = []  # send_async calls waiting for buffer room
        self.closed = False  # closed: no new connection, no new attempt

    def track(self, f: asyncio.Future) -> None:
        self.inflight.add(f)
        f.add_done_callback(self.inflight.discard)

    @property
    def buffered(self) -> int:
        """Bytes handed over and not yet answered: waiting for a batch, or in one. Counted per
        batch, not per message (a done-callback per future costs more than the send)."""
        return self.acc.bytes + self.outstanding

    def release(self, size: int) -> None:
        """A batch of `size` bytes is settled (every message has its outcome, or was left out)."""
        self.outstanding -= size
        if self.room and self.buffered < self.buffer_max:
            room, self.room = self.room, []
            for w in room:
                if not w.done():
                    w.set_result(None)

    async def connection(self):
        if self.closed:
            raise ConnectError("the producer was closed", refused=True)
        conn = await super().connection()
        if self.closed:  # closed while it connected: it would never be closed
            conn.close()
            self.conn = None
            raise ConnectError("the producer was closed", refused=True)
        return conn

    def close(self) -> None:
        self.closed = True
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        for b in self.acc.drain(lambda topic: None, _waiting):  # never hang: say it was not sent
            _fail(b.items, closed_error())
        self.release(0)  # wake send_async waiting for room: they fail, closed
        super().close()


class Producer(ClientBase):
    def __init__(self, bootstrap, *, send_timeout_ms: int = 3000,
                 retry_times_when_send_failed: int = 2, retry_when_outcome_unknown: bool = True,
                 failover_timeout_ms: int = 5000, linger_ms: int = LINGER_MS_DEFAULT,
                 batch_bytes_max: int = BATCH_BYTES_MAX_DEFAULT,
                 batch_messages_max: int = BATCH_MESSAGES_MAX_DEFAULT,
                 buffer_bytes_max: int = BUFFER_BYTES_MAX_DEFAULT, **kw):
        # bootstrap: any member(s) of the broker group; a raft group's followers point to
        # the leader (NOT_LEADER), which this producer then follows by itself.
        # linger_ms: how long a handed-over message may wait for others to fill its batch;
        # batch_bytes_max / batch_messages_max: where a batch is cut (see the module docstring)
        # buffer_bytes_max: bytes handed over and not yet answered (see the module docstring)
        super().__init__(bootstrap, request_timeout_ms=send_timeout_ms, **kw)
        check_limits(batch_bytes_max, batch_messages_max)
        if not (isinstance(buffer_bytes_max, int) and buffer_bytes_max >= 1):
            raise ValueError(f"buffer_bytes_max: {buffer_bytes_max!r}, must be an int of at least 1")
        self.buffer_bytes_max = buffer_bytes_max
        if not (isinstance(linger_ms, (int, float)) and linger_ms >= 0):
            raise ValueError(f"linger_ms: {linger_ms!r}, must be a number of milliseconds >= 0")
        self.failover_s = failover_timeout_ms / 1000
        self.retries = retry_times_when_send_failed
        self.retry_unknown = retry_when_outcome_unknown
        self.linger_s = linger_ms / 1000
        self.batch_bytes_max = batch_bytes_max
        self.batch_messages_max = batch_messages_max
        self.ids = MessageIds()
        self._routes: dict[str, tuple[float, tp.Route]] = {}
        self._rr: dict[str, itertools.count] = {}
        self._topic_bytes: dict[str, bytes] = {}
        self.send_zones = True  # batches go as SEND_ZONE until a broker does not know it

    def _new_session(self) -> ProducerSession:
        return ProducerSession(self)

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

    def send_nowait(self, topic: str, body: bytes, key=None, tags: str | None = None,
                    properties: dict | None = None, queue_id: int | None = None,
                    flags: int = 0, _msg_id: bytes | None = None) -> asyncio.Future:
        """Hand one message over and return at once a future of its SendResult (or of the
        SendError send_async would raise). Call it on a running event loop; what the wire
        cannot carry (a bad topic, properties, flags, queue_id) is refused here, at once.
        (_msg_id: the id of an earlier attempt elsewhere, broker/client/cluster.py's retries.)"""
        if topic not in self._topic_bytes:  # (checked once per topic)
            self._checked_topic(topic)
        props = codec.message_properties(key, tags, properties) if (key or tags or properties) else b""
        if len(props) > codec.PROPS_BYTES_MAX:
            raise FieldLimitError("properties", f"{len(props)} bytes", f"PROPS_BYTES_MAX={codec.PROPS_BYTES_MAX}")
        if type(body) is not bytes and not isinstance(body, (bytearray, memoryview)):
            raise TypeError(f"body must be bytes, not {type(body).__name__}")
        if flags and not (type(flags) is int and 0 <= flags <= 0xFFFFFFFF):
            check_int("flags", flags, 0, 0xFFFFFFFF)
        if queue_id is not None:
            check_int("queue_id", queue_id, -2**31, 2**31 - 1)
        s = self._sessions.get(asyncio.get_running_loop()) or self._session()
        size = BATCH_MESSAGE_HEAD_BYTES + len(props) + len(body)
        acc = s.acc
        buffered = acc.bytes + s.outstanding  # s.buffered, inline: this runs per message
        if buffered and buffered + size > s.buffer_max:
            raise ProducerBufferFull(f"{buffered} bytes handed over wait for their answers; "
                                     f"{size} more would pass buffer_bytes_max={s.buffer_max}")
        fut = s.loop.create_future()
        acc.add(topic, queue_id, size, Handed(fut, _msg_id or self.ids.next(), flags, props, body))
        if s.handle is None:
            s.lingering = bool(self.linger_s)
            s.handle = (s.loop.call_later(self.linger_s, self._flush, s) if s.lingering
                        else s.loop.call_soon(self._flush, s))
        elif s.lingering and acc.full():  # a whole batch is ready: lingering gains nothing
            s.handle.cancel()
            s.lingering = False
            s.handle = s.loop.call_soon(self._flush, s)
        return fut

    async def send_async(self, topic: str, body: bytes, key=None, tags: str | None = None,
                         properties: dict | None = None, queue_id: int | None = None,
                         flags: int = 0) -> SendResult:
        """Send one message and wait for its acknowledgement (in a batch with the messages
        handed over in the same loop pass: asyncio.gather over send_async batches too).
        When buffer_bytes_max bytes wait for answers, it waits for room first."""
        args = (topic, body, key, tags, properties, queue_id, flags)
        try:
            fut = self.send_nowait(*args)
        except ProducerBufferFull:
            fut = await self._when_room(args)
        return await fut

    async def _when_room(self, args) -> asyncio.Future:
        s = self._session()
        deadline = s.loop.time() + self.request_timeout_s
        while True:
            left = deadline - s.loop.time()
            w = s.loop.create_future()
            s.room.append(w)
            if left > 0:
                await asyncio.wait([w], timeout=left)
            if not w.done():
                w.cancel()
                raise ProducerBufferFull(f"no room within send_timeout_ms: {s.buffered} bytes handed "
                                         f"over wait for their answers (buffer_bytes_max={s.buffer_max})")
            if s.closed:
                raise closed_error()
            try:
                return self.send_nowait(*args)
            except ProducerBufferFull:
                continue

    # --- batches: the fast path, and a task when it does not do ---------------------------

    def _flush(self, s: ProducerSession) -> None:
        """Send every waiting message, batched. With the routes cached and the connection up
        each batch is one request resolved by a callback; otherwise one task first finds
        them (and flushes again), so the batches still leave in order."""
        s.handle = None
        if s.preparing or not s.acc.count:
            return
        conn, routes, now = s.conn, self._routes, time.monotonic()
        for topic in s.acc.topics():
            cached = routes.get(topic)
            if cached is None or now - cached[0] >= ROUTE_TTL_S:
                conn = None
        if conn is None or conn.closed:
            s.preparing = True
            s.track(s.loop.create_task(self._prepare(s)))
            return
        tails = s.tails
        for b in s.acc.drain(lambda topic: routes[topic][1].write_queues, _waiting):
            s.outstanding += b.size  # released once the batch is settled (_send_now, _retry)
            tail = tails.get((b.topic, b.queue_id)) if tails else None
            if tail is None:
                self._send_now(s, conn, b)
            else:  # the queue's earlier batch is being retried or split: after it, in order
                self._retry(s, b, None, after=tail)
        conn.flush()  # everything ready this pass is queued: no second pass to write it

    async def _prepare(self, s: ProducerSession) -> None:
        """Look up the routes and the connection the waiting messages need, then flush. A
        lookup that fails is the first attempt of its batches (nothing was sent: stored=False
        unless a retry stores it) and they go on in their own tasks, as send_async did."""
        failed: dict[str | None, TidelogError] = {}  # topic (None: every topic) -> the error
        try:
            try:
                for topic in s.acc.topics():
                    try:
                        await self._route(s, topic)
                    except ConnectError as e:
                        failed[None] = e
                        break
                    except TidelogError as e:
                        failed[topic] = e
                if None not in failed:
                    await s.connection()
            except TidelogError as e:
                failed[None] = e
            finally:
                s.preparing = False
            if not failed:
                return self._flush(s)
            routes = self._routes
            queues = lambda topic: routes[topic][1].write_queues if topic in routes else None
            for b in s.acc.drain(queues, _waiting):
                s.outstanding += b.size  # released when its _retry task ends
                e = failed.get(None) or failed.get(b.topic)
                self._retry(s, b, (e, None, False) if e is not None else None)
        except Exception as e:  # a bug: never leave a future hanging, nor an unretrieved error
            for b in s.acc.drain(lambda topic: None, _waiting):
                _fail(b.items, bug_error(e, stored=False))
        except BaseException as e:  # cancelled (the loop ending)
            for b in s.acc.drain(lambda topic: None, _waiting):
                _fail(b.items, e)
            raise

    def _builder(self, b: Batch):
        """(request code, build(queue_id) -> body): the batch's frame for one attempt."""
        topic, items = b.topic, b.items
        if len(items) == 1:  # the same bytes as a lone send_async always sent
            h = items[0]
            tb = self._topic_bytes.get(topic)
            return Req.SEND, lambda qid: sp.encode_request_parts(sp.SendRequest(
                topic, qid, h.flags, int(time.time() * 1000), h.msg_id, h.props, h.body), tb)

        def build(qid: int) -> bytes:
            now = int(time.time() * 1000)
            return sp.encode_batch_request(sp.SendBatchRequest(
                topic, qid, [sp.BatchMessage(h.flags, now, h.msg_id, h.props, h.body) for h in items]))
        if not self.send_zones:
            return Req.SEND_BATCH, build
        tb = self._topic_bytes.get(topic) or topic.encode()

        def zone(qid: int) -> tuple:
            return sp.encode_zone_request(tb, qid, int(time.time() * 1000), items)
        zone.v1 = build  # what an older broker, which answers REQUEST_CODE_NOT_SUPPORTED, takes
        return Req.SEND_ZONE, zone

    def _send_now(self, s: ProducerSession, conn, b: Batch) -> None:
        code, build = self._builder(b)
        try:
            body = build(b.queue_id)
        except Exception as e:  # checked at hand-over; a FieldLimitError here is a bug
            s.release(b.size)
            return _fail(b.items, e)
        # answered in the pass the answer arrives (on_done), written by _flush's conn.flush()
        rf = conn.request(code, body, self.request_timeout_s,
                          on_done=partial(self._answered, s, conn, b, code, build), flush=False)
        if not rf.done():
            s.inflight.add(rf)

    def _answered(self, s: ProducerSession, conn, b: Batch, code: int, build, rf: asyncio.Future) -> None:
        s.inflight.discard(rf)
        e = ConnectionLost("request cancelled") if rf.cancelled() else rf.exception()
        if e is None:
            f = rf.result()
            if f.code == Code.SUCCESS:
                s.release(b.size)
                return resolve(b, code, f, 1, False)
            e = f
        elif not isinstance(e, TidelogError):
            s.release(b.size)
            return _fail(b.items, e)
        self._retry(s, b, (e, conn, True), code, build)

    def _retry(self, s: ProducerSession, b: Batch, first, code: int | None = None, build=None,
               after: asyncio.Task | None = None) -> None:
        """The batch goes on in a task (after `after`): retries as the module docstring says.
        Later batches for its queue wait for that task (s.tails), so they stay behind it."""
        if code is None:
            code, build = self._builder(b)
        task = s.loop.create_task(self._settle(s, b, code, build, first, after))
        s.track(task)
        task.add_done_callback(lambda t: s.release(b.size))  # counted when it left the accumulator
        if b.queue_id is not None:
            key = (b.topic, b.queue_id)
            s.tails[key] = task
            task.add_done_callback(lambda t: s.tails.pop(key) if s.tails.get(key) is t else None)

    async def _settle(self, s: ProducerSession, b: Batch, code: int, build, first, after=None) -> None:
        """The batch's outcome; a MESSAGE_TOO_LARGE refusal sends its halves, one after the other."""
        if after is not None:
            await asyncio.wait([after])
        todo = [(b, code, build, first)]
        while todo:
            b, code, build, first = todo.pop()
            try:
                f, attempts, unknown = await self._with_retries(
                    s, b.topic, None if b.sticky else b.queue_id, code, build, first)
            except SendError as e:
                if e.code == Code.MESSAGE_TOO_LARGE and e.stored is False and len(b.items) > 1:
                    self._lower_limits(str(e))
                    half = len(b.items) // 2  # nothing stored: halves, on its queue, in order
                    for items in (b.items[half:], b.items[:half]):  # a stack: first half first
                        items = [h for h in items if not h.fut.done()]
                        if items:
                            part = b._replace(items=items, sticky=b.queue_id is None)
                            todo.append((part, *self._builder(part), None))
                    continue
                _fail(b.items, e)
                continue
            except Exception as e:  # a bug: each message says so, nothing escapes the task
                _fail(b.items, bug_error(e, stored=None))
                continue
            except BaseException as e:  # cancelled: this batch and the parts not sent yet
                for part, *_ in [(b,)] + todo:
                    _fail(part.items, e)
                raise
            resolve(b, code, f, attempts, unknown)

    def _lower_limits(self, refusal: str) -> None:
        """A broker's batch limits below this producer's: keep them, cut later batches to them."""
        named = limits_named(refusal)
        if not named:
            return  # one message too large, not the batch
        self.batch_messages_max = min(self.batch_messages_max, named.get("batch_messages_max", 1 << 16))
        self.batch_bytes_max = min(self.batch_bytes_max, named.get("batch_bytes_max", 1 << 62))
        for ses in list(self._sessions.values()):
            ses.acc.lower_limits(self.batch_bytes_max, self.batch_messages_max)

    async def _before_close(self, s: ProducerSession) -> None:
        """Send what waits, and wait until every batch has its outcome."""
        if s.handle is not None:
            s.handle.cancel()
        self._flush(s)
        while s.inflight:
            await asyncio.wait(list(s.inflight))

    async def send_batch_async(self, topic: str, bodies: list[bytes], queue_id: int | None = None,
                               keys: list | None = None, tags: str | None = None) -> list[SendResult]:
        """Send messages to one queue as one write: all are stored, or none (never split, never
        coalesced with other sends). Raises the batch's SendError."""
        self._checked_topic(topic)
        if not bodies:
            return []
        s = self._session()
        items = [Handed(s.loop.create_future(), self.ids.next(), 0,
                        codec.message_properties(keys[i] if keys else None, tags), body)
                 for i, body in enumerate(bodies)]
        b = Batch(topic, queue_id, queue_id is None, items, 0)
        code, build = self._builder(b)
        f, attempts, unknown = await self._with_retries(s, topic, queue_id, code, build)
        resolve(b, code, f, attempts, unknown)  # each message's result (or the same error)
        errors = [h.fut.exception() for h in items]  # (all retrieved: all set alike)
        if errors[0] is not None:
            raise errors[0]
        return [h.fut.result() for h in items]

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

    async def _with_retries(self, s: ProducerSession, topic: str, queue_id: int | None, code: int, build,
                            first=None):
        """Try until an answer settles it (see the module docstring); `first` is the outcome of
        an attempt already made. Finding the leader (NOT_LEADER, a dead leader's refused
        connection) does not use up retries: it is bounded by `failover_timeout_ms`.
        Every error raised says stored=settle(what every attempt said), never more."""
        attempts, failures, refresh = 0, 0, False
        said: set[str] = set()
        deadline = time.monotonic() + self.failover_s
        while True:
            if first is None and s.closed:  # closed: no new attempt (nor connection)
                raise closed_error(settle(said), attempts)
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
                if getattr(e, "plain_to_tls", False):  # a TLS-only broker: nothing to retry
                    where = str(e).removesuffix(PLAIN_TO_TLS_HINT) + PLAIN_TO_TLS_HINT.split(" (")[0]
                    raise SendConnectError(TLSRequired(where), attempts, stored=settle(said)) from None
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
                decode = sp.decode_response if code == Req.SEND else sp.decode_batch_response
                try:
                    result = decode(f.body) if len(f.body) else None  # where it was stored
                except BadRequest as e:
                    result, err = None, f"{err} (stored; where is unknown, the answer does not decode: {e})"
                raise SendError(fc, err, stored=True, result=result, attempts=attempts)
            if fc == Code.REQUEST_CODE_NOT_SUPPORTED and code == Req.SEND_ZONE:
                self.send_zones = False  # a broker from before SEND_ZONE: SEND_BATCH from now on
                code, build = Req.SEND_BATCH, build.v1
                attempts -= 1  # nothing stored, nothing tried that counts
                continue
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

