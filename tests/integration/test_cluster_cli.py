"""`tidelog cluster up|status|down` + produce/consume, as a new user would run them."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def tidelog(*args, env):
    return subprocess.run([sys.executable, "-m", "ops.cli.main", *args], capture_output=True,
                          text=True, timeout=120, env=env)


def test_cluster_commands(tmp_path):
    env = {**os.environ, "TIDELOG_CLUSTER_DIR": str(tmp_path / "c")}
    try:
        r = tidelog("cluster", "up", "--nodes", "3", "--mode", "raft", env=env)
        assert r.returncode == 0, r.stderr
        assert "raft group of 3 up" in r.stdout and "leader n" in r.stdout
        r = tidelog("cluster", "up", "--nodes", "3", "--mode", "raft", env=env)
        assert r.returncode == 1 and "already running" in r.stderr
        b = tidelog("cluster", "bootstrap", env=env).stdout.strip()
        assert b.count(",") == 2
        r = tidelog("produce", "-b", b, "--topic", "t", "--count", "500", "--json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["acked"] == 500, r.stderr
        r = tidelog("consume", "-b", b, "--topic", "t", "--group", "g", "--count", "500", "--quiet", env=env)
        assert r.returncode == 0, r.stderr
        st = json.loads(tidelog("cluster", "status", "--json", env=env).stdout)
        assert st["verdict"] == "healthy" and st["leader"]
        roles = sorted(n["role"] for n in st["nodes"])
        assert roles == ["follower", "follower", "leader"]
        leader = next(n for n in st["nodes"] if n["role"] == "leader")["replication"]
        assert all(f["lag"] == 0 for f in leader["followers"].values())
        assert leader["commit_index"] >= 500
        target = next(n["id"] for n in st["nodes"] if n["role"] == "follower")
        r = tidelog("admin", "transfer-leader", "-b", b, "--to", target, env=env)
        assert r.returncode == 0, r.stderr
        r = tidelog("admin", "transfer-leader", "-b", b, "--to", "nobody", env=env)
        assert r.returncode == 1 and "not a follower" in r.stderr
        text = tidelog("cluster", "status", env=env).stdout
        assert "healthy" in text and "committed" in text
    finally:
        r = tidelog("cluster", "down", env=env)
    assert r.returncode == 0 and "stopped 3 node(s)" in r.stdout
    st = json.loads(tidelog("cluster", "status", "--json", env=env).stdout)
    assert st["verdict"] == "down"


def test_master_slave_cluster_commands(tmp_path):
    """cluster up --mode master-slave, HA status (text and JSON), admin status, promote."""
    d = str(tmp_path / "ms")
    env = dict(os.environ)
    try:
        r = tidelog("cluster", "up", "--nodes", "3", "--mode", "master-slave", "--async", "--data-dir", d,
                    "--set", "ha_heartbeat_interval_ms=200", "--set", "ha_housekeeping_interval_ms=1000", env=env)
        assert r.returncode == 0, r.stderr
        assert "master-slave (async) group of 3 up" in r.stdout and "master n0" in r.stdout
        b = tidelog("cluster", "bootstrap", "--data-dir", d, env=env).stdout.strip()
        r = tidelog("produce", "-b", b, "--topic", "t", "--count", "300", "--json", env=env)
        assert r.returncode == 0 and json.loads(r.stdout)["acked"] == 300, r.stderr
        st = json.loads(tidelog("cluster", "status", "--data-dir", d, "--json", env=env).stdout)
        assert st["verdict"] == "healthy" and st["leader"] == "n0"
        m = next(n for n in st["nodes"] if n["id"] == "n0")["replication"]
        assert m["role"] == "master" and m["ha_replication"] == "async" and m["slave_count"] == 2
        assert set(m["slaves"]) == {"n1", "n2"} and all("lag_bytes" in s for s in m["slaves"].values())
        s1 = next(n for n in st["nodes"] if n["id"] == "n1")["replication"]
        assert s1["role"] == "slave" and s1["master"] == "n0" and s1["connected"]
        assert s1["last_read_ms_ago"] is not None and s1["max_offset"] > 0
        text = tidelog("cluster", "status", "--data-dir", d, env=env).stdout
        assert "ack offset" in text and "in sync" in text and "required 2" in text
        r = tidelog("admin", "status", "-b", st["nodes"][1]["address"], env=env)
        assert r.returncode == 0 and "slave of n0" in r.stdout, r.stdout + r.stderr
        r = tidelog("admin", "promote", "-b", b, "--node", "nobody", env=env)
        assert r.returncode == 1 and "no node 'nobody'" in r.stderr
        r = tidelog("admin", "promote", "-b", b, "--node", "n2", "--json", env=env)
        assert r.returncode == 0, r.stderr
        rep = json.loads(r.stdout)
        assert rep["node"] == "n2" and rep["epoch"] == 2 and rep["switchover"] and rep["clean"]
        r = tidelog("admin", "promote", "-b", b, "--node", "n2", env=env)
        assert r.returncode == 0 and "already master" in r.stdout
        r = tidelog("consume", "-b", b, "--topic", "t", "--group", "g", "--count", "300", "--quiet", env=env)
        assert r.returncode == 0, r.stderr
    finally:
        r = tidelog("cluster", "down", "--data-dir", d, env=env)
    assert r.returncode == 0 and "stopped 3 node(s)" in r.stdout
