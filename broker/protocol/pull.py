"""PULL: consuming a queue by offset, with long polling.

PULL request body (big-endian):
    off  size  field
      0     4  queue_id
      4     8  queue_offset     where to read from
     12     4  max_messages
     16     4  max_bytes        the broker stops after this many bytes (at least one message)
     20     4  suspend_ms       long polling: wait up to this long for new messages
     24     1  topic_len
     25     2  filter_len
     27        topic | filter ("" for all, or tags joined by "||")

PULL response body (codes SUCCESS, PULL_NOT_FOUND, PULL_OFFSET_MOVED):
      0     8  next_offset      where the next pull should start
      8     8  min_offset       the queue's bounds now
     16     8  max_offset
     24     4  count            entries that follow
     28        entries, whole and in queue order, in the CommitLog codec (store/codec.py)
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from broker.protocol.codes import BadRequest, FieldLimitError, check_int, check_len
from broker.store.codec import TOPIC_BYTES_MAX

FILTER_BYTES_MAX = 0xFFFF  # filter_len u16

_REQ = struct.Struct(">iQIIIBH")
_RESP = struct.Struct(">QQQI")


class PullRequest(NamedTuple):
    topic: str
    queue_id: int
    queue_offset: int
    max_messages: int
    max_bytes: int
    suspend_ms: int
    tags: str = ""


class PullResponse(NamedTuple):
    next_offset: int
    min_offset: int
    max_offset: int
    count: int
    entries: bytes


def encode_request(r: PullRequest) -> bytes:
    """Raises FieldLimitError for a field over its limit (a topic over TOPIC_BYTES_MAX...)."""
    t, f = r.topic.encode(), r.tags.encode()
    if not 0 < len(t) <= TOPIC_BYTES_MAX:
        raise FieldLimitError("topic", f"{len(t)} bytes", f"1..{TOPIC_BYTES_MAX} (TOPIC_BYTES_MAX)")
    check_len("tag filter", f, FILTER_BYTES_MAX, "FILTER_BYTES_MAX")
    try:
        return _REQ.pack(r.queue_id, r.queue_offset, r.max_messages, r.max_bytes, r.suspend_ms,
                         len(t), len(f)) + t + f
    except struct.error:
        check_int("queue_id", r.queue_id, -2**31, 2**31 - 1)
        check_int("queue_offset", r.queue_offset, 0, 2**64 - 1)
        for name in ("max_messages", "max_bytes", "suspend_ms"):
            check_int(name, getattr(r, name), 0, 2**32 - 1)
        raise


def decode_request(buf: bytes) -> PullRequest:
    try:
        qid, off, maxn, maxb, susp, tlen, flen = _REQ.unpack_from(buf)
        p = _REQ.size
        if p + tlen + flen != len(buf) or tlen == 0:
            raise BadRequest("PULL body length does not match its topic and filter")
        if tlen > TOPIC_BYTES_MAX:
            raise BadRequest(f"topic of {tlen} bytes exceeds TOPIC_BYTES_MAX={TOPIC_BYTES_MAX}")
        return PullRequest(str(buf[p:p + tlen], "utf-8"), qid, off, maxn, maxb, susp,
                           str(buf[p + tlen:], "utf-8"))
    except (struct.error, UnicodeDecodeError) as e:
        raise BadRequest(f"PULL body does not decode: {e}") from None


def encode_response(r: PullResponse) -> bytes:
    try:
        return _RESP.pack(r.next_offset, r.min_offset, r.max_offset, r.count) + r.entries
    except struct.error:
        for name in ("next_offset", "min_offset", "max_offset"):
            check_int(name, getattr(r, name), 0, 2**64 - 1)
        check_int("count", r.count, 0, 2**32 - 1)
        raise


def decode_response(buf: bytes) -> PullResponse:
    if len(buf) < _RESP.size:
        raise BadRequest("PULL response is shorter than its header")
    return PullResponse(*_RESP.unpack_from(buf), buf[_RESP.size:])


def parse_tags(expr: str) -> frozenset[str] | None:
    """A subscription expression: "" or "*" for everything, else tags joined by "||"."""
    expr = expr.strip()
    if expr in ("", "*"):
        return None
    tags = frozenset(t.strip() for t in expr.split("||") if t.strip())
    if not tags:
        raise BadRequest(f"bad tag filter {expr!r}")
    return tags
