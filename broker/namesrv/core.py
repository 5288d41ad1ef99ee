"""The name server's route table (RocketMQ's RouteInfoManager), pure: no sockets, no clock, no
threads. The driver (broker/namesrv/server.py) feeds it registrations, connection closes and
a tick; time enters as `now_ms` arguments. docs/design/name-server.md §2 is the plan.

Tables (RouteInfoManager's in brackets):
    groups:  broker_name -> Group(cluster, nodes, leader_id, fence)  [brokerAddrTable]
      nodes: node_id -> Node(address, role, term, epoch, leader_id, last_seen_ms, conn_id, ...)
                                                                      [brokerLiveTable]
    topics:  topic -> broker_name -> QueueData                       [topicQueueTable]
    clusters are derived from the groups                              [clusterAddrTable]

Rules (each a test in tests/unit/test_namesrv_core.py):
- N0 who may register: on a secure name server a registration (or unregistration) for group G
  as node N is taken only from a certificate naming member N and group G (`refusal`; the
  driver reads both from the TLS peer certificate). A node of one group -- or one taken out of
  its group -- cannot enter another group's routes.
- N1 a registration upserts its node and stamps it `now` (registerBroker -> brokerLiveTable.put).
- N2 only the routed leader's topics make the group's queue data, and its list is complete:
  topics it no longer lists leave the group; a topic with no group left is gone
  (deleteTopicWithBrokerRegistration, which Tidelog always does).
- N3 a leader claim is routed only as far as the group's own members confirm it
  (`choose_leader`; RocketMQ's stateVersion check took the highest claim, which any member
  certificate could make up to 2^63-1). Each node reports its rank (term, epoch) and whom it
  follows (`leader_id`). A node claiming a leading role at rank r is *vouched for* by itself
  and by every non-claiming node of rank exactly r that follows it; it is the leader when more
  than half of the group's registered nodes vouch for it and r is not below the group's fence.
  The fence is the highest rank of a claimant ever vouched for by two or more nodes at once
  while the group existed here: a stale leader (a partitioned old one still connected) is not
  routed again after the nodes that moved on leave this name server. One node's word never
  raises the fence, so no single forged registration can hold a group's real leader off.
  Consequences: a claimant with a made-up rank is vouched for by itself only; a follower with a
  made-up rank vouches for nobody (it only counts in the group's size); a new leader is routed
  once its followers' registrations say they follow it (brokers re-register within STANDING_POLL_MS when their
  term, epoch or leader changes: broker/registrar.py). Recomputed after every registration and
  every node leaving. A node_id stays in the group it registered in while its entry lives.
- N4 expiry: a node not heard from for broker_expire_ms is dropped (scanNotActiveBroker), and
  every node registered on a connection that closed is dropped at once
  (BrokerHousekeepingService -> onChannelDestroy). A group whose leader is gone keeps its
  queues with leader None; the last node gone removes the group (its fence with it) and its
  queue data.
- N5 a route (pickupTopicRouteData): per group holding the topic, its queue data, leader and
  followers, sorted by broker_name; `version` changes whenever the route would read differently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from broker.protocol import namesrv as ns
from broker.protocol.codes import BadRequest

NO_RANK = (-1, -1)


class Bounds(NamedTuple):
    routes_topics_max: int = 100_000
    groups_max: int = 256
    nodes_per_group_max: int = 9


class QueueData(NamedTuple):
    write_queues: int
    read_queues: int
    perm: int


@dataclass
class Node:
    node_id: str
    address: str
    role: str  # as registered (Group.role_of says what it is in the route)
    term: int
    epoch: int
    last_seen_ms: int
    conn_id: object
    topics_version: int = 0
    leader_id: str | None = None  # whom it follows ("" none known; None: a broker that does not say)
    listed: tuple = ()  # its last topic list, when it claims to lead (applied while it is the leader)

    @property
    def rank(self) -> tuple[int, int]:
        return (self.term, self.epoch)

    @property
    def claims(self) -> bool:
        return self.role in ns.LEADING_ROLES


@dataclass
class Group:
    cluster: str
    nodes: dict[str, Node] = field(default_factory=dict)
    leader_id: str | None = None
    fence: tuple[int, int] = NO_RANK  # N3: no leader below the highest rank two nodes once vouched for
    topics: set[str] = field(default_factory=set)  # the topics its leader listed last

    def role_of(self, n: Node) -> str:
        """A leader claim that is not routed (N3) shows as a follower."""
        return n.role if n.node_id == self.leader_id or not n.claims else "follower"


class RouteShape(NamedTuple):
    leader_address: str | None
    term: int  # the leader's term (raft) or epoch (master-slave), 0 without a leader
    followers: list[str]


class Dropped(NamedTuple):
    broker_name: str
    node_id: str
    why: str


def refusal(broker_name: str, node_id: str, cert_member: str | None, cert_group: str | None) -> str | None:
    """N0: why a connection whose certificate names member `cert_member` of group `cert_group`
    may not register (or unregister) `node_id` in group `broker_name`; None when it may."""
    if cert_member != node_id:
        return (f"this connection's certificate names member {cert_member!r}, not node_id {node_id!r}: "
                "a node registers only itself")
    if cert_group != broker_name:
        if cert_group is None:
            return (f"this connection's certificate (member {cert_member!r}) names no broker group "
                    f"(tidelog-group:<broker_name>), so it may not register in group {broker_name!r}: "
                    "re-issue it naming the group (tidelog deploy or upgrade re-issues certificates "
                    "that lack it)")
        return (f"this connection's certificate names broker group {cert_group!r}, not {broker_name!r}: "
                "a node registers only in its own group")
    return None


def vouchers(nodes, x: Node) -> int:
    """N3: how many of `nodes` vouch for claimant `x`: itself, and every node that claims
    nothing, has x's rank exactly and follows x (or does not say whom it follows)."""
    r = x.rank
    return sum(1 for n in nodes
               if n is x or (not n.claims and n.rank == r and n.leader_id in (x.node_id, None)))


