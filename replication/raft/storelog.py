"""The core's LogView over the broker's CommitLog (entries by index via the position index)."""

from __future__ import annotations

from broker.store.commitlog import POSITION, CommitLog
from replication.raft.messages import Entry


class StoreLog:
    def __init__(self, commitlog: CommitLog):
        self.cl = commitlog

    def begin_index(self) -> int:
        return self.cl.positions.first

    def last_index(self) -> int:
        return self.cl.tail.next_index - 1

    def term_at(self, index: int) -> int | None:
        pos = self.cl.position(index)
        return pos[2] if pos is not None else None

    def entries(self, lo: int, max_entries: int, max_bytes: int) -> list[Entry]:
        """Entries from `lo`: at least one (if held), then up to the bounds."""
        if lo < self.begin_index():
            return []
        n = min(max_entries, self.cl.tail.next_index - lo)
        if n <= 0:
            return []
        recent = self.cl.recent_entries(lo, n, max_bytes)  # what a leader just wrote: no reads
        if recent is not None:
            return recent
        recs, total = [], 0
        for phys, size, term in POSITION.iter_unpack(self.cl.positions.read(lo, n)):
            if recs and total + size > max_bytes:
                break
            recs.append((phys, size, term))
            total += size
        out: list[Entry] = []
        i = 0
        while i < len(recs):  # one read per run of adjacent entries
            j, end = i + 1, recs[i][0] + recs[i][1]
            while j < len(recs) and recs[j][0] == end:
                end += recs[j][1]
                j += 1
            data = memoryview(self.cl.read(recs[i][0], end - recs[i][0]))  # slices: no copies
            off = 0
            for k in range(i, j):
                size = recs[k][1]
                out.append((lo + k, recs[k][2], data[off:off + size]))
                off += size
            i = j
        return out

    def bytes_after(self, index: int) -> int:
        pos = self.cl.position(index)
        if pos is None:
            return self.cl.tail.offset - self.cl.min_offset
        return max(0, self.cl.tail.offset - (pos[0] + pos[1]))
