"""An in-memory log for the simulation and unit tests: the LogView the core reads, plus
what a driver does with a Ready (truncate, reset, append) and with a leader's appends.

`items` is what the page cache holds; entries up to `flushed` were fsynced. A power loss
(`crash`) keeps the fsynced prefix and, given a seeded `rng`, a random part of the rest
(writes reach the disk in order, and a torn entry fails its checksum and is dropped by
recovery, so what survives is a prefix). A cut counts as durable at once: `flushed` only
comes down with it."""

from __future__ import annotations

from replication.raft.messages import Entry


class MemLog:
    def __init__(self):
        self.begin = 0
        self.items: list[Entry] = []  # items[i] holds index begin + i
        self.flushed = -1  # entries up to here survive a crash

    # LogView
    def begin_index(self) -> int:
        return self.begin

    def last_index(self) -> int:
        return self.begin + len(self.items) - 1

    def term_at(self, index: int) -> int | None:
        i = index - self.begin
        return self.items[i][1] if 0 <= i < len(self.items) else None

    def entries(self, lo: int, max_entries: int, max_bytes: int) -> list[Entry]:
        i = lo - self.begin
        if i < 0:
            return []
        out, size = [], 0
        for e in self.items[i:i + max_entries]:
            if out and size + len(e[2]) > max_bytes:
                break
            out.append(e)
            size += len(e[2])
        return out

    def bytes_after(self, index: int) -> int:
        i = max(0, index + 1 - self.begin)
        return sum(len(e[2]) for e in self.items[i:])

    # writes
    def truncate_from(self, index: int) -> None:
        del self.items[max(0, index - self.begin):]
        self.flushed = min(self.flushed, self.last_index())

    def reset_to(self, index: int) -> None:
        self.begin, self.items = index, []
        self.flushed = index - 1

    def append(self, entries: list[Entry]) -> None:
        for e in entries:
            if e[0] != self.last_index() + 1:
                raise AssertionError(f"append of {e[0]} after {self.last_index()}")
            self.items.append(e)

    def flush(self) -> None:
        self.flushed = self.last_index()

    def unsynced(self) -> int:
        return self.last_index() - self.flushed

    def crash(self, rng=None) -> int:
        """Lose what was not flushed (with `rng`: all but a random prefix of it, a torn
        tail). Returns how many entries were lost."""
        keep = rng.randrange(self.unsynced() + 1) if rng is not None and self.unsynced() > 0 else 0
        before = self.last_index()
        self.truncate_from(self.flushed + keep + 1)
        self.flushed = self.last_index()  # what survived a restart is on disk
        return before - self.last_index()
