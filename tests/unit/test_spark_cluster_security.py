"""Spark RPC is authenticated wherever the master is not this one JVM (ops/spark_cluster.py):
the operator's secret is made once into a 0600 properties file; the standalone daemons, the
query server's spark-submit and an in-process driver get it from that file or over py4j,
never on a command line; local mode needs none (Spark makes one per run)."""

from __future__ import annotations

import os
import stat

import pytest

from ops import spark_cluster
from ops.spark_cluster import SparkCluster, SparkClusterError, auth_conf, auth_file, auth_submit_args, is_local


@pytest.fixture()
def secret_file(tmp_path, monkeypatch):
    f = tmp_path / "home" / "spark-auth.conf"
    monkeypatch.setattr(spark_cluster, "AUTH_FILE", f)
    return f


def test_the_secret_is_made_once_into_a_private_file(secret_file):
    assert auth_file() == secret_file and stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    conf = auth_conf("spark://127.0.0.1:7077")
    assert conf["spark.authenticate"] == "true" and len(conf["spark.authenticate.secret"]) >= 43
    assert auth_conf("spark://127.0.0.1:7077") == conf  # kept: every daemon and driver shares it
    os.chmod(secret_file, 0o644)
    with pytest.raises(SparkClusterError, match="must be this user's and 0600"):
        auth_file()


def test_only_a_master_outside_this_jvm_needs_the_secret(secret_file):
    for m in (None, "local", "local[2]", "local[*]", "local[4,2]"):
        assert is_local(m) and auth_submit_args(m) == [] and auth_conf(m) == {}, m
    assert not secret_file.exists()
    for m in ("spark://127.0.0.1:7077", "local-cluster[2,1,1024]", "yarn"):
        assert auth_submit_args(m) == ["--properties-file", str(secret_file), "--load-spark-defaults"], m


def test_the_standalone_daemons_read_the_secret_from_its_file(tmp_path, secret_file, monkeypatch):
    spawned = []
    monkeypatch.setattr(SparkCluster, "_spawn", lambda self, name, args, env: spawned.append((name, args, env))
                        or {"name": name, "pid": os.getpid(), "start_time": 0, "log": ""})
    monkeypatch.setattr(SparkCluster, "_wait_ready", lambda self, st, timeout_s: None)
    monkeypatch.setattr(SparkCluster, "status", lambda self: {})
    SparkCluster(tmp_path / "spark").up()
    secret = auth_conf("spark://x:1")["spark.authenticate.secret"]
    assert [n for n, _, _ in spawned] == ["master", "worker-1", "worker-2"]
    for name, args, env in spawned:
        assert args[-2:] == ["--properties-file", str(secret_file)], name
        assert secret not in " ".join(args) and secret not in " ".join(env.values()), name


def test_the_query_servers_driver_on_a_cluster_gets_the_file_not_the_secret(tmp_path, secret_file):
    from spark_jobs import sqlsecurity, sqlserver

    files = sqlsecurity.ServerFiles([tmp_path], tmp_path / "users.yaml", tmp_path / "ca.crt", tmp_path / "t.p12")
    cmd = sqlserver._command(10000, "spark://127.0.0.1:7077", tmp_path / "wh", files)
    i = cmd.index("--properties-file")
    assert cmd[i:i + 3] == ["--properties-file", str(secret_file), "--load-spark-defaults"]
    assert auth_conf("spark://x:1")["spark.authenticate.secret"] not in " ".join(cmd)
    local = sqlserver._command(10000, "local[2]", tmp_path / "wh", files)
    assert "spark.authenticate=true" in local and "--properties-file" not in local


class _Session:
    class sparkContext:  # noqa: N801 - what session() calls on it
        @staticmethod
        def setLogLevel(level):
            pass


def test_an_in_process_driver_gets_the_secret_by_file_or_py4j(tmp_path, secret_file, monkeypatch):
    """A JVM that starts now: its spark-submit gets the file (PYSPARK_SUBMIT_ARGS, as it was
    afterwards); a JVM of this process already running: the settings, over py4j."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from spark_jobs.warehouse import session

    seen = []
    monkeypatch.setattr(SparkSession.Builder, "getOrCreate", lambda self: seen.append(
        (os.environ.get("PYSPARK_SUBMIT_ARGS"), dict(self._options))) or _Session())
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--driver-memory 1g pyspark-shell")
    monkeypatch.setattr(SparkContext, "_gateway", None)
    session("spark://127.0.0.1:7077")
    secret = auth_conf("spark://x:1")["spark.authenticate.secret"]
    args, options = seen[-1]
    assert args == f"--properties-file {secret_file} --load-spark-defaults --driver-memory 1g pyspark-shell"
    assert secret not in str(options)
    assert os.environ["PYSPARK_SUBMIT_ARGS"] == "--driver-memory 1g pyspark-shell"
    monkeypatch.setattr(SparkContext, "_gateway", object())
    session("spark://127.0.0.1:7077")
    args, options = seen[-1]
    assert args == "--driver-memory 1g pyspark-shell"
    assert options["spark.authenticate"] == "true" and options["spark.authenticate.secret"] == secret
    session("local[2]")
    assert "spark.authenticate.secret" not in seen[-1][1]
