"""A whole-cluster roll of a spec with two groups and no name servers (`LocalCluster.up(groups=2)`):
the workload runs on each group at once (its own topic and history per group) and the report
sums them, each group's own under `groups`; a roll to the build every node already runs
restarts nothing, so this checks the workload and the bookkeeping, not the restarts (those:
test_platform_namesrv.py, test_platform_local.py). A whole-cluster roll cannot be rolled back
for one group (upgrade.json would then say all of it was)."""

import os
import signal

import pytest

from ops.cluster import LocalCluster
from ops.localbroker import pid_alive
from ops.upgrade import UpgradeError, rollback, upgrade, whole_cluster

pytestmark = pytest.mark.slow


def test_whole_roll_of_two_groups_without_name_servers(tmp_path):
    c = LocalCluster(tmp_path / "c")
    pids: list[int] = []
    try:
        c.up(3, "raft", wait=True, groups=2)
        pids = [n.pid for n in c.nodes]
        spec = c.spec
        assert whole_cluster(spec, None) and not whole_cluster(spec, "g0")
        r = upgrade(spec, "current", workload_rate=100)
        w = r["workload"]
        assert r["group"] == "all" and len(r["versions"]) == 6, r
        assert w["safe"] and w["counts"]["lost"] == 0, w
        assert set(w["groups"]) == {"g0", "g1"} and all(g["ok"] > 0 and g["safe"] for g in w["groups"].values()), w
        assert w["ok"] == sum(g["ok"] for g in w["groups"].values())
        assert [n.pid for n in c.nodes] == pids  # already on that build: nothing restarted
        with pytest.raises(UpgradeError, match="roll it back whole"):
            rollback(spec, "g0")
    finally:
        try:
            c.down()
        finally:
            for pid in pids:
                if pid and pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
