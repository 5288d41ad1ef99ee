"""The name server's route table (RocketMQ's RouteInfoManager), pure: no sockets, no clock, no
threads. The driver (broker/namesrv/server.py) feeds it registrations, connection closes and
a tick; time enters as `now_ms` arguments. docs/design/name-server.md §2 is the plan.

Tables (RouteInfoManager's in brackets):
    groups:  broker_name -> Group(cluster, nodes, leader_id, rank)   [brokerAddrTable]
      nodes: node_id -> Node(address, role, term, epoch, last_seen_ms, conn_id, ...)  [brokerLiveTable]
    topics:  topic -> broker_name -> QueueData                       [topicQueueTable]
    clusters are derived from the groups                              [clusterAddrTable]

Rules (each a test in tests/unit/test_namesrv_core.py):
- N1 a registration upserts its node and stamps it `now` (registerBroker -> brokerLiveTable.put).
- N2 only a leading node's (raft leader, master, standalone) topics make the group's queue
  data, and its list is complete: topics it no longer lists leave the group; a topic with no
  group left is gone (deleteTopicWithBrokerRegistration, which Tidelog always does).
- N3 fencing: a leader claim with a lower (term, epoch) than the group's highest seen -- or an
  equal one from another node -- is recorded as a follower and its topics ignored
  (registerBroker's stateVersion check); a higher one demotes the previous leader at once.
  When the leader leaves, the fence falls to the highest (term, epoch) of the nodes still there.
  A node_id stays in the group it registered in while its entry lives (another group: BadRequest).
- N4 expiry: a node not heard from for broker_expire_ms is dropped (scanNotActiveBroker), and
  every node registered on a connection that closed is dropped at once
  (BrokerHousekeepingService -> onChannelDestroy). A group whose leader is gone keeps its
  queues with leader None; the last node gone removes the group and its queue data.
- N5 a route (pickupTopicRouteData): per group holding the topic, its queue data, leader and
  followers, sorted by broker_name; `version` changes whenever the route would read differently.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from broker.protocol import namesrv as ns
from broker.protocol.codes import BadRequest


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
    role: str  # as registered (a fenced leader claim is kept as "follower")
    term: int
    epoch: int
    last_seen_ms: int
    conn_id: object
    topics_version: int = 0


@dataclass
class Group:
    cluster: str
    nodes: dict[str, Node] = field(default_factory=dict)
    leader_id: str | None = None
    rank: tuple[int, int] = (-1, -1)  # the highest (term, epoch) a leader claim had: fences lower ones
    topics: set[str] = field(default_factory=set)  # the topics its leader listed last


class Dropped(NamedTuple):
    broker_name: str
    node_id: str
    why: str


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
        """N1-N3. BadRequest (nothing changed) when the registration breaks a bound."""
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
        rank = (req.term, req.epoch)
        role = req.role
        claims = role in ns.LEADING_ROLES
        if claims and (rank < g.rank or (rank == g.rank and g.leader_id not in (None, req.node_id))):
            role = "follower"  # N3: a stale leader (a partitioned old one): not routable
            claims = False
        old = g.nodes.get(req.node_id)
        node = Node(req.node_id, req.address, role, req.term, req.epoch, now_ms, conn_id, req.topics_version)
        g.nodes[req.node_id] = node
        changed = old is None or (old.address, old.role) != (node.address, node.role)
        if claims:
            if g.leader_id != req.node_id:
                if g.leader_id in g.nodes:  # N3: "switch slave to master": the old one steps down
                    g.nodes[g.leader_id].role = "follower"
                g.leader_id = req.node_id
                changed = True
            g.rank = rank
            self._set_topics(req.broker_name, g, req.topics)  # N2
        elif g.leader_id == req.node_id:
            g.leader_id = None  # it says it no longer leads
            changed = True
        if changed:
            self._touch_group(g)
        leader = g.nodes.get(g.leader_id) if g.leader_id else None
        return ns.RegisterResult(self.namesrv_id, leader.address if leader else None)

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

    def _set_topics(self, name: str, g: Group, topics: list[ns.TopicQueues]) -> None:
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
        del g.nodes[node_id]
        if g.leader_id == node_id:
            g.leader_id = None  # its queues stay, not writable, until a new leader registers
            # the fence is what the nodes still here claim: a leader that left (or a forged one)
            # does not fence the group's real leader forever
            g.rank = max(((n.term, n.epoch) for n in g.nodes.values()), default=(-1, -1))
        if g.nodes:
            self._touch_group(g)
            return
        del self.groups[name]  # the last node: the group and its queue data go
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
            leader = g.nodes.get(g.leader_id) if g.leader_id else None
            followers = sorted(n.address for n in g.nodes.values() if n.node_id != g.leader_id)
            groups.append(ns.GroupRoute(name, qd.write_queues, qd.read_queues, qd.perm,
                                        leader.address if leader else None,
                                        (leader.term or leader.epoch) if leader else 0, followers))
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
            nodes = [ns.NodeInfo(n.node_id, n.address, n.role, n.term, n.epoch,
                                 max(0, now_ms - n.last_seen_ms), n.topics_version)
                     for _, n in sorted(g.nodes.items())]
            groups.append(ns.GroupInfo(name, g.cluster, leader.address if leader else None,
                                       g.leader_id if leader else None, leader.term if leader else 0,
                                       leader.epoch if leader else 0, len(g.topics), nodes))
        return ns.ClusterInfo(self.namesrv_id, clusters, groups)
