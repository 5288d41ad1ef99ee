"""A master that restarts cut off from its group must not take back the lead with an epoch
the promoted master already uses (issue 13, item 1), on real processes.

n0 stores a tail its paused slaves never get (answered FLUSH_SLAVE_TIMEOUT); n0 is killed;
the best slave (n1) is promoted and acknowledges a few more sends (fewer bytes than n0's tail); n1 and n2 are
paused; n0 restarts and reaches nobody; everyone resumes. Before the fix n0 reopened epoch 2
too, its longer log won, and n1 cut the acknowledged sends. Now n0 waits as a slave without a
master until it can hear a quorum, then follows n1 and loses only its unconfirmed tail."""

import asyncio
import random
import signal
import time

import pytest
import uvloop

from broker.client import Admin, Producer
from ops.cluster import LocalCluster
from tests.integration.test_master_slave import (FORK, TOPIC, Load, admin, check_once_in_order, read_all,
                                                 replicas_agree, start_group, wait_caught_up)

pytestmark = pytest.mark.slow


def status_of(c, node):
    return admin([c.node(node).address], Admin.status)


def test_master_restarted_in_isolation_does_not_reuse_the_promoted_epoch(tmp_path, seed):
    rng = random.Random(seed)
    c = LocalCluster(tmp_path / "cluster")
    load = Load(None, rng, window=32, body_max=16384)  # a tail far larger than the socket buffers
    try:
        load.addresses = start_group(c, 3, ha_replication="sync", **FORK)

        async def tail_on_n0():
            task = asyncio.create_task(load.run(3.0))
            await asyncio.sleep(0.8)
            for n in ("n1", "n2"):
                c.kill(n, signal.SIGSTOP)
            await asyncio.sleep(1.4)  # > slave_ack_timeout_ms: sends stored, FLUSH_SLAVE_TIMEOUT
            c.kill("n0")
            for n in ("n1", "n2"):
                c.kill(n, signal.SIGCONT)
            load.stop = True
            await task

        uvloop.run(tail_on_n0())
        assert load.stored_unconfirmed, load.codes  # n0 holds a tail nobody confirmed
        n0_end = None
        time.sleep(0.5)
        ends = {n: status_of(c, n)["store"]["max_offset"] for n in ("n1", "n2")}
        best = max(ends, key=lambda n: (ends[n], n == "n1"))  # the one a promotion accepts
        report = admin([c.node(best).address], lambda a: a.promote(best))
        assert report["clean"] and report["epoch"] == 2, report
        deadline = time.monotonic() + 10
        while status_of(c, best)["replication"].get("in_sync_count", 0) < 2:
            assert time.monotonic() < deadline, "no slave follows the promoted master"
            time.sleep(0.05)
        more = {}
        with Producer([c.node(best).address], retry_times_when_send_failed=0) as p:
            for i in range(5):
                r = p.send(TOPIC, b"after-promotion-%d" % i)
                more[r.msg_id] = (r.queue_id, r.queue_offset, b"after-promotion-%d" % i, time.monotonic())
        load.acked.update(more)
        n1_end = status_of(c, best)["store"]["max_offset"]
        for n in ("n1", "n2"):
            c.kill(n, signal.SIGSTOP)
        try:
            c.restart("n0")  # nobody answers it
            time.sleep(2.0)
            st = status_of(c, "n0")
            n0_end, while_alone = st["store"]["max_offset"], st["replication"]
        finally:
            for n in ("n1", "n2"):
                c.kill(n, signal.SIGCONT)
        assert n0_end > n1_end, "the scenario needs n0's log to be the longer one"
        st = wait_caught_up(c)
        rows = {n["id"]: n["replication"] for n in st["nodes"]}
        got = read_all(c.addresses, len(load.acked))
        replicas_agree(c)
    finally:
        c.down()
    check_once_in_order(load, got)  # nothing acknowledged is lost: the 5 sends after the promotion too
    assert rows[best]["role"] == "master" and rows["n0"]["master"] == best, rows
    # alone, n0 opened no epoch: it waited as a slave without a master, and said why
    assert while_alone["role"] == "slave" and while_alone["master"] is None, while_alone
    assert while_alone["epoch"] == 1 and "members needed" in while_alone["waiting_to_lead"], while_alone
    with open(c.node(best).home + "/broker.log") as f:
        assert "cut this log" not in f.read()
