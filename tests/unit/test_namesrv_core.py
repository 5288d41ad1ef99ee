"""The name server's RouteTable (broker/namesrv/core.py): rules N0-N5 of
docs/design/name-server.md §2 and §4, each test citing the RocketMQ method it follows
(namesrv/.../RouteInfoManager.java, BrokerHousekeepingService.java) or where it departs from it
(N0, N3: issue 39 item 2), plus the bounds."""

import pytest

from broker.namesrv.core import Bounds, RouteTable
from broker.protocol import namesrv as ns
from broker.protocol.codes import BadRequest

EXPIRE = 120_000


def reg(node="n0", group="g0", role="leader", term=1, epoch=0, topics=(("orders", 8),), port=None, mode="raft",
        leader=None):
    """`leader`: whom the node says it follows (None: a broker that does not say)."""
    return ns.RegisterBroker("c", group, node, f"127.0.0.1:{port or 10000 + int(node[1:])}", mode, role,
                             term, epoch, 1, [ns.TopicQueues(t, q, q, 6) for t, q in topics], leader)


def table(**kw) -> RouteTable:
    return RouteTable("ns1", EXPIRE, **kw)


def test_n0_a_certificate_registers_its_own_node_in_its_own_group_only():
    # issue 39 item 2: a member certificate of group g1 (or one naming no group, issued before
    # groups were named) may not register in group g0, whatever node_id, term or epoch it says
    from broker.namesrv.core import refusal
    assert refusal("g0", "n0", "n0", "g0") is None
    assert "names member 'n1', not node_id 'n0'" in refusal("g0", "n0", "n1", "g0")
    assert "names broker group 'g1', not 'g0'" in refusal("g0", "n0", "n0", "g1")
    assert "names no broker group" in refusal("g0", "n0", "n0", None)
    assert "re-issue" in refusal("g0", "n0", "n0", None)


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


def test_n3_a_leader_is_routed_once_most_registered_nodes_follow_it():
    # RocketMQ's registerBroker took the highest stateVersion; here the group's own members
    # must vouch: the claimant itself and every follower of its rank that names it
    t = table()
    t.register(reg("n0", term=5, leader="n0"), "c0", 0)
    assert t.leader_of("g0") == "127.0.0.1:10000"  # alone: more than half of one
    t.register(reg("n1", role="follower", term=5, leader="n0"), "c1", 0)
    t.register(reg("n2", role="follower", term=5, leader=""), "c2", 0)  # voted, no append yet
    assert t.leader_of("g0") == "127.0.0.1:10000" and t.groups["g0"].fence == (5, 0)
    # failover: n0 gone, n1 wins term 6 with n2's vote; routed only once n2 says it follows n1
    t.connection_closed("c0")
    t.register(reg("n1", term=6, leader="n1"), "c1", 10)
    assert t.leader_of("g0") is None
    assert t.route("orders").groups[0].leader is None  # the queues stay, not writable
    t.register(reg("n2", role="follower", term=6, leader=""), "c2", 11)
    assert t.leader_of("g0") is None  # a vote is not a vouch
    t.register(reg("n2", role="follower", term=6, leader="n1"), "c2", 12)
    assert t.leader_of("g0") == "127.0.0.1:10001"
    assert t.cluster_info(12).groups[0].leader_id == "n1"


def test_n3_a_partitioned_old_leader_is_not_routed_and_the_fence_outlives_who_raised_it():
    t = table()
    t.register(reg("n0", term=5, leader="n0"), "c0", 0)  # cut off from its group, still registering
    t.register(reg("n1", term=6, leader="n1"), "c1", 0)
    t.register(reg("n2", role="follower", term=6, leader="n1"), "c2", 0)
    assert t.leader_of("g0") == "127.0.0.1:10001"
    assert t.groups["g0"].nodes["n0"].role == "leader" and t.cluster_info(0).groups[0].nodes[0].role == "follower"
    t.connection_closed("c1")
    t.connection_closed("c2")  # the nodes that moved on leave this name server
    t.register(reg("n0", term=5, leader="n0", topics=(("stale", 1),)), "c0", 10)
    assert t.leader_of("g0") is None  # fenced at 6: not routed back to the stale leader
    assert t.route("stale") is None
    t.register(reg("n0", role="follower", term=6, leader=""), "c0", 20)  # it heard of term 6
    t.register(reg("n1", term=6, leader="n1"), "c1", 20)
    t.register(reg("n0", role="follower", term=6, leader="n1"), "c0", 21)
    assert t.leader_of("g0") == "127.0.0.1:10001"


