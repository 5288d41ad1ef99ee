"""Read a CommitLog directory without opening a store: for tools, tests and the reconcile job.

Never writes. Walks the segment files in offset order, entry by entry through the codec,
following end-of-segment markers; stops at the first never-written byte, or at a bad
entry (which it reports, rather than raising, so a damaged copy can still be compared).
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


def iter_entries(directory: Path, end: list | None = None) -> Iterator[codec.Entry]:
    """Every entry of the CommitLog under `directory` (a broker's data_dir), in log order.
    If `end` is a list, a LogEnd is appended to it when the walk stops."""
    pos, reason = 0, None
    for path in segments(directory):
        base = int(path.name)
        data = path.read_bytes()
        if pos and base != pos:
            reason = f"segment {path.name} does not start where the previous one ended ({pos})"
            break
        # the segment's own size is not trusted (a copy may be truncated): its marker says
        # where it ends, and bytes that stop short of a whole entry or marker are reported
        w = codec.walk(data, base=base, read="entry")
        for rel, e in w:
            yield e
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
