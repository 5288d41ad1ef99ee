"""Quorum math."""

from __future__ import annotations


def majority(n_voters: int) -> int:
    return n_voters // 2 + 1


def quorum_index(marks: list[int], n_voters: int) -> int:
    """The highest index that a majority of `n_voters` holds, given one watermark per voter
    (-1: holds nothing). Sorts `marks` in place."""
    marks.sort(reverse=True)
    return marks[majority(n_voters) - 1]
