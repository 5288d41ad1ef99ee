"""The Spark session and the warehouse the reconciled tables live in.

Tables are Parquet directories under the warehouse, partitioned by `run_date` and `cluster`:

    <warehouse>/<table>/run_date=2026-11-22/cluster=prod/part-*.parquet

The job writes those files by path and needs no catalog. The catalog users query is a Hive
metastore kept in the warehouse (embedded Derby, `<warehouse>/_catalog/metastore_db`): the
tables are created there once (`catalog_statements`, by whichever Hive JVM comes first: the
query server, `tidelog sql`, or `tidelog reconcile`'s catch-up) as partitioned Parquet tables
whose partitions Spark finds by listing the directories (`manageFilesourcePartitions=false`),
so a new run date needs no ALTER TABLE, MSCK or REFRESH: every new session sees it.
`<warehouse>/_catalog/conf/spark-defaults.conf` holds the settings, so pyspark's own
`spark-sql`/`pyspark` see the tables with `SPARK_CONF_DIR` pointing there. Spark skips
`_`-prefixed paths, so `_catalog` is never mistaken for a table's data.

Embedded Derby admits one JVM at a time: while the query server (spark_jobs/sqlserver.py) runs
it owns the metastore and everyone else goes through it (`tidelog sql`, beeline); without it,
the first JVM to open the catalog holds it until it exits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import sys
from pathlib import Path

DATABASE = "tidelog"
TABLES = ("replica_entries", "reconciled_log", "replica_divergence", "replica_summary")
PARTITIONS = ("run_date", "cluster")


def default_warehouse() -> Path:
    return Path(os.environ.get("TIDELOG_WAREHOUSE", Path.home() / ".tidelog" / "warehouse")).expanduser()


@contextlib.contextmanager
def console_to(path: Path | None):
    """Point this process's fds 1 and 2 at `path` while a child is spawned, so the child (the
    Spark driver JVM: its banner, log4j's console) writes there for its whole life; ours are
    restored at once. Under Airflow fd 2 is a stream the task log shows at ERROR level; in a
    terminal the banner would come before a command's one-line answer or error."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for f in (*saved, fd):
            os.close(f)


@contextlib.contextmanager
def _environ(name: str, value: str | None):
    """The variable `name` is `value` again (None: unset) when the block ends."""
    try:
        yield
    finally:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def console_log(warehouse: Path, app: str) -> Path:
    """Where a session's JVM console goes: <warehouse>/_spark_logs/<app>-<UTC time>.log."""
    import datetime as dt

    return Path(warehouse).expanduser() / "_spark_logs" / f"{app}-{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%S}.log"


