"""Shared pieces of the Raft core: configuration, hard state, the log view, the Ready record."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Protocol

from replication.raft.messages import Entry, Message


@dataclass(frozen=True)
class RaftConfig:
    node_id: str
    voters: tuple[str, ...]  # every member, this node included
    election_ticks: int = 30  # a follower campaigns after 30..59 ticks without a leader
    heartbeat_ticks: int = 10
    push_timeout_ticks: int = 100  # resend appends / give up on a gap after this long
    max_pending_entries: int = 1000  # appends in flight per follower (DLedger maxPendingSize)
    push_batch_bytes_max: int = 1 << 20
    push_batch_entries_max: int = 512
    follower_buffer_entries_max: int = 20_000  # out-of-order appends a follower holds
    ticks_per_second: int = 100
    peer_push_quota_bytes_per_s: int = 20 << 20  # DLedger peerPushQuota
    peer_push_throttle_point_bytes: int = 300 << 20  # quota applies above this lag
    leadership_transfer_lag_entries_max: int = 10_000
    transfer_timeout_ticks: int = 300
    preferred_leader: str | None = None
    pre_vote: bool = True
    check_quorum: bool = True

    def __post_init__(self):
        if self.node_id not in self.voters:
            raise ValueError(f"node {self.node_id} is not among the voters {self.voters}")
        if self.preferred_leader is not None and self.preferred_leader not in self.voters:
            raise ValueError(f"preferred leader {self.preferred_leader} is not a voter")


@dataclass(frozen=True)
class HardState:
    """What must be on disk before this node answers anyone: its term and its vote."""

    term: int = 0
    voted_for: str | None = None


class Role(Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


class LogView(Protocol):
    """The core's read-only view of its log (the driver applies Ready's changes to it)."""

    def begin_index(self) -> int: ...  # first index held (last_index + 1 when empty)

    def last_index(self) -> int: ...  # -1 when the log never held anything

    def term_at(self, index: int) -> int | None: ...

    def entries(self, lo: int, max_entries: int, max_bytes: int) -> list[Entry]: ...

    def bytes_after(self, index: int) -> int: ...  # bytes of the entries after `index`


@dataclass(slots=True)
class Ready:
    """What the driver must do, in this order: persist `hard_state`; apply `truncate_from`
    or `reset_to`, then `append` (and make them durable per the flush policy); only then
    send `messages`; then act on `commit_index`. `append_noop` asks a new leader's driver to
    append one empty entry of the current term (so earlier terms' entries can commit)."""

    hard_state: HardState | None = None
    truncate_from: int | None = None  # delete entries >= this index
    reset_to: int | None = None  # delete everything; the log restarts at this index
    append: list[Entry] = field(default_factory=list)
    messages: list[tuple[str, Message]] = field(default_factory=list)
    commit_index: int | None = None  # the commit index advanced to this
    append_noop: bool = False
    role_changed: bool = False

    def empty(self) -> bool:
        return (self.hard_state is None and self.truncate_from is None and self.reset_to is None
                and not self.append and not self.messages and self.commit_index is None
                and not self.append_noop and not self.role_changed)
