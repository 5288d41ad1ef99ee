"""Quorum math."""

from __future__ import annotations


def majority(n_voters: int) -> int:
    return n_voters // 2 + 1


def quorum_index(watermarks: dict[str, int], voters: list[str] | tuple[str, ...]) -> int:
    """The highest index that a majority of `voters` holds (-1 if none)."""
    return quorum_index_of([watermarks.get(v, -1) for v in voters], len(voters))


def quorum_index_of(marks: list[int], n_voters: int) -> int:
    """quorum_index over the watermarks of all `n_voters` (a list, one per voter)."""
    marks.sort(reverse=True)
    return marks[majority(n_voters) - 1]
