"""When a broker node registers (broker/registrar_core.py): at once on connect, every
register_interval_ms, at once on a change (one in flight per name server), and reconnects
with a bounded backoff."""

from broker.registrar_core import RECONNECT_MAX_MS, RECONNECT_MIN_MS, Action, RegistrarCore

A, B = "ns1:9876", "ns2:9876"


def test_connect_then_register_at_once_then_every_interval():
    c = RegistrarCore([A, B], 30_000, 0)
    assert c.due(0) == [Action("connect", A), Action("connect", B)]
    assert c.due(0) == []  # in flight
    c.connected(A, 5)
    assert c.due(5) == [Action("register", A)]  # a (re)connect registers at once
    c.registered(A, 10)
    assert c.due(29_999) == [] and c.next_due_ms() == 30_010
    assert c.due(30_010) == [Action("register", A)]


def test_a_change_registers_now_or_right_after_the_one_in_flight():
    c = RegistrarCore([A], 30_000, 0)
    c.due(0)
    c.connected(A, 0)
    c.due(0)
    c.changed(1)  # e.g. a role change while a registration is in flight
    c.registered(A, 2)
    assert c.due(2) == [Action("register", A)]  # again, with the new state
    c.registered(A, 3)
    c.changed(4)
    assert c.due(4) == [Action("register", A)]


def test_failures_back_off_and_a_lost_connection_reconnects():
    c = RegistrarCore([A], 30_000, 0)
    now, delays = 0, []
    for _ in range(8):
        assert c.due(now) == [Action("connect", A)]
        c.connect_failed(A, now)
        delays.append(c.next_due_ms() - now)
        now = c.next_due_ms()
    assert delays[0] == RECONNECT_MIN_MS and delays[-1] == RECONNECT_MAX_MS
    c.due(now)
    c.connected(A, now)
    c.due(now)
    c.registered(A, now)
    c.disconnected(A, now + 1)  # the name server restarted
    c.changed(now + 2)  # not connected: nothing to send until it reconnects
    assert c.due(now + RECONNECT_MIN_MS + 1) == [Action("connect", A)]


def test_registration_lists_topics_only_when_leading():
    from types import SimpleNamespace as NS

    from broker.config import BrokerConfig
    from broker.registrar import registration
    from broker.topics import TopicConfig

    peers = [{"id": f"n{i}", "address": f"127.0.0.1:{10911 + i}"} for i in range(3)]
    cfg = BrokerConfig(mode="raft", node_id="n1", peers=peers, listen="127.0.0.1:10912", insecure=True,
                       broker_name="g0", namesrv_addresses=("127.0.0.1:9876",))
    topics = NS(topics={"t": TopicConfig("t", 4, 4)}, version=3)
    lead = registration(cfg, NS(role_name="leader", node=NS(term=7)), topics, cfg.peer_address)
    assert (lead.role, lead.term, lead.node_id, lead.address, lead.topics_version) == ("leader", 7, "n1", "127.0.0.1:10912", 3)
    # and the auto-creation template: auto_create_topic_enable is on by default
    assert [(t.topic, t.write_queues) for t in lead.topics] == [("t", 4), ("%TBW102", 4)]
    cand = registration(cfg, NS(role_name="candidate", node=NS(term=8)), topics, cfg.peer_address)
    assert (cand.role, cand.topics) == ("follower", [])  # a candidate leads nothing
    ms = cfg.model_copy(update={"mode": "master-slave"})
    fenced = registration(ms, NS(role_name="master", accepting_writes=False, epochs=NS(last_epoch=4)), topics, "a:1")
    assert (fenced.role, fenced.epoch, fenced.topics) == ("slave", 4, [])


def test_namesrv_config_is_secure_by_default_and_names_bad_fields():
    import pytest

    from broker.config import ConfigError
    from broker.namesrv import config as nc

    with pytest.raises(ConfigError, match="insecure: true"):
        nc.from_dict({}).require_security()
    with pytest.raises(ConfigError, match="did you mean 'broker_expire_ms'"):
        nc.from_dict({"broker_expire_msec": 1, "insecure": True})
    assert nc.from_dict({"listen": "0.0.0.0:9877", "insecure": True}).port == 9877


