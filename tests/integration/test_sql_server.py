"""Spark SQL as a user meets it: the warehouse's persistent catalog (a new JVM finds
tidelog.reconciled_log with no registration step; a later run date shows up), the query server
(`tidelog sql serve --detach` answers `tidelog sql`; `tidelog sql stop` leaves no process), and
the errors a user makes, each one line with its exit code. The same server meets a local
attacker (issue 39 item 1): no TLS, NOSASL, no or wrong credentials are refused; a cluster's
user who is not an admin reads the warehouse's tables and nothing else (not the security
directory, no ADD JAR, TRANSFORM, reflect, CREATE TABLE there), and a real other local user
(nobody) can neither read the secrets nor log in as the operator. One warehouse for the module
(in a directory other users may enter); every server started here is stopped by pid, even when
a test fails."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import yaml

from broker.client.security import Credentials, write_credentials_file
from broker.security.scram import make_verifier
from ops.localbroker import free_ports, pid_alive
from spark_jobs import craft, hs2client, sqlsecurity, sqlserver
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
def wh():
    """A warehouse with one reconciled date (2026-03-01, 300 indexes), in a directory other
    local users may enter (pytest's own is 0700: the attacker must reach the server's files
    to be refused by them); any query server that a test left running is stopped by its pid
    at the end."""
    tmp = Path(tempfile.mkdtemp(prefix="tidelog-sql-test-"))
    os.chmod(tmp, 0o755)
    wh = tmp / "warehouse"
    try:
        p = reconcile(tmp, wh, "2026-03-01", 300)
        assert "prod 2026-03-01: clean" in p.stdout
        yield wh
    finally:
        info = sqlserver.running(wh)
        if info is not None:
            sqlserver.stop(wh)
            assert not pid_alive(info["pid"])
        shutil.rmtree(tmp, ignore_errors=True)


# A cluster's state on this controller, as `tidelog deploy` leaves it: its users (an admin, an
# application user, one more to be locked out) with their SCRAM verifiers.
PASSWORDS = {"admin": "cluster-admin-pw", "app": "app-pw", "locky": "locky-pw"}
ROLES = {"admin": ["admin"], "app": ["app"], "locky": ["app"]}


def cluster_states(tmp: Path) -> dict:
    """The environment `tidelog sql serve` reads cluster users with: one cluster's state."""
    d = tmp / "clusters" / "prod" / "security"
    d.mkdir(parents=True)
    (d / "users.yaml").write_text(yaml.safe_dump({u: {"password": pw, "roles": ROLES[u], "scram": make_verifier(pw)}
                                                  for u, pw in PASSWORDS.items()}))
    os.chmod(d / "users.yaml", 0o600)
    write_credentials_file(d / "app.credentials.yaml", "app", PASSWORDS["app"], d / "ca.crt")
    return {"TIDELOG_STATE_DIR": str(tmp / "clusters"), "TIDELOG_CLUSTER_DIR": str(tmp / "no-cluster")}


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


def test_query_server_answers_sees_a_new_date_refuses_an_attacker_and_stops(wh, tmp_path):
    reconcile(tmp_path, wh, "2026-03-02", 200)  # written while no server holds the catalog
    states = cluster_states(tmp_path)
    (port,) = free_ports(1)
    p = tidelog("sql", "serve", "--detach", "--warehouse", str(wh), "--port", str(port), "--json", env=states)
    info = json.loads(p.stdout)
    try:
        assert info["user_warnings"] == [] and info["jdbc_url"] == (
            f"jdbc:hive2://127.0.0.1:{port}/tidelog;ssl=true;sslTrustStore={wh}/_catalog/sql-truststore.p12;"
            f"trustStorePassword={sqlsecurity.TRUSTSTORE_PASSWORD}")
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

        the_attacker_is_refused(info, wh, Path(states["TIDELOG_STATE_DIR"]) / "prod" / "security", tmp_path)
        a_local_user_can_neither_read_the_secrets_nor_log_in_as_the_operator(info, wh)

        again = json.loads(tidelog("sql", "serve", "--detach", "--warehouse", str(wh), "--json", env=states).stdout)
        assert again["pid"] == info["pid"] and again["started"] is False
        # the admin's path after all that: the catalog through the server, as the warehouse admin
        (wh / "_catalog" / "tables.json").unlink()
        assert sqlserver.ensure_catalog(wh) == "server"
    finally:
        s = json.loads(tidelog("sql", "stop", "--warehouse", str(wh), "--json").stdout)
    assert s["stopped"] and s["pid"] == info["pid"]
    assert not pid_alive(info["pid"]) and sqlserver.running(wh) is None
    assert not os.path.exists(f"/proc/{info['pid']}")  # exited and collected: `pgrep java` no longer lists it
    assert not os.path.exists(wh / "_catalog" / "sqlserver.json")
    assert json.loads(tidelog("sql", "stop", "--warehouse", str(wh), "--json").stdout)["stopped"] is False


