"""`tidelog reconcile | validate | sql`: the Spark reconcile job, its GX gates, and Spark SQL on
the warehouse."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import click

from ops.cli.common import emit_json, fail

warehouse_option = click.option(
    "--warehouse", type=click.Path(path_type=Path), default=None, envvar="TIDELOG_WAREHOUSE",
    help="Where the tables live (default ~/.tidelog/warehouse, or $TIDELOG_WAREHOUSE)")
date_option = click.option("--run-date", default=None, help="YYYY-MM-DD (default: today, UTC)")
master_option = click.option("--master", default=None, envvar="TIDELOG_SPARK_MASTER",
                             help="Spark master (default local[2], or $TIDELOG_SPARK_MASTER)")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable output")


def _today() -> str:
    return dt.datetime.now(dt.timezone.utc).date().isoformat()


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
    from expectations.validate import ValidationError, validate
    from spark_jobs.inputs import discover
    from spark_jobs.reconcile import reconcile as run_job
    from spark_jobs.warehouse import session, spark_sql_command

    run_date = run_date or _today()
    try:
        dt.date.fromisoformat(run_date)
    except ValueError:
        fail(f"--run-date {run_date!r} is not a date (YYYY-MM-DD)", 2)
    wh = _wh(warehouse)
    try:
        discover(logs)  # bad input is told at once, before Spark starts
    except FileNotFoundError as e:
        fail(str(e), 2)
    click.echo(f"reconciling {logs} for {run_date} into {wh} (Spark starting...)", err=True)
    spark = session(master)
    r = run_job(logs, run_date, wh, spark=spark)
    if not no_validate:
        try:
            r["validation"] = validate(run_date, wh, spark=spark, lag_entries_max=lag_max)
        except ValidationError as e:
            fail(str(e), 2)
    spark.stop()
    if as_json:
        emit_json(r)
    else:
        for c in r["clusters"]:
            click.echo(f"{c['cluster']} {c['run_date']}: {c['verdict']}; {c['entries']} entries; "
                       + ", ".join(f"{k} {v}" for k, v in sorted(c["statuses"].items()))
                       + f"; divergence rows {c['divergence_rows']}")
            for n in c["nodes"]:
                click.echo(f"  {n['node']:<10} {n['state']:<8} index {n['begin_index']}..{n['end_index']} "
                           f"committed {n['node_committed_index']} lag {n['lag']} crc errors {n['crc_errors']}"
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
    from expectations.validate import ValidationError, validate as run_validate
    from spark_jobs.warehouse import session

    spark = session(master, app="tidelog-validate")
    try:
        v = run_validate(run_date or _today(), _wh(warehouse), spark=spark, lag_entries_max=lag_max)
    except ValidationError as e:
        fail(str(e), 2)
    finally:
        spark.stop()
    if as_json:
        emit_json(v)
    else:
        print_validation(v)
    sys.exit(0 if v["success"] else 1)


@click.command()
@click.argument("query", required=False)
@warehouse_option
@master_option
@click.option("--limit", type=int, default=50, show_default=True, help="Rows to show")
@json_option
def sql(query, warehouse, master, limit, as_json):
    """Spark SQL on the reconciled tables (database `tidelog`); a prompt when given no QUERY."""
    from spark_jobs.warehouse import register, session

    wh = _wh(warehouse)
    spark = session(master, app="tidelog-sql")
    try:
        tables = register(spark, wh)
        if query:
            if not _run(spark, query, limit, as_json):
                sys.exit(1)
            return
        click.echo(f"Spark SQL on {wh}; tables in database tidelog: {', '.join(tables) or '(none yet)'}. "
                   "End statements with ';'. Ctrl-D quits.", err=True)
        buf = ""
        while True:
            try:
                line = input("tidelog-sql> " if not buf else "        ...> ")
            except EOFError:
                break
            buf += line + "\n"
            if buf.rstrip().endswith(";"):
                _run(spark, buf.rstrip().rstrip(";"), limit, as_json)
                buf = ""
    finally:
        spark.stop()


def _run(spark, query: str, limit: int, as_json: bool) -> bool:
    """Run one statement and show its rows; False (with the error printed) when it fails."""
    from pyspark.errors import PySparkException

    try:
        df = spark.sql(query)
        if as_json:
            emit_json([r.asDict(recursive=True) for r in df.limit(limit).collect()])
        else:
            df.show(limit, truncate=False)
    except PySparkException as e:
        click.echo(f"error: {str(e).splitlines()[0]}", err=True)
        return False
    return True


COMMANDS = [reconcile, validate, sql]
