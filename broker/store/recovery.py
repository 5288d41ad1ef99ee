"""CommitLog recovery (a part of CommitLog, kept apart for size): open the files, find where
to scan from (the checkpoint, if it names an entry boundary of this log; else the first
segment), walk the entries with codec.walk2, rebuild the position index from them, cut a torn
or corrupt tail (zeroing what follows it), and fsync what was re-read before calling it
flushed: after a kill -9 the page cache may hold writes no fsync covered yet.

Both formats are read (docs/design/batch-format.md, "Recovery"): a TLE1 entry and a TLE2
record batch are each one entry, one POSITION record. A batch is checked whole (framing,
its records' framing, head and records CRCs, its place) and a torn or corrupt one is cut at
its start, never after a prefix of its records: its messages were acknowledged together, only
once all of it was durable or committed.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from typing import NamedTuple

from broker.store import codec
from broker.store.checkpoint import Checkpoint

log = logging.getLogger("broker.store.commitlog")

POSITION = struct.Struct(">QIQ")  # phys_offset, size, term
SCAN_CHUNK_BYTES = 8 << 20


class Tail(NamedTuple):
    offset: int  # where the next entry goes
    next_index: int  # the index it gets
    last_term: int  # term of the entry before it


@dataclass
class RecoveryReport:
    scanned_from: int = 0
    entries_checked: int = 0
    cut_offset: int | None = None  # where a torn or corrupt tail was cut
    cut_reason: str | None = None
    cut_bytes: int = 0  # non-zero bytes found and zeroed after the cut
    segments_removed: int = 0
    full_scan: bool = False


class Recovery:
    """CommitLog's recovery methods (the CommitLog provides segments, positions, tail, ...)."""

    def recover(self, cp: Checkpoint | None) -> RecoveryReport:
        """Open the files and cut any torn or corrupt tail after the checkpoint."""
        self.segments.load()
        self.positions.load()
        report = RecoveryReport()
        if not self.segments.files:
            if cp is not None and cp.flushed_offset > 0:
                # restart_at dropped every file and checkpointed where the log goes on (its
                # first append creates the segment); else the CommitLog files were removed
                log.warning("no CommitLog segment exists: going on from the checkpoint at offset %d, "
                            "index %d (a log restarted there, or its files were removed)",
                            cp.flushed_offset, cp.next_index)
                self.positions.reset(cp.next_index)
                self.tail = self.flushed = Tail(cp.flushed_offset, cp.next_index, cp.last_term)
                return report
            # an empty log: its first segment (sparse, as every segment: files.py)
            self.segments.create(0)
            nxt = cp.next_index if cp is not None else 0
            self.positions.reset(nxt)
            self.tail = self.flushed = Tail(0, nxt, 0)
            return report
        if cp is not None:  # records below the checkpoint's index were fsynced with it
            self._positions_from_log_start(min(self.positions.count, cp.next_index))
        start = self._scan_start(cp)
        if start is None:
            report.full_scan = True
            start = (self._first_entry_offset(), None, 0)
        report.scanned_from = start[0]
        self._scan(start, report)
        if report.full_scan and not report.entries_checked and cp is not None:
            self._empty_at_checkpoint(cp)
        self._positions_from_log_start(self.positions.count)  # (read back by the scan)
        # What was re-read may have been only in the page cache (a kill -9 keeps it, a power
        # loss does not): it is called flushed only once fsynced here.
        self.segments.mark_dirty_from(report.scanned_from)
        durable = self._sync_segments(directory=True)
        self.positions.flush_tail()
        self.positions.sync()
        if durable:
            self.flushed = self.tail
        else:  # only what the checkpoint vouched for (nothing on a full scan)
            first = self.segments.first_unit
            self.flushed = (Tail(*start) if start[1] is not None
                            else Tail(first, self.positions.first, 0))
        return report

    def _empty_at_checkpoint(self, cp: Checkpoint) -> None:
        """A scan of everything found no entry: the log is empty, and the checkpoint says where
        (a log restarted there whose first entries were not durable). Without it the log would
        go on at index 0, as if it had never held anything."""
        end = self.tail.offset
        at_file = self.segments.find(cp.flushed_offset) is not None or cp.flushed_offset == self.segments.next_base()
        if cp.flushed_offset < end and not self._marker_between(cp.flushed_offset, end):
            return
        if cp.flushed_offset > end and not (at_file and self.segments.find(end) is not None
                                            and self.segments.find(end) is self.segments.find(cp.flushed_offset)):
            return
        log.warning("the CommitLog holds no entry: it goes on at the checkpoint's offset %d, index %d",
                    max(end, cp.flushed_offset), cp.next_index)
        self.positions.reset(cp.next_index)
        self.tail = Tail(max(end, cp.flushed_offset), cp.next_index, cp.last_term)

    def _first_entry_offset(self) -> int:
        """Where a scan of everything starts: the first segment's base, or its first entry
        when the log restarted inside it (restart_at, reset: zeros before the entry). A full
        scan from the base would take those zeros for the end of the log and cut it all."""
        seg = self.segments.files[0]
        head = seg.pread(0, codec.BLANK_SIZE_MIN)
        if head.count(0) != len(head):
            return seg.base
        rel, block = 0, 1 << 16
        while rel < seg.size:  # the first non-zero byte: inside the first entry's size field
            data = seg.pread(rel, min(block, seg.size - rel))
            if not data:
                break
            zeros = len(data) - len(data.lstrip(b"\0"))
            if zeros < len(data):
                at = rel + zeros
                for cand in range(max(0, at - 3), at + 1):  # the size is a big-endian u32
                    if self._entry_at(seg, cand):
                        return seg.base + cand
                break
            rel += len(data)
        return seg.base

    def _entry_at(self, seg, rel: int) -> bool:
        """An entry in its place starts at `rel`, or the marker that closes the segment."""
        head = seg.pread(rel, codec.BLANK_SIZE_MIN)
        if len(head) < codec.BLANK_SIZE_MIN:
            return False
        rest = seg.size - rel
        if codec.classify2(head, 0, len(head), rest) == (codec.MARKER, 0, rest, None):
            return True
        size, magic = codec.peek(head)
        if magic not in (codec.ENTRY_MAGIC, codec.BATCH_MAGIC) or not codec.HEADER_SIZE <= size <= seg.size - rel:
            return False
        try:
            return codec.check_entry(seg.pread(rel, size))[3] == seg.base + rel
        except codec.CorruptEntry:
            return False

    def _positions_from_log_start(self, upto: int) -> None:
        """Start the position index at the first entry of the first segment (looking at the
        records below `upto` only). Retention deletes segments and the position files below
        them, but the records of deleted entries that share a file with kept ones stay in it,
        and loading the file finds them: the log would claim entries it has not (a raft
        leader would ship them), and a checkpoint at the log's start would look like no
        entry boundary (the scan of everything that follows lost the log's next index)."""
        first, p = self.segments.first_unit, self.positions

        def below(i: int) -> bool:
            raw = p.read(i)
            return len(raw) == POSITION.size and POSITION.unpack(raw)[0] < first

        if first is None or p.first >= upto or not below(p.first):
            return
        lo, hi = p.first, upto
        while lo < hi:
            mid = (lo + hi) // 2
            if below(mid):
                lo = mid + 1
            else:
                hi = mid
        index = lo
        log.info("the CommitLog starts at offset %d: its index starts at entry %d (was %d)",
                 first, index, p.first)
        p.delete_before(index)
        p.first = index

    def _scan_start(self, cp: Checkpoint | None):
        """(offset, expected index, last term) to scan from, or None for a full scan."""
        if cp is None:
            return None
        seg = self.segments.find(cp.flushed_offset)
        at_next_base = cp.flushed_offset == self.segments.next_base()
        if seg is None and not at_next_base:
            log.error("checkpoint offset %d lies outside the CommitLog files [%d, %d): "
                      "scanning everything", cp.flushed_offset, self.segments.first_unit,
                      self.segments.next_base())
            return None
        if cp.next_index < self.positions.first or cp.next_index > self.positions.count:
            log.warning("position index [%d, %d) does not cover checkpoint index %d: "
                        "rebuilding it", self.positions.first, self.positions.count,
                        cp.next_index)
            return None
        why = self._not_a_boundary(cp)
        if why is not None:
            log.error("checkpoint offset %d (index %d) is not where this log's entries end: %s; "
                      "scanning everything", cp.flushed_offset, cp.next_index, why)
            return None
        return cp.flushed_offset, cp.next_index, cp.last_term

    def _not_a_boundary(self, cp: Checkpoint) -> str | None:
        """Why entry next_index-1 does not end at the checkpoint's offset (None if it does).
        A checkpoint written from a snapshot older than a truncation can name an offset in
        the middle of an entry written after the cut; scanning from there would cut the
        good entries that follow as "corrupt"."""
        off, nxt = cp.flushed_offset, cp.next_index
        if nxt == self.positions.first:
            if nxt < self.positions.count:
                phys = POSITION.unpack(self.positions.read(nxt))[0]
                if phys != off and not self._marker_between(off, phys):  # (restarted at off)
                    return f"the log's first entry {nxt} starts at {phys}"
            return None
        raw = self.positions.read(nxt - 1)
        if len(raw) != POSITION.size:
            return f"no position record for entry {nxt - 1}"
        phys, size, term = POSITION.unpack(raw)
        if term != cp.last_term:
            return f"entry {nxt - 1} has term {term}"
        if phys + size != off and not self._marker_between(phys + size, off):
            return f"entry {nxt - 1} ends at {phys + size}"
        # its head after every check (either magic; a batch: both CRCs), or why it has none
        w = codec.walk2(self.read(phys, size), base=phys, read="head")
        e = next(iter(w), (0, None))[1]
        if e is None:
            return f"entry {nxt - 1} at {phys}: {w.stop.reason or w.stop.kind}"
        if e.index != nxt - 1 or e.size != size or e.term != term:
            return f"the entry at {phys} is index {e.index}, term {e.term}, {e.size} bytes"
        return None

    def _marker_between(self, end: int, off: int) -> bool:
        """Whether an end-of-segment marker fills [end, off) and `off` ends that segment (a
        log whose last entry closed its segment ends at the next one's start)."""
        seg = self.segments.find(end)
        if seg is None or seg.base + seg.size != off or off - end < codec.BLANK_SIZE_MIN:
            return False
        head = seg.pread(end - seg.base, codec.BLANK_SIZE_MIN)
        return codec.classify2(head, 0, len(head), off - end) == (codec.MARKER, 0, off - end, None)

    def _scan(self, start, report: RecoveryReport) -> None:
        pos, expected, last_term = start
        if expected is None:
            self.positions.reset(0)
        else:
            self.positions.truncate(expected)
        records: list[bytes] = []
        reason = None
        for at, e, why in self._walk(pos):
            pos = at
            if e is None:
                reason = why
                break
            if expected is None:
                expected = e.index
                self.positions.reset(expected)
            if e.index != expected:
                reason = f"index {e.index} where {expected} was expected"
                break
            if e.term < last_term:
                reason = f"term {e.term} after term {last_term}"
                break
            records.append(POSITION.pack(e.phys_offset, e.size, e.term))
            if len(records) >= 4096:
                self.positions.append(b"".join(records))
                records.clear()
            report.entries_checked += 1
            expected += 1
            last_term = e.term
            pos = at + e.size
        if records:
            self.positions.append(b"".join(records))
        if expected is None:
            expected = 0
            self.positions.reset(0)
        self.tail = Tail(pos, expected, last_term)
        self._cut_after(pos, reason, report)

    def _walk(self, pos: int):
        """Yield (offset, head, None) for each entry of either magic from `pos` (a
        codec.BatchHead: index, term, phys_offset and size are all the scan needs), following
        end-of-segment markers; end with (offset, None, reason) at a bad entry or (offset,
        None, None) at the end of the written data (codec.walk2's rule, with the segment's
        geometry). "head" makes every check an entry can fail (both CRCs of a batch, its
        records' framing, its place) without copying a body."""
        while True:
            seg = self.segments.find(pos)
            if seg is None:
                yield pos, None, None
                return
            seg_end = seg.base + seg.size
            need = SCAN_CHUNK_BYTES
            while True:  # one window of the segment at a time
                win = seg.pread(pos - seg.base, min(max(need, SCAN_CHUNK_BYTES), seg_end - pos))
                w = codec.walk2(win, base=pos, segment_end=seg_end - pos, read="head")
                for rel, e in w:
                    yield pos + rel, e, None
                stop = w.stop
                at = pos + stop.pos
                if stop.kind == codec.PARTIAL:
                    if stop.pos == 0:  # the window asked for it all: the file is shorter
                        yield at, None, f"segment file ends inside the entry at {at}"
                        return
                    pos, need = at, stop.size  # read on from there, the whole entry at least
                    continue
                if stop.kind == codec.MARKER:
                    pos = seg_end
                    break
                if stop.kind == codec.END:
                    yield at, None, None  # never written: the end of the log
                else:
                    yield at, None, stop.reason or f"{stop.kind} at {at}"
                return

    def _cut_after(self, pos: int, reason: str | None, report: RecoveryReport) -> None:
        """Zero what follows `pos` in its segment and remove later segments."""
        seg = self.segments.find(pos)
        dirty = 0
        if seg is not None:
            dirty = self._zero_written(seg, pos)
        later = self.segments.delete_from(pos + 1 if seg is not None else pos)
        if reason is None and not dirty and not later:
            return
        report.cut_offset = pos
        report.cut_reason = reason or "data after the end of the log"
        report.cut_bytes = dirty
        report.segments_removed = len(later)
        log.warning("recovery cut the CommitLog at offset %d (index %d): %s; zeroed %d bytes, "
                    "removed %d later segment(s)", pos, self.tail.next_index, report.cut_reason,
                    dirty, len(later))

    def _zero_written(self, seg, pos: int) -> int:
        """Zero the written bytes from `pos` up to the first all-zero block; return how many."""
        rel, end, zeroed = pos - seg.base, seg.size, 0
        block = 1 << 20
        while rel < end:
            data = seg.pread(rel, min(block, end - rel))
            if not data or data.count(0) == len(data):
                break
            seg.pwrite(rel, bytes(len(data)))
            zeroed += len(data) - data.count(0)
            rel += len(data)
        if zeroed:
            self.segments.mark_dirty(seg)
        return zeroed

