"""The operator's first hour, in a real browser (Debian's chromium driven by Playwright), against
`tidelog airflow` (what `make airflow` runs): log in, trigger tidelog_deploy, then
tidelog_failover_drill, then tidelog_reconcile_nightly from their UI forms with the defaults
(only the drill's duration is shortened), see each run succeed, open the drill's report tab
(figures, fault timeline, the plot) and the Data Docs from the Airflow UI. Screenshots land in
the test's tmp dir (`shots/`); the forms' defaults point at a local cluster of the test's own
(TIDELOG_SPEC & co., as an operator would set them for their Airflow).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from infra import spec as sp
from ops import deploy
from ops.airflow_local import DAG_IDS, Api, admin_password
from ops.localbroker import free_ports
from tests import airflow_env
from tests.helpers import local_spec

pytestmark = pytest.mark.slow

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


class UI:
    """A signed-in browser page on one Airflow, with the REST API beside it for waiting."""

    def __init__(self, page, base: str, home: Path, shots: Path):
        self.page, self.base, self.shots = page, base, shots
        self.api = Api(base)
        self.api.login("admin", admin_password(home))
        self.password = admin_password(home)
        shots.mkdir(parents=True, exist_ok=True)
        self.trouble: list[str] = []   # what the browser saw go wrong: said when a wait times out
        page.on("requestfailed", lambda r: self.trouble.append(f"request failed: {r.url} ({r.failure})"))
        page.on("console", lambda m: m.type == "error" and self.trouble.append(f"console error: {m.text}"))

    def wait_for(self, locator, what: str, timeout_s: float) -> None:
        """`locator`'s first match, or an error that says what the page was doing instead."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            locator.first.wait_for(timeout=timeout_s * 1000)
        except PlaywrightTimeout:
            self.shot(f"timeout-{what}")
            frames = [f.url for f in self.page.frames]
            raise AssertionError(f"{what}: nothing after {timeout_s}s; frames {frames}; "
                                 f"trouble {self.trouble[-20:]}") from None

    def shot(self, name: str) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def login(self) -> None:
        pg = self.page
        pg.goto(self.base + "/", wait_until="networkidle")
        pg.fill("input[name=username]", "admin")
        pg.fill("input[name=password]", self.password)
        self.shot("01-login")
        pg.click("button[type=submit]")
        pg.wait_for_url(self.base + "/", timeout=60_000)

    def trigger(self, dag_id: str, fill: dict[str, str] | None = None) -> str:
        """Open the DAG's trigger form, change only `fill` (field -> text), submit; the run id."""
        pg = self.page
        pg.goto(f"{self.base}/dags/{dag_id}", wait_until="networkidle")
        pg.get_by_role("button", name="Trigger").first.click()
        submit = pg.get_by_test_id("trigger-dag-submit")
        submit.wait_for(timeout=30_000)
        for name, text in (fill or {}).items():
            pg.locator(f"[role=dialog] input[name=element_{name}]").fill(text)
        self.shot(f"form-{dag_id}")
        assert submit.is_enabled(), f"{dag_id}: the form's Trigger button is disabled with the defaults"
        submit.click()
        pg.wait_for_url(f"**/dags/{dag_id}/runs/**", timeout=30_000)
        return pg.url.split("/runs/", 1)[1].split("/")[0].replace("%3A", ":").replace("%2B", "+")

    def wait(self, dag_id: str, run_id: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            try:
                state = self.api.run_state(dag_id, run_id)
            except OSError as e:  # an API server busy past one poll's timeout (2 cores, Spark
                state = f"unknown: {e}"  # and the scheduler at work): ask again, as a user would
            if state in ("success", "failed"):
                return state
            time.sleep(2)
        raise AssertionError(f"{dag_id} {run_id} still {state} after {timeout_s}s")

    def task_log(self, dag_id: str, run_id: str, task: str) -> list[dict]:
        lg = self.api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}/taskInstances/{task}/logs/1")
        return [c for c in lg["content"] if isinstance(c, dict)]

    def report_tab(self, dag_id: str, run_id: str):
        """The run's page, then its "Tidelog report" tab (the plugin's view in an iframe)."""
        pg = self.page
        pg.goto(f"{self.base}/dags/{dag_id}/runs/{quote(run_id, safe='')}", wait_until="networkidle")
        pg.get_by_text("Tidelog report", exact=True).first.click()
        frame = pg.frame_locator("iframe[title='Tidelog report']")
        frame.locator("h1").wait_for(timeout=30_000)
        return frame


