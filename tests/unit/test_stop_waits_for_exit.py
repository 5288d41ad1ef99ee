"""`tidelog spark down` and `tidelog sql stop` say "stopped" only once each process has exited,
every thread of it, and is gone from the process table (ops/spark_cluster.py `terminate`). A
JVM's main thread ends first: /proc/PID/stat says Z from then on (pid_alive: gone) while its other
threads still exit. The stand-in here does the same at SIGTERM: its main thread ends and another
thread lives on for LINGER_S; or it ignores SIGTERM, for the SIGKILL after the bound."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ops import spark_cluster
from ops.spark_cluster import SparkCluster, start_time
from spark_jobs import sqlserver
from spark_jobs.warehouse import catalog_dir

LINGER_S = 1.0
# (the handler only notes SIGTERM; the main loop starts the thread and ends itself, outside
# the handler: a full run once saw the stand-in still there 30 s after SIGTERM)
JVM_LIKE = """
import ctypes, signal, sys, threading, time
termed = []
signal.signal(signal.SIGTERM, (lambda *_: termed.append(1)) if sys.argv[2] == "exits" else signal.SIG_IGN)
print("ready", flush=True)
while not termed:
    time.sleep(0.02)
threading.Thread(target=time.sleep, args=(float(sys.argv[1]),)).start()
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends first, as a JVM's does
"""


@pytest.fixture
def jvm_like():
    """start(on_term) -> a running stand-in's pid; every one started is killed at the end."""
    started = []

    def start(on_term: str = "exits", *extra: str) -> int:
        p = subprocess.Popen([sys.executable, "-c", JVM_LIKE, str(LINGER_S), on_term, *extra],
                             stdout=subprocess.PIPE, text=True)
        started.append(p)
        assert p.stdout.readline() == "ready\n"
        return p.pid

    yield start
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait()


def gone(pid: int) -> bool:
    return not os.path.exists(f"/proc/{pid}")


def spark_state(cluster: SparkCluster, pid: int) -> None:
    cluster.dir.mkdir(parents=True)
    cluster.state_path.write_text(json.dumps({"webui_port": 1, "processes": [
        {"name": "master", "pid": pid, "start_time": start_time(pid), "log": "master.log"}]}))


def test_spark_down_returns_once_every_thread_has_exited(tmp_path, jvm_like):
    pid = jvm_like()
    cluster = SparkCluster(tmp_path / "spark")
    spark_state(cluster, pid)
    (p,) = cluster.down()
    assert p["pid"] == pid and p["killed"] is False and gone(pid)


def test_spark_down_waits_for_the_process_it_had_to_kill(tmp_path, jvm_like, monkeypatch):
    monkeypatch.setattr(spark_cluster, "STOP_TIMEOUT_S", 0.3)
    pid = jvm_like("ignores")
    cluster = SparkCluster(tmp_path / "spark")
    spark_state(cluster, pid)
    (p,) = cluster.down()
    assert p["killed"] is True and gone(pid)


def test_sql_stop_returns_once_every_thread_has_exited(tmp_path, jvm_like):
    wh = tmp_path / "warehouse"
    pid = jvm_like("exits", sqlserver.SERVER_CLASS)  # what `running` checks the pid's command line for
    catalog_dir(wh).mkdir(parents=True)
    sqlserver.state_path(wh).write_text(json.dumps({"pid": pid, "port": 1}))
    r = sqlserver.stop(wh)
    assert r["stopped"] and r["pid"] == pid and r["killed"] is False and gone(pid)
