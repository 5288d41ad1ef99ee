"""The HA wire: how a slave copies its master's CommitLog (after RocketMQ's HAConnection /
HAClient, with RocketMQ 5's epoch handshake). One TCP connection per slave, to the master's
HA address (`ha_address`; by default the client port + 1, as RocketMQ's 10911/10912).

Slave -> master
    HELLO     once, first:  u32 length | JSON Hello
    REPORT    then only:    u64 offset: the end of the slave's CommitLog that it holds
                            (durably, under its flush policy); sent at start, after each
                            append and at least every `ha_heartbeat_interval_ms`

Master -> slave
    WELCOME   once, first:  u32 length | JSON Welcome (or a refusal naming the master)
    TRANSFER  then only:    a 32-byte header, then `body_size` bytes of CommitLog

    TRANSFER header (big-endian):
        off  size  field
          0     8  offset       CommitLog offset of the body's first byte
          8     4  body_size    0 for a heartbeat (nothing new; the fields below are news)
         12     4  epoch        the master's current epoch
         16     8  master_end   the master's CommitLog end offset when this was sent
         24     8  confirm      how far the master lets consumers read (its high watermark)
    The body is raw CommitLog bytes [offset, offset + body_size): entries and end-of-segment
    markers in the codec of broker/store/codec.py, possibly cut mid-entry at either end.
    Bodies follow each other without gaps; the slave appends only at its exact end.

All integers are unsigned big-endian; JSON is UTF-8.

Numbers are range-checked on both sides against epochs.py's bounds, narrower than their fields:
epochs 0..EPOCH_MAX, offsets and indexes 0..OFFSET_MAX. Decoders (decode_handshake,
decode_header, decode_report) and encoders raise HAProtocolError naming the field and the limit.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field

from replication.master_slave.epochs import EPOCH_MAX, OFFSET_MAX

HEADER = struct.Struct(">QIIQQ")
REPORT = struct.Struct(">Q")
_LEN = struct.Struct(">I")
HANDSHAKE_BYTES_MAX = 1 << 20
VERSION = 1


class HAProtocolError(ValueError):
    """Bytes on an HA connection that do not follow this protocol: the connection is closed."""


@dataclass(frozen=True)
class Hello:
    node: str
    epochs: list  # [[epoch, start], ...]
    min_offset: int
    end_offset: int
    epoch_seen: int  # the highest epoch this slave has heard of
    version: int = VERSION


@dataclass(frozen=True)
class Welcome:
    node: str
    epoch: int = 0
    epochs: list = field(default_factory=list)
    start: int = 0  # the master streams from here
    first_index: int = 0  # the index of the entry at `start` (needed with `reset`)
    truncate_to: int | None = None  # the slave first cuts its log here
    reset: bool = False  # the slave drops its log; the first entry streamed restarts it
    error: str | None = None  # a refusal (e.g. "not the master"); then `master` may say who is
    master: str | None = None
    version: int = VERSION


def encode_handshake(msg) -> bytes:
    """Raises HAProtocolError for a handshake over HANDSHAKE_BYTES_MAX or with a field its
    receiver refuses (a number out of range: the same check as the decoder's)."""
    try:
        _check(msg)
    except TypeError as e:
        raise HAProtocolError(f"{type(msg).__name__}: {e}") from None
    body = json.dumps(asdict(msg), separators=(",", ":")).encode()
    if len(body) > HANDSHAKE_BYTES_MAX:
        raise HAProtocolError(f"{type(msg).__name__} of {len(body)} bytes exceeds "
                              f"HANDSHAKE_BYTES_MAX={HANDSHAKE_BYTES_MAX}")
    return _LEN.pack(len(body)) + body


def decode_handshake(buf, cls):
    """(message, bytes used) from the front of `buf`, or (None, 0) if it is not all there."""
    if len(buf) < _LEN.size:
        return None, 0
    (n,) = _LEN.unpack_from(buf)
    if n > HANDSHAKE_BYTES_MAX:
        raise HAProtocolError(f"handshake of {n} bytes exceeds {HANDSHAKE_BYTES_MAX}")
    if len(buf) < _LEN.size + n:
        return None, 0
    try:
        d = json.loads(bytes(buf[_LEN.size:_LEN.size + n]))
        if not isinstance(d, dict):
            raise TypeError("not an object")
        if d.get("version") != VERSION:
            raise HAProtocolError(f"HA protocol version {d.get('version')!r}, this node speaks {VERSION}")
        msg = cls(**d)
        _check(msg)
    except HAProtocolError:
        raise
    except (ValueError, TypeError, RecursionError) as e:  # RecursionError: JSON nested too deep
        raise HAProtocolError(f"bad {cls.__name__}: {type(e).__name__}: {e}") from None
    return msg, _LEN.size + n


_RANGES = (("epoch", EPOCH_MAX, "EPOCH_MAX"), ("epoch_seen", EPOCH_MAX, "EPOCH_MAX"),
           ("min_offset", OFFSET_MAX, "OFFSET_MAX"), ("end_offset", OFFSET_MAX, "OFFSET_MAX"),
           ("start", OFFSET_MAX, "OFFSET_MAX"), ("first_index", OFFSET_MAX, "OFFSET_MAX"))


def _in_range(value, hi: int) -> bool:
    return type(value) is int and 0 <= value <= hi


def _check(msg) -> None:
    """Field types and ranges, so a bad peer is refused here rather than failing later."""
    for name, hi, limit in _RANGES:
        if hasattr(msg, name):
            value = getattr(msg, name)
            if not _in_range(value, hi):
                raise TypeError(f"{name} must be an integer in 0..{limit}={hi}, got {value!r}")
    if not isinstance(msg.node, str) or not msg.node:
        raise TypeError("node must be a non-empty string")
    if not isinstance(msg.epochs, list) or not all(
            isinstance(e, list) and len(e) == 2 and _in_range(e[0], EPOCH_MAX) and _in_range(e[1], OFFSET_MAX)
            for e in msg.epochs):
        raise TypeError(f"epochs must be a list of [epoch, start] pairs, epoch in 0..EPOCH_MAX={EPOCH_MAX}, "
                        f"start in 0..OFFSET_MAX={OFFSET_MAX}")
    if isinstance(msg, Welcome):
        if msg.truncate_to is not None and not _in_range(msg.truncate_to, OFFSET_MAX):
            raise TypeError(f"truncate_to must be an integer in 0..OFFSET_MAX={OFFSET_MAX} or null")
        if type(msg.reset) is not bool:
            raise TypeError("reset must be true or false")


def _header_problem(offset, size, epoch, master_end, confirm) -> str | None:
    for name, v, hi, limit in (("offset", offset, OFFSET_MAX, "OFFSET_MAX"), ("body_size", size, 2**32 - 1, "2**32-1"),
                               ("epoch", epoch, EPOCH_MAX, "EPOCH_MAX"),
                               ("master_end", master_end, OFFSET_MAX, "OFFSET_MAX"),
                               ("confirm", confirm, OFFSET_MAX, "OFFSET_MAX")):
        if not _in_range(v, hi):
            return f"TRANSFER {name}: {v!r}, the limit is 0..{limit}={hi}"
    return None


def encode_header(offset: int, size: int, epoch: int, master_end: int, confirm: int) -> bytes:
    """Raises HAProtocolError (naming the field) for a value out of its range."""
    try:
        if offset <= OFFSET_MAX and epoch <= EPOCH_MAX and master_end <= OFFSET_MAX and confirm <= OFFSET_MAX:
            return HEADER.pack(offset, size, epoch, master_end, confirm)
    except (struct.error, TypeError):
        pass
    raise HAProtocolError(_header_problem(offset, size, epoch, master_end, confirm) or "TRANSFER header: a bad field")


def decode_header(buf, pos: int = 0) -> tuple[int, int, int, int, int]:
    """(offset, body_size, epoch, master_end, confirm) of the TRANSFER header at `pos`; raises
    HAProtocolError naming a field out of its range."""
    fields = HEADER.unpack_from(buf, pos)
    offset, _, epoch, master_end, confirm = fields
    if offset > OFFSET_MAX or epoch > EPOCH_MAX or master_end > OFFSET_MAX or confirm > OFFSET_MAX:
        raise HAProtocolError(_header_problem(*fields))
    return fields


def encode_report(offset: int) -> bytes:
    if not _in_range(offset, OFFSET_MAX):
        raise HAProtocolError(f"REPORT offset: {offset!r}, the limit is 0..OFFSET_MAX={OFFSET_MAX}")
    return REPORT.pack(offset)


def decode_report(buf, pos: int = 0) -> int:
    """The offset of the REPORT at `pos`; raises HAProtocolError past OFFSET_MAX."""
    (offset,) = REPORT.unpack_from(buf, pos)
    if offset > OFFSET_MAX:
        raise HAProtocolError(f"REPORT offset: {offset}, the limit is 0..OFFSET_MAX={OFFSET_MAX}")
    return offset