def session(master: str | None = None, app: str = "tidelog-reconcile", conf: dict | None = None,
            console: Path | None = None):
    """A SparkSession for the job (local[2] unless told otherwise: --master or
    $TIDELOG_SPARK_MASTER; under spark-submit the master it was given); `conf` on top (e.g.
    `catalog_conf`, for a Hive session on a warehouse's metastore); `console`: a file for the
    driver JVM's own output (when this call starts it)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: no guessing at interfaces
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from ops.spark_cluster import auth_conf, auth_submit_args, is_local

    b = SparkSession.builder.appName(app)
    master = master or os.environ.get("TIDELOG_SPARK_MASTER")
    if master:
        b = b.master(master)
    elif not os.environ.get("SPARK_SUBMIT_OPTS") and "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        b = b.master("local[2]")
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS")
    if SparkContext._gateway is not None:  # this process's JVM runs: the secret goes over py4j
        b = b.config(map=auth_conf(master))
    elif not is_local(master):  # the JVM starts now: its spark-submit reads the secret's file
        os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(auth_submit_args(master)) + " " + (submit_args or "pyspark-shell")
    log4j = Path(__file__).with_name("log4j2.properties")
    with console_to(console), _environ("PYSPARK_SUBMIT_ARGS", submit_args):
        spark = (b.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j}")
                  .config("spark.ui.enabled", "false")
                  .config("spark.ui.showConsoleProgress", "false")
                  .config("spark.sql.session.timeZone", "UTC")
                  .config("spark.sql.shuffle.partitions", "8")
                  .config("spark.sql.adaptive.enabled", "true")
                  .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
                  .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                  .config("spark.driver.memory", os.environ.get("TIDELOG_SPARK_DRIVER_MEMORY", "2g"))
                  .config(map=conf or {})
                  .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    # PySpark logs every failed query's whole JVM stack as JSON; the commands print the error
    logging.getLogger("SQLQueryContextLogger").setLevel(logging.CRITICAL)
    return spark


def table_dir(warehouse: Path, table: str) -> Path:
    return Path(warehouse) / table


SCHEMA_FILE = "_schema.ddl"  # a table's columns; Spark skips files starting with "_" when reading


def ddl(schema) -> str:
    return ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in schema.fields)


def tables_sql(warehouse: Path) -> str:
    """The statements that make the warehouse's tables visible in a Spark session."""
    lines = [f"CREATE DATABASE IF NOT EXISTS {DATABASE};"]
    for t in TABLES:
        d = table_dir(warehouse, t)
        if not (d / SCHEMA_FILE).exists():
            continue
        lines.append(f"CREATE TABLE IF NOT EXISTS {DATABASE}.{t} ({(d / SCHEMA_FILE).read_text().strip()}) "
                     f"USING parquet PARTITIONED BY ({', '.join(PARTITIONS)}) LOCATION '{d.resolve()}';")
        lines.append(f"MSCK REPAIR TABLE {DATABASE}.{t};")
    return "\n".join(lines) + "\n"


CATALOG_DIR = "_catalog"
CATALOG_MARKER = "tables.json"  # the statements the metastore's tables were created from


def catalog_dir(warehouse: Path) -> Path:
    return Path(warehouse).resolve() / CATALOG_DIR


def catalog_conf(warehouse: Path, log4j: str = "log4j2.properties") -> dict[str, str]:
    """Spark settings of a Hive session on the warehouse's own metastore (`log4j`: the driver's
    log configuration, a file beside this one)."""
    c = catalog_dir(warehouse)
    log4j = Path(__file__).with_name(log4j)
    return {
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": str(c / "databases"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={c / 'metastore_db'};create=true",
        # partitions come from listing the table's directories, never from the metastore
        "spark.sql.hive.manageFilesourcePartitions": "false",
        "spark.driver.extraJavaOptions": f"-Dderby.stream.error.file={c / 'derby.log'} "
                                         f"-Dlog4j2.configurationFile={log4j}",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
    }


def on_catalog(spark, warehouse: Path) -> bool:
    """Is `spark` a Hive session on this warehouse's metastore?"""
    conf = spark.sparkContext.getConf()
    key = "spark.hadoop.javax.jdo.option.ConnectionURL"
    return (conf.get("spark.sql.catalogImplementation", "in-memory") == "hive"
            and conf.get(key, "") == catalog_conf(warehouse)[key])


def write_conf_dir(warehouse: Path) -> Path:
    """`<warehouse>/_catalog/conf` with a spark-defaults.conf for SPARK_CONF_DIR."""
    d = catalog_dir(warehouse) / "conf"
    d.mkdir(parents=True, exist_ok=True)
    (d / "spark-defaults.conf").write_text(
        "# written by tidelog: pyspark's spark-sql / pyspark / spark-submit on this warehouse's catalog\n"
        + "".join(f"{k} {v}\n" for k, v in catalog_conf(warehouse).items()))
    return d


def spark_sql_command(warehouse: Path, tool: str = "spark-sql") -> str:
    """The command line of pyspark's own `spark-sql` (or `pyspark`) from the venv on the
    warehouse's catalog; nothing to register first."""
    return f"PATH=.venv/bin:$PATH SPARK_CONF_DIR={catalog_dir(warehouse) / 'conf'} {tool}" + \
        (f" --database {DATABASE}" if tool == "spark-sql" else "")


