"""The Kafka zone of a TLE2 entry: a Kafka RecordBatch v2 stored as it arrived.

A Produce batch becomes one CommitLog entry of the TLE2 layout (codec.py's table) whose zone
is marked ATTR_KAFKA in its attributes and holds, after the zone head and the topic, the
producer's Kafka batch byte for byte (compressed or not; its base_offset and
partition_leader_epoch as the producer sent them, 0 and -1 usually):

    zone  0  2  attributes   ATTR_KAFKA (bits 0-2 and the rest 0: the Kafka batch carries its
                             own compression in its own attributes)
          2  2  count        the Kafka batch's records_count (1..BATCH_COUNT_MAX)
          4  4  queue_id     the partition's queue in this group
          8  1  topic_len
          9     topic, then the Kafka batch (broker/kafka/records.py's layout), to the zone's end

records_crc (CRC-32 of the zone, the broker's head field) is what every replica, recovery and
the Spark reader check, as for any zone; the Kafka batch's own CRC-32C is checked once, by the
leader when the batch arrives (records.split). A Fetch hands the stored batch back with
base_offset = the entry's base_queue_offset and the leader epoch set in place (outside the
Kafka CRC): nothing is re-encoded.

A reader that wants Tidelog messages (a native PULL consumer, dispatch's keys, the Spark
reader's rows) gets them from `messages`: one per Kafka record, with
- born_ts_ms = the batch's base_timestamp + the record's timestamp_delta,
- msg_id = "KF" + the entry's phys_offset (8 bytes) + the record's place (4) + 2 zero bytes:
  the same on every replica, unique in the log (Kafka records carry no id of their own),
- properties: KEYS = the record key when it is UTF-8 text without separators (so key lookups
  and the key index work), and each header as a property named "h:<name>" (values that are
  not UTF-8 are left out; Kafka consumers get every header, byte for byte),
- body = the record value (b"" for a null value).
"""

from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

from broker.store.codec import (BATCH_COUNT_MAX, MSG_ID_SIZE, PROPS_BYTES_MAX, TOPIC_BYTES_MAX, ZONE_HEAD,
                                ZONE_TOPIC_AT, CorruptEntry, crc32)

ATTR_KAFKA = 0x0100
KAFKA_HEAD = struct.Struct(">qiibIhiqqqhii")  # broker/kafka/records.py HEAD (kept here: the store imports no client code)
KAFKA_HEAD_SIZE = KAFKA_HEAD.size  # 61
KAFKA_LENGTH_OVERHEAD = 12
KAFKA_MAGIC = 2
HEADER_PREFIX = "h:"
_ID = struct.Struct(">2sQI2x")


class KafkaZone(NamedTuple):
    count: int
    queue_id: int
    topic: str
    batch_at: int  # where the Kafka batch starts, relative to the zone
    base_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    attributes: int  # the Kafka batch's own


def encode_zone(topic: bytes, queue_id: int, batch) -> tuple[list, int, int]:
    """([zone head + topic, batch], records_crc, zone size) for a Kafka batch already checked
    (records.split): the parts go to the log in one gathering write."""
    if not 1 <= len(topic) <= TOPIC_BYTES_MAX:
        raise ValueError(f"topic of {len(topic)} bytes, not 1..{TOPIC_BYTES_MAX}")
    count = KAFKA_HEAD.unpack_from(batch, 0)[12]
    if not 1 <= count <= BATCH_COUNT_MAX:
        raise ValueError(f"a Kafka batch of {count} records: at most {BATCH_COUNT_MAX} fit one entry")
    head = ZONE_HEAD.pack(ATTR_KAFKA, count, queue_id, len(topic)) + topic
    return [head, batch], crc32(batch, crc32(head)), len(head) + len(batch)


def read_zone(zone, pos: int = 0, end: int | None = None) -> KafkaZone:
    """The zone's framing, checked: the head, a UTF-8 topic, a Kafka batch of magic 2 whose
    length is exactly the rest of the zone and whose records_count is the zone's count.
    Raises CorruptEntry."""
    zsize = (len(zone) if end is None else end) - pos
    if zsize < ZONE_TOPIC_AT:
        raise CorruptEntry(f"framing: Kafka zone of {max(zsize, 0)} bytes")
    attributes, count, queue_id, topic_len = ZONE_HEAD.unpack_from(zone, pos)
    if attributes != ATTR_KAFKA:
        raise CorruptEntry(f"framing: Kafka zone attributes 0x{attributes:04x}")
    at = ZONE_TOPIC_AT + topic_len
    if not 1 <= topic_len <= TOPIC_BYTES_MAX or at + KAFKA_HEAD_SIZE > zsize:
        raise CorruptEntry(f"framing: topic length {topic_len} in a Kafka zone of {zsize} bytes")
    try:
        topic = str(zone[pos + ZONE_TOPIC_AT:pos + at], "utf-8")
    except UnicodeDecodeError:
        raise CorruptEntry("framing: the topic is not UTF-8") from None
    (_, length, _, magic, _, kattrs, last_delta, base_ts, _, pid, pepoch, bseq,
     kcount) = KAFKA_HEAD.unpack_from(zone, pos + at)
    if magic != KAFKA_MAGIC or length + KAFKA_LENGTH_OVERHEAD != zsize - at:
        raise CorruptEntry(f"framing: Kafka batch of magic {magic} and length {length} in {zsize - at} bytes")
    if kcount != count or not 1 <= count:
        raise CorruptEntry(f"framing: Kafka batch of {kcount} records in a zone of {count}")
    return KafkaZone(count, queue_id, topic, at, base_ts, pid, pepoch, bseq, kattrs)


def batch(zone, pos: int = 0, end: int | None = None) -> memoryview:
    """The stored Kafka batch (a view: copy it before placing its offset)."""
    z = read_zone(zone, pos, end)
    return memoryview(zone)[pos + z.batch_at:(len(zone) if end is None else end)]


def msg_id(phys_offset: int, k: int) -> bytes:
    return _ID.pack(b"KF", phys_offset, k)


def _props(key: bytes | None, headers: list) -> bytes:
    pairs = []
    if key:
        try:
            text = key.decode()
        except UnicodeDecodeError:
            text = ""
        if text and not any(c in text for c in " \x01\x02"):
            pairs.append(f"KEYS\x01{text}")
    for name, value in headers:
        if value is None or "\x01" in name or "\x02" in name:
            continue
        try:
            v = value.decode()
        except UnicodeDecodeError:
            continue
        if "\x01" not in v and "\x02" not in v:
            pairs.append(f"{HEADER_PREFIX}{name}\x01{v}")
    out = "".join(p + "\x02" for p in pairs).encode()
    return out if len(out) <= PROPS_BYTES_MAX else out[:0]


def messages(zone, pos: int, end: int, phys_offset: int) -> Iterator[tuple[int, int, bytes, bytes, bytes]]:
    """(flags, born_ts_ms, msg_id, properties, body) of each record: BatchRecord's shape.
    Decompresses what the batch compressed. Raises CorruptEntry."""
    from broker.kafka import records as kr  # (compression codecs: only a reader of Kafka zones needs them)

    z = read_zone(zone, pos, end)
    data = memoryview(zone)[pos + z.batch_at:end]
    try:
        b = kr.Batch(kr.head(data), data)
        for k, r in enumerate(kr.records(b)):
            yield (0, max(0, z.base_timestamp + r.timestamp_delta), msg_id(phys_offset, k),
                   _props(r.key, r.headers), r.value or b"")
    except kr.InvalidRecord as e:
        raise CorruptEntry(f"Kafka records: {e}") from None


assert _ID.size == MSG_ID_SIZE
