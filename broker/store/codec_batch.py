"""The record batch (TLE2) half of the CommitLog codec: encode, check, walk and read batches.

The byte layout of both formats is the table at the top of `codec.py` (one place of layout
truth: its structs, sizes and limits are codec's); this module is the code for the TLE2 half,
re-exported by `codec` (`codec.iter_messages`, ...). Leaders write TLE2 by default
(`commitlog_format: 2`, docs/design/batch-format.md); every reader walks both magics with
`walk2`/`classify2` (`codec.walk`/`classify` are TLE1's own, kept for its tests and tools).

Checks, and who pays for them:
  check_batch   framing of the 65-byte head, both CRCs: one pass over the bytes (a follower)
  walk_records  the records' framing: each record_size agrees with its lengths and the sizes
                sum to the zone (the leader on receipt; every reader that decodes records)

A zone may instead be a Kafka zone (codec_kafka.py: ATTR_KAFKA, a Kafka RecordBatch stored as
it arrived, written only by the Kafka listener): check_batch, check_entry, walk2, decode_batch
and iter_messages read both kinds; walk_records, frame_records and record_ids (the native
record walks) refuse it, and their callers that meet one ask `is_kafka` first.
"""

from __future__ import annotations

import struct
import zlib
from collections import namedtuple
from typing import Iterator, NamedTuple

from broker.store import codec_kafka, native
from broker.store.codec import (
    BATCH_HEAD, BATCH_HEAD_SIZE, BATCH_MAGIC, BATCH_SIZE_MIN, BATCH_TOPIC_AT, BLANK_SIZE_MIN,
    BATCH_COUNT_MAX, ATTR_COMPRESSION_MASK, CORRUPT, ENTRY_MAGIC, HEAD_CRC_END, HEAD_CRC_START,
    HEADER_SIZE, MSG_ID_SIZE, PROPS_BYTES_MAX, RECORD, RECORD_SIZE, TOPIC_BYTES_MAX,
    ZONE_HEAD, ZONE_TOPIC_AT, CorruptEntry, Entry, Stop, Walk, check, classify2, crc32, decode, header, _SIZE_MAGIC)

# the per-record walks in C (broker/store/_zonewalk.c): fast paths of the functions below;
# without them (not built where this was installed, or TIDELOG_NO_C_EXT) the Python loops do it all
_zonewalk = native.zonewalk()
_C_CRC = crc32 is zlib.crc32  # zlib's CRC in C as well; with zlib-ng's, the faster one after it

_new = tuple.__new__
_HEAD_ZONE = struct.Struct(BATCH_HEAD.format + ZONE_HEAD.format[1:])  # the first 65 bytes
_U32, _U64 = 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF


class BatchLimitError(ValueError):
    """A value the TLE2 encoder cannot store (the shape of protocol.codes.FieldLimitError,
    which this store-level module cannot import): names the field and its limit."""

    def __init__(self, field: str, value, limit: str):
        self.field, self.value, self.limit = field, value, limit
        super().__init__(f"{field}: {value}, the limit is {limit}")


class BatchRecord(NamedTuple):
    """One message of a batch as the producer gives it (the encoder's input, decode's output)."""

    flags: int
    born_ts_ms: int
    msg_id: bytes
    properties: bytes
    body: bytes


class BatchHead(NamedTuple):
    """The first 65 bytes of a TLE2 entry, in byte order (`check_batch`). From a TLE1 entry
    (walk2 "head"): crc and records_crc are its one CRC, attributes 0, count 1."""

    size: int
    magic: int
    crc: int
    index: int
    term: int
    phys_offset: int
    base_queue_offset: int
    store_ts_ms: int
    records_crc: int
    attributes: int
    count: int
    queue_id: int
    topic_len: int


class RecordHead(NamedTuple):
    """A record's header (`walk_records`); `rel` is where it starts in the zone."""

    rel: int
    size: int
    flags: int
    born_ts_ms: int
    msg_id: bytes
    props_len: int
    body_len: int