def _impyla(port: int, stmt: str = "SELECT current_user()", conf: dict | None = None, **kw):
    """One statement's rows over a raw impyla connection (the attacker's own client); `conf`:
    the session's settings (OpenSession's configuration)."""
    from impala.dbapi import connect

    c = connect(host="127.0.0.1", port=port, retries=1, **kw)  # one try, not three logins
    try:
        cur = c.cursor(configuration=conf, close_finished_queries=False)
        cur.execute(stmt)
        return cur.fetchall()
    finally:
        try:
            c.close()
        except AttributeError:  # impyla closing a socket the server already closed
            pass


def the_attacker_is_refused(info: dict, wh: Path, cluster_security: Path, tmp: Path) -> None:
    from impala.error import Error as ImpylaError
    from thrift.transport.TTransport import TTransportException

    port, ca, sec = info["port"], str(sqlsecurity.public_ca(wh)), wh / "_catalog" / "security"
    refused = (TTransportException, ImpylaError, OSError, ssl.SSLError)
    tls = {"use_ssl": True, "ca_cert": ca}
    for how in ({"auth_mechanism": "NOSASL"},                               # the old `;auth=noSasl` URL
                {"auth_mechanism": "PLAIN", "user": "app", "password": PASSWORDS["app"]},   # right password, no TLS
                {**tls, "auth_mechanism": "NOSASL"},
                {**tls, "auth_mechanism": "PLAIN"},                         # no credentials (impyla makes some up)
                {**tls, "auth_mechanism": "PLAIN", "user": "app", "password": "wrong"},
                {**tls, "auth_mechanism": "PLAIN", "user": "nobody-here", "password": "x"}):
        with pytest.raises(refused):
            _impyla(port, **how)
    with pytest.raises(refused, match="Proxy user substitution is not allowed"):  # doAs as someone else
        _impyla(port, conf={"hive.server2.proxy.user": "admin"}, **tls, auth_mechanism="PLAIN", user="app",
                password=PASSWORDS["app"])
    assert _impyla(port, **tls, auth_mechanism="PLAIN", user="app", password=PASSWORDS["app"]) == [("app",)]

    app = Credentials("app", PASSWORDS["app"], ca)
    admin = sqlsecurity.catalog_credentials(wh)
    cluster_admin = Credentials("admin", PASSWORDS["admin"], ca)   # a cluster's admin, its own password
    jar = tmp / "evil.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("Evil.class", b"")
    assert sqlserver.query(info, "SELECT count(*) FROM tidelog.reconciled_log", credentials=app).rows == [(500,)]
    assert ("tidelog", "reconciled_log", False) in sqlserver.query(info, "SHOW TABLES", credentials=app).rows
    assert sqlserver.query(info, "DESCRIBE tidelog.replica_summary", credentials=app).rows
    not_allowed = "[TIDELOG_SQL_NOT_ALLOWED] user 'app' is not an admin: "
    for stmt, what in ((f"ADD JAR {jar}", "the command AddJarsCommand"),
                       ("SELECT TRANSFORM(index) USING 'id' AS (a) FROM tidelog.reconciled_log",
                        "TRANSFORM ... USING (runs a program on the server)"),
                       ("SELECT reflect('java.lang.System', 'getProperty', 'user.name')", "reflect()/java_method()"),
                       ("SELECT java_method('java.lang.Runtime', 'getRuntime')", "reflect()/java_method()"),
                       (f"CREATE TABLE tidelog.stolen (v string) USING text LOCATION '{sec}'",
                        "the command CreateDataSourceTableCommand"),
                       ("SET spark.sql.runSQLOnFiles=true", "the command SetCommand")):
        with pytest.raises(hs2client.HS2Error) as e:
            sqlserver.query(info, stmt, credentials=app)
        assert str(e.value).startswith(not_allowed + what), (stmt, str(e.value))
    # the files by path: off for every session, and a session that turns it back on (OpenSession
    # may set any runtime setting) meets the guard
    with pytest.raises(hs2client.HS2Error, match="TABLE_OR_VIEW_NOT_FOUND"):
        sqlserver.query(info, f"SELECT * FROM text.`{sec}`", credentials=app)
    for path in (sec, sec / "ca.key", wh / "reconciled_log"):
        with pytest.raises(refused, match=r"user 'app' is not an admin: reading files by their path \(file:"):
            _impyla(port, f"SELECT * FROM text.`{path}`", {"set:hiveconf:spark.sql.runSQLOnFiles": "true"}, **tls, auth_mechanism="PLAIN", user="app", password=PASSWORDS["app"])
    # nothing of what was refused ran: no jar, no table (the check runs before a command does)
    assert not [r for r in sqlserver.query(info, "LIST JARS", credentials=admin).rows if "evil" in str(r)]
    assert "stolen" not in {r[1] for r in sqlserver.query(info, "SHOW TABLES IN tidelog", credentials=admin).rows}
    assert sqlserver.query(info, "SELECT current_user()", credentials=cluster_admin).rows == [("admin",)]
    assert sqlserver.query(info, "LIST JARS", credentials=cluster_admin).columns  # an admin's command: allowed

    q = tidelog("sql", "--credentials", str(cluster_security / "app.credentials.yaml"), "--warehouse", str(wh),
                "--json", "SELECT count(*) AS n FROM reconciled_log")
    assert json.loads(q.stdout) == [{"n": 500}]
    e = tidelog("sql", "--credentials", str(cluster_security / "app.credentials.yaml"), "--warehouse", str(wh),
                f"ADD JAR {jar}", check=False)
    assert e.returncode == 1 and e.stderr.splitlines()[0].startswith(f"error: {not_allowed}the command AddJarsCommand")
    e = tidelog("sql", "--warehouse", str(wh), "SELECT 1", check=False,
                env={"TIDELOG_USERNAME": "app", "TIDELOG_PASSWORD": "wrong"})
    assert e.returncode == 1 and e.stderr.splitlines() == [
        f"error: the query server 127.0.0.1:{port} refused the login of user 'app' (unknown user or wrong password; "
        "credentials from the environment (TIDELOG_USERNAME...): give --credentials FILE, or TIDELOG_USERNAME and "
        "TIDELOG_PASSWORD)"]

    # failed logins are bounded: after 5 in a row the name is locked, the right password too
    locky = Credentials("locky", PASSWORDS["locky"], ca)
    for _ in range(5):
        with pytest.raises(hs2client.LoginRefused):
            sqlserver.query(info, "SELECT 1", credentials=Credentials("locky", "guess", ca))
    with pytest.raises(hs2client.LoginRefused):
        sqlserver.query(info, "SELECT 1", credentials=locky)
    log = Path(info["log"]).read_text()
    assert "login refused for user 'locky': locked for" in log and "refused for user 'app': the command AddJarsCommand" in log
    assert oct(os.stat(info["log"]).st_mode & 0o777) == "0o600"