def choose_leader(nodes, incumbent: str | None, fence: tuple[int, int]) -> tuple[str | None, tuple[int, int]]:
    """N3: (the routed leader or None, the fence after this). The fence rises to the rank of
    any claimant two or more nodes vouch for; a leader needs more than half of `nodes` and a
    rank not below the fence. Of several such (only nodes that do not say whom they follow
    make that possible) the incumbent keeps it, else none does."""
    nodes = list(nodes)
    counted = [(x, vouchers(nodes, x)) for x in nodes if x.claims]
    fence = max([fence] + [x.rank for x, v in counted if v >= 2])
    ok = [x.node_id for x, v in counted if 2 * v > len(nodes) and x.rank >= fence]
    if len(ok) == 1:
        return ok[0], fence
    return (incumbent if incumbent in ok else None), fence


class RouteTable:
    def __init__(self, namesrv_id: str = "namesrv", broker_expire_ms: int = 120_000,
                 bounds: Bounds = Bounds()):
        self.namesrv_id = namesrv_id
        self.broker_expire_ms = broker_expire_ms
        self.bounds = bounds
        self.groups: dict[str, Group] = {}
        self.topics: dict[str, dict[str, QueueData]] = {}
        self._versions: dict[str, int] = {}  # topic -> version of its route
        self._clock = 0

    # --- registrations -------------------------------------------------------------------------

    def register(self, req: ns.RegisterBroker, conn_id, now_ms: int) -> ns.RegisterResult:
        """N1-N3. BadRequest (nothing changed) when the registration breaks a bound. The
        caller has checked N0 (the certificate names this node and group)."""
        g = self.groups.get(req.broker_name)
        self._check_bounds(req, g)
        other = next((name for name, og in self.groups.items()
                      if name != req.broker_name and req.node_id in og.nodes), None)
        if other is not None:
            raise BadRequest(f"RegisterBroker: node {req.node_id} is registered in group {other}, "
                             f"not {req.broker_name}: a node stays in its group while it is registered")
        if g is None:
            g = self.groups[req.broker_name] = Group(req.cluster)
        g.cluster = req.cluster
        before = self._signature(g)
        listed = tuple(req.topics) if req.role in ns.LEADING_ROLES else ()
        g.nodes[req.node_id] = Node(req.node_id, req.address, req.role, req.term, req.epoch, now_ms,
                                    conn_id, req.topics_version, req.leader_id, listed)
        self._recompute(req.broker_name, g, before, refresh=g.leader_id == req.node_id)
        leader = g.nodes.get(g.leader_id) if g.leader_id else None
        return ns.RegisterResult(self.namesrv_id, leader.address if leader else None)

    def _recompute(self, name: str, g: Group, before, refresh: bool = False) -> None:
        """N3 after any change to the group's nodes; N2 when the leader changed or (`refresh`)
        re-registered; N5's version when the group reads differently."""
        leader, g.fence = choose_leader(g.nodes.values(), g.leader_id, g.fence)
        if leader != g.leader_id or (refresh and leader is not None):
            g.leader_id = leader
            if leader is not None:
                self._set_topics(name, g, g.nodes[leader].listed)  # N2
        if self._signature(g) != before:
            self._touch_group(g)

    @staticmethod
    def _signature(g: Group) -> RouteShape:
        """What the group contributes to a route besides its queue data."""
        leader = g.nodes.get(g.leader_id) if g.leader_id else None
        return RouteShape(leader.address if leader else None, (leader.term or leader.epoch) if leader else 0,
                          sorted(n.address for n in g.nodes.values() if n.node_id != g.leader_id))

    def _check_bounds(self, req: ns.RegisterBroker, g: Group | None) -> None:
        b = self.bounds
        if g is None and len(self.groups) >= b.groups_max:
            raise BadRequest(f"RegisterBroker: {len(self.groups)} groups registered: groups_max={b.groups_max}")
        if g is not None and req.node_id not in g.nodes and len(g.nodes) >= b.nodes_per_group_max:
            raise BadRequest(f"RegisterBroker: group {req.broker_name} has {len(g.nodes)} nodes: "
                             f"nodes_per_group_max={b.nodes_per_group_max}")
        if req.role in ns.LEADING_ROLES and req.topics:
            names = {t.topic for t in req.topics}
            if len(names) != len(req.topics):
                raise BadRequest("RegisterBroker: topics: a topic is listed twice")
            new = len(names - self.topics.keys())
            if len(self.topics) + new > b.routes_topics_max:
                raise BadRequest(f"RegisterBroker: {len(self.topics)} topics routed and {new} new: "
                                 f"routes_topics_max={b.routes_topics_max}")

    def _set_topics(self, name: str, g: Group, topics) -> None:
        listed = {}
        for t in topics:
            listed[t.topic] = QueueData(t.write_queues, t.read_queues, t.perm)
        for topic in g.topics - listed.keys():  # N2: the leader's list is complete
            self._remove_queue_data(topic, name)
        for topic, qd in listed.items():
            per_group = self.topics.setdefault(topic, {})
            if per_group.get(name) != qd:
                per_group[name] = qd
                self._bump(topic)
        g.topics = set(listed)

    def _remove_queue_data(self, topic: str, name: str) -> None:
        per_group = self.topics.get(topic)
        if per_group is None or per_group.pop(name, None) is None:
            return
        if per_group:
            self._bump(topic)
        else:
            del self.topics[topic]
            self._versions.pop(topic, None)

    def _bump(self, topic: str) -> None:
        self._clock += 1
        self._versions[topic] = self._clock

    def _touch_group(self, g: Group) -> None:
        for topic in g.topics:
            if topic in self.topics:
                self._bump(topic)

    # --- leaving ---------------------------------------------------------------------------------

    def unregister(self, broker_name: str, node_id: str) -> bool:
        """A clean stop (unRegisterBroker); False if the node was not registered."""
        g = self.groups.get(broker_name)
        if g is None or node_id not in g.nodes:
            return False
        self._drop(broker_name, node_id)
        return True

    def connection_closed(self, conn_id) -> list[Dropped]:
        """N4: every node registered on that connection goes at once (onChannelDestroy)."""
        gone = [Dropped(name, n.node_id, "connection closed")
                for name, g in self.groups.items() for n in g.nodes.values() if n.conn_id == conn_id]
        for d in gone:
            self._drop(d.broker_name, d.node_id)
        return gone

    def expire(self, now_ms: int) -> list[Dropped]:
        """N4: nodes not heard from for broker_expire_ms (scanNotActiveBroker)."""
        gone = [Dropped(name, n.node_id, f"not heard from for {now_ms - n.last_seen_ms} ms "
                                         f"(broker_expire_ms={self.broker_expire_ms})")
                for name, g in self.groups.items() for n in g.nodes.values()
                if n.last_seen_ms + self.broker_expire_ms < now_ms]
        for d in gone:
            self._drop(d.broker_name, d.node_id)
        return gone

    def _drop(self, name: str, node_id: str) -> None:
        g = self.groups[name]
        before = self._signature(g)
        del g.nodes[node_id]
        if g.nodes:
            # a leader gone leaves its queues, not writable, until another is vouched for; a
            # follower gone may leave the leader short of vouchers, or let a tie resolve
            self._recompute(name, g, before)
            return
        del self.groups[name]  # the last node: the group, its fence and its queue data go
        for topic in list(g.topics):
            self._remove_queue_data(topic, name)

    # --- reading -----------------------------------------------------------------------------------

    def route(self, topic: str) -> ns.TopicRoute | None:
        """N5 (pickupTopicRouteData); None for a topic no group holds."""
        per_group = self.topics.get(topic)
        if not per_group:
            return None
        groups = []
        for name in sorted(per_group):
            qd, g = per_group[name], self.groups[name]
            shape = self._signature(g)
            groups.append(ns.GroupRoute(name, qd.write_queues, qd.read_queues, qd.perm,
                                        shape.leader_address, shape.term, shape.followers))
        return ns.TopicRoute(topic, self._versions[topic], True, groups)

    def leader_of(self, broker_name: str) -> str | None:
        g = self.groups.get(broker_name)
        return g.nodes[g.leader_id].address if g is not None and g.leader_id in g.nodes else None

    def cluster_info(self, now_ms: int) -> ns.ClusterInfo:
        clusters: dict[str, list[str]] = {}
        groups = []
        for name in sorted(self.groups):
            g = self.groups[name]
            clusters.setdefault(g.cluster, []).append(name)
            leader = g.nodes.get(g.leader_id) if g.leader_id else None
            nodes = [ns.NodeInfo(n.node_id, n.address, g.role_of(n), n.term, n.epoch,
                                 max(0, now_ms - n.last_seen_ms), n.topics_version)
                     for _, n in sorted(g.nodes.items())]
            groups.append(ns.GroupInfo(name, g.cluster, leader.address if leader else None,
                                       g.leader_id if leader else None, leader.term if leader else 0,
                                       leader.epoch if leader else 0, len(g.topics), nodes))
        return ns.ClusterInfo(self.namesrv_id, clusters, groups)
