"""Entry point for `spark-submit` (a Spark cluster, or pyspark's own launcher):

    spark-submit --master spark://HOST:7077 \\
        --properties-file ~/.tidelog/spark-auth.conf --load-spark-defaults \\
        spark_jobs/reconcile_main.py --logs /shared/logs --warehouse /shared/warehouse [--run-date 2026-11-22]

(the properties file: the Spark RPC secret the cluster's daemons share, ops/spark_cluster.py
AUTH_FILE; never `--conf spark.authenticate.secret=...`, which every local user can read).

Executors on other machines get the codec and the segment reader as a zip (addPyFile); the
collection and the warehouse must be on storage every executor can read. Prints the job's
summary as JSON; exit 1 when it found problems.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# What a task imports, closed under imports (tests/unit/test_reconcile_ship.py checks it): the
# segment reader reads TLE2 through codec's lazy re-exports of codec_batch, so both ship, and
# a Kafka zone's records through codec_kafka and broker/kafka/records.py (whose crc32c and
# cramjam a worker's Python needs too: they are Tidelog's own dependencies).
SHIPPED = ("broker/__init__.py", "broker/store/__init__.py", "broker/store/codec.py", "broker/store/codec_batch.py",
           "broker/store/native.py", "broker/store/codec_kafka.py", "broker/kafka/__init__.py",
           "broker/kafka/records.py",
           "spark_jobs/__init__.py", "spark_jobs/segment_reader.py", "spark_jobs/reconcile.py",
           "spark_jobs/warehouse.py", "spark_jobs/inputs.py", "broker/store/logreader.py", "broker/store/files.py",
           "broker/store/checkpoint.py")


def code_zip(directory: Path) -> Path:
    """The SHIPPED files as `directory`/tidelog_reconcile.zip (what executors import from)."""
    z = Path(directory) / "tidelog_reconcile.zip"
    with zipfile.ZipFile(z, "w") as f:
        for rel in SHIPPED:
            f.write(ROOT / rel, rel)
    return z


def ship_code(spark) -> None:
    """Executors not in local mode import the job's code from the zip (once per SparkContext:
    Spark refuses a second file of the same name), so workers need pyspark and pyarrow only."""
    sc = spark.sparkContext
    if sc.master.startswith("local") or getattr(sc, "_tidelog_shipped", False):
        return
    sc.addPyFile(str(code_zip(Path(tempfile.mkdtemp(prefix="tidelog-")))))
    sc._tidelog_shipped = True


def main(argv=None) -> int:
    from spark_jobs.reconcile import reconcile
    from spark_jobs.warehouse import session

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--logs", required=True, type=Path)
    ap.add_argument("--warehouse", type=Path, default=None)
    ap.add_argument("--run-date", default=None)
    args = ap.parse_args(argv)
    spark = session()
    ship_code(spark)
    try:
        r = reconcile(args.logs, args.run_date, args.warehouse, spark=spark)
    finally:
        spark.stop()
    print(json.dumps(r, default=str))
    return 0 if r["verdict"] == "clean" else 1


if __name__ == "__main__":
    sys.exit(main())
