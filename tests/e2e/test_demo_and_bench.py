"""`make run` and `make bench` end to end (their commands, on tiny bounds for the bench)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

FIELDS = {"workload", "mode", "replicas", "flush", "payload", "conns", "window", "n_acked", "errors",
          "wall_s", "msgs_per_s", "MB_per_s", "lat_ms_p50", "lat_ms_p99", "lat_ms_p999",
          "client_cpu_s", "server_cpu_s", "client_api", "server_nodes", "client_cpu_us_per_msg",
          "server_cpu_us_per_msg_each", "server_cpu_us_per_msg", "cpu_us_per_msg"}
ROLES = {"standalone": [["standalone"]], "master-slave": [["master", "slave"]],
         "raft": [["follower", "follower", "leader"]]}


def row(name, value, width=48):
    """A line of the demo's closing summary."""
    return f"  {name:<{width}} {value!s:>8}"


def test_demo_runs_the_whole_platform_and_stops_clean(tmp_path):
    env = {**os.environ, "TIDELOG_WAREHOUSE": str(tmp_path / "wh")}   # the demo publishes to the default warehouse
    r = subprocess.run([sys.executable, "-m", "ops.cli.main", "demo", "--data-dir", str(tmp_path),
                        "--messages", "600", "--drill-s", "6"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    out = r.stdout
    assert "OK: every acknowledged message was read back from the group that acknowledged it; the drill lost " \
        "nothing; both groups' replicas reconcile clean" in out
    lines = out.splitlines()
    for line in (row("messages acknowledged", 600), row("messages read back", 600),
                 row("reconcile: verdict", "clean"), row("GX validation", "passed"),
                 row("brokers / name servers stopped", "6 / 2")):
        assert line in lines, line
    assert "drill: acknowledged but lost" in out
    # traffic went through the name servers to both groups, and came back from where it was acked
    per_group = {}
    for line in lines:
        for g in ("g0", "g1"):
            if line.strip().startswith(f"{g}: acknowledged / read back"):
                acked, back = line.split()[-3::2]
                per_group[g] = (int(acked), int(back))
    assert set(per_group) == {"g0", "g1"} and all(a == b > 0 for a, b in per_group.values()), per_group
    assert sum(a for a, _ in per_group.values()) == 600
    # the name servers' route: both groups, 4 queues each, before and after the drill
    assert out.count("route of demo-orders from the name servers") == out.count("ns-h7 and ns-h8 agree)") == 2, out
    assert sum(line.strip().startswith("g0: queues 0-3, leader g0-h") for line in lines) == 2
    assert sum(line.strip().startswith("g1: queues 0-3, leader g1-h") for line in lines) == 2
    before, after = next(line for line in lines if "g0's leader before / after the drill" in line).split()[-3::2]
    assert before.startswith("g0-h") and after.startswith("g0-h")
    # the one `tidelog sql` query and its answer: a row per replica of each group, none lagging
    assert "$ tidelog sql --warehouse" in out
    assert [[c.strip() for c in line.split("|")[1:4]] for line in lines if line.startswith(("|g0", "|g1"))] == \
        [["g0", f"g0-h{i}", "ok"] for i in (1, 2, 3)] + [["g1", f"g1-h{i}", "ok"] for i in (4, 5, 6)]
    plot = next(line.split()[-1] for line in lines if line.strip().startswith("drill plot:"))
    assert Path(plot).is_file() and "Data Docs:     file://" in out and "make airflow" in out
    # its closing lines name commands that work as printed: the query, on the same warehouse
    cmd = next(line.split(":", 1)[1].strip() for line in lines if line.strip().startswith("query the tables:"))
    q = subprocess.run(cmd.replace("tidelog sql", f"{sys.executable} -m ops.cli.main sql --json", 1), shell=True,
                       capture_output=True, text=True, timeout=300, env=env)
    assert q.returncode == 0, q
    answer = json.loads(q.stdout)
    assert {r["group"] for r in answer} == {"g0", "g1"} and {r["status"] for r in answer} == {"consistent"}, answer


def test_broker_demo_survives_a_crash(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ops.cli.main", "demo", "--broker-only", "--data-dir", str(tmp_path),
                        "--messages", "1500"], capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: every acknowledged message survived the crash" in r.stdout
    assert "present after crash + restart                  1500" in r.stdout


def test_bench_prints_one_json_line_per_workload(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ops.cli.main", "bench", "--data-dir", str(tmp_path),
                        "--duration-s", "0.3", "--messages", "300",
                        "-w", "send-c1-w256-async", "-w", "send-c4-w256-sync",
                        "-w", "ms-sync-1slave-c1-w256-async", "-w", "send-c1-w256-async-tls"],
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [x["workload"] for x in lines] == ["send-c1-w256-async", "send-c4-w256-sync",
                                              "ms-sync-1slave-c1-w256-async", "send-c1-w256-async-tls"]
    assert [x["security"] for x in lines] == ["off", "off", "off", "tls+scram"]
    ms = lines[2]
    assert ms["mode"] == "master-slave" and ms["replicas"] == 2 and ms["ha_replication"] == "sync"
    for x in lines:
        assert FIELDS <= set(x) and x["n_acked"] > 0 and x["errors"] == 0
        assert x["lat_ms_p50"] <= x["lat_ms_p99"] <= x["lat_ms_p999"]
        # CPU per acknowledged message: this process, then each broker of the group in node order
        assert x["client_api"] in ("send_nowait", "send_async")
        each, nodes = x["server_cpu_us_per_msg_each"], x["server_nodes"]
        assert len(each) == len(nodes) == x["replicas"], x
        assert len({n["id"] for n in nodes}) == len(nodes), nodes
        assert sorted(n["role"] for n in nodes) in ROLES[x["mode"]], nodes
        assert x["client_cpu_us_per_msg"] > 0 and all(v > 0 for v in each), x
        assert abs(x["server_cpu_us_per_msg"] - sum(each)) <= 0.01 * (len(each) + 1), x
        assert abs(x["cpu_us_per_msg"] - x["client_cpu_us_per_msg"] - sum(each)) <= 0.01 * (len(each) + 2), x


def test_hop_floor_model_burns_the_asked_cpu_in_the_named_processes(tmp_path):
    """TIDELOG_HOP_WORK (the round trip's model): each point's CPU time shows up in the CPU
    column of the process it names, and the row says it is a model."""
    work = {"client": 200, "leader_send": 250, "leader_answer": 150, "follower_before": 300}
    env = {**os.environ, "TIDELOG_HOP_WORK": ",".join(f"{k}={v}" for k, v in work.items())}
    try:
        r = subprocess.run([sys.executable, "-m", "ops.cli.main", "bench", "--data-dir", str(tmp_path),
                            "--duration-s", "2", "--messages", "300", "-w", "hop-floor-raft3-w1"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        (x,) = [json.loads(line) for line in r.stdout.splitlines()]
        assert x["errors"] == 0 and x["n_acked"] == 300 and x["model_work_us"] == work, x
        f1, f2, leader = x["server_cpu_us_per_msg_each"]
        # (the floor's own work is well under these: ~40-130 us a message per process)
        assert x["client_cpu_us_per_msg"] >= work["client"], x
        assert leader >= work["leader_send"] + work["leader_answer"], x
        assert min(f1, f2) >= work["follower_before"], x
    finally:
        left = subprocess.run(["pgrep", "-f", f"bench.hop_floor .*{tmp_path}"], capture_output=True, text=True)
        for pid in left.stdout.split():
            os.kill(int(pid), 9)
    assert left.stdout == "", f"hop-floor processes still running: {left.stdout}"


def test_hop_floor_row_measures_the_bare_round_trip_and_stops_its_processes(tmp_path):
    """The floor under raft3-c1-w1 (bench/hop_floor.py): three real processes on loopback,
    the same client loop and CPU accounting as the broker rows; afterwards none of them runs
    and their files are gone."""
    try:
        r = subprocess.run([sys.executable, "-m", "ops.cli.main", "bench", "--data-dir", str(tmp_path),
                            "--duration-s", "0.3", "--messages", "300", "-w", "hop-floor-raft3-w1"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        (x,) = [json.loads(line) for line in r.stdout.splitlines()]
        assert x["workload"] == "hop-floor-raft3-w1" and x["window"] == 1 and x["replicas"] == 3
        assert FIELDS <= set(x) and 0 < x["n_acked"] <= 300 and x["errors"] == 0
        assert x["lat_ms_p50"] <= x["lat_ms_p99"] <= x["lat_ms_p999"]
        each = x["server_cpu_us_per_msg_each"]
        assert [n["role"] for n in x["server_nodes"]] == ["follower", "follower", "leader"] and len(each) == 3
        assert x["client_cpu_us_per_msg"] > 0 and all(v > 0 for v in each), x
        assert abs(x["cpu_us_per_msg"] - x["client_cpu_us_per_msg"] - sum(each)) <= 0.05, x
    finally:  # what is left is stopped here, whatever failed above
        left = subprocess.run(["pgrep", "-f", f"bench.hop_floor .*{tmp_path}"], capture_output=True, text=True)
        for pid in left.stdout.split():
            os.kill(int(pid), 9)
    assert left.stdout == "", f"hop-floor processes still running: {left.stdout}"
    assert not (tmp_path / "hop-floor").exists()
