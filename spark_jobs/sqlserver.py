"""The query server: Spark's Thrift JDBC/ODBC server (HiveServer2) on a warehouse's catalog.

One long-lived JVM holds a Hive session on the warehouse's metastore, so a query answers in
well under a second instead of paying a JVM start each time, and it is the one JVM the embedded
Derby metastore admits while it runs: `tidelog sql` and beeline/JDBC/ODBC clients go through it.

    start(warehouse, port=None, detach=True) -> info    spark-submit ... HiveThriftServer2, on
                                                        127.0.0.1 only; state in
                                                        <warehouse>/_catalog/sqlserver.json, its
                                                        log in <warehouse>/_catalog/sqlserver.log
    running(warehouse) -> info | None                   the state file's pid is alive and is that
                                                        server
    stop(warehouse) -> {"stopped": ...}                 SIGTERM (SIGKILL after STOP_TIMEOUT_S)
    query(info, sql) -> Result(columns, rows)           one statement through the server
    ensure_catalog(warehouse, spark=None) -> how        the metastore knows every table the
                                                        warehouse holds (nothing to do, through
                                                        the server, this Hive session, or a short
                                                        Hive JVM of its own)
    refresh_users() -> [{warehouse, warnings}]          every running server of this controller
                                                        imports its users again (a cluster's
                                                        users changed: deploy, `tidelog user`)

Why Thrift and not Spark Connect: Connect's Python client needs grpcio-status and zstandard,
which the pinned stack does not install; HiveServer2 is spoken by the beeline shipped in
pyspark's bin/, any JDBC/ODBC tool, and by spark_jobs/hs2client.py (impyla).

Who gets in (spark_jobs/sqlsecurity.py, spark_jobs/java/tidelog/sql/): the server listens on
loopback only, takes TLS only (the warehouse's own CA), and every connection logs in with SASL
PLAIN inside it, checked against SCRAM-SHA-256 verifiers: the warehouse admin's and every
cluster's users on this controller. The users file is read again when it changes, and it is
rewritten whenever this controller changes a cluster's users (`tidelog deploy`, `tidelog user
set|delete`, `tidelog role set|delete`: refresh_users, over the servers listed in SERVERS_DIR),
so a deleted user's next login -- and its open sessions' next statement -- is refused.

Failed logins lock a name: 5 within 60 s lock it for 60 s, and each costs a second. That guards
the passwords people choose, and it lets anyone who reaches the port lock out any such name for
a minute. So the platform's own path -- ensure_catalog, the warm-up, the DAG tasks, and the
operator's `tidelog sql` when given no credentials -- does not use a name the public can lock:
it logs in as the warehouse admin, `warehouse-admin`, a service principal with a name of its own
(no cluster's user is imported under it) and a password of 256 random bits in a 0600 file only
the operator can read. That name is never locked: a lockout protects a guessable password, no
rate of guessing reaches 2^256, and a lock on it would give everyone who can connect a way to
stop the catalog's upkeep. Each of its failed logins still costs a second and is logged.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from broker.client.security import Credentials, CredentialsError
from broker.store.files import write_atomic
from ops.localbroker import free_ports, pid_alive
from ops.security import state_roots
from ops.spark_cluster import SparkClusterError, auth_submit_args, is_local, start_time, terminate
from spark_jobs import hs2client, sqlsecurity
from spark_jobs.warehouse import CATALOG_MARKER, DATABASE, catalog_conf, catalog_dir, catalog_statements, \
    existing_tables, on_catalog, session, write_conf_dir

SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"
HOST = "127.0.0.1"
STATE_FILE = "sqlserver.json"
LOG_FILE = "sqlserver.log"
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.25
LOG4J = "log4j2-sqlserver.properties"  # errors, and the login check's and the guard's lines
LOCKED_EXIT = 3  # `python -m spark_jobs.sqlserver catalog W`: the metastore is in another JVM's hands
# the query servers this controller's user started, one file each (named by its warehouse),
# so that a change of a cluster's users reaches every running server's users file
SERVERS_DIR = Path(os.environ.get("TIDELOG_SQL_SERVERS_DIR", "~/.tidelog/sql-servers")).expanduser()
DERBY_LOCKED = "Another instance of Derby may have already booted the database"


class ServerError(Exception):
    """The query server could not start or answer; the message says what to do."""


class CatalogLocked(ServerError):
    pass


def locked_message(warehouse: Path) -> str:
    return (f"the catalog in {catalog_dir(warehouse)} is in use by another JVM (embedded Derby admits one "
            f"at a time): a spark-sql/pyspark with SPARK_CONF_DIR={catalog_dir(warehouse) / 'conf'}, or another "
            f"`tidelog sql`; close it, or run `tidelog sql serve --warehouse {warehouse} --detach` once "
            f"nothing else holds it and query through that")


def is_locked_error(e: BaseException) -> bool:
    """Derby's lock, as the server's log or a local session's error shows it (py4j hands only
    the outer Hive error over: the client could not be made, which here means the lock)."""
    return any(s in str(e) for s in (DERBY_LOCKED, "XSDB6", "Unable to instantiate "
                                     "org.apache.hadoop.hive.ql.metadata.SessionHiveMetaStoreClient"))


def spark_home() -> Path:
    return Path(importlib.util.find_spec("pyspark").origin).parent


def state_path(warehouse: Path) -> Path:
    return catalog_dir(warehouse) / STATE_FILE


def _is_server(pid: int) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return SERVER_CLASS in cmd and pid_alive(pid)


def running(warehouse: Path) -> dict | None:
    """The query server of this warehouse, if its recorded pid is alive and is that server."""
    try:
        info = json.loads(state_path(warehouse).read_text())
    except (OSError, ValueError):
        return None
    return info if _is_server(int(info["pid"])) else None


def _answers(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=1).close()
        return True
    except OSError:
        return False


def _command(port: int, master: str | None, warehouse: Path, files: sqlsecurity.ServerFiles) -> list[str]:
    """spark-submit of the server: the login check and the SQL guard on the driver's class path
    (with the server's hive-site.xml: TLS, CUSTOM authentication, doAs), the guard as a SQL
    extension; only the port and the address are HiveServer2 settings on the command line."""
    master = master or os.environ.get("TIDELOG_SPARK_MASTER") or "local[2]"
    conf = {**sqlsecurity.server_conf(warehouse, files),
            "spark.driver.memory": os.environ.get("TIDELOG_SPARK_DRIVER_MEMORY", "2g"),
            "spark.driver.extraClassPath": os.pathsep.join(map(str, files.classpath)),
            "spark.driver.extraJavaOptions": catalog_conf(warehouse, LOG4J)["spark.driver.extraJavaOptions"]}
    if is_local(master):
        # the driver's RPC and block manager ports admit only this JVM's own (a secret Spark
        # makes per run in local mode): a local user cannot talk Spark's RPC to the driver
        conf["spark.authenticate"] = "true"
    cmd = [str(spark_home() / "bin" / "spark-submit"), "--master", master, "--name", "tidelog-sql-server",
           *auth_submit_args(master)]  # on a cluster: the operator's shared secret, from its 0600 file
    for k, v in conf.items():
        cmd += ["--conf", f"{k}={v}"]
    return cmd + ["--class", SERVER_CLASS, "spark-internal",
                  "--hiveconf", f"hive.server2.thrift.bind.host={HOST}",
                  "--hiveconf", f"hive.server2.thrift.port={port}"]


def _env(warehouse: Path) -> dict:
    return {**os.environ, "SPARK_CONF_DIR": str(write_conf_dir(warehouse)), "SPARK_LOCAL_IP": HOST,
            "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable)}


def _tail(path: Path, lines: int = 5) -> str:
    try:
        keep = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip() and not ln.startswith("\tat ")]
    except OSError:
        return ""
    return " | ".join(keep[-lines:])


def start(warehouse: Path, port: int | None = None, detach: bool = True, master: str | None = None,
          timeout_s: float = START_TIMEOUT_S, on_ready: Callable[[dict], None] | None = None) -> dict:
    """Start the query server for `warehouse` (or find the one already running) and make sure
    the catalog holds the warehouse's tables. detach=False: call `on_ready(info)`, then run
    until the server exits or Ctrl-C (which stops it)."""
    warehouse = Path(warehouse).resolve()
    info = running(warehouse)
    try:
        if info is None:
            info = _launch(warehouse, port, master, timeout_s)
            info["started"] = True
        else:  # its users again: the server reads the file anew when it changes
            info["started"] = False
            info["user_warnings"] = sqlsecurity.write_users(warehouse)[1]
            _register(warehouse)
    except (sqlsecurity.SecurityError, CredentialsError) as e:
        raise ServerError(f"the query server's security files: {e}") from None
    try:
        ensure_catalog(warehouse)
        if info["started"]:
            _warm_up(info, warehouse)
    except (OSError, hs2client.HS2Error, ServerError) as e:
        if info["started"]:
            stop(warehouse)
        raise ServerError(f"the query server on port {info['port']} did not take the catalog's tables: {e}; "
                          f"its log: {info['log']}") from None
    if detach:
        return info
    if on_ready:
        on_ready(info)
    try:
        while pid_alive(info["pid"]):
            time.sleep(POLL_S)
            _reap(info["pid"])
    except KeyboardInterrupt:
        pass
    finally:
        stop(warehouse)
    return info


def _warm_up(info: dict, warehouse: Path) -> None:
    """One small query, so the first user's query does not pay for the JVM's first Spark job."""
    tables = existing_tables(warehouse)
    if tables:
        query(info, f"SELECT count(*) FROM {DATABASE}.{tables[-1]}",
              credentials=sqlsecurity.catalog_credentials(warehouse))


def _launch(warehouse: Path, port: int | None, master: str | None, timeout_s: float) -> dict:
    port = port or free_ports(1)[0]
    if _answers(port):
        raise ServerError(f"port {port} on {HOST} is taken; choose another with --port")
    c = catalog_dir(warehouse)
    c.mkdir(parents=True, exist_ok=True)
    files, warnings = sqlsecurity.prepare_server(warehouse, spark_home() / "jars")
    try:
        cmd = _command(port, master, warehouse, files)
    except SparkClusterError as e:
        raise ServerError(str(e)) from None
    log = c / LOG_FILE
    # the log names who logged in and what was refused: the server's user's to read
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with open(fd, "w") as out:  # cwd: anything Hive drops in the working directory stays here
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=_env(warehouse), cwd=c, start_new_session=True)
    info = {"pid": proc.pid, "host": HOST, "port": port, "warehouse": str(warehouse), "log": str(log),
            "jdbc_url": sqlsecurity.jdbc_url(HOST, port, warehouse, DATABASE),
            "ca_file": str(files.public_ca), "admin_credentials": str(sqlsecurity.admin_credentials_file(warehouse)),
            "since": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    state_path(warehouse).write_text(json.dumps(info) + "\n")
    _register(warehouse)
    info["user_warnings"] = warnings
    deadline = time.monotonic() + timeout_s
    while not _answers(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                _terminate(proc.pid)
            state_path(warehouse).unlink(missing_ok=True)
            _registration(warehouse).unlink(missing_ok=True)
            if DERBY_LOCKED in log.read_text(errors="replace"):
                raise CatalogLocked(locked_message(warehouse))
            why = f"exited with code {proc.returncode}" if proc.returncode is not None else \
                f"did not listen within {timeout_s:.0f} s"
            raise ServerError(f"the query server {why}; its log {log}: {_tail(log)}")
        time.sleep(POLL_S)
    return info


def _reap(pid: int) -> None:
    """Collect our own child's exit status (a zombie would look alive to kill -0)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _terminate(pid: int) -> bool:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; returns once the process has exited, every
    thread of it, and been collected (ops.spark_cluster.terminate); True if killed."""
    proc = {"pid": pid, "start_time": start_time(pid)}
    terminate([proc], STOP_TIMEOUT_S)
    return proc["killed"]


def stop(warehouse: Path) -> dict:
    """Stop the warehouse's query server (the recorded pid, checked to be that server)."""
    warehouse = Path(warehouse).resolve()
    info = running(warehouse)
    state_path(warehouse).unlink(missing_ok=True)
    _registration(warehouse).unlink(missing_ok=True)
    if info is None:
        return {"stopped": False, "warehouse": str(warehouse), "reason": f"no query server running for {warehouse}"}
    killed = _terminate(int(info["pid"]))
    return {"stopped": True, "warehouse": str(warehouse), "pid": info["pid"], "port": info["port"], "killed": killed}


def _registration(warehouse: Path) -> Path:
    return SERVERS_DIR / (hashlib.sha256(str(Path(warehouse).resolve()).encode()).hexdigest()[:16] + ".json")


def _register(warehouse: Path) -> None:
    """List the server, with the state roots its users came from (a later refresh, from a
    process with other TIDELOG_* settings, imports from the same ones)."""
    SERVERS_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    entry = {"warehouse": str(Path(warehouse).resolve()), "roots": [str(r) for r in state_roots()]}
    write_atomic(_registration(warehouse), json.dumps(entry).encode(), 0o600)


def served_warehouses() -> list[tuple[Path, list[Path]]]:
    """The query servers this user started which still run: (warehouse, its users' state
    roots) each; a listed server that no longer runs is taken off the list."""
    out = []
    for f in sorted(SERVERS_DIR.glob("*.json")):
        try:
            entry = json.loads(f.read_text())
            warehouse, roots = Path(entry["warehouse"]), [Path(r) for r in entry["roots"]]
        except (OSError, ValueError, KeyError, TypeError):
            warehouse = None
        if warehouse is None or running(warehouse) is None:
            f.unlink(missing_ok=True)
        else:
            out.append((warehouse, roots))
    return out


def refresh_users() -> list[dict]:
    """Every query server this user runs imports its users again (sqlsecurity.write_users; the
    server reads the file anew at the next login and statement): [{warehouse, warnings}] and,
    where that failed, its error (never raised: the cluster's change is made already)."""
    out = []
    for warehouse, roots in served_warehouses():
        try:
            out.append({"warehouse": str(warehouse), "warnings": sqlsecurity.write_users(warehouse, roots)[1]})
        except (OSError, sqlsecurity.SecurityError, CredentialsError) as e:
            out.append({"warehouse": str(warehouse), "warnings": [], "error": str(e)})
    return out


def query(info: dict, statement: str, rows_max: int = hs2client.FETCH_ROWS_MAX,
          database: str | None = DATABASE, credentials: Credentials | str | None = None) -> hs2client.Result:
    """One statement through a running server, in `database`, as `credentials` (a Credentials,
    a credentials file, or None: sqlsecurity.client_credentials finds them, the warehouse
    admin's last). Raises hs2client.HS2Error with Spark's message (LoginRefused: not let in),
    CredentialsError when no credentials are found."""
    if not isinstance(credentials, Credentials):
        credentials = sqlsecurity.client_credentials(Path(info["warehouse"]), credentials)
    with hs2client.Connection(info["host"], int(info["port"]), database, credentials=credentials) as c:
        return c.execute(statement, rows_max)


def _marker(warehouse: Path) -> Path:
    return catalog_dir(warehouse) / CATALOG_MARKER


def pending_catalog(warehouse: Path) -> list[str]:
    """The statements the metastore still needs: none when it was made from these ones (a
    table whose columns changed is dropped first; its files stay, the table is EXTERNAL)."""
    want = catalog_statements(warehouse)
    try:
        have = json.loads(_marker(warehouse).read_text()) if (catalog_dir(warehouse) / "metastore_db").exists() else []
    except (OSError, ValueError):
        have = []
    if want == have:
        return []
    out = []
    for stmt in want:
        name = stmt.split(" (", 1)[0].rsplit(" ", 1)[-1]
        if stmt not in have and any(h.split(" (", 1)[0].endswith(f" {name}") for h in have):
            out.append(f"DROP TABLE IF EXISTS {name}")
        out.append(stmt)
    return out


def hive_session(warehouse: Path, master: str | None = None, app: str = "tidelog-sql"):
    """A Hive session on the warehouse's metastore in this process (a session of another kind
    already running here is stopped first: the catalog is fixed when a SparkContext starts)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and not on_catalog(active, warehouse):
        active.stop()
    write_conf_dir(warehouse)
    spark = session(master, app=app, conf=catalog_conf(warehouse, log4j="log4j2-quiet.properties"),
                    console=catalog_dir(warehouse) / f"{app}-console.log")   # no JVM banner before a one-line answer
    spark.sparkContext.setLogLevel("OFF")  # failures reach the user as one line each
    return spark


def apply_catalog(spark, warehouse: Path) -> None:
    """Run the pending catalog statements in a Hive session on this warehouse's metastore."""
    todo = pending_catalog(warehouse)
    try:
        for stmt in todo:
            spark.sql(stmt)
    except Exception as e:  # noqa: BLE001 - py4j hands Derby's lock over as a generic error
        if is_locked_error(e):
            raise CatalogLocked(locked_message(warehouse)) from None
        raise
    if todo:
        _marker(warehouse).write_text(json.dumps(catalog_statements(warehouse), indent=1) + "\n")


def ensure_catalog(warehouse: Path, spark=None, spawn: bool = True) -> str:
    """Make the warehouse's metastore hold its tables. Returns how: "current" (nothing to do),
    "server" (through the running query server), "session" (through `spark`, a Hive session on
    this metastore), "spawned" (a short Hive JVM of its own, ~15 s) or "skipped" (spawn=False).
    Raises CatalogLocked when another JVM holds the metastore."""
    warehouse = Path(warehouse).resolve()
    todo = pending_catalog(warehouse)
    if not todo:
        return "current"
    info = running(warehouse)
    if info is not None:
        try:
            admin = sqlsecurity.catalog_credentials(warehouse)
        except CredentialsError as e:
            raise ServerError(f"the catalog's tables go through the query server, as an admin: {e}") from None
        for stmt in todo:
            query(info, stmt, database=None, credentials=admin)  # the database may not exist yet
        _marker(warehouse).write_text(json.dumps(catalog_statements(warehouse), indent=1) + "\n")
        return "server"
    if spark is not None and on_catalog(spark, warehouse):
        apply_catalog(spark, warehouse)
        return "session"
    if not spawn:
        return "skipped"
    catalog_dir(warehouse).mkdir(parents=True, exist_ok=True)
    p = subprocess.run([sys.executable, "-m", "spark_jobs.sqlserver", "catalog", str(warehouse)],
                       capture_output=True, text=True, cwd=catalog_dir(warehouse),
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
                           str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH")]))})
    if p.returncode == LOCKED_EXIT:
        raise CatalogLocked(locked_message(warehouse))
    if p.returncode != 0:
        raise ServerError(f"creating the tables in {catalog_dir(warehouse)} failed: "
                          + " | ".join(ln for ln in p.stderr.splitlines()[-5:] if ln.strip()))
    return "spawned"


def _catalog_main(warehouse: Path) -> int:
    spark = hive_session(warehouse, app="tidelog-catalog")
    try:
        apply_catalog(spark, warehouse)
    except CatalogLocked as e:
        print(e, file=sys.stderr)
        return LOCKED_EXIT
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "catalog":
        sys.exit(_catalog_main(Path(sys.argv[2])))
    print(f"usage: python -m spark_jobs.sqlserver catalog WAREHOUSE   (tables into {DATABASE}'s metastore)",
          file=sys.stderr)
    sys.exit(2)
