"""Spark SQL as a user meets it: the warehouse's persistent catalog (a new JVM finds
tidelog.reconciled_log with no registration step; a later run date shows up), the query server
(`tidelog sql serve --detach` answers `tidelog sql`; `tidelog sql stop` leaves no process), and
the errors a user makes, each one line with its exit code. The same server meets a local
attacker (issue 39 item 1): no TLS, NOSASL, no or wrong credentials are refused; a cluster's
user who is not an admin reads the warehouse's tables and nothing else (not the security
directory, no ADD JAR, TRANSFORM, reflect, CREATE TABLE there), and a real other local user
(nobody; skipped when not root) can neither read the secrets nor log in as the operator. Its
users follow the clusters': a user deleted at runtime is refused at once, a name an admin and a
plain user share is no SQL admin, and locking out the public name admin leaves the platform's
own path (the warehouse admin) working. One warehouse and one query server for the module (in
a directory other users may enter); every server started here is stopped by pid, even when a
test fails."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import stat
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


# Two clusters' state on this controller, as `tidelog deploy` leaves it (users.yaml with SCRAM
# verifiers, roles.yaml, the admin's credentials naming the nodes). Each check below has users
# of its own, so none depends on what another did to its names (locked them, deleted them):
#   app    reads the tables; meets the guard        locky  locked out by 5 wrong passwords
#   gone   deleted at runtime (tidelog user delete)  admin  the public name every cluster has: locked
#   dup    plain in prod, an admin in stage: no SQL admin with either password
PROD_BOOTSTRAP = "127.0.0.1:19871"
CLUSTERS = {
    "prod": {"admin": ("prod-admin-pw", ["admin"]), "app": ("app-pw", ["app"]), "locky": ("locky-pw", ["app"]),
             "gone": ("gone-pw", ["app"]), "dup": ("dup-prod-pw", ["app"])},
    "stage": {"dup": ("dup-stage-pw", ["ops"])},
}
ROLES = {"prod": {"app": {"sub": ["*"]}}, "stage": {"ops": {"admin": True}}}


def cluster_states(tmp: Path) -> dict:
    """The environment `tidelog sql serve` reads cluster users with (and where its server is listed)."""
    for name, users in CLUSTERS.items():
        d = tmp / "clusters" / name / "security"
        d.mkdir(parents=True)
        (d / "users.yaml").write_text(yaml.safe_dump(
            {u: {"password": pw, "roles": roles, "scram": make_verifier(pw)} for u, (pw, roles) in users.items()}))
        (d / "roles.yaml").write_text(yaml.safe_dump({"admin": {"admin": True}, **ROLES[name]}))
        for f in ("users.yaml", "roles.yaml"):
            os.chmod(d / f, 0o600)
        write_credentials_file(d / "app.credentials.yaml", "app", CLUSTERS["prod"]["app"][0], d / "ca.crt")
        write_credentials_file(d / "admin.credentials.yaml", "admin", users.get("admin", ("x",))[0], d / "ca.crt",
                               PROD_BOOTSTRAP if name == "prod" else None)
    return {"TIDELOG_STATE_DIR": str(tmp / "clusters"), "TIDELOG_CLUSTER_DIR": str(tmp / "no-cluster"),
            "TIDELOG_SQL_SERVERS_DIR": str(tmp / "sql-servers")}


def password(user: str, cluster: str = "prod") -> str:
    return CLUSTERS[cluster][user][0]


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


@pytest.fixture(scope="module")
def server(wh, tmp_path_factory):
    """The module's one query server (one JVM), on `wh` with a second run date reconciled while
    no server held the catalog, and both clusters' users; stopped by its pid at the end (the
    last test stops it as a user does, and checks)."""
    tmp = tmp_path_factory.mktemp("server")
    reconcile(tmp, wh, "2026-03-02", 200)
    states = cluster_states(tmp)
    (port,) = free_ports(1)
    p = tidelog("sql", "serve", "--detach", "--warehouse", str(wh), "--port", str(port), "--json", env=states)
    info = json.loads(p.stdout)
    info["states"], info["tmp"] = states, tmp
    try:
        yield info
    finally:
        if sqlserver.running(wh) is not None:
            sqlserver.stop(wh)
        assert not pid_alive(info["pid"])


def test_query_server_answers_and_sees_a_new_date(server, wh):
    info, port = server, server["port"]
    stage, prod = (Path(server["states"]["TIDELOG_STATE_DIR"]) / c / "security" for c in ("stage", "prod"))
    assert info["user_warnings"] == [
        f"user 'dup' is an admin in {stage} but not in {prod}: it is no SQL admin (the server tells sessions apart "
        "by name; give one of them another name)"]
    assert info["jdbc_url"] == (
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


def refused_errors() -> tuple:
    from impala.error import Error as ImpylaError
    from thrift.transport.TTransport import TTransportException

    return TTransportException, ImpylaError, OSError, ssl.SSLError


def test_the_attacker_is_refused(server, wh):
    info, tmp = server, server["tmp"]
    cluster_security = Path(server["states"]["TIDELOG_STATE_DIR"]) / "prod" / "security"
    port, ca, sec = info["port"], str(sqlsecurity.public_ca(wh)), wh / "_catalog" / "security"
    refused = refused_errors()
    tls = {"use_ssl": True, "ca_cert": ca}
    for how in ({"auth_mechanism": "NOSASL"},                               # the old `;auth=noSasl` URL
                {"auth_mechanism": "PLAIN", "user": "app", "password": password("app")},   # right password, no TLS
                {**tls, "auth_mechanism": "NOSASL"},
                {**tls, "auth_mechanism": "PLAIN"},                         # no credentials (impyla makes some up)
                {**tls, "auth_mechanism": "PLAIN", "user": "app", "password": "wrong"},
                {**tls, "auth_mechanism": "PLAIN", "user": "nobody-here", "password": "x"}):
        with pytest.raises(refused):
            _impyla(port, **how)
    with pytest.raises(refused, match="Proxy user substitution is not allowed"):  # doAs as someone else
        _impyla(port, conf={"hive.server2.proxy.user": sqlsecurity.ADMIN_USER}, **tls, auth_mechanism="PLAIN",
                user="app", password=password("app"))
    assert _impyla(port, **tls, auth_mechanism="PLAIN", user="app", password=password("app")) == [("app",)]

    app = Credentials("app", password("app"), ca)
    admin = sqlsecurity.catalog_credentials(wh)
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
            _impyla(port, f"SELECT * FROM text.`{path}`", {"set:hiveconf:spark.sql.runSQLOnFiles": "true"}, **tls,
                    auth_mechanism="PLAIN", user="app", password=password("app"))
    # nothing of what was refused ran: no jar, no table (the check runs before a command does)
    assert not [r for r in sqlserver.query(info, "LIST JARS", credentials=admin).rows if "evil" in str(r)]
    assert "stolen" not in {r[1] for r in sqlserver.query(info, "SHOW TABLES IN tidelog", credentials=admin).rows}
    assert sqlserver.query(info, "SELECT current_user()", credentials=admin).rows == [(sqlsecurity.ADMIN_USER,)]
    assert sqlserver.query(info, "LIST JARS", credentials=admin).columns  # an admin's command: allowed

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
    locky = Credentials("locky", password("locky"), ca)
    for _ in range(5):
        with pytest.raises(hs2client.LoginRefused):
            sqlserver.query(info, "SELECT 1", credentials=Credentials("locky", "guess", ca))
    with pytest.raises(hs2client.LoginRefused):
        sqlserver.query(info, "SELECT 1", credentials=locky)
    log = Path(info["log"]).read_text()
    assert "login refused for user 'locky': locked after 5 failed logins" in log and "refused for user 'app': the command AddJarsCommand" in log
    assert oct(os.stat(info["log"]).st_mode & 0o777) == "0o600"


AS_NOBODY = """
import sys
from pathlib import Path
sec = Path(sys.argv[1])
for f in ("ca.key", "sql-server.key", "server.p12", "users.yaml", sys.argv[2]):
    try:
        (sec / f).read_bytes()
        print("read", f)
    except PermissionError:
        print("denied", f)
