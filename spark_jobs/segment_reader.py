"""One CommitLog segment file -> rows, for the reconcile job. Pure: bytes in, rows out, so it
runs the same inside a Spark task and in a unit test.

Entries are read with the store's codec (`codec.inspect`) and never trusted blindly:
- a bad CRC is a row with `crc_ok = False`; the framing still says where the next entry
  starts, so reading goes on. Its index is taken from its good neighbours (indexes are
  contiguous), since the index field itself may be what was damaged;
- broken framing (bad magic, lengths that disagree, an entry cut short) makes the bytes up to
  the next entry that decodes with a good CRC at the offset it names unreadable: that region
  is a `problem` row, and when good entries on both sides say which indexes it held, each is
  an entry row with `crc_ok = False` and no term (`lost` in the damaged region);
- a segment that stops without its end-of-segment marker (a truncated copy) is a problem row.
"""

from __future__ import annotations

from typing import NamedTuple

from broker.store import codec

ENTRY_MAGIC_BYTES = codec.ENTRY_MAGIC.to_bytes(4, "big")


class Row(NamedTuple):
    kind: str  # "entry" or "problem"
    index: int | None
    term: int | None
    crc: int | None
    crc_ok: bool
    phys_offset: int
    size: int
    topic: str | None = None
    queue_id: int | None = None
    queue_offset: int | None = None
    msg_id: str | None = None
    keys: list | None = None
    store_ts_ms: int | None = None
    problem: str | None = None


COLUMNS = Row._fields


def read_columns(data: bytes, base: int) -> dict[str, list]:
    """read_segment's rows as columns (what the Spark task hands over). The common case — every
    entry whole and its CRC good — is one tight pass over `codec.header`; a segment with any
    damage is read again entry by entry by read_segment, which knows how to report it."""
    cols: dict[str, list] = {f: [] for f in COLUMNS}
    (kind, index, term, crc, crc_ok, phys, size, topic, queue_id, queue_offset, msg_id, keys,
     store_ts, problem) = (cols[f].append for f in COLUMNS)
    hsize, keys_of = codec.HEADER_SIZE, codec.keys_of
    w = codec.walk(data, base=base, read="header")  # framing, CRC and place checked
    try:
        for rel, h in w:
            p = rel + hsize + h[12]
            kind("entry"), index(h[3]), term(h[4]), crc(h[2]), crc_ok(True), phys(h[5]), size(h[0])
            topic(data[rel + hsize:p].decode()), queue_id(h[10]), queue_offset(h[6]), msg_id(h[9].hex())
            keys(keys_of(data[p:p + h[13]]) if h[13] else []), store_ts(h[7]), problem(None)
    except UnicodeDecodeError:
        w.stop = None
    if w.stop is None or w.stop.kind not in (codec.END, codec.MARKER):
        rows = read_segment(data, base)
        return {f: [r[i] for r in rows] for i, f in enumerate(COLUMNS)}
    return cols


def _entry_row(e: codec.Entry, crc: int, ok: bool, phys: int, problem: str | None = None) -> Row:
    return Row("entry", e.index, e.term, crc, ok, phys, e.size, e.topic, e.queue_id, e.queue_offset,
               e.msg_id.hex(), e.keys if e.properties else [], e.store_ts_ms, problem)


def _good_at(data: bytes, rel: int, base: int) -> bool:
    try:
        e, _, ok = codec.inspect(data, rel)
    except codec.CorruptEntry:
        return False
    return ok and e.phys_offset == base + rel


def resync(data: bytes, start: int, base: int) -> int:
    """The next position at or after `start` where an entry decodes with a good CRC at the
    offset it names, or where the end-of-segment marker fits exactly; len(data) if none."""
    n = len(data)
    pos = start
    while True:
        m = data.find(ENTRY_MAGIC_BYTES, pos + 4)
        if m < 0:
            break
        cand = m - 4
        if cand >= start and _good_at(data, cand, base):
            return cand
        pos = m - 3
    blank = codec.BLANK_MAGIC.to_bytes(4, "big")
    m = data.find(blank, start + 4)
    while m >= 0:
        cand = m - 4
        if cand >= start and codec.peek(data, cand)[0] == n - cand:
            return cand
        m = data.find(blank, m + 1)
    return n


def read_segment(data: bytes, base: int) -> list[Row]:
    """Every entry and problem of the segment whose first byte is at log offset `base`."""
    rows: list[Row] = []
    n, rel = len(data), 0
    damaged: list[int] = []  # positions in `rows` of problem rows between entries
    while True:
        # framing by the walk rule; the CRC and the entry's place are this reader's to report
        w = codec.walk(data, rel, read="header", verify=False)
        for at, _h in w:
            e, crc, ok = codec.inspect(data, at)
            problem = None
            if ok and e.phys_offset != base + at:
                ok, problem = False, f"entry names offset {e.phys_offset}, found at {base + at}"
            elif not ok:
                problem = "CRC mismatch"
            rows.append(_entry_row(e, crc, ok, base + at, problem))
        stop = w.stop
        rel = stop.pos
        if stop.kind in (codec.END, codec.MARKER):  # never written / the segment ends
            break
        if stop.kind == codec.PARTIAL and stop.size == codec.BLANK_SIZE_MIN:
            rows.append(Row("problem", None, None, None, False, base + rel, n - rel,
                            problem=f"segment stops at offset {base + rel} without an end-of-segment "
                                    "marker (truncated copy?)"))
            break
        reason = stop.reason if stop.kind == codec.CORRUPT else \
            f"truncated entry ({n - rel} of {stop.size} bytes)"
        nxt = resync(data, rel + 1, base)
        damaged.append(len(rows))
        rows.append(Row("problem", None, None, None, False, base + rel, nxt - rel,
                        problem=f"unreadable from offset {base + rel} ({nxt - rel} bytes): {reason}"))
        rel = nxt
        if rel >= n:
            break
    return _fill_indexes(rows, damaged)


def _neighbour_index(rows: list[Row], i: int) -> int | None:
    """The index row i must have, counted from the nearest good entry with no damaged region
    in between (before it first, else after it); None when there is none."""
    for direction in (-1, 1):
        k, steps = i + direction, 1
        while 0 <= k < len(rows) and rows[k].kind == "entry":
            if rows[k].crc_ok:
                return rows[k].index - direction * steps
            k, steps = k + direction, steps + 1
    return None


def _fill_indexes(rows: list[Row], damaged: list[int]) -> list[Row]:
    """Bad entries take their index from their good neighbours; indexes lost in a damaged
    region between two good entries become rows of their own."""
    out: list[Row] = []
    for i, r in enumerate(rows):
        if r.kind == "entry" and not r.crc_ok:
            idx = _neighbour_index(rows, i)
            if idx is not None:
                r = r._replace(index=idx)
        out.append(r)
        if i in damaged:
            before = out[-2] if len(out) >= 2 and out[-2].kind == "entry" else None
            after = rows[i + 1] if i + 1 < len(rows) and rows[i + 1].kind == "entry" else None
            if before is not None and after is not None and before.index is not None \
                    and after.crc_ok:
                out += [Row("entry", idx, None, None, False, r.phys_offset, 0,
                            problem="lost in a damaged region")
                        for idx in range(before.index + 1, after.index)]
    return out