class BatchMeta(NamedTuple):
    """The fields an indexer needs, framing only (walk2 "meta"), the same for both magics:
    `topic_at` is where the topic bytes start in the entry (TLE1: 91, TLE2: 65)."""

    size: int
    magic: int
    phys_offset: int
    base_queue_offset: int
    store_ts_ms: int
    count: int
    queue_id: int
    topic_len: int
    topic_at: int


class Batch(NamedTuple):
    """A decoded TLE2 entry (`decode_batch`)."""

    index: int
    term: int
    phys_offset: int
    base_queue_offset: int
    store_ts_ms: int
    queue_id: int
    topic: str
    records: tuple[BatchRecord, ...]
    size: int
    records_crc: int


class Message(namedtuple("Message", Entry._fields + ("batch_pos",))):
    """One message read from either format: Entry's fields, in Entry's order, then its place
    in its batch. index, term, phys_offset, store_ts_ms and size (the entry's) are the batch's;
    queue_offset = base_queue_offset + batch_pos. A TLE1 entry is batch_pos 0 of one."""

    __slots__ = ()
    props = Entry.props
    keys = Entry.keys
    tags = Entry.tags


# --- encoding -----------------------------------------------------------------------------


def _limit(field: str, value, lo: int, hi: int) -> None:
    if not isinstance(value, int) or not lo <= value <= hi:
        raise BatchLimitError(field, value, f"{lo}..{hi}")


def encode_zone(topic: str | bytes, queue_id: int, records) -> tuple[bytes, int]:
    """The producer's part of a batch and its records_crc: `records` are BatchRecord-shaped
    (flags, born_ts_ms, msg_id, properties, body). Raises BatchLimitError (a ValueError)
    naming the field for anything the layout cannot hold."""
    if _zonewalk is not None and type(topic) is bytes and type(queue_id) is int:
        fast = _zonewalk.encode_zone(topic, queue_id, records, _C_CRC)
        if fast is not None:
            return fast if _C_CRC else (fast[0], crc32(fast[0]))
    t = topic.encode() if isinstance(topic, str) else bytes(topic)
    if not 1 <= len(t) <= TOPIC_BYTES_MAX:
        raise BatchLimitError("topic", f"{len(t)} bytes", f"1..{TOPIC_BYTES_MAX} (TOPIC_BYTES_MAX)")
    _limit("queue_id", queue_id, 0, _U32)
    parts = [b"", t]
    pack, append = RECORD.pack, parts.append
    for k, (flags, born, msg_id, props, body) in enumerate(records):
        if len(props) > PROPS_BYTES_MAX:
            raise BatchLimitError(f"record {k} properties", f"{len(props)} bytes",
                                  f"PROPS_BYTES_MAX={PROPS_BYTES_MAX}")
        if len(msg_id) != MSG_ID_SIZE:
            raise BatchLimitError(f"record {k} msg_id", f"{len(msg_id)} bytes", f"exactly {MSG_ID_SIZE}")
        size = RECORD_SIZE + len(props) + len(body)
        try:
            append(pack(size, flags, born, msg_id, len(props), len(body)))
        except struct.error:
            _limit(f"record {k} flags", flags, 0, _U32)
            _limit(f"record {k} born_ts_ms", born, 0, _U64)
            raise BatchLimitError(f"record {k} body", f"{len(body)} bytes", f"0..{_U32 - size}") from None
        append(props)
        append(body)
    count = (len(parts) - 2) // 3
    if not 1 <= count <= BATCH_COUNT_MAX:
        raise BatchLimitError("count", count, f"1..{BATCH_COUNT_MAX} records (BATCH_COUNT_MAX)")
    parts[0] = ZONE_HEAD.pack(0, count, queue_id, len(t))
    zone = b"".join(parts)
    return zone, crc32(zone)


