"""An Airflow of the tests' own: AIRFLOW_HOME in a temporary directory, the project's DAGs,
a migrated SQLite metadata DB. Airflow reads its configuration once, at import, so everything
that imports Airflow runs in a child process with this environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ops.airflow_local import base_environment

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def env(home: Path, **extra: str) -> dict:
    e = base_environment(home)   # what `tidelog airflow` gives its Airflow
    e.update({
        "PYTHONPATH": str(REPO),
        "TIDELOG_DRILL_SCHEDULE": "none",       # no scheduled run may start in the middle of a test
        "TIDELOG_RECONCILE_SCHEDULE": "none",
    })
    e.update(extra)
    return e


def migrate(e: dict) -> None:
    r = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=e, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def run_dag(e: dict, dag_id: str, conf: dict, timeout_s: float = 600) -> tuple[dict, str]:
    """dag.test(run_conf=conf) in a child; ({"state", "tasks": {task: state}}, its output)."""
    r = subprocess.run([sys.executable, "-m", "tests.dag_runner", "test", dag_id, json.dumps(conf)], env=e,
                       cwd=REPO, capture_output=True, text=True, timeout=timeout_s)
    out = r.stdout + r.stderr
    last = [line for line in r.stdout.splitlines() if line.startswith("DAG_RESULT ")]
    assert last, f"dag runner exited {r.returncode} without a result:\n{out[-6000:]}"
    return json.loads(last[-1][len("DAG_RESULT "):]), out
