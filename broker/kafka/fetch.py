"""Kafka's Fetch and ListOffsets over the broker's ConsumeQueues (broker/kafka/service.py's half
that reads).

Fetch reads each partition as a native PULL does (`store.get`: whole entries from the
queue offset, the first one even past the byte bound, so a consumer always progresses) and
hands back Kafka record batches: an entry a Kafka producer wrote is its stored batch, with
base_offset (the entry's first queue offset) set in place and nothing re-encoded; an entry
written natively becomes a batch encoded from its messages (key from KEYS, headers from the
other properties, an `h:<name>` property back under its own name). A batch may start
before the fetch offset: Kafka consumers skip those records, as they do for compressed
batches from Kafka. The high watermark is the queue's end: what is dispatched, which in a
raft group is only what the quorum committed.

With fewer than min_bytes to give, a Fetch waits (long poll) until the dispatcher adds to one
of its partitions or max_wait_ms runs out (capped by long_polling_max_ms), then answers what
there is.

ListOffsets: earliest (-2) and latest (-1) are the queue's bounds; a timestamp finds the
first offset stored at or after it (store time, which only grows along a queue: a binary
search reading one entry a probe).
"""

from __future__ import annotations

import time

from broker.kafka import errors as E
from broker.kafka import records as kr
from broker.store import codec, codec_kafka
from broker.store import message_store as ms

READ_MESSAGES_MAX = 8192  # queue units one partition's read looks at
FETCH_BYTES_MAX = 32 << 20  # one Fetch answer at most, whatever max_bytes says (Kafka's fetch.max.bytes)
PARTITIONS_MAX = 10_000  # partitions one Fetch may name (Kafka's clients ask for far fewer)
EARLIEST, LATEST = -2, -1


TIMESTAMP_MAX = (1 << 62) - 1  # a native born time is a u64; Kafka's timestamps are int64


def native_batch(msgs: list, base_offset: int) -> bytes:
    """A Kafka batch of Tidelog messages (consecutive queue offsets from base_offset); born
    times past what Kafka's int64 timestamps hold are clamped."""
    born = [min(m.born_ts_ms, TIMESTAMP_MAX) for m in msgs]
    base_ts = min(born)
    recs = []
    for k, m in enumerate(msgs):
        key, headers = None, []
        for name, value in (m.props().items() if m.properties else ()):
            if name == "KEYS" and key is None:
                key = value.split(" ")[0].encode()
            elif name.startswith(codec_kafka.HEADER_PREFIX):
                headers.append((name[len(codec_kafka.HEADER_PREFIX):], value.encode()))
            else:
                headers.append((name, value.encode()))
        recs.append(kr.Record(k, born[k] - base_ts, key, m.body, headers))
    return kr.encode(recs, base_offset=base_offset, base_timestamp=base_ts, leader_epoch=0)


def kafka_batches(data) -> list:
    """The Kafka record batches of whole entries read from a queue (store.get's data)."""
    out = []
    for p, meta in codec.walk2(data, read="meta"):
        if meta.magic == codec.BATCH_MAGIC and codec.is_kafka(data, p + codec.BATCH_HEAD_SIZE):
            b = bytearray(codec_kafka.batch(data, p + codec.BATCH_HEAD_SIZE, p + meta.size))
            kr.place(b, meta.base_queue_offset, 0)
            out.append(b)
        else:
            msgs = list(codec.iter_messages(data[p:p + meta.size], verify=False))
            out.append(native_batch(msgs, msgs[0].queue_offset))
    return out


