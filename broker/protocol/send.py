"""SEND and SEND_BATCH: producing messages.

SEND request body (big-endian):
    off  size  field
      0     4  queue_id     i32, the queue the producer picked
      4     4  flags        user flags, stored untouched
      8     8  born_ts_ms
     16    16  msg_id       producer-assigned, the same on every retry of this message
     32     1  topic_len
     33     2  props_len
     35        topic | properties (codec.encode_properties) | body (the rest)

SEND response body (code SUCCESS):
      0     4  queue_id
      4     8  queue_offset
     12     8  phys_offset
     20     8  index
     28     8  store_ts_ms

Limits (encoders raise FieldLimitError, decoders BadRequest, answered with BAD_REQUEST):
topic 1..TOPIC_BYTES_MAX bytes (the store's, under the u8 field), properties up to
PROPS_BYTES_MAX, msg_id exactly 16 bytes, a batch up to 65535 messages.

SEND_BATCH request body: topic_len u8 | topic | queue_id i32 | count u16, then per message
    flags u32 | born_ts_ms u64 | msg_id 16 | props_len u16 | body_len u32 | props | body.
    A batch goes to one queue and is stored as one write (all or nothing).
SEND_BATCH response body: queue_id i32 | first_queue_offset u64 | first_index u64 |
    store_ts_ms u64 | count u16, then count x phys_offset u64.
    Message i's log index is first_index plus the number of times the phys offset changes
    before it (`indexes`): an entry per message (TLE1) counts up by one, the messages of one
    record batch (TLE2) share its entry, its offset and its index.
SEND_ZONE request body: records_crc u32 | zone, the zone being the producer's part of a
    record batch byte for byte as the CommitLog keeps it (broker/store/codec.py, TLE2 from
    offset 56: attributes u16 | count u16 | queue_id u32 | topic_len u8 | topic | count x
    record), records_crc its CRC-32. The broker checks the CRC once and the records' framing,
    and stores the zone as received (commitlog_format 2) or as an entry per message (1).
    Answered as SEND_BATCH. A broker that does not know it answers REQUEST_CODE_NOT_SUPPORTED
    (nothing stored): the producer then sends SEND_BATCH.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from broker.protocol import frame as fr
from broker.protocol.codes import BadRequest, Code, FieldLimitError, check_int, check_len
from broker.store import codec_batch
from broker.store.codec import (MSG_ID_SIZE, PROPS_BYTES_MAX, TOPIC_BYTES_MAX, ZONE_HEAD as _ZONE_HEAD,
                                ZONE_TOPIC_AT, CorruptEntry, crc32)
from broker.store.commitlog import NewEntry, ZoneItem

_REQ = struct.Struct(">iIQ16sBH")
_topics: dict[bytes, str] = {}  # decoded topic names (a bounded cache)
TOPICS_CACHED_MAX = 4096
_RESP = struct.Struct(">iQQQQ")
_BATCH_HEAD = struct.Struct(">iH")
_BATCH_MSG = struct.Struct(">IQ16sHI")
_BATCH_RESP = struct.Struct(">iQQQH")


# The wire carries exactly what a leader appends, so the broker hands decoded requests to
# the store as they are: one type, defined with the store.
SendRequest = NewEntry


class SendResponse(NamedTuple):
    queue_id: int
    queue_offset: int
    phys_offset: int
    index: int
    store_ts_ms: int


class BatchMessage(NamedTuple):
    flags: int
    born_ts_ms: int
    msg_id: bytes
    properties: bytes
    body: bytes


class SendBatchRequest(NamedTuple):
    topic: str
    queue_id: int
    messages: list[BatchMessage]


class SendBatchResponse(NamedTuple):
    queue_id: int
    first_queue_offset: int
    first_index: int
    store_ts_ms: int
    phys_offsets: list[int]


def check_topic(t: bytes) -> None:
    """A topic (UTF-8 bytes) the wire and the store take, else FieldLimitError."""
    if not 0 < len(t) <= TOPIC_BYTES_MAX:
        raise FieldLimitError("topic", f"{len(t)} bytes", f"1..{TOPIC_BYTES_MAX} (TOPIC_BYTES_MAX)")


def _check_message(msg_id: bytes, properties: bytes) -> None:
    if len(msg_id) != MSG_ID_SIZE:
        raise FieldLimitError("msg_id", f"{len(msg_id)} bytes", f"exactly {MSG_ID_SIZE}")
    check_len("properties", properties, PROPS_BYTES_MAX, "PROPS_BYTES_MAX")


def _check_ints(**fields) -> None:
    """After a struct.error: name the integer field that does not fit."""
    bounds = {"queue_id": (-2**31, 2**31 - 1), "flags": (0, 2**32 - 1)}
    for name, v in fields.items():
        lo, hi = bounds.get(name, (0, 2**64 - 1))
        check_int(name, v, lo, hi)
    raise FieldLimitError("SEND", "a field", "see broker/protocol/send.py")


def encode_request_parts(r: SendRequest, topic: bytes | None = None) -> tuple:
    """The body as parts for a gathering write: (header, topic, properties, body).
    Raises FieldLimitError for a field over its limit."""
    t = r.topic.encode() if topic is None else topic
    if not 0 < len(t) <= TOPIC_BYTES_MAX:
        check_topic(t)
    if len(r.msg_id) != MSG_ID_SIZE or len(r.properties) > PROPS_BYTES_MAX:
        _check_message(r.msg_id, r.properties)
    try:
        head = _REQ.pack(r.queue_id, r.flags, r.born_ts_ms, r.msg_id, len(t), len(r.properties))
    except struct.error:
        _check_ints(queue_id=r.queue_id, flags=r.flags, born_ts_ms=r.born_ts_ms)
    return head, t, r.properties, r.body


def encode_request(r: SendRequest) -> bytes:
    return b"".join(encode_request_parts(r))


def decode_request(buf: bytes) -> SendRequest:
    if len(buf) < _REQ.size:
        raise BadRequest(f"SEND body of {len(buf)} bytes is shorter than its {_REQ.size}-byte header")
    queue_id, flags, born, msg_id, tlen, plen = _REQ.unpack_from(buf)
    p = _REQ.size
    if p + tlen + plen > len(buf):
        raise BadRequest("SEND body is shorter than its topic and properties")
    if tlen == 0:
        raise BadRequest("SEND without a topic")
    if tlen > TOPIC_BYTES_MAX:
        raise BadRequest(f"topic of {tlen} bytes exceeds TOPIC_BYTES_MAX={TOPIC_BYTES_MAX}")
    topic = _topic(bytes(buf[p:p + tlen]), "topic")
    return SendRequest(topic, queue_id, flags, born, msg_id, buf[p + tlen:p + tlen + plen],
                       buf[p + tlen + plen:])


def encode_response(r: SendResponse) -> bytes:
    try:
        return _RESP.pack(*r)
    except struct.error:
        _check_ints(**r._asdict())


# A whole SUCCESS frame answering a SEND, packed in one go (the hot path of every ack).
_OK_FRAME = struct.Struct(fr.HEADER.format + _RESP.format.lstrip(">"))


def encode_ok_frame(corr_id: int, version: int, r: SendResponse) -> bytes:
    return _OK_FRAME.pack(_OK_FRAME.size, fr.MAGIC, version, fr.FLAG_RESPONSE, Code.SUCCESS,
                          corr_id, 0, *r)


def decode_response(buf: bytes) -> SendResponse:
    if len(buf) != _RESP.size:
        raise BadRequest(f"SEND response of {len(buf)} bytes, expected {_RESP.size}")
    return SendResponse(*_RESP.unpack(buf))


BATCH_MESSAGES_WIRE_MAX = 0xFFFF  # count u16 (the broker's batch_messages_max is lower)


def _topic(raw: bytes, what: str) -> str:
    """A topic's name from its bytes (a bounded cache of decoded names); BadRequest if not UTF-8."""
    topic = _topics.get(raw)
    if topic is None:
        try:
            topic = raw.decode()
        except UnicodeDecodeError:
            raise BadRequest(f"{what} is not UTF-8") from None
        if len(_topics) < TOPICS_CACHED_MAX:
            _topics[raw] = topic
    return topic


