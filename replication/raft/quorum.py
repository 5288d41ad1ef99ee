"""Quorum math."""

from __future__ import annotations


def majority(n_voters: int) -> int:
    return n_voters // 2 + 1


def quorum_index(watermarks: dict[str, int], voters: list[str] | tuple[str, ...]) -> int:
    """The highest index that a majority of `voters` holds (-1 if none)."""
    marks = sorted((watermarks.get(v, -1) for v in voters), reverse=True)
    return marks[majority(len(voters)) - 1]