def test_n3_a_huge_term_from_a_node_of_the_group_routes_nothing_and_fences_nothing():
    # issue 39 item 2 within a group: a node taken out of it, its certificate kept
    t = table()
    t.register(reg("n0", term=5, leader="n0"), "c0", 0)
    t.register(reg("n1", role="follower", term=5, leader="n0"), "c1", 0)
    huge = (1 << 63) - 1
    t.register(reg("x9", term=huge, leader="x9", port=6666, topics=(("orders", 64), ("evil", 8))), "evil", 0)
    assert t.leader_of("g0") == "127.0.0.1:10000"  # vouched for by itself only
    assert t.route("evil") is None and t.route("orders").groups[0].write_queues == 8
    assert t.groups["g0"].fence == (5, 0)
    t.register(reg("x9", role="follower", term=huge, leader=""), "evil", 1)  # a follower: the same
    t.register(reg("n0", term=5, leader="n0"), "c0", 2)
    assert t.leader_of("g0") == "127.0.0.1:10000" and t.groups["g0"].fence == (5, 0)
    # claiming the group's own term does not help either: its followers name their leader
    t.register(reg("x9", term=5, leader="x9", port=6666), "evil", 3)
    assert t.leader_of("g0") == "127.0.0.1:10000"
    t.connection_closed("c0")  # ... even with the real leader gone
    assert t.leader_of("g0") is None


def test_n3_a_lone_registration_leads_but_never_fences_the_group():
    t = table()  # a name server just restarted: a forger registers first
    huge = (1 << 63) - 1
    t.register(reg("x9", term=huge, leader="x9", port=6666), "evil", 0)
    assert t.leader_of("g0") == "127.0.0.1:6666" and t.groups["g0"].fence == (-1, -1)
    t.register(reg("n0", term=5, leader="n0"), "c0", 1)
    assert t.leader_of("g0") is None  # one against one
    t.register(reg("n1", role="follower", term=5, leader="n0"), "c1", 2)
    assert t.leader_of("g0") == "127.0.0.1:10000"


def test_n3_master_slave_pairs_and_epochs():
    # epochs fence as terms do; a pair's survivor is promoted alone (promotion_quorum(2) = 1)
    t = table()
    ms = dict(group="ms", mode="master-slave", term=0)
    t.register(reg("m0", role="master", epoch=1, leader="m0", **ms), "d0", 0)
    t.register(reg("m1", role="slave", epoch=1, leader="m0", **ms), "d1", 0)
    assert t.leader_of("ms") == "127.0.0.1:10000" and t.groups["ms"].fence == (0, 1)
    t.connection_closed("d0")  # the master dies
    t.register(reg("m1", role="master", epoch=2, leader="m1", **ms), "d1", 10)
    assert t.leader_of("ms") == "127.0.0.1:10001"
    t.register(reg("m0", role="slave", epoch=1, leader="", **ms), "d0", 20)  # back, waiting
    assert t.leader_of("ms") is None
    t.register(reg("m0", role="slave", epoch=2, leader="m1", **ms), "d0", 21)  # follows the new master
    assert t.leader_of("ms") == "127.0.0.1:10001" and t.groups["ms"].fence == (0, 2)
    # a paused old master that stays registered while its slave is promoted: neither is routed
    # until one of them hears of the other (RocketMQ would take the higher epoch)
    t.register(reg("m0", role="master", epoch=3, leader="m0", **ms), "d0", 30)
    t.register(reg("m1", role="master", epoch=2, leader="m1", **ms), "d1", 30)
    assert t.leader_of("ms") is None


