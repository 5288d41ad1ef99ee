"""Thousands of seeded Raft simulations (3 and 5 nodes) with storage faults (power loss with
torn writes, also mid-Ready; kill -9; failing fsyncs) and every checker on. Each node's Ready
goes through ready.py's apply_ready, the broker driver's own order.

A failure names its seeds; replay one with
    .venv/bin/python -m replication.raft.sim --seed SEED --nodes N --verbose
Set TIDELOG_SEED to choose where the seed ranges start (a random start otherwise)."""

import os
import random

import pytest

from replication import simrun
from replication.raft import sim as raft_sim
from replication.simrun import replay, run_jobs

pytestmark = pytest.mark.slow

RUNS = [(3, 1500), (5, 600)]  # (nodes, seeds): 2,100 in all
# (seed, nodes) that once caught a bug, kept so its fix stays tested:
CAUGHT = [(942976488, 3),  # a follower restarted its log at a resent TRUNCATE after a power cut took its tail
          (816333782, 3)]  # a vote granted while the lease promised to a leader held (a term change forgot it)


@pytest.mark.parametrize("nodes, count", RUNS)
def test_many_seeds(nodes, count):
    start = int(os.environ.get("TIDELOG_SEED") or random.randrange(10**9))
    print(f"seeds {start}..{start + count - 1}, {nodes} nodes (TIDELOG_SEED={start} replays them)")
    failures = run_jobs([("raft", s, nodes) for s in range(start, start + count)], min(2, os.cpu_count() or 1))
    assert not failures, "\n".join(f"seed {s} ({n} nodes): {why}\n  replay: {replay('raft', s, n)}"
                                   for s, n, why in failures[:10])


@pytest.mark.parametrize("seed, nodes", CAUGHT)
def test_seeds_that_once_caught_a_bug(seed, nodes):
    assert simrun.run_one(("raft", seed, nodes)) is None, replay("raft", seed, nodes)


def first_caught(limit=200):
    return simrun.first_caught("raft", 3, limit)


def test_a_failing_seed_is_reported_with_its_replay(monkeypatch):
    """The harness itself: a broken core must be caught (here: votes ignore log freshness)."""
    from replication.raft import node as raft_node

    monkeypatch.setattr(raft_node.RaftNode, "_log_ok", lambda self, i, t: True)
    caught = first_caught(40)
    assert caught and "committed" in caught[1], caught


def test_acks_sent_before_the_fsync_are_caught(monkeypatch):
    """The mutation check for the driver's order: ports that let a follower's ack out before
    the flusher made what it acknowledges durable. A power loss then takes an entry a quorum
    counted, and a leader without it is elected."""
    monkeypatch.setattr(raft_sim.SimPorts, "unsynced_mark", lambda self: None)
    caught = first_caught()
    assert caught and "committed" in caught[1], caught
    print(f"caught at seed {caught[0]}: {caught[1]}")


def test_sending_before_persisting_is_caught(monkeypatch):
    """The same for an apply_ready that sends a Ready's messages before anything of it is
    persisted (votes before the hard state, acks before the log)."""
    real = raft_sim.apply_ready

    class Sent:
        def __init__(self, node, r):
            self.node, self.r = node, r

        def ready(self):
            return self.r

        @property
        def is_leader(self):
            return self.node.is_leader

    def sends_first(node, ports):
        r = node.ready()
        for to, msg in r.messages:
            ports.send(to, msg)
        r.messages = []
        return real(Sent(node, r), ports)

    monkeypatch.setattr(raft_sim, "apply_ready", sends_first)
    caught = first_caught()
    assert caught, "no seed caught messages sent before their writes were persisted"
    print(f"caught at seed {caught[0]}: {caught[1]}")