def run_first_hour(ui: UI, spec_path: str) -> dict:
    """The user's path; what it saw (for the assertions)."""
    seen = {}
    ui.login()
    ui.shot("02-dags")

    run = ui.trigger("tidelog_deploy")
    assert ui.wait("tidelog_deploy", run, 300) == "success"
    lines = [(c.get("logger"), c.get("event")) for c in ui.task_log("tidelog_deploy", run, "deploy")]
    ours = [e for lg, e in lines if lg == "tidelog.task"]
    done = next(i for i, (_, e) in enumerate(lines) if str(e).startswith("Done."))
    assert ours and all(i < done for i, (lg, _) in enumerate(lines) if lg == "tidelog.task"), lines
    seen["deploy_lines"] = ours

    run = ui.trigger("tidelog_failover_drill", {"duration_s": "8"})
    assert ui.wait("tidelog_failover_drill", run, 300) == "success"
    frame = ui.report_tab("tidelog_failover_drill", run)
    frame.locator("img[alt='drill plot']").wait_for(timeout=30_000)
    seen["drill_page"] = frame.locator("body").inner_text()
    seen["plot_width"] = frame.locator("img[alt='drill plot']").evaluate("img => img.naturalWidth")
    ui.shot("05-drill-report")
    ui.page.goto(f"{ui.base}/tidelog/runs/tidelog_failover_drill/{quote(run, safe='')}", wait_until="networkidle")
    ui.shot("05b-drill-report-whole")   # the same page outside the tab's frame: all of it, plot included

    run = ui.trigger("tidelog_reconcile_nightly")
    assert ui.wait("tidelog_reconcile_nightly", run, 600) == "success"
    gx_log = ui.task_log("tidelog_reconcile_nightly", run, "gx_checkpoint")
    seen["gx_log_levels"] = [(c.get("level"), c.get("logger")) for c in gx_log]
    frame = ui.report_tab("tidelog_reconcile_nightly", run)
    seen["reconcile_page"] = frame.locator("body").inner_text()
    ui.shot("06-reconcile-report")
    frame.get_by_text("Data Docs: every validation").click()
    rows = frame.locator("table#validation-results-table tbody tr, .bootstrap-table tbody tr")
    # a page of ~2 MB of vendored scripts from Airflow's API server, on a box still busy after Spark
    ui.wait_for(rows, "data-docs-rows", 90)
    seen["docs_rows"] = rows.count()
    seen["docs_text"] = frame.locator("body").inner_text()
    ui.shot("07-data-docs")
    ui.page.goto(f"{ui.base}/tidelog/data-docs/index.html", wait_until="networkidle")
    ui.shot("07b-data-docs-whole")
    seen["events"] = ui.api.call("GET", "/api/v2/assets/events?source_dag_id=tidelog_reconcile_nightly")["asset_events"]
    # the tables the reconcile published, queried as the README says, through make airflow's query server
    seen["sql"] = subprocess.run([str(airflow_env.BIN / "tidelog"), "sql", "-v", "--json",
                                  "SELECT status, count(*) AS n FROM tidelog.reconciled_log GROUP BY status"],
                                 capture_output=True, text=True, timeout=120)
    return seen