def encode_head(index: int, term: int, phys_offset: int, base_queue_offset: int,
                store_ts_ms: int, records_crc: int, zone_size: int) -> bytes:
    """The 56 broker-assigned bytes before a zone of `zone_size` bytes, head_crc included:
    write [head, zone] with one gathering write. Raises BatchLimitError for a field out of
    range (they are the broker's own numbers: a bug, named)."""
    try:
        rest = BATCH_HEAD.pack(BATCH_HEAD_SIZE + zone_size, BATCH_MAGIC, 0, index, term,
                               phys_offset, base_queue_offset, store_ts_ms, records_crc)
    except struct.error:
        for name, v, hi in (("zone_size", zone_size, _U32 - BATCH_HEAD_SIZE), ("index", index, _U64),
                            ("term", term, _U64), ("phys_offset", phys_offset, _U64),
                            ("base_queue_offset", base_queue_offset, _U64),
                            ("store_ts_ms", store_ts_ms, _U64), ("records_crc", records_crc, _U32)):
            _limit(name, v, 0, hi)
        raise
    return rest[:8] + crc32(rest[HEAD_CRC_START:]).to_bytes(4, "big") + rest[HEAD_CRC_START:]


def encode_batch(index: int, term: int, phys_offset: int, base_queue_offset: int,
                 store_ts_ms: int, topic: str | bytes, queue_id: int, records) -> bytes:
    """A whole TLE2 entry as bytes (tests, crafted segments; the broker writes [head, zone])."""
    zone, crc = encode_zone(topic, queue_id, records)
    return encode_head(index, term, phys_offset, base_queue_offset, store_ts_ms, crc, len(zone)) + zone


# --- checking and reading -----------------------------------------------------------------


def check_batch(buf, pos: int = 0, verify: bool = True, where: int | None = None) -> BatchHead:
    """The head of the TLE2 entry at `pos` once its framing (magic, size, the zone head: a
    topic, 1.. records that can fit, no compression) and, with `verify`, head_crc and
    records_crc hold. Copies nothing; leaves the records' framing to `walk_records`.
    Raises CorruptEntry naming what is wrong (`where`: the offset to name in it)."""
    avail = len(buf) - pos
    if avail < BATCH_TOPIC_AT:
        raise CorruptEntry(f"truncated batch head ({max(avail, 0)} of {BATCH_TOPIC_AT} bytes)", where)
    h = _new(BatchHead, _HEAD_ZONE.unpack_from(buf, pos))
    size = h.size
    if h.magic != BATCH_MAGIC:
        raise CorruptEntry(f"bad magic 0x{h.magic:08x}", where)
    if size < BATCH_SIZE_MIN:
        raise CorruptEntry(f"framing: batch size {size} is below {BATCH_SIZE_MIN}", where)
    if size > avail:
        raise CorruptEntry(f"truncated batch ({avail} of {size} bytes)", where)
    if verify:
        mv = memoryview(buf)
        if crc32(mv[pos + HEAD_CRC_START:pos + HEAD_CRC_END]) != h.crc:
            raise CorruptEntry("head CRC mismatch (index, term, phys_offset, base_queue_offset, "
                               "store_ts_ms or records_crc)", where)
        if crc32(mv[pos + BATCH_HEAD_SIZE:pos + size]) != h.records_crc:
            raise CorruptEntry("records CRC mismatch (the producer's records)", where)
    reason = _zone_head_problem(h.attributes, h.count, h.topic_len, size - BATCH_HEAD_SIZE)
    if reason:
        raise CorruptEntry(reason, where)
    return h


def check_entry(buf, pos: int = 0) -> tuple[int, int, int, int]:
    """`codec.check` for an entry of either magic: (size, index, term, phys_offset) once it
    passes every check recovery makes (walk2 "head": a TLE2 batch's framing, both CRCs, its
    records' framing, a UTF-8 topic), so a replica stores exactly what its own recovery keeps.
    Raises CorruptEntry."""
    if len(buf) - pos >= BLANK_SIZE_MIN and _SIZE_MAGIC.unpack_from(buf, pos)[1] == BATCH_MAGIC:
        h = check_batch(buf, pos, True, None)
        frame_zone(buf, pos + BATCH_HEAD_SIZE, pos + h.size)
        _topic(buf, pos + BATCH_TOPIC_AT, h.topic_len, None)
        return h.size, h.index, h.term, h.phys_offset
    return check(buf, pos)


def is_kafka(zone, pos: int = 0) -> bool:
    """Whether the zone at `pos` (an entry's offset BATCH_HEAD_SIZE) is a Kafka zone."""
    return ZONE_HEAD.unpack_from(zone, pos)[0] == codec_kafka.ATTR_KAFKA


