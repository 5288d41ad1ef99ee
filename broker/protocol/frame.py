"""Frames: how every request and response travels over TCP (clients and, later, peers).

Frame layout (big-endian):

    off  size  field
      0     4  frame_size   the whole frame in bytes, this field included
      4     2  magic        0x544C ("TL"): anything else is not a Tidelog frame
      6     1  version      protocol version of the sender (PROTOCOL_VERSION)
      7     1  flags        bit 0 RESPONSE, bit 1 ONEWAY (no response wanted)
      8     2  code         request code (Req) or, in a response, the result (Code)
     10     4  corr_id      chosen by the requester; a response carries its request's
     14     2  header_len   size of the header map
     16        header map (header_len bytes) | body (the rest of the frame)

Header map: count u16, then per entry key_len u8 | key | value_len u16 | value (UTF-8).
It carries small extras (an error message, a leader's address); bodies are defined per
message family in the sibling modules.

Versions: a receiver accepts MIN_VERSION..PROTOCOL_VERSION and answers in the request's
version, so nodes of adjacent releases talk to each other during a rolling upgrade.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from broker.protocol.codes import Code, FieldLimitError, check_int, check_len

HEADER = struct.Struct(">IHBBHIH")
HEADER_SIZE = HEADER.size  # 16
MAGIC = 0x544C
PROTOCOL_VERSION = 1
MIN_VERSION = 1
FLAG_RESPONSE = 0x01
FLAG_ONEWAY = 0x02
FRAME_BYTES_MAX_DEFAULT = 16 << 20
HEADER_MAP_BYTES_MAX = 16 << 10
READ_MIN = 64 << 10  # FrameReader compacts when less room than this is left for a read
HEADER_KEY_BYTES_MAX = 255  # key_len u8
HEADER_VALUE_BYTES_MAX = 65535  # value_len u16
ERROR_BYTES_MAX = 4096  # a response's "error" text is cut to this (it may quote what it refuses)
FRAME_SIZE_MAX = 0xFFFFFFFF  # frame_size u32


class FrameError(Exception):
    """A frame that cannot be read. `code` names the problem; `corr_id` is known or None."""

    def __init__(self, code: Code, message: str, corr_id: int | None = None):
        self.code = code
        self.corr_id = corr_id
        super().__init__(message)


class Frame(NamedTuple):
    version: int
    flags: int
    code: int
    corr_id: int
    headers: dict[str, str]
    body: memoryview  # bytes-like; bytes(frame.body) for a copy

    @property
    def is_response(self) -> bool:
        return bool(self.flags & FLAG_RESPONSE)

    @property
    def oneway(self) -> bool:
        return bool(self.flags & FLAG_ONEWAY)


_EMPTY: dict[str, str] = {}


def encode_headers(headers: dict[str, str] | None) -> bytes:
    """Raises FieldLimitError for a map the wire cannot carry (or a receiver would refuse:
    over HEADER_MAP_BYTES_MAX)."""
    if not headers:
        return b""
    check_int("header count", len(headers), 0, 0xFFFF)
    parts = [struct.pack(">H", len(headers))]
    for k, v in headers.items():
        kb, vb = str(k).encode(), str(v).encode()
        check_len(f"header key {str(k)[:40]!r}", kb, HEADER_KEY_BYTES_MAX, "HEADER_KEY_BYTES_MAX")
        check_len(f"header {str(k)[:40]!r}", vb, HEADER_VALUE_BYTES_MAX, "HEADER_VALUE_BYTES_MAX")
        parts += [struct.pack(">B", len(kb)), kb, struct.pack(">H", len(vb)), vb]
    out = b"".join(parts)
    check_len("header map", out, HEADER_MAP_BYTES_MAX, "HEADER_MAP_BYTES_MAX")
    return out


def cut_error(text: str) -> str:
    """An error text short enough for a header: an answer must get out even when the error
    quotes a huge request (a 1 MB topic name)."""
    b = text.encode()
    if len(b) <= ERROR_BYTES_MAX:
        return text
    return b[:ERROR_BYTES_MAX - 40].decode(errors="ignore") + f"... ({len(b)} bytes, cut)"


def decode_headers(raw) -> dict[str, str]:
    if not raw:
        return _EMPTY
    try:
        (count,) = struct.unpack_from(">H", raw, 0)
        pos, out = 2, {}
        for _ in range(count):
            kl = raw[pos]
            if pos + 1 + kl + 2 > len(raw):
                raise ValueError("entry runs past the map")
            k = bytes(raw[pos + 1:pos + 1 + kl]).decode()
            pos += 1 + kl
            (vl,) = struct.unpack_from(">H", raw, pos)
            if pos + 2 + vl > len(raw):
                raise ValueError("value runs past the map")
            out[k] = bytes(raw[pos + 2:pos + 2 + vl]).decode()
            pos += 2 + vl
        if pos != len(raw):
            raise ValueError("trailing bytes")
        return out
    except (struct.error, IndexError, ValueError, UnicodeDecodeError) as e:
        raise FrameError(Code.BAD_FRAME, f"malformed header map: {e}") from None


def _pack_header(size: int, version: int, flags: int, code: int, corr_id: int, hlen: int) -> bytes:
    try:
        return HEADER.pack(size, MAGIC, version, flags, code, corr_id, hlen)
    except struct.error:
        check_int("frame size", size, HEADER_SIZE, FRAME_SIZE_MAX)
        check_int("version", version, 0, 0xFF)
        check_int("flags", flags, 0, 0xFF)
        check_int("code", code, 0, 0xFFFF)
        check_int("corr_id", corr_id, 0, 0xFFFFFFFF)
        raise FieldLimitError("frame header", "a field", "see broker/protocol/frame.py") from None


def encode(code: int, corr_id: int, body: bytes = b"", headers: dict | None = None,
           flags: int = 0, version: int = PROTOCOL_VERSION) -> bytes:
    """Raises FieldLimitError for a field the frame cannot carry."""
    hm = encode_headers(headers) if headers else b""
    return _pack_header(HEADER_SIZE + len(hm) + len(body), version, flags, code, corr_id, len(hm)) + hm + body


def encode_header(code: int, corr_id: int, body_len: int, flags: int = 0,
                  version: int = PROTOCOL_VERSION) -> bytes:
    """The fixed header of a frame with no header map, for a body written separately."""
    return _pack_header(HEADER_SIZE + body_len, version, flags, code, corr_id, 0)


def encode_response(code: int, corr_id: int, body: bytes = b"", headers: dict | None = None,
                    version: int = PROTOCOL_VERSION) -> bytes:
    if headers:
        if "error" in headers:
            headers = {**headers, "error": cut_error(str(headers["error"]))}
        return encode(code, corr_id, body, headers, FLAG_RESPONSE, version)
    return _pack_header(HEADER_SIZE + len(body), version, FLAG_RESPONSE, code, corr_id, 0) + body


def _parse(buf, mv: memoryview, pos: int, end: int, frame_bytes_max: int, out: list,
           budget: int = 1 << 62, cheap=frozenset(), costly: int = 1):
    """Whole frames in buf[pos:end] onto `out`: (where parsing stopped, the size the partial
    frame there needs, or 0 when `budget` ran out with whole frames perhaps left). A frame
    costs 1 of the budget if it is oneway or its code is `cheap`, else `costly` (its answer
    may be big: a PULL). Raises FrameError for a frame that cannot be read."""
    unpack = HEADER.unpack_from
    while end - pos >= HEADER_SIZE:
        if budget <= 0:
            return pos, 0
        size, magic, version, flags, code, corr, hlen = unpack(buf, pos)
        if magic != MAGIC:
            raise FrameError(Code.BAD_FRAME, f"bad frame magic 0x{magic:04x}: not a Tidelog peer")
        if size > frame_bytes_max:
            raise FrameError(Code.FRAME_TOO_LARGE,
                             f"frame of {size} bytes exceeds frame_bytes_max={frame_bytes_max}", corr)
        if size < HEADER_SIZE + hlen or hlen > HEADER_MAP_BYTES_MAX:
            raise FrameError(Code.BAD_FRAME,
                             f"frame of {size} bytes cannot hold a {hlen}-byte header map", corr)
        if end - pos < size:
            return pos, size
        start = pos + HEADER_SIZE
        headers = decode_headers(mv[start:start + hlen]) if hlen else _EMPTY
        out.append(Frame(version, flags, code, corr, headers, mv[start + hlen:pos + size]))
        pos += size
        budget -= 1 if flags & FLAG_ONEWAY or code in cheap else costly
    return pos, HEADER_SIZE


def _partial_error(left) -> FrameError:
    corr = HEADER.unpack_from(left)[5] if len(left) >= HEADER_SIZE else None
    want = HEADER.unpack_from(left)[0] if len(left) >= HEADER_SIZE else HEADER_SIZE
    return FrameError(Code.BAD_FRAME, f"stream ended inside a frame ({len(left)} of {want} bytes)", corr)


class FrameDecoder:
    """Incremental: feed bytes, get whole frames. After a bad frame, `error` is set and the
    decoder takes nothing more (the stream cannot be re-synchronised: close it).

    Frame bodies are memoryviews into the bytes that were fed (no copy, and they stay valid);
    a frame that arrives in pieces is joined once, when its last piece is in.
    """

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT):
        self.frame_bytes_max = frame_bytes_max
        self._parts: list[bytes] = []  # an incomplete frame's pieces
        self._have = 0
        self._need = 0  # bytes needed before it is worth parsing again
        self.error: FrameError | None = None

    def feed(self, data: bytes) -> list[Frame]:
        if self.error is not None:
            return []
        if self._parts:
            self._parts.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            buf = b"".join(self._parts)
            self._parts, self._have = [], 0
        else:
            buf = data
        out: list[Frame] = []
        try:
            pos, need = _parse(buf, memoryview(buf), 0, len(buf), self.frame_bytes_max, out)
        except FrameError as e:
            self.error = e
            return out
        if pos < len(buf):
            self._parts, self._have, self._need = [buf[pos:]], len(buf) - pos, need
        return out

    def eof_error(self) -> FrameError | None:
        """At end of stream: the error for a partial frame left over, if any."""
        if self.error is not None or not self._parts:
            return None
        return _partial_error(b"".join(self._parts))


class FrameReader:
    """Frames for an asyncio.BufferedProtocol: the transport reads straight into one reused
    buffer (no allocation per read). Frame bodies point into that buffer, so they are valid
    only until the next read: a caller handles its frames before it lets the transport read
    again (it may stop part way, see `frames`, and go on later: the bytes stay put).

    Memory follows the bytes that arrived, never a header's claim: the buffer starts at
    `initial` (allocated at the first read), doubles towards `capacity` while reads fill it,
    and grows for a frame that does not fit only by doubling once half of it holds that
    frame's bytes -- a 16-byte header announcing 16 MiB costs nothing until the bytes come.
    When empty it goes back to at most `capacity`.
    """

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT, capacity: int = 1 << 20,
                 initial: int | None = None, cheap_codes=frozenset(), costly: int = 1):
        self.frame_bytes_max = frame_bytes_max
        self._capacity = capacity
        self._want = capacity if initial is None else min(initial, capacity)  # size when empty
        self._buf = bytearray()
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._need = HEADER_SIZE  # the frame at _start needs this many bytes; 0: more may be whole
        self._cheap, self._costly = cheap_codes, costly
        self._read_at = 0.0  # when the last read came
        self._frame_at = 0.0  # when the first byte of the frame at _start came
        self.error: FrameError | None = None
        # lane(view, start, end) -> bytes it took: whole frames from `start` handled before any
        # Frame is built (replication/raft/lane.py); 0 leaves them to `frames`
        self.lane = None

    @property
    def allocated(self) -> int:
        return len(self._buf)

    @property
    def more(self) -> bool:
        """`frames` stopped on its budget: whole frames may be waiting in the buffer."""
        return self._need == 0 and self.error is None

    @property
    def partial_since(self) -> float | None:
        """When the first byte of the frame still waiting for bytes came (the `now` of that
        read); None when no frame is part way in."""
        if self._need == 0 or self._start == self._end or self.error is not None:
            return None
        return self._frame_at

    def postpone(self, seconds: float) -> None:
        """Reading was paused this long (by us): it does not count against the partial frame."""
        self._frame_at += seconds

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        start, end = self._start, self._end
        size = len(self._buf)
        if start == end:
            self._start = self._end = 0
            if size != self._want:  # first read, busy reads (grow) or a big frame gone (shrink)
                self._replace(self._want)
        elif size - end < READ_MIN or start + self._need > size:
            self._make_room(end - start, size)
        return self._view[self._end:]

    def _make_room(self, pending: int, size: int) -> None:
        need = self._need
        if need > size and 2 * pending > size:
            # the frame does not fit and half the buffer holds its bytes: room for as many
            # again (what arrived, not the header's frame_size, decides)
            self._replace(min(need, 2 * pending + READ_MIN))
        elif self._want > size:
            self._replace(self._want)
        elif self._start:
            # move the partial frame to the front (same-size slice assignment: no resize,
            # so bodies of frames already handed out may keep pointing at the old bytes)
            self._buf[:pending] = self._buf[self._start:self._end]
            self._start, self._end = 0, pending

    def _replace(self, size: int) -> None:
        pending = self._end - self._start
        fresh = bytearray(size)
        fresh[:pending] = self._buf[self._start:self._end]
        self._buf, self._view = fresh, memoryview(fresh)
        self._start, self._end = 0, pending

    def fill(self, nbytes: int, now: float = 0.0) -> None:
        """The transport wrote `nbytes` into the last get_buffer() at time `now`."""
        if self._start == self._end:
            self._frame_at = now
        if nbytes == len(self._buf) - self._end and self._want < self._capacity:
            self._want = min(self._capacity, 2 * self._want)  # the read filled it: offer more
        self._end += nbytes
        self._read_at = now

    def frames(self, budget: int = 1 << 62) -> list[Frame]:
        """The whole frames in the buffer, up to `budget` (see _parse); `more` says whether
        it ran out. Frames not taken stay in the buffer, where the next call finds them."""
        if self.error is not None:
            return []
        if self.lane is not None and HEADER_SIZE <= self._end - self._start >= self._need:
            took = self.lane(self._view, self._start, self._end)
            if took:
                self._start += took
                self._frame_at = self._read_at
        out: list[Frame] = []
        try:
            self._start, self._need = _parse(self._buf, self._view, self._start, self._end,
                                             self.frame_bytes_max, out, budget, self._cheap, self._costly)
        except FrameError as e:
            self.error = e
        if out:
            self._frame_at = self._read_at  # a frame ended in the last read: the next began there
        return out

    def buffer_updated(self, nbytes: int, now: float = 0.0) -> list[Frame]:
        self.fill(nbytes, now)
        return self.frames()

    def eof_error(self) -> FrameError | None:
        if self.error is not None or self._end == self._start:
            return None
        return _partial_error(bytes(self._buf[self._start:self._end]))