"""


def test_a_local_user_can_neither_read_the_secrets_nor_log_in_as_the_operator(server, wh):
    """As the local user nobody (CI runs as root; elsewhere this is skipped, and says so)."""
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("needs root and runuser: it runs as the local user nobody")

    def as_nobody(*args, env=None):
        return subprocess.run(["runuser", "-u", "nobody", "--", "env", "HOME=/tmp", *(env or []), sys.executable, *args],
                              capture_output=True, text=True, timeout=120, cwd=ROOT)

    with traversable_by_others(ROOT, Path(sys.executable).parent):
        nobody_runs_the_cli(as_nobody, wh)


@contextlib.contextmanager
def traversable_by_others(*paths):
    """Let other users pass through (o+x, never read) the directories above `paths` that a
    checkout placed where only its owner may (`mktemp -d` makes 0700): nobody must be able to
    run this checkout's interpreter and code; restored afterwards."""
    changed = []
    for p in paths:
        for d in [Path(p).resolve(), *Path(p).resolve().parents]:
            mode = d.stat().st_mode
            if not mode & stat.S_IXOTH and d not in (c for c, _ in changed):
                os.chmod(d, stat.S_IMODE(mode) | stat.S_IXOTH)
                changed.append((d, mode))
    try:
        yield
    finally:
        for d, mode in reversed(changed):
            os.chmod(d, stat.S_IMODE(mode))