def frame_zone(zone, pos: int, end: int) -> None:
    """The zone's framing, of either kind (codec_kafka.read_zone, or frame_records: the checks
    walk_records makes, no heads built). Raises CorruptEntry."""
    if is_kafka(zone, pos):
        codec_kafka.read_zone(zone, pos, end)
    else:
        frame_records(zone, pos, end)


def zone_ids_keys(zone, pos: int, end: int, phys_offset: int) -> tuple[list[bytes], list[list[str]]]:
    """(each message's msg_id, each message's keys) of the zone of the entry at `phys_offset`,
    of either kind (a Kafka zone's decoded: codec_kafka.messages). Raises CorruptEntry."""
    from broker.store.codec import keys_of
    if is_kafka(zone, pos):
        ms = list(codec_kafka.messages(zone, pos, end, phys_offset))
        return [m[2] for m in ms], [keys_of(m[3]) if m[3] else [] for m in ms]
    recs, z = walk_records(zone, pos, end), pos + RECORD_SIZE
    return [r.msg_id for r in recs], [keys_of(zone[z + r.rel:z + r.rel + r.props_len]) if r.props_len else []
                                      for r in recs]


def _zone_head_problem(attributes: int, count: int, topic_len: int, zone_size: int) -> str | None:
    if attributes == codec_kafka.ATTR_KAFKA:  # (its own framing: codec_kafka.read_zone)
        return None if count and 1 <= topic_len <= TOPIC_BYTES_MAX else \
            f"framing: a Kafka zone of {count} records and a topic of {topic_len} bytes"
    if attributes & ATTR_COMPRESSION_MASK:
        return f"framing: compression {attributes & ATTR_COMPRESSION_MASK} is not supported"
    if attributes:
        return f"framing: reserved attribute bits 0x{attributes:04x} are set"
    if count == 0:
        return "framing: a batch of 0 records"
    if not 1 <= topic_len <= TOPIC_BYTES_MAX:
        return f"framing: topic length {topic_len}, not 1..{TOPIC_BYTES_MAX}"
    if ZONE_TOPIC_AT + topic_len + count * RECORD_SIZE > zone_size:
        return f"framing: {count} records cannot fit a zone of {zone_size} bytes"
    return None


def _zone_start(zone, pos: int, end: int | None) -> tuple[int, int, int]:
    """(record count, where the first record starts relative to `pos`, the zone's size) once
    the zone head of `zone[pos:end]` holds, for a zone of native records (a Kafka zone is
    refused: its records are not Tidelog's). Raises CorruptEntry."""
    zsize = (len(zone) if end is None else end) - pos
    if zsize < ZONE_TOPIC_AT:
        raise CorruptEntry(f"framing: zone of {max(zsize, 0)} bytes, its head needs {ZONE_TOPIC_AT}")
    attributes, count, _, topic_len = ZONE_HEAD.unpack_from(zone, pos)
    if attributes == codec_kafka.ATTR_KAFKA:
        raise CorruptEntry("framing: a Kafka zone where native records were expected")
    reason = _zone_head_problem(attributes, count, topic_len, zsize)
    if reason:
        raise CorruptEntry(reason)
    return count, ZONE_TOPIC_AT + topic_len, zsize


def walk_records(zone, pos: int = 0, end: int | None = None) -> list[RecordHead]:
    """The record headers of the zone `zone[pos:end]` (the producer's part: from the entry's
    offset 56, or a SEND_ZONE body after its records_crc), all framed before any is returned: each record_size
    is RECORD_SIZE + props_len + body_len, props_len <= PROPS_BYTES_MAX, and `count` records
    end exactly at the zone's end. `rel` is relative to `pos`. Raises CorruptEntry."""
    count, rel, zsize = _zone_start(zone, pos, end)
    out, unpack, rsize = [], RECORD.unpack_from, RECORD_SIZE
    for k in range(count):
        if rel + rsize > zsize:
            raise CorruptEntry(f"framing: record {k} of {count} starts {rel} bytes into a zone of {zsize}")
        r = unpack(zone, pos + rel)
        size, plen = r[0], r[4]
        if size != rsize + plen + r[5] or rel + size > zsize or plen > PROPS_BYTES_MAX:
            raise CorruptEntry(f"framing: record {k} of {count} (at {rel} in the zone) has size {size}, "
                               f"props {plen}, body {r[5]}: they disagree or overrun the zone")
        out.append(_new(RecordHead, (rel,) + r))
        rel += size
    if rel != zsize:
        raise CorruptEntry(f"framing: {count} records end at {rel}, the zone at {zsize}")
    return out


