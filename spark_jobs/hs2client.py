"""A small HiveServer2 client: enough of TCLIService over Thrift's binary protocol to run one
statement on Spark's Thrift JDBC server and fetch its rows. Pure Python (no PyHive, thrift or
SASL packages): the server runs with `hive.server2.authentication=NOSASL`, so the transport is
the plain byte stream.

Wire layout (Thrift binary protocol, big-endian):

    message   i32 0x8001_0000 | type (1 call, 2 reply, 3 exception) · string name · i32 seqid · struct
    struct    repeated (i8 type · i16 field id · value), ended by i8 0
    string    i32 length · bytes          list/set  i8 element type · i32 count · elements
    map       i8 key type · i8 value type · i32 count · (key, value)...

The calls (field ids from Hive's TCLIService.thrift): OpenSession, ExecuteStatement (blocking,
runAsync false), GetResultSetMetadata, FetchResults (columnar rows: protocol V6 and later),
CloseOperation, CloseSession. Each request is field 1 of the call's args; the answer is field 0.
"""

from __future__ import annotations

import json
import re
import socket
import struct
from typing import NamedTuple

STOP, BOOL, BYTE, DOUBLE, I16, I32, I64, STRING, STRUCT, MAP, SET, LIST = 0, 2, 3, 4, 6, 8, 10, 11, 12, 13, 14, 15
CALL, REPLY, EXCEPTION = 1, 2, 3
VERSION_1 = 0x80010000
PROTOCOL_V8 = 7  # HIVE_CLI_SERVICE_PROTOCOL_V8: columnar row sets
STATUS_ERROR = 3  # TStatusCode: SUCCESS 0, SUCCESS_WITH_INFO 1, STILL_EXECUTING 2, ERROR 3, INVALID_HANDLE 4
COMPLEX_TYPES = {10, 11, 12}  # TTypeId ARRAY, MAP, STRUCT: the server sends them as JSON text
FETCH_ROWS_MAX = 10_000
_FIXED = {BOOL: ">?", BYTE: ">b", DOUBLE: ">d", I16: ">h", I32: ">i", I64: ">q"}


class HS2Error(Exception):
    """The server refused a statement: str() is Spark's one-line message (`[PARSE_SYNTAX_ERROR]
    Syntax error at or near 'SELEC'...`), `detail` the whole text the server sent."""

    def __init__(self, message: str, sql_state: str | None = None):
        super().__init__(first_line(message))
        self.detail = message
        self.sql_state = sql_state


# "Error running query: [CLASS] org.apache...SomeException: \n[CLASS] the message..."
_NOISE = re.compile(r"^(Error running query: )?(\[[A-Z0-9_.]+\] )?([\w.$]+(Exception|Error): ?)?")


def first_line(message: str) -> str:
    for line in message.splitlines():
        line = _NOISE.sub("", line.strip(), count=1) if "Exception" in line or "Error running" in line else line.strip()
        if line:
            return line
    return message.strip()


class Result(NamedTuple):
    columns: list[str]
    rows: list[tuple]


def _write(buf: bytearray, ttype: int, value) -> None:
    if ttype in _FIXED:
        buf += struct.pack(_FIXED[ttype], value)
    elif ttype == STRING:
        data = value.encode() if isinstance(value, str) else value
        buf += struct.pack(">i", len(data)) + data
    elif ttype == STRUCT:  # {field id: (type, value)}
        for fid, (ft, fv) in value.items():
            buf += struct.pack(">bh", ft, fid)
            _write(buf, ft, fv)
        buf += b"\x00"
    elif ttype == MAP:  # (key type, value type, dict)
        kt, vt, d = value
        buf += struct.pack(">bbi", kt, vt, len(d))
        for k, v in d.items():
            _write(buf, kt, k)
            _write(buf, vt, v)
    else:
        raise ValueError(f"cannot write Thrift type {ttype}")


