"""`make airflow` / `tidelog airflow`: Airflow standalone with the project's DAGs.

`airflow standalone` runs the API server (UI + REST), scheduler, DAG processor and triggerer
as children it spawns by name, so the venv's bin goes first on PATH. We give it its own
AIRFLOW_HOME (default ~/.tidelog/airflow), our `dags/` folder, no examples, a look for new
DAG files every 10 s (changed files are re-parsed every 30 s, Airflow's default) and our DAGs
unpaused at creation; its chatter goes to `<home>/standalone.log`. The UI listens on --host;
Airflow's two task-log servers (--log-port and the next port) on all interfaces, which Airflow
hard-codes.
This process waits until the UI answers and the four DAGs are parsed, prints where to log in
and the DAGs' state, and on Ctrl-C (or SIGTERM) stops the whole process group and waits.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import click

REPO = Path(__file__).resolve().parents[1]
DAG_IDS = ("tidelog_deploy", "tidelog_rolling_upgrade", "tidelog_failover_drill", "tidelog_reconcile_nightly")
STOP_TIMEOUT_S = 30.0


def default_home() -> Path:
    return Path(os.environ.get("TIDELOG_AIRFLOW_HOME", Path.home() / ".tidelog" / "airflow")).expanduser()


def base_environment(home: Path) -> dict:
    """This process's environment plus an Airflow of ours: its home, our DAGs, no examples,
    our DAGs active at creation, this venv's commands first on PATH."""
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    })
    return env


def exports(home: Path) -> str:
    """Shell export lines for what base_environment adds (so `airflow dags test`, `airflow
    connections add` and friends in a user's shell see the same Airflow as `make airflow`)."""
    import shlex

    env = base_environment(home)
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items() if k.startswith("AIRFLOW")]
    return "\n".join(lines + [f'export PATH={shlex.quote(str(Path(sys.executable).parent))}:"$PATH"'])


def environment(home: Path, host: str, port: int, log_port: int) -> dict:
    env = base_environment(home)
    env.update({
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": env.get("AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL", "10"),
        # a task's supervisor waits this long for each Execution API call (Airflow: 5 s, five
        # tries): on a box busy with brokers and Spark the API server once took longer for
        # ~37 s at a task's start and the supervisor killed the task (SIGKILL, run failed)
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": env.get("AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT", "30"),
        "AIRFLOW__API__HOST": host,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": f"http://{host}:{port}",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{host}:{port}/execution/",
        # the task-log servers of the scheduler (`airflow serve-logs`) and the triggerer: only
        # their ports can be set. Airflow 3.3 binds them to every interface (serve_logs() passes
        # host="" to uvicorn) and standalone starts both without --skip-serve-logs; they answer
        # only requests signed with [api] secret_key (README: make airflow, the CLI's --help)
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(log_port),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(log_port + 1),
    })
    return env


class Api:
    """The few REST v2 calls the launcher (and the tests) make."""

    def __init__(self, base: str):
        self.base, self.token = base.rstrip("/"), None

    def call(self, method: str, path: str, body=None, timeout_s: float = 10.0):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read() or b"null")

    def login(self, user: str, password: str) -> None:
        self.token = self.call("POST", "/auth/token", {"username": user, "password": password})["access_token"]

    def healthy(self) -> bool:
        try:
            self.call("GET", "/api/v2/monitor/health", timeout_s=3)
            return True
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def dags(self) -> dict[str, dict]:
        r = self.call("GET", "/api/v2/dags?tags=tidelog&limit=100")
        return {d["dag_id"]: d for d in r["dags"]}

    def trigger(self, dag_id: str, conf: dict) -> str:
        return self.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]

    def run_state(self, dag_id: str, run_id: str) -> str:
        from urllib.parse import quote

        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")["state"]

    def unpause(self, dag_id: str) -> None:
        self.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})


def admin_password(home: Path) -> str | None:
    try:
        return json.loads((home / "simple_auth_manager_passwords.json.generated").read_text()).get("admin")
    except (OSError, ValueError):
        return None


