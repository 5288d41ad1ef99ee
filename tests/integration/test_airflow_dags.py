"""The Airflow DAGs, for real: a migrated metadata DB of the tests' own, the DagBag, each DAG
run with dag.test() against a local raft group, and red runs: a drill against a cluster with a
deliberately broken replica, a reconcile whose GX checkpoint fails. `airflow standalone` itself
(through `tidelog airflow`, what `make airflow` runs) is driven from a browser in
tests/e2e/test_browser.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import uvloop

from broker.client import Admin
from broker.store.logreader import iter_entries
from infra import spec as sp
from ops import dagtasks, deploy, health
from ops.airflow_local import DAG_IDS
from ops.build import build_wheel, tree_version
from ops.dagtasks import TaskFailed, safe_name
from ops.demo_broker import QUEUES, TOPIC, produce
from tests import airflow_env
from ops.security import credentials_for
from tests.helpers import local_spec

pytestmark = pytest.mark.slow


# The brokers' admin login lives in Airflow, as an operator would keep it: the spec names the
# connection (security.connection_id); deploy gives the brokers its verifier, and every task
# (and this test process, which deploys and breaks things directly) connects with it over TLS.
CONN_ID = "tidelog_afraft"
CONN = json.dumps({"conn_type": "generic", "login": "airflow-ops", "password": "af-" + os.urandom(9).hex()})


@pytest.fixture(scope="module")
def af(airflow_db):
    return {**airflow_db, f"AIRFLOW_CONN_{CONN_ID.upper()}": CONN}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("afcluster")
    path = local_spec(tmp, "afraft", security={"connection_id": CONN_ID})
    spec = sp.load(path)
    os.environ[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = CONN
    try:
        yield str(path), spec, tmp
    finally:
        deploy.stop(spec)
        os.environ.pop(f"AIRFLOW_CONN_{CONN_ID.upper()}", None)


@pytest.fixture
def deployed(cluster):
    path, spec, tmp = cluster
    deploy.deploy(spec)  # a no-op when the deploy test (or an earlier one) left it running
    return cluster


def ok_run(af, dag_id, conf, timeout_s=600):
    res, out = airflow_env.run_dag(af, dag_id, conf, timeout_s)
    assert res["state"] == "success", f"{res}\n{out[-8000:]}"
    assert set(res["tasks"].values()) <= {"success", "skipped"}, res
    return res, out


def test_dagbag_imports_every_dag_with_its_form_tags_and_docs(af):
    e = {**af, "TIDELOG_DRILL_SCHEDULE": "0 1 * * *", "TIDELOG_RECONCILE_SCHEDULE": "0 3 * * *"}
    r = subprocess.run([sys.executable, "-m", "tests.dag_runner", "dagbag"], env=e, cwd=airflow_env.REPO,
                       capture_output=True, text=True, timeout=300)
    line = next(x for x in r.stdout.splitlines() if x.startswith("DAG_RESULT "))
    bag = json.loads(line[len("DAG_RESULT "):])
    assert bag["import_errors"] == {}
    assert sorted(bag["dags"]) == sorted(DAG_IDS)
    for dag_id, d in bag["dags"].items():
        assert "tidelog" in d["tags"] and len(d["tags"]) >= 2, dag_id
        assert "red run means" in d["doc_md"], dag_id   # every DAG says what a failure means
        assert d["params"] and "spec" in d["params"], dag_id
        for name, p in d["params"].items():
            assert p["description"] and len(p["description"]) > 15, (dag_id, name)
            assert p["schema"].get("type"), (dag_id, name)
        assert Path(d["fileloc"]).parent == airflow_env.REPO / "dags"
    assert bag["dags"]["tidelog_failover_drill"]["schedule"] == "0 1 * * *"
    assert bag["dags"]["tidelog_reconcile_nightly"]["schedule"] == "0 3 * * *"
    assert bag["dags"]["tidelog_failover_drill"]["params"]["nemesis"]["schema"]["enum"][0] == "kill-leader"
    assert bag["dags"]["tidelog_reconcile_nightly"]["tasks"] == ["collect", "reconcile", "gx_checkpoint", "publish"]
    assert len(bag["dags"]["tidelog_reconcile_nightly"]["outlets"]) == 4
    # the DAG files only declare and wire: no logic of their own
    for f in (airflow_env.REPO / "dags").glob("*.py"):
        assert len(f.read_text().splitlines()) < 150, f


def test_deploy_dag_provisions_deploys_and_gates_on_health(af, cluster):
    path, spec, _ = cluster
    res, out = ok_run(af, "tidelog_deploy", {"spec": path, "provision": True})
    assert res["tasks"] == {"provision": "success", "deploy": "success", "health_gate": "success"}
    assert all(f"  h{i}: started (pid " in out for i in (1, 2, 3)) and "group g0: healthy" in out
    assert health.status(spec)["verdict"] == "healthy"


def test_deploy_task_fails_with_the_spec_error(tmp_path):
    """What the deploy task says on a bad spec (the DAG runs show the same text as the log's last line)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nprovider: local\nhosts: [{name: h1}]\ngroups: [{name: g0, hosts: [h9]}]\n")
    with pytest.raises(TaskFailed, match=f"cluster spec {bad}: .*no host 'h9' in hosts"):
        dagtasks.deploy(str(bad))
    with pytest.raises(TaskFailed, match="nope.yaml: cannot read the spec: No such file"):
        dagtasks.deploy(str(tmp_path / "nope.yaml"))


def test_rolling_upgrade_dag_moves_one_node_at_a_time_between_two_builds(af, deployed, tmp_path):
    path, spec, _ = deployed
    wheel = build_wheel(tmp_path / "dist", version="0.1.99")
    res, out = ok_run(af, "tidelog_rolling_upgrade", {"spec": path, "to": str(wheel)})
    assert res["tasks"] == {"pre_check": "success", "roll": "success", "post_check": "success"}
    steps = [line for line in out.splitlines() if "-> 0.1.99-" in line]
    assert len(steps) == 3 and "leadership moved" in out   # one node at a time, the leader last
    assert {r["version"] for r in health.status(spec)["groups"][0]["nodes"]} == {"0.1.99"}
    assert tree_version() != "0.1.99"   # two builds; the later tests run on the upgraded group


def test_failover_drill_dag_stores_its_report_per_run(af, deployed):
    path, spec, tmp = deployed
    reports = tmp / "reports"
    res, out = ok_run(af, "tidelog_failover_drill", {"spec": path, "duration_s": 8, "rate": 100,
                                                     "reports_dir": str(reports)})
    (run_dir,) = list(reports.iterdir())
    assert run_dir.name == safe_name(res["run_id"])
    (drill_dir,) = list(run_dir.iterdir())
    report = json.loads((drill_dir / "report.json").read_text())
    assert report["ok"] and report["counts"]["lost"] == 0 and report["figures"]["ok"] > 0
    assert (drill_dir / "drill.png").stat().st_size > 10_000
    assert f"drill report: {drill_dir}/report.json" in out and f"drill plot:   {drill_dir}/drill.png" in out


def break_a_follower(spec) -> str:
    """Flip one byte inside a committed entry of a follower's CommitLog, on disk, under the
    running node: the replica now disagrees with the others on its committed prefix."""
    bootstrap = [n.address for n in spec.nodes()]
    creds = credentials_for(spec)  # the Airflow connection's login
    assert creds.username == "airflow-ops" and creds.tls
    with Admin(bootstrap, credentials=creds) as a:
        if TOPIC not in a.list_topics():
            a.create_topic(TOPIC, QUEUES)
    uvloop.run(produce(bootstrap, 300, creds))
    st = health.wait_healthy(spec)
    g = st["groups"][0]
    node = next(p for p in spec.nodes() if p.id != g["leader"])
    committed = min(r["commit_index"] for r in g["nodes"])
    victim = next(e for e in iter_entries(Path(node.data_dir)) if e.index == committed // 2)
    seg = max((p for p in (Path(node.data_dir) / "commitlog").iterdir() if p.name.isdigit()
               and int(p.name) <= victim.phys_offset), key=lambda p: int(p.name))
    fd = os.open(seg, os.O_RDWR)
    try:
        at = victim.phys_offset - int(seg.name) + victim.size - 1   # the body's last byte
        b = os.pread(fd, 1, at)
        os.pwrite(fd, bytes([b[0] ^ 0x5A]), at)
        os.fsync(fd)
    finally:
        os.close(fd)
    return node.id


def test_drill_dag_turns_red_on_a_cluster_with_a_broken_replica(af, deployed):
    path, spec, tmp = deployed
    broken = break_a_follower(spec)
    reports = tmp / "reports-broken"
    res, out = airflow_env.run_dag(af, "tidelog_failover_drill", {"spec": path, "duration_s": 8, "rate": 100,
                                                                  "reports_dir": str(reports)})
    assert res["state"] == "failed", out[-6000:]
    assert res["tasks"] == {"pre_check": "success", "drill": "failed"}
    assert "SAFETY VIOLATION" in out and f"{broken}: its log stops early" in out
    (report,) = reports.glob("*/*/report.json")
    assert not json.loads(report.read_text())["ok"]


def test_reconcile_dag_turns_red_with_the_failed_expectations_in_its_log(af, deployed):
    """dag.test of the nightly reconcile on the cluster the previous test broke: the Spark job
    finds the corrupt entry, the GX checkpoint fails and names the expectations; nothing is
    published."""
    path, spec, tmp = deployed
    res, out = airflow_env.run_dag(af, "tidelog_reconcile_nightly",
                                   {"spec": path, "collect_dir": str(tmp / "collected"),
                                    "warehouse": str(tmp / "wh"), "run_date": "2026-01-03"})
    assert res["state"] == "failed", out[-6000:]
    assert res["tasks"] == {"collect": "success", "reconcile": "success", "gx_checkpoint": "failed",
                            "publish": "upstream_failed"}
    assert "FAILED replica_entries: every entry's CRC is valid" in out
    assert "no divergent or corrupt entry at or below the committed index" in out
    assert res["asset_events"] == []
