"""Kafka's RecordBatch v2 (magic 2): split, check, read and write.

The batch (clients/.../record/DefaultRecordBatch.java, apache/kafka@1eb7644):

    offset  size  field
         0     8  base_offset             assigned by the broker: outside the CRC
         8     4  batch_length            bytes after this field
        12     4  partition_leader_epoch  assigned by the broker: outside the CRC
        16     1  magic                   2
        17     4  crc                     CRC-32C (Castagnoli) of bytes 21..end
        21     2  attributes              bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4,
                                          4 zstd), 3 timestamp type (1: log append time),
                                          4 transactional, 5 control batch
        23     4  last_offset_delta
        27     8  base_timestamp
        35     8  max_timestamp
        43     8  producer_id             -1: not idempotent
        51     2  producer_epoch
        53     4  base_sequence           the first record's sequence number
        57     4  records_count
        61     -  records                 compressed as a whole when attributes say so

A record (DefaultRecord.java), varints zig-zag encoded as protobuf's:

    length varint | attributes int8 | timestamp_delta varlong | offset_delta varint |
    key_length varint (-1 null) | key | value_length varint (-1 null) | value |
    headers_count varint | per header: key_length varint | key (UTF-8) | value_length varint | value

The broker checks the CRC once when a batch arrives and never recomputes it: the fields it
assigns (base_offset, partition_leader_epoch) are outside it, so a stored batch goes back to
consumers as the producer wrote it with two fields set in place (`place`).
"""

from __future__ import annotations

import mmap
import struct
import zlib
from typing import Iterator, NamedTuple

import cramjam
from crc32c import crc32c

from broker.store.codec_kafka import KAFKA_HEAD as HEAD  # the layout is the store's: one codec

HEAD_SIZE = HEAD.size  # 61
CRC_FROM = 21
LENGTH_OVERHEAD = 12  # base_offset + batch_length: not counted in batch_length
MAGIC = 2
COMPRESSION_MASK = 0x07
TIMESTAMP_LOG_APPEND = 0x08
TRANSACTIONAL = 0x10
CONTROL = 0x20
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
CODECS = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
RECORDS_MAX = 1 << 20  # more records than a batch the broker takes can hold
DECOMPRESSED_BYTES_MAX = 64 << 20  # a compression bomb is refused, not inflated
_XERIAL = b"\x82SNAPPY\x00"  # the Java client's snappy framing (xerial snappy-java)


