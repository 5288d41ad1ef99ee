"""Raft followers index committed entries off the replication path (issue 15, lever 3): on
their tick (raft_follower_dispatch_interval_ms), or at once past
raft_follower_dispatch_lag_bytes_max, and completely when they become leader. Real 3-process
groups on loopback; the followers' dispatch is held back by config so that the new leader
really starts with unindexed entries."""

import time

import pytest

from broker.client import Admin, Consumer, Producer
from ops.cluster import LocalCluster

pytestmark = pytest.mark.slow

TOPIC = "lazy"


def stores(c: LocalCluster) -> dict:
    return {n["id"]: n["store"] for n in c.status()["nodes"] if n.get("store")}


def wait_committed_everywhere(c: LocalCluster, timeout_s: float = 10.0) -> dict:
    """Until every node's confirm offset is the same (the commit index reached the followers)."""
    deadline = time.monotonic() + timeout_s
    while True:
        st = stores(c)
        if len(st) == 3 and len({s["confirm_offset"] for s in st.values()}) == 1:
            return st
        assert time.monotonic() < deadline, st
        time.sleep(0.1)


def read_all(addresses, expect: int) -> list:
    got = []
    with Consumer(addresses, "verify", TOPIC, auto_commit=False) as cons:
        deadline = time.monotonic() + 20
        while len(got) < expect and time.monotonic() < deadline:
            got += cons.poll(timeout_ms=300, max_messages=1000)
    return got


def test_a_new_leader_serves_complete_queues_from_entries_it_never_indexed_as_a_follower(tmp_path, seed):
    c = LocalCluster(tmp_path / "c")
    try:
        # followers never index on their own here, only when they become leader: not on their
        # tick, not past a lag, and not after their store's flushes (every 20 ms here: the
        # commit index, never a flush, decides what a raft member indexes)
        c.up(3, "raft", raft_follower_dispatch_interval_ms=60_000, flush_interval_ms=20,
             raft_follower_dispatch_lag_bytes_max=1 << 40, raft_election_timeout_ms=300)
        old = c.wait_for_leader()
        with Admin(c.addresses) as a:
            a.create_topic(TOPIC, 4)
        acked = {}
        with Producer(c.addresses) as p:
            for k in range(20):
                bodies = [b"m-%d-%d" % (k, i) for i in range(50)]
                for r, body in zip(p.send_batch(TOPIC, bodies, keys=[f"k{k}-{i}" for i in range(50)]), bodies):
                    acked[r.msg_id] = (r.queue_id, r.queue_offset, body)
        st = wait_committed_everywhere(c)
        followers = [n for n in st if n != old]
        # the test means something only if the followers really left their entries unindexed
        assert all(st[n]["dispatched_offset"] < st[n]["confirm_offset"] for n in followers), st
        c.kill(old)
        new = c.wait_for_leader(15, exclude=old)
        got = read_all([n.address for n in c.spec.nodes() if n.id != old], len(acked))
        seen = {m.msg_id: (m.queue_id, m.queue_offset, m.body) for m in got}
        assert len(got) == len(seen) == len(acked) and seen == acked, (len(got), len(acked))
        with Admin([n.address for n in c.spec.nodes() if n.id == new]) as a:
            assert [m.body for m in a.query_by_key(TOPIC, "k7-3")] == [b"m-7-3"]  # the key index too
        # the queue offsets the new leader assigns follow what the old one committed
        last = {}
        for q, off, _ in acked.values():
            last[q] = max(last.get(q, -1), off)
        with Producer([n.address for n in c.spec.nodes() if n.id != old]) as p:
            for i in range(40):
                r = p.send(TOPIC, b"after-%d" % i)
                assert r.queue_offset > last.get(r.queue_id, -1), (r, last)
                last[r.queue_id] = r.queue_offset
    finally:
        c.down()


def test_a_followers_unindexed_lag_stays_under_its_bound(tmp_path):
    bound = 64 << 10
    c = LocalCluster(tmp_path / "c")
    try:
        c.up(3, "raft", raft_follower_dispatch_interval_ms=60_000, raft_follower_dispatch_lag_bytes_max=bound,
             flush_interval_ms=20)
        leader = c.wait_for_leader()
        with Admin(c.addresses) as a:
            a.create_topic(TOPIC, 2)
        with Producer(c.addresses) as p:
            for k in range(40):
                p.send_batch(TOPIC, [bytes(1000)] * 32)  # ~1.3 MiB in all, ~32 KiB an entry
        st = wait_committed_everywhere(c)
        for n, s in st.items():
            if n != leader:
                lag = s["confirm_offset"] - s["dispatched_offset"]
                assert 0 < s["dispatched_offset"] and lag < bound, (n, s)
    finally:
        c.down()
