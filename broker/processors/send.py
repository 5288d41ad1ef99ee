"""SEND / SEND_BATCH / SEND_ZONE: validate, append as one write, acknowledge by the flush policy.

Every send frame read in one go from one connection becomes one `store.put` (one CommitLog
write). With `flush: async` the answers go out at once; with `flush: sync` they wait in
`waiters` (ordered by CommitLog offset, and so by deadline) until the flusher reports the
offset durable, or answer FLUSH_DISK_TIMEOUT (stored, not yet confirmed durable) after
`sync_flush_timeout_ms`. In a raft group, or on a SYNC master, the answers wait instead for
the replication driver (`broker.repl.append`) to say the replicas hold them.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from functools import partial

from broker.protocol import frame as fr
from broker.protocol import send as sp
from broker.protocol.codes import BadRequest, Code, Req
from broker.store import codec
from broker.store.commitlog import StoreNotWritable
from broker.store.files import DiskFull
from broker.topics import TopicError
from replication.errors import NotLeader, SlaveNotAvailable
from broker.system import topic_entry

log = logging.getLogger(__name__)

REFUSAL_LOG_S = 5.0


class Reject(Exception):
    def __init__(self, code: Code, message: str):
        self.code = code
        super().__init__(message)


class Refused(Reject):
    """Nothing was stored (not the leader, no slave in sync, disk full, ...); `headers` for
    the native answer (the leader's address)."""

    def __init__(self, code: Code, message: str, headers: dict | None = None):
        super().__init__(code, message)
        self.headers = headers


class SendProcessor:
    def __init__(self, broker):
        self.broker = broker
        cfg = broker.config
        self.body_max = cfg.message_body_bytes_max
        self.batch_max = cfg.batch_messages_max
        self.batch_bytes_max = cfg.batch_bytes_max
        self.zone_max = cfg.zone_bytes_max
        self.sync = cfg.flush == "sync"
        self.timeout_s = cfg.sync_flush_timeout_ms / 1000
        # (end_offset, deadline, conn, reply(code, error), answers in flight) in offset order
        self.waiters: deque = deque()
        self.batches = 0  # store.put calls: messages / batches = the mean batch size
        self._logged: dict[Code, float] = {}  # when a refusal of each code was last logged

    def check_send(self, topic: str, queue_id: int, body_len: int, props_len: int) -> None:
        """A send to `topic`:`queue_id` may be stored here (auto-creating the topic when that
        is on); raises Reject naming why not. Every protocol's sends pass here."""
        cfg = self.broker.topics.get(topic)
        if cfg is None:
            repl = self.broker.repl
            if not repl.accepting_writes:
                return  # the send is refused as a whole below (NOT_LEADER)
            try:
                cfg = self.broker.topics.get_or_auto_create(topic)
            except TopicError as e:
                raise Reject(Code.BAD_REQUEST, str(e)) from None
            if cfg is None:
                raise Reject(Code.TOPIC_NOT_EXIST, f"topic {topic} does not exist and "
                             "auto_create_topic_enable is off")
            repl.share_auto_created(*topic_entry(cfg))
        if not cfg.writable:
            raise Reject(Code.NO_PERMISSION, f"topic {topic} is not writable (perm {cfg.perm})")
        if not 0 <= queue_id < cfg.write_queues:
            raise Reject(Code.QUEUE_ID_INVALID,
                         f"queue {queue_id} of topic {topic}: it has {cfg.write_queues} write queues")
        if body_len > self.body_max:
            raise Reject(Code.MESSAGE_TOO_LARGE, f"message body of {body_len} bytes exceeds "
                         f"message_body_bytes_max={self.body_max}")
        if props_len > codec.PROPS_BYTES_MAX:
            raise Reject(Code.MESSAGE_TOO_LARGE, f"properties of {props_len} bytes exceed "
                         f"{codec.PROPS_BYTES_MAX}")

    def handle(self, conn, frames: list[fr.Frame]) -> None:
        items: list = []  # SendRequests / PutItems / ZoneItems: what the store appends
        accepted: list[tuple[fr.Frame, int, int]] = []  # (frame, number of messages, queue)
        checked: set = set()  # (topic, queue_id) already found writable in this batch
        body_max = self.body_max
        props_max = codec.PROPS_BYTES_MAX
        decode = sp.decode_request
        for f in frames:
            try:
                if f.code == Req.SEND:
                    r = decode(f.body)
                    # the per-message bounds are checked for every SEND; only the topic's
                    # (auth, writable, queue) are taken as checked for the rest of the read
                    if (r.topic, r.queue_id) not in checked or len(r.body) > body_max or \
                            len(r.properties) > props_max:
                        self._may_pub(conn, r.topic)
                        self.check_send(r.topic, r.queue_id, len(r.body), len(r.properties))
                        checked.add((r.topic, r.queue_id))
                    items.append(r)
                    accepted.append((f, 1, r.queue_id))
                elif f.code == Req.SEND_ZONE:
                    z = self._zone_item(conn, f)
                    items.append(z)
                    accepted.append((f, z.count, z.queue_id))
                else:
                    batch = self._batch_items(conn, f)
                    items += batch
                    accepted.append((f, len(batch), batch[0].queue_id))
            except Reject as e:
                conn.respond(f, e.code, error=str(e))
            except BadRequest as e:
                conn.respond(f, Code.BAD_REQUEST, error=str(e))
        if not items:
            return

        def answering(batch) -> tuple:
            """(reply(code, error), answers it sends): what the stored batch is answered with."""
            qoffs, phys = batch.queue_offsets, batch.phys_offsets
            indexes, ts = batch.indexes, batch.store_ts_ms
            answers, k, Resp = [], 0, sp.SendResponse
            for f, n, qid in accepted:
                if not f.flags & fr.FLAG_ONEWAY:
                    if f.code == Req.SEND:
                        answers.append((f, Resp(qid, qoffs[k], phys[k], indexes[k], ts)))
                    else:  # message i's index: first_index + the entries begun before it
                        answers.append((f, sp.SendBatchResponse(qid, qoffs[k], indexes[k], ts, phys[k:k + n])))
                k += n
            return partial(self._answer, conn, answers), len(answers)
        try:
            self.put(conn, items, answering)
        except Refused as e:
            self._refuse(conn, accepted, e.code, str(e), e.headers)

    def put(self, conn, items: list, answering) -> None:
        """Append `items` as one write and have them answered once they are acknowledged: by
        the replicas (raft, a SYNC master: `repl.append` calls back), by the fsync (`flush:
        sync`), or at once. `answering(batch)` -> (reply(code, error), how many answers it
        sends: what `conn` counts in flight meanwhile; 0: nothing to answer). The one store
        path of every protocol (native frames, Kafka's Produce). Raises Refused, storing nothing."""
        repl = self.broker.repl
        reply = None
        n = 0
        early: list = []  # an outcome that came before `reply` was made

        def done(code: int, err: str | None) -> None:
            if reply is not None:
                self._replicated(conn, reply, n, code, err)
            else:
                early.append((code, err))
        try:
            # raft / a SYNC master: answered once the replicas hold them (a later loop pass;
            # `early` if a replication calls `done` before append returns, e.g. failing)
            batch, waits = repl.append(items, done)
        except NotLeader as e:
            raise Refused(e.code, f"not stored: {e}", {"leader": e.leader_address} if e.leader_address else None)
        except SlaveNotAvailable as e:
            raise Refused(Code.SLAVE_NOT_AVAILABLE, f"not stored: {e}") from None
        except DiskFull as e:
            raise Refused(Code.DISK_FULL, f"not stored: {e.strerror or e}") from None
        except StoreNotWritable as e:
            raise Refused(Code.STORE_NOT_WRITABLE, f"not stored: {e}") from None
        self.broker.stats_sent += len(batch.queue_offsets)
        self.batches += 1
        reply, n = answering(batch)
        if early:
            reply(*early[0])
        elif waits:
            conn.add_inflight(n)
        elif self.sync:
            if n:
                self.waiters.append((batch.end_offset, time.monotonic() + self.timeout_s, conn, reply, n))
                conn.add_inflight(n)
            self.broker.flusher.request()
        else:
            reply(Code.SUCCESS, None)
            self.broker.schedule_dispatch()

    @staticmethod
    def _replicated(conn, reply, n: int, code: int, error: str | None) -> None:
        conn.done_inflight(n)
        if not conn.closed:
            reply(code, error)
            conn.flush()

    def _may_pub(self, conn, topic: str) -> None:
        why = self.broker.guard.may_pub(conn, topic)
        if why is not None:
            raise Reject(Code.NO_PERMISSION, why)

    def _batch_items(self, conn, f) -> list:
        """A SEND_BATCH's messages as the store's items (one topic, one queue)."""
        topic, queue_id, items = sp.decode_batch_entries(f.body)
        self._check_batch(conn, topic, queue_id, [len(m.body) for m in items],
                          max(len(m.properties) for m in items))
        return items

    def _zone_item(self, conn, f):
        """A SEND_ZONE as the store's ZoneItem (its CRC and records' framing checked on
        decode), within what one entry may hold (segments, frames, replicas' bounds)."""
        z = sp.decode_zone_request(f.body)
        self._check_batch(conn, z.topic, z.queue_id, z.bodies, z.props_max)
        if len(z.zone) > self.zone_max:
            # named as a batch_bytes_max a producer adopts (it counts 34 bytes a message, a
            # zone 38, plus the zone's head and topic)
            fits = max(1, self.zone_max - 264 - 4 * self.batch_max)
            raise Reject(Code.MESSAGE_TOO_LARGE, f"record batch of {len(z.zone)} bytes exceeds what one "
                         f"entry holds here ({self.zone_max} bytes): send at most batch_bytes_max={fits}")
        return z

    def _check_batch(self, conn, topic: str, queue_id: int, bodies: list[int], props_max: int) -> None:
        """A batch checked as a whole: PUB, the topic and queue once, its size, the limits
        against its largest message."""
        self._may_pub(conn, topic)
        if len(bodies) > self.batch_max:
            raise Reject(Code.MESSAGE_TOO_LARGE, f"batch of {len(bodies)} messages "
                         f"exceeds batch_messages_max={self.batch_max}")
        total = sum(bodies)
        if total > self.batch_bytes_max:
            raise Reject(Code.MESSAGE_TOO_LARGE, f"batch of {total} body bytes exceeds "
                         f"batch_bytes_max={self.batch_bytes_max}")
        self.check_send(topic, queue_id, max(bodies), props_max)

    @staticmethod
    def _answer(conn, answers, code: Code, error: str | None = None) -> None:
        ok = sp.encode_ok_frame
        for f, r in answers:
            if code == Code.SUCCESS and type(r) is sp.SendResponse:
                conn.queue(ok(f.corr_id, f.version, r))
            elif type(r) is sp.SendResponse:
                conn.respond(f, code, sp.encode_response(r), error=error)
            else:
                conn.respond(f, code, sp.encode_batch_response(r), error=error)

    def _refuse(self, conn, accepted, code: Code, message: str, headers: dict | None = None) -> None:
        if code not in (Code.NOT_LEADER, Code.LEADER_TRANSFERRING):
            now = time.monotonic()
            if now - self._logged.get(code, -REFUSAL_LOG_S) >= REFUSAL_LOG_S:  # not per send
                self._logged[code] = now
                log.warning("send refused (%s): %s", code.name, message)
        for f, *_ in accepted:
            conn.respond(f, code, error=message, headers=headers)

    # --- flush completions (event-loop thread) -------------------------------------------

    def on_flushed(self, flushed_offset: int, error: Exception | None) -> None:
        touched = set()
        w = self.waiters
        while w and w[0][0] <= flushed_offset:
            _, _, conn, reply, n = w.popleft()
            reply(Code.SUCCESS, None)
            conn.done_inflight(n)
            touched.add(conn)
        if error is not None:
            self._expire(float("inf"), f"fsync failed: {error}", touched)
        for conn in touched:
            conn.flush()

    def tick(self, now: float) -> None:
        touched = set()
        self._expire(now, None, touched)
        for conn in touched:
            conn.flush()

    def _expire(self, now: float, why: str | None, touched: set) -> None:
        w = self.waiters
        while w and w[0][1] <= now:
            _, _, conn, reply, n = w.popleft()
            msg = why or f"stored, but not fsynced within sync_flush_timeout_ms={int(self.timeout_s * 1000)}"
            reply(Code.FLUSH_DISK_TIMEOUT, msg)
            conn.done_inflight(n)
            touched.add(conn)
