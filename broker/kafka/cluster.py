"""What a Kafka client sees of the cluster (broker/kafka/service.py's Metadata, and the partition
numbers every request carries).

One group (no name servers): partition p is queue p, the brokers are the group's members, a
node's id its index in `peers`.

Several groups behind name servers: a topic's partitions are numbered across the groups the name
servers route for it, in broker_name order, each group's queues in order (p = the queues of the
groups before it + q), so one Kafka producer's partitions span every group and a request for
partition p goes to the leader of the group that holds it, which reads and stores queue q. A
broker learns the numbering from the name servers' route of the topic (GET_TOPIC_ROUTE, as its
member; cached ROUTE_TTL_S). A request for a partition this broker's group does not hold, or
for a topic whose route it has not fetched yet, is answered NOT_LEADER_OR_FOLLOWER (the client
refreshes its metadata and retries; the fetch is then under way). Node ids are a CRC of a node's
address (stable as groups come and go); a node's Kafka address is its client address's port + 2
(the name servers know client addresses; every node's kafka_listener is `auto` there). Consumer
groups are coordinated by the first group in broker_name order, whose leader keeps every Kafka
group's offsets (its own partitions' under their queue numbers, as its native consumers' are).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from typing import NamedTuple

from broker.config import KAFKA_PORT_OFFSET, parse_hostport

log = logging.getLogger(__name__)

ROUTE_TTL_S = 2.0
ROUTE_FETCH_TIMEOUT_S = 3.0
ROUTES_MAX = 10_000  # topics whose routes are cached (the oldest fetched go first)
FETCHES_MAX = 64  # route lookups under way at once (more: answered from what is known)


class Part(NamedTuple):
    """A group's share of a topic's partitions."""
    broker_name: str
    base: int  # its first partition
    queues: int
    leader: str | None  # the leader's client address
    members: tuple  # every member's client address (the leader first)


def node_id_of(address: str) -> int:
    return zlib.crc32(address.encode()) & 0x7FFFFFFF


def kafka_address_of(address: str) -> tuple[str, int]:
    host, port = parse_hostport(address)
    return host, port + KAFKA_PORT_OFFSET


class ClusterView:
    def __init__(self, broker):
        cfg = broker.config
        self.broker = broker
        self.me = cfg.broker_name
        self.multi = bool(cfg.namesrv_addresses)
        self._names = None
        self._routes: dict[str, tuple[float, list[Part] | None]] = {}
        self._fetching: dict[str, asyncio.Task] = {}
        if self.multi:
            from broker.client.namesrv_client import NameServers
            self._names = NameServers(list(cfg.namesrv_addresses), credentials=cfg.member_credentials(),
                                      request_timeout_ms=int(ROUTE_FETCH_TIMEOUT_S * 1000))

    async def close(self) -> None:
        for t in self._fetching.values():
            t.cancel()
        if self._names is not None:
            await self._names.aclose()

    # --- routes --------------------------------------------------------------------------------

    async def parts(self, topic: str) -> list[Part] | None:
        """The topic's groups as the name servers route it now (None: no group holds it)."""
        got = self._routes.get(topic)
        if got is not None and time.monotonic() - got[0] < ROUTE_TTL_S:
            return got[1]
        task = self._fetching.get(topic)
        if task is None:
            if len(self._fetching) >= FETCHES_MAX:
                return got[1] if got is not None else None
            task = self._fetching[topic] = asyncio.ensure_future(self._fetch(topic))
        try:
            return await asyncio.shield(task)
        except Exception as e:  # the name servers do not answer: the last route known, if any
            log.warning("kafka: no route for %s from the name servers: %s", topic, e)
            return got[1] if got is not None else None

    async def _fetch(self, topic: str) -> list[Part] | None:
        try:
            async with asyncio.timeout(ROUTE_FETCH_TIMEOUT_S):  # (never wait_for: tests/unit/test_task_stops.py)
                route = await self._names.topic_route(topic)
        finally:
            self._fetching.pop(topic, None)
        parts, base = None, 0
        if route is not None and route.exists:
            parts = []
            for g in sorted(route.groups, key=lambda g: g.broker_name):
                members = tuple(([g.leader] if g.leader else []) + [f for f in g.followers if f != g.leader])
                parts.append(Part(g.broker_name, base, g.write_queues, g.leader, members))
                base += g.write_queues
        self._routes.pop(topic, None)
        self._routes[topic] = (time.monotonic(), parts)
        while len(self._routes) > ROUTES_MAX:
            del self._routes[next(iter(self._routes))]
        return parts

    def _cached(self, topic: str) -> list[Part] | None:
        """The route known now, a refresh started when it is stale (the data path never waits)."""
        got = self._routes.get(topic)
        if got is None or time.monotonic() - got[0] >= ROUTE_TTL_S:
            if topic not in self._fetching and len(self._fetching) < FETCHES_MAX:
                self._fetching[topic] = asyncio.ensure_future(self._fetch(topic))
                self._fetching[topic].add_done_callback(lambda t: t.cancelled() or t.exception())
        return None if got is None else got[1]

    # --- partitions ----------------------------------------------------------------------------

    def local_queue(self, topic: str, p: int) -> int | None:
        """The queue of this group that partition p is; None if another group holds it (or the
        numbering is not known here yet)."""
        if not self.multi:
            return p
        for part in self._cached(topic) or ():
            if part.broker_name == self.me:
                return p - part.base if part.base <= p < part.base + part.queues else None
        return None

    # --- Metadata across groups ------------------------------------------------------------------

    async def metadata(self, conn, names: list[str], may_create, denied) -> tuple[list, list]:
        """(brokers, topics) of a Metadata answer from the name servers' routes: `may_create(name)`
        auto-creates a topic here (True if it did), `denied(name)` is the ACL's error (or 0)."""
        from broker.kafka import errors as E

        nodes: dict[str, int] = {}
        for p in self.broker.config.peers:  # this group's members, even before any route names them
            nodes[p.address] = node_id_of(p.address)
        topics = []
        for name in names:
            err = denied(name)
            if err:
                topics.append({"error_code": err, "name": name, "partitions": []})
                continue
            parts = await self.parts(name)
            if parts is None:
                if may_create(name):  # routed once this group re-registers: the client retries
                    self._routes.pop(name, None)
                    topics.append({"error_code": E.LEADER_NOT_AVAILABLE, "name": name, "partitions": []})
                else:
                    topics.append({"error_code": E.UNKNOWN_TOPIC_OR_PARTITION, "name": name, "partitions": []})
                continue
            out = []
            for part in parts:
                ids = [node_id_of(a) for a in part.members]
                for a in part.members:
                    nodes[a] = node_id_of(a)
                leader = node_id_of(part.leader) if part.leader else -1
                out += [{"error_code": E.NONE if part.leader else E.LEADER_NOT_AVAILABLE,
                         "partition_index": part.base + q, "leader_id": leader, "replica_nodes": ids,
                         "isr_nodes": ids, "offline_replicas": []} for q in range(part.queues)]
            topics.append({"error_code": E.NONE, "name": name, "partitions": out})
        brokers = [{"node_id": i, "host": kafka_address_of(a)[0], "port": kafka_address_of(a)[1], "rack": None}
                   for a, i in sorted(nodes.items(), key=lambda x: x[1])]
        return brokers, topics

    # --- the coordinator of consumer groups ------------------------------------------------------

    async def coordinator(self) -> tuple[str, str | None] | None:
        """(broker_name, leader address) of the group that coordinates consumer groups: the
        first in broker_name order (cached ROUTE_TTL_S); None if the name servers know none."""
        got = self._routes.get("")  # (the cluster's groups, under the empty topic name)
        if got is not None and time.monotonic() - got[0] < ROUTE_TTL_S:
            return got[1]
        try:
            async with asyncio.timeout(ROUTE_FETCH_TIMEOUT_S):
                info = await self._names.cluster_info()
        except Exception as e:  # noqa: BLE001 - no name server answers: what was known, if anything
            log.warning("kafka: no cluster info from the name servers: %s", e)
            return got[1] if got is not None else None
        groups = sorted(info.groups, key=lambda g: g.broker_name)
        found = (groups[0].broker_name, groups[0].leader) if groups else None
        self._routes[""] = (time.monotonic(), found)
        return found

    def coordinates(self) -> bool:
        """Whether this node's group coordinates consumer groups (one group: it does)."""
        if not self.multi:
            return True
        got = self._routes.get("")
        if got is None or time.monotonic() - got[0] >= ROUTE_TTL_S:
            asyncio.ensure_future(self.coordinator()).add_done_callback(lambda t: t.cancelled() or t.exception())
        return got is not None and got[1] is not None and got[1][0] == self.me
