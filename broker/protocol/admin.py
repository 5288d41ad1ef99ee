"""Heartbeats and status (JSON bodies, see jsonbody.py).

HEARTBEAT  Heartbeat -> GroupMembers   a consumer says it is alive in its group and gets
                                       the group's live members (for queue allocation)
STATUS     {}        -> Status         role, offsets, flush position, uptime, version;
                                       raft mode: term, leader, indexes, followers' lag
TRANSFER_LEADER TransferLeader -> {}   raft mode, on the leader: hand leadership over
FAULT      Faults    -> Faults          drills: set the node's transport fault switch
                                       (only with fault_injection: true)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Heartbeat:
    client_id: str
    group: str = ""  # empty for producers
    topics: list[str] = field(default_factory=list)
    leaving: bool = False  # a consumer closing: reallocate its queues now


@dataclass(frozen=True)
class GroupMembers:
    group: str
    members: list[str]


@dataclass(frozen=True)
class Status:
    broker_name: str
    version: str
    protocol_version: int
    mode: str
    role: str
    listen: str
    uptime_s: float
    flush: str
    store: dict
    topics: int
    connections: int
    replication: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TransferLeader:
    target: str


@dataclass(frozen=True)
class Faults:
    drop_peers: list[str] = field(default_factory=list)  # group members to stop talking to
    isolate: bool = False  # also drop every client request (except FAULT)
