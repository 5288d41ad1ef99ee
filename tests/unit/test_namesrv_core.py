"""The name server's RouteTable (broker/namesrv/core.py): rules N1-N5 of
docs/design/name-server.md §2, each test citing the RocketMQ method it follows
(namesrv/.../RouteInfoManager.java, BrokerHousekeepingService.java), plus the bounds."""

import pytest

from broker.namesrv.core import Bounds, RouteTable
from broker.protocol import namesrv as ns
from broker.protocol.codes import BadRequest

EXPIRE = 120_000


def reg(node="n0", group="g0", role="leader", term=1, epoch=0, topics=(("orders", 8),), port=None, mode="raft"):
    return ns.RegisterBroker("c", group, node, f"127.0.0.1:{port or 10000 + int(node[1:])}", mode, role,
                             term, epoch, 1, [ns.TopicQueues(t, q, q, 6) for t, q in topics])


def table(**kw) -> RouteTable:
    return RouteTable("ns1", EXPIRE, **kw)


def test_n1_register_upserts_and_stamps_last_seen():
    # RouteInfoManager.registerBroker: brokerLiveTable.put(addr, new BrokerLiveInfo(now, ...))
    t = table()
    t.register(reg("n0"), "c1", 1000)
    t.register(reg("n0", port=20000), "c2", 5000)  # moved: same node, new address and connection
    n = t.groups["g0"].nodes["n0"]
    assert (n.address, n.last_seen_ms, n.conn_id) == ("127.0.0.1:20000", 5000, "c2")
    assert len(t.groups["g0"].nodes) == 1
    assert t.cluster_info(6000).groups[0].nodes[0].age_ms == 1000


def test_n2_only_a_leading_nodes_topics_count_and_its_list_is_complete():
    # registerBroker: topic configs are taken from the master (isMaster || isPrimeSlave);
    # deleteTopicWithBrokerRegistration: a topic the master no longer lists is removed
    t = table()
    t.register(reg("n1", role="follower", topics=(("ghost", 4),)), "c1", 0)
    assert t.route("ghost") is None  # a follower's topics are ignored
    t.register(reg("n0", topics=(("orders", 8), ("audit", 2))), "c0", 0)
    assert t.route("orders").groups[0].write_queues == 8 and t.route("audit") is not None
    t.register(reg("n0", topics=(("orders", 8),)), "c0", 10)
    assert t.route("audit") is None and "audit" not in t.topics  # no group left: gone
    t.register(reg("n3", "h0", mode="standalone", role="standalone", term=0, topics=(("orders", 4),)), "c9", 10)
    assert [g.broker_name for g in t.route("orders").groups] == ["g0", "h0"]  # standalone leads too


def test_n3_stale_leader_claim_is_a_follower_and_higher_term_demotes():
    # registerBroker's stateVersion check: "Registering Broker conflicts with the existed one,
    # just ignore"; and "switch slave to master: first remove <1, IP:PORT>"
    t = table()
    t.register(reg("n0", term=5), "c0", 0)
    t.register(reg("n1", term=4, topics=(("stale", 1),)), "c1", 0)  # a partitioned old leader
    assert t.groups["g0"].nodes["n1"].role == "follower"
    assert t.route("stale") is None and t.leader_of("g0") == "127.0.0.1:10000"
    t.register(reg("n2", term=5), "c2", 0)  # equal rank from another node: no second leader
    assert t.leader_of("g0") == "127.0.0.1:10000"
    t.register(reg("n1", term=6), "c1", 0)  # the new leader: the old one steps down at once
    assert t.leader_of("g0") == "127.0.0.1:10001"
    assert t.groups["g0"].nodes["n0"].role == "follower"
    assert t.route("orders").groups[0].followers == ["127.0.0.1:10000", "127.0.0.1:10002"]
    # master-slave fences by epoch: a stale master's claim after a promotion
    t.register(reg("m0", "ms", role="master", term=0, epoch=2, mode="master-slave"), "d0", 0)
    t.register(reg("m1", "ms", role="master", term=0, epoch=1, mode="master-slave"), "d1", 0)
    assert t.leader_of("ms") == "127.0.0.1:10000" and t.groups["ms"].nodes["m1"].role == "follower"


def test_n3_a_leader_leaving_lowers_the_fence_to_the_nodes_still_there():
    # a forged (or simply gone) leader with a huge term must not fence the real one for as
    # long as any node of the group stays: expiry, connection close and unregister alike
    for leave in (lambda t: t.connection_closed("evil"), lambda t: t.expire(EXPIRE + 1),
                  lambda t: t.unregister("g0", "n9")):
        t = table()
        t.register(reg("n0", term=3), "c0", EXPIRE)
        t.register(reg("n1", role="follower", term=3), "c1", EXPIRE)
        t.register(reg("n9", term=10**9, port=6666), "evil", 0)
        assert t.leader_of("g0") == "127.0.0.1:6666"
        assert t.groups["g0"].nodes["n0"].role == "follower"
        leave(t)
        assert t.groups["g0"].rank == (3, 0)  # the highest rank of the nodes left
        t.register(reg("n0", term=3), "c0", EXPIRE)  # the real leader's next registration
        assert t.leader_of("g0") == "127.0.0.1:10000"
        t.register(reg("n1", term=2), "c1", EXPIRE)  # still fenced below what remains
        assert t.leader_of("g0") == "127.0.0.1:10000"
    t = table()
    t.register(reg("n0", term=7), "c0", 0)
    t.register(reg("n1", role="follower", term=0), "c1", 0)
    t.unregister("g0", "n0")
    assert t.groups["g0"].rank == (0, 0)


