"""Spark SQL as a user meets it: the warehouse's persistent catalog (a new JVM finds
tidelog.reconciled_log with no registration step; a later run date shows up), the query server
(`tidelog sql serve --detach` answers `tidelog sql`; `tidelog sql stop` leaves no process), and
the errors a user makes, each one line with its exit code. One warehouse for the module; every
server started here is stopped by pid, even when a test fails."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ops.localbroker import free_ports, pid_alive
from spark_jobs import craft, sqlserver
from spark_jobs.craft import E, Node
from spark_jobs.warehouse import existing_tables, spark_sql_command
from tests.helpers import run_tidelog as tidelog

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SEG = 64 << 10
STATUS_QUERY = "SELECT status, count(*) AS n FROM tidelog.reconciled_log GROUP BY status"


def reconcile(tmp: Path, wh: Path, date: str, entries: int):
    logs = craft.write_cluster(tmp / f"logs-{date}", "prod",
                               [Node(n, [E(i, 1) for i in range(entries)], entries - 1) for n in ("n1", "n2", "n3")],
                               segment_bytes=SEG).parent
    return tidelog("reconcile", "--logs", str(logs), "--run-date", date, "--warehouse", str(wh), "--no-validate")


def no_stack(p) -> None:
    out = p.stdout + p.stderr
    assert "Traceback" not in out and "at org.apache" not in out


@pytest.fixture(scope="module")
def wh(tmp_path_factory):
    """A warehouse with one reconciled date (2026-03-01, 300 indexes); any query server that
    a test left running is stopped by its pid at the end."""
    tmp = tmp_path_factory.mktemp("sql")
    wh = tmp / "warehouse"
    p = reconcile(tmp, wh, "2026-03-01", 300)
    assert "prod 2026-03-01: clean" in p.stdout
    try:
        yield wh
    finally:
        info = sqlserver.running(wh)
        if info is not None:
            sqlserver.stop(wh)
            assert not pid_alive(info["pid"])


def test_bad_input_is_one_line_before_spark_starts(tmp_path):
    v = tidelog("validate", "--run-date", "2026-99-01", "--warehouse", str(tmp_path), check=False)
    assert v.returncode == 2 and v.stderr.splitlines() == ["error: --run-date '2026-99-01' is not a date (YYYY-MM-DD)"]
    for args in (("sql", STATUS_QUERY), ("validate", "--run-date", "2026-03-01")):
        p = tidelog(*args, "--warehouse", str(tmp_path / "none"), check=False)
        assert p.returncode == 2 and p.stderr.splitlines() == [
            f"error: no warehouse at {tmp_path / 'none'}: run `tidelog reconcile --logs DIR --warehouse "
            f"{tmp_path / 'none'}` first"]


def test_a_new_jvm_finds_the_tables_with_no_registration_step(wh):
    """The reconcile (its own JVMs) put the tables in the warehouse's catalog; pyspark's own
    spark-sql, as the reconcile printed it, queries tidelog.reconciled_log by name."""
    assert json.loads((wh / "_catalog" / "tables.json").read_text())[0] == "CREATE DATABASE IF NOT EXISTS tidelog"
    p = subprocess.run(["bash", "-c", f"{spark_sql_command(wh)} -e \"{STATUS_QUERY}\""], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.splitlines() == ["consistent\t300"]


def test_cold_path_parse_error_is_one_line(wh):
    p = tidelog("sql", "SELEC x", "--warehouse", str(wh), "-v", check=False)
    assert p.returncode == 1
    assert "via a local Spark session" in p.stderr
    assert "error: [PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'" in p.stderr
    no_stack(p)


def test_cold_path_says_when_rows_were_cut_at_the_limit(wh):
    p = tidelog("sql", "SELECT node, index FROM tidelog.replica_entries ORDER BY node, index", "--limit", "3",
                "--warehouse", str(wh))
    assert p.stdout.splitlines()[3:-1] == ["|n1  |0    |", "|n1  |1    |", "|n1  |2    |"]
    assert p.stderr.splitlines()[-1:] == ["(first 3 rows: --limit N for more)"]
    no_stack(p)


def test_validate_names_the_run_dates_there_are_before_spark(wh):
    p = tidelog("validate", "--run-date", "2026-11-22", "--warehouse", str(wh), check=False)
    (line,) = p.stderr.splitlines()
    assert p.returncode == 2 and line.startswith(
        f"error: replica_entries has no rows for run date 2026-11-22 in {wh}; its run dates, newest first: ")
    assert "2026-03-01" in line


def test_query_server_answers_sees_a_new_date_and_stops(wh, tmp_path):
    reconcile(tmp_path, wh, "2026-03-02", 200)  # written while no server holds the catalog
    (port,) = free_ports(1)
    p = tidelog("sql", "serve", "--detach", "--warehouse", str(wh), "--port", str(port), "--json")
    info = json.loads(p.stdout)
    try:
        assert info["port"] == port and info["host"] == "127.0.0.1" and pid_alive(info["pid"])
        assert sqlserver.running(wh)["pid"] == info["pid"]
        q = tidelog("sql", STATUS_QUERY, "--warehouse", str(wh), "--json", "-v")
        assert q.stderr.splitlines() == [f"via the query server 127.0.0.1:{port} (pid {info['pid']})"]
        assert json.loads(q.stdout) == [{"status": "consistent", "n": 500}]
        q = tidelog("sql", "SELECT node, index FROM tidelog.replica_entries", "--warehouse", str(wh), "--json")
        assert len(json.loads(q.stdout)) == 50 and q.stderr.splitlines() == ["(first 50 rows: --limit N for more)"]
        q = tidelog("sql", "SELECT run_date, count(*) AS n, max(replicas) AS r FROM reconciled_log GROUP BY run_date "
                           "ORDER BY run_date", "--warehouse", str(wh), "--json")
        assert json.loads(q.stdout) == [{"run_date": "2026-03-01", "n": 300, "r": ["n1", "n2", "n3"]},
                                        {"run_date": "2026-03-02", "n": 200, "r": ["n1", "n2", "n3"]}]
        t = tidelog("sql", "SELECT node, lag FROM tidelog.replica_summary WHERE run_date = '2026-03-02' ORDER BY node",
                    "--warehouse", str(wh))
        assert t.stdout.splitlines()[1:6] == ["|node|lag|", "+----+---+", "|n1  |0  |", "|n2  |0  |", "|n3  |0  |"]

        e = tidelog("sql", "SELEC x", "--warehouse", str(wh), check=False)
        assert e.returncode == 1 and e.stderr.splitlines() == [
            "error: [PARSE_SYNTAX_ERROR] Syntax error at or near 'SELEC'. SQLSTATE: 42601 (line 1, pos 0)"]
        e = tidelog("sql", "SELECT * FROM tidelog.reconciled_logs", "--warehouse", str(wh), check=False)
        (line,) = e.stderr.splitlines()
        assert e.returncode == 2 and line.startswith(
            "error: [TABLE_OR_VIEW_NOT_FOUND] The table or view `tidelog`.`reconciled_logs`")
        assert line.endswith(f"(the tables in {wh}: {', '.join(f'tidelog.{t}' for t in existing_tables(wh))})")
        assert "tidelog.reconciled_log," in line
        no_stack(e)

        again = json.loads(tidelog("sql", "serve", "--detach", "--warehouse", str(wh), "--json").stdout)
        assert again["pid"] == info["pid"] and again["started"] is False
    finally:
        s = json.loads(tidelog("sql", "stop", "--warehouse", str(wh), "--json").stdout)
    assert s["stopped"] and s["pid"] == info["pid"]
    assert not pid_alive(info["pid"]) and sqlserver.running(wh) is None
    assert not os.path.exists(f"/proc/{info['pid']}")  # exited and collected: `pgrep java` no longer lists it
    assert not os.path.exists(wh / "_catalog" / "sqlserver.json")
    assert json.loads(tidelog("sql", "stop", "--warehouse", str(wh), "--json").stdout)["stopped"] is False