class InvalidRecord(ValueError):
    """The batch cannot be taken; `code` is the Kafka error to answer with."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


CORRUPT_MESSAGE, UNSUPPORTED_FOR_MESSAGE_FORMAT, UNSUPPORTED_COMPRESSION_TYPE, INVALID_RECORD = 2, 43, 76, 87


class BatchHead(NamedTuple):
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def size(self) -> int:
        return self.batch_length + LENGTH_OVERHEAD

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL)


class Record(NamedTuple):
    offset_delta: int
    timestamp_delta: int
    key: bytes | None
    value: bytes | None
    headers: list  # [(str, bytes | None)]


class Batch(NamedTuple):
    head: BatchHead
    data: memoryview  # the whole batch, head included


def head(buf, pos: int = 0) -> BatchHead:
    return BatchHead(*HEAD.unpack_from(buf, pos))


def split(records) -> list[Batch]:
    """The batches of a Produce request's `records` field, each checked: magic 2, its length
    inside the data, its CRC, a records count that the length can hold. InvalidRecord otherwise
    (the whole partition's data is refused: Kafka's rule)."""
    buf = memoryview(records)
    out, pos, n = [], 0, len(buf)
    while pos < n:
        if n - pos < HEAD_SIZE:
            if n - pos >= 17 and buf[pos + 16] != MAGIC:
                raise InvalidRecord(UNSUPPORTED_FOR_MESSAGE_FORMAT, f"magic {buf[pos + 16]}: only record "
                                    "batches of magic 2 are taken (a client of Kafka 0.11 or later)")
            raise InvalidRecord(CORRUPT_MESSAGE, f"{n - pos} bytes at {pos}: shorter than a batch header")
        h = head(buf, pos)
        if h.magic != MAGIC:
            raise InvalidRecord(UNSUPPORTED_FOR_MESSAGE_FORMAT, f"magic {h.magic}: only record batches of "
                                "magic 2 are taken (a client of Kafka 0.11 or later)")
        if h.batch_length < HEAD_SIZE - LENGTH_OVERHEAD or pos + h.size > n:
            raise InvalidRecord(CORRUPT_MESSAGE, f"batch at {pos}: length {h.batch_length} does not fit "
                                f"the {n - pos} bytes left")
        data = buf[pos:pos + h.size]
        if crc32c(data[CRC_FROM:]) != h.crc:
            raise InvalidRecord(CORRUPT_MESSAGE, f"batch at {pos}: CRC-32C mismatch")
        if not 0 < h.records_count <= RECORDS_MAX or h.last_offset_delta != h.records_count - 1:
            if not h.is_control:
                raise InvalidRecord(INVALID_RECORD, f"batch at {pos}: {h.records_count} records with "
                                    f"last_offset_delta {h.last_offset_delta}")
        if h.compression not in CODECS:
            raise InvalidRecord(UNSUPPORTED_COMPRESSION_TYPE, f"batch at {pos}: compression {h.compression}")
        out.append(Batch(h, data))
        pos += h.size
    return out


# --- records -----------------------------------------------------------------------------

def decompress(codec: int, data) -> bytes:
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out = d.decompress(bytes(data), DECOMPRESSED_BYTES_MAX)
            if d.unconsumed_tail:
                raise InvalidRecord(INVALID_RECORD, f"gzip records inflate past {DECOMPRESSED_BYTES_MAX} bytes")
            return out
        if codec == SNAPPY:
            return _snappy(bytes(data))
        if codec == LZ4:
            return _bounded(cramjam.lz4.decompress_into, bytes(data), "lz4")
        if codec == ZSTD:
            return _bounded(cramjam.zstd.decompress_into, bytes(data), "zstd")
    except InvalidRecord:
        raise
    except Exception as e:  # noqa: BLE001 - each library has its own errors: one name for all
        raise InvalidRecord(CORRUPT_MESSAGE, f"{CODECS.get(codec, codec)} records do not decompress: {e}") from None
    raise InvalidRecord(UNSUPPORTED_COMPRESSION_TYPE, f"compression {codec}")


def _bounded(into, data: bytes, name: str, limit: int | None = None) -> bytes:
    """`into(data, buffer)` into a buffer of at most `limit` (DECOMPRESSED_BYTES_MAX) bytes: an
    anonymous mapping, whose pages exist only once written, so a compression bomb stops at the
    bound instead of filling memory."""
    limit = DECOMPRESSED_BYTES_MAX if limit is None else limit
    buf = mmap.mmap(-1, max(1, limit))
    try:
        try:
            n = into(data, buf)
        except cramjam.DecompressionError as e:
            if "whole buffer" in str(e) or "smaller than required" in str(e):
                raise InvalidRecord(INVALID_RECORD, f"{name} records inflate past {limit} bytes") from None
            raise
        return buf[:n]
    finally:
        buf.close()


def _snappy(data: bytes) -> bytes:
    if not data.startswith(_XERIAL):
        return _bounded(cramjam.snappy.decompress_raw_into, data, "snappy")
    out, pos, left = [], 16, DECOMPRESSED_BYTES_MAX  # magic 8, version 4, compatible 4; (length i32, block)*
    while pos < len(data):
        (n,) = struct.unpack_from(">i", data, pos)
        if n < 0 or pos + 4 + n > len(data):
            raise InvalidRecord(CORRUPT_MESSAGE, f"snappy block of {n} bytes at {pos} past the data's end")
        block = _bounded(cramjam.snappy.decompress_raw_into, data[pos + 4:pos + 4 + n], "snappy", left)
        left -= len(block)
        out.append(block)
        pos += 4 + n
    return b"".join(out)


def compress(codec: int, data: bytes) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        c = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return c.compress(data) + c.flush()
    if codec == SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"compression {codec}")


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    """A zig-zag varint at buf[pos]: (value, next pos)."""
    out = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise InvalidRecord(CORRUPT_MESSAGE, "a record's varint runs past its end")
        b = buf[pos]
        pos += 1
        out |= (b & 0x7F) << shift
        if not b & 0x80:
            return (out >> 1) ^ -(out & 1), pos
        shift += 7


def records(batch: Batch) -> Iterator[Record]:
    """The batch's records (decompressed), each checked to fit its length."""
    h = batch.head
    raw = decompress(h.compression, batch.data[HEAD_SIZE:])
    pos, end = 0, len(raw)
    for i in range(h.records_count):
        length, pos = _varint(raw, pos, end)
        stop = pos + length
        if length < 0 or stop > end:
            raise InvalidRecord(CORRUPT_MESSAGE, f"record {i}: length {length} past the batch's end")
        pos += 1  # attributes (unused)
        ts, pos = _varint(raw, pos, stop)
        od, pos = _varint(raw, pos, stop)
        key, pos = _blob(raw, pos, stop, f"record {i} key")
        value, pos = _blob(raw, pos, stop, f"record {i} value")
        nh, pos = _varint(raw, pos, stop)
        if not 0 <= nh <= stop - pos:
            raise InvalidRecord(CORRUPT_MESSAGE, f"record {i}: {nh} headers")
        headers = []
        for _ in range(nh):
            hk, pos = _blob(raw, pos, stop, f"record {i} header key")
            hv, pos = _blob(raw, pos, stop, f"record {i} header value")
            if hk is None:
                raise InvalidRecord(CORRUPT_MESSAGE, f"record {i}: a header without a key")
            try:
                headers.append((hk.decode(), hv))
            except UnicodeDecodeError:
                raise InvalidRecord(CORRUPT_MESSAGE, f"record {i}: a header key that is not UTF-8") from None
        if pos != stop:
            raise InvalidRecord(CORRUPT_MESSAGE, f"record {i}: {stop - pos} bytes left in it")
        yield Record(od, ts, key, value, headers)
    if pos != end:
        raise InvalidRecord(CORRUPT_MESSAGE, f"{end - pos} bytes after the last of {h.records_count} records")


