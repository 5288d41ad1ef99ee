"""`tidelog reconcile | validate | sql`: the Spark reconcile job, its GX gates, and Spark SQL on
the warehouse."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import click

from ops.cli.common import emit_json, fail, progress

warehouse_option = click.option(
    "--warehouse", type=click.Path(path_type=Path), default=None, envvar="TIDELOG_WAREHOUSE",
    help="Where the tables live (default ~/.tidelog/warehouse, or $TIDELOG_WAREHOUSE)")
date_option = click.option("--run-date", default=None, help="YYYY-MM-DD (default: today, UTC)")
master_option = click.option("--master", default=None, envvar="TIDELOG_SPARK_MASTER",
                             help="Spark master (default local[2], or $TIDELOG_SPARK_MASTER)")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output")


def _today() -> str:
    return dt.datetime.now(dt.timezone.utc).date().isoformat()


def parse_run_date(run_date: str | None) -> str:
    """The run date (today, UTC, by default); anything but YYYY-MM-DD exits 2 before Spark starts."""
    run_date = run_date or _today()
    try:
        dt.datetime.strptime(run_date, "%Y-%m-%d")
    except ValueError:
        fail(f"--run-date {run_date!r} is not a date (YYYY-MM-DD)", 2)
    return run_date


def require_tables(wh: Path) -> list[str]:
    """The warehouse's tables; none (or no warehouse) exits 2 naming what to run."""
    from spark_jobs.warehouse import existing_tables

    tables = existing_tables(wh)
    if not tables:
        what = "no tables in" if Path(wh).is_dir() else "no warehouse at"
        fail(f"{what} {wh}: run `tidelog reconcile --logs DIR --warehouse {wh}` first", 2)
    return tables


def run_dates(wh: Path, table: str = "replica_entries") -> list[str]:
    """The run dates `table` has rows of, newest first: its partitions' data files (no Spark)."""
    from spark_jobs.warehouse import table_dir

    return sorted({f.parts[-3].split("=", 1)[1] for f in table_dir(wh, table).glob("run_date=*/cluster=*/part-*")},
                  reverse=True)


def require_run_date(wh: Path, run_date: str, table: str = "replica_entries", shown: int = 5) -> None:
    """A run date `table` has no rows of exits 2 naming the dates it has (newest first)."""
    have = run_dates(wh, table)
    if run_date in have:
        return
    which = (f"its run dates, newest first: {', '.join(have[:shown])}"
             + (f" and {len(have) - shown} more" if len(have) > shown else "")) if have else \
        f"it has none yet: `tidelog reconcile --logs DIR --warehouse {wh}` writes them"
    fail(f"{table} has no rows for run date {run_date} in {wh}; {which}", 2)


def _wh(warehouse: Path | None) -> Path:
    from spark_jobs.warehouse import default_warehouse

    return Path(warehouse) if warehouse else default_warehouse()


def print_validation(v: dict) -> None:
    tables = ", ".join(f"{t} {'ok' if ok else 'FAILED'}" for t, ok in v["tables"].items())
    click.echo(f"validation {v['run_date']}: {'PASSED' if v['success'] else 'FAILED'} ({tables})")
    for f in v["failures"]:
        click.echo(f"  ! {f['suite']}: {f['description']} [{f['expectation']}] "
                   f"unexpected {f['unexpected_count']}" + (f"; e.g. {f['sample'][:3]}" if f["sample"] else ""))
    click.echo(f"  Data Docs: {v['data_docs']}")


@click.command()
@click.option("--logs", type=click.Path(path_type=Path), required=True,
              help="A collection directory (`tidelog collect --out DIR`): DIR/<cluster>/<node>/")
@date_option
@warehouse_option
@master_option
@click.option("--no-validate", is_flag=True, help="Skip the Great Expectations checkpoint")
@click.option("--lag-max", type=int, default=1000, show_default=True,
              help="GX: the most entries a replica may lag the longest log")
