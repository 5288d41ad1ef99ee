"""Read a CommitLog directory without opening a store: for tools, tests and the reconcile job.

Never writes. Walks the segment files in offset order, entry by entry through the codec
(`walk2`: TLE1 entries and TLE2 record batches alike), following end-of-segment markers; stops
at the first never-written byte, or at a bad entry (which it reports, rather than raising, so
a damaged copy can still be compared).

Two views of the same walk: `iter_messages` (one Message per message: a TLE1 entry is one, a
batch gives each of its records with the batch's index, term and phys_offset) for whoever
looks for messages (msg ids, bodies), and `iter_batches` (one head per CommitLog entry, which
is what a raft index or a replica compare counts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, NamedTuple

from broker.store import codec
from broker.store.files import NAME_DIGITS


class LogEnd(NamedTuple):
    offset: int  # where the readable log ends
    reason: str | None  # None: the end of what was written; else why reading stopped


def segments(directory: Path) -> list[Path]:
    d = Path(directory) / "commitlog"
    if not d.is_dir():
        return []
    return sorted(p for p in d.iterdir() if p.name.isdigit() and len(p.name) == NAME_DIGITS)


def _walk(directory: Path, end: list | None, read: str) -> Iterator[tuple[bytes, int, object]]:
    """(segment bytes, position in them, walk2 item) of every entry, in log order. If `end`
    is a list, a LogEnd is appended to it when the walk stops."""
    pos, reason = 0, None
    for path in segments(directory):
        base = int(path.name)
        data = path.read_bytes()
        if pos and base != pos:
            reason = f"segment {path.name} does not start where the previous one ended ({pos})"
            break
        # the segment's own size is not trusted (a copy may be truncated): its marker says
        # where it ends, and bytes that stop short of a whole entry or marker are reported
        w = codec.walk2(data, base=base, read=read)
        for rel, item in w:
            yield data, rel, item
        stop = w.stop
        pos = base + stop.pos
        if stop.kind == codec.MARKER:
            pos = base + len(data)
            continue
        if stop.kind == codec.END:
            reason = "end"
        elif stop.kind == codec.PARTIAL and stop.size == codec.BLANK_SIZE_MIN:
            reason = f"segment {path.name} ends without an end-of-segment marker"
        elif stop.kind == codec.PARTIAL:
            reason = (f"offset {pos}: truncated entry ({len(data) - stop.pos} of {stop.size} "
                      "bytes)")
        else:
            reason = f"offset {pos}: {stop.reason}"
        break
    if end is not None:
        end.append(LogEnd(pos, None if reason in (None, "end") else reason))


def iter_messages(directory: Path, end: list | None = None) -> Iterator[codec.Message]:
    """Every message of the CommitLog under `directory` (a broker's data_dir), in log order:
    a Message (Entry's fields plus batch_pos) per TLE1 entry and per record of a TLE2 batch,
    each entry checked whole (framing, CRCs, its place) before any of its messages is given.
    If `end` is a list, a LogEnd is appended to it when the walk stops."""
    for _data, _rel, msgs in _walk(directory, end, "messages"):
        yield from msgs


# The name from before TLE2: its callers read messages (msg ids, bodies, an index's offset),
# which for a TLE1 log is one per entry.
iter_entries = iter_messages


class LogBatch(NamedTuple):
    """One CommitLog entry of either format (`iter_batches`): its head (a TLE1 entry is a batch
    of one, its CRC standing for both of a batch's) and its topic."""

    head: codec.BatchHead
    topic: str


def iter_batches(directory: Path, end: list | None = None) -> Iterator[LogBatch]:
    """Every CommitLog entry under `directory`, in log order, once its framing, its records'
    framing, its CRCs and its place check out (no record is copied). `end` as iter_messages."""
    for data, rel, h in _walk(directory, end, "head"):
        at = rel + (codec.BATCH_TOPIC_AT if h.magic == codec.BATCH_MAGIC else codec.HEADER_SIZE)
        yield LogBatch(h, data[at:at + h.topic_len].decode("utf-8", "replace"))


def log_bytes(directory: Path, limit: int) -> bytes:
    """The CommitLog's raw bytes from its first segment's start up to offset `limit`."""
    out = []
    for path in segments(directory):
        base = int(path.name)
        if base >= limit:
            break
        with open(path, "rb") as f:
            out.append(f.read(limit - base))
    return b"".join(out)
