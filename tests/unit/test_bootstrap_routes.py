"""multigroup.BootstrapRoutes: a topic's route from the broker groups themselves (no name
server), as `tidelog produce|consume -b <several groups>` use it. Each group is a stub Admin
that answers STATUS and GET_ROUTE as a broker's node does (or fails as a group that is down)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from broker.client import multigroup
from broker.client.connection import parse_bootstrap
from broker.client.errors import BrokerError, ConnectError
from broker.namesrv import TEMPLATE_TOPIC
from broker.protocol import topics as tp
from broker.protocol.codes import Code


class _Conn:
    def __init__(self, address):
        self.address = address


class _Session:
    def __init__(self, node):
        self.conn = _Conn(node.answering)


class Node:
    """One group as its answering member sees it: STATUS, and the topics it holds."""

    def __init__(self, broker_name, addresses, role="leader", replication=None, topics=(), auto_create=True,
                 down=False):
        self.broker_name, self.role, self.topics, self.auto_create = broker_name, role, dict(topics), auto_create
        self.addresses = parse_bootstrap(addresses)
        self.answering = addresses[0]
        self.replication = replication or {}
        self.down = down
        self.closed = False

    def _session(self):
        return _Session(self)

    async def status_async(self):
        if self.down:
            raise ConnectError(f"cannot connect to {self.answering}: refused", refused=True)
        return {"broker_name": self.broker_name, "role": self.role, "replication": self.replication}

    async def route_async(self, topic):
        return self.route(topic)

    def route(self, topic):
        if topic in self.topics:
            return tp.Route(topic, self.topics[topic], self.topics[topic], 6, True)
        if self.auto_create:
            return tp.Route(topic, 4, 4, 6, False)  # the broker's template: created on first send
        raise BrokerError(Code.TOPIC_NOT_EXIST, f"topic {topic} does not exist")

    async def aclose(self):
        self.closed = True


def routes_over(*nodes) -> multigroup.BootstrapRoutes:
    r = multigroup.BootstrapRoutes({})
    r.groups = {f"key{i}": n for i, n in enumerate(nodes)}  # keys: what bootstrap_groups found
    return r


def run(coro):
    return asyncio.run(coro)


G0 = ["10.0.0.1:10911", "10.0.0.2:10911", "10.0.0.3:10911"]
G1 = ["10.0.1.1:10911", "10.0.1.2:10911", "10.0.1.3:10911"]


def test_a_topic_routes_to_every_group_that_holds_it_with_its_leader():
    g0 = Node("g0", G0, topics={"orders": 2}, replication={"term": 7})
    g1 = Node("g1", [G1[1], G1[0], G1[2]], role="follower",
              replication={"leader_address": G1[0], "term": 3}, topics={"orders": 3})
    route = run(routes_over(g1, g0).topic_route("orders"))
    assert route.exists and [g.broker_name for g in route.groups] == ["g0", "g1"]
    r0, r1 = route.groups
    assert (r0.write_queues, r0.leader, r0.term, r0.followers) == (2, G0[0], 7, G0[1:])
    assert (r1.write_queues, r1.leader, r1.term, r1.followers) == (3, G1[0], 3, G1[1:])
    again = run(routes_over(g1, g0).topic_route("orders"))
    assert again.version == route.version  # the same route reads the same
    g1.topics["orders"] = 4
    assert run(routes_over(g1, g0).topic_route("orders")).version != route.version


def test_held_nowhere_is_none_even_with_a_group_down_and_the_template_is_the_creating_groups(caplog):
    """A group that is down must not turn "held by none of those that answered" into an error:
    the producer goes on to the auto-creation template, as through name servers."""
    g0 = Node("g0", G0, topics={"other": 1})
    g1 = Node("g1", G1, down=True)
    g2 = Node("g2", ["10.0.2.1:10911"], role="standalone", auto_create=False)
    routes = routes_over(g0, g1, g2)
    with caplog.at_level(logging.WARNING, logger="broker.client.multigroup"):
        assert run(routes.topic_route("fresh")) is None
        template = run(routes.topic_route(TEMPLATE_TOPIC))
        run(routes.topic_route("other"))  # the same groups missing: said once
    assert not template.exists and [g.broker_name for g in template.groups] == ["g0"]
    assert template.groups[0].write_queues == 4
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "key1" in warned[0] and "refused" in warned[0], warned
    assert run(routes.topic_route("other")).groups[0].broker_name == "g0"


def test_nobody_answering_raises_what_failed():
    routes = routes_over(Node("g0", G0, down=True), Node("g1", G1, down=True))
    with pytest.raises(ConnectError, match="refused"):
        run(routes.topic_route("orders"))


def test_one_group_reached_twice_is_one_route():
    a = Node("g0", G0, topics={"t": 2})
    b = Node("g0", [G0[1]], role="follower", replication={"leader_address": G0[0]}, topics={"t": 2})
    route = run(routes_over(a, b).topic_route("t"))
    assert [g.broker_name for g in route.groups] == ["g0"]


@pytest.mark.parametrize("role, replication, leader", [
    ("master", {"epoch": 4}, G0[0]),
    ("master", {"fenced": True}, None),  # a master cut off from its slaves takes no writes
    ("master", {"waiting_to_lead": True}, None),
    ("slave", {"master_address": G0[1], "connected": True, "epoch": 4}, G0[1]),
    ("slave", {"master_address": G0[1], "connected": False}, None),  # its master is gone
    ("follower", {"leader_address": None}, None),  # an election in progress
    ("candidate", {}, None),
])
def test_the_leader_is_who_a_name_server_would_route_to(role, replication, leader):
    route = run(routes_over(Node("g0", G0, role=role, replication=replication, topics={"t": 1})).topic_route("t"))
    (g,) = route.groups
    assert g.leader == leader and leader not in g.followers
    assert sorted(g.followers + ([leader] if leader else [])) == sorted(G0)


def test_close_closes_every_groups_admin():
    nodes = [Node("g0", G0), Node("g1", G1)]
    run(routes_over(*nodes).aclose())
    assert all(n.closed for n in nodes)


def test_answering_splits_groups_from_addresses_nobody_answered_for():
    found = {"g0": G0, "solo": ["10.0.9.9:10911"], "10.0.7.7:10911": ["10.0.7.7:10911"]}
    groups, silent = multigroup.answering(found)
    assert groups == {"g0": G0, "solo": ["10.0.9.9:10911"]}  # a standalone group of one is a group
    assert silent == ["10.0.7.7:10911"]
