"""Name-server bodies (JSON, broker/protocol/jsonbody.py; docs/design/name-server.md §3).

REGISTER_BROKER   RegisterBroker  -> RegisterResult   broker node -> name server, at start, every
                                                       register_interval_ms, on (re)connect, role
                                                       and topic changes (RocketMQ's
                                                       REGISTER_BROKER = 103)
UNREGISTER_BROKER NodeRef         -> {}               on a clean stop
GET_TOPIC_ROUTE   TopicName       -> TopicRoute       TOPIC_NOT_EXIST (SYSTEM_BUSY in the grace
                                                       after a start: brokers are still registering)
GET_CLUSTER_INFO  {}              -> ClusterInfo      every group, node, role, term, age

A registration carries the node's whole topic list when it leads (role leader, master or
standalone) and none otherwise: the name server replaces the group's queue data with it
(rule N2 of broker/namesrv/core.py), so a topic deleted on the leader leaves the route. It also
says whom the node follows (`leader_id`): a leader claim is routed only as far as the group's
registered nodes vouch for it (rule N3). Unknown fields are ignored on decoding, so a name
server from before `leader_id` takes these bodies, and one after takes bodies without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from broker.protocol.topics import PERM_RW

NAME_RE = r"^[A-Za-z0-9_.-]{1,64}$"  # broker_name, node_id, cluster: as broker/config.py
Name = Annotated[str, Field(pattern=NAME_RE)]
Address = Annotated[str, Field(min_length=3, max_length=261)]  # host:port as clients dial it
Queues = Annotated[int, Field(ge=1, le=65535)]
Count = Annotated[int, Field(ge=0, le=(1 << 63) - 1)]
LeaderRef = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{0,64}$")]  # a node id, or "": none known

LEADING_ROLES = frozenset({"leader", "master", "standalone"})  # whose topics make the route
Role = Literal["leader", "follower", "master", "slave", "standalone"]


@dataclass(frozen=True)
class TopicQueues:
    topic: Annotated[str, Field(min_length=1, max_length=127)]
    write_queues: Queues
    read_queues: Queues
    perm: Annotated[int, Field(ge=0, le=PERM_RW)] = PERM_RW


@dataclass(frozen=True)
class RegisterBroker:
    cluster: Name
    broker_name: Name  # the group (RocketMQ's brokerName)
    node_id: Name  # must be the member id of the sender's certificate on a secure name server
    address: Address  # where clients reach this node
    mode: Literal["standalone", "raft", "master-slave"]
    role: Role
    term: Count = 0  # raft: the node's current term
    epoch: Count = 0  # master-slave: the HA epoch
    topics_version: Count = 0  # bumped by the node on every topic change
    topics: list[TopicQueues] = field(default_factory=list)  # empty unless role is leading
    # whom this node follows at its term/epoch: its leader's (master's) node id, its own when it
    # leads, "" when it knows none (a raft follower that has just voted, a slave without a
    # master). A leader claim is routed only when most registered nodes of the group vouch for
    # it (broker/namesrv/core.py, N3). None: not said -- a broker from before this field
    # (issue 39), taken as vouching for any leader claim of its own term/epoch, as they were.
    leader_id: LeaderRef | None = None


@dataclass(frozen=True)
class RegisterResult:
    namesrv_id: str
    leader_address: str | None  # the group's leader as this name server knows it now


@dataclass(frozen=True)
class NodeRef:
    broker_name: Name
    node_id: Name


@dataclass(frozen=True)
class GroupRoute:
    broker_name: str
    write_queues: int
    read_queues: int
    perm: int
    leader: str | None  # None: the group has no leader registered (not writable for now)
    term: int  # the leader's term (raft) or epoch (master-slave)
    followers: list[str] = field(default_factory=list)  # addresses, sorted


@dataclass(frozen=True)
class TopicRoute:
    topic: str
    version: int  # changes whenever this route would read differently
    exists: bool = True  # False only for a template route (the auto-creation template)
    groups: list[GroupRoute] = field(default_factory=list)  # sorted by broker_name


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    role: str
    term: int
    epoch: int
    age_ms: int  # since its last registration
    topics_version: int = 0


@dataclass(frozen=True)
class GroupInfo:
    broker_name: str
    cluster: str
    leader: str | None  # the leader's address
    leader_id: str | None
    term: int
    epoch: int
    topics: int
    nodes: list[NodeInfo] = field(default_factory=list)  # sorted by node_id


@dataclass(frozen=True)
class ClusterInfo:
    namesrv_id: str
    clusters: dict[str, list[str]] = field(default_factory=dict)  # cluster -> broker names
    groups: list[GroupInfo] = field(default_factory=list)  # sorted by broker_name
