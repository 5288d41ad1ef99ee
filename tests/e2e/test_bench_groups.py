"""`tidelog bench -w raft3x2-ns-c1-w256-async` end to end on tiny bounds (issue 16): two raft
groups of three behind one name server, the topic created through it, sends through
ClusterProducer. Checks the row's shape, that both groups took acknowledged sends, and that the
CPU columns cover all seven server processes; not the speeds. The phase is bounded by messages
(1500: several window-fulls, each sent to one group and the next to the other), not by the
clock: on a loaded box 0.3 s can hold a single window-full, all in one group."""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

NAME = "raft3x2-ns-c1-w256-async"


def test_bench_two_groups_behind_a_name_server(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ops.cli.main", "bench", "--data-dir", str(tmp_path),
                        "--duration-s", "10", "--messages", "1500", "-w", NAME],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    [x] = [json.loads(line) for line in r.stdout.splitlines()]
    assert x["workload"] == NAME and x["mode"] == "raft" and x["replicas"] == 3
    assert x["groups"] == 2 and x["namesrvs"] == 1 and x["client"] == "ClusterProducer"
    assert x["errors"] == 0 and x["n_acked"] > 0
    # both groups took sends, and every ack is counted under its group
    assert set(x["group_acked"]) == {"g0", "g1"} and all(v > 0 for v in x["group_acked"].values()), json.dumps(x)
    assert sum(x["group_acked"].values()) == x["n_acked"]
    # CPU of all six brokers, then the name server, in that order
    nodes, each = x["server_nodes"], x["server_cpu_us_per_msg_each"]
    assert [n["id"] for n in nodes] == ["g0-n0", "g0-n1", "g0-n2", "g1-n3", "g1-n4", "g1-n5", "ns-n0"]
    assert len(each) == len(nodes) and all(v > 0 for v in each[:6]), x
    for g in ("g0", "g1"):
        assert sorted(n["role"] for n in nodes if n["id"].startswith(g)) == ["follower", "follower", "leader"]
    assert nodes[6]["role"] == nodes[6]["role_end"] == "namesrv"
    assert abs(x["server_cpu_us_per_msg"] - sum(each)) <= 0.01 * (len(each) + 1), x
    assert abs(x["cpu_us_per_msg"] - x["client_cpu_us_per_msg"] - sum(each)) <= 0.01 * (len(each) + 2), x
    assert "not a scaling claim" in x["note"] and "times the groups" in x["note"]