def _blob(buf, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    n, pos = _varint(buf, pos, end)
    if n == -1:
        return None, pos
    if n < 0 or pos + n > end:
        raise InvalidRecord(CORRUPT_MESSAGE, f"{what}: length {n} past the record's end")
    return bytes(buf[pos:pos + n]), pos + n


# --- writing -------------------------------------------------------------------------------

def _zz(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _zz_blob(b: bytes | None) -> bytes:
    return _zz(-1) if b is None else _zz(len(b)) + b


def encode_record(r: Record) -> bytes:
    body = b"".join([b"\x00", _zz(r.timestamp_delta), _zz(r.offset_delta), _zz_blob(r.key), _zz_blob(r.value),
                     _zz(len(r.headers))] + [_zz_blob(k.encode()) + _zz_blob(v) for k, v in r.headers])
    return _zz(len(body)) + body


def encode(recs: list[Record], *, base_offset: int = 0, base_timestamp: int = 0, max_timestamp: int | None = None,
           producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1, compression: int = NONE,
           attributes: int = 0, leader_epoch: int = -1) -> bytes:
    """A batch of `recs` (offset deltas as given), its CRC computed."""
    if not recs:
        raise ValueError("a batch holds at least one record")
    payload = compress(compression, b"".join(encode_record(r) for r in recs))
    last = max(r.offset_delta for r in recs)
    if max_timestamp is None:
        max_timestamp = base_timestamp + max(r.timestamp_delta for r in recs)
    attrs = (attributes & ~COMPRESSION_MASK) | compression
    tail = struct.pack(">hiqqqhii", attrs, last, base_timestamp, max_timestamp, producer_id, producer_epoch,
                       base_sequence, len(recs)) + payload
    length = len(tail) + 9  # partition_leader_epoch 4, magic 1, crc 4
    return struct.pack(">qiibI", base_offset, length, leader_epoch, MAGIC, crc32c(tail)) + tail


_PLACE = struct.Struct(">q")
_EPOCH = struct.Struct(">i")


def place(batch: bytearray | memoryview, base_offset: int, leader_epoch: int) -> None:
    """Set the two broker-assigned fields in place (outside the CRC: nothing to recompute)."""
    _PLACE.pack_into(batch, 0, base_offset)
    _EPOCH.pack_into(batch, 12, leader_epoch)
