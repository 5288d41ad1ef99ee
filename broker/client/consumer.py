"""The Consumer: read a topic as part of a group, in order per queue, at least once.

Queues are shared out among the group's live members (from heartbeats, allocated evenly as
RocketMQ's AllocateMessageQueueAveragely) unless `queues=` pins them. A topic that does not
exist is an error (BrokerError TOPIC_NOT_EXIST) from the first `poll()`. Each owned queue has a
background long-polling pull that fills a bounded buffer; `poll()` hands out buffered
messages.

At-least-once: an offset is committed only for messages that `poll()` already returned,
either by `commit()` or, with `auto_commit`, at the start of a later `poll()` (and at
`close()`). A consumer that crashes after `poll()` but before the next commit gets those
messages again when it (or whoever takes its queues) restarts from the committed offset.

Master-slave groups: the consumer talks to the master; when the master is down, a slave
serves its pulls, heartbeats and commits, and the first commit after such a move carries
every owned queue's offset. With `read_from_slave` the pulls go to a slave even while the
master is up (RocketMQ's slave reads), up to what the master has confirmed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from typing import NamedTuple

from broker.client.base import ClientBase, Session
from broker.client.connection import ClientConnection, parse_bootstrap
from broker.client.errors import (BrokerError, PermissionDenied, ConnectError, ConnectionLost, CorruptMessage, NotSent,
                                  RequestTimeout)
from broker.protocol import admin as ap
from broker.protocol import jsonbody
from broker.protocol import offsets as op
from broker.protocol import pull as pp
from broker.protocol import topics as tp
from broker.protocol.codes import Code, Req
from broker.store import codec

log = logging.getLogger(__name__)

RETRY_S = 0.2


class Message(NamedTuple):
    """One message as poll() and the admin lookups hand it out. `(index, batch_pos)` names it
    in the log: messages of one record batch (TLE2) share its index, term and store time,
    and batch_pos is the place in it (0 for a message stored on its own, TLE1)."""

    topic: str
    queue_id: int
    queue_offset: int
    msg_id: str
    body: bytes
    keys: list[str]
    tags: str | None
    properties: dict[str, str]
    born_ts_ms: int
    store_ts_ms: int
    index: int
    term: int
    flags: int
    batch_pos: int = 0
    broker_name: str | None = None  # the group it came from (ClusterConsumer; None: one group)

    @classmethod
    def from_entry(cls, e) -> Message:
        """From a codec.Entry (TLE1) or a codec.Message (either format, `iter_messages`)."""
        props = codec.decode_properties(e.properties) if e.properties else {}
        keys = props.pop(codec.PROP_KEYS, "")
        tags = props.pop(codec.PROP_TAGS, None)
        return cls(e.topic, e.queue_id, e.queue_offset, e.msg_id.hex(), e.body,
                   keys.split(" ") if keys else [], tags, props, e.born_ts_ms, e.store_ts_ms,
                   e.index, e.term, e.flags, getattr(e, "batch_pos", 0))


def allocate(queues: list[int], members: list[str], me: str) -> list[int]:
    """RocketMQ's AllocateMessageQueueAveragely: contiguous, as even as possible."""
    if me not in members or not queues:
        return []
    n, m, i = len(queues), len(members), members.index(me)
    mod = n % m
    avg = 1 if n <= m else (n // m + 1 if i < mod else n // m)
    start = i * avg if i < mod else i * avg + mod
    return queues[start:start + min(avg, max(0, n - start))]


class _Queue:
    def __init__(self, queue_id: int, offset: int):
        self.queue_id = queue_id
        self.next_pull = offset  # where the next pull starts
        self.fetched = offset  # everything below was fetched (incl. filtered-out messages)
        self.delivered = offset  # everything below was returned by poll()
        self.committed = offset
        self.buffer: deque[Message] = deque()
        self.task: asyncio.Task | None = None
        self.error: Exception | None = None


class ConsumerSession(Session):
    def __init__(self, client: Consumer):
        super().__init__(client)
        self.c = client
        self.queues: dict[int, _Queue] = {}
        self.members: list[str] = []
        self.read_queues: int | None = None
        self.data = asyncio.Event()
        self.started = False
        self.heartbeat_task: asyncio.Task | None = None
        self.last_commit = time.monotonic()
        self._rotation = 0
        self.slave_conn = None  # read_from_slave: where pulls go
        self._slave_lock = asyncio.Lock()
        self.committed_via: str | None = None  # the node the last commit went to

    async def start(self) -> None:
        """The first rebalance; its errors (no broker, no such topic) are raised to poll(),
        and the next poll() tries again."""
        if self.started:
            return
        try:
            await self.rebalance()
        except BrokerError:
            if self.members:  # the heartbeat made us a member: others must not wait for us
                await self._leave()
            raise  # else it was refused (e.g. NO_PERMISSION on the group): nothing to leave
        self.started = True
        self.heartbeat_task = asyncio.create_task(self._heartbeats())

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.c.heartbeat_interval_s)
            try:
                await self.rebalance()
            except (ConnectError, NotSent, ConnectionLost, RequestTimeout, BrokerError) as e:
                log.warning("consumer %s: heartbeat failed: %s", self.c.client_id, e)

    async def rebalance(self) -> None:
        c = self.c
        # the heartbeat first: it goes to the leader / master (following NOT_LEADER), so the
        # topic is then described by the node that knows every committed topic
        hb = await self.call_json(Req.HEARTBEAT, ap.Heartbeat(c.client_id, c.group, [c.topic]),
                                  ap.GroupMembers)
        self.members = hb.members
        try:  # every time: the topic may change its queue count (or be deleted)
            info = await self.call_json(Req.DESCRIBE_TOPIC, tp.TopicName(c.topic), tp.TopicInfo)
            self.read_queues = info.read_queues
        except BrokerError as e:
            if e.code != Code.TOPIC_NOT_EXIST:
                raise
            if self.read_queues is None:  # never existed: say so now rather than wait in poll()
                raise BrokerError(Code.TOPIC_NOT_EXIST, f"topic '{c.topic}' does not exist") from None
        if self.read_queues is None:
            return
        if c.fixed_queues is not None:
            want = [q for q in c.fixed_queues if q < self.read_queues]
        else:
            want = allocate(list(range(self.read_queues)), self.members, c.client_id)
        lost = [q for q in self.queues if q not in want]
        if lost:
            await self.commit([self.queues[q] for q in lost])
            for q in lost:
                qs = self.queues.pop(q)
                if qs.task:
                    qs.task.cancel()
            log.info("consumer %s: released queues %s of %s", c.client_id, lost, c.topic)
        gained = [q for q in want if q not in self.queues]
        if gained:
            await self._take(gained)

    async def _take(self, queue_ids: list[int]) -> None:
        c = self.c
        have = await self.call_json(Req.QUERY_OFFSET, op.QueryOffsets(c.group, c.topic, queue_ids), op.Offsets)
        info = await self.call_json(Req.DESCRIBE_TOPIC, tp.TopicName(c.topic), tp.TopicInfo)
        bounds = {q.queue_id: (q.min_offset, q.max_offset) for q in info.queues}
        for q in queue_ids:
            off = have.offsets.get(q, -1)
            if off < 0:
                lo, hi = bounds.get(q, (0, 0))
                off = lo if c.from_where == "earliest" else hi
            qs = _Queue(q, off)
            self.queues[q] = qs
            qs.task = asyncio.create_task(self._pull_loop(qs))
        log.info("consumer %s: owns queues %s of %s", c.client_id, sorted(self.queues), c.topic)

    async def _pull_loop(self, qs: _Queue) -> None:
        c = self.c
        while True:
            if len(qs.buffer) >= c.buffer_messages_max:
                await asyncio.sleep(0.005)
                continue
            offset = qs.next_pull
            req = pp.encode_request(pp.PullRequest(c.topic, qs.queue_id, offset, c.pull_batch_size,
                                                   c.pull_bytes_max, c.long_poll_ms, c.tags))
            conn = None
            try:
                conn, headers = await self._pull_connection()
                f = await conn.request(Req.PULL, req, c.long_poll_ms / 1000 + c.request_timeout_s, headers)
            except (ConnectError, NotSent, ConnectionLost, RequestTimeout) as e:
                log.debug("pull %s/%d: %s", c.topic, qs.queue_id, e)
                if conn is not None and conn is self.slave_conn:
                    self.slave_conn = None
                    conn.close()
                else:
                    self.drop(conn)
                await asyncio.sleep(RETRY_S)
                continue
            if f.code == Code.SUCCESS:
                r = pp.decode_response(f.body)
                if not self._accept(qs, r, offset):
                    return
            elif f.code == Code.PULL_NOT_FOUND:
                continue
            elif f.code in (Code.NOT_LEADER, Code.LEADER_TRANSFERRING):
                self.follow(f, conn)  # the group elected another leader: pull from it
                await asyncio.sleep(RETRY_S)
            elif f.code == Code.PULL_OFFSET_MOVED:
                r = pp.decode_response(f.body)
                log.warning("consumer %s: offset %d of %s/%d is out of range [%d, %d]: moving to %d",
                            c.client_id, qs.next_pull, c.topic, qs.queue_id, r.min_offset,
                            r.max_offset, r.next_offset)
                qs.next_pull = qs.fetched = r.next_offset
                if not qs.buffer:
                    qs.delivered = r.next_offset
            elif f.code in (Code.NO_PERMISSION, Code.AUTH_FAILED):  # waiting will not change it
                qs.error = PermissionDenied(f.code, f.headers.get("error", ""))
                self.data.set()
                return
            else:
                log.warning("pull %s/%d: %s %s", c.topic, qs.queue_id, Code(f.code).name,
                            f.headers.get("error", ""))
                await asyncio.sleep(RETRY_S * 5)

    async def _pull_connection(self):
        """(connection, headers) for pulls: a slave's with `read_from_slave` (when one is
        found), else the session's own (the leader / master, or whoever serves)."""
        if not self.c.read_from_slave:
            return await self.connection(), None
        if self.slave_conn is None or self.slave_conn.closed:
            async with self._slave_lock:
                if self.slave_conn is None or self.slave_conn.closed:
                    self.slave_conn = await self._find_slave()
        if self.slave_conn is None:
            return await self.connection(), None
        return self.slave_conn, {"read_from": "slave"}

    async def _find_slave(self):
        st = await self.call_json(Req.STATUS, None)
        peers = (jsonbody.decode(dict, st.body).get("replication") or {}).get("peers") or {}
        for node, address in sorted(peers.items()):
            host, port = parse_bootstrap([address])[0]
            try:
                conn = await self.c.open_connection(host, port)
                f = await conn.request(Req.STATUS, b"{}", self.c.request_timeout_s)
            except (ConnectError, NotSent, ConnectionLost, RequestTimeout):
                continue
            if f.code == Code.SUCCESS and jsonbody.decode(dict, f.body).get("role") == "slave":
                log.info("consumer %s: pulling from slave %s (%s)", self.c.client_id, node, address)
                return conn
            conn.close()
        return None

    def _accept(self, qs: _Queue, r: pp.PullResponse, offset: int) -> bool:
        """Buffer the messages of a pull from `offset`. The body holds whole entries of either
        format: a pull from inside a record batch gets all of the batch (both its CRCs are
        checked once, whole), and the messages before `offset` are dropped here, so poll()
        hands out exactly from where it asked; the broker's next_offset is past the last
        whole batch. The tag filter is per message: a batch ships when any message matches.
        A corrupt entry stops the queue with CorruptMessage at the first offset not read."""
        wanted = self.c.tag_set
        at = offset  # the queue offset after the last message read (kept or filtered out)
        try:
            for m in codec.iter_messages(r.entries, verify=True, from_queue_offset=offset):
                at = m.queue_offset + 1
                if wanted is None or codec.tag_of(m.properties) in wanted:
                    qs.buffer.append(Message.from_entry(m))
        except codec.CorruptEntry as err:
            qs.error = CorruptMessage(self.c.topic, qs.queue_id, at, err.reason)
            self.data.set()
            return False
        qs.next_pull = qs.fetched = r.next_offset
        self.data.set()
        return True

    def take(self, max_messages: int) -> list[Message]:
        out: list[Message] = []
        queues = list(self.queues.values())
        self._rotation = (self._rotation + 1) % max(1, len(queues))
        for qs in queues[self._rotation:] + queues[:self._rotation]:  # no queue starves
            if qs.error is not None and not qs.buffer:
                raise qs.error
            n = min(len(qs.buffer), max_messages - len(out))
            for _ in range(n):
                out.append(qs.buffer.popleft())
            if n:
                qs.delivered = out[-1].queue_offset + 1
            if not qs.buffer and qs.error is None:
                qs.delivered = max(qs.delivered, qs.fetched)
            if len(out) >= max_messages:
                break
        return out

    async def commit(self, queues=None) -> None:
        queues = list(self.queues.values()) if queues is None else queues
        conn = await self.connection()
        moved = conn.address != self.committed_via  # e.g. a master's slave took over: tell it all
        todo = {q.queue_id: q.delivered for q in queues if moved or q.delivered != q.committed}
        if not todo:
            return
        await self.call_json(Req.COMMIT_OFFSET, op.CommitOffsets(self.c.group, self.c.topic, todo))
        self.committed_via = self.conn.address if self.conn is not None else None
        for q in queues:
            q.committed = todo.get(q.queue_id, q.committed)
        self.last_commit = time.monotonic()

    def seek(self, queue_id: int, offset: int) -> None:
        qs = self.queues.get(queue_id)
        if qs is None:
            raise ValueError(f"queue {queue_id} is not assigned to this consumer")
        if qs.task:
            qs.task.cancel()
        fresh = _Queue(queue_id, offset)
        fresh.committed = qs.committed
        self.queues[queue_id] = fresh
        fresh.task = asyncio.create_task(self._pull_loop(fresh))

    async def stop(self) -> None:
        if self.heartbeat_task:
            self.heartbeat_task.cancel()
        if self.slave_conn is not None:
            self.slave_conn.close()
        for qs in self.queues.values():
            if qs.task:
                qs.task.cancel()
        try:
            if self.c.auto_commit:
                await self.commit()
        except (ConnectError, NotSent, ConnectionLost, RequestTimeout, BrokerError) as e:
            log.warning("consumer %s: could not commit on close: %s", self.c.client_id, e)
        await self._leave()

    async def _leave(self) -> None:
        """Tell the group we are gone, so our queues are shared out now (best effort)."""
        try:
            await self.call_json(Req.HEARTBEAT, ap.Heartbeat(self.c.client_id, self.c.group, [self.c.topic], True))
        except (ConnectError, NotSent, ConnectionLost, RequestTimeout, BrokerError) as e:
            log.warning("consumer %s: could not leave the group: %s", self.c.client_id, e)