@json_option
def reconcile(logs, run_date, warehouse, master, no_validate, lag_max, as_json):
    """Reconcile the replicas' logs with Spark into the warehouse, then validate with GX.

    Exit 0: clean and valid; 1: the job found problems or an expectation failed; 2: bad input."""
    from spark_jobs.inputs import discover

    run_date = parse_run_date(run_date)
    wh = _wh(warehouse).expanduser().resolve()  # executors on a Spark cluster write it from elsewhere
    try:
        discover(logs)  # bad input is told at once, before Spark starts (and before the imports
    except FileNotFoundError as e:  # below: Great Expectations alone takes ~6 s to import here)
        fail(str(e), 2)
    from spark_jobs.reconcile import reconcile as run_job
    from spark_jobs.warehouse import console_log, session, spark_sql_command
    if not no_validate:
        from expectations.validate import ValidationError, validate
    click.echo(f"reconciling {logs} for {run_date} into {wh} (Spark starting...)", err=True)
    stages = ["Spark starting", "decoding and reconciling the replicas"] \
        + ([] if no_validate else ["Great Expectations checkpoints"]) + ["the warehouse's catalog"]
    with progress(len(stages), "reconcile") as tick:   # stderr, terminals only
        tick(0, note=stages[0])
        spark = session(master, console=console_log(wh, "tidelog-reconcile"))   # the JVM's banner: a file
        tick(note=stages[1])
        r = run_job(logs, run_date, wh, spark=spark)
        if not no_validate:
            tick(note=stages[2])
            try:
                r["validation"] = validate(run_date, wh, spark=spark, lag_entries_max=lag_max)
            except ValidationError as e:
                fail(str(e), 2)
        tick(note=stages[-1])
        r["catalog"] = _catch_up_catalog(wh, spark)   # stops `spark`
        tick()
    if as_json:
        emit_json(r)
    else:
        for c in r["clusters"]:
            click.echo(f"{c['cluster']} {c['run_date']}: {c['verdict']}; {c['entries']} entries; "
                       + ", ".join(f"{k} {v}" for k, v in sorted(c["statuses"].items()))
                       + f"; divergence rows {c['divergence_rows']}")
            for n in c["nodes"]:
                click.echo(f"  {n['node']:<10} {n.get('verdict', n['state']):<10} index {n['begin_index']}.."
                           f"{n['end_index']} committed {n['node_committed_index']} lag {n['lag']} "
                           f"lost {n.get('lost', 0)} crc errors {n['crc_errors']}"
                           + (f"  ! {n['problem']}" if n["problem"] else ""))
            for p in c["problems"]:
                click.echo(f"  ! {p}")
        click.echo(f"tables: {', '.join(r['tables'])} in {r['warehouse']}: tidelog sql \"SELECT ...\", or\n"
                   f"  {spark_sql_command(Path(r['warehouse']))}")
        if "validation" in r:
            print_validation(r["validation"])
    ok = r["verdict"] == "clean" and r.get("validation", {"success": True})["success"]
    sys.exit(0 if ok else 1)


@click.command()
@date_option
@warehouse_option
@master_option
@click.option("--lag-max", type=int, default=1000, show_default=True,
              help="The most entries a replica may lag the longest log")
@json_option
def validate(run_date, warehouse, master, lag_max, as_json):
    """Run the Great Expectations checkpoints on a run date's tables; print the Data Docs path."""
    run_date, wh = parse_run_date(run_date), _wh(warehouse)
    if "replica_entries" in require_tables(wh):  # both told before the ~6 s of Great Expectations' import
        require_run_date(wh, run_date)            # and Spark's start
    from expectations.validate import ValidationError, validate as run_validate
    from spark_jobs.warehouse import console_log, session
    spark = session(master, app="tidelog-validate", console=console_log(wh, "tidelog-validate"))
    try:
        v = run_validate(run_date, wh, spark=spark, lag_entries_max=lag_max)
    except ValidationError as e:
        fail(str(e), 2)
    finally:
        spark.stop()
    if as_json:
        emit_json(v)
    else:
        print_validation(v)
    sys.exit(0 if v["success"] else 1)


def _catch_up_catalog(wh: Path, spark) -> str:
    """After a reconcile: the warehouse's catalog knows every table (partitions need nothing).
    Stops `spark`. A query server running on the warehouse takes the tables; else, when the
    catalog lacks one, a Hive session on it in this process's JVM (already up: no second JVM
    start) creates them, and holds the catalog only until this command exits."""
    from spark_jobs import sqlserver
    from spark_jobs.hs2client import first_line

    spark.stop()
    try:
        if sqlserver.running(wh) is not None or not sqlserver.pending_catalog(wh):
            return sqlserver.ensure_catalog(wh, spawn=False)   # through the server, or "current"
        click.echo("registering the tables in the warehouse's catalog (once per warehouse)...", err=True)
        hive = sqlserver.hive_session(wh)   # a new context: a session's catalog is fixed when it starts
        try:
            return sqlserver.ensure_catalog(wh, hive)
        finally:
            hive.stop()
    except Exception as e:  # noqa: BLE001 - a locked metastore, a server that did not answer, Hive's own errors
        why = str(e) if isinstance(e, sqlserver.ServerError) else first_line(str(e))
        click.echo(f"warning: the tables are written, but not yet in the catalog: {why}", err=True)
        return "pending"


