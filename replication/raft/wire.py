"""Raft messages on the wire: the body of a oneway RAFT frame (broker/protocol/frame.py).

Layout (big-endian). Every message starts with:
    kind u8 | term u64 | src_len u8 | src (UTF-8)
then, by kind:
    1 VoteRequest       last_index i64 | last_term u64 | flags u8 (1 pre-vote, 2 transfer)
    2 VoteResponse      granted u8 | pre_vote u8
    3 Push              type u8 | commit_index i64 | seq u64 | count u32,
                        then per entry: index i64 | term u64 | len u32 | data
    4 PushResponse      type u8 | code u8 | index i64 | begin i64 | end i64 | seq u64
    5 Heartbeat         commit_index i64
    6 HeartbeatResponse ok u8 | needs_probe u8
    7 TimeoutNow        (nothing)
Entry data is the CommitLog entry's bytes, untouched.

Numbers are range-checked both ways against messages.py's bounds (terms 0..TERM_MAX, indexes
-1..INDEX_MAX, entry indexes 0..INDEX_MAX), narrower than their fields: a message outside them
is refused by the encoder (FieldLimitError) and by the decoder (BadRequest naming the field
and the limit), so a forged term near 2**64 never reaches the core.
"""

from __future__ import annotations

import struct

from broker.protocol.codes import BadRequest, FieldLimitError, check_int, check_len
from replication.raft import messages as m

SRC_BYTES_MAX = 255  # src_len u8

_HEAD = struct.Struct(">BQB")
_VOTE_REQ = struct.Struct(">qQB")
_VOTE_RESP = struct.Struct(">BB")
_PUSH = struct.Struct(">BqQI")
_ENTRY = struct.Struct(">qQI")
_PUSH_RESP = struct.Struct(">BBqqqQ")
_HB = struct.Struct(">q")
_HB_RESP = struct.Struct(">BB")

_KIND = {m.VoteRequest: 1, m.VoteResponse: 2, m.Push: 3, m.PushResponse: 4, m.Heartbeat: 5,
         m.HeartbeatResponse: 6, m.TimeoutNow: 7}


def encode_parts(msg: m.Message) -> tuple:
    """The message as parts for a gathering write (entry data is not copied). Raises
    FieldLimitError for a field the layout cannot carry (a sender over SRC_BYTES_MAX bytes, a
    negative term...)."""
    bad = m.out_of_bounds(msg, entries=False)  # (entries: in _encode_parts' loop)
    if bad is not None:
        field, value, limit = bad
        raise FieldLimitError(f"{type(msg).__name__} {field}", value, limit)
    try:
        return _encode_parts(msg)
    except (struct.error, TypeError) as e:  # TypeError: a non-number compared with a bound
        _limits(msg)
        raise FieldLimitError(type(msg).__name__, "a field", f"the layout above ({e})") from None


def _limits(msg) -> None:
    """Name the field of `msg` that does not fit (after a struct.error)."""
    check_len("src", msg.src.encode(), SRC_BYTES_MAX, "SRC_BYTES_MAX")
    check_int("term", msg.term, 0, 2**64 - 1)
    signed = {"last_index", "commit_index", "index", "begin_index", "end_index"}
    for name in ("last_index", "last_term", "commit_index", "seq", "index", "begin_index", "end_index"):
        if hasattr(msg, name):
            lo, hi = (-2**63, 2**63 - 1) if name in signed else (0, 2**64 - 1)
            check_int(name, getattr(msg, name), lo, hi)
    for index, term, data in getattr(msg, "entries", ()):
        check_int("entry index", index, -2**63, 2**63 - 1)
        check_int("entry term", term, 0, 2**64 - 1)
        check_len("entry data", data, 2**32 - 1, "u32")
    check_int("entries", len(getattr(msg, "entries", ())), 0, 2**32 - 1)


def _encode_parts(msg: m.Message) -> tuple:
    src = msg.src.encode()
    if len(src) > SRC_BYTES_MAX:
        check_len("src", src, SRC_BYTES_MAX, "SRC_BYTES_MAX")
    head = _HEAD.pack(_KIND[type(msg)], msg.term, len(src)) + src
    if isinstance(msg, m.Push):
        parts = [head, _PUSH.pack(msg.type, msg.commit_index, msg.seq, len(msg.entries))]
        index_max, term_max = m.INDEX_MAX, m.TERM_MAX
        for index, term, data in msg.entries:
            if not (0 <= index <= index_max and 0 <= term <= term_max):
                bad = m.out_of_bounds(msg)
                if bad is not None:
                    raise FieldLimitError(f"Push {bad[0]}", bad[1], bad[2])
            parts += [_ENTRY.pack(index, term, len(data)), data]
        return tuple(parts)
    if isinstance(msg, m.VoteRequest):
        body = _VOTE_REQ.pack(msg.last_index, msg.last_term, msg.pre_vote | msg.transfer << 1)
    elif isinstance(msg, m.VoteResponse):
        body = _VOTE_RESP.pack(msg.granted, msg.pre_vote)
    elif isinstance(msg, m.PushResponse):
        body = _PUSH_RESP.pack(msg.type, msg.code, msg.index, msg.begin_index, msg.end_index, msg.seq)
    elif isinstance(msg, m.Heartbeat):
        body = _HB.pack(msg.commit_index)
    elif isinstance(msg, m.HeartbeatResponse):
        body = _HB_RESP.pack(msg.ok, msg.needs_probe)
    else:
        body = b""
    return head, body


