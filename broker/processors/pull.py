"""PULL: read a queue by offset; when there is nothing new, hold the request (long polling)
until the dispatcher adds to that queue or `suspend_ms` (capped by `long_polling_max_ms`)
runs out, as RocketMQ's PullRequestHoldService does."""

from __future__ import annotations

import time

from broker.security.acl import may_sub
from broker.security.guard import Guard
from broker.protocol import pull as pp
from broker.protocol.codes import BadRequest, Code
from broker.store import codec
from broker.store import message_store as ms


class PullProcessor:
    def __init__(self, broker):
        self.broker = broker
        cfg = broker.config
        self.max_messages = cfg.pull_messages_max
        self.max_bytes = cfg.pull_bytes_max
        self.poll_max_s = cfg.long_polling_max_ms / 1000
        # (topic, queue_id) -> [(deadline, conn, frame, request, tag_hashes)]
        self.parked: dict[tuple[str, int], list] = {}

    def handle(self, conn, f) -> None:
        req = pp.decode_request(f.body)
        Guard.require(may_sub(conn.principal, req.topic))
        self.broker.serve_or_raise("read", f.headers)
        cfg = self.broker.topics.get(req.topic)
        if cfg is None:
            return conn.respond(f, Code.TOPIC_NOT_EXIST, error=f"topic {req.topic} does not exist")
        if not cfg.readable:
            return conn.respond(f, Code.NO_PERMISSION, error=f"topic {req.topic} is not readable")
        if not 0 <= req.queue_id < cfg.read_queues:
            return conn.respond(f, Code.QUEUE_ID_INVALID, error=f"queue {req.queue_id} of topic "
                                f"{req.topic}: it has {cfg.read_queues} read queues")
        if req.max_messages < 1 or req.max_bytes < 1:
            raise BadRequest("max_messages and max_bytes must be positive")
        tags = pp.parse_tags(req.tags)
        hashes = None if tags is None else frozenset(codec.tag_hash(t) for t in tags)
        if self._answer(conn, f, req, hashes):
            return
        if req.suspend_ms > 0:
            deadline = time.monotonic() + min(req.suspend_ms / 1000, self.poll_max_s)
            self.parked.setdefault((req.topic, req.queue_id), []).append((deadline, conn, f, req, hashes))
            conn.add_inflight(1)
        else:
            self._not_found(conn, f, req)

    def _answer(self, conn, f, req: pp.PullRequest, hashes) -> bool:
        """Answer if there is something to say now; False when the queue has nothing new."""
        r = self.broker.store.get(req.topic, req.queue_id, req.queue_offset,
                                  min(req.max_messages, self.max_messages),
                                  min(req.max_bytes, self.max_bytes), hashes)
        if r.status in (ms.FOUND, ms.NO_MATCHED_MESSAGE):
            code = Code.SUCCESS
        elif r.status in (ms.OFFSET_TOO_SMALL, ms.OFFSET_OVERFLOW):
            code = Code.PULL_OFFSET_MOVED
        else:
            return False
        conn.respond(f, code, pp.encode_response(
            pp.PullResponse(r.next_offset, r.min_offset, r.max_offset, r.count, r.data)))
        return True

    def _not_found(self, conn, f, req) -> None:
        lo, hi = self.broker.store.queue_bounds(req.topic, req.queue_id)
        conn.respond(f, Code.PULL_NOT_FOUND, pp.encode_response(
            pp.PullResponse(req.queue_offset, lo, hi, 0, b"")))

    def on_dispatched(self, touched) -> None:
        """New messages in these queues: answer the pulls parked on them that now have some."""
        self._sweep([k for k in touched if k in self.parked],
                    lambda item: self._answer(item[1], item[2], item[3], item[4]))

    def tick(self, now: float, everything: bool = False) -> None:
        """Answer PULL_NOT_FOUND to the parked pulls whose long poll ran out (all, on shutdown)."""
        def expire(item) -> bool:
            if everything or item[0] <= now:
                self._not_found(item[1], item[2], item[3])
                return True
            return False
        self._sweep(list(self.parked), expire)

    def _sweep(self, keys, answered) -> None:
        """Offer each parked pull under `keys` to `answered` (True: it was answered); keep
        the others parked; drop those whose connection closed; flush each connection once."""
        conns = set()
        for key in keys:
            keep = []
            for item in self.parked[key]:
                conn = item[1]
                if conn.closed:
                    continue
                if answered(item):
                    conn.done_inflight(1)
                    conns.add(conn)
                else:
                    keep.append(item)
            if keep:
                self.parked[key] = keep
            else:
                del self.parked[key]
        for c in conns:
            c.flush()
