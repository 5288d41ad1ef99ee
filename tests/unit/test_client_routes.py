"""broker/client/routes.py: a client's route table over broker groups (docs/design/name-server.md
sections 5-7), after RocketMQ's MQClientInstance / TopicPublishInfo / MQFaultStrategy."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client.consumer import allocate
from broker.client.routes import (LATENCY_MAX_MS, NOT_AVAILABLE_DURATION_MS, PERM_READ, PERM_WRITE,
                                  RouteTable, not_available_ms)


@dataclass(frozen=True)
class G:  # the fields of protocol GroupRoute the table reads
    broker_name: str
    write_queues: int = 4
    read_queues: int = 4
    perm: int = PERM_READ | PERM_WRITE
    leader: str | None = "10.0.0.1:10911"
    term: int = 1
    followers: tuple = ()


@dataclass(frozen=True)
class R:  # protocol TopicRoute
    topic: str
    version: int
    exists: bool = True
    groups: tuple = field(default_factory=tuple)


def two_groups(version=1, **g1):
    return R("t", version, groups=(G("g1", leader="b:1", followers=("b:2", "b:3"), **g1),
                                   G("g0", leader="a:1", followers=("a:1", "a:2"))))


def test_publish_and_subscribe_queues_span_groups_in_broker_name_order():
    rt = RouteTable()
    assert rt.apply("t", two_groups(), 0)
    # interleaved: consecutive picks (one per loop pass) change group
    assert rt.publish_queues("t") == [(g, q) for q in range(4) for g in ("g0", "g1")]
    assert sorted(rt.subscribe_queues("t")) == sorted(rt.publish_queues("t"))
    assert not rt.apply("t", two_groups(), 5)  # the same route: nothing changed


def test_a_group_without_leader_or_write_perm_takes_no_sends_but_keeps_its_reads():
    # topicRouteData2TopicPublishInfo: writable and master alive; subscribe info: readable
    rt = RouteTable()
    rt.apply("t", R("t", 1, groups=(
        G("g0", leader=None), G("g1", perm=PERM_READ), G("g2", write_queues=2, read_queues=3))), 0)
    assert rt.publish_queues("t") == [("g2", 0), ("g2", 1)]
    assert rt.subscribe_queues("t") == ([("g0", q) for q in range(4)] + [("g1", q) for q in range(4)]
                                        + [("g2", q) for q in range(3)])


def test_a_failed_fetch_never_removes_a_known_route_and_staleness_follows_the_fetches():
    rt = RouteTable(refresh_interval_ms=30000)
    rt.apply("t", two_groups(), 1000)
    assert rt.stale(30999) == [] and rt.stale(31000) == ["t"]
    rt.fetched("t", 31000)  # the fetch failed (every name server down): the route stays
    assert rt.stale(31000) == [] and rt.publish_queues("t") and rt.known("t")
    rt.fetched("unknown", 0)
    assert not rt.known("unknown") and rt.select("unknown") is None


def test_addresses_leader_first_then_followers():
    rt = RouteTable()
    rt.apply("t", two_groups(), 0)
    assert rt.addresses_of("g0") == ["a:1", "a:2"]  # the leader listed among followers once
    assert rt.addresses_of("g1") == ["b:1", "b:2", "b:3"] and rt.leader_of("g1") == "b:1"
    assert rt.addresses_of("nope") == [] and rt.leader_of("nope") is None


def test_round_robin_covers_every_writable_queue_evenly():
    rt = RouteTable(start=7)
    rt.apply("t", two_groups(), 0)
    picks = Counter(rt.select("t") for _ in range(800))
    assert set(picks) == set(rt.publish_queues("t")) and set(picks.values()) == {100}


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=4), start=st.integers(0, 1000),
       last=st.integers(0, 4))
def test_a_retry_goes_to_another_group_whenever_there_is_one(sizes, start, last):
    """selectOneMessageQueue(lastBrokerName): a queue of another group if any exists, else
    the next queue anyway."""
    rt = RouteTable(start=start)
    rt.apply("t", R("t", 1, groups=tuple(G(f"g{i}", write_queues=n) for i, n in enumerate(sizes))), 0)
    last_broker = f"g{last}"
    q = rt.select("t", last_broker=last_broker)
    writable = {f"g{i}" for i, n in enumerate(sizes) if n}
    if not writable:
        assert q is None
    elif writable - {last_broker}:
        assert q[0] != last_broker
    else:
        assert q[0] == last_broker


def test_not_available_duration_steps():
    # computeNotAvailableDuration over HEAD's tables
    assert [not_available_ms(x) for x in (0, 49, 50, 99, 100, 549, 550, 1799, 1800, 3000, 5000, 10000, 15000, 10**6)] \
        == [0, 0, 0, 0, 0, 0, 2000, 2000, 5000, 6000, 10000, 10000, 30000, 30000]
    assert len(LATENCY_MAX_MS) == len(NOT_AVAILABLE_DURATION_MS)
    with pytest.raises(ValueError):
        RouteTable(latency_max_ms=(1, 2), not_available_duration_ms=(0,))


def test_latency_fault_tolerance_avoids_a_failed_group_for_its_isolation_time():
    rt = RouteTable(latency_fault=True)
    rt.apply("t", two_groups(), 0)
    rt.record("g1", 3, failed=True, now_ms=1000)  # isolation: counts as 10,000 ms -> 10 s
    assert not rt.available("g1", 10999) and rt.available("g1", 11000) and not rt.reachable("g1")
    assert all(rt.select("t", now_ms=5000)[0] == "g0" for _ in range(20))
    rt.record("g1", 1, failed=False, now_ms=6000)  # a fast answer does not shorten the avoidance
    assert not rt.available("g1", 10999) and rt.reachable("g1")
    assert {rt.select("t", now_ms=11000)[0] for _ in range(20)} == {"g0", "g1"}


def test_latency_fault_tolerance_falls_back_to_reachable_then_any():
    rt = RouteTable(latency_fault=True)
    rt.apply("t", two_groups(), 0)
    rt.record("g0", 600, failed=False, now_ms=0)  # slow: 2 s unavailable, still reachable
    rt.record("g1", 0, failed=True, now_ms=0)  # failed: unavailable and unreachable
    assert {rt.select("t", now_ms=100)[0] for _ in range(20)} == {"g0"}  # reachable beats unreachable
    rt.record("g0", 0, failed=True, now_ms=100)
    assert {rt.select("t", now_ms=200)[0] for _ in range(40)} == {"g0", "g1"}  # none usable: any
    off = RouteTable()  # off: records nothing, round robin only
    off.apply("t", two_groups(), 0)
    off.record("g1", 0, failed=True, now_ms=0)
    assert off.available("g1", 0) and {off.select("t")[0] for _ in range(8)} == {"g0", "g1"}


def test_sixteen_queues_over_two_groups_and_three_members_are_owned_once_each():
    """Consumers rebalance over (broker_name, queue_id) with AllocateMessageQueueAveragely."""
    rt = RouteTable()
    rt.apply("t", R("t", 1, groups=(G("g0", read_queues=8), G("g1", read_queues=8))), 0)
    queues = sorted(rt.subscribe_queues("t"))
    members = sorted(["c-a", "c-b", "c-c"])
    owned = [allocate(queues, members, m) for m in members]
    assert sorted(q for o in owned for q in o) == queues  # all 16, each once
    assert sorted(len(o) for o in owned) == [5, 5, 6]
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for _ in range(50):  # any membership: a partition of the queues
        ms = sorted(rng.sample([f"m{i}" for i in range(20)], rng.randint(1, 20)))
        got = [q for m in ms for q in allocate(queues, ms, m)]
        assert sorted(got) == queues, f"seed {seed}: {ms}"


def test_a_groups_addresses_come_from_the_newest_route_that_lists_it():
    rt = RouteTable()
    rt.apply("old", R("old", 1, groups=(G("g0", leader="dead:1", followers=("x:2",)),)), 1000)
    rt.apply("new", R("new", 1, groups=(G("g0", leader="live:1", followers=("x:2",)),)), 2000)
    assert rt.leader_of("g0") == "live:1" and rt.addresses_of("g0")[0] == "live:1"
