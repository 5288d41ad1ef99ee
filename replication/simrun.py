"""Many seeds of every simulation, spread over the machine's cores (`make sim-long`).

    python -m replication.simrun [--seeds 10000] [--start S] [--jobs 2] [--only raft|master-slave|namesrv]

The simulations: Raft (replication/raft/sim.py), master-slave (replication/master_slave/sim.py)
and the name servers with the groups that register with them (broker/namesrv/sim.py, whose
`nodes` is the number of name servers).

For each simulation it prints one JSON line: seeds run, violations, seconds, the start seed,
and up to ten failing seeds with their replay commands. Exit 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import sys
import time

# (nodes, share of the seeds, the Sim's options): master-slave's shares with overlap switch
# over often, a switchover starting while another is on; failover_crash kills failovers'
# promoters before they lead; async runs ASYNC masters (cut off now and then, half of them
# fencing themselves)
MIXES = {"raft": [(3, 0.7, {}), (5, 0.3, {})],
         "master-slave": [(3, 0.45, {}), (2, 0.05, {}), (5, 0.05, {}), (3, 0.1, {"failover_crash": 0.5}),
                          (3, 0.1, {"overlap": 0.5}), (5, 0.05, {"overlap": 0.5}),
                          (3, 0.1, {"replication": "async"}), (5, 0.05, {"replication": "async"}),
                          (2, 0.05, {"replication": "async"})],
         "namesrv": [(2, 0.6, {}), (3, 0.4, {})]}
REPLAY = {"raft": "replication.raft.sim", "master-slave": "replication.master_slave.sim",
          "namesrv": "broker.namesrv.sim"}


def run_one(job):
    """job: (kind, seed, nodes) or (kind, seed, nodes, the Sim's keyword options)."""
    kind, seed, nodes, *opts = job
    if kind == "raft":
        from replication.raft.sim import SafetyViolation, Sim
    elif kind == "namesrv":
        from broker.namesrv.sim import SafetyViolation, Sim
    else:
        from replication.master_slave.sim import SafetyViolation, Sim
    try:
        Sim(seed, nodes, **(opts[0] if opts else {})).run()
        return None
    except SafetyViolation as e:
        return seed, nodes, str(e)[:300]
    except Exception as e:  # a crash of a core is a failure too
        return seed, nodes, f"{type(e).__name__}: {e}"[:300]


def run_jobs(jobs: list, procs: int) -> list:
    """The failures (seed, nodes, why) of (kind, seed, nodes[, options]) jobs run over
    `procs` processes, sorted."""
    with mp.get_context("fork").Pool(procs) as pool:
        return sorted(f for f in pool.imap_unordered(run_one, jobs, chunksize=20) if f)


def first_caught(kind: str, nodes: int = 3, limit: int = 200, **opts):
    """(seed, why) of the first failing seed from 0, in this process (so a test's monkeypatched
    rule applies), or None."""
    for seed in range(limit):
        f = run_one((kind, seed, nodes, opts))
        if f:
            return seed, f[2]
    return None


def replay(kind: str, seed: int, nodes: int, **opts) -> str:
    return f".venv/bin/python -m {REPLAY[kind]} --seed {seed} --nodes {nodes} --verbose" + \
        "".join(f" --{k} {v}" for k, v in opts.items())


def jobs_for(kind: str, start: int, count: int) -> list:
    out, seed = [], start
    for i, (nodes, share, opts) in enumerate(MIXES[kind]):
        n = count - len(out) if i == len(MIXES[kind]) - 1 else round(count * share)
        out += [(kind, s, nodes, opts) for s in range(seed, seed + n)]
        seed += n
    return out


def run(kind: str, start: int, count: int, jobs: int) -> dict:
    t0 = time.monotonic()
    todo = jobs_for(kind, start, count)
    opts = {(seed, nodes): o for _, seed, nodes, o in todo}  # (each seed is run once)
    failures = run_jobs(todo, jobs)
    return {"sim": kind, "seeds": count, "violations": len(failures), "seconds": round(time.monotonic() - t0, 1),
            "start": start, "jobs": jobs,
            "failures": [{"seed": s, "nodes": n, "why": why, "options": opts[s, n],
                          "replay": replay(kind, s, n, **opts[s, n])}
                         for s, n, why in failures[:10]]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10_000, help="seeds per simulation")
    ap.add_argument("--start", type=int, default=None, help="first seed (default: random, printed)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", choices=sorted(MIXES))
    a = ap.parse_args(argv)
    start = a.start if a.start is not None else random.randrange(10**9)
    bad = 0
    for kind in ([a.only] if a.only else list(MIXES)):
        r = run(kind, start, a.seeds, a.jobs)
        bad += r["violations"]
        print(json.dumps(r), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
