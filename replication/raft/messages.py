"""Messages between Raft nodes (pure data; the wire codec is in wire.py).

Every message names its sender (`src`) and the sender's term. Entries travel as
(index, term, data) triples; `data` is the CommitLog entry's bytes (store/codec.py), which
the core never looks into.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

Entry = tuple[int, int, bytes]  # (index, term, data)

# Bounds of the numbers a message may carry (inclusive), checked by the wire codec both ways
# and by the core before it acts on a message (out_of_bounds). The wire fields are wider (term
# u64, index i64): the headroom means a node's next term, and the next index, always fit, and
# a forged term near 2**64 is refused instead of adopted. 2**62 is far beyond any real count:
# one election a millisecond takes 146 million years to get there.
TERM_MAX = 2**62
INDEX_MAX = 2**62
INDEX_NONE = -1  # "no index" (an empty log's last index, nothing committed yet)
SEQ_MAX = 2**64 - 1  # a push's id (u64): only echoed back, never counted on


class PushType(IntEnum):
    APPEND = 1  # entries to append after the follower's end
    COMPARE = 2  # "do you hold this (index, term)?": a new leader looking for the match point
    TRUNCATE = 3  # cut everything after `entries[0]`, which the follower holds (it said so)
    COMMIT = 4  # only the commit index (appends are sparse)
    RESET = 5  # the leader holds nothing before `entries[0]`: TRUNCATE if the follower holds it,
    #            else the follower's log starts over there (logs that do not overlap)


PROBES = (PushType.COMPARE, PushType.TRUNCATE, PushType.RESET)  # find or set the match point


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
    index: int  # APPEND: the last index now held; COMPARE/TRUNCATE/RESET: the index asked about
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


_TERM = (0, TERM_MAX, f"0..TERM_MAX={TERM_MAX}")
_INDEX = (INDEX_NONE, INDEX_MAX, f"{INDEX_NONE}..INDEX_MAX={INDEX_MAX}")
_SEQ = (0, SEQ_MAX, f"0..SEQ_MAX={SEQ_MAX}")
# per message type: (field, low, high, limit as said in a refusal) for each bounded number
_BOUNDS = {
    VoteRequest: (("term", *_TERM), ("last_term", *_TERM), ("last_index", *_INDEX)),
    VoteResponse: (("term", *_TERM),),
    Push: (("term", *_TERM), ("commit_index", *_INDEX), ("seq", *_SEQ)),
    PushResponse: (("term", *_TERM), ("index", *_INDEX), ("begin_index", *_INDEX), ("end_index", *_INDEX),
                   ("seq", *_SEQ)),
    Heartbeat: (("term", *_TERM), ("commit_index", *_INDEX)),
    HeartbeatResponse: (("term", *_TERM),),
    TimeoutNow: (("term", *_TERM),),
}


def _entries_ok(entries) -> bool:
    """One fast pass (a push carries up to hundreds of entries, and is checked on encode,
    decode and in the core)."""
    try:
        return all(0 <= i <= INDEX_MAX and 0 <= t <= TERM_MAX and i.__class__ is int and t.__class__ is int
                   for i, t, _ in entries)
    except (TypeError, ValueError):
        return False


def _bad(value, lo: int, hi: int) -> bool:
    return not isinstance(value, int) or not lo <= value <= hi


def _all_within(cls, bounds) -> callable:
    """One expression over `cls`'s bounded fields (as namedtuple writes its methods): True
    when every one is a plain int within its bound. It runs on every message's path (encode,
    decode, the core: six times a message at a leader) and costs a fifth of the loop below."""
    test = " and ".join(f"type(m.{name}) is int and {lo} <= m.{name} <= {hi}" for name, lo, hi, _ in bounds)
    ns: dict = {}
    exec(f"def within(m):\n    return {test}\n", ns)
    ns["within"].__qualname__ = f"within_{cls.__name__}"
    return ns["within"]


_WITHIN = {cls: _all_within(cls, bounds) for cls, bounds in _BOUNDS.items()}


def out_of_bounds(msg: Message, entries: bool = True) -> tuple[str, object, str] | None:
    """(field, value, limit) for the first number of `msg` outside its bound, or None.
    `entries=False` leaves a push's entries out (the wire codec checks them in its own loop).
    The fast test passes plain ints within bounds; anything else is judged field by field
    (an int subclass such as bool passes there, as isinstance says)."""
    if not _WITHIN[msg.__class__](msg):
        for name, lo, hi, limit in _BOUNDS[msg.__class__]:
            value = getattr(msg, name)
            if not isinstance(value, int) or not lo <= value <= hi:
                return name, value, limit
    es = msg.entries if entries and msg.__class__ is Push else ()
    if es and not _entries_ok(es):
        for index, term, _ in es:  # (the slow way, only to name the culprit)
            if _bad(index, 0, INDEX_MAX):
                return "entry index", index, f"0..INDEX_MAX={INDEX_MAX}"
            if _bad(term, 0, TERM_MAX):
                return "entry term", term, f"0..TERM_MAX={TERM_MAX}"
    return None