# A SEND_ZONE is what the store appends too (one record batch): the store's type.
ZoneRequest = ZoneItem


_U32 = struct.Struct(">I")


def encode_zone_request(topic: bytes, queue_id: int, born_ts_ms: int, messages) -> tuple:
    """SEND_ZONE's body as parts (records_crc, zone) for `messages` (objects with flags,
    msg_id, props and body: the producer's Handed), all born at `born_ts_ms`: the zone is
    the store codec's own (codec_batch.encode_zone). Raises FieldLimitError."""
    try:
        zone, crc = codec_batch.encode_zone(topic, queue_id, [(m.flags, born_ts_ms, m.msg_id, m.props, m.body)
                                                               for m in messages])
    except codec_batch.BatchLimitError as e:
        raise FieldLimitError(e.field, e.value, e.limit) from None
    return _U32.pack(crc), zone


def decode_zone_request(buf) -> ZoneRequest:
    """A SEND_ZONE body, its CRC and its records' framing checked. Raises BadRequest
    naming what is wrong (nothing is stored)."""
    if len(buf) < 4:
        raise BadRequest(f"SEND_ZONE body of {len(buf)} bytes: no records_crc")
    crc = _U32.unpack_from(buf)[0]
    zone = memoryview(buf)[4:]
    if crc32(zone) != crc:
        raise BadRequest("SEND_ZONE records_crc does not match the zone (damaged in transit, or "
                         "not the CRC-32 of the bytes after it)")
    try:
        bodies, props_max = codec_batch.frame_records(zone)
    except CorruptEntry as e:
        raise BadRequest(f"SEND_ZONE zone: {e.reason}") from None
    _, _, queue_id, tlen = _ZONE_HEAD.unpack_from(zone)
    topic = _topic(bytes(zone[ZONE_TOPIC_AT:ZONE_TOPIC_AT + tlen]), "SEND_ZONE topic")
    if queue_id > 0x7FFFFFFF:
        raise BadRequest(f"SEND_ZONE queue_id {queue_id} is out of range")
    return ZoneRequest(topic, queue_id, zone, crc, bodies, props_max)


