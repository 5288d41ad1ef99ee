"""One CommitLog segment file -> rows, for the reconcile job. Pure: bytes in, rows out, so it
runs the same inside a Spark task and in a unit test.

One row per message: a TLE1 entry is one (batch_pos 0), a TLE2 record batch one per record
(batch_pos k), each with the batch's index, term, phys_offset, size, store_ts_ms and crc (its
head_crc, which covers placement and content) and queue_offset = base_queue_offset + k.
Agreement between replicas is per entry: the reconcile job votes on batch_pos 0 rows (and the
NULL ones below), one per replica and entry.

Entries are read with the store's codec (`codec.walk2`, both magics) and never trusted blindly:
- a bad CRC (TLE2: either of the two) makes the entry's rows `crc_ok = False`; the framing still
  says where the next entry starts, so reading goes on. Their index is taken from their good
  neighbours (indexes are contiguous), since the index field itself may be what was damaged;
- a batch whose records cannot be framed (their sizes disagree with the zone) is one row with
  `batch_pos` NULL, `crc_ok = False` and the reason as its `problem`;
- broken framing (bad magic, lengths that disagree, an entry cut short) makes the bytes up to
  the next entry (of either magic) that decodes with good CRCs at the offset it names
  unreadable: that region is a `problem` row, and when good entries on both sides say which
  indexes it held, each is an entry row with `crc_ok = False`, no term and `batch_pos` NULL
  (`lost` in the damaged region);
- a segment that stops without its end-of-segment marker (a truncated copy) is a problem row.
"""

from __future__ import annotations

from typing import NamedTuple

from broker.store import codec
from broker.store.codec import CorruptEntry

ENTRY_MAGIC_BYTES = codec.ENTRY_MAGIC.to_bytes(4, "big")
BATCH_MAGIC_BYTES = codec.BATCH_MAGIC.to_bytes(4, "big")


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
    batch_pos: int | None = 0  # the message's place in its entry; None: the entry as a whole


COLUMNS = Row._fields


def read_columns(data: bytes, base: int) -> dict[str, list]:
    """read_segment's rows as columns (what the Spark task hands over). The common case — every
    entry whole, its CRCs good, at its place — is one tight pass (`walk2` framing, then
    `codec.header` / `check_batch` + `walk_records` per entry); a segment with any damage is
    read again entry by entry by read_segment, which knows how to report it."""
    cols: dict[str, list] = {f: [] for f in COLUMNS}
    (kind, index, term, crc, crc_ok, phys, size, topic, queue_id, queue_offset, msg_id, keys,
     store_ts, problem, batch_pos) = (cols[f].append for f in COLUMNS)
    hsize, keys_of, header, batch_magic = codec.HEADER_SIZE, codec.keys_of, codec.header, BATCH_MAGIC_BYTES
    check_batch, ids_keys, zone_at, topic_at = (codec.check_batch, codec.zone_ids_keys,
                                                codec.BATCH_HEAD_SIZE, codec.BATCH_TOPIC_AT)
    w = codec.walk2(data, read="frame")  # framing only: CRCs and places are checked here
    try:
        for rel, n in w:
            if data[rel + 4:rel + 8] == batch_magic:
                h = check_batch(data, rel)
                if h.phys_offset != base + rel:
                    raise CorruptEntry("misplaced")
                ids, ks = ids_keys(data, rel + zone_at, rel + n, h.phys_offset)
                k = len(ids)
                t = data[rel + topic_at:rel + topic_at + h.topic_len].decode()
                for c, v in (("kind", "entry"), ("index", h.index), ("term", h.term), ("crc", h.crc),
                             ("crc_ok", True), ("phys_offset", h.phys_offset), ("size", n), ("topic", t),
                             ("queue_id", h.queue_id), ("store_ts_ms", h.store_ts_ms), ("problem", None)):
                    cols[c] += [v] * k
                q = h.base_queue_offset
                cols["queue_offset"] += range(q, q + k)
                cols["batch_pos"] += range(k)
                cols["msg_id"] += [i.hex() for i in ids]
                cols["keys"] += ks
                continue
            h = header(data, rel)  # framing and CRC
            if h[5] != base + rel:
                raise CorruptEntry("misplaced")
            p = rel + hsize + h[12]
            kind("entry"), index(h[3]), term(h[4]), crc(h[2]), crc_ok(True), phys(h[5]), size(h[0])
            topic(data[rel + hsize:p].decode()), queue_id(h[10]), queue_offset(h[6]), msg_id(h[9].hex())
            keys(keys_of(data[p:p + h[13]]) if h[13] else []), store_ts(h[7]), problem(None), batch_pos(0)
    except (CorruptEntry, UnicodeDecodeError):
        w.stop = None
    if w.stop is None or w.stop.kind not in (codec.END, codec.MARKER):
        rows = read_segment(data, base)
        return {f: [r[i] for r in rows] for i, f in enumerate(COLUMNS)}
    return cols


