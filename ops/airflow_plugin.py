"""The Airflow plugin `tidelog` (registered through the `airflow.plugins` entry point): reports
where the user looks, served by Airflow's own API server.

- A **Tidelog report** tab on every DAG run (an external view, destination `dag_run`): a drill
  run shows its report — verdict, figures, anomalies, fault timeline, leader changes and the
  plot; a nightly reconcile shows each cluster's verdict, the GX result and links to that run
  date's Data Docs pages; any other run what its tasks returned.
- **Tidelog reports** and **Data Docs** in the navigation: recent drill/reconcile runs, and the
  Great Expectations Data Docs site (self-contained, see expectations/datadocs.py).
- The DAGs' timetable, `ops.dagkit.CronFromNowTimetable` (Airflow finds a custom timetable's
  class again, when it deserializes a DAG, only among the plugins' `timetables`).

Every page needs a signed-in Airflow user (the UI's session cookie or a bearer token): a run's
report one who may read that DAG, the Data Docs one who may read the reconcile DAG, and the
index lists only runs of DAGs the user may read. Files are only ever served from a drill's report directory (named by the
drill task's XCom) or from the Data Docs site, never from a path in the URL.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, Response

from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.plugins_manager import AirflowPlugin
from ops import reports_html as html
from ops.dagkit import CronFromNowTimetable

PREFIX = "/tidelog"
DRILL_DAG, DRILL_TASK = "tidelog_failover_drill", "drill"
RECONCILE_DAG = "tidelog_reconcile_nightly"
REPORT_DIR_KEY = "report_dir"   # the drill task pushes where its reports go before it starts
DRILL_FILES = {"drill.png": "image/png", "report.json": "application/json", "history.json": "application/json"}

app = FastAPI(title="Tidelog reports", docs_url=None, redoc_url=None, openapi_url=None)
read_dag = Depends(requires_access_dag("GET"))


# ---- what the metadata DB knows about a run ----------------------------------------------------

def _value(v):
    if isinstance(v, str | bytes):
        try:
            return json.loads(v)
        except ValueError:
            return v
    return v


def run_xcoms(dag_id: str, run_id: str) -> dict[tuple[str, str], object]:
    """{(task_id, key): value} of one run."""
    from sqlalchemy import select

    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as s:
        rows = s.execute(select(XComModel.task_id, XComModel.key, XComModel.value)
                         .where(XComModel.dag_id == dag_id, XComModel.run_id == run_id)).all()
    return {(t, k): _value(v) for t, k, v in rows}


def run_state(dag_id: str, run_id: str) -> str | None:
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as s:
        st = s.scalar(select(DagRun.state).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
    if st is None:
        raise HTTPException(404, f"no run {run_id!r} of {dag_id}")
    return str(getattr(st, "value", st))


def recent_runs(limit: int = 30) -> list[dict]:
    from sqlalchemy import select

    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as s:
        rows = s.execute(select(DagRun.dag_id, DagRun.run_id, DagRun.state, DagRun.start_date)
                         .where(DagRun.dag_id.in_([DRILL_DAG, RECONCILE_DAG]))
                         .order_by(DagRun.id.desc()).limit(limit)).all()
    return [{"dag_id": d, "run_id": r, "state": str(getattr(st, "value", st)), "start": str(start or "")[:19]}
            for d, r, st, start in rows]


# ---- files ----------------------------------------------------------------------------------------

def drill_dirs(xcoms: dict) -> list[Path]:
    """The drill reports of a run: each subdirectory of the run's report dir with a report.json."""
    where = xcoms.get((DRILL_TASK, REPORT_DIR_KEY))
    if not where:
        return []
    root = Path(str(where))
    return sorted((p for p in root.iterdir() if (p / "report.json").is_file()), key=lambda p: p.name) \
        if root.is_dir() else []


def docs_site() -> Path:
    from expectations.validate import docs_site as site

    return site()


def inside(base: Path, rel: str) -> Path:
    """`base/rel`, refusing anything that resolves outside `base`."""
    p = (base / rel).resolve()
    if base.resolve() not in (p, *p.parents) or not p.is_file():
        raise HTTPException(404, "no such file")
    return p


# ---- pages ----------------------------------------------------------------------------------------

@app.get("/", response_class=HTMLResponse)
def index(user: GetUserDep) -> str:
    from airflow.api_fastapi.app import get_auth_manager

    readable = get_auth_manager().get_authorized_dag_ids(user=user)
    docs = f"{PREFIX}/data-docs/index.html" \
        if RECONCILE_DAG in readable and (docs_site() / "index.html").is_file() else None
    return html.index_page(PREFIX, [r for r in recent_runs() if r["dag_id"] in readable], docs)


