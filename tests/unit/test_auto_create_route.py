"""Topic auto-creation through the name servers' template (issue 16; RocketMQ's TBW102):
brokers that create topics on first send register the template topic (broker/registrar.py),
the name server routes it like any topic (broker/namesrv/core.py: nothing special), a producer
that finds no route for a topic borrows the template's with min(its default_topic_queues, the
template's) queues per group (broker/client/routes.py apply_template, after
MQClientInstance.updateTopicRouteInfoFromNameServer(topic, isDefault=true, producer)), and
switches to the topic's own route once a fetch finds it. The real processes:
tests/integration/test_namesrv_auto_create.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace as NS

import pytest

from broker.client import cluster, namesrv_client
from broker.client.errors import SendError
from broker.client.outcomes import SendResult
from broker.client.routes import TEMPLATE_ROUTE_REFRESH_MS, RouteTable
from broker.config import BrokerConfig
from broker.namesrv import TEMPLATE_TOPIC
from broker.namesrv.core import RouteTable as NamesrvTable
from broker.protocol import namesrv as ns
from broker.protocol.codes import Code
from broker.registrar import registration
from broker.topics import TopicConfig, TopicError, TopicManager


def group(name, queues=4, leader=True, perm=6):
    return ns.GroupRoute(name, queues, queues, perm, f"{name}-leader:1" if leader else None, 1, [])


def template(*groups):
    return ns.TopicRoute(TEMPLATE_TOPIC, 7, True, list(groups))


# --- the client's route table ----------------------------------------------------------------

def test_a_borrowed_route_is_the_templates_groups_with_min_queues_and_says_it_does_not_exist():
    rt = RouteTable()
    assert rt.apply_template("fresh", template(group("g0", 8), group("g1", 2)), 4, 0)
    r = rt.route("fresh")
    assert (r.topic, r.exists) == ("fresh", False) and rt.borrowed("fresh")
    # min(defaultTopicQueueNums, the template's readQueueNums), per group
    assert [(g.broker_name, g.write_queues, g.read_queues) for g in r.groups] == [("g0", 4, 4), ("g1", 2, 2)]
    assert sorted(rt.publish_queues("fresh")) == [("g0", q) for q in range(4)] + [("g1", 0), ("g1", 1)]
    # a producer asking for fewer queues than the template gets its own count
    small = RouteTable()
    small.apply_template("fresh", template(group("g0", 8)), 2, 0)
    assert small.publish_queues("fresh") == [("g0", 0), ("g0", 1)]


def test_the_topics_own_route_replaces_the_borrowed_one_and_not_the_other_way():
    rt = RouteTable(refresh_interval_ms=30_000)
    rt.apply_template("fresh", template(group("g0", 4), group("g1", 4)), 4, 0)
    own = ns.TopicRoute("fresh", 3, True, [group("g0", 8)])
    assert rt.apply("fresh", own, 10)
    assert not rt.borrowed("fresh") and rt.route("fresh") == own
    assert rt.publish_queues("fresh") == [("g0", q) for q in range(8)]
    assert not rt.apply_template("fresh", template(group("g1", 4)), 4, 20)  # only a fetch replaces it
    assert rt.route("fresh") == own


def test_a_borrowed_route_is_refreshed_soon_and_an_own_route_at_the_interval():
    rt = RouteTable(refresh_interval_ms=30_000)
    rt.apply_template("fresh", template(group("g0")), 4, 0)
    rt.apply("known", ns.TopicRoute("known", 1, True, [group("g0")]), 0)
    assert rt.stale(TEMPLATE_ROUTE_REFRESH_MS - 1) == []
    assert rt.stale(TEMPLATE_ROUTE_REFRESH_MS) == ["fresh"]
    rt.fetched("fresh", TEMPLATE_ROUTE_REFRESH_MS)  # TOPIC_NOT_EXIST still: the borrowed route stays
    assert rt.borrowed("fresh") and rt.stale(2 * TEMPLATE_ROUTE_REFRESH_MS) == ["fresh"]
    assert rt.stale(30_000) == ["fresh", "known"]


def test_a_template_whose_groups_take_no_writes_now_is_not_borrowed():
    rt = RouteTable()
    assert not rt.apply_template("fresh", template(group("g0", leader=False), group("g1", perm=4)), 4, 0)
    assert not rt.known("fresh")


# --- brokers register the template; the name server routes it like a topic ----------------------

def _config(name, auto, queues=4):
    return BrokerConfig(insecure=True, broker_name=name, listen="127.0.0.1:10911", auto_create_topic_enable=auto,
                        default_topic_queues=queues, namesrv_addresses=("127.0.0.1:9876",))


def _standalone(cfg, topics):
    address = {"g0": "127.0.0.1:10911", "g1": "127.0.0.1:10912"}[cfg.broker_name]
    return registration(cfg, NS(role_name="standalone"), NS(topics=topics, version=len(topics)), address)


def test_a_leading_node_registers_the_template_only_when_its_config_auto_creates():
    on, off = _config("g0", True, 6), _config("g1", False)
    t = {"orders": TopicConfig("orders", 8, 8)}
    assert [(x.topic, x.write_queues, x.perm) for x in _standalone(on, t).topics] == [("orders", 8, 6),
                                                                                     (TEMPLATE_TOPIC, 6, 6)]
    assert [x.topic for x in _standalone(off, t).topics] == ["orders"]
    peers = [{"id": f"n{i}", "address": f"127.0.0.1:{10911 + i}"} for i in range(3)]
    raft = on.model_copy(update={"mode": "raft", "node_id": "n0", "peers": peers})
    follower = registration(raft, NS(role_name="follower", node=NS(term=2)), NS(topics=t, version=1), "a:1")
    assert follower.topics == []  # only the leader's list makes the route (rule N2)


def test_only_the_group_that_auto_creates_is_in_the_template_route_and_gets_the_topic():
    names = NamesrvTable("ns0")
    g0, g1 = _config("g0", True), _config("g1", False)
    names.register(_standalone(g0, {}), "c0", 0)
    names.register(_standalone(g1, {"orders": TopicConfig("orders", 8, 8)}), "c1", 0)
    tpl = names.route(TEMPLATE_TOPIC)
    assert [g.broker_name for g in tpl.groups] == ["g0"] and names.route("fresh") is None

    producer = RouteTable()
    assert producer.apply_template("fresh", tpl, 4, 0)
    assert {q[0] for q in producer.publish_queues("fresh")} == {"g0"}  # every send goes to g0
    # g0 creates it on the first send and re-registers: the name server routes it to g0 alone
    names.register(_standalone(g0, {"fresh": TopicConfig("fresh", 4, 4)}), "c0", 1)
    own = names.route("fresh")
    assert [(g.broker_name, g.write_queues) for g in own.groups] == [("g0", 4)] and own.exists
    # turning auto-creation off on g0 takes the template out of the route (N2: a complete list)
    names.register(_standalone(g0.model_copy(update={"auto_create_topic_enable": False}),
                               {"fresh": TopicConfig("fresh", 4, 4)}), "c0", 2)
    assert names.route(TEMPLATE_TOPIC) is None and names.route("fresh") is not None


def test_the_template_name_is_reserved_on_brokers(tmp_path):
    topics = TopicManager(tmp_path / "topics.json", True, 4, 1024)
    with pytest.raises(TopicError, match="reserved"):
        topics.get_or_auto_create(TEMPLATE_TOPIC)  # a send to it is refused: it never holds messages
    assert topics.get_or_auto_create("fresh") == TopicConfig("fresh", 4, 4)


def test_a_name_server_with_auto_creation_off_does_not_route_the_template():
    from broker.namesrv.config import from_dict
    from broker.namesrv.server import NameServer
    from broker.protocol import jsonbody
    from broker.protocol.topics import TopicName

    async def ask(server, topic):
        answers = []
        conn = NS(respond=lambda f, code, body=b"", error=None: answers.append((code, error)))
        server._route(conn, NS(body=jsonbody.encode(TopicName(topic))))
        return answers[0]

    async def go(auto):
        server = NameServer(from_dict({"insecure": True, "startup_grace_ms": 0, "auto_create_topic_enable": auto}))
        server.core.register(_standalone(_config("g0", True), {}), "c0", 0)
        return await ask(server, TEMPLATE_TOPIC)
    assert asyncio.run(go(True))[0] == Code.SUCCESS
    code, error = asyncio.run(go(False))
    assert code == Code.TOPIC_NOT_EXIST and "auto_create_topic_enable: false" in error


# --- ClusterProducer (stand-in group producers and name servers) -------------------------------

class FakeGroupProducer:
    sent: list = []

    def __init__(self, addresses, **kw):
        self.addresses = [tuple(a.split(":")) for a in addresses]
        self.group = addresses[0].split("-")[0]

    def send_nowait(self, topic, body, key, tags, properties, queue_id, flags, msg_id):
        f = asyncio.get_running_loop().create_future()
        FakeGroupProducer.sent.append((self.group, topic, queue_id))
        f.set_result(SendResult(msg_id.hex(), topic, queue_id, 0, 0, 0, 0))
        return f

    async def aclose(self):
        pass

    def close(self):
        pass


@pytest.fixture
def names(monkeypatch):
    """routes: topic -> route the stand-in name servers answer (absent: TOPIC_NOT_EXIST)."""
    monkeypatch.setattr(cluster, "Producer", FakeGroupProducer)
    FakeGroupProducer.sent = []
    state = {"routes": {TEMPLATE_TOPIC: template(group("g0", 8))}, "asked": []}

    async def topic_route(self, topic):
        state["asked"].append(topic)
        await asyncio.sleep(0)
        return state["routes"].get(topic)
    monkeypatch.setattr(namesrv_client.NameServers, "topic_route", topic_route)
    return state


def test_a_producer_sends_a_new_topic_over_the_template_groups_then_takes_its_own_route(names):
    async def go():
        async with cluster.ClusterProducer("ns:9876", default_topic_queues=2) as p:
            first = await asyncio.gather(*(p.send_async("fresh", b"x") for _ in range(20)))
            first += [await p.send_async("fresh", b"x") for _ in range(8)]
            assert p.routes.table.borrowed("fresh")
            names["routes"]["fresh"] = ns.TopicRoute("fresh", 9, True, [group("g0", 8)])  # g0 created it
            p.routes.table.fetched("fresh", -1e9)  # its refresh is due
            p._last_refresh_check = -1e9
            while p.routes.table.borrowed("fresh"):
                await p.send_async("fresh", b"x")
                await asyncio.sleep(0.001)
            later = [await p.send_async("fresh", b"x") for _ in range(16)]  # one loop pass each
            return first, later
    first, later = asyncio.run(go())
    assert {(r.broker_name, r.queue_id) for r in first} == {("g0", 0), ("g0", 1)}  # min(2, 8) queues
    assert {r.queue_id for r in later} == set(range(8))  # the topic's own route: 8 queues
    # the route of the topic, then the template once, however many sends waited for it
    assert names["asked"][:2] == ["fresh", TEMPLATE_TOPIC] and names["asked"].count(TEMPLATE_TOPIC) == 1


def test_without_a_template_or_with_auto_creation_off_a_new_topic_fails_naming_it(names):
    async def send(**kw):
        async with cluster.ClusterProducer("ns:9876", **kw) as p:
            with pytest.raises(SendError) as e:
                await p.send_async("fresh", b"x")
            return e.value
    off = asyncio.run(send(auto_create_topic_enable=False))
    assert off.code == Code.TOPIC_NOT_EXIST and off.stored is False and "'fresh'" in str(off)
    assert "auto_create_topic_enable=False" in str(off) and TEMPLATE_TOPIC not in names["asked"]
    del names["routes"][TEMPLATE_TOPIC]  # no group auto-creates
    none = asyncio.run(send())
    assert none.code == Code.TOPIC_NOT_EXIST and "'fresh'" in str(none) and TEMPLATE_TOPIC in str(none)
    assert FakeGroupProducer.sent == []


def test_default_topic_queues_is_checked():
    with pytest.raises(ValueError, match="default_topic_queues"):
        cluster.ClusterProducer("ns:9876", default_topic_queues=0)