def test_n3_a_node_stays_in_the_group_it_registered_in():
    t = table()
    t.register(reg("n0", "g0", term=3), "c0", 0)
    with pytest.raises(BadRequest, match="n0.*group g0.*not g1"):
        t.register(reg("n0", "g1", term=99), "c0", 0)
    assert set(t.groups) == {"g0"} and t.leader_of("g0") == "127.0.0.1:10000"
    t.connection_closed("c0")  # its entry gone: it may register elsewhere
    t.register(reg("n0", "g1"), "c0", 0)
    assert t.leader_of("g1") == "127.0.0.1:10000"


def test_n4_expiry_at_broker_expire_ms_and_connection_close_at_once():
    # RouteInfoManager.scanNotActiveBroker (last + expire < now); BrokerHousekeepingService
    # onChannelClose -> onChannelDestroy
    t = table()
    t.register(reg("n0"), "c0", 0)
    t.register(reg("n1", role="follower"), "c1", 1000)
    assert t.expire(EXPIRE) == []  # 120 s exactly: still alive
    dropped = t.expire(EXPIRE + 1)
    assert [(d.broker_name, d.node_id) for d in dropped] == [("g0", "n0")]
    r = t.route("orders")  # the leader is gone: the queues stay, not writable
    assert r.groups[0].leader is None and r.groups[0].followers == ["127.0.0.1:10001"]
    assert [d.node_id for d in t.connection_closed("c1")] == ["n1"]  # at once
    assert t.groups == {} and t.route("orders") is None  # the last node takes the group with it
    assert t.connection_closed("c1") == []


def test_n4_a_reregistration_on_a_new_connection_survives_the_old_ones_close():
    t = table()
    t.register(reg("n0"), "old", 0)
    t.register(reg("n0"), "new", 10)
    assert t.connection_closed("old") == [] and t.leader_of("g0") is not None


def test_n4_unregister_on_clean_stop():
    # RouteInfoManager.unregisterBroker
    t = table()
    t.register(reg("n0"), "c0", 0)
    assert t.unregister("g0", "n0") and not t.unregister("g0", "n0")
    assert t.route("orders") is None


def test_n5_route_sorted_by_group_with_leader_followers_and_version():
    # pickupTopicRouteData; topicRouteData2TopicPublishInfo sorts QueueData by brokerName;
    # TopicRouteData.topicRouteDataChanged: clients skip unchanged routes
    t = table()
    t.register(reg("n0", "g1", term=2), "a", 0)
    t.register(reg("n1", "g0", term=7), "b", 0)
    t.register(reg("n2", "g0", role="follower", term=7), "c", 0)
    r = t.route("orders")
    assert [(g.broker_name, g.leader, g.term, g.followers) for g in r.groups] == [
        ("g0", "127.0.0.1:10001", 7, ["127.0.0.1:10002"]), ("g1", "127.0.0.1:10000", 2, [])]
    v = r.version
    t.register(reg("n1", "g0", term=7), "b", 10)  # a periodic re-registration: nothing changed
    assert t.route("orders").version == v
    t.register(reg("n2", "g0", term=8), "c", 20)  # a new leader: the route reads differently
    assert t.route("orders").version > v
    assert t.route("nope") is None


@pytest.mark.parametrize("bounds, regs, bound", [
    (Bounds(groups_max=1), [reg("n0", "g0"), reg("n1", "g1")], "groups_max=1"),
    (Bounds(nodes_per_group_max=1), [reg("n0"), reg("n1", role="follower")], "nodes_per_group_max=1"),
    (Bounds(routes_topics_max=2), [reg("n0", topics=(("a", 1), ("b", 1), ("c", 1)))], "routes_topics_max=2"),
])
def test_bounds_refuse_naming_the_bound(bounds, regs, bound):
    t = table(bounds=bounds)
    for r in regs[:-1]:
        t.register(r, "c", 0)
    with pytest.raises(BadRequest, match=bound):
        t.register(regs[-1], "c", 0)


def test_a_topic_listed_twice_is_refused():
    t = table()
    with pytest.raises(BadRequest, match="twice"):
        t.register(reg("n0", topics=(("a", 1), ("a", 2))), "c", 0)


def test_a_secure_name_server_checks_ip_addresses_against_the_connection_but_not_dns_names():
    """A registration naming an IP must come from it (or loopback from loopback); a DNS name
    (specs allow them) is not resolved on the event loop, so it is not refused for that."""
    from types import SimpleNamespace

    from broker.namesrv.server import NameServer
    from broker.protocol import namesrv as nsp

    said = []
    me = SimpleNamespace(config=SimpleNamespace(secure=True), guard=SimpleNamespace(refused=lambda *a, **k: None))

    def check(address, source):
        conn = SimpleNamespace(source=source, member="n0", respond=lambda f, code, **kw: said.append(code))
        r = nsp.RegisterBroker("c", "g0", "n0", address, "raft", "leader")
        return NameServer._not_its_address(me, conn, None, r)
    assert not check("10.0.0.5:10911", "10.0.0.5")
    assert check("10.9.9.9:10911", "10.0.0.5")
    assert not check("127.0.3.7:10911", "127.0.0.1")
    assert check("10.0.0.5:10911", "127.0.0.1")
    assert not check("broker-1.example.com:10911", "10.0.0.5")
    assert len(said) == 2
