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