def nobody_runs_the_cli(as_nobody, wh):
    p = as_nobody("-c", AS_NOBODY, str(wh / "_catalog" / "security"), sqlsecurity.ADMIN_CREDENTIALS)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["denied", "ca.key", "denied", "sql-server.key", "denied", "server.p12",
                                "denied", "users.yaml", "denied", sqlsecurity.ADMIN_CREDENTIALS]
    p = as_nobody("-m", "ops.cli.main", "sql", "--warehouse", str(wh), "SELECT * FROM tidelog.reconciled_log")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"error: the query server of {wh} needs a user: give --credentials FILE (a user's credentials file, e.g. a "
        "cluster's <state>/security/<user>.credentials.yaml) or TIDELOG_USERNAME and TIDELOG_PASSWORD (the warehouse "
        f"admin's are in {sqlsecurity.admin_credentials_file(wh)}, readable by the server's operator)"], p.stderr
    p = as_nobody("-m", "ops.cli.main", "sql", "--warehouse", str(wh), "--json", "SELECT count(*) AS n FROM reconciled_log",
                  env=["TIDELOG_USERNAME=app", f"TIDELOG_PASSWORD={password('app')}"])
    assert p.returncode == 0 and json.loads(p.stdout) == [{"n": 500}], p.stderr


def test_a_name_an_admin_and_a_plain_user_share_is_no_sql_admin(server, wh):
    """`dup` is an admin in stage (its role ops has the admin flag) and a plain user in prod: the
    server tells sessions apart by name only, so neither password buys an admin's statement."""
    ca = str(sqlsecurity.public_ca(wh))
    for cluster in ("stage", "prod"):
        dup = Credentials("dup", password("dup", cluster), ca)
        assert sqlserver.query(server, "SELECT count(*) FROM tidelog.reconciled_log", credentials=dup).rows == [(500,)]
        with pytest.raises(hs2client.HS2Error, match=r"user 'dup' is not an admin: the command ListJarsCommand"):
            sqlserver.query(server, "LIST JARS", credentials=dup)