AS_NOBODY = """
import sys
from pathlib import Path
sec = Path(sys.argv[1])
for f in ("ca.key", "sql-server.key", "server.p12", "users.yaml", "admin.credentials.yaml"):
    try:
        (sec / f).read_bytes()
        print("read", f)
    except PermissionError:
        print("denied", f)
"""


def a_local_user_can_neither_read_the_secrets_nor_log_in_as_the_operator(info: dict, wh: Path) -> None:
    """As the local user nobody (when this runs as root: CI does)."""
    if os.geteuid() != 0 or not shutil.which("runuser"):
        import warnings
        warnings.warn("not root: the other local user's part of the attacker test did not run")
        return

    def as_nobody(*args, env=None):
        return subprocess.run(["runuser", "-u", "nobody", "--", "env", "HOME=/tmp", *(env or []), sys.executable, *args],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)

    p = as_nobody("-c", AS_NOBODY, str(wh / "_catalog" / "security"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["denied", "ca.key", "denied", "sql-server.key", "denied", "server.p12",
                                "denied", "users.yaml", "denied", "admin.credentials.yaml"]
    p = as_nobody("-m", "ops.cli.main", "sql", "--warehouse", str(wh), "SELECT * FROM tidelog.reconciled_log")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"error: the query server of {wh} needs a user: give --credentials FILE (a user's credentials file, e.g. a "
        "cluster's <state>/security/<user>.credentials.yaml) or TIDELOG_USERNAME and TIDELOG_PASSWORD (the warehouse "
        f"admin's are in {wh}/_catalog/security/admin.credentials.yaml, readable by the server's operator)"], p.stderr
    p = as_nobody("-m", "ops.cli.main", "sql", "--warehouse", str(wh), "--json", "SELECT count(*) AS n FROM reconciled_log",
                  env=["TIDELOG_USERNAME=app", f"TIDELOG_PASSWORD={PASSWORDS['app']}"])
    assert p.returncode == 0 and json.loads(p.stdout) == [{"n": 500}], p.stderr