@app.get("/runs/{dag_id}/{run_id}", response_class=HTMLResponse, dependencies=[read_dag])
def run_report(dag_id: str, run_id: str) -> str:
    state = run_state(dag_id, run_id)
    xcoms = run_xcoms(dag_id, run_id)
    sections = []
    if dag_id == DRILL_DAG:
        dirs = drill_dirs(xcoms)
        for d in dirs:
            rep = json.loads((d / "report.json").read_text())
            plot = html.run_url(PREFIX, dag_id, run_id) + f"/drills/{d.name}/drill.png" \
                if (d / "drill.png").is_file() else None
            sections.append(html.drill_section(rep, plot))
        if not dirs:
            sections.append("<div class='sub'>no drill report for this run (the drill task did not start, "
                            "or its report directory is gone)</div>")
    elif dag_id == RECONCILE_DAG and isinstance(xcoms.get(("reconcile", "return_value")), dict):
        from expectations.validate import docs_pages_of

        result = xcoms[("reconcile", "return_value")]
        gx = xcoms.get(("gx_checkpoint", "return_value"))
        clusters = {c.get("cluster") for c in result.get("clusters") or []}
        pages = [(name, f"{PREFIX}/data-docs/{rel}") for name, rel in docs_pages_of(str(result.get("run_date")), clusters)]
        pages.append(("Data Docs: every validation", f"{PREFIX}/data-docs/index.html"))
        sections.append(html.reconcile_section(result, gx if isinstance(gx, dict) else None, pages))
    else:
        sections.append(html.summaries_section({t: v for (t, k), v in sorted(xcoms.items()) if k == "return_value"}))
    return html.run_page(dag_id, run_id, state, sections)


@app.get("/runs/{dag_id}/{run_id}/drills/{drill}/{name}", dependencies=[read_dag])
def drill_file(dag_id: str, run_id: str, drill: str, name: str) -> FileResponse:
    if name not in DRILL_FILES:
        raise HTTPException(404, "no such file")
    run_state(dag_id, run_id)
    for d in drill_dirs(run_xcoms(dag_id, run_id)):
        if d.name == drill:
            return FileResponse(inside(d, name), media_type=DRILL_FILES[name])
    raise HTTPException(404, f"no drill {drill!r} in run {run_id!r}")


@app.get("/data-docs/{path:path}", dependencies=[Depends(requires_access_dag("GET", param_dag_id=RECONCILE_DAG))])
def data_docs(path: str) -> Response:
    """The Data Docs hold sample rows of the reconciled tables: for who may read the DAG that
    validates them."""
    return docs_page(docs_site(), path or "index.html")


def docs_page(site: Path, path: str) -> Response:
    """A Data Docs file, pages self-contained even while a validation rebuilds the site: GX
    writes its pages with CDN links, then expectations.datadocs rewrites them, and a page read
    between the two would load nothing on an offline Airflow. The vendored files are served
    from the package (the site's copies are the same files, for reading the site off disk, and
    may be half copied during a first build)."""
    from expectations.datadocs import SITE_VENDOR, VENDOR, localize

    vendored = path.startswith(SITE_VENDOR + "/")
    page = inside(VENDOR, path[len(SITE_VENDOR) + 1:]) if vendored else inside(site, path)
    if page.suffix != ".html":
        return FileResponse(page)
    rel = os.path.relpath(site.resolve(), page.parent)
    return HTMLResponse(localize(page.read_text(encoding="utf-8", errors="replace"),
                                 "" if rel == "." else rel + "/"))


class TidelogPlugin(AirflowPlugin):
    name = "tidelog"
    timetables = [CronFromNowTimetable]   # the DAGs' schedules: Airflow (de)serializes only registered ones
    fastapi_apps = [{"app": app, "url_prefix": PREFIX, "name": "Tidelog reports"}]
    external_views = [
        {"name": "Tidelog report", "href": PREFIX + "/runs/{DAG_ID}/{RUN_ID}", "destination": "dag_run",
         "url_route": "tidelog-run-report"},
        {"name": "Tidelog reports", "href": PREFIX + "/", "destination": "nav", "url_route": "tidelog-reports",
         "category": "browse"},
        {"name": "Data Docs", "href": PREFIX + "/data-docs/index.html", "destination": "nav",
         "url_route": "tidelog-data-docs", "category": "browse"},
    ]