def test_a_user_deleted_at_runtime_is_refused_by_the_running_server(server, wh, monkeypatch):
    """`tidelog user delete` on a cluster this controller deployed (its brokers faked: they
    committed the change) reaches the running server at once: the user's next login is refused,
    and so is the next statement of the session it had open; the other users go on."""
    import infra.spec
    import ops.cluster
    from click.testing import CliRunner

    from ops.cli import acl_cmds

    states = server["states"]
    monkeypatch.setattr(infra.spec, "STATE_ROOT", Path(states["TIDELOG_STATE_DIR"]))
    monkeypatch.setattr(ops.cluster, "DEFAULT_DIR", Path(states["TIDELOG_CLUSTER_DIR"]))
    monkeypatch.setattr(sqlserver, "SERVERS_DIR", Path(states["TIDELOG_SQL_SERVERS_DIR"]))
    monkeypatch.setenv("TIDELOG_CREDENTIALS", str(Path(states["TIDELOG_STATE_DIR"]) / "prod" / "security"
                                                  / "admin.credentials.yaml"))
    monkeypatch.setattr(acl_cmds, "admin_call", lambda bootstrap, fn: None)
    ca = str(sqlsecurity.public_ca(wh))
    gone = Credentials("gone", password("gone"), ca)
    with hs2client.Connection(server["host"], server["port"], "tidelog", credentials=gone) as session:
        assert session.execute("SELECT count(*) FROM reconciled_log").rows == [(500,)]
        r = CliRunner().invoke(acl_cmds.user, ["delete", "gone", "-b", PROD_BOOTSTRAP])
        assert r.exit_code == 0 and r.stderr == "", r.output
        with pytest.raises(hs2client.HS2Error, match="user 'gone' may no longer log in to this server"):
            session.execute("SELECT count(*) FROM reconciled_log")
    with pytest.raises(hs2client.LoginRefused, match="refused the login of user 'gone'"):
        sqlserver.query(server, "SELECT 1", credentials=gone)
    app = Credentials("app", password("app"), ca)
    assert sqlserver.query(server, "SELECT count(*) FROM reconciled_log", credentials=app).rows == [(500,)]
    assert "refused for user 'gone': no longer in the users file" in Path(server["log"]).read_text()


def test_a_locked_public_name_does_not_stop_the_platform(server, wh):
    """Anyone who reaches the port can lock the name admin (every cluster has one) with five wrong
    guesses. The platform's own path logs in as the warehouse admin, a name of its own that is
    never locked (its password is 256 random bits): guesses at it lock nothing, and
    ensure_catalog goes on through the server."""
    from concurrent.futures import ThreadPoolExecutor

    ca = str(sqlsecurity.public_ca(wh))
    cluster_admin = Credentials("admin", password("admin"), ca)  # a cluster's admin logs in with its own password
    assert sqlserver.query(server, "LIST JARS", credentials=cluster_admin).columns

    def guess(user: str, i: int) -> bool:
        try:
            sqlserver.query(server, "SELECT 1", credentials=Credentials(user, f"guess-{i}", ca))
        except hs2client.LoginRefused:
            return True
        return False

    with ThreadPoolExecutor(8) as ex:  # at once: a lockout counts parallel guesses too
        assert all(ex.map(guess, ["admin"] * 8 + [sqlsecurity.ADMIN_USER] * 8, range(16)))
    with pytest.raises(hs2client.LoginRefused):
        sqlserver.query(server, "SELECT 1", credentials=cluster_admin)
    assert "login refused for user 'admin': locked after 5 failed logins" in Path(server["log"]).read_text()
    (wh / "_catalog" / "tables.json").unlink()  # the catalog's upkeep, as after a reconcile
    assert sqlserver.ensure_catalog(wh) == "server"


def test_serve_again_then_stop(server, wh):
    """The last of the module's server tests: `serve` on a running server imports the users
    again and starts nothing; `tidelog sql stop` leaves no process and no state."""
    info = server
    again = json.loads(tidelog("sql", "serve", "--detach", "--warehouse", str(wh), "--json", env=info["states"]).stdout)
    assert again["pid"] == info["pid"] and again["started"] is False
    s = json.loads(tidelog("sql", "stop", "--warehouse", str(wh), "--json").stdout)
    assert s["stopped"] and s["pid"] == info["pid"]
    assert not pid_alive(info["pid"]) and sqlserver.running(wh) is None
    assert not os.path.exists(f"/proc/{info['pid']}")  # exited and collected: `pgrep java` no longer lists it
    assert not os.path.exists(wh / "_catalog" / "sqlserver.json")
    assert json.loads(tidelog("sql", "stop", "--warehouse", str(wh), "--json").stdout)["stopped"] is False