class _SqlGroup(click.Group):
    """`tidelog sql serve|stop ...` are subcommands; anything else is the query command's."""

    def __init__(self, *args, query_command: click.Command, **kwargs):
        super().__init__(*args, **kwargs)
        self.query_command = query_command

    def make_context(self, info_name, args, parent=None, **extra):
        if args and args[0] in self.commands:
            return super().make_context(info_name, args, parent=parent, **extra)
        return self.query_command.make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        return ctx.command.invoke(ctx) if ctx.command is not self else super().invoke(ctx)


@click.command("sql")
@click.argument("query", required=False)
@warehouse_option
@master_option
@click.option("--credentials", "credentials_file", type=click.Path(path_type=Path), default=None,
              help="Log in to the query server as this credentials file's user (default: TIDELOG_USERNAME and "
                   "TIDELOG_PASSWORD, TIDELOG_CREDENTIALS, else the warehouse admin's file when readable)")
@click.option("--limit", type=click.IntRange(min=0), default=50, show_default=True, help="Rows to show")
@json_option
@click.option("--verbose", "-v", is_flag=True, help="Say on stderr whether the query server answered")
def sql_query(query, warehouse, master, credentials_file, limit, as_json, verbose):
    """Spark SQL on the reconciled tables (database `tidelog`); a prompt when given no QUERY.

    Goes through the warehouse's query server when one runs (`tidelog sql serve --detach`;
    `tidelog sql stop`), logged in as a user (--credentials), else a local Spark session.
    Exit 1: the statement failed or the login was refused; 2: no such table or warehouse, no
    credentials for the server, or the catalog is held by another JVM."""
    from broker.client.security import CredentialsError
    from spark_jobs import sqlsecurity, sqlserver

    wh = _wh(warehouse).resolve()
    require_tables(wh)
    info = sqlserver.running(wh)
    if info is not None:
        try:
            creds = sqlsecurity.client_credentials(wh, credentials_file)
        except CredentialsError as e:
            fail(str(e), 2)
        if verbose:
            click.echo(f"via the query server {info['host']}:{info['port']} (pid {info['pid']})", err=True)
        run, close = (lambda q: sqlserver.query(info, q, limit + 1, credentials=creds)), (lambda: None)  # one more: was it cut?
    else:
        if verbose:
            click.echo(f"via a local Spark session (no query server for {wh}; `tidelog sql serve --detach` "
                       "starts one)", err=True)
        spark = sqlserver.hive_session(wh, master)
        run, close = (lambda q: _spark_result(spark, q, limit + 1)), spark.stop
        try:
            sqlserver.ensure_catalog(wh, spark)
            spark.sql("USE tidelog")
        except Exception as e:  # noqa: BLE001 - a locked or broken metastore: one line, not a JVM stack
            close()
            fail(_catalog_problem(e, wh), 2)
    try:
        if query:
            code = _answer(run, query, wh, as_json, limit)
            if code:
                sys.exit(code)
            return
        click.echo(f"Spark SQL on {wh}; tables in database tidelog: {', '.join(require_tables(wh))}. "
                   "End statements with ';'. Ctrl-D quits.", err=True)
        buf = ""
        while True:
            try:
                line = input("tidelog-sql> " if not buf else "        ...> ")
            except EOFError:
                break
            buf += line + "\n"
            if buf.rstrip().endswith(";"):
                _answer(run, buf.rstrip().rstrip(";"), wh, as_json, limit)
                buf = ""
    finally:
        close()


def _catalog_problem(e: Exception, wh: Path) -> str:
    from spark_jobs import sqlserver
    from spark_jobs.hs2client import first_line

    if isinstance(e, sqlserver.ServerError):
        return str(e)
    return sqlserver.locked_message(wh) if sqlserver.is_locked_error(e) else first_line(str(e))


def _spark_result(spark, query: str, limit: int):
    from spark_jobs.hs2client import Result

    df = spark.sql(query)
    return Result(df.columns, [tuple(_plain(v) for v in r) for r in df.limit(limit).collect()])


def _plain(v):
    if hasattr(v, "asDict"):
        return v.asDict(recursive=True)
    return [_plain(x) for x in v] if isinstance(v, list) else v