_SIZES = struct.Struct(">I 4x 8x 16x H I")  # a record head's size, props_len, body_len


def frame_records(zone, pos: int = 0, end: int | None = None) -> tuple[list[int], int]:
    """Check the framing of the zone `zone[pos:end]` exactly as walk_records does (the same
    CorruptEntry reasons) without building a RecordHead per record -- a follower checking what
    it appends, a leader checking a SEND_ZONE, need the verdict and the sizes, not the heads:
    returns (each record's body length, the largest props_len)."""
    if _zonewalk is not None:
        fast = _zonewalk.frame_records(zone, pos, -1 if end is None else end)
        if fast is not None:
            return fast
    count, rel, zsize = _zone_start(zone, pos, end)
    unpack, rsize = _SIZES.unpack_from, RECORD_SIZE
    bodies, props_max = [], 0
    append = bodies.append
    for k in range(count):
        if rel + rsize > zsize:
            raise CorruptEntry(f"framing: record {k} of {count} starts {rel} bytes into a zone of {zsize}")
        size, plen, blen = unpack(zone, pos + rel)
        if size != rsize + plen + blen or rel + size > zsize or plen > PROPS_BYTES_MAX:
            raise CorruptEntry(f"framing: record {k} of {count} (at {rel} in the zone) has size {size}, "
                               f"props {plen}, body {blen}: they disagree or overrun the zone")
        append(blen)
        if plen > props_max:
            props_max = plen
        rel += size
    if rel != zsize:
        raise CorruptEntry(f"framing: {count} records end at {rel}, the zone at {zsize}")
    return bodies, props_max


_IDS = struct.Struct(">I 4x 8x 16s H 4x")  # a record head's size, msg_id, props_len


def record_ids(zone, pos: int, end: int, hash_seed: int | None = None) -> tuple[list, int]:
    """(msg ids, whether any record has properties) of the zone `zone[pos:end]`, for an
    indexer of a log whose entries were checked when written: one unpack per record, the
    framing checked only as far as the records must end at the zone's end (CorruptEntry).
    With `hash_seed`, each id's CRC-32 continued from it instead of the id (the key index's
    id_hash), which is all an indexer needs of them. A Kafka zone has no such ids: the
    dispatcher asks `is_kafka` first."""
    if _zonewalk is not None:
        fast = _zonewalk.record_ids(zone, pos, end, -1 if hash_seed is None else hash_seed)
        if fast is not None:
            return fast
    count, topic_len = ZONE_HEAD.unpack_from(zone, pos)[1::2]
    p, ids, props = pos + ZONE_TOPIC_AT + topic_len, [], 0
    unpack, append = _IDS.unpack_from, ids.append
    try:
        for _ in range(count):
            size, msg_id, plen = unpack(zone, p)
            append(msg_id)
            props |= plen
            p += size
    except struct.error:
        raise CorruptEntry(f"framing: {count} records overrun the zone") from None
    if p != end:
        raise CorruptEntry(f"framing: {count} records end at {p - pos}, the zone at {end - pos}")
    if hash_seed is not None:
        ids = [zlib.crc32(i, hash_seed) for i in ids]
    return ids, props


def _topic(buf, at: int, n: int, where: int | None) -> str:
    try:
        return bytes(buf[at:at + n]).decode()
    except UnicodeDecodeError:
        raise CorruptEntry("topic is not UTF-8", where) from None


