"""Combined-fault drills (nemesis sequences) on a local 3-node group, raft and master-slave:
the steps run in order inside one fault window, every step is in the report's timeline with
its time, the group is healthy again after the heal, and the history checker and the replica
comparison (unchanged) judge the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra import spec as sp
from ops import deploy
from ops.drill.run import drill
from tests.helpers import local_spec

pytestmark = pytest.mark.slow

MODES = ["raft", "master-slave"]


@pytest.fixture(scope="module", params=MODES)
def cluster(request, tmp_path_factory):
    mode = request.param
    tmp = tmp_path_factory.mktemp(f"combined-{mode}")
    spec = sp.load(local_spec(tmp, "tcomb" + ("ms" if mode == "master-slave" else "raft"), mode=mode))
    try:
        assert deploy.deploy(spec)["status"]["verdict"] == "healthy"
        yield spec
    finally:
        deploy.stop(spec)


EXPECTED_STEPS = {
    # (mode, nemesis): the steps in order (heal steps after them)
    ("raft", "isolated-restart"): ["SIGSTOP", "SIGSTOP", "kill -9", "SIGCONT", "SIGCONT", "wait for a new leader",
                                   "partition", "SIGSTOP", "SIGSTOP", "start"],
    ("master-slave", "isolated-restart"): ["SIGSTOP", "SIGSTOP", "kill -9", "SIGCONT", "SIGCONT", "promote",
                                           "partition", "SIGSTOP", "SIGSTOP", "start"],
    ("raft", "partition-then-kill"): ["partition", "wait for a new leader", "kill -9"],
    ("master-slave", "partition-then-kill"): ["partition", "promote", "kill -9"],
}


@pytest.mark.parametrize("nemesis", ["isolated-restart", "partition-then-kill", "kill-during-transfer"])
def test_combined_drill(cluster, nemesis, seed, tmp_path, request):
    spec = cluster
    mode = spec.groups[0].mode
    r = drill(spec, nemesis, duration_s=12, rate=100, report_dir=tmp_path, seed=seed, fault_s=4, calm_s=1)
    report = json.loads((Path(r["report_dir"]) / "report.json").read_text())
    assert report["faults"], report  # calm 1 s, then 4 s windows (a sequence may run longer)
    for ev in report["faults"]:
        steps = [s["step"] for s in ev["steps"]]
        print(f"\n{mode} {nemesis} seed {seed} at {ev['at_s']}s: {ev['detail']}\n  failover {ev.get('failover')}")
        assert "error" not in ev, ev["error"]  # every step of the scenario ran
        if (mode, nemesis) in EXPECTED_STEPS:
            assert steps[:len(EXPECTED_STEPS[mode, nemesis])] == EXPECTED_STEPS[mode, nemesis], steps
        else:  # kill-during-transfer
            assert steps[:3] == ["transfer leadership", "kill -9", "transfer result"], steps
        times = [s["at_s"] for s in ev["steps"]]
        assert times == sorted(times) and ev["at_s"] <= times[0] and times[-1] <= ev["healed_at_s"]
        assert steps[-1] == "heal" and not any("error" in s for s in ev["steps"] if s["step"] == "heal")
        heal_steps = [s for s in ev["steps"] if s["step"] == "heal"]
        assert ev["heal_began_s"] <= heal_steps[0]["at_s"] and heal_steps[-1]["done_s"] <= ev["healed_at_s"]
        assert ev["heal_s"] == round(ev["healed_at_s"] - ev["heal_began_s"], 3)  # a restart's seconds show
        if mode == "master-slave" and nemesis != "kill-during-transfer":
            assert ev["failover"]["report"]["clean"], ev["failover"]  # promoted in sync, never forced
        assert ev["verdict_after"] == "healthy"
    print(f"  ok {r['ok']} counts {r['counts']}\n  figures {r['figures']}")
    assert r["figures"]["final_verdict"] == "healthy"
    assert Path(r["plot"]).stat().st_size > 10_000
    # the history checker and the replica comparison are the drill's own: no acknowledged send lost
    assert r["ok"], (r["anomalies"], r["counts"])
    assert r["figures"]["reads"] >= r["figures"]["ok"] > 100


def overlapping(seed: int) -> int:
    """The first seed from `seed` on whose first mixed window overlaps two faults (the nemesis
    draws the kind, then whether a second one overlaps it, from the drill's Random)."""
    import random

    from ops.drill.nemesis import KINDS

    while True:
        rng = random.Random(seed)
        rng.choice(KINDS)
        if rng.random() < 0.5:
            return seed
        seed += 1


def test_mixed_overlaps_two_faults(cluster, seed, tmp_path):
    spec = cluster
    mode = spec.groups[0].mode
    seed = overlapping(seed)
    r = drill(spec, "mixed", duration_s=10, rate=100, report_dir=tmp_path, seed=seed, fault_s=3, calm_s=1)
    ev = r["faults"][0]
    print(f"\n{mode} mixed seed {seed}: {ev['detail']}\n  {[(s['step'], s['node'], s.get('fault')) for s in ev['steps']]}"
          f"\n  ok {r['ok']} counts {r['counts']}\n  figures {r['figures']}")
    faults = [s for s in ev["steps"] if "fault" in s]
    assert len(faults) == 2 and faults[1]["overlaps"] == ev["kind"] and "error" not in ev
    assert faults[0]["node"] != faults[1]["node"]
    heal = next(s for s in ev["steps"] if s["step"] == "heal")
    assert faults[0]["at_s"] < faults[1]["at_s"] < heal["at_s"]  # the second came before the first healed
    assert all(e["verdict_after"] == "healthy" for e in r["faults"]) and r["figures"]["final_verdict"] == "healthy"
    assert r["ok"], (r["anomalies"], r["counts"])


def test_a_drill_with_a_librdkafka_workload(cluster, seed, tmp_path):
    """`tidelog drill --workload kafka`: librdkafka (acks=all, idempotence) through the group's
    Kafka listeners while the leader is killed -9 (and, master-slave, the best slave promoted);
    the same history checker and replica comparison judge it."""
    spec = cluster
    r = drill(spec, "kill-leader", duration_s=10, rate=200, report_dir=tmp_path, seed=seed, fault_s=3, calm_s=1,
              workload="kafka")
    print(f"\n{spec.groups[0].mode} kafka workload seed {seed}: ok {r['ok']} counts {r['counts']}\n"
          f"  figures {r['figures']}")
    assert r["workload"]["client"] == "librdkafka"
    assert r["figures"]["ok"] > 1000 and r["figures"]["final_verdict"] == "healthy"
    assert r["ok"], (r["anomalies"], r["counts"])
