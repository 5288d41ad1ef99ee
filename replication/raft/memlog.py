"""An in-memory log for the simulation and unit tests: the LogView the core reads, plus
what a driver does with a Ready (truncate, reset, append) and with a leader's appends."""

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

    def crash(self) -> None:
        """Lose what was not flushed."""
        self.truncate_from(self.flushed + 1)
