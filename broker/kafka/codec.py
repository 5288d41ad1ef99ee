"""Kafka's wire protocol, the generic part: primitive types, and messages declared as data.

Every Kafka request and response is a struct of fields, each present in a range of versions,
and from the message's first *flexible* version on, strings, bytes and arrays are "compact"
(length + 1 as an unsigned varint, 0 meaning null) and every struct ends with tagged fields
(KIP-482). apache/kafka declares them in clients/src/main/resources/common/message/*.json;
broker/kafka/apis.py declares the ones Tidelog speaks with `F(...)` below, one line a field,
and this module encodes and decodes any of them at any version. Nothing is hand-coded per
message: a layout is written once.

Primitive types (big-endian, as Kafka's protocol guide):

    int8 int16 int32 int64 uint16   fixed width, two's complement (uint16 unsigned)
    float64                         IEEE 754 double
    bool                            one byte, 0 or 1 (anything else is refused)
    uuid                            16 bytes
    string  / compact string        int16 length (-1 null)  / uvarint length+1 (0 null), UTF-8
    bytes   / compact bytes         int32 length (-1 null)  / uvarint length+1 (0 null)
    records                         bytes holding record batches (handed over as a memoryview)
    [T]     / compact [T]           int32 count (-1 null)   / uvarint count+1 (0 null)
    tagged fields (flexible only)   uvarint count, then per field: uvarint tag, uvarint size, data

Decoding never trusts a length: each is checked against the bytes left and against a bound
(ARRAY_ITEMS_MAX) before anything is allocated, and every failure is a KafkaDecodeError that
names the field, so a malformed request gets an error answer (or a closed connection when its
header cannot be read), never an exception the listener does not expect.
"""

from __future__ import annotations

import struct
import uuid as _uuid
from typing import Any, NamedTuple

ARRAY_ITEMS_MAX = 1 << 20  # more items than any request of ours needs; a lie is refused early
VARINT_BYTES_MAX = 5  # an unsigned varint of 32 bits

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_U16, _F64 = struct.Struct(">H"), struct.Struct(">d")
_FIXED = {"int8": _I8, "int16": _I16, "int32": _I32, "int64": _I64, "uint16": _U16, "float64": _F64}


class KafkaDecodeError(ValueError):
    """The bytes are not a valid message of the declared layout; the text names the field."""


class Field(NamedTuple):
    name: str
    type: str | tuple  # a primitive name, "[prim]", or a tuple of Fields: an array of structs
    lo: int  # first version with the field
    hi: int  # last version with it (inclusive; 2**15 - 1 for "N+")
    nullable: bool
    tag: int | None  # a tagged field (flexible versions only)
    default: Any
    array: bool  # a tuple type: array of structs (True) or one struct (False)


V_MAX = 2 ** 15 - 1


def versions(text: str) -> tuple[int, int]:
    """"3+" -> (3, V_MAX); "0-4" -> (0, 4); "2" -> (2, 2); "none" -> (1, 0) (empty)."""
    if text == "none":
        return 1, 0
    if text.endswith("+"):
        return int(text[:-1]), V_MAX
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def F(name: str, type, v: str = "0+", *, null: bool = False, tag: int | None = None,
      default: Any = None, struct_: bool = False) -> Field:
    """One field: F("acks", "int16"), F("transactional_id", "string", "3+", null=True),
    F("topics", (F("name", "string"), ...)) for an array of structs (struct_=True: one struct)."""
    lo, hi = versions(v)
    if default is None and not null:
        default = _zero(type)
    return Field(name, type, lo, hi, null, tag, default, isinstance(type, tuple) and not struct_)


def _zero(type) -> Any:
    if isinstance(type, tuple):
        return None  # an empty array / a struct of defaults: encode() makes them
    if type.startswith("["):
        return []
    return {"string": "", "bytes": b"", "records": b"", "bool": False, "float64": 0.0,
            "uuid": _uuid.UUID(int=0)}.get(type, 0)


class Message(NamedTuple):
    """A request or response layout: its fields, the versions it exists in, the first flexible one."""
    name: str
    fields: tuple
    lo: int
    hi: int
    flexible_from: int

    def flexible(self, version: int) -> bool:
        return version >= self.flexible_from


def message(name: str, valid: str, flexible: str, *fields: Field) -> Message:
    lo, hi = versions(valid)
    flex = versions(flexible)[0] if flexible != "none" else V_MAX + 1
    return Message(name, tuple(fields), lo, hi, flex)