def catalog_statements(warehouse: Path) -> list[str]:
    """The DDL that creates the warehouse's tables in a Hive metastore (one per table that
    has a recorded schema), after the database."""
    out = [f"CREATE DATABASE IF NOT EXISTS {DATABASE}"]
    for t in TABLES:
        d = table_dir(warehouse, t)
        if (d / SCHEMA_FILE).exists():
            out.append(f"CREATE TABLE IF NOT EXISTS {DATABASE}.{t} ({(d / SCHEMA_FILE).read_text().strip()}) "
                       f"USING parquet PARTITIONED BY ({', '.join(PARTITIONS)}) LOCATION '{d.resolve()}'")
    return out


def existing_tables(warehouse: Path) -> list[str]:
    return [t for t in TABLES if (table_dir(warehouse, t) / SCHEMA_FILE).exists()]


def register(spark, warehouse: Path) -> list[str]:
    """Make the warehouse's tables visible in this session (and rewrite tables.sql, the same
    for an in-memory catalog); the table names registered. The persistent catalog learns of
    new tables here only through a running query server or when `spark` is a Hive session on
    it: otherwise `sqlserver.ensure_catalog` (tidelog reconcile, the DAG's publish) does it."""
    from spark_jobs import sqlserver

    sql = tables_sql(warehouse)
    Path(warehouse).mkdir(parents=True, exist_ok=True)
    (Path(warehouse) / "tables.sql").write_text(sql)
    if on_catalog(spark, warehouse):
        sqlserver.ensure_catalog(warehouse, spark)
    else:
        # a session's catalog may hold these tables from another warehouse (CREATE ... IF NOT
        # EXISTS would keep them pointing there): drop them first (external tables: only the
        # session's entry goes, never the files)
        for t in existing_tables(warehouse):
            spark.sql(f"DROP TABLE IF EXISTS {DATABASE}.{t}")
        for stmt in sql.split(";\n"):
            if stmt.strip():
                spark.sql(stmt)
        try:
            sqlserver.ensure_catalog(warehouse, spawn=False)
        except (OSError, sqlserver.ServerError, sqlserver.hs2client.HS2Error) as e:
            logging.getLogger(__name__).warning("the query server did not take the new tables: %s", e)
    spark.sql(f"USE {DATABASE}")
    return [r.tableName for r in spark.sql(f"SHOW TABLES IN {DATABASE}").collect()]


def read_table(spark, warehouse: Path, table: str):
    """A table as a DataFrame straight from its files (partition columns included), with its
    recorded schema, so a table without any rows yet reads as empty rather than failing."""
    d = table_dir(warehouse, table)
    if not (d / SCHEMA_FILE).exists():
        raise FileNotFoundError(f"no table {table} in {warehouse}: run `tidelog reconcile` first")
    return spark.read.schema((d / SCHEMA_FILE).read_text().strip()).parquet(str(d))


# columns whose values are (nearly) all distinct: Parquet's dictionary attempt only costs time.
# Not index, phys_offset, crc or store_timestamp: replica_entries has a row per message, and a
# TLE2 batch's messages share its index, offset, head CRC and store time (repeats a dictionary
# encodes well)
UNIQUE_COLUMNS = ("msg_id", "agreed_crc")


def replace_partition(spark, df, warehouse: Path, table: str, run_date: str, cluster: str) -> None:
    """Write `df` as the (run_date, cluster) partition of `table`, replacing what a previous
    run of that date wrote (and nothing else), even when `df` is empty."""
    path = str(table_dir(warehouse, table))
    jvm = spark._jvm
    part = jvm.org.apache.hadoop.fs.Path(f"{path}/run_date={run_date}/cluster={cluster}")
    fs = part.getFileSystem(spark._jsc.hadoopConfiguration())
    if fs.exists(part):
        fs.delete(part, True)
    w = df.write.mode("append").partitionBy(*PARTITIONS)
    for col in UNIQUE_COLUMNS:
        if col in df.columns:
            w = w.option(f"parquet.enable.dictionary#{col}", "false")
    w.parquet(path)
    (table_dir(warehouse, table) / SCHEMA_FILE).write_text(ddl(df.schema) + "\n")