def test_n3_a_broker_that_does_not_say_whom_it_follows_vouches_by_its_rank():
    # registrations from brokers before leader_id (issue 39) decode with None: as before
    t = table()
    t.register(reg("n0", term=5, leader=None), "c0", 0)
    t.register(reg("n1", role="follower", term=5, leader=None), "c1", 0)
    t.register(reg("n2", role="follower", term=5, leader=None), "c2", 0)
    assert t.leader_of("g0") == "127.0.0.1:10000" and t.groups["g0"].fence == (5, 0)
    # a second claim of one rank, both vouched for by n2: the incumbent keeps it
    t.register(reg("n1", term=5, leader=None), "c1", 1)
    assert t.leader_of("g0") == "127.0.0.1:10000"
    from broker.namesrv.core import choose_leader  # ... and with no incumbent, neither
    assert choose_leader(t.groups["g0"].nodes.values(), None, (5, 0)) == (None, (5, 0))


def test_n3_a_group_rebuilt_from_scratch_starts_a_new_fence():
    t = table()
    t.register(reg("n0", term=9, leader="n0"), "c0", 0)
    t.register(reg("n1", role="follower", term=9, leader="n0"), "c1", 0)
    assert t.groups["g0"].fence == (9, 0)
    t.connection_closed("c0")
    t.connection_closed("c1")  # every node left: the group and its fence go
    assert "g0" not in t.groups
    t.register(reg("n0", term=1, leader="n0"), "c0", 10)
    t.register(reg("n1", role="follower", term=1, leader="n0"), "c1", 10)
    assert t.leader_of("g0") == "127.0.0.1:10000"


def test_n3_choose_leader_and_vouchers_directly():
    from broker.namesrv.core import Node, choose_leader, vouchers

    def node(i, role, term, leader):
        return Node(i, "a:1", role, term, 0, 0, None, 0, leader)
    a, b, c, d = node("a", "leader", 3, "a"), node("b", "follower", 3, "a"), node("c", "follower", 3, ""), \
        node("d", "follower", 2, "a")
    assert [vouchers([a, b, c, d], a)] == [2]  # itself and b: c names no one, d is of another term
    assert choose_leader([a, b, c, d], None, (-1, -1)) == (None, (3, 0))  # 2 of 4: not more than half
    assert choose_leader([a, b, c], None, (-1, -1)) == ("a", (3, 0))
    assert choose_leader([a, b, c], None, (4, 0)) == (None, (4, 0))  # below the fence


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


def test_a_secure_name_server_refuses_and_logs_a_registration_for_a_group_its_certificate_does_not_name():
    # issue 39 item 2 in the driver: NO_PERMISSION with the reason, and a refusal logged
    from types import SimpleNamespace

    from broker.namesrv.server import NameServer
    from broker.protocol.codes import Code

    refused, said = [], []
    me = SimpleNamespace(config=SimpleNamespace(secure=True),
                         guard=SimpleNamespace(refused=lambda conn, what, kind=None: refused.append(what)))

    def check(broker_name, node_id, member, group):
        conn = SimpleNamespace(member=member, ns_group=group,
                               respond=lambda f, code, **kw: said.append((code, kw.get("error", ""))))
        return NameServer._not_that_member(me, conn, None, broker_name, node_id)
    assert not check("g0", "n0", "n0", "g0") and not said
    assert check("g0", "b0", "b0", "g1")
    assert said[-1][0] == Code.NO_PERMISSION and "names broker group 'g1', not 'g0'" in said[-1][1]
    assert refused[-1] == "member b0 (group g1) tried to register as g0/b0"
    assert check("g0", "n0", "n0", None) and "names no broker group" in said[-1][1]


def test_a_registration_from_nobody_counts_as_a_failed_login():
    # issue 39 item 8: AUTH_FAILED answers to REGISTER/UNREGISTER without a member certificate
    # or a login count as failed logins; the third closes the connection (Guard's AUTH_FAILURES_MAX)
    from types import SimpleNamespace

    from broker.namesrv.server import NameServer
    from broker.protocol.codes import Code
    from broker.security.guard import AUTH_FAILURES_MAX, AuthState, Guard

    said, closed = [], []
    me = SimpleNamespace(config=SimpleNamespace(secure=True), guard=SimpleNamespace(unauthenticated=Guard.unauthenticated))
    conn = SimpleNamespace(member=None, principal=None, auth=AuthState(), close=lambda: closed.append(True),
                           respond=lambda f, code, **kw: said.append(code))
    for i in range(AUTH_FAILURES_MAX):
        assert not closed
        assert NameServer._refuse_registrant(me, conn, None)
    assert said == [Code.AUTH_FAILED] * AUTH_FAILURES_MAX and closed == [True]