def _read(buf, pos: int, verify: bool, where: int | None, base_offset: int | None):
    """(head, topic, record heads) of the TLE2 entry at `pos`, every check made (a Kafka
    zone: its BatchRecords, decoded by codec_kafka.messages)."""
    h = check_batch(buf, pos, verify, where)
    if base_offset is not None and h.phys_offset != base_offset + pos:
        raise CorruptEntry(f"entry names offset {h.phys_offset}, found at {base_offset + pos}", where)
    zone_at = pos + BATCH_HEAD_SIZE
    try:
        if h.attributes == codec_kafka.ATTR_KAFKA:
            recs = [_new(BatchRecord, r) for r in codec_kafka.messages(buf, zone_at, pos + h.size, h.phys_offset)]
        else:
            recs = walk_records(buf, zone_at, pos + h.size)
    except CorruptEntry as err:
        raise CorruptEntry(err.reason, where) from None
    return h, _topic(buf, pos + BATCH_TOPIC_AT, h.topic_len, where), recs


def decode_batch(buf, pos: int = 0, verify: bool = True, base_offset: int | None = None) -> Batch:
    """Decode the TLE2 entry at `pos` (copies the records). `base_offset` (the log offset of
    buf[0]) also checks that it sits where it says. Raises CorruptEntry."""
    where = None if base_offset is None else base_offset + pos
    h, topic, recs = _read(buf, pos, verify, where, base_offset)
    zone_at, records = pos + BATCH_HEAD_SIZE, []
    if h.attributes:  # a Kafka zone: decoded already
        records, recs = recs, ()
    for r in recs:
        p = zone_at + r.rel + RECORD_SIZE
        q = p + r.props_len
        records.append(BatchRecord(r.flags, r.born_ts_ms, r.msg_id, bytes(buf[p:q]),
                                   bytes(buf[q:q + r.body_len])))
    return Batch(h.index, h.term, h.phys_offset, h.base_queue_offset, h.store_ts_ms, h.queue_id,
                 topic, tuple(records), h.size, h.records_crc)


def _messages(buf, pos: int, verify: bool, base_offset: int | None = None) -> list[Message]:
    """The messages of the entry (either magic) at `pos`, all checked before any is returned."""
    where = None if base_offset is None else base_offset + pos
    magic = _SIZE_MAGIC.unpack_from(buf, pos)[1] if len(buf) - pos >= BLANK_SIZE_MIN else None
    if magic != BATCH_MAGIC:
        return [_new(Message, decode(buf, pos, verify, base_offset) + (0,))]
    h, topic, recs = _read(buf, pos, verify, where, base_offset)
    zone_at, out = pos + BATCH_HEAD_SIZE, []
    index, term, phys, qoff, ts, size, qid = (h.index, h.term, h.phys_offset, h.base_queue_offset,
                                              h.store_ts_ms, h.size, h.queue_id)
    if h.attributes:  # a Kafka zone: decoded already
        return [_new(Message, (index, term, phys, qoff + k, ts, r.born_ts_ms, r.msg_id, qid, r.flags, topic,
                               r.properties, r.body, size, k)) for k, r in enumerate(recs)]
    for k, r in enumerate(recs):
        p = zone_at + r.rel + RECORD_SIZE
        q = p + r.props_len
        out.append(_new(Message, (index, term, phys, qoff + k, ts, r.born_ts_ms, r.msg_id, qid,
                                  r.flags, topic, bytes(buf[p:q]), bytes(buf[q:q + r.body_len]),
                                  size, k)))
    return out


def iter_messages(buf, verify: bool = True, from_queue_offset: int | None = None) -> Iterator[Message]:
    """The messages of consecutive whole entries of either magic (a pull body): a TLE1 entry
    is a batch of one. A batch is checked whole before any of its messages is yielded; with
    `from_queue_offset`, messages before it (a pull that starts inside a batch) are dropped.
    Raises CorruptEntry at the first entry that does not check out."""
    pos, end = 0, len(buf)
    while pos < end:
        msgs = _messages(buf, pos, verify)
        for m in msgs:
            if from_queue_offset is None or m.queue_offset >= from_queue_offset:
                yield m
        pos += msgs[0].size


# --- walking a run of entries of either magic ---------------------------------------------

_META2 = struct.Struct(">II 4x 8x 8x QQQ 4x 2x HIB")  # TLE2: size .. topic_len, no topic_at
_META1 = struct.Struct(">II 4x 8x 8x QQQ 8x 16x I 4x B")  # TLE1: size, magic, phys .. topic_len
_AT2 = (BATCH_TOPIC_AT,)