def _entry_row(e: codec.Entry, crc: int, ok: bool, phys: int, problem: str | None = None) -> Row:
    return Row("entry", e.index, e.term, crc, ok, phys, e.size, e.topic, e.queue_id, e.queue_offset,
               e.msg_id.hex(), e.keys if e.properties else [], e.store_ts_ms, problem, 0)


def _tle1_rows(data: bytes, at: int, base: int) -> list[Row]:
    e, crc, ok = codec.inspect(data, at)  # CorruptEntry: its framing (lengths, topic) is broken
    problem = None
    if ok and e.phys_offset != base + at:
        ok, problem = False, f"entry names offset {e.phys_offset}, found at {base + at}"
    elif not ok:
        problem = "CRC mismatch"
    return [_entry_row(e, crc, ok, base + at, problem)]


def _batch_rows(data: bytes, at: int, size: int, base: int) -> list[Row]:
    """The rows of the TLE2 entry at `at` whose framing (magic, size) the walk accepted."""
    _, _, head_crc, index, term, phys, qoff, ts, records_crc = codec.BATCH_HEAD.unpack_from(data, at)
    mv = memoryview(data)
    bad = [what for what, ok in (
        ("head CRC mismatch", codec.crc32(mv[at + codec.HEAD_CRC_START:at + codec.HEAD_CRC_END]) == head_crc),
        ("records CRC mismatch", codec.crc32(mv[at + codec.BATCH_HEAD_SIZE:at + size]) == records_crc)) if not ok]
    try:
        h = codec.check_batch(data, at, verify=False)
        ids, ks = codec.zone_ids_keys(data, at + codec.BATCH_HEAD_SIZE, at + size, phys)
    except CorruptEntry as err:
        why = "; ".join([f"records cannot be framed: {err.reason}"] + bad)
        return [Row("entry", index, term, head_crc, False, base + at, size, problem=why, batch_pos=None)]
    if not bad and phys != base + at:
        bad = [f"entry names offset {phys}, found at {base + at}"]
    ok, problem = not bad, "; ".join(bad) or None
    topic = bytes(data[at + codec.BATCH_TOPIC_AT:at + codec.BATCH_TOPIC_AT + h.topic_len]).decode("utf-8", "replace")
    return [Row("entry", index, term, head_crc, ok, base + at, size, topic, h.queue_id, qoff + k, i.hex(),
                ks[k], ts, problem, k) for k, i in enumerate(ids)]


def _good_at(data: bytes, rel: int, base: int) -> bool:
    """An entry of either magic decodes at `rel` with good CRCs (and framed records) and names
    the offset it sits at."""
    try:
        if data[rel + 4:rel + 8] == BATCH_MAGIC_BYTES:
            h = codec.check_batch(data, rel)
            codec.frame_zone(data, rel + codec.BATCH_HEAD_SIZE, rel + h.size)
            return h.phys_offset == base + rel
        e, _, ok = codec.inspect(data, rel)
    except CorruptEntry:
        return False
    return ok and e.phys_offset == base + rel


