"""From a new user's report, without a JVM: `tidelog sql` says on stderr when its rows were cut
at --limit (both forms, stdout unchanged; through the query server and a local session, each
asked for one row more), and a wrong table name lists the warehouse's tables; `tidelog validate`
names the run dates the warehouse has, before Great Expectations or Spark load; `tidelog bench
--help` lists the workloads."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from ops.cli.main import cli
from broker.client.security import Credentials
from spark_jobs import sqlsecurity, sqlserver
from spark_jobs.hs2client import Result

ROWS = [("n1", i) for i in range(7)]
NOTE = "(first 5 rows: --limit N for more)"


def tables(wh, *names):
    for t in names:
        (wh / t).mkdir(parents=True)
        (wh / t / "_schema.ddl").write_text("`index` bigint\n")
    return wh


@pytest.fixture
def via_server(monkeypatch, tmp_path):
    """`tidelog sql` on a warehouse whose query server answers with ROWS (its first rows_max),
    logged in as whoever sqlsecurity.client_credentials finds (here: a made-up user)."""
    asked = []

    def query(info, statement, rows_max, credentials=None):
        asked.append(rows_max)
        if "reconciled_logs" in statement:
            raise RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] The table or view `tidelog`.`reconciled_logs` "
                               "cannot be found. SQLSTATE: 42P01; line 1 pos 14")
        return Result(["node", "index"], ROWS[:rows_max])

    monkeypatch.setattr(sqlserver, "running", lambda wh: {"host": "127.0.0.1", "port": 1, "pid": 1})
    monkeypatch.setattr(sqlserver, "query", query)
    monkeypatch.setattr(sqlsecurity, "client_credentials", lambda wh, credentials=None: Credentials("u", "p"))
    return tables(tmp_path / "wh", "replica_entries", "reconciled_log"), asked


def sql(wh, *args):
    return CliRunner().invoke(cli, ["sql", "--warehouse", str(wh), *args])


@pytest.mark.parametrize("form", ["--json", "table"])
def test_rows_cut_at_the_limit_say_so_on_stderr(via_server, form):
    wh, asked = via_server
    r = sql(wh, "SELECT node, index FROM tidelog.replica_entries", "--limit", "5",
            *([form] if form == "--json" else []))
    assert r.exit_code == 0, r.output
    assert asked == [6]  # one more than shown: cut or not, without counting the rest
    assert r.stderr.splitlines() == [NOTE]
    if form == "--json":
        assert json.loads(r.stdout) == [{"node": "n1", "index": i} for i in range(5)]
    else:
        assert r.stdout.splitlines()[3:-1] == [f"|n1  |{i}    |" for i in range(5)]


def test_rows_that_fit_say_nothing(via_server):
    wh, _ = via_server
    for limit in ("7", "50"):
        r = sql(wh, "SELECT node, index FROM tidelog.replica_entries", "--limit", limit, "--json")
        assert r.exit_code == 0 and r.stderr == "" and len(json.loads(r.stdout)) == 7


def test_a_local_session_fetches_one_more_row_and_says_so(monkeypatch, tmp_path):
    fetched = []

    class DF:
        columns = ["node", "index"]

        def limit(self, n):
            fetched.append(n)
            return type("Limited", (), {"collect": lambda _: ROWS[:n]})()

    class Spark:
        def sql(self, q):
            return DF()

        def stop(self):
            pass

    monkeypatch.setattr(sqlserver, "running", lambda wh: None)
    monkeypatch.setattr(sqlserver, "hive_session", lambda wh, master=None: Spark())
    monkeypatch.setattr(sqlserver, "ensure_catalog", lambda wh, spark=None: "current")
    wh = tables(tmp_path / "wh", "replica_entries")
    r = sql(wh, "SELECT node, index FROM tidelog.replica_entries", "--limit", "5", "--json")
    assert r.exit_code == 0, r.output
    assert fetched == [6] and len(json.loads(r.stdout)) == 5 and r.stderr.splitlines() == [NOTE]


def test_a_wrong_table_name_lists_the_warehouses_tables(via_server):
    wh, _ = via_server
    r = sql(wh, "SELECT * FROM tidelog.reconciled_logs")
    assert r.exit_code == 2
    (line,) = r.stderr.splitlines()
    assert line.startswith("error: [TABLE_OR_VIEW_NOT_FOUND] The table or view `tidelog`.`reconciled_logs`")
    assert line.endswith(f"(the tables in {wh}: tidelog.replica_entries, tidelog.reconciled_log)")


def test_with_no_tables_the_hint_stays_the_reconcile(tmp_path, capsys):
    from ops.cli.data_cmds import _answer

    def run(q):
        raise RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] The table or view `tidelog`.`x` cannot be found.")

    assert _answer(run, "SELECT * FROM tidelog.x", tmp_path, False, 50) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: [TABLE_OR_VIEW_NOT_FOUND] The table or view `tidelog`.`x` cannot be found. "
        f"(the tables in {tmp_path} come from `tidelog reconcile --logs DIR --warehouse {tmp_path}`)"]


VALIDATE = textwrap.dedent("""
    import sys
    from click.testing import CliRunner
    import spark_jobs.warehouse
    spark_jobs.warehouse.session = lambda *a, **k: sys.exit("Spark started")  # not for this error
    from ops.cli.main import cli
    r = CliRunner().invoke(cli, sys.argv[1:])
    heavy = sorted(m for m in ("great_expectations",) if m in sys.modules)
    print(r.exit_code, heavy, r.output.strip().splitlines()[-1])