class _Reader:
    def __init__(self, f):
        self.f = f

    def exact(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ConnectionError("the query server closed the connection")
        return data

    def value(self, ttype: int):
        """Any value; structs become {field id: value}, strings stay bytes."""
        if ttype in _FIXED:
            fmt = _FIXED[ttype]
            return struct.unpack(fmt, self.exact(struct.calcsize(fmt)))[0]
        if ttype == STRING:
            return self.exact(struct.unpack(">i", self.exact(4))[0])
        if ttype == STRUCT:
            out = {}
            while True:
                ft = self.exact(1)[0]
                if ft == STOP:
                    return out
                fid = struct.unpack(">h", self.exact(2))[0]
                out[fid] = self.value(ft)
        if ttype in (LIST, SET):
            et, n = struct.unpack(">bi", self.exact(5))
            return [self.value(et) for _ in range(n)]
        if ttype == MAP:
            kt, vt, n = struct.unpack(">bbi", self.exact(6))
            return {self.value(kt): self.value(vt) for _ in range(n)}
        raise ConnectionError(f"unknown Thrift type {ttype} from the query server")


def _handle(ident: dict) -> tuple:
    return STRUCT, {1: (STRING, ident[1]), 2: (STRING, ident[2])}


class Connection:
    """One HiveServer2 session; `with Connection(host, port) as c: c.execute(sql)`."""

    def __init__(self, host: str, port: int, database: str | None = None, user: str = "tidelog",
                 timeout_s: float = 600.0):
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.r = _Reader(self.sock.makefile("rb"))
        self.seq = 0
        conf = {"use:database": database} if database else {}
        resp = self._call("OpenSession", {1: (I32, PROTOCOL_V8), 2: (STRING, user), 4: (MAP, (STRING, STRING, conf))})
        self.session = {1: _handle(resp[3][1])}

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self._call("CloseSession", {1: (STRUCT, self.session)})
        except (OSError, HS2Error):
            pass
        finally:
            self.sock.close()

    def _call(self, name: str, req: dict) -> dict:
        self.seq += 1
        buf = bytearray(struct.pack(">I", VERSION_1 | CALL))
        _write(buf, STRING, name)
        buf += struct.pack(">i", self.seq)
        _write(buf, STRUCT, {1: (STRUCT, req)})
        self.sock.sendall(buf)
        head = struct.unpack(">i", self.r.exact(4))[0]
        self.r.value(STRING)  # the method name echoed
        self.r.exact(4)  # seqid
        body = self.r.value(STRUCT)
        if head & 0xFF == EXCEPTION:
            raise HS2Error(f"{name}: {body.get(1, b'').decode(errors='replace')}")
        resp = body[0]
        status = resp[1]
        if status.get(1) == STATUS_ERROR:
            raise HS2Error(status.get(5, b"").decode(errors="replace"),
                           status.get(3, b"").decode(errors="replace") or None)
        return resp

    def execute(self, statement: str, rows_max: int = FETCH_ROWS_MAX) -> Result:
        """Run one statement to completion; its columns and up to `rows_max` rows."""
        resp = self._call("ExecuteStatement", {1: (STRUCT, self.session), 2: (STRING, statement), 4: (BOOL, False)})
        op = resp[2]
        handle = {1: _handle(op[1]), 2: (I32, op[2]), 3: (BOOL, op[3])}
        try:
            if not op.get(3):
                return Result([], [])
            meta = self._call("GetResultSetMetadata", {1: (STRUCT, handle)})[2][1]
            names = [c[1].decode() for c in meta]
            complex_cols = [_is_complex(c[2][1][0]) for c in meta]
            cols: list[list] = [[] for _ in names]
            while cols and len(cols[0]) < rows_max:
                r = self._call("FetchResults", {1: (STRUCT, handle), 2: (I32, 0),
                                                3: (I64, min(rows_max - len(cols[0]), FETCH_ROWS_MAX))})
                got = [_column(c, cx) for c, cx in zip(r[3].get(3, []), complex_cols)]
                if not got or not got[0]:
                    break
                for acc, vals in zip(cols, got):
                    acc.extend(vals)
                if not r.get(2):
                    break
            return Result(names, list(zip(*cols)) if cols else [])
        finally:
            self._call("CloseOperation", {1: (STRUCT, handle)})


def _is_complex(type_entry: dict) -> bool:
    """A TTypeEntry that is not a primitive, or whose primitive id is ARRAY, MAP or STRUCT."""
    return 1 not in type_entry or type_entry[1].get(1) in COMPLEX_TYPES


def _column(tcolumn: dict, complex_type: bool) -> list:
    ((kind, col),) = tcolumn.items()
    values, nulls = col[1], col.get(2, b"")
    out = []
    for i, v in enumerate(values):
        if i // 8 < len(nulls) and nulls[i // 8] >> (i % 8) & 1:
            out.append(None)
        elif kind == 7:  # strings: text, or JSON text for arrays, maps, structs
            s = v.decode(errors="replace")
            out.append(_json_or_text(s) if complex_type else s)
        else:
            out.append(v)
    return out


def _json_or_text(s: str):
    try:
        return json.loads(s)
    except ValueError:
        return s