def resync(data: bytes, start: int, base: int) -> int:
    """The next position at or after `start` where an entry of either magic decodes with good
    CRCs at the offset it names, or where the end-of-segment marker fits exactly; len(data)
    if none."""
    n = len(data)
    found = {m: data.find(m, start + 4) for m in (ENTRY_MAGIC_BYTES, BATCH_MAGIC_BYTES)}
    while True:
        live = [(at, m) for m, at in found.items() if at >= 0]
        if not live:
            break
        at, m = min(live)
        if _good_at(data, at - 4, base):
            return at - 4
        found[m] = data.find(m, at + 1)
    blank = codec.BLANK_MAGIC.to_bytes(4, "big")
    m = data.find(blank, start + 4)
    while m >= 0:
        cand = m - 4
        if codec.peek(data, cand)[0] == n - cand:
            return cand
        m = data.find(blank, m + 1)
    return n


def read_segment(data: bytes, base: int) -> list[Row]:
    """Every message, damaged entry and problem of the segment whose first byte is at log
    offset `base`."""
    units: list[list[Row]] = []  # one per entry (its rows), or one problem row
    damaged: list[int] = []  # positions in `units` of problem regions between entries
    n, rel = len(data), 0
    while True:
        # framing (size, magic) by the walk rule; the rest is this reader's to report
        w, stop = codec.walk2(data, rel, read="frame"), None
        for at, size in w:
            try:
                units.append(_batch_rows(data, at, size, base) if data[at + 4:at + 8] == BATCH_MAGIC_BYTES
                             else _tle1_rows(data, at, base))
            except CorruptEntry as err:  # a TLE1 header whose lengths disagree: broken framing
                stop = codec.Stop(codec.CORRUPT, at, 0, err.reason)
                break
        stop = stop or w.stop
        rel = stop.pos
        if stop.kind in (codec.END, codec.MARKER):  # never written / the segment ends
            break
        if stop.kind == codec.PARTIAL and stop.size == codec.BLANK_SIZE_MIN:
            units.append([Row("problem", None, None, None, False, base + rel, n - rel, batch_pos=None,
                              problem=f"segment stops at offset {base + rel} without an end-of-segment "
                                      "marker (truncated copy?)")])
            break
        reason = stop.reason if stop.kind == codec.CORRUPT else \
            f"truncated entry ({n - rel} of {stop.size} bytes)"
        nxt = resync(data, rel + 1, base)
        damaged.append(len(units))
        units.append([Row("problem", None, None, None, False, base + rel, nxt - rel, batch_pos=None,
                          problem=f"unreadable from offset {base + rel} ({nxt - rel} bytes): {reason}")])
        rel = nxt
        if rel >= n:
            break
    return [r for u in _fill_indexes(units, damaged) for r in u]


def _neighbour_index(units: list[list[Row]], i: int) -> int | None:
    """The index entry i must have, counted from the nearest good entry with no damaged region
    in between (before it first, else after it); None when there is none."""
    for direction in (-1, 1):
        k, steps = i + direction, 1
        while 0 <= k < len(units) and units[k][0].kind == "entry":
            if units[k][0].crc_ok:
                return units[k][0].index - direction * steps
            k, steps = k + direction, steps + 1
    return None


def _fill_indexes(units: list[list[Row]], damaged: list[int]) -> list[list[Row]]:
    """Bad entries take their index from their good neighbours; indexes lost in a damaged
    region between two good entries become entries (one row each) of their own."""
    out: list[list[Row]] = []
    dset = set(damaged)
    for i, u in enumerate(units):
        if u[0].kind == "entry" and not u[0].crc_ok:
            idx = _neighbour_index(units, i)
            if idx is not None:
                u = [r._replace(index=idx) for r in u]
        out.append(u)
        if i in dset:
            before = out[-2][0] if len(out) >= 2 and out[-2][0].kind == "entry" else None
            after = units[i + 1][0] if i + 1 < len(units) and units[i + 1][0].kind == "entry" else None
            if before is not None and after is not None and before.index is not None \
                    and after.crc_ok:
                out += [[Row("entry", idx, None, None, False, u[0].phys_offset, 0,
                             problem="lost in a damaged region", batch_pos=None)]
                        for idx in range(before.index + 1, after.index)]
    return out
