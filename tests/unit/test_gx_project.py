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