@pytest.fixture
def airflow_ui(tmp_path, airflow_db):
    """`tidelog airflow` on free ports, its forms' defaults pointed at a local cluster of ours."""
    spec_path = local_spec(tmp_path, "uiraft")
    port, log_port, _ = free_ports(3)
    home = tmp_path / "home"
    e = {**airflow_db, "TIDELOG_AIRFLOW_HOME": str(home), "TIDELOG_SPEC": str(spec_path),
         "TIDELOG_WAREHOUSE": str(tmp_path / "wh"), "TIDELOG_DRILL_REPORTS": str(tmp_path / "reports"),
         "TIDELOG_COLLECT_DIR": str(tmp_path / "collected")}
    e.pop("AIRFLOW_HOME")
    proc = subprocess.Popen([str(airflow_env.BIN / "tidelog"), "airflow", "--port", str(port), "--log-port",
                             str(log_port)], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            out.append(line)
            if "Ctrl-C stops Airflow" in line:
                break
        assert any(f"Airflow is up: http://127.0.0.1:{port}" in x for x in out), "".join(out)
        yield f"http://127.0.0.1:{port}", home, str(spec_path)
    finally:
        standalone = next((int(x.split("pid ")[1].split()[0]) for x in out if "airflow standalone is pid" in x), None)
        proc.send_signal(signal.SIGINT)   # Ctrl-C, as a user stops make airflow
        try:
            rc = proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        rest = proc.stdout.read()
        deploy.stop(sp.load(spec_path))
        if standalone and not group_gone(standalone, 15):
            os.killpg(standalone, signal.SIGKILL)
            raise AssertionError(f"processes of airflow's group {standalone} outlived Ctrl-C")
    assert rc == 0 and "SQL query server stopped" in rest and "Airflow stopped" in rest, rest
    assert not (tmp_path / "wh" / "_catalog" / "sqlserver.json").exists()   # the server's state is gone with it


def group_gone(pgid: int, timeout_s: float) -> bool:
    """Every process of the group has exited (PID 1 reaps zombies slowly here)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it)")
def test_a_user_deploys_drills_and_reconciles_from_the_ui_and_reads_the_reports(airflow_ui, tmp_path, monkeypatch):
    from playwright.sync_api import sync_playwright

    base, home, spec_path = airflow_ui
    monkeypatch.setenv("TIDELOG_WAREHOUSE", str(tmp_path / "wh"))   # the test's own `tidelog sql`: Airflow's warehouse
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_context(viewport={"width": 1400, "height": 900}).new_page()
            ui = UI(page, base, home, tmp_path / "shots")
            seen = run_first_hour(ui, spec_path)
        finally:
            browser.close()
    print(f"screenshots: {tmp_path / 'shots'}")
    assert any(line.strip().startswith("h1: started") for line in seen["deploy_lines"])
    page = seen["drill_page"]
    assert "no safety violation" in page and "longest time to a new leader" in page
    assert "Fault timeline" in page and "kill-leader" in page and seen["plot_width"] > 500
    assert "clean" in seen["reconcile_page"] and "passed" in seen["reconcile_page"]
    assert "reconciled_log · uiraft · " in seen["reconcile_page"]   # this run date's pages of this cluster
    assert seen["docs_rows"] >= 3 and "reconciled_log" in seen["docs_text"]
    noisy = [lv for lv in seen["gx_log_levels"] if lv[0] == "error" or (lv[1] or "").startswith("great_expectations")]
    assert noisy == [], noisy    # no GX chatter, and nothing (Spark's banner) at error
    tables = {ev["name"] for ev in seen["events"]}
    assert tables == {"tidelog.replica_entries", "tidelog.reconciled_log", "tidelog.replica_divergence",
                      "tidelog.replica_summary"}
    assert all(ev["extra"]["data_docs"].endswith("/tidelog/data-docs/index.html") for ev in seen["events"])
    sql = seen["sql"]
    assert sql.returncode == 0 and sql.stderr.startswith("via the query server 127.0.0.1:"), sql
    assert {r["status"] for r in json.loads(sql.stdout)} == {"consistent"}, sql.stdout
    assert sorted(d.name for d in (tmp_path / "shots").iterdir())[:2] == ["01-login.png", "02-dags.png"]
    shutil.copytree(tmp_path / "shots", Path(os.environ.get("TIDELOG_SHOTS", tmp_path / "shots-kept")),
                    dirs_exist_ok=True)
    assert set(DAG_IDS) >= {"tidelog_deploy", "tidelog_failover_drill", "tidelog_reconcile_nightly"}


if __name__ == "__main__":  # against a running `tidelog airflow`: python -m tests.e2e.test_browser BASE HOME SPEC SHOTS
    import sys

    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        ui = UI(b.new_context(viewport={"width": 1400, "height": 900}).new_page(), sys.argv[1], Path(sys.argv[2]),
                Path(sys.argv[4]))
        print(json.dumps(run_first_hour(ui, sys.argv[3]), default=str)[:3000])
        b.close()
