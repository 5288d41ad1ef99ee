"""`tidelog reconcile` without its collection directory and `tidelog validate` without a
warehouse say so before they load Spark's or Great Expectations' modules (GX alone took ~6 s
to import here: the error came after 10-12 s)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    from click.testing import CliRunner
    from ops.cli.main import cli
    r = CliRunner().invoke(cli, sys.argv[1:])
    heavy = sorted(m for m in ("great_expectations", "pyspark") if m in sys.modules)
    print(r.exit_code, heavy, r.output.strip().splitlines()[-1])
""")


@pytest.mark.parametrize("args,error", [
    (["reconcile", "--logs", "{tmp}/absent", "--warehouse", "{tmp}/wh"], "no collection directory"),
    (["validate", "--warehouse", "{tmp}/wh", "--run-date", "2026-01-01"], "no warehouse at"),
], ids=["reconcile", "validate"])
def test_bad_input_is_told_before_spark_or_gx_load(tmp_path, args, error):
    script = tmp_path / "run.py"  # a file: under `python -c` PySpark's Spark Connect import exits (its doctest check)
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), *(a.format(tmp=tmp_path) for a in args)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    code, rest = out.stdout.split(" ", 1)
    assert code == "2" and rest.startswith("[] ") and error in rest, out.stdout
