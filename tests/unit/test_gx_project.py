"""The GX project committed in expectations/gx matches the suites defined in code, so a run
never has to rewrite (and dirty) it, and every expectation says what it checks."""

from __future__ import annotations

from pathlib import Path

import great_expectations as gx

import expectations
from expectations.suites import SUITES
from expectations.validate import _same, context

COMMITTED = Path(expectations.__file__).resolve().parent   # not TIDELOG_GX_ROOT: the tests' copy


def test_committed_suites_match_the_code():
    ctx = context(COMMITTED)
    for table, build in SUITES.items():
        stored = ctx.suites.get(table)
        assert _same(stored, gx.ExpectationSuite(name=table, expectations=build())), table
        assert ctx.checkpoints.get(f"tidelog_{table}").validation_definitions[0].suite.name == table


def test_every_expectation_is_described_once():
    descriptions = [e.description for build in SUITES.values() for e in build()]
    assert all(descriptions) and len(set(descriptions)) == len(descriptions)


def test_each_test_process_validates_into_a_gx_project_of_its_own(tmp_path):
    """An xdist worker inherits the controller's TIDELOG_GX_ROOT and makes its own copy (two
    workers validating into one project rebuild each other's Data Docs); a root the user set
    is kept. Run as a fresh process importing the conftest, as a worker does."""
    import os
    import subprocess
    import sys

    repo = COMMITTED.parent
    show = "import os, tests.conftest; print(os.environ['TIDELOG_GX_ROOT'])"

    def root_seen(**env) -> str:
        e = {k: v for k, v in os.environ.items() if k not in ("TIDELOG_GX_ROOT", "TIDELOG_TEST_GX_ROOT_PID")}
        r = subprocess.run([sys.executable, "-c", show], cwd=repo, env={**e, **env}, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.strip()

    inherited = root_seen(TIDELOG_GX_ROOT=str(tmp_path), TIDELOG_TEST_GX_ROOT_PID="1")
    assert inherited != str(tmp_path)
    assert root_seen(TIDELOG_GX_ROOT=str(tmp_path)) == str(tmp_path)   # the user's own
    assert root_seen() != str(COMMITTED)
