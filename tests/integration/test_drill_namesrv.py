"""Drills on a cluster with name servers (issue 16): 2 raft groups x 3 nodes behind 2 name
servers, secure, as `tidelog cluster up --groups 2 --namesrv 2` makes it. The workload runs
through the name servers (ClusterProducer) on both groups; the drain reads each group directly.

- kill-namesrv: every name server SIGKILLed for the fault window, then restarted: sends to the
  known routes go on (acknowledgements in the window, no long gap), nothing acknowledged is
  lost, the name servers route both groups again after the heal;
- kill-leader aimed at g1 (`group="g1"`): only g1's leader is killed, g1 gets a new leader,
  the workload (on both groups) loses nothing, and the report names g1;
- kill-namesrv-and-leader aimed at g1: the name servers down, then g1's leader: the clients must
  find g1's new leader from the member addresses they know.

The figures (time to a new leader, longest gap between acks, acked / lost) are printed for the
closing note. Every process is stopped by LocalCluster.down, and by pid after a failure.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from ops.cluster import LocalCluster
from ops.drill.run import drill
from ops.localbroker import pid_alive

pytestmark = pytest.mark.slow

RATE = 100
DURATION_S = 9  # calm 1 s, one 4 s fault window, heal, calm


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = LocalCluster(tmp_path_factory.mktemp("drillns") / "c")
    pids: list[int] = []
    try:
        c.up(3, "raft", wait=True, groups=2, namesrv=2)
        pids = [n.pid for n in c.nodes + c.namesrvs]
        assert len(pids) == 8 and all(pids), pids
        warm_up(c)
        yield c
    finally:
        try:
            pids += [n.pid for n in c.nodes + c.namesrvs]  # restarted by a drill: new pids
            c.down()
        except Exception:  # noqa: BLE001 - `up` failed before it wrote the spec, or down failed: by pid below
            pass
        for pid in pids:
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def warm_up(c: LocalCluster, seconds: float = 3.0) -> None:
    """A freshly deployed cluster's first writes stalled every send for 1.5-4 s on the loaded test
    box (its groups' STATUS probes timed out meanwhile too), before any fault: the drills here
    measure faults, so the cluster takes a few seconds of sends through the name servers first."""
    from broker.client.cluster import create_topic
    from ops.drill.workload import Workload
    from ops.security import credentials_for

    creds = credentials_for(c.spec)
    made = create_topic(c.namesrv_addresses, "warm-up", 4, credentials=creds)
    assert not [r for r in made.values() if isinstance(r, Exception)], made
    wl = Workload([], "warm-up", "warm-up", RATE, credentials=creds, namesrv=c.namesrv_addresses)
    wl.start(time.monotonic())
    time.sleep(seconds)
    wl.stop()
    assert wl.error is None and wl.acked > 0, wl.error


def run(c: LocalCluster, nemesis: str, seed: int, tmp_path: Path, group: str | None = None) -> dict:
    r = drill(c.spec, nemesis, duration_s=DURATION_S, rate=RATE, report_dir=tmp_path, group=group, seed=seed,
              fault_s=4, calm_s=1, log=print)
    f = r["figures"]
    print(f"\n{nemesis} group {r['group']} seed {seed}: ok {r['ok']} liveness {r['liveness']}\n"
          f"  acked {f['ok']} (by group {f.get('ok_by_group')}), failed {f['failed']}, unknown {f['unknown']}, "
          f"lost {r['counts']['lost']}, read back {f['reads']}\n"
          f"  time to new leader {f['time_to_new_leader_s_max']}s, longest ack gap {f['longest_ack_gap_s']}s "
          f"(at {f['longest_ack_gap_at_s']}s; by group {f.get('longest_ack_gap_s_by_group')}; in the fault "
          f"window {f['longest_ack_gap_in_faults_s']}s), recovery {f['recovery_s_max']}s")
    for ev in r["faults"]:
        print(f"  fault {ev['kind']} {ev['node']} at {ev['at_s']}s: {ev['detail']}")
        if "namesrv_outage" in ev:
            print(f"  name servers down: {ev['namesrv_outage']}")
    report = json.loads((Path(r["report_dir"]) / "report.json").read_text())
    assert report["workload"] == {"via": "namesrv", "groups": ["g0", "g1"], "namesrv": c.namesrv_addresses,
                                  "client": "tidelog"}
    assert len(report["faults"]) == 1, report["faults"]
    assert Path(r["plot"]).stat().st_size > 10_000
    # the drill's own judges: the history checker (nothing acknowledged lost) and the replicas
    assert r["ok"], (r["anomalies"], r["counts"], r["drain_problems"])
    assert r["counts"]["lost"] == 0 and f["reads"] >= f["ok"] > 0.5 * RATE * DURATION_S
    assert set(f["ok_by_group"]) == {"g0", "g1"}  # the workload spans both groups
    assert f["final_verdict"] == "healthy" and report["faults"][0]["verdict_after"] == "healthy"
    return r


def test_kill_namesrv_sends_to_known_routes_go_on(cluster, seed, tmp_path):
    r = run(cluster, "kill-namesrv", seed, tmp_path)
    (ev,) = r["faults"]
    assert ev["node"] == "ns-n0,ns-n1" and ev["nodes"] == ["ns-n0", "ns-n1"] and "error" not in ev
    assert [s["step"] for s in ev["steps"]] == ["kill -9", "kill -9", "heal"]  # both restarted at once
    out = ev["namesrv_outage"]
    assert out["namesrv_down_s"] >= 3  # held for the window
    assert out["acks"] > RATE and set(out["acks_by_group"]) == {"g0", "g1"}  # both groups, without them
    assert r["liveness"] == {"ok": True, "problems": []}
    assert len({leader for _, leader in r["leader_changes"] if leader}) == 1  # no broker was touched


def test_kill_leader_aimed_at_g1_reroutes(cluster, seed, tmp_path):
    leaders = {g["name"]: g["leader"] for g in cluster.health()["groups"]}
    r = run(cluster, "kill-leader", seed, tmp_path, group="g1")
    (ev,) = r["faults"]
    assert r["group"] == "g1" and ev["node"] == leaders["g1"] and ev["node"].startswith("g1-")
    assert ev["time_to_new_leader_s"] is not None, r["leader_changes"]
    assert {g["name"]: g["leader"] for g in cluster.health()["groups"]}["g0"] == leaders["g0"]  # g0 untouched
    assert "namesrv_outage" not in ev and r["liveness"]["ok"]


def test_kill_namesrv_and_leader_the_new_leader_is_found_without_name_servers(cluster, seed, tmp_path):
    r = run(cluster, "kill-namesrv-and-leader", seed, tmp_path, group="g1")
    (ev,) = r["faults"]
    assert ev["node"].startswith("g1-") and [s["node"] for s in ev["steps"][:3]] == ["ns-n0", "ns-n1", ev["node"]]
    out = ev["namesrv_outage"]
    assert out["new_leader_at_s"] is not None, (out, r["leader_changes"])
    assert r["liveness"] == {"ok": True, "problems": []}, r["liveness"]
    assert out["target_acks_after_new_leader"] > 0  # g1's new leader took sends while they were down