def test_an_unexpected_error_in_a_link_task_is_retried_not_fatal(monkeypatch, caplog):
    # a connect or register task that raised something other than an I/O error used to die
    # silently with its link busy: that name server never heard from the node again
    import asyncio
    from types import SimpleNamespace as NS

    from broker import registrar as rg
    from broker.protocol import namesrv as ns
    from broker.protocol.codes import Code

    class FakeLink:
        closed = False

        async def request(self, code, body, timeout_s):
            sent.append(code)
            if len(sent) == 1:
                raise ValueError("boom in register")
            return NS(code=Code.SUCCESS, headers={})

        def abort(self):
            self.closed = True

    opens, sent = [], []

    async def fake_open(host, port, timeout_s, credentials=None):
        opens.append(port)
        if len(opens) == 1:
            raise ValueError("boom in connect")
        return FakeLink()

    monkeypatch.setattr(rg._Link, "open", fake_open)
    cfg = NS(namesrv_addresses=["127.0.0.1:9876"], register_interval_ms=60_000, register_timeout_ms=1000,
             broker_name="g0", node_id="n0", member_credentials=lambda: None)
    me = ns.RegisterBroker("c", "g0", "n0", "127.0.0.1:1", "standalone", "standalone", 0, 0, 0, [])

    async def go():
        r = rg.Registrar(cfg, lambda: me)
        r.start()
        deadline = asyncio.get_running_loop().time() + 5
        while len(sent) < 2 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        r._task.cancel()
        await asyncio.gather(r._task, *r._running, return_exceptions=True)
        return r

    r = asyncio.run(go())
    assert len(opens) >= 2 and len(sent) == 2, (opens, sent)  # both failures were retried
    assert not r.core.links["127.0.0.1:9876"].busy
    text = caplog.text
    assert "ValueError: boom in connect" in text and "ValueError: boom in register" in text


def test_a_change_of_standing_registers_at_once_the_first_look_only_records():
    # a name server routes a leader once its followers say they follow it (core.py N3): a
    # follower that voted, or learnt its leader, must say so now, not a period later
    c = RegistrarCore([A], 30_000, 0)
    assert not c.observe(("follower", 5, 0, "n0"), 0)  # the first look: the first registration says it
    c.due(0)
    c.connected(A, 0)
    c.due(0)
    c.registered(A, 1)
    assert not c.observe(("follower", 5, 0, "n0"), 2) and c.due(2) == []
    assert c.observe(("follower", 6, 0, ""), 3)  # voted in term 6
    assert c.due(3) == [Action("register", A)]
    assert c.observe(("follower", 6, 0, "n1"), 4)  # learnt the leader while that one is in flight
    c.registered(A, 5)
    assert c.due(5) == [Action("register", A)]  # again at once, with the leader


