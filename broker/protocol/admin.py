"""Heartbeats and status (JSON bodies, see jsonbody.py).

HEARTBEAT  Heartbeat -> GroupMembers   a consumer says it is alive in its group and gets
                                       the group's live members (for queue allocation)
STATUS     {}        -> Status         role, offsets, flush position, uptime, version;
                                       raft mode: term, leader, indexes, followers' lag
TRANSFER_LEADER TransferLeader -> {}   raft mode, on the leader: hand leadership over
FAULT      Faults    -> Faults          drills: set the node's transport fault switch
                                       (only with fault_injection: true)
LIST_GROUPS    {}            -> GroupList  every group with committed offsets or live members
DESCRIBE_GROUP DescribeGroup -> GroupInfo  per topic and queue: the broker's max offset, the
                                           group's committed offset (-1: none) and the lag;
                                           the live members (SUBSCRIPTION_GROUP_NOT_EXIST)
Both are answered by the node that keeps the group's members and offsets (raft: the leader,
NOT_LEADER elsewhere; master-slave: the master, or a slave while it is down).
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


@dataclass(frozen=True)
class GroupSummary:
    group: str
    topics: list[str]
    members: int
    lag: int  # summed over the queues the group has committed


@dataclass(frozen=True)
class GroupList:
    groups: list[GroupSummary]


@dataclass(frozen=True)
class DescribeGroup:
    group: str
    topic: str | None = None  # only this topic


@dataclass(frozen=True)
class GroupQueue:
    queue_id: int
    broker_offset: int  # the queue's max offset: where the next message will go
    committed_offset: int  # the next offset the group will read; -1: never committed
    lag: int | None  # broker_offset - committed_offset; None when never committed


@dataclass(frozen=True)
class GroupTopic:
    topic: str
    read_queues: int  # what consumers share out (0: the topic does not exist)
    queues: list[GroupQueue]


@dataclass(frozen=True)
class GroupMember:
    client_id: str
    address: str  # the address its heartbeats came from ("" when not known)
    last_heartbeat_ms_ago: int
    topics: list[str]


@dataclass(frozen=True)
class GroupInfo:
    group: str
    topics: list[GroupTopic]
    members: list[GroupMember]  # in allocation order (sorted by client id)
