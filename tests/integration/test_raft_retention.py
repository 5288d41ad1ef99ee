"""A real 3-process raft group: a follower cut off from its leader for less than an election
timeout (so it keeps its leader and asks for nothing) while the leader's retention deletes the
segments it needs; once the link heals, the leader resets it at its first retained entry
and it catches up (it used to stall there for good)."""

import time

import pytest

from broker.client import Admin, Producer
from ops.cluster import LocalCluster

pytestmark = pytest.mark.slow


def raft_view(c: LocalCluster) -> dict:
    return {n["id"]: n["replication"] for n in c.status()["nodes"]}


def test_follower_behind_the_leaders_retention_is_reset_and_catches_up(tmp_path):
    c = LocalCluster(tmp_path / "cluster")
    try:
        # every retention check deletes what it may (force threshold ~0): only the segment
        # being written survives on each node, whoever still needs the others
        c.up(3, "raft", "async", segment_bytes=64 << 10, message_body_bytes_max=8 << 10,
             raft_election_timeout_ms=6000, raft_heartbeat_interval_ms=200, raft_push_timeout_ms=300,
             retention_check_interval_ms=100, disk_usage_ratio_clean=1e-6, disk_usage_ratio_force=1e-6,
             flush_interval_ms=50)
        # a long election timeout (the cut must stay shorter), and a node's first message to
        # a peer it has no connection to yet is dropped: the first election can take 2-3 rounds
        lead = c.wait_for_leader(45)
        lag = next(n.id for n in c.nodes if n.id != lead)
        addr = {n.id: n.address for n in c.nodes}
        with Producer([addr[lead]]) as p:
            for i in range(20):
                p.send("t", b"before-%d" % i)
            with Admin(c.addresses) as a:
                a.set_faults(addr[lead], drop_peers=[lag])
                a.set_faults(addr[lag], drop_peers=[lead])
                t0 = time.monotonic()
                for i in range(400):  # ~6 segments of 64 KiB
                    p.send("t", b"cut-%d-" % i + b"x" * 1000)
                deadline = time.monotonic() + 4
                while True:  # the leader's retention deleted what the lagger needs next
                    view = raft_view(c)
                    if view[lead]["begin_index"] > view[lag]["end_index"] + 1:
                        break
                    assert time.monotonic() < deadline, view
                    time.sleep(0.1)
                assert time.monotonic() - t0 < 5.5, "took too long: the lagger may have campaigned"
                assert view[lag]["leader"] == lead and view[lag]["term"] == view[lead]["term"]
                a.set_faults(addr[lead])
                a.set_faults(addr[lag])
            p.send("t", b"after")
        deadline = time.monotonic() + 20
        while True:
            view = raft_view(c)
            if view[lag]["end_index"] == view[lead]["end_index"] \
                    and view[lag]["commit_index"] == view[lead]["commit_index"]:
                break
            assert time.monotonic() < deadline, f"the follower stalled: {view}"
            time.sleep(0.1)
        assert c.wait_for_leader(45) == lead and view[lag]["term"] == view[lead]["term"]
    finally:
        c.down()