class Fetcher:
    def __init__(self, broker, service):
        self.broker, self.service = broker, service
        self.poll_max_s = broker.config.long_polling_max_ms / 1000
        self.bytes_max = FETCH_BYTES_MAX
        self.parked: list = []  # [conn, h, req, slot, keys, timer]

    # --- Fetch -------------------------------------------------------------------------------

    def fetch(self, conn, h, req, slot) -> None:
        b = self.broker
        if b._dispatch_owed:
            b.dispatch_now()  # whatever this reads sees every answered send
        responses, total = self._read(conn, req)
        wait = min(req["max_wait_ms"] / 1000, self.poll_max_s)
        if total >= req["min_bytes"] or wait <= 0 or any(
                p["error_code"] for t in responses for p in t["partitions"]):
            return self._send(conn, h, slot, responses)
        cluster = self.service.cluster
        keys = {(t["topic"], cluster.local_queue(t["topic"], p["partition"])) for t in req["topics"]
                for p in t["partitions"]}
        item = [conn, h, req, slot, keys, None]
        item[5] = b.loop.call_later(wait, self._expire, item)
        self.parked.append(item)
        conn.add_inflight(1)

    def _send(self, conn, h, slot, responses) -> None:
        self.service._answer(conn, slot, h, h.api_version, {
            "throttle_time_ms": 0, "error_code": E.NONE, "session_id": 0, "responses": responses})

    def _expire(self, item) -> None:
        if item in self.parked:
            self.parked.remove(item)
            self._finish(item)

    def _finish(self, item) -> None:
        conn, h, req, slot, _, timer = item
        timer.cancel()
        conn.done_inflight(1)
        if not conn.closed:
            self._send(conn, h, slot, self._read(conn, req)[0])
            conn.flush()

    def on_dispatched(self, touched) -> None:
        """New messages in these queues: answer the parked fetches that now have min_bytes."""
        if not self.parked:
            return
        for item in [i for i in self.parked if i[4] & touched or i[0].closed]:
            if item[0].closed:
                self.parked.remove(item)
                item[5].cancel()
                item[0].done_inflight(1)
            elif self._read(item[0], item[2])[1] >= item[2]["min_bytes"]:
                self.parked.remove(item)
                self._finish(item)

    def stop(self) -> None:
        for item in self.parked:
            self._finish(item)
        self.parked.clear()

    def _read(self, conn, req) -> tuple[list, int]:
        """(the responses, the bytes they hold) of a Fetch request now. Once max_bytes (or
        fetch_bytes_max, the broker's) is spent, the other partitions are answered empty
        without being read; a partition named twice is read once; a partition whose read
        fails is answered with an error and the others are served."""
        budget = min(req["max_bytes"] if req["max_bytes"] > 0 else 1, self.bytes_max)
        out, total, seen, named = [], 0, set(), 0
        for t in req["topics"]:
            parts = []
            out.append({"topic": t["topic"], "partitions": parts})
            for p in t["partitions"]:
                named += 1
                key = (t["topic"], p["partition"])
                if total >= budget or key in seen or named > PARTITIONS_MAX:
                    parts.append(self._empty(p["partition"], E.NONE if named <= PARTITIONS_MAX else E.INVALID_REQUEST))
                    continue
                seen.add(key)
                try:
                    a = self._partition(conn, t["topic"], p["partition"], p["fetch_offset"],
                                        max(1, min(p["partition_max_bytes"], budget - total)))
                except Exception as e:  # noqa: BLE001 - a bug or a damaged entry: this partition only
                    self.service.refused(conn, f"fetch of {t['topic']}[{p['partition']}] failed: {e!r}")
                    a = self._empty(p["partition"], E.UNKNOWN_SERVER_ERROR)
                parts.append(a)
                total += sum(map(len, a["records"] or ()))
        return out, total

    @staticmethod
    def _empty(p: int, err: int) -> dict:
        return {"partition_index": p, "error_code": err, "high_watermark": -1, "last_stable_offset": -1,
                "log_start_offset": -1, "aborted_transactions": None, "preferred_read_replica": -1, "records": []}

    def _partition(self, conn, topic: str, p: int, offset: int, max_bytes: int) -> dict:
        a = {"partition_index": p, "error_code": E.NONE, "high_watermark": -1, "last_stable_offset": -1,
             "log_start_offset": -1, "aborted_transactions": None, "preferred_read_replica": -1,
             "records": []}  # (empty, never null: librdkafka cannot read a null one)
        q = self.service.cluster.local_queue(topic, p)
        err = E.NOT_LEADER_OR_FOLLOWER if q is None else self.service.partition_error(conn, topic, q, read=True)
        if err:
            a["error_code"] = err
            return a
        store = self.broker.store
        r = store.get(topic, q, offset, READ_MESSAGES_MAX, max_bytes)
        lo, hi = (r.min_offset, r.max_offset) if r.status != ms.NO_SUCH_QUEUE else (0, 0)
        a.update(high_watermark=hi, last_stable_offset=hi, log_start_offset=lo)
        if r.status in (ms.OFFSET_TOO_SMALL, ms.OFFSET_OVERFLOW):
            a["error_code"] = E.OFFSET_OUT_OF_RANGE
        elif r.status == ms.NO_SUCH_QUEUE and offset:
            a["error_code"] = E.OFFSET_OUT_OF_RANGE
        elif r.data:
            a["records"] = kafka_batches(r.data)
        return a

    # --- ListOffsets ---------------------------------------------------------------------------

    def list_offsets(self, conn, h, req, slot) -> None:
        b = self.broker
        if b._dispatch_owed:
            b.dispatch_now()
        topics = []
        for t in req["topics"]:
            parts = []
            topics.append({"name": t["name"], "partitions": parts})
            for p in t["partitions"]:
                ts = p["timestamp"]
                a = {"partition_index": p["partition_index"], "error_code": E.NONE, "timestamp": -1, "offset": -1,
                     "leader_epoch": 0}
                parts.append(a)
                q = self.service.cluster.local_queue(t["name"], p["partition_index"])
                err = E.NOT_LEADER_OR_FOLLOWER if q is None else \
                    self.service.partition_error(conn, t["name"], q, read=True)
                if err:
                    a["error_code"] = err
                    continue
                lo, hi = b.store.queue_bounds(t["name"], q)
                if ts == EARLIEST:
                    a["offset"] = lo
                elif ts == LATEST or ts < 0:
                    a["offset"] = hi
                else:
                    a["offset"], a["timestamp"] = self._offset_at(t["name"], q, lo, hi, ts)
        self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "topics": topics})

    def _stored_at(self, topic: str, q: int, offset: int) -> int:
        r = self.broker.store.get(topic, q, offset, 1, 1)
        for m in codec.iter_messages(r.data, verify=False, from_queue_offset=offset):
            return m.store_ts_ms
        return time.time_ns() // 1_000_000

    def _offset_at(self, topic: str, q: int, lo: int, hi: int, ts: int) -> tuple[int, int]:
        """(the first offset stored at or after `ts`, its store time); (-1, -1) if none."""
        while lo < hi:
            mid = (lo + hi) // 2
            if self._stored_at(topic, q, mid) < ts:
                lo = mid + 1
            else:
                hi = mid
        end = self.broker.store.queue_bounds(topic, q)[1]
        return (lo, self._stored_at(topic, q, lo)) if lo < end else (-1, -1)