# --- reading ---------------------------------------------------------------------------------

class Reader:
    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf, pos: int = 0, end: int | None = None):
        self.buf = memoryview(buf)
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int, what: str) -> memoryview:
        if n < 0 or n > self.end - self.pos:
            raise KafkaDecodeError(f"{what}: needs {n} bytes, {self.end - self.pos} left")
        out = self.buf[self.pos:self.pos + n]
        self.pos += n
        return out

    def fixed(self, s: struct.Struct, what: str):
        if self.end - self.pos < s.size:
            raise KafkaDecodeError(f"{what}: needs {s.size} bytes, {self.end - self.pos} left")
        v = s.unpack_from(self.buf, self.pos)[0]
        self.pos += s.size
        return v

    def uvarint(self, what: str) -> int:
        out = shift = 0
        for _ in range(VARINT_BYTES_MAX):
            if self.pos >= self.end:
                raise KafkaDecodeError(f"{what}: a varint runs past the end")
            b = self.buf[self.pos]
            self.pos += 1
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
        raise KafkaDecodeError(f"{what}: a varint longer than {VARINT_BYTES_MAX} bytes")

    def length(self, flexible: bool, wide: bool, what: str) -> int:
        """A string's, bytes' or array's length; -1 for null."""
        if flexible:
            return self.uvarint(what) - 1
        n = self.fixed(_I32 if wide else _I16, what)
        if n < -1:
            raise KafkaDecodeError(f"{what}: length {n}")
        return n


def _read_value(r: Reader, f: Field, type, flexible: bool, version: int, what: str):
    if isinstance(type, tuple):
        if not f.array:
            return _read_struct(r, type, flexible, version, what)
        n = r.length(flexible, True, what)
        if n == -1:
            if not f.nullable:
                raise KafkaDecodeError(f"{what}: null, and it is not nullable")
            return None
        _check_items(n, r, what)
        return [_read_struct(r, type, flexible, version, f"{what}[{i}]") for i in range(n)]
    if type.startswith("["):
        n = r.length(flexible, True, what)
        if n == -1:
            if not f.nullable:
                raise KafkaDecodeError(f"{what}: null, and it is not nullable")
            return None
        _check_items(n, r, what)
        return [_read_prim(r, type[1:-1], flexible, f.nullable, f"{what}[{i}]") for i in range(n)]
    return _read_prim(r, type, flexible, f.nullable, what)


def _check_items(n: int, r: Reader, what: str) -> None:
    if n > ARRAY_ITEMS_MAX or n > r.left():  # every item takes at least one byte
        raise KafkaDecodeError(f"{what}: {n} items in {r.left()} bytes (at most {ARRAY_ITEMS_MAX})")


def _read_prim(r: Reader, type: str, flexible: bool, nullable: bool, what: str):
    s = _FIXED.get(type)
    if s is not None:
        return r.fixed(s, what)
    if type == "string" or type == "bytes" or type == "records":
        n = r.length(flexible, type != "string", what)
        if n == -1:
            if not nullable:
                raise KafkaDecodeError(f"{what}: null, and it is not nullable")
            return None
        data = r.take(n, what)
        if type == "string":
            try:
                return str(data, "utf-8")
            except UnicodeDecodeError:
                raise KafkaDecodeError(f"{what}: not UTF-8") from None
        return data if type == "records" else bytes(data)
    if type == "bool":
        b = r.fixed(_I8, what)
        if b not in (0, 1):
            raise KafkaDecodeError(f"{what}: a bool of {b}")
        return bool(b)
    if type == "uuid":
        return _uuid.UUID(bytes=bytes(r.take(16, what)))
    raise AssertionError(f"unknown type {type!r}")


def _read_struct(r: Reader, fields: tuple, flexible: bool, version: int, what: str) -> dict:
    out = {}
    tagged = {}
    for f in fields:
        if f.tag is not None:
            if flexible and f.lo <= version <= f.hi:
                tagged[f.tag] = f
            out[f.name] = f.default
        elif f.lo <= version <= f.hi:
            out[f.name] = _read_value(r, f, f.type, flexible, version, f"{what}.{f.name}" if what else f.name)
        else:
            out[f.name] = f.default
    if flexible:
        _read_tagged(r, tagged, out, version, what)
    return out


