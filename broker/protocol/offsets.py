"""Consumer-group offsets (JSON bodies, see jsonbody.py).

QUERY_OFFSET   QueryOffsets  -> Offsets   (-1 for a queue the group never committed)
COMMIT_OFFSET  CommitOffsets -> {}        offsets are the next offset to consume
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class QueryOffsets:
    group: str
    topic: str
    queue_ids: list[int]


@dataclass(frozen=True)
class Offsets:
    offsets: dict[int, int]


@dataclass(frozen=True)
class CommitOffsets:
    group: str
    topic: str
    offsets: dict[int, int]
