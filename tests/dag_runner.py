"""Child process for the Airflow tests (see tests/airflow_env.py):

    python -m tests.dag_runner dagbag                  the DagBag: import errors and each DAG's shape
    python -m tests.dag_runner test DAG_ID CONF_JSON   dag.test(run_conf=...): the run's and tasks' states
"""

from __future__ import annotations

import json
import os
import sys


def bag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])


def describe(b) -> dict:
    out = {"import_errors": {k: str(v)[-2000:] for k, v in b.import_errors.items()}, "dags": {}}
    for dag_id, d in b.dags.items():
        params = {k: {"default": d.params.get_param(k).value if d.params.get_param(k).has_value else None,
                      "schema": d.params.get_param(k).schema,
                      "description": d.params.get_param(k).description} for k in d.params}
        out["dags"][dag_id] = {"tags": sorted(d.tags), "doc_md": d.doc_md or "", "params": params,
                               "schedule": getattr(d.timetable, "expression", None) or type(d.timetable).__name__,
                               "tasks": [t.task_id for t in d.tasks], "fileloc": d.fileloc,
                               "outlets": sorted(a.name for t in d.tasks for a in getattr(t, "outlets", []))}
    return out


def main(argv: list[str]) -> int:
    if argv[0] == "dagbag":
        print("DAG_RESULT " + json.dumps(describe(bag())))
        return 0
    dag_id, conf = argv[1], json.loads(argv[2])
    b = bag()
    if b.import_errors:
        print("DAG_RESULT " + json.dumps({"state": "import_error", "errors": list(b.import_errors.values())}))
        return 1
    dr = b.get_dag(dag_id).test(run_conf=conf)
    from airflow.utils.session import create_session
    from airflow.models.taskinstance import TaskInstance

    from airflow.models.asset import AssetEvent

    with create_session() as s:
        tis = s.query(TaskInstance).filter(TaskInstance.dag_id == dag_id, TaskInstance.run_id == dr.run_id).all()
        tasks = {ti.task_id: str(ti.state.value if hasattr(ti.state, "value") else ti.state) for ti in tis}
        events = [{"asset": e.asset.name, "extra": e.extra} for e in
                  s.query(AssetEvent).filter(AssetEvent.source_dag_id == dag_id, AssetEvent.source_run_id == dr.run_id)]
    state = dr.state.value if hasattr(dr.state, "value") else str(dr.state)
    print("DAG_RESULT " + json.dumps({"state": state, "run_id": dr.run_id, "tasks": tasks, "asset_events": events}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