def test_registration_says_whom_the_node_follows():
    from types import SimpleNamespace as NS

    from broker.config import BrokerConfig
    from broker.registrar import Standing, registration, standing

    peers = [{"id": f"n{i}", "address": f"127.0.0.1:{10911 + i}", "ha_address": f"127.0.0.1:{11911 + i}"}
             for i in range(3)]
    cfg = BrokerConfig(mode="raft", node_id="n1", peers=peers, listen="127.0.0.1:10912", insecure=True,
                       broker_name="g0", namesrv_addresses=("127.0.0.1:9876",))
    topics = NS(topics={}, version=0)
    assert standing(cfg, NS(role_name="leader", node=NS(term=7, leader_id="n1"))) == Standing("leader", 7, 0, "n1")
    assert standing(cfg, NS(role_name="follower", node=NS(term=7, leader_id="n0"))) == Standing("follower", 7, 0, "n0")
    voted = registration(cfg, NS(role_name="candidate", node=NS(term=8, leader_id=None)), topics, "a:1")
    assert (voted.role, voted.term, voted.leader_id) == ("follower", 8, "")
    ms = cfg.model_copy(update={"mode": "master-slave"})
    slave = NS(role_name="slave", accepting_writes=False, epochs=NS(last_epoch=3), epoch_seen=4, master="n0")
    # a slave says the newest epoch it recorded a master of: what a promotion's quorum records
    assert standing(ms, slave) == Standing("slave", 0, 4, "n0")
    fenced = NS(role_name="master", accepting_writes=False, epochs=NS(last_epoch=4), epoch_seen=4, master="n1")
    assert standing(ms, fenced) == Standing("slave", 0, 4, "")  # not routable, follows no one
    master = NS(role_name="master", accepting_writes=True, epochs=NS(last_epoch=4), epoch_seen=4, master="n1")
    assert standing(ms, master) == Standing("master", 0, 4, "n1")
    alone = cfg.model_copy(update={"mode": "standalone", "node_id": None, "peers": []})
    assert standing(alone, NS(role_name="standalone")) == Standing("standalone", 0, 0, "g0")


def test_a_leaders_topic_list_is_made_once_per_topic_change():
    # the standing is read every STANDING_POLL_MS: a list of thousands of topics is not remade
    from types import SimpleNamespace as NS

    from broker.config import BrokerConfig
    from broker.registrar import registration
    from broker.topics import TopicConfig

    class Topics:  # (a stand-in that can be weakly referred to, as TopicManager)
        def __init__(self):
            self.topics, self.version = {"t": TopicConfig("t", 4, 4)}, 1

    cfg = BrokerConfig(insecure=True, broker_name="g0", namesrv_addresses=("127.0.0.1:9876",),
                       auto_create_topic_enable=False)
    topics, me = Topics(), NS(role_name="standalone")
    first = registration(cfg, me, topics, "a:1").topics
    assert registration(cfg, me, topics, "a:1").topics is first
    topics.topics["u"], topics.version = TopicConfig("u", 2, 2), 2
    assert [t.topic for t in registration(cfg, me, topics, "a:1").topics] == ["t", "u"]


def test_the_registrar_registers_a_change_of_standing_without_being_told(monkeypatch):
    # Broker.on_role_changed tells the registrar of role changes only; a term or leader change
    # is found by the standing poll (STANDING_POLL_MS)
    import asyncio
    from types import SimpleNamespace as NS

    from broker import registrar as rg
    from broker.protocol import jsonbody
    from broker.protocol import namesrv as ns
    from broker.protocol.codes import Code

    sent = []

    class FakeLink:
        closed = False

        async def request(self, code, body, timeout_s):
            sent.append(jsonbody.decode(ns.RegisterBroker, body))
            return NS(code=Code.SUCCESS, headers={})

    async def fake_open(host, port, timeout_s, credentials=None):
        return FakeLink()

    monkeypatch.setattr(rg._Link, "open", fake_open)
    cfg = NS(namesrv_addresses=["127.0.0.1:9876"], register_interval_ms=60_000, register_timeout_ms=1000,
             broker_name="g0", node_id="n2", member_credentials=lambda: None)
    now = {"term": 5, "leader": "n0"}

    def snapshot():
        return ns.RegisterBroker("c", "g0", "n2", "127.0.0.1:1", "raft", "follower", now["term"], 0, 0, [],
                                 now["leader"])

    async def go():
        r = rg.Registrar(cfg, snapshot)
        r.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not sent and loop.time() < deadline:
            await asyncio.sleep(0.01)
        now.update(term=6, leader="n1")  # an election: no role change, no changed() call
        t0 = loop.time()
        while len(sent) < 2 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        took = loop.time() - t0
        r._task.cancel()
        await asyncio.gather(r._task, *r._running, return_exceptions=True)
        return took

    took = asyncio.run(go())
    assert [(s.term, s.leader_id) for s in sent] == [(5, "n0"), (6, "n1")]
    assert took < rg.STANDING_POLL_MS / 1000 + 0.5, took
