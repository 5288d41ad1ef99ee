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
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field

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
    """Raises HAProtocolError for a handshake over HANDSHAKE_BYTES_MAX (a receiver refuses it)."""
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


def _check(msg) -> None:
    """Field types, so a bad peer is refused here rather than failing later."""
    ints = {"min_offset", "end_offset", "epoch_seen", "epoch", "start", "first_index"}
    for name, value in asdict(msg).items():
        if name in ints and (type(value) is not int or value < 0):
            raise TypeError(f"{name} must be a non-negative integer, got {value!r}")
    if not isinstance(msg.node, str) or not msg.node:
        raise TypeError("node must be a non-empty string")
    if not isinstance(msg.epochs, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(type(x) is int and x >= 0 for x in e)
            for e in msg.epochs):
        raise TypeError("epochs must be a list of [epoch, start] pairs")
    if isinstance(msg, Welcome):
        if msg.truncate_to is not None and (type(msg.truncate_to) is not int or msg.truncate_to < 0):
            raise TypeError("truncate_to must be a non-negative integer or null")
        if type(msg.reset) is not bool:
            raise TypeError("reset must be true or false")


def encode_header(offset: int, size: int, epoch: int, master_end: int, confirm: int) -> bytes:
    """Raises HAProtocolError (naming the field) for a value its field cannot carry."""
    try:
        return HEADER.pack(offset, size, epoch, master_end, confirm)
    except struct.error:
        for name, v, bits in (("offset", offset, 64), ("body_size", size, 32), ("epoch", epoch, 32),
                              ("master_end", master_end, 64), ("confirm", confirm, 64)):
            if not isinstance(v, int) or not 0 <= v < 1 << bits:
                raise HAProtocolError(f"TRANSFER {name}: {v!r}, the limit is 0..2**{bits}-1") from None
        raise


def encode_report(offset: int) -> bytes:
    try:
        return REPORT.pack(offset)
    except struct.error:
        raise HAProtocolError(f"REPORT offset: {offset!r}, the limit is 0..2**64-1") from None
