"""The DAGs' schedules with Airflow's own DAG processor and scheduler (an Airflow of the test's,
tests/airflow_env.py): the custom timetable goes through serialization (it must be registered
in the `tidelog` plugin, or the DAG processor reports the DAG as an import error), the next run
the DAG processor stores for a DAG whose slot passed half an hour ago is that slot tomorrow, and
the scheduler starts no run for it, while it does start one for a slot that just fell due."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys

import pytest

from tests import airflow_env

pytestmark = pytest.mark.slow

STATE = r"""
import json
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.errors import ParseImportError
from airflow.utils.session import create_session

with create_session() as s:
    dags = {d.dag_id: {"next": d.next_dagrun and d.next_dagrun.isoformat(), "paused": d.is_paused}
            for d in s.query(DagModel)}
    runs = [{"dag_id": r.dag_id, "run_id": r.run_id, "run_type": str(r.run_type)} for r in s.query(DagRun)]
    errors = [e.stacktrace[-1500:] for e in s.query(ParseImportError)]
print("STATE " + json.dumps({"dags": dags, "runs": runs, "errors": errors}))
"""


def airflow(e: dict, *args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    """An Airflow command in a process group of its own, the whole group stopped on a timeout."""
    proc = subprocess.Popen([str(airflow_env.BIN / "airflow"), *args], env=e, cwd=e["AIRFLOW_HOME"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"airflow {' '.join(args)} still running after {timeout_s}s:\n{out[-4000:]}")
    finally:
        try:  # a component's children that outlived it
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def state(e: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", STATE], env=e, cwd=airflow_env.REPO, capture_output=True,
                       text=True, timeout=120)
    line = next((x for x in r.stdout.splitlines() if x.startswith("STATE ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(line[len("STATE "):])


def test_processor_and_scheduler_start_no_run_for_a_missed_slot(tmp_path):
    now = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
    missed = now - dt.timedelta(minutes=30)   # today's slot of the reconcile DAG, half an hour ago
    e = airflow_env.env(tmp_path / "af",
                        TIDELOG_RECONCILE_SCHEDULE=f"{missed.minute} {missed.hour} * * *",
                        TIDELOG_DRILL_SCHEDULE="* * * * *",          # a slot that falls due every minute
                        AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG="0",  # its run starts no task
                        TIDELOG_SPEC=str(tmp_path / "no-such-spec.yaml"))
    airflow_env.migrate(e)
    r = airflow(e, "dag-processor", "--num-runs", "1")
    assert r.returncode == 0, r.stdout[-4000:]
    st = state(e)
    assert st["errors"] == [], st["errors"]
    assert st["dags"]["tidelog_reconcile_nightly"]["next"] == (missed + dt.timedelta(days=1)).isoformat(), st
    assert not st["dags"]["tidelog_reconcile_nightly"]["paused"]

    r = airflow(e, "scheduler", "--num-runs", "3", "--skip-serve-logs")
    assert r.returncode == 0, r.stdout[-4000:]
    st = state(e)
    runs = {x["dag_id"]: x for x in st["runs"]}
    assert "tidelog_reconcile_nightly" not in runs, st["runs"]                  # no run for the missed slot
    assert runs["tidelog_failover_drill"]["run_id"].startswith("scheduled__"), st["runs"]   # a due one runs
    assert st["dags"]["tidelog_reconcile_nightly"]["next"] == (missed + dt.timedelta(days=1)).isoformat()