def push_response_parts(head: bytes, ptype: int, code: int, index: int, begin: int, end: int,
                        seq: int) -> tuple:
    """encode_parts of a PushResponse whose message head (`response_head`) is made already
    and whose numbers are known to be in bounds (the follower lane's answers)."""
    return head, _PUSH_RESP.pack(ptype, code, index, begin, end, seq)


def response_head(src: str, term: int) -> bytes:
    """The head of a PushResponse from `src` in `term` (encode_parts' first part)."""
    return encode_parts(m.PushResponse(src, term, m.PushType.APPEND, m.PushCode.SUCCESS, 0, 0, 0, 0))[0]


def push_head(src: str, term: int) -> bytes:
    """The head of a Push from `src` in `term` (encode_parts' first part; then PUSH, and
    ENTRY + data per entry: the leader lane's pushes)."""
    return encode_parts(m.Push(src, term, m.PushType.COMMIT, 0, (), 0))[0]


PUSH, ENTRY = _PUSH, _ENTRY


def encode(msg: m.Message) -> bytes:
    return b"".join(encode_parts(msg))


_SRC_CACHED_MAX = 64  # member ids decoded once (a group has a handful)
_src_cache: dict[bytes, str] = {}
_PUSH_TYPES = {t.value: t for t in m.PushType}
_PUSH_CODES = {c.value: c for c in m.PushCode}


def _sender(raw: bytes) -> str:
    src = _src_cache.get(raw)
    if src is None:
        src = raw.decode()
        if len(_src_cache) < _SRC_CACHED_MAX:
            _src_cache[raw] = src
    return src


def _enum(table: dict, value: int, what: str):
    try:
        return table[value]
    except KeyError:
        raise BadRequest(f"raft message does not decode: {value} is not a valid {what}") from None


def decode(buf) -> m.Message:
    try:
        kind, term, slen = _HEAD.unpack_from(buf, 0)
        p = _HEAD.size + slen
        raw = bytes(buf[_HEAD.size:p])
        if len(raw) != slen:
            raise BadRequest("raft message: short sender")
        src = _sender(raw)
        if kind == 3:
            ptype, commit, seq, count = _PUSH.unpack_from(buf, p)
            p += _PUSH.size
            entries = []
            index_max, term_max = m.INDEX_MAX, m.TERM_MAX
            for _ in range(count):
                index, eterm, n = _ENTRY.unpack_from(buf, p)
                p += _ENTRY.size
                if not 0 <= index <= index_max:
                    raise BadRequest(f"raft Push from {src!r}: entry index {index} is out of range, "
                                     f"the limit is 0..INDEX_MAX={m.INDEX_MAX}")
                if eterm > term_max:
                    raise BadRequest(f"raft Push from {src!r}: entry term {eterm} is out of range, "
                                     f"the limit is 0..TERM_MAX={m.TERM_MAX}")
                if p + n > len(buf):
                    raise BadRequest("raft message: entry runs past the body")
                entries.append((index, eterm, bytes(buf[p:p + n])))
                p += n
            msg = m.Push(src, term, _enum(_PUSH_TYPES, ptype, 'PushType'), commit, tuple(entries), seq)
        elif kind == 1:
            li, lt, flags = _VOTE_REQ.unpack_from(buf, p)
            p += _VOTE_REQ.size
            msg = m.VoteRequest(src, term, li, lt, bool(flags & 1), bool(flags & 2))
        elif kind == 2:
            granted, pre = _VOTE_RESP.unpack_from(buf, p)
            p += _VOTE_RESP.size
            msg = m.VoteResponse(src, term, bool(granted), bool(pre))
        elif kind == 4:
            ptype, code, index, begin, end, seq = _PUSH_RESP.unpack_from(buf, p)
            p += _PUSH_RESP.size
            msg = m.PushResponse(src, term, _enum(_PUSH_TYPES, ptype, 'PushType'), _enum(_PUSH_CODES, code, 'PushCode'),
                                 index, begin, end, seq)
        elif kind == 5:
            (commit,) = _HB.unpack_from(buf, p)
            p += _HB.size
            msg = m.Heartbeat(src, term, commit)
        elif kind == 6:
            ok, probe = _HB_RESP.unpack_from(buf, p)
            p += _HB_RESP.size
            msg = m.HeartbeatResponse(src, term, bool(ok), bool(probe))
        elif kind == 7:
            msg = m.TimeoutNow(src, term)
        else:
            raise BadRequest(f"raft message: unknown kind {kind}")
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        if isinstance(e, BadRequest):
            raise
        raise BadRequest(f"raft message does not decode: {e}") from None
    if p != len(buf):
        raise BadRequest(f"raft message has {len(buf) - p} trailing bytes")
    bad = m.out_of_bounds(msg, entries=False)  # (entries: checked in the loop above)
    if bad is not None:
        field, value, limit = bad
        raise BadRequest(f"raft {type(msg).__name__} from {msg.src!r}: {field} {value} is out of "
                         f"range, the limit is {limit}")
    return msg
