"""Messages between Raft nodes (pure data; the wire codec is in wire.py).

Every message names its sender (`src`) and the sender's term. Entries travel as
(index, term, data) triples; `data` is the CommitLog entry's bytes (store/codec.py), which
the core never looks into.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

Entry = tuple[int, int, bytes]  # (index, term, data)


class PushType(IntEnum):
    APPEND = 1  # entries to append after the follower's end
    COMPARE = 2  # "do you hold this (index, term)?": a new leader looking for the match point
    TRUNCATE = 3  # cut everything after `entries[0]`'s index, which becomes the follower's end
    COMMIT = 4  # only the commit index (appends are sparse)


class PushCode(IntEnum):
    SUCCESS = 0
    INCONSISTENT_STATE = 1  # not matching / a gap that did not fill: compare again
    REPEATED_PUSH = 2  # this append is already waiting here
    TERM_STALE = 3  # the pusher's term is older than ours (our term is in the answer)


@dataclass(frozen=True, slots=True)
class VoteRequest:
    src: str
    term: int  # for a pre-vote: the term the candidate would campaign in
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False  # a leadership transfer: ignore the leader lease


@dataclass(frozen=True, slots=True)
class VoteResponse:
    src: str
    term: int
    granted: bool
    pre_vote: bool = False


@dataclass(frozen=True, slots=True)
class Push:
    src: str
    term: int
    type: PushType
    commit_index: int
    entries: tuple[Entry, ...] = ()
    seq: int = 0  # leader-side id of this push, echoed back


@dataclass(frozen=True, slots=True)
class PushResponse:
    src: str
    term: int
    type: PushType
    code: PushCode
    index: int  # APPEND: the last index now held; COMPARE/TRUNCATE: the index asked about
    begin_index: int
    end_index: int
    seq: int = 0


@dataclass(frozen=True, slots=True)
class Heartbeat:
    src: str
    term: int
    commit_index: int


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    src: str
    term: int
    ok: bool  # False: the heartbeat's term is older than ours
    needs_probe: bool = False  # our log is not verified against this leader's: COMPARE us


@dataclass(frozen=True, slots=True)
class TimeoutNow:
    """Leadership transfer: the leader tells a caught-up follower to campaign at once."""

    src: str
    term: int


Message = VoteRequest | VoteResponse | Push | PushResponse | Heartbeat | HeartbeatResponse | TimeoutNow
