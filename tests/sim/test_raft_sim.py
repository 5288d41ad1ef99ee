"""Thousands of seeded Raft simulations (3 and 5 nodes) with every checker on.

A failure names its seeds; replay one with
    .venv/bin/python -m replication.raft.sim --seed SEED --nodes N --verbose
Set TIDELOG_SEED to choose where the seed ranges start (a random start otherwise)."""

import multiprocessing as mp
import os
import random

import pytest

from replication.raft.sim import SafetyViolation, Sim

pytestmark = pytest.mark.slow

RUNS = [(3, 1500), (5, 600)]  # (nodes, seeds)


def run_one(args):
    seed, nodes = args
    try:
        Sim(seed, nodes).run()
        return None
    except SafetyViolation as e:
        return seed, nodes, str(e)[:300]
    except Exception as e:  # a crash of the core is a failure too
        return seed, nodes, f"{type(e).__name__}: {e}"[:300]


@pytest.mark.parametrize("nodes, count", RUNS)
def test_many_seeds(nodes, count):
    start = int(os.environ.get("TIDELOG_SEED") or random.randrange(10**9))
    jobs = [(s, nodes) for s in range(start, start + count)]
    with mp.get_context("fork").Pool(min(2, os.cpu_count() or 1)) as pool:
        failures = [f for f in pool.imap_unordered(run_one, jobs, chunksize=20) if f]
    assert not failures, "\n".join(
        f"seed {s} ({n} nodes): {why}\n  replay: .venv/bin/python -m replication.raft.sim "
        f"--seed {s} --nodes {n} --verbose" for s, n, why in sorted(failures)[:10])


def test_a_failing_seed_is_reported_with_its_replay(monkeypatch):
    """The harness itself: a broken core must be caught (here: votes ignore log freshness)."""
    from replication.raft import node as raft_node

    monkeypatch.setattr(raft_node.RaftNode, "_log_ok", lambda self, i, t: True)
    failures = [f for f in map(run_one, [(s, 3) for s in range(40)]) if f]
    assert failures and "committed" in failures[0][2]