def test_a_read_lease_that_ignores_a_leadership_handoff_is_caught(monkeypatch):
    """Issue 13, item 8: the read lease must end when the leader sends TimeoutNow (its
    target may win at once, with votes the lease counted on). A lease without that rule is
    caught by the sim's lease checker: a deposed leader still serving reads."""
    from replication.raft import leader as raft_leader
    from replication.raft.quorum import majority

    def lease_end_tick(self):
        cfg = self.node.cfg
        need = majority(len(cfg.voters)) - 1
        if need <= 0:
            return raft_leader.FOREVER
        sent = sorted((p.answered_sent_tick for p in self.progress.values()), reverse=True)
        return sent[need - 1] + cfg.election_ticks - raft_leader.lease_margin_ticks(cfg.election_ticks)

    monkeypatch.setattr(raft_leader.LeaderSide, "lease_end_tick", lease_end_tick)
    caught = first_caught()
    assert caught and "read lease" in caught[1], caught
    print(f"caught at seed {caught[0]}: {caught[1]}")


# --- lazy ticks: an idle node sleeps through the ticks its core calls quiet ------------------

LAZY_RUNS = [(3, 200), (5, 100)]  # (nodes, seeds), each run twice: a tick per step, and lazy


@pytest.mark.parametrize("nodes, count", LAZY_RUNS)
def test_lazy_ticks_give_the_same_runs(nodes, count):
    """The broker's driver sleeps through a node's quiet ticks (RaftNode.quiet_ticks) and runs
    them before the node's next input. With quiet_ticks right, that is the same run as a tick
    per step, message for message, whatever the faults (and the lease checker sees each lazy
    leader's lease as it will be once it runs the ticks it owes)."""
    start = int(os.environ.get("TIDELOG_SEED") or random.randrange(10**9))
    print(f"seeds {start}..{start + count - 1}, {nodes} nodes (TIDELOG_SEED={start} replays them)")
    for seed in range(start, start + count):
        diff = raft_sim.lazy_ticks_differ(seed, nodes)
        assert diff is None, (f"seed {seed} ({nodes} nodes): {diff}\n  replay: .venv/bin/python -m "
                              f"replication.raft.sim --seed {seed} --nodes {nodes} --compare-lazy")


def first_lazy_difference(limit: int = 60):
    for seed in range(limit):
        diff = raft_sim.lazy_ticks_differ(seed, 3)
        if diff:
            return seed, diff
    return None


def test_a_follower_that_sleeps_past_its_election_timeout_is_caught(monkeypatch):
    """Mutation check of the comparison: a follower that calls one tick too many quiet
    campaigns a tick late, and the runs part."""
    from replication.raft import node as raft_node
    real = raft_node.RaftNode.quiet_ticks

    def one_too_many(self):
        q = real(self)
        return q + 1 if self.role != raft_node.Role.LEADER else q

    monkeypatch.setattr(raft_node.RaftNode, "quiet_ticks", one_too_many)
    caught = first_lazy_difference()
    assert caught, "no seed caught a follower sleeping through its election timeout"
    print(f"caught at seed {caught[0]}: {caught[1]}")


def test_a_leader_that_sleeps_with_a_commit_index_unsaid_is_caught(monkeypatch):
    """The same for a leader that sleeps although a follower has not been told the commit
    index (tick() would send it alone): its COMMIT push leaves late."""
    from replication.raft import leader as raft_leader
    from replication.raft.progress import State

    def ignores_commit_sent(self):
        node, cfg = self.node, self.node.cfg
        if self.transfer is not None:
            return 0
        last = node.log.last_index()
        if any(p.state != State.APPEND or p.write_index <= last or p.pending for p in self.progress.values()):
            return 0
        return max(0, cfg.heartbeat_ticks - self._since_heartbeat - 1)

    monkeypatch.setattr(raft_leader.LeaderSide, "quiet_ticks", ignores_commit_sent)
    caught = first_lazy_difference()
    assert caught, "no seed caught a leader sleeping with a commit index to send"
    print(f"caught at seed {caught[0]}: {caught[1]}")