class Consumer(ClientBase):
    def __init__(self, bootstrap, group: str, topic: str, *, tags: str = "*",
                 from_where: str = "earliest", auto_commit: bool = True,
                 auto_commit_interval_ms: int = 5000, queues: list[int] | None = None,
                 pull_batch_size: int = 32, pull_bytes_max: int = 1 << 20,
                 long_poll_ms: int = 15_000, buffer_messages_max: int = 1000,
                 heartbeat_interval_ms: int = 3000, client_id: str | None = None,
                 read_from_slave: bool = False, **kw):
        super().__init__(bootstrap, **kw)
        if from_where not in ("earliest", "latest"):
            raise ValueError("from_where must be 'earliest' or 'latest'")
        if not group:
            raise ValueError("a consumer needs a group")
        self.group, self.topic, self.tags = group, topic, tags
        self.tag_set = pp.parse_tags(tags)
        self.from_where = from_where
        self.auto_commit = auto_commit
        self.auto_commit_interval_s = auto_commit_interval_ms / 1000
        self.fixed_queues = queues
        self.pull_batch_size = pull_batch_size
        self.pull_bytes_max = pull_bytes_max
        self.long_poll_ms = long_poll_ms
        self.buffer_messages_max = buffer_messages_max
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000
        # master-slave groups: pull from a slave (the group's master still keeps offsets
        # and membership); a slave serves what it holds, up to the master's watermark
        self.read_from_slave = read_from_slave
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{os.urandom(3).hex()}"

    def _new_session(self) -> ConsumerSession:
        return ConsumerSession(self)

    async def _before_close(self, session: Session) -> None:
        if isinstance(session, ConsumerSession) and session.started:
            await session.stop()

    # --- async API -------------------------------------------------------------------------

    async def poll_async(self, timeout_ms: int = 1000, max_messages: int = 100) -> list[Message]:
        """Messages in order per queue; [] when none arrived within timeout_ms."""
        s: ConsumerSession = self._session()
        await s.start()
        if self.auto_commit and time.monotonic() - s.last_commit >= self.auto_commit_interval_s:
            await s.commit()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            s.data.clear()
            msgs = s.take(max_messages)
            if msgs:
                return msgs
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            try:
                async with asyncio.timeout(left):  # (not wait_for: broker/tasks.py)
                    await s.data.wait()
            except TimeoutError:
                return []

    def data_event(self) -> asyncio.Event:
        """Set when messages may be waiting for this loop's poll() (ClusterConsumer waits on
        several groups' events at once, then polls without waiting: a poll is never cancelled
        once it may have taken messages)."""
        return self._session().data

    async def commit_async(self) -> None:
        """Commit the offsets of everything poll() has returned so far."""
        s: ConsumerSession = self._session()
        await s.commit()

    async def assignment_async(self) -> list[int]:
        s: ConsumerSession = self._session()
        await s.start()
        return sorted(s.queues)

    async def seek_async(self, queue_id: int, offset: int) -> None:
        s: ConsumerSession = self._session()
        await s.start()
        s.seek(queue_id, offset)

    # --- blocking API ----------------------------------------------------------------------

    def poll(self, timeout_ms: int = 1000, max_messages: int = 100) -> list[Message]:
        return self._run(self.poll_async(timeout_ms, max_messages))

    def commit(self) -> None:
        self._run(self.commit_async())

    def assignment(self) -> list[int]:
        return self._run(self.assignment_async())

    def seek(self, queue_id: int, offset: int) -> None:
        self._run(self.seek_async(queue_id, offset))