def wait_ready(proc: subprocess.Popen, api: Api, home: Path, timeout_s: float, say) -> dict[str, dict]:
    """Until the UI answers, we can log in and our DAGs are parsed; their rows."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, dict] = {}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"airflow standalone exited with {proc.returncode}; "
                                       f"see {home / 'standalone.log'}")
        if api.token is None and api.healthy() and admin_password(home):
            api.login("admin", admin_password(home))
            say("API server up; waiting for the DAG processor to parse dags/ ...")
        if api.token is not None:
            try:
                seen = api.dags()
            except urllib.error.URLError:
                seen = {}
            if all(d in seen for d in DAG_IDS):
                return seen
        time.sleep(1.0)
    missing = [d for d in DAG_IDS if d not in seen]
    raise click.ClickException(f"not ready after {timeout_s:.0f}s (DAGs not parsed: {missing}); "
                               f"see {home / 'standalone.log'} and `airflow dags list-import-errors`")


def stop(proc: subprocess.Popen) -> int:
    """SIGTERM the whole group (standalone and every component it spawned), then wait."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return proc.wait()
    try:
        return proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()
    finally:
        try:  # components that outlived their parent
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def start_sql_server(say) -> Path | None:
    """The warehouse's query server (what `tidelog sql` and JDBC tools use while Airflow runs):
    the warehouse this process's environment names, the one the DAG forms default to. A
    failure is one line, never fatal: Airflow serves on without it."""
    from spark_jobs import sqlserver
    from spark_jobs.warehouse import default_warehouse

    wh = default_warehouse()
    say(f"starting the SQL query server on {wh} (a Spark JVM: ~25 s) ...")
    try:
        info = sqlserver.start(wh, detach=True)
    except sqlserver.ServerError as e:
        say(f"no SQL query server: {e}")
        return None
    say(f"SQL query server {'up' if info['started'] else 'already running'}: {info['jdbc_url']} "
        f"(TLS; users log in: a cluster's with their own passwords, the warehouse admin's in "
        f"{info.get('admin_credentials')}; tidelog sql uses it; pid {info['pid']}, log {info['log']})")
    return wh if info["started"] else None


def stop_sql_server(wh: Path | None, say) -> None:
    from spark_jobs import sqlserver

    if wh is not None and sqlserver.stop(wh)["stopped"]:
        say("SQL query server stopped")


def main(home: Path, host: str, port: int, log_port: int, ready_timeout_s: float, sql_server: bool = True) -> int:
    def say(msg: str) -> None:
        click.echo(click.style("==> ", fg="cyan", bold=True) + msg)

    home.mkdir(parents=True, exist_ok=True)
    env = environment(home, host, port, log_port)
    url = f"http://{host}:{port}"
    logf = open(home / "standalone.log", "ab")
    say(f"starting airflow standalone (AIRFLOW_HOME={home}, DAGs from {REPO / 'dags'}; log {home / 'standalone.log'})")
    proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), "standalone"], env=env, cwd=home,
                            stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    say(f"airflow standalone is pid {proc.pid} (its own process group)")

    def on_signal(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)   # even when started with SIGINT ignored (a background job)
    ours = None   # the query server this process started (it stops it with Airflow)
    try:
        api = Api(url)
        dags = wait_ready(proc, api, home, ready_timeout_s, say)
        say(click.style(f"Airflow is up: {url}", bold=True))
        say(f"log in as admin; the password is in {home / 'simple_auth_manager_passwords.json.generated'} "
            f"(now: {admin_password(home)})")
        for dag_id in DAG_IDS:
            d = dags[dag_id]
            state = "PAUSED: unpause it with the toggle in the UI" if d["is_paused"] else "active"
            say(f"  {dag_id:<28} {state}  {url}/dags/{dag_id}")
        say(f"reports: each run's 'Tidelog report' tab; Data Docs: {url}/tidelog/data-docs/index.html")
        ours = start_sql_server(say) if sql_server else None
        say("trigger a DAG with the ▶ button to get its form; Ctrl-C stops Airflow")
        rc = proc.wait()
        say(f"airflow standalone exited with {rc}; see {home / 'standalone.log'}")
        stop_sql_server(ours, say)
        return rc or 1
    except KeyboardInterrupt:
        say("stopping Airflow ...")
        stop_sql_server(ours, say)
        stop(proc)
        say("Airflow stopped")
        return 0
    except click.ClickException:
        stop_sql_server(ours, say)
        stop(proc)
        raise
    finally:
        logf.close()
