"""The Spark session and the warehouse the reconciled tables live in.

Tables are Parquet directories under the warehouse, partitioned by `run_date` and `cluster`:

    <warehouse>/<table>/run_date=2026-11-22/cluster=prod/part-*.parquet

The catalog is Spark's in-memory one: every session (ours, `tidelog sql`, a user's
`spark-sql -i <warehouse>/tables.sql`) registers the tables from `tables.sql`, which the job
rewrites after each run. No metastore process, nothing that allows only one JVM at a time.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

DATABASE = "tidelog"
TABLES = ("replica_entries", "reconciled_log", "replica_divergence", "replica_summary")
PARTITIONS = ("run_date", "cluster")


def default_warehouse() -> Path:
    return Path(os.environ.get("TIDELOG_WAREHOUSE", Path.home() / ".tidelog" / "warehouse")).expanduser()


def session(master: str | None = None, app: str = "tidelog-reconcile"):
    """A SparkSession for the job (local[2] unless told otherwise: --master or
    $TIDELOG_SPARK_MASTER; under spark-submit the master it was given)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # local mode: no guessing at interfaces
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app)
    master = master or os.environ.get("TIDELOG_SPARK_MASTER")
    if master:
        b = b.master(master)
    elif not os.environ.get("SPARK_SUBMIT_OPTS") and "spark.master" not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
        b = b.master("local[2]")
    log4j = Path(__file__).with_name("log4j2.properties")
    spark = (b.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={log4j}")
              .config("spark.ui.enabled", "false")
              .config("spark.ui.showConsoleProgress", "false")
              .config("spark.sql.session.timeZone", "UTC")
              .config("spark.sql.shuffle.partitions", "8")
              .config("spark.sql.adaptive.enabled", "true")
              .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
              .config("spark.sql.execution.arrow.pyspark.enabled", "true")
              .config("spark.driver.memory", os.environ.get("TIDELOG_SPARK_DRIVER_MEMORY", "2g"))
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


def spark_sql_command(warehouse: Path) -> str:
    """The `spark-sql` command line (pyspark's own CLI, from the venv) that sees the tables;
    the in-memory catalog keeps it from creating a Derby metastore in the working directory."""
    return (f"PATH=.venv/bin:$PATH spark-sql --conf spark.sql.catalogImplementation=in-memory "
            f"-i {Path(warehouse) / 'tables.sql'}")


def register(spark, warehouse: Path) -> list[str]:
    """Make the warehouse's tables visible in this session (and rewrite tables.sql for
    spark-sql users); the table names registered."""
    sql = tables_sql(warehouse)
    Path(warehouse).mkdir(parents=True, exist_ok=True)
    (Path(warehouse) / "tables.sql").write_text(sql)
    for stmt in sql.split(";\n"):
        if stmt.strip():
            spark.sql(stmt)
    spark.sql(f"USE {DATABASE}")
    return [r.tableName for r in spark.sql(f"SHOW TABLES IN {DATABASE}").collect()]


def read_table(spark, warehouse: Path, table: str):
    """A table as a DataFrame straight from its files (partition columns included), with its
    recorded schema, so a table without any rows yet reads as empty rather than failing."""
    d = table_dir(warehouse, table)
    if not (d / SCHEMA_FILE).exists():
        raise FileNotFoundError(f"no table {table} in {warehouse}: run `tidelog reconcile` first")
    return spark.read.schema((d / SCHEMA_FILE).read_text().strip()).parquet(str(d))


# columns whose values are (nearly) all distinct: Parquet's dictionary attempt only costs time
UNIQUE_COLUMNS = ("index", "msg_id", "phys_offset", "crc", "agreed_crc", "store_timestamp")


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
