"""The scheduled DAGs' timetable (ops.dagkit.CronFromNowTimetable), at the level of
next_dagrun_info with a clock of the test's: no run for a slot that passed before the DAG was
first scheduled or while it was paused; a slot that just fell due still runs; then every slot.
Airflow reads its configuration at import, so the timetable is asked in a child process with
an Airflow of the test's own (tests/airflow_env.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import airflow_env

CHILD = r"""
import datetime as dt, json, sys
from airflow.timetables import trigger
from airflow.timetables.base import DataInterval, TimeRestriction
from ops import dagkit

def at(s):
    return dt.datetime.fromisoformat(s).replace(tzinfo=dt.timezone.utc) if s else None

out = []
for case in json.loads(sys.argv[1]):
    tt = dagkit.schedule(case.get("env", "TIDELOG_TEST_SCHEDULE"), case.get("cron", "0 3 * * *"))
    if tt is None:
        out.append({"type": "NoneType", "next": None, "logical": None})
        continue
    dagkit._utcnow = trigger.utcnow = lambda now=at(case["now"]): now   # ours, and Airflow's own
    last = at(case.get("last"))
    info = tt.next_dagrun_info(
        last_automated_data_interval=DataInterval(last, last) if last else None,
        restriction=TimeRestriction(at(case.get("earliest")), None, case.get("catchup", False)))
    out.append({"type": type(tt).__name__, "next": info and info.run_after.isoformat(),
                "logical": info and info.logical_date.isoformat()})
print("RESULT " + json.dumps(out))
"""


def ask(tmp_path, cases: list[dict]) -> list[dict]:
    e = airflow_env.env(tmp_path / "af", TIDELOG_MANUAL_SCHEDULE="none")
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases)], env=e, cwd=airflow_env.REPO,
                       capture_output=True, text=True, timeout=180)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(line[len("RESULT "):])


def utc(s: str) -> str:
    return s + "+00:00"


# (what happened, now, last scheduled run's slot, the next run it must be)
CASES = [
    # the user's report: first scheduled at 04:27, the 03:00 slot of that day had passed
    ("first start after the day's slot", "2026-11-29T04:27:00", None, "2026-11-30T03:00:00"),
    ("first start before the day's slot", "2026-11-29T02:10:00", None, "2026-11-29T03:00:00"),
    # the DAG processor recomputes the next run every ~30 s: one that just fell due, not yet
    # started by the scheduler, is kept (up to LATE), not pushed to the next day
    ("slot just due, scheduler not there yet", "2026-11-29T03:00:20", None, "2026-11-29T03:00:00"),
    ("slot due 4 minutes ago", "2026-11-29T03:04:00", None, "2026-11-29T03:00:00"),
    ("slot passed 6 minutes ago", "2026-11-29T03:06:00", None, "2026-11-30T03:00:00"),
    # later runs: every slot
    ("the run after the last one", "2026-11-29T02:00:00", "2026-11-28T03:00:00", "2026-11-29T03:00:00"),
    ("the run after the last one, due", "2026-11-29T03:00:30", "2026-11-28T03:00:00", "2026-11-29T03:00:00"),
    ("just after a run", "2026-11-29T03:00:02", "2026-11-29T03:00:00", "2026-11-30T03:00:00"),
    # a manual run of the DAG (max_active_runs=1) held the 03:00 run back for 10 minutes: it
    # is owed (the slot right after the last run) and runs late, not tomorrow
    ("due slot held back by a manual run", "2026-11-29T03:10:00", "2026-11-28T03:00:00", "2026-11-29T03:00:00"),
    ("due slot held back an hour", "2026-11-29T04:00:00", "2026-11-28T03:00:00", "2026-11-29T03:00:00"),
    # paused (or Airflow stopped) from the 26th to the 29th at 04:27: none of the missed slots
    ("unpaused after missed slots", "2026-11-29T04:27:00", "2026-11-25T03:00:00", "2026-11-30T03:00:00"),
    ("unpaused before the day's slot", "2026-11-29T02:27:00", "2026-11-25T03:00:00", "2026-11-29T03:00:00"),
]


OTHERS = [
    # hourly: the slot of 04:00 was 27 minutes ago, the next is 05:00
    ({"cron": "0 * * * *", "now": "2026-11-29T04:27:00"}, "2026-11-29T05:00:00"),
    # a start_date in the future: its first slot
    ({"now": "2026-11-29T04:27:00", "earliest": "2026-12-05T00:00:00"}, "2026-12-05T03:00:00"),
    # catch-up (not what our DAGs use): Airflow's own rule, every slot after the last
    ({"now": "2026-11-29T04:27:00", "last": "2026-11-25T03:00:00", "catchup": True}, "2026-11-26T03:00:00"),
]


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    """Every case asked of one child (an Airflow import takes seconds)."""
    cases = [{"now": now, "last": last} for _, now, last, _ in CASES] + [c for c, _ in OTHERS]
    cases.append({"env": "TIDELOG_MANUAL_SCHEDULE", "now": "2026-11-29T04:27:00"})
    return ask(tmp_path_factory.mktemp("schedule"), cases)


@pytest.mark.parametrize("i", range(len(CASES)), ids=[c[0] for c in CASES])
def test_next_run_is_never_a_missed_slot(answers, i):
    what, _, _, expected = CASES[i]
    got = answers[i]
    assert got["next"] == got["logical"] == utc(expected), what
    assert got["type"] == "CronFromNowTimetable"


def test_other_crons_start_date_catchup_and_manual(answers):
    assert [g["next"] for g in answers[len(CASES):-1]] == [utc(expected) for _, expected in OTHERS]
    assert answers[-1] == {"type": "NoneType", "next": None, "logical": None}   # "none": manual only