def _read_tagged(r: Reader, known: dict, out: dict, version: int, what: str) -> None:
    n = r.uvarint(f"{what} tagged fields")
    _check_items(n, r, f"{what} tagged fields")
    last = -1
    for _ in range(n):
        tag = r.uvarint(f"{what} tag")
        if tag <= last:
            raise KafkaDecodeError(f"{what}: tagged fields out of order ({tag} after {last})")
        last = tag
        size = r.uvarint(f"{what} tag {tag} size")
        data = r.take(size, f"{what} tag {tag}")
        f = known.get(tag)
        if f is None:
            continue  # a tag this version does not know: skipped, as KIP-482 says
        sub = Reader(data)
        out[f.name] = _read_value(sub, f, f.type, True, version, f"{what}.{f.name}")
        if sub.left():
            raise KafkaDecodeError(f"{what}.{f.name}: {sub.left()} bytes left in its tagged field")


def decode(m: Message, version: int, buf, pos: int = 0, whole: bool = True) -> dict:
    """`m` at `version` from `buf[pos:]`; whole=True: every byte must be used."""
    if not m.lo <= version <= m.hi:
        raise KafkaDecodeError(f"{m.name} v{version} is not supported (v{m.lo}-v{m.hi})")
    r = Reader(buf, pos)
    out = _read_struct(r, m.fields, m.flexible(version), version, "")
    if whole and r.left():
        raise KafkaDecodeError(f"{m.name} v{version}: {r.left()} bytes after its last field")
    return out


# --- writing ---------------------------------------------------------------------------------

def uvarint(n: int) -> bytes:
    if n < 0:
        raise ValueError(f"an unsigned varint of {n}")
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length(n: int, flexible: bool, wide: bool) -> bytes:
    if flexible:
        return uvarint(n + 1)
    return (_I32 if wide else _I16).pack(n)


def _write_value(out: list, f: Field, type, v, flexible: bool, version: int) -> None:
    if isinstance(type, tuple):
        if not f.array:
            _write_struct(out, type, v or {}, flexible, version)
            return
        if v is None:
            if not f.nullable:
                v = []
            else:
                out.append(_length(-1, flexible, True))
                return
        out.append(_length(len(v), flexible, True))
        for item in v:
            _write_struct(out, type, item, flexible, version)
        return
    if type.startswith("["):
        if v is None and f.nullable:
            out.append(_length(-1, flexible, True))
            return
        v = v or []
        out.append(_length(len(v), flexible, True))
        for item in v:
            _write_prim(out, type[1:-1], item, flexible)
        return
    _write_prim(out, type, v, flexible)


def _write_prim(out: list, type: str, v, flexible: bool) -> None:
    s = _FIXED.get(type)
    if s is not None:
        out.append(s.pack(v))
    elif type == "string":
        if v is None:
            out.append(_length(-1, flexible, False))
        else:
            b = v.encode()
            out.append(_length(len(b), flexible, False))
            out.append(b)
    elif type == "bytes" or type == "records":
        if v is None:
            out.append(_length(-1, flexible, True))
        elif type == "records" and isinstance(v, list):  # batches, by reference: nothing joined
            out.append(_length(sum(map(len, v)), flexible, True))
            out += v
        else:
            out.append(_length(len(v), flexible, True))
            out.append(v)
    elif type == "bool":
        out.append(b"\x01" if v else b"\x00")
    elif type == "uuid":
        out.append(v.bytes)
    else:
        raise AssertionError(f"unknown type {type!r}")


def _write_struct(out: list, fields: tuple, obj: dict, flexible: bool, version: int) -> None:
    tagged = []
    for f in fields:
        if not f.lo <= version <= f.hi:
            continue
        v = obj.get(f.name, f.default)
        if f.tag is not None:
            if flexible and v != f.default:
                tagged.append((f, v))
            continue
        _write_value(out, f, f.type, v, flexible, version)
    if flexible:
        out.append(uvarint(len(tagged)))
        for f, v in sorted(tagged, key=lambda t: t[0].tag):
            sub: list = []
            _write_value(sub, f, f.type, v, True, version)
            data = b"".join(sub)
            out += [uvarint(f.tag), uvarint(len(data)), data]


def encode_parts(m: Message, version: int, obj: dict) -> list:
    """`obj` as `m` at `version`, as a list of bytes-like parts (records go by reference)."""
    if not m.lo <= version <= m.hi:
        raise ValueError(f"{m.name} v{version} is not declared (v{m.lo}-v{m.hi})")
    out: list = []
    _write_struct(out, m.fields, obj, m.flexible(version), version)
    return out


def encode(m: Message, version: int, obj: dict) -> bytes:
    return b"".join(encode_parts(m, version, obj))
