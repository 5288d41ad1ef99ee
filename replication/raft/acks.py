"""Client appends waiting for the quorum (DLedger's pendingAppendResponsesByTerm).

The leader's driver adds one item per client batch (its last index); items complete in index
order once the commit index reaches them, fail with TERM_CHANGED when the term moves on (or
this node stops leading), and with WAIT_QUORUM_ACK_TIMEOUT at their deadline.
"""

from __future__ import annotations

from collections import deque
from typing import Any


class PendingAcks:
    def __init__(self):
        self.items: deque[tuple[int, int, float, Any]] = deque()  # (index, term, deadline, token)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, index: int, term: int, deadline: float, token: Any) -> None:
        if self.items and index < self.items[-1][0]:
            raise ValueError(f"index {index} added after {self.items[-1][0]}")
        self.items.append((index, term, deadline, token))

    def committed(self, commit_index: int, term: int) -> list[Any]:
        """Tokens whose index is committed (and of `term`: a leader acks its own appends)."""
        out = []
        while self.items and self.items[0][0] <= commit_index and self.items[0][1] == term:
            out.append(self.items.popleft()[3])
        return out

    def term_changed(self, term: int | None) -> list[Any]:
        """Tokens of other terms than `term` (None: this node no longer leads)."""
        keep, out = deque(), []
        for it in self.items:
            (keep if term is not None and it[1] == term else out).append(it)
        self.items = keep
        return [it[3] for it in out]

    def expired(self, now: float) -> list[Any]:
        out = []
        while self.items and self.items[0][2] <= now:
            out.append(self.items.popleft()[3])
        return out
