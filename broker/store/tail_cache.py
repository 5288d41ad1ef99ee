"""The log's newest entries in memory: the bytes objects the CommitLog just wrote, for the
readers that come right after the writer -- the dispatcher (ConsumeQueues, key index) and a
master's stream to its slaves -- instead of reading them back from the file (dispatching one
256-message batch had cost four reads: 8 bytes and 64 KiB, then 8 bytes and the whole entry).

Entries are kept by their log offset, oldest dropped first once more than `max_bytes` are
held. The CommitLog empties it before every cut (a truncation or restart may put other bytes
at an offset it holds) and drops what retention deletes, so what it returns is always what
the file holds there. (Between cuts the log only grows: the order written is offset order.)"""

from __future__ import annotations

from collections import OrderedDict


class TailCache:
    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        # offset -> entry, in the order written; an OrderedDict drops its oldest in O(1) (a
        # dict's first key is found by scanning past every slot popped before it)
        self._held: OrderedDict[int, bytes] = OrderedDict()
        self.bytes = 0

    def add(self, places: list[int], entries: list) -> None:
        """Entries just written at `places` (only bytes objects are kept: a view may be into a
        buffer its owner reuses)."""
        held = self._held
        for at, entry in zip(places, entries):
            if type(entry) is bytes:
                old = held.pop(at, None)
                if old is not None:
                    self.bytes -= len(old)
                held[at] = entry
                self.bytes += len(entry)
        while self.bytes > self.max_bytes:
            self.bytes -= len(held.popitem(last=False)[1])

    def forget_before(self, offset: int) -> None:
        """Retention deleted the log below `offset`."""
        held = self._held
        while held and next(iter(held)) < offset:
            self.bytes -= len(held.popitem(last=False)[1])

    def clear(self) -> None:
        self._held.clear()
        self.bytes = 0

    def run(self, offset: int, limit: int, max_bytes: int, first_whole: bool = False) -> list[bytes]:
        """The held entries that follow each other from `offset`, each ending at or before
        `limit`, together at most `max_bytes` (`first_whole`: the first one whatever its size);
        [] when the entry at `offset` is not held or does not fit."""
        held, out, n = self._held, [], 0
        entry = held.get(offset)
        while entry is not None:
            end = offset + len(entry)
            if end > limit or (n + len(entry) > max_bytes and not (first_whole and not out)):
                break
            out.append(entry)
            n += len(entry)
            offset = end
            entry = held.get(offset)
        return out
