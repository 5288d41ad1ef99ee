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
