"""`tidelog group list|describe` and Admin.list_groups/describe_group: offsets, lag, members."""

import json
import time

import pytest

from broker.client import Admin, BrokerError, Consumer, Producer
from broker.protocol.codes import Code

from ..helpers import BrokerThread, run_tidelog

N, QUEUES, READ = 40, 4, 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    with BrokerThread(tmp_path_factory.mktemp("groups") / "b") as b:
        with Admin([b.address]) as a:
            a.create_topic("orders", QUEUES)
        with Producer([b.address]) as p:
            for i in range(N):
                p.send("orders", b"m%d" % i)  # round robin: N / QUEUES per queue
        yield b


@pytest.fixture(scope="module")
def billing(broker):
    """The group `billing` read READ messages and committed; queue -> its committed offset."""
    committed = {q: 0 for q in range(QUEUES)}
    with Consumer([broker.address], "billing", "orders") as c:
        got = []
        deadline = time.monotonic() + 20
        while len(got) < READ and time.monotonic() < deadline:
            got += c.poll(timeout_ms=300, max_messages=READ - len(got))
        c.commit()
    assert len(got) == READ
    for m in got:
        committed[m.queue_id] = max(committed[m.queue_id], m.queue_offset + 1)
    return committed


def test_describe_shows_the_exact_lag_per_queue_and_in_total(broker, billing):
    with Admin([broker.address]) as a:
        d = a.describe_group("billing")
    assert d["group"] == "billing" and d["lag"] == N - READ
    rows = {q["queue_id"]: q for q in d["queues"]}
    assert sorted(rows) == list(range(QUEUES))
    for q, row in rows.items():
        assert row["topic"] == "orders" and row["broker_offset"] == N // QUEUES
        assert row["committed_offset"] == billing[q] and row["lag"] == N // QUEUES - billing[q]
    assert d["members"] == []  # the consumer left when it closed

    p = run_tidelog("group", "describe", "billing", "-b", broker.address, "--json")
    assert json.loads(p.stdout) == d | {"members": []}
    text = run_tidelog("group", "describe", "billing", "-b", broker.address).stdout
    assert f"group billing: lag {N - READ}" in text
    for q in range(QUEUES):  # topic, queue, broker offset, committed, lag, owner
        assert ["orders", str(q), str(N // QUEUES), str(billing[q]), str(N // QUEUES - billing[q]), "-"] \
            in [line.split() for line in text.splitlines()]


def test_group_list(broker, billing):
    with Admin([broker.address]) as a:
        groups = {g.group: g for g in a.list_groups()}
    assert groups["billing"].lag == N - READ and groups["billing"].topics == ["orders"]
    text = run_tidelog("group", "list", "-b", broker.address).stdout
    assert ["billing", "orders", "0", str(N - READ)] in [line.split() for line in text.splitlines()]


def test_two_members_own_disjoint_queues_covering_all(broker):
    kw = dict(heartbeat_interval_ms=200, auto_commit=False)
    with Consumer([broker.address], "pair", "orders", **kw) as c1, \
            Consumer([broker.address], "pair", "orders", **kw) as c2:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            c1.poll(timeout_ms=50)
            c2.poll(timeout_ms=50)
            a1, a2 = c1.assignment(), c2.assignment()
            if a1 and a2 and sorted(a1 + a2) == list(range(QUEUES)):
                break
        with Admin([broker.address]) as a:
            d = a.describe_group("pair", topic="orders")
    members = {m["client_id"]: m for m in d["members"]}
    assert set(members) == {c1.client_id, c2.client_id}
    owned = [members[c.client_id]["owns"]["orders"] for c in (c1, c2)]
    assert owned == [a1, a2]  # what the consumers themselves took
    assert not set(owned[0]) & set(owned[1]) and sorted(owned[0] + owned[1]) == list(range(QUEUES))
    assert all(m["address"].startswith("127.0.0.1:") and m["last_heartbeat_ms_ago"] < 20_000
               for m in members.values())
    assert {q["owner"] for q in d["queues"]} == set(members)


def test_unknown_group_is_a_clear_error(broker, billing):
    with Admin([broker.address]) as a:
        with pytest.raises(BrokerError) as e:
            a.describe_group("g9")
    assert e.value.code == Code.SUBSCRIPTION_GROUP_NOT_EXIST and "no consumer group 'g9' (groups you may use: " in str(e.value)
    p = run_tidelog("group", "describe", "g9", "-b", broker.address, check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert p.stderr.splitlines()[0].startswith("error: SUBSCRIPTION_GROUP_NOT_EXIST: no consumer group 'g9' "
                                               "(groups you may use: billing")


@pytest.mark.slow
def test_raft_group_is_described_by_the_leader_when_a_follower_is_asked(tmp_path):
    from ops.cluster import LocalCluster

    c = LocalCluster(tmp_path / "cluster")
    try:
        c.up(3, "raft", "async", message_body_bytes_max=64 << 10, raft_election_timeout_ms=1500)
        leader = c.wait_for_leader()
        followers = [n.address for n in c.nodes if n.id != leader]
        with Admin(followers) as a:
            a.create_topic("orders", QUEUES)
        with Producer(followers) as p:
            for i in range(N):
                p.send("orders", b"m%d" % i)
        with Consumer(followers, "billing", "orders") as cons:
            got = []
            deadline = time.monotonic() + 20
            while len(got) < READ and time.monotonic() < deadline:
                got += cons.poll(timeout_ms=300, max_messages=READ - len(got))
            cons.commit()  # committed through the log: acknowledged once a quorum holds it
        with Admin(followers[:1]) as a:  # NOT_LEADER is followed to the leader
            d = a.describe_group("billing")
        assert d["lag"] == N - READ and sum(q["broker_offset"] for q in d["queues"]) == N
    finally:
        c.down()
