"""A log of fixed-size records: slot n holds record n (ConsumeQueues, the position index).

A record of all zero bytes is an empty slot: owners make sure real records never are.
Records are written in order, so the written slots of a file are one run: everything
before `first` and from `count` on is empty, which lets `load` find where it ends by
binary search.

Appends are held in memory (`flush_tail` writes them; it happens by itself every
TAIL_BYTES_MAX): a small write per send batch per queue cost ~50 us here, mostly the file
time update. Reads see held records too. The owners' data is derived from the CommitLog,
so records lost with the process are rebuilt at recovery.
"""

from __future__ import annotations

from pathlib import Path

from broker.store.files import FileQueue

TAIL_BYTES_MAX = 64 << 10


class RecordFile:
    def __init__(self, directory: Path, record_size: int, records_per_file: int):
        self.record_size = record_size
        self.files = FileQueue(directory, records_per_file, record_size)
        self._zero = bytes(record_size)
        self.first = 0  # the first written slot
        self.count = 0  # the next slot to write
        self._tail = bytearray()  # records [written, count), not yet in the files
        self.written = 0

    @property
    def directory(self) -> Path:
        return self.files.directory

    def load(self) -> None:
        self.files.load()
        written = [(f, self._first_written(f)) for f in self.files.files]
        written = [(f, i) for f, i in written if i < self.files.units_of(f)]
        self._tail.clear()
        if not written:
            base = self.files.first_unit
            self.first = self.count = self.written = base if base is not None else 0
            return
        head, head_first = written[0]
        tail, tail_first = written[-1]
        self.first = head.base + head_first
        self.count = self.written = tail.base + self._written_end(tail, tail_first)

    def _slot_empty(self, f, i: int) -> bool:
        return f.pread(i * self.record_size, self.record_size) == self._zero

    def _first_written(self, f) -> int:
        """The first written slot of file f (relative), or its size if none is."""
        units = self.files.units_of(f)
        if units and not self._slot_empty(f, 0):
            return 0
        # a log that was reset or rebuilt starts mid-file: find the first non-zero byte
        chunk, rs = 1 << 20, self.record_size
        for pos in range(0, units * rs, chunk):
            data = f.pread(pos, min(chunk, units * rs - pos))
            zeros = len(data) - len(data.lstrip(b"\0"))
            if zeros < len(data):
                return (pos + zeros) // rs
        return units

    def _written_end(self, f, start: int) -> int:
        """The first empty slot of file f at or after its first written slot `start`."""
        lo, hi = start, self.files.units_of(f)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._slot_empty(f, mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def close(self) -> None:
        self.flush_tail()
        self.files.close()

    # --- writes (event-loop thread) ----------------------------------------------------

    def reset(self, start: int) -> None:
        """Drop every record; the next append goes to slot `start`."""
        self.files.delete_all()
        self._tail.clear()
        self.first = self.count = self.written = start

    def append(self, data: bytes) -> None:
        """Append whole records at slot `count`."""
        self.write_at(self.count, data)

    def write_at(self, slot: int, data: bytes) -> None:
        """Write whole records from `slot` (<= count): overwrites, then extends."""
        if slot > self.count:
            raise ValueError(f"slot {slot} would leave a gap after {self.count}")
        if self.first == self.count:  # empty: this write sets where the records start
            self.first = slot
        n = len(data) // self.record_size
        if slot == self.count and self.written + len(self._tail) // self.record_size == slot:
            self._tail += data  # a plain append: held in memory for now
            self.count += n
            if len(self._tail) >= TAIL_BYTES_MAX:
                self.flush_tail()
            return
        self.flush_tail()
        self._write(slot, data)
        self.count = self.written = max(self.count, slot + n)

    def flush_tail(self) -> None:
        """Write the records held in memory (on the thread that writes)."""
        if self._tail:
            self._write(self.written, bytes(self._tail))  # on failure they stay held
            self.written += len(self._tail) // self.record_size
            self._tail.clear()

    def _write(self, slot: int, data: bytes) -> None:
        rs = self.record_size
        n = len(data) // rs
        done = 0
        while done < n:
            at = slot + done
            f = self.files.file_for_write(at)
            k = min(f.base + self.files.units_of(f) - at, n - done)
            f.pwrite((at - f.base) * rs, data[done * rs:(done + k) * rs])
            self.files.mark_dirty(f)
            done += k

    def truncate(self, slot: int) -> None:
        """Drop the records from `slot` on."""
        if slot >= self.count:
            return
        slot = max(slot, self.first)
        if slot >= self.written:  # only held records go
            del self._tail[(slot - self.written) * self.record_size:]
            self.count = slot
            return
        self._tail.clear()
        f = self.files.find(slot)
        if f is not None and slot > f.base:
            self.files.delete_from(f.base + 1)  # the files after f
            end = min(self.written, f.base + self.files.units_of(f))
            f.pwrite((slot - f.base) * self.record_size, bytes((end - slot) * self.record_size))
            self.files.mark_dirty(f)
        else:
            self.files.delete_from(slot)
        self.count = self.written = slot
        self.first = min(self.first, slot)

    def delete_before(self, slot: int) -> None:
        """Delete whole files below `slot` (retention)."""
        self.files.delete_before(slot)
        if self.files.first_unit is not None:
            self.first = max(self.first, self.files.first_unit)

    # --- reads -------------------------------------------------------------------------

    def record(self, slot: int) -> bytes:
        """Record `slot` (empty if not written): `read(slot)`, without a file read or a
        join when it is still held in memory (the newest records are)."""
        k = slot - self.written
        if 0 <= k and slot < self.count:
            rs = self.record_size
            return bytes(self._tail[k * rs:(k + 1) * rs])
        return self.read(slot)

    def read(self, slot: int, n: int = 1) -> bytes:
        """Records [slot, slot+n) clipped to what is written; may return fewer."""
        rs = self.record_size
        end = min(slot + n, self.count)
        out = []
        disk_end = min(end, self.written)
        while slot < disk_end:
            f = self.files.find(slot)
            if f is None:
                return b"".join(out)
            k = min(disk_end, f.base + self.files.units_of(f)) - slot
            chunk = f.pread((slot - f.base) * rs, k * rs)
            out.append(chunk)
            if len(chunk) < k * rs:
                return b"".join(out)
            slot += k
        if slot < end:
            out.append(bytes(self._tail[(slot - self.written) * rs:(end - self.written) * rs]))
        return b"".join(out)

    def sync(self) -> None:
        self.files.sync_dirty()