def _answer(run, query: str, wh: Path, as_json: bool, limit: int) -> int:
    """Run one statement and show its first `limit` rows (`run` fetches one more: a result cut
    there says so on stderr, as Spark's show() does); the exit code (1: it failed, 2: no such
    table)."""
    from spark_jobs import sqlserver
    from spark_jobs.hs2client import first_line
    from spark_jobs.warehouse import DATABASE, existing_tables

    try:
        res = run(query)
    except Exception as e:  # noqa: BLE001 - Spark's errors (PySpark, py4j, the server's) become one line
        if sqlserver.is_locked_error(e):
            fail(sqlserver.locked_message(wh), 2)
        msg = first_line(str(e))
        if "TABLE_OR_VIEW_NOT_FOUND" in msg or "SCHEMA_NOT_FOUND" in msg:
            tables = existing_tables(wh)
            hint = (f"the tables in {wh}: {', '.join(f'{DATABASE}.{t}' for t in tables)}" if tables
                    else f"the tables in {wh} come from `tidelog reconcile --logs DIR --warehouse {wh}`")
            click.echo(f"error: {msg} ({hint})", err=True)
            return 2
        click.echo(f"error: {msg}", err=True)
        return 1
    rows = res.rows[:limit]
    if as_json:
        emit_json([dict(zip(res.columns, r)) for r in rows])
    elif res.columns:
        click.echo(_table(res.columns, rows))
    if len(res.rows) > len(rows):
        click.echo(f"(first {len(rows)} rows: --limit N for more)", err=True)
    return 0


def _cell(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, list):
        return "[" + ", ".join(_cell(x) for x in v) + "]"
    return str(v)


def _table(columns: list[str], rows: list[tuple]) -> str:
    """Rows as Spark's show(truncate=False) draws them."""
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    rule = "+" + "+".join("-" * w for w in widths) + "+"
    line = lambda vals: "|" + "|".join(v.ljust(w) for v, w in zip(vals, widths)) + "|"  # noqa: E731
    return "\n".join([rule, line(columns), rule, *map(line, cells), rule])


@click.command("serve")
@warehouse_option
@click.option("--port", type=int, default=None, help="Port on 127.0.0.1 (default: a free one)")
@click.option("--detach", is_flag=True, help="Run in the background (stop with `tidelog sql stop`)")
@master_option
@json_option
def sql_serve(warehouse, port, detach, master, as_json):
    """Start the query server (Spark's Thrift JDBC server) on the warehouse's catalog, on
    127.0.0.1; in the foreground until Ctrl-C, or --detach."""
    from spark_jobs import sqlserver

    wh = _wh(warehouse).resolve()
    if not as_json:
        click.echo(f"starting the query server for {wh} (a JVM: 20-40 s)...", err=True)
    try:
        info = sqlserver.start(wh, port, detach=detach, master=master,
                               on_ready=lambda i: _show_server(i, as_json, "Ctrl-C stops it"))
    except sqlserver.CatalogLocked as e:
        fail(str(e), 2)
    except sqlserver.ServerError as e:
        fail(str(e), 1)
    if detach:
        _show_server(info, as_json, f"stop it: tidelog sql stop --warehouse {wh}")


def _show_server(info: dict, as_json: bool, how_to_stop: str) -> None:
    if as_json:
        emit_json(info)
        return
    wh = info["warehouse"]
    for w in info.get("user_warnings") or []:
        click.echo(f"warning: the query server's users: {w}", err=True)
    click.echo(f"query server {'started' if info.get('started') else 'already running'} for {wh}: "
               f"pid {info['pid']}, {info['host']}:{info['port']} (TLS, users log in), log {info['log']}\n"
               f"  tidelog sql --warehouse {wh} \"SELECT status, count(*) FROM tidelog.reconciled_log GROUP BY status\"\n"
               f"  PATH={Path(sys.executable).parent}:$PATH beeline -u '{info['jdbc_url']}' -n USER -p PASSWORD\n"
               f"  (the warehouse admin's password: {info.get('admin_credentials')}; a cluster's users log in with "
               f"their own)\n"
               f"  {how_to_stop}")


@click.command("stop")
@warehouse_option
@json_option
def sql_stop(warehouse, as_json):
    """Stop the warehouse's query server (its recorded pid, checked to be that server)."""
    from spark_jobs import sqlserver

    r = sqlserver.stop(_wh(warehouse))
    if as_json:
        emit_json(r)
    elif r["stopped"]:
        click.echo(f"stopped the query server (pid {r['pid']}, port {r['port']})" + (" with SIGKILL" if r["killed"] else ""))
    else:
        click.echo(r["reason"])


sql = _SqlGroup("sql", query_command=sql_query, commands=[sql_serve, sql_stop],
                help="Spark SQL on the reconciled tables: `tidelog sql [\"QUERY\"]`, `tidelog sql serve|stop`.")


COMMANDS = [reconcile, validate, sql]