class Walk2(Walk):
    """`codec.Walk` for both magics (see `walk2`); `stop` is set once it is exhausted. Its own
    iteration, so that the TLE1 readers' walk keeps its shapes and its speed until step 2
    moves them over."""

    __slots__ = ()

    def __init__(self, buf, pos, end, base, segment_end, read, verify, size_max):
        if read not in ("meta", "frame", "head", "messages"):
            raise ValueError(f"read={read!r}: one of meta, frame, head, messages")
        super().__init__(buf, pos, end, base, segment_end, read, verify, size_max)

    def __iter__(self):
        buf, p, end, base = self.buf, self.pos, self.end, self.base
        seg_end, read, verify, size_max = self.segment_end, self.read, self.verify, self.size_max
        if read in ("meta", "frame"):
            # fast path: framing only; anything unusual goes to classify2, the one rule
            limit = end if seg_end is None else min(end, seg_end - BLANK_SIZE_MIN)
            peek_, meta2, meta1, is_meta = _SIZE_MAGIC.unpack_from, _META2.unpack_from, _META1.unpack_from, read == "meta"
            while p + BLANK_SIZE_MIN <= limit:
                size, magic = peek_(buf, p)
                if magic == BATCH_MAGIC:
                    if size < BATCH_SIZE_MIN:
                        break
                elif magic != ENTRY_MAGIC or size < HEADER_SIZE:
                    break
                if p + size > limit or (size_max is not None and size > size_max):
                    break
                if not is_meta:
                    yield p, size
                elif magic == BATCH_MAGIC:
                    yield p, _new(BatchMeta, meta2(buf, p) + _AT2)
                else:
                    s, mg, ph, q, ts, qid, tl = meta1(buf, p)
                    yield p, _new(BatchMeta, (s, mg, ph, q, ts, 1, qid, tl, HEADER_SIZE))
                p += size
            self.pos, self.stop = p, classify2(buf, p, end, seg_end, size_max) or Stop(
                CORRUPT, p, 0, "the walk stopped at a whole entry")  # unreachable: same checks
            return
        while True:
            stop = classify2(buf, p, end, seg_end, size_max)
            if stop is not None:
                self.pos, self.stop = p, stop
                return
            try:
                if read == "messages":
                    item = _messages(buf, p, verify, base)
                    size = item[0].size
                else:
                    item = _head(buf, p, verify, base)
                    size = item.size
            except CorruptEntry as err:
                self.pos, self.stop = p, Stop(CORRUPT, p, 0, err.reason)
                return
            yield p, item
            p += size


def _head(buf, p: int, verify: bool, base: int | None) -> BatchHead:
    if _SIZE_MAGIC.unpack_from(buf, p)[1] == BATCH_MAGIC:
        return _read(buf, p, verify, None, base)[0]
    h = header(buf, p, verify)
    if base is not None and h[5] != base + p:
        raise CorruptEntry(f"entry names offset {h[5]}, found at {base + p}")
    return _new(BatchHead, (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[2], 0, 1, h[10], h[12]))


def walk2(buf, pos: int = 0, end: int | None = None, *, base: int | None = None,
          segment_end: int | None = None, read: str = "head", verify: bool = True,
          size_max: int | None = None) -> Walk2:
    """`codec.walk` for a log of either magic, by `codec.classify2` (the same rule, with TLE2
    starting an entry too; a TLE2 entry is at least BATCH_SIZE_MIN bytes). Iterate for
    (pos, item), then read `.stop`. `read`:
      "head"      a BatchHead, after every check: framing, the records' framing, the CRCs if
                  `verify`, the place if `base` (TLE1: `codec.header`, as a batch of one)
      "messages"  a list of Message (every check, as "head", and a UTF-8 topic)
      "meta"      a BatchMeta, framing only (size and magic): for verified logs, fast
      "frame"     the entry's size, framing only
    """
    return Walk2(buf, pos, len(buf) if end is None else end, base, segment_end, read, verify,
                 size_max)
