"""The CommitLog entry codec: the one place that knows how an entry is laid out in bytes.

Every mode (standalone, master-slave, raft), the recovery code, the replication code, the
pull path and the Spark reader encode and decode entries through this module only.

Entry layout (all integers big-endian, unsigned):

    off  size  field          meaning
      0     4  total_size     size of the whole entry in bytes, this field included
      4     4  magic          ENTRY_MAGIC ("TLE1"); BLANK_MAGIC ("TLB1") marks end-of-segment
      8     4  crc            CRC-32 (zlib/IEEE) of bytes [12, total_size): every field
                              after this one, header and payload alike, so a flipped bit in
                              the index, term, topic, properties or body is detected
     12     8  index          position in the log: contiguous from 0, never reused
     20     8  term           raft term / master-slave epoch of the writer (0 standalone)
     28     8  phys_offset    where this entry starts in the CommitLog (its own address)
     36     8  queue_offset   its slot in the ConsumeQueue of (topic, queue_id)
     44     8  store_ts_ms    when the (leader) broker stored it, ms since the epoch
     52     8  born_ts_ms     when the producer created it, ms since the epoch
     60    16  msg_id         producer-assigned unique id, the same on every retry
     76     4  queue_id
     80     4  flags          user flags, stored and returned untouched
     84     1  topic_len      1..TOPIC_BYTES_MAX
     85     2  props_len      0..PROPS_BYTES_MAX
     87     4  body_len
     91        topic (UTF-8) | properties | body

Record-batch entry, magic BATCH_MAGIC ("TLE2"): one CommitLog entry holds a producer's batch
(docs/design/batch-format.md). Its first 52 bytes are TLE1's, so `peek`, `peek_ids` and the
framing of a walk read both formats alike. TLE2 is what the broker writes by default
(`commitlog_format: 2`); its code is codec_batch.py.

    off  size  field              written by  covered by
      0     4  total_size         broker      framing (the record sizes must sum to it)
      4     4  magic "TLE2"       broker      framing
      8     4  head_crc           broker      CRC-32 of [12, 56): the broker-assigned fields
                                              and records_crc, so a flipped bit anywhere shows
     12     8  index              broker      head_crc   raft index / log position of the batch
     20     8  term               broker      head_crc
     28     8  phys_offset        broker      head_crc   the entry's own address
     36     8  base_queue_offset  broker      head_crc   queue offset of record 0
     44     8  store_ts_ms        broker      head_crc   one store time for the batch
     52     4  records_crc        producer    head_crc   CRC-32 of [56, total_size)
    ---- the zone: the producer's part, never rewritten by the broker ----
     56     2  attributes         producer    records_crc  bits 0-2 compression (only 0, none);
                                                           the other bits are reserved, 0
     58     2  count              producer    records_crc  1..BATCH_COUNT_MAX records
     60     4  queue_id           producer    records_crc
     64     1  topic_len          producer    records_crc  1..TOPIC_BYTES_MAX
     65        topic (UTF-8), then count x record:
    record  0     4  record_size  this field included: RECORD_SIZE + props_len + body_len
            4     4  flags
            8     8  born_ts_ms
           16    16  msg_id
           32     2  props_len    0..PROPS_BYTES_MAX
           34     4  body_len
           38        properties | body

Message k of a batch is at queue offset base_queue_offset + k and shares the batch's index,
term, phys_offset and store_ts_ms; (phys_offset, k) names it. A TLE1 entry reads as a batch
of one. The broker assigns the first 56 bytes in place and never recomputes records_crc.

Properties are `name 0x01 value 0x02` pairs (UTF-8), as in RocketMQ. Reserved names:
KEYS (space-separated business keys, indexed for lookup) and TAGS (one tag, filterable).

The end-of-segment marker is `total_size` (the bytes left in the segment) followed by
BLANK_MAGIC; a reader that meets it continues at the next segment. A region that starts with
zero bytes has never been written.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

try:  # the log's CRC-32s: zlib-ng's (SIMD), the same values as zlib's, ~3-4x faster from 1 KiB up
    from zlib_ng.zlib_ng import crc32
except ImportError:  # (not installed: zlib's, as before)
    crc32 = zlib.crc32

ENTRY_MAGIC = 0x544C4531  # "TLE1"
BLANK_MAGIC = 0x544C4231  # "TLB1"

HEADER = struct.Struct(">III QQQQQQ 16s II BHI")
HEADER_SIZE = HEADER.size  # 91
PREFIX = struct.Struct(">III")  # total_size, magic, crc
_BODY_HEADER = struct.Struct(">QQQQQQ 16s II BHI")  # the part after the crc
_SIZE_MAGIC = struct.Struct(">II")
# The fields an indexer needs, read in one go: size, magic, phys_offset, queue_offset,
# store_ts_ms, msg_id, queue_id, topic_len, props_len (topic and properties follow the header).
META = struct.Struct(">II 4x 8x 8x QQQ 8x 16s I 4x BH")
CRC_START = 12
BLANK_SIZE_MIN = 8  # a segment always keeps room for the end-of-segment marker

TOPIC_BYTES_MAX = 127  # RocketMQ's topic length limit
PROPS_BYTES_MAX = 32767  # RocketMQ's properties length limit
MSG_ID_SIZE = 16

# TLE2, the record batch (layout above; the code is in codec_batch.py)
BATCH_MAGIC = 0x544C4532  # "TLE2"
BATCH_HEAD = struct.Struct(">III QQQQQ I")  # size, magic, head_crc .. records_crc
BATCH_HEAD_SIZE = BATCH_HEAD.size  # 56: where the zone starts
HEAD_CRC_START, HEAD_CRC_END = CRC_START, BATCH_HEAD_SIZE
ZONE_HEAD = struct.Struct(">HHIB")  # attributes, count, queue_id, topic_len
ZONE_TOPIC_AT = ZONE_HEAD.size  # 9: the topic's offset in the zone
BATCH_TOPIC_AT = BATCH_HEAD_SIZE + ZONE_TOPIC_AT  # 65: the topic's offset in the entry
RECORD = struct.Struct(">II Q 16s HI")  # record_size, flags, born_ts_ms, msg_id, props_len, body_len
RECORD_SIZE = RECORD.size  # 38
BATCH_SIZE_MIN = BATCH_TOPIC_AT + 1 + RECORD_SIZE  # 104: a one-byte topic, one empty record
BATCH_COUNT_MAX = 0xFFFF  # the count field's range; the broker's batch_messages_max is lower
ATTR_COMPRESSION_MASK = 0x0007

PROP_KEYS = "KEYS"
PROP_TAGS = "TAGS"
_NAME_SEP = "\x01"
_PAIR_SEP = "\x02"


class CorruptEntry(Exception):
    """Bytes that do not decode as an entry; `reason` names what is wrong."""

    def __init__(self, reason: str, offset: int | None = None):
        self.reason = reason
        self.offset = offset
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"corrupt entry{where}: {reason}")


class Entry(NamedTuple):
    """One decoded CommitLog entry (a NamedTuple: built once per message on hot paths)."""

    index: int
    term: int
    phys_offset: int
    queue_offset: int
    store_ts_ms: int
    born_ts_ms: int
    msg_id: bytes
    queue_id: int
    flags: int
    topic: str
    properties: bytes
    body: bytes
    size: int

    def props(self) -> dict[str, str]:
        return decode_properties(self.properties)

    @property
    def keys(self) -> list[str]:
        return keys_of(self.properties)

    @property
    def tags(self) -> str | None:
        return self.props().get(PROP_TAGS)


def entry_size(topic_len: int, props_len: int, body_len: int) -> int:
    return HEADER_SIZE + topic_len + props_len + body_len


def encode_parts(
    index: int,
    term: int,
    phys_offset: int,
    queue_offset: int,
    store_ts_ms: int,
    born_ts_ms: int,
    msg_id: bytes,
    queue_id: int,
    flags: int,
    topic: bytes,
    properties: bytes,
    body: bytes,
) -> tuple[bytes, bytes, bytes, bytes]:
    """An entry as (header, topic, properties, body), ready for a gathering write (no copy of
    the body). `topic` is UTF-8 bytes; callers validate lengths beforehand."""
    tail = _BODY_HEADER.pack(index, term, phys_offset, queue_offset, store_ts_ms, born_ts_ms,
                             msg_id, queue_id, flags, len(topic), len(properties), len(body))
    crc = crc32(body, crc32(properties, crc32(topic, crc32(tail))))
    size = HEADER_SIZE + len(topic) + len(properties) + len(body)
    return PREFIX.pack(size, ENTRY_MAGIC, crc) + tail, topic, properties, body


def encode(*fields) -> bytes:
    """One entry as bytes (see encode_parts for the arguments)."""
    return b"".join(encode_parts(*fields))


def encode_blank(size: int) -> bytes:
    """The end-of-segment marker for the `size` bytes left in a segment (size >= 8)."""
    return _SIZE_MAGIC.pack(size, BLANK_MAGIC)


def peek(buf, pos: int = 0) -> tuple[int, int]:
    """(total_size, magic) at `pos`; (0, 0) for never-written space. CorruptEntry if fewer
    than 8 bytes are there (callers check first; this names the problem if one did not)."""
    try:
        return _SIZE_MAGIC.unpack_from(buf, pos)
    except struct.error:
        raise CorruptEntry(f"truncated: {max(len(buf) - pos, 0)} of {_SIZE_MAGIC.size} bytes "
                           "for size and magic") from None


def header(buf, pos: int = 0, verify: bool = True, where: int | None = None) -> tuple:
    """The header fields of the entry at `pos` (in HEADER's order: size, magic, crc, index,
    term, phys_offset, queue_offset, store_ts_ms, born_ts_ms, msg_id, queue_id, flags,
    topic_len, props_len, body_len) once its framing and, with `verify`, its CRC hold. Copies
    nothing. Raises CorruptEntry with the reason (`where`: the offset to name in it)."""
    avail = len(buf) - pos
    if avail < HEADER_SIZE:
        raise CorruptEntry(f"truncated header ({avail} of {HEADER_SIZE} bytes)", where)
    h = HEADER.unpack_from(buf, pos)
    size, magic, crc = h[0], h[1], h[2]
    if magic != ENTRY_MAGIC:
        raise CorruptEntry(f"bad magic 0x{magic:08x}", where)
    if size != HEADER_SIZE + h[12] + h[13] + h[14]:
        raise CorruptEntry(f"size {size} disagrees with its field lengths", where)
    if size > avail:
        raise CorruptEntry(f"truncated entry ({avail} of {size} bytes)", where)
    if h[12] == 0:
        raise CorruptEntry("empty topic", where)
    if verify and crc32(memoryview(buf)[pos + CRC_START:pos + size]) != crc:
        raise CorruptEntry("CRC mismatch", where)
    return h


def decode(buf, pos: int = 0, verify: bool = True, base_offset: int | None = None,
           topic_errors: str = "strict") -> Entry:
    """Decode the entry that starts at `pos` in `buf`.

    `verify` checks the CRC; `base_offset` (the file offset of buf[0]) also checks that the
    entry sits at the physical offset it names. Raises CorruptEntry with the reason.
    """
    where = None if base_offset is None else base_offset + pos
    (size, _, _, index, term, phys, qoff, store_ts, born_ts, msg_id, queue_id, flags,
     topic_len, props_len, body_len) = header(buf, pos, verify, where)
    if base_offset is not None and phys != base_offset + pos:
        raise CorruptEntry(f"entry names offset {phys}, found at {base_offset + pos}", where)
    p = pos + HEADER_SIZE
    try:
        topic = bytes(buf[p:p + topic_len]).decode("utf-8", topic_errors)
    except UnicodeDecodeError:
        raise CorruptEntry("topic is not UTF-8", where) from None
    p += topic_len
    props = bytes(buf[p:p + props_len])
    p += props_len
    return Entry(index, term, phys, qoff, store_ts, born_ts, msg_id, queue_id, flags, topic,
                 props, bytes(buf[p:p + body_len]), size)


def inspect(buf, pos: int = 0) -> tuple[Entry, int, bool]:
    """(entry, stored CRC, CRC ok) without stopping at a bad CRC: for tools that must report a
    damaged entry and read on (the reconcile job). Its fields are only trustworthy when the
    CRC is ok. Damage to the framing itself (magic, lengths) still raises CorruptEntry."""
    e = decode(buf, pos, verify=False, topic_errors="replace")
    crc = PREFIX.unpack_from(buf, pos)[2]
    return e, crc, crc32(memoryview(buf)[pos + CRC_START:pos + e.size]) == crc


def check(buf, pos: int = 0) -> tuple[int, int, int, int]:
    """Verify the entry at `pos` (magic, lengths, CRC) without decoding its fields:
    (size, index, term, phys_offset). Raises CorruptEntry."""
    h = header(buf, pos)
    return h[0], h[3], h[4], h[5]


_IDS = struct.Struct(">QQQ")


def peek_ids(buf, pos: int = 0) -> tuple[int, int, int]:
    """(index, term, phys_offset) of the entry at `pos`, unverified (for routing only).
    CorruptEntry if the buffer is too short to hold them."""
    try:
        return _IDS.unpack_from(buf, pos + CRC_START)
    except struct.error:
        raise CorruptEntry(f"truncated header ({max(len(buf) - pos, 0)} bytes)") from None


def iter_entries(buf, verify: bool = True):
    """Decode consecutive whole entries from a buffer (e.g. the body of a pull response)."""
    pos, end = 0, len(buf)
    while pos < end:
        e = decode(buf, pos, verify=verify)
        yield e
        pos += e.size


# --- walking a run of entries ------------------------------------------------------------
#
# Every loop that reads CommitLog bytes entry by entry (recovery, dispatch, the log reader, the
# Spark reader, the slave's stream) goes through `walk`, so they all recognise the same things
# in the same way. At position p (buffer coordinates; `end` is where the buffer's valid bytes
# stop, `segment_end` where the segment ends if the caller knows it), in this order:
#
#   condition                                               stop / item
#   segment_end known and segment_end - p < 8               CORRUPT "segment ends without an
#                                                            end-of-segment marker"
#   end - p < 8                                             PARTIAL (need 8 bytes)
#   size == 0 and magic == 0                                END: never written (zero fill)
#   magic == BLANK_MAGIC, size >= 8 (and == segment_end-p   MARKER: the segment ends; the log
#     when segment_end is known)                              goes on at p + size
#   magic == BLANK_MAGIC otherwise                          CORRUPT (marker of a wrong size)
#   magic != ENTRY_MAGIC                                    CORRUPT "bad magic"
#   size < HEADER_SIZE, size > size_max, or (segment_end    CORRUPT "entry size ... impossible"
#     known) p + size + 8 > segment_end
#   p + size > end                                          PARTIAL (need `size` bytes at p)
#   the entry does not check out at the level `read` asks   CORRUPT (the codec's reason)
#   otherwise                                               yield (p, item); p += size
#
# Nothing else ends a walk, and nothing raises out of it: arbitrary bytes end in a Stop.
#
# `walk2`/`classify2` (codec_batch.py) apply the same rule with BATCH_MAGIC starting an entry
# too (smallest size BATCH_SIZE_MIN instead of HEADER_SIZE): every reader of a log uses them.
# `walk`/`classify` stay TLE1-only (TLE1's own tools and tests).

END = "end"  # zero bytes: never written, the end of the log
MARKER = "marker"  # an end-of-segment marker: the log goes on at the next segment
PARTIAL = "partial"  # what starts here runs past the buffer: read more bytes
CORRUPT = "corrupt"  # not an entry, nor a marker, nor never-written space


class Stop(NamedTuple):
    """Why a walk ended. `pos` is in buffer coordinates; `size` is the marker's size (MARKER)
    or the bytes needed at `pos` (PARTIAL); `reason` says what is wrong (CORRUPT)."""

    kind: str
    pos: int
    size: int = 0
    reason: str | None = None


def classify(buf, pos: int, end: int, segment_end: int | None = None,
             size_max: int | None = None, both_magics: bool = False) -> Stop | None:
    """The walk rule for the bytes at `pos`: None when a whole entry with sane framing
    (magic, size) starts there, else the Stop. Checks no fields beyond size and magic.
    `both_magics` (via `classify2`, the two-magic walk's rule) lets a TLE2 entry start there
    too; without it (today's readers) only TLE1 does, and TLE2 is a bad magic."""
    if segment_end is not None and segment_end - pos < BLANK_SIZE_MIN:
        return Stop(CORRUPT, pos, 0, "segment ends without an end-of-segment marker")
    left = end - pos
    if left < BLANK_SIZE_MIN:
        return Stop(PARTIAL, pos, BLANK_SIZE_MIN)
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    if magic == ENTRY_MAGIC or (both_magics and magic == BATCH_MAGIC):
        if size < (HEADER_SIZE if magic == ENTRY_MAGIC else BATCH_SIZE_MIN) or (size_max is not None and size > size_max) or (
                segment_end is not None and pos + size + BLANK_SIZE_MIN > segment_end):
            return Stop(CORRUPT, pos, 0, f"entry size {size} is impossible here")
        if size > left:
            return Stop(PARTIAL, pos, size)
        return None
    if size == 0 and magic == 0:
        return Stop(END, pos)
    if magic == BLANK_MAGIC:
        if size < BLANK_SIZE_MIN or (segment_end is not None and size != segment_end - pos):
            seg_left = "" if segment_end is None else f", {segment_end - pos} left"
            return Stop(CORRUPT, pos, 0, f"end-of-segment marker of {size} bytes{seg_left}")
        return Stop(MARKER, pos, size)
    return Stop(CORRUPT, pos, 0, f"bad magic 0x{magic:08x}")


class Walk:
    """An iteration over the entries of `buf` from `pos` (see `walk`); `stop` is set once it
    is exhausted."""

    __slots__ = ("buf", "pos", "end", "base", "segment_end", "read", "verify", "size_max", "stop")

    def __init__(self, buf, pos, end, base, segment_end, read, verify, size_max):
        self.buf, self.pos, self.end, self.base = buf, pos, end, base
        self.segment_end, self.read, self.verify, self.size_max = segment_end, read, verify, size_max
        self.stop: Stop | None = None

    def __iter__(self):
        buf, p, end, base = self.buf, self.pos, self.end, self.base
        seg_end, read, verify, size_max = self.segment_end, self.read, self.verify, self.size_max
        # fast path: an entry's size and magic read once (with the fields `read` wants when it
        # is "meta"); anything unusual goes to `classify`, the one rule
        hsize, magic_ok = HEADER_SIZE, ENTRY_MAGIC
        limit = end if seg_end is None else min(end, seg_end - BLANK_SIZE_MIN)
        if read == "meta":
            meta = META.unpack_from
            while p + hsize <= limit:
                m = meta(buf, p)
                size = m[0]
                if m[1] != magic_ok or size < hsize or p + size > limit or (
                        size_max is not None and size > size_max):
                    break
                yield p, m
                p += size
        elif read == "frame":
            peek_ = _SIZE_MAGIC.unpack_from
            while p + BLANK_SIZE_MIN <= limit:
                size, magic = peek_(buf, p)
                if magic != magic_ok or size < hsize or p + size > limit or (
                        size_max is not None and size > size_max):
                    break
                yield p, size
                p += size
        else:
            while True:
                stop = classify(buf, p, end, seg_end, size_max)
                if stop is not None:
                    self.pos, self.stop = p, stop
                    return
                try:
                    if read == "entry":
                        item = decode(buf, p, verify, base_offset=base)
                    else:  # "header"
                        item = header(buf, p, verify)
                        if base is not None and item[5] != base + p:
                            raise CorruptEntry(f"entry names offset {item[5]}, found at {base + p}")
                except CorruptEntry as err:
                    self.pos, self.stop = p, Stop(CORRUPT, p, 0, err.reason)
                    return
                yield p, item
                p += item[0] if read == "header" else item.size
        # the fast paths end here: say why, by the rule
        self.pos, self.stop = p, classify(buf, p, end, seg_end, size_max) or Stop(
            CORRUPT, p, 0, "the walk stopped at a whole entry")  # unreachable: same checks


def classify2(buf, pos: int, end: int, segment_end: int | None = None,
              size_max: int | None = None) -> Stop | None:
    """`classify` with both magics (TLE1 and TLE2) starting an entry: the rule of `walk2`."""
    return classify(buf, pos, end, segment_end, size_max, True)


def walk(buf, pos: int = 0, end: int | None = None, *, base: int | None = None,
         segment_end: int | None = None, read: str = "entry", verify: bool = True,
         size_max: int | None = None) -> Walk:
    """Walk the entries of `buf[pos:end]` by the rule above; iterate for (pos, item), then
    read `.stop` (a Stop: END, MARKER, PARTIAL or CORRUPT) to learn why the walk ended.

    `read` is what each item is, and how much of an entry is checked before it is yielded:
      "entry"   an Entry (`decode`: framing, lengths, UTF-8 topic, the CRC if `verify`)
      "header"  the HEADER fields (`header`: framing, lengths, the CRC if `verify`)
      "meta"    the META fields, framing only (size and magic): for verified logs, fast
      "frame"   the entry's size, framing only: for bytes another check verifies later
    `base` (the log offset of buf[0]) also checks, for "entry" and "header", that each entry
    names the offset it sits at. `segment_end` (buffer coordinates) enables the segment
    rules: the marker fills the segment exactly, an entry leaves room for the marker.
    """
    return Walk(buf, pos, len(buf) if end is None else end, base, segment_end, read, verify,
                size_max)


# --- properties -------------------------------------------------------------------------


def encode_properties(props: dict[str, str] | None) -> bytes:
    if not props:
        return b""
    parts = []
    for name, value in props.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise ValueError("property names and values must be strings")
        if not name or _NAME_SEP in name or _PAIR_SEP in name:
            raise ValueError(f"bad property name {name!r}")
        if _NAME_SEP in value or _PAIR_SEP in value:
            raise ValueError(f"property {name!r} contains a reserved separator character")
        parts.append(f"{name}{_NAME_SEP}{value}{_PAIR_SEP}")
    out = "".join(parts).encode()
    if len(out) > PROPS_BYTES_MAX:
        raise ValueError(f"properties are {len(out)} bytes, at most {PROPS_BYTES_MAX}")
    return out


def decode_properties(raw: bytes) -> dict[str, str]:
    if not raw:
        return {}
    out = {}
    for pair in raw.decode(errors="replace").split(_PAIR_SEP):
        if pair:
            name, _, value = pair.partition(_NAME_SEP)
            out[name] = value
    return out


def message_properties(keys=None, tags: str | None = None, user: dict | None = None) -> bytes:
    """Encode a message's properties: keys (a string or a list), one tag, user properties."""
    props = dict(user or {})
    for reserved in (PROP_KEYS, PROP_TAGS):
        if reserved in props:
            raise ValueError(f"{reserved} is reserved: pass it as keys=/tags=")
    if keys:
        klist = [keys] if isinstance(keys, str) else list(keys)
        for k in klist:
            if not k or " " in k:
                raise ValueError(f"bad key {k!r}: keys are non-empty and contain no spaces")
        props[PROP_KEYS] = " ".join(klist)
    if tags:
        if "||" in tags:
            raise ValueError("a message carries one tag; '||' is for subscriptions")
        props[PROP_TAGS] = tags
    return encode_properties(props)


def keys_of(raw: bytes) -> list[str]:
    if not raw:
        return []
    v = decode_properties(raw).get(PROP_KEYS)
    return v.split(" ") if v else []


def tag_of(raw: bytes) -> str | None:
    if not raw:
        return None
    return decode_properties(raw).get(PROP_TAGS)


def tag_hash(tag: str | None) -> int:
    """The tag code stored in ConsumeQueue records (0 means: no tag). Stable across processes."""
    return zlib.crc32(tag.encode()) + 1 if tag else 0


# --- TLE2: the code lives in codec_batch.py ----------------------------------------------
# Re-exported lazily (PEP 562) so that this module still imports on its own, without the
# TLE2 half, wherever only TLE1 is read (the Spark job ships both: reconcile_main.SHIPPED).

_BATCH_API = frozenset((
    "BatchLimitError", "BatchHead", "BatchMeta", "BatchRecord", "RecordHead", "Batch", "Message",
    "encode_head", "encode_zone", "encode_batch", "check_batch", "walk_records", "decode_batch",
    "iter_messages", "walk2", "Walk2", "check_entry", "frame_zone", "zone_ids_keys", "is_kafka"))


def __getattr__(name: str):
    if name in _BATCH_API:
        from broker.store import codec_batch
        return getattr(codec_batch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
