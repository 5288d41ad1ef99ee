"""The reconcile job on a real Spark standalone cluster (`tidelog spark up`: a master and two
workers on loopback, from pyspark's jars) gives the very rows `local[2]` gives, on a collection
of two broker groups with a forked tail and a lagging replica, over authenticated RPC; `tidelog
spark down` leaves none of the processes it started (nor their executors) running."""

from __future__ import annotations

import json

import pytest

from ops import dagtasks
from ops.localbroker import pid_alive
from ops.spark_cluster import SparkCluster, _stat, master_json, session_members
from spark_jobs import craft
from spark_jobs.craft import E, Node
from spark_jobs.reconcile import reconcile
from spark_jobs.warehouse import TABLES, read_table, session
from tests.helpers import run_tidelog as tidelog

pytestmark = pytest.mark.slow

N = 400            # entries per group: 0-199 in term 1, 200-399 in term 2, all committed
SEG = 1 << 20      # one segment per replica: six decode tasks over both executors
DATE = "2026-02-01"


def collection(out):
    base = [E(i, 1 if i < 200 else 2) for i in range(N)]
    g0 = [Node(f"g0-n{i}", list(base), N - 1, group="g0") for i in range(3)]
    # g1: a deposed leader kept 4 entries of term 2 that the new leader (term 3) wrote over, and
    # a follower lags 150 entries behind
    g1 = [Node("g1-n0", base + [E(i, 2) for i in range(N, N + 4)], N - 1, group="g1"),
          Node("g1-n1", base + [E(i, 3) for i in range(N, N + 3)], N - 1, group="g1"),
          Node("g1-n2", base[:N - 150], N - 151, group="g1")]
    craft.write_cluster(out, "c1", g0 + g1, segment_bytes=SEG, format=2)
    return out


@pytest.fixture()
def spark_cluster(tmp_path):
    """`tidelog spark up` in tmp_path; whatever happens, every process it recorded is stopped."""
    c = SparkCluster(tmp_path / "spark")
    try:
        p = tidelog("spark", "up", "--data-dir", str(c.dir), "--json", check=False, timeout_s=180)
        assert p.returncode == 0, p.stderr + p.stdout
        yield json.loads(p.stdout)
    finally:
        c.down()


def rows(spark, wh, table):
    """A table's rows for DATE as sorted, comparable text."""
    df = read_table(spark, wh, table).filter(f"run_date = '{DATE}'")
    return sorted(json.dumps(r.asDict(recursive=True), default=str, sort_keys=True) for r in df.collect())


def test_reconcile_on_a_spark_cluster_matches_local(tmp_path, spark_cluster):
    st = spark_cluster
    assert st["running"] and st["started"] and st["workers_alive"] == 2 and st["cores"] == 2
    url = st["master_url"]
    assert url.startswith("spark://127.0.0.1:")
    # its RPC takes only drivers with the operator's secret (a driver without it is refused);
    # the driver below gets it from ops.spark_cluster.AUTH_FILE
    assert "SecurityManager: authentication enabled" in (tmp_path / "spark" / "master.log").read_text()
    logs = collection(tmp_path / "logs")
    on_cluster, local = tmp_path / "wh-cluster", tmp_path / "wh-local"

    # the nightly DAG's reconcile task with its Spark master field set: the driver in this process
    # (client mode), the tasks on the two workers' executors. (`tidelog reconcile --master URL`
    # is the same call behind a command line; one JVM here keeps the test short.)
    said = []
    r = dagtasks.reconcile(logs, DATE, on_cluster, master=url, log=said.append)
    assert said[0].startswith(f"Spark ({url}) started"), said
    (c,) = r["clusters"]
    assert c["verdict"] == "problems" and c["divergence_rows"] == 3
    assert c["statuses"] == {"consistent": 2 * N - 150, "missing_on_some": 150, "divergent": 3,
                             "uncommitted_tail": 1}

    spark = session("local[2]", app="tidelog-tests")  # the same JVM, a new context
    try:
        assert spark.sparkContext.master == "local[2]"
        mine = reconcile(logs, DATE, local, spark=spark)
        assert mine["clusters"][0]["entries"] == c["entries"]
        for t in TABLES:
            got, want = rows(spark, on_cluster, t), rows(spark, local, t)
            assert got and got == want, t
    finally:
        spark.stop()

    # it ran on the cluster: the master lists the finished application, with executors on both workers
    apps = master_json(st["webui"].rsplit(":", 1)[1])["completedapps"]
    assert [a["name"] for a in apps] == ["tidelog-reconcile"]
    executor_logs = sorted((tmp_path / "spark" / "work").glob("worker-*/app-*/*/stderr"))
    assert len(executor_logs) == 2, executor_logs

    p = tidelog("spark", "down", "--data-dir", str(tmp_path / "spark"), "--json")
    stopped = json.loads(p.stdout)["stopped"]
    assert sorted(x["name"] for x in stopped) == ["master", "worker-1", "worker-2"]
    for x in st["processes"]:
        assert not pid_alive(x["pid"]) and not session_members(x["pid"]), x
    assert tidelog("spark", "status", "--data-dir", str(tmp_path / "spark"), check=False).returncode == 2
    assert "nothing to stop" in tidelog("spark", "down", "--data-dir", str(tmp_path / "spark")).stdout


def test_down_says_stopped_once_its_jvms_are_gone(tmp_path, spark_cluster):
    """`tidelog spark down` returns once each JVM has exited and left the process table (a
    `pgrep java` right after listed them: a JVM's main thread ends first, the rest a moment
    later, and PID 1 collects the exited process a second or so after that)."""
    pids = [p["pid"] for p in spark_cluster["processes"]]
    p = tidelog("spark", "down", "--data-dir", str(tmp_path / "spark"))
    assert p.stdout.startswith("stopped the Spark master and workers: "), p.stdout
    left = {pid: s[0] for pid in pids if (s := _stat(pid))}  # pid -> state (Z: exited, not collected)
    assert not left, left