""")


def test_validate_names_the_run_dates_it_has_before_gx_or_spark(tmp_path):
    wh = tables(tmp_path / "wh", "replica_entries", "replica_summary")
    dates = [f"2026-03-0{d}" for d in range(1, 8)]
    for d in dates:
        part = wh / "replica_entries" / f"run_date={d}" / "cluster=prod"
        part.mkdir(parents=True)
        (part / "part-00000-x.c000.snappy.parquet").write_bytes(b"")
        (part / ".part-00000-x.c000.snappy.parquet.crc").write_bytes(b"")
    (wh / "replica_entries" / "run_date=2026-04-01").mkdir()  # no files: no rows
    script = tmp_path / "run.py"  # a file: under `python -c` PySpark's Spark Connect import exits (its doctest check)
    script.write_text(VALIDATE)
    for run_date, which in (("2026-11-22", "its run dates, newest first: 2026-03-07, 2026-03-06, 2026-03-05, "
                                           "2026-03-04, 2026-03-03 and 2 more"),
                            ("2026-04-01", "its run dates, newest first: 2026-03-07")):
        out = subprocess.run([sys.executable, str(script), "validate", "--run-date", run_date, "--warehouse", str(wh)],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        code, heavy, line = out.stdout.strip().split(" ", 2)
        assert (code, heavy) == ("2", "[]"), out.stdout
        assert line.startswith(f"error: replica_entries has no rows for run date {run_date} in {wh}; ")
        assert which in line


def test_bench_help_lists_every_workload_unbroken():
    from bench import fuzz_bench, hop_floor, kafka_bench, reconcile_bench, sql_bench
    from bench.run import FAILOVER, WORKLOADS

    r = CliRunner().invoke(cli, ["bench", "--help"], terminal_width=80)
    assert r.exit_code == 0
    help_words = r.stdout.replace(",", " ").split()
    names = [w.full_name for w in WORKLOADS] + [hop_floor.NAME, FAILOVER, fuzz_bench.NAME, reconcile_bench.NAME,
                                                sql_bench.NAME, *kafka_bench.NAMES]
    assert [n for n in names if n not in help_words] == []
    assert "  master-slave: ms-sync-1slave-c1-w1-async, " in r.stdout


def test_an_unknown_workload_is_still_an_error_naming_it(tmp_path, monkeypatch):
    import bench.run

    def no_cluster(*a, **k):
        raise AssertionError("a workload started beside an unknown name")

    monkeypatch.setattr(bench.run, "LocalCluster", no_cluster)
    r = CliRunner().invoke(cli, ["bench", "-w", "send-c1-w1", "-w", "raft3-failover-x", "--data-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert r.stderr.splitlines()[0] == "error: no such workload: raft3-failover-x"
    assert "raft3-failover," in r.stderr and "send-c1-w1-async," in r.stderr