def encode_batch_request(r: SendBatchRequest) -> bytes:
    """Raises FieldLimitError for a field over its limit."""
    t = r.topic.encode()
    check_topic(t)
    check_int("batch messages", len(r.messages), 0, BATCH_MESSAGES_WIRE_MAX)
    try:
        parts = [bytes([len(t)]), t, _BATCH_HEAD.pack(r.queue_id, len(r.messages))]
        for m in r.messages:
            _check_message(m.msg_id, m.properties)
            check_len("body", m.body, 0xFFFFFFFF, "u32")
            parts += [_BATCH_MSG.pack(m.flags, m.born_ts_ms, m.msg_id, len(m.properties), len(m.body)),
                      m.properties, m.body]
    except struct.error:
        check_int("queue_id", r.queue_id, -2**31, 2**31 - 1)
        for m in r.messages:
            _check_ints(flags=m.flags, born_ts_ms=m.born_ts_ms)
    return b"".join(parts)


def decode_batch_request(buf: bytes) -> SendBatchRequest:
    topic, queue_id, items = decode_batch_entries(buf)
    return SendBatchRequest(topic, queue_id, [BatchMessage(e.flags, e.born_ts_ms, e.msg_id, bytes(e.properties),
                                                           bytes(e.body)) for e in items])


def decode_batch_entries(buf: bytes) -> tuple[str, int, list[NewEntry]]:
    """A SEND_BATCH body as (topic, queue_id, the store's NewEntry per message): what the
    broker appends, built in one pass. Raises BadRequest naming what does not decode."""
    try:
        tlen = buf[0]
        topic = _topics.get(bytes(buf[1:1 + tlen])) if tlen else None
        if topic is None:
            topic = str(buf[1:1 + tlen], "utf-8")
            if tlen == 0 or len(topic.encode()) != tlen:
                raise BadRequest("SEND_BATCH without a whole topic")
            if tlen > TOPIC_BYTES_MAX:
                raise BadRequest(f"topic of {tlen} bytes exceeds TOPIC_BYTES_MAX={TOPIC_BYTES_MAX}")
            if len(_topics) < TOPICS_CACHED_MAX:
                _topics[bytes(buf[1:1 + tlen])] = topic
        p = 1 + tlen
        queue_id, count = _BATCH_HEAD.unpack_from(buf, p)
        p += _BATCH_HEAD.size
        out = []
        unpack, size, end = _BATCH_MSG.unpack_from, _BATCH_MSG.size, len(buf)
        for _ in range(count):
            flags, born, msg_id, plen, blen = unpack(buf, p)
            p += size
            q = p + plen
            p = q + blen
            if p > end:
                raise BadRequest("SEND_BATCH message runs past the body")
            out.append(NewEntry(topic, queue_id, flags, born, msg_id, buf[q - plen:q], buf[q:p]))
    except (IndexError, struct.error, UnicodeDecodeError) as e:
        raise BadRequest(f"SEND_BATCH body does not decode: {e}") from None
    if p != len(buf):
        raise BadRequest(f"SEND_BATCH body has {len(buf) - p} trailing bytes")
    if not out:
        raise BadRequest("SEND_BATCH with no messages")
    return topic, queue_id, out


def indexes(first_index: int, phys_offsets: list[int]) -> list[int]:
    """Each message's log index in a SEND_BATCH answer (see the module's docstring)."""
    out, index, last = [], first_index, None
    for p in phys_offsets:
        if last is not None and p != last:
            index += 1
        out.append(index)
        last = p
    return out


def encode_batch_response(r: SendBatchResponse) -> bytes:
    try:
        return _BATCH_RESP.pack(r.queue_id, r.first_queue_offset, r.first_index, r.store_ts_ms,
                                len(r.phys_offsets)) + struct.pack(f">{len(r.phys_offsets)}Q", *r.phys_offsets)
    except struct.error:
        check_int("batch messages", len(r.phys_offsets), 0, BATCH_MESSAGES_WIRE_MAX)
        for p in r.phys_offsets:
            check_int("phys_offset", p, 0, 2**64 - 1)
        _check_ints(queue_id=r.queue_id, first_queue_offset=r.first_queue_offset,
                    first_index=r.first_index, store_ts_ms=r.store_ts_ms)


def decode_batch_response(buf: bytes) -> SendBatchResponse:
    try:
        qid, qoff, idx, ts, n = _BATCH_RESP.unpack_from(buf)
        phys = list(struct.unpack_from(f">{n}Q", buf, _BATCH_RESP.size))
    except struct.error as e:
        raise BadRequest(f"SEND_BATCH response does not decode: {e}") from None
    return SendBatchResponse(qid, qoff, idx, ts, phys)
