"""`tidelog reconcile` with a collection directory that is not there says so before it loads
Spark's or Great Expectations' modules (GX alone took ~6 s to import here: the error came
after 12 s)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import sys
    from click.testing import CliRunner
    from ops.cli.main import cli
    r = CliRunner().invoke(cli, ["reconcile", "--logs", sys.argv[1], "--warehouse", sys.argv[2]])
    heavy = sorted(m for m in ("great_expectations", "pyspark") if m in sys.modules)
    print(r.exit_code, heavy, r.output.strip().splitlines()[-1])
""")


def test_a_missing_collection_directory_is_told_before_spark_or_gx_load(tmp_path):
    script = tmp_path / "run.py"  # a file: under `python -c` PySpark's Spark Connect import exits (its doctest check)
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "absent"), str(tmp_path / "wh")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    code, rest = out.stdout.split(" ", 1)
    assert code == "2" and rest.startswith("[] ") and "no collection directory" in rest, out.stdout
