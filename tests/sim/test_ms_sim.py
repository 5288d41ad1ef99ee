"""Thousands of seeded master-slave simulations (2, 3 and 5 nodes) with storage faults,
pauses, partitions, the scripted restart-in-isolation and lagging-failover sequences, and
every checker on (replication/master_slave/sim.py).

A failure names its seeds; replay one with
    .venv/bin/python -m replication.master_slave.sim --seed SEED --nodes N --verbose
Set TIDELOG_SEED to choose where the seed ranges start (a random start otherwise)."""

import os
import random

import pytest

from replication import simrun
from replication.master_slave import core as C
from replication.master_slave import roles
from replication.simrun import replay, run_jobs

pytestmark = pytest.mark.slow

OVERLAP = {"overlap": 0.5}  # switchovers often, one starting half the time while another is on
# (nodes, seeds, the Sim's options): 2,000 in all, and 700 with overlapping switchovers
RUNS = [(3, 1400, {}), (2, 300, {}), (5, 300, {}), (3, 400, OVERLAP), (5, 200, OVERLAP), (2, 100, OVERLAP)]


@pytest.mark.parametrize("nodes, count, opts", RUNS)
def test_many_seeds(nodes, count, opts):
    start = int(os.environ.get("TIDELOG_SEED") or random.randrange(10**9))
    print(f"seeds {start}..{start + count - 1}, {nodes} nodes {opts} (TIDELOG_SEED={start} replays them)")
    failures = run_jobs([("master-slave", s, nodes, opts) for s in range(start, start + count)],
                        min(2, os.cpu_count() or 1))
    assert not failures, "\n".join(f"seed {s} ({n} nodes): {why}\n  replay: {replay('master-slave', s, n, **opts)}"
                                   for s, n, why in failures[:10])


def first_caught(limit=200):
    return simrun.first_caught("master-slave", 3, limit)


def test_a_restarted_master_that_may_reuse_an_epoch_is_caught(monkeypatch):
    """The mutation check: the rule before issue 13 (a restarting master opens an epoch from
    whatever it can see, needing no one) must be caught, within a few seeds."""
    def old_rule(me, views, members):
        target = roles.whom_to_follow(me, views)
        return ("follow", target) if target else ("open", roles.new_epoch(me, views))

    monkeypatch.setattr(roles, "restart_decision", old_rule)
    monkeypatch.setattr(roles, "restart_quorum", lambda n: 1)
    caught = first_caught()
    assert caught and "led" in caught[1], caught
    print(f"caught at seed {caught[0]}: {caught[1]}")


def test_a_promotion_that_ignores_the_safety_checks_is_caught(monkeypatch):
    monkeypatch.setattr(roles, "promotion_problems", lambda facts: [])
    caught = first_caught()
    assert caught and "without acknowledged" in caught[1], caught
    print(f"caught at seed {caught[0]}: {caught[1]}")


def test_epoch_promises_matter(monkeypatch):
    """Without the quorums (an epoch opened by its master alone) the sim finds two masters
    writing under one epoch."""
    monkeypatch.setattr(roles, "promotion_quorum", lambda n: 1)
    monkeypatch.setattr(roles, "restart_quorum", lambda n: 1)
    caught = first_caught()
    assert caught, "no seed caught masters that open epochs alone"
    print(f"caught at seed {caught[0]}: {caught[1]}")


def test_a_master_whose_switchover_fence_lapses_and_takes_writes_again_is_caught(monkeypatch):
    """The mutation check for the lapse rule (NodeCore.tick): a fenced master whose
    switchover never told it the outcome took writes again in its epoch (the rule before
    2026-11-28) while the promoted node led a new one without them."""
    def old_rule(self, now_ms):
        self.fences.clear()  # "the switchover did not complete in time: taking writes again"
        return []

    monkeypatch.setattr(C.NodeCore, "fence_lapsed", old_rule)
    caught = first_caught()
    assert caught and "without acknowledged" in caught[1], caught
    print(f"caught at seed {caught[0]}: {caught[1]}")


def test_a_switchover_that_ignores_an_epoch_opened_since_its_fence_is_caught(monkeypatch):
    """The mutation check for roles.seen_since_fence: the fenced master restarted, opened a
    new epoch and acknowledged sends in it; the promoter, caught up to the old end, recorded
    a later epoch and led without them. Seed 484 (5 nodes) was found by searching seeds from
    0 with the rule off (`simrun.first_caught("master-slave", 5, 1000)`: re-find it so if the
    sim's random draws change); it must pass with the rule on."""
    job = ("master-slave", 484, 5)
    assert simrun.run_one(job) is None, replay(*job)
    monkeypatch.setattr(roles, "seen_since_fence", lambda seen, fenced: False)
    caught = simrun.run_one(job)
    assert caught and "without acknowledged" in caught[2], caught


def test_a_switchover_that_lifts_another_ones_fence_is_caught(monkeypatch):
    """The mutation check for fence ids (NodeCore.fence): with one fence per master, as before
    2026-11-28, a second switchover's fence replaced the first's (and put off its lapse), then
    gave up and lifted it: the master acknowledged sends that the first, caught up to the end
    it was told, led without (seed 284, 3 nodes, found by `simrun.first_caught("master-slave", 3, 1000, overlap=0.5)` with the
    rule off: re-find it so if the sim's random draws change). It must pass with the rule on."""
    job = ("master-slave", 284, 3, OVERLAP)
    assert simrun.run_one(job) is None, replay(*job[:3], **OVERLAP)

    def one_fence(self, ms, now_ms, fence_id=None):
        if self.role != roles.MASTER:
            raise C.Refused(f"{self.me} is not the master")
        self.fences.clear()  # any lift lifts it, any fence replaces it
        if ms:
            self.fences[None] = now_ms + ms

    monkeypatch.setattr(C.NodeCore, "fence", one_fence)
    caught = simrun.run_one(job)
    assert caught and "without acknowledged" in caught[2], caught


def test_a_switchover_to_a_slave_whose_log_is_only_long_enough_is_caught(monkeypatch):
    """The mutation check for roles.holds_log_of: a slave that had written a tail of its own as
    master (epoch 6), came back following the new master, and was switched over to before that
    master told it where to cut, passed the length check (its log reached the fenced end) and
    led without the acknowledged sends the master held at those offsets (seed 743220988,
    3 nodes, found by test_many_seeds with overlapping switchovers). It must pass with the
    rule on."""
    job = ("master-slave", 743220988, 3, OVERLAP)
    assert simrun.run_one(job) is None, replay(*job[:3], **OVERLAP)
    monkeypatch.setattr(roles, "holds_log_of", lambda mine, my_end, master, end: my_end >= end)
    caught = simrun.run_one(job)
    assert caught and "without acknowledged" in caught[2], caught
