"""What the DAG files share: their Params (the UI's trigger forms), defaults, schedules, and
the glue from a task to `ops.dagtasks`. Imported only by `dags/` (it imports Airflow).

Defaults come from the environment the DAG processor runs in (`tidelog airflow` sets them),
so one Airflow can point its forms at another spec or warehouse without editing DAG files:

    TIDELOG_SPEC                  cluster spec the forms start with (infra/examples/local-raft3.yaml)
    TIDELOG_WAREHOUSE             reconciled tables (~/.tidelog/warehouse)
    TIDELOG_DRILL_REPORTS         drill reports, one directory per DAG run (~/.tidelog/drill-reports)
    TIDELOG_COLLECT_DIR           collected replica logs, one directory per run date (~/.tidelog/collected)
    TIDELOG_DRILL_SCHEDULE        cron for tidelog_failover_drill ("0 1 * * *"; "none": manual only)
    TIDELOG_RECONCILE_SCHEDULE    cron for tidelog_reconcile_nightly ("0 3 * * *"; "none": manual only)

Schedules are CronFromNowTimetable (below): no run for a slot that passed before the DAG was
scheduled or while it was paused.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

from airflow.sdk import Param, get_current_context
from airflow.timetables.base import DagRunInfo
from airflow.timetables.trigger import CronTriggerTimetable

from ops import dagtasks
from ops.dagtasks import TaskFailed

REPO = Path(__file__).resolve().parents[1]
TAGS = ["tidelog"]
NEMESES = ["kill-leader", "kill-random", "pause-leader", "partition-leader", "isolate-random", "mixed",
           "isolated-restart", "partition-then-kill", "kill-during-transfer", "kill-namesrv",
           "kill-namesrv-and-leader"]  # = ops.drill.nemesis.NAMES


def home_dir(env: str, default: str) -> str:
    return os.environ.get(env) or str(Path.home() / ".tidelog" / default)


def default_spec() -> str:
    return os.environ.get("TIDELOG_SPEC") or str(REPO / "infra" / "examples" / "local-raft3.yaml")


def schedule(env: str, default_cron: str):
    """A cron from the environment ("none": triggered by hand only), as a CronFromNowTimetable:
    the first run is the next slot after the DAG is first scheduled, then every slot; unpausing
    a DAG does not start a run for a missed slot."""
    cron = os.environ.get(env, default_cron).strip()
    if cron.lower() in ("", "none", "manual"):
        return None
    return CronFromNowTimetable(cron, timezone="UTC")


def _utcnow() -> dt.datetime:   # the timetable's clock (the tests set it)
    return dt.datetime.now(dt.timezone.utc)


class CronFromNowTimetable(CronTriggerTimetable):
    """Airflow's CronTriggerTimetable, but a slot that passed unrun is skipped, not run late.

    Without catch-up, Airflow's own (3.3) always offers the latest past slot, so a DAG first
    scheduled at 04:27 ran its 03:00 slot at once (run_immediately=False changes nothing). Here
    the next run is the latest of: the slot after the last scheduled run, the first slot at or
    after the DAG's start_date, and the due slot: the latest slot if it is owed (the one right
    after the last scheduled run: a run that could not start on time, e.g. behind a manual run of
    the same DAG with max_active_runs=1, still runs, however late) or at most LATE old (the
    scheduler's leeway to start a run that just fell due: the DAG processor recomputes the next
    run every ~30 s and must not skip one the scheduler is about to start), else the next one.
    So the first run is the next slot, later runs every slot, and when a pause (or a stopped
    Airflow) missed two slots or more, none of them runs (the DAG processor keeps a paused
    DAG's next run up to date); a pause that missed only the slot right after the last run
    runs that one on unpausing, as Airflow's own would. One gap: the next run the DB held when Airflow stopped, if its slot passed meanwhile,
    runs when the scheduler gets to it before the DAG processor re-reads the DAG. Manual runs
    are not affected.

    Registered in the `tidelog` Airflow plugin (`timetables`): Airflow serializes a custom
    timetable by its import path and finds the class again only among the plugins' timetables.
    """

    LATE = dt.timedelta(minutes=5)

    @property
    def expression(self) -> str:   # as airflow.sdk's CronTriggerTimetable has it
        return self._expression

    def next_dagrun_info(self, *, last_automated_data_interval, restriction):
        if restriction.catchup:
            return super().next_dagrun_info(last_automated_data_interval=last_automated_data_interval,
                                            restriction=restriction)
        from airflow.sdk.timezone import coerce_datetime

        now = coerce_datetime(_utcnow())
        latest = self._align_to_prev(now)
        owed = last_automated_data_interval is not None and \
            self._get_next(last_automated_data_interval.end) == latest  # the slot right after the last run
        candidates = [latest if owed or now - latest <= self.LATE else self._align_to_next(now)]
        if last_automated_data_interval is not None:
            candidates.append(self._get_next(last_automated_data_interval.end))
        if restriction.earliest is not None:
            candidates.append(self._align_to_next(restriction.earliest))
        start = max(candidates)
        if restriction.latest is not None and restriction.latest < start:
            return None
        return DagRunInfo.interval(coerce_datetime(start - self._interval), start)


DEFAULT_ARGS = {"owner": "tidelog", "retries": 0}


def spec_param() -> Param:
    return Param(default_spec(), type="string", title="Cluster spec",
                 description="Path (on the Airflow worker) of the cluster spec YAML: hosts, provider, groups. "
                             "SSH credentials may come from the Airflow connection its ssh.connection_id names.")


def group_param(empty: str = "the first group") -> Param:
    """The form's broker-group field: a group name from the spec (g0, g1, ...); `empty` says
    what a run with the field left empty acts on."""
    return Param(None, type=["null", "string"], title="Broker group", pattern=r"^[A-Za-z0-9_.-]*$",
                 description=f"The spec's group to act on (its name, e.g. g0); empty: {empty}.")


def params_of() -> dict:
    return dict(get_current_context()["params"])


def run_date() -> str:
    """The run's date: the logical date, or (a run triggered with no logical date) the day it
    was asked to run."""
    ctx = get_current_context()
    when = ctx.get("logical_date") or ctx["dag_run"].run_after
    return (when or dt.datetime.now(dt.timezone.utc)).date().isoformat()


def announce(key: str, value) -> None:
    """An XCom other views read while the task is still running or after it failed."""
    get_current_context()["ti"].xcom_push(key=key, value=value)


def ui_url(path: str) -> str:
    """An absolute link into this Airflow's web server (its api.base_url)."""
    from airflow.configuration import conf

    return conf.get("api", "base_url", fallback="").rstrip("/") + path


def run_path() -> str:
    """<dag id>/<run id> of the current run, quoted for a URL."""
    from urllib.parse import quote

    ctx = get_current_context()
    return f"{quote(ctx['dag'].dag_id, safe='')}/{quote(ctx['run_id'], safe='')}"


def run_dir_name() -> str:
    return dagtasks.safe_name(get_current_context()["run_id"])


# The task log is what an operator reads: our lines at INFO; the libraries a task drives only
# when they warn (GX logs every metric it computes, py4j every gateway call).
TASK_LOG = logging.getLogger("tidelog.task")
QUIET_LIBRARIES = ("great_expectations", "py4j", "pyspark", "paramiko", "matplotlib", "PIL", "urllib3")


def say(msg: str) -> None:
    """Into the task log, through the logging channel: print() goes through the task's stdout,
    a separate stream that Airflow interleaves with the log in arrival order, not in call order."""
    TASK_LOG.info(msg)


def quiet_libraries() -> None:
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING)


def run(fn, *args, **kwargs):
    """Call an ops.dagtasks function; a TaskFailed fails the task at once (no retries: a red run
    is the answer, not a transient error) with its message as the log's last word."""
    from airflow.sdk.exceptions import AirflowFailException

    quiet_libraries()
    TASK_LOG.setLevel(logging.INFO)
    try:
        return fn(*args, log=say, **kwargs)
    except TaskFailed as e:
        say(f"FAILED: {e}")
        raise AirflowFailException(str(e)) from None
    except dagtasks.operational_errors() as e:
        say(f"FAILED: {type(e).__name__}: {e}")
        raise AirflowFailException(f"{type(e).__name__}: {e}") from None
