"""`tidelog spark down`'s session sweep (ops/spark_cluster.py): a recorded leader already gone
leaves its session id free for reuse; only leftovers placed in this cluster's directory go."""

import json
import os
import subprocess
import time

from ops.spark_cluster import SparkCluster, _stat, start_time


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        s = _stat(pid)
        if s is None or s[0] == "Z":
            return True
        time.sleep(0.02)
    return False


def test_down_spares_a_reused_session_id_and_kills_this_clusters_leftover(tmp_path):
    cluster = SparkCluster(tmp_path / "spark")
    (cluster.dir / "work").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # an unrelated setsid leader that got a recorded (long gone) worker's pid
    stranger = subprocess.Popen(["sleep", "60"], cwd=elsewhere, start_new_session=True)
    # a gone worker's session that still holds an executor working under the cluster's dir
    sh = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!"], cwd=cluster.dir / "work",
                          start_new_session=True, stdout=subprocess.PIPE, text=True)
    leftover = int(sh.stdout.readline())
    sh.wait()
    try:
        procs = [{"name": "master", "pid": sh.pid, "start_time": 1, "log": "m.log"},
                 {"name": "worker-1", "pid": stranger.pid, "start_time": start_time(stranger.pid) - 1,
                  "log": "w.log"}]
        cluster.state_path.write_text(json.dumps({"webui_port": 1, "processes": procs}))
        assert cluster.down() == []  # neither recorded process is still ours
        assert _gone(leftover)
        assert stranger.poll() is None and not _gone(stranger.pid, 0.3)
    finally:
        stranger.kill()
        stranger.wait()
        try:
            os.kill(leftover, 9)
        except ProcessLookupError:
            pass
