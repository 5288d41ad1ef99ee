"""Thousands of seeded name-server simulations (broker/namesrv/sim.py): 2 and 3 name servers,
groups of raft (3, 5), master-slave (2, 3) and standalone nodes registering through the real
RegistrarCore, forgers with real certificates, lost and slow messages, connection closes,
expiries and name-server restarts; the checkers of docs/design/name-server.md §10 after every
change, and convergence after the last fault and after a quiet failover.

A failure names its seeds; replay one with
    .venv/bin/python -m broker.namesrv.sim --seed SEED --nodes N --verbose
Set TIDELOG_SEED to choose where the seed ranges start (a random start otherwise).

The mutation checks put back, one at a time, what the rules replaced, and each must be caught
within a few seeds: no group in the certificate (issue 39 item 2's hijack), RocketMQ's "the
highest claim wins" (the same, within a group), no fence, vouching by rank alone (who is
followed not said), the fence raised by a claim no other node vouched for (a lone forger holds
the real leader off), the term-majority rule first proposed for issue 39 (a forger alone once
fences the group), and a registrar that re-registers only on role changes.
"""

import os
import random

import pytest

from broker.namesrv import core as C
from broker.namesrv.sim import SafetyViolation, Sim
from broker.registrar_core import RegistrarCore
from replication import simrun
from replication.simrun import replay, run_jobs

pytestmark = pytest.mark.slow

RUNS = [(2, 1200), (3, 800)]  # (name servers, seeds): 2,000 in all
LIMIT = 60  # a broken rule must be caught within this many seeds


@pytest.mark.parametrize("nodes, count", RUNS)
def test_many_seeds(nodes, count):
    start = int(os.environ.get("TIDELOG_SEED") or random.randrange(10**9))
    print(f"seeds {start}..{start + count - 1}, {nodes} name servers (TIDELOG_SEED={start} replays them)")
    failures = run_jobs([("namesrv", s, nodes) for s in range(start, start + count)], min(2, os.cpu_count() or 1))
    assert not failures, "\n".join(f"seed {s} ({n} name servers): {why}\n  replay: {replay('namesrv', s, n)}"
                                   for s, n, why in failures[:10])


def test_a_seed_replays_the_same_run():
    assert Sim(7, 3).run() == Sim(7, 3).run()


def test_a_failure_prints_its_replay_line(monkeypatch):
    monkeypatch.setattr(C, "refusal", lambda broker_name, node_id, member, group: None)
    with pytest.raises(SafetyViolation, match=r"replay: \.venv/bin/python -m broker\.namesrv\.sim --seed \d+ --nodes 2"):
        for seed in range(LIMIT):
            Sim(seed, 2).run()


def caught(what: str):
    got = simrun.first_caught("namesrv", 2, LIMIT)
    assert got, f"no seed of {LIMIT} caught {what}"
    print(f"{what}: caught at seed {got[0]}: {got[1]}")
    return got[1]


def test_no_group_in_the_certificate_is_caught(monkeypatch):
    """Issue 39 item 2 as it was: the certificate proved the node, not its group."""
    real = C.refusal
    monkeypatch.setattr(C, "refusal", lambda broker_name, node_id, member, group: real(broker_name, node_id,
                                                                                        member, broker_name))
    assert "whose certificate names" in caught("registrations without a group pin")


def test_the_highest_claim_winning_is_caught(monkeypatch):
    """RocketMQ's stateVersion rule, which the name server had: any claim above the leader's
    term took the group, up to 2^63-1."""
    def highest(nodes, incumbent, fence):
        claims = [x for x in nodes if x.claims]
        top = max((x.rank for x in claims), default=None)
        best = [x.node_id for x in claims if x.rank == top]
        return (incumbent if incumbent in best else (best[0] if best else None)), fence

    monkeypatch.setattr(C, "choose_leader", highest)
    assert "forger" in caught("the highest claim winning")


def test_no_fence_is_caught(monkeypatch):
    real = C.choose_leader
    monkeypatch.setattr(C, "choose_leader", lambda nodes, incumbent, fence: real(nodes, incumbent, C.NO_RANK))
    assert "followed a leader at" in caught("no fence")


def test_vouching_by_rank_alone_is_caught(monkeypatch):
    """Followers counted for any claimant of their term: a node taken out of the group claims
    leadership of the term the group is in, and the followers of its real leader confirm it."""
    monkeypatch.setattr(C, "vouchers", lambda nodes, x: sum(1 for n in nodes if n is x or (not n.claims and
                                                                                         n.rank == x.rank)))
    assert "forger" in caught("vouching by rank alone")


def test_a_fence_raised_by_one_node_is_caught(monkeypatch):
    """A lone claimant's rank as the fence: a forger registered alone for a moment (a name
    server just restarted) would hold the group's real leader off for as long as the group
    stays registered."""
    real = C.choose_leader

    def lone_fence(nodes, incumbent, fence):
        nodes = list(nodes)
        leader, fence = real(nodes, incumbent, fence)
        if leader is not None:
            fence = max(fence, next(x.rank for x in nodes if x.node_id == leader))
        return leader, fence

    monkeypatch.setattr(C, "choose_leader", lone_fence)
    assert "routed to None" in caught("a fence one node raised")


def test_the_term_majority_rule_is_caught(monkeypatch):
    """The rule first proposed: the rank more than half of the registered nodes report, a leader
    claim of exactly that rank, the highest such rank ever as the fence."""
    def term_majority(nodes, incumbent, fence):
        nodes = list(nodes)
        ranks = sorted((x.rank for x in nodes), reverse=True)
        confirmed = ranks[len(ranks) // 2]
        fence = max(fence, confirmed)
        ok = [x.node_id for x in nodes if x.claims and x.rank == confirmed]
        return (ok[0] if len(ok) == 1 else incumbent if incumbent in ok else None), fence

    monkeypatch.setattr(C, "choose_leader", term_majority)
    caught("the term-majority rule")


def test_a_registrar_that_waits_for_its_period_is_caught(monkeypatch):
    """Only role changes re-registering at once: the followers of a new leader say they follow
    it a register_interval_ms later, and the failover's reroute waits for that."""
    monkeypatch.setattr(RegistrarCore, "observe", lambda self, standing, now_ms: False)
    assert "after a failover with no fault" in caught("a registrar deaf to its standing")
