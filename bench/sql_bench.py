"""The `sql-query-server` bench row: a small warehouse (3 replicas x N crafted entries,
reconciled by the Spark job), then the same queries through the query server (the code path
`tidelog sql` takes when one runs: a HiveServer2 session per query) and one query on the cold
path (a local Spark session: JVM start, Hive catalog, query). Seconds per query.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from spark_jobs import craft

NAME = "sql-query-server"
ENTRIES = 20_000
SEGMENT = 16 << 20
QUERIES = [
    "SELECT status, count(*) FROM tidelog.reconciled_log GROUP BY status",
    "SELECT node, lag, entries FROM tidelog.replica_summary ORDER BY node",
    "SELECT count(*) FROM tidelog.replica_entries WHERE NOT crc_ok",
    "SELECT max(index), min(index) FROM tidelog.reconciled_log WHERE committed",
    "SELECT count(*) FROM tidelog.replica_divergence",
]
RUNS = 10


def run(data_dir: Path, entries: int = ENTRIES) -> dict:
    from bench.run import percentile
    from spark_jobs import sqlserver
    from spark_jobs.reconcile import reconcile
    from spark_jobs.warehouse import session

    work = Path(data_dir) / "sql"
    shutil.rmtree(work, ignore_errors=True)
    logs = craft.write_cluster(work / "logs", "bench", [
        craft.Node(n, [craft.E(i, 1) for i in range(entries)], entries - 1) for n in ("r1", "r2", "r3")],
        segment_bytes=SEGMENT).parent
    wh = work / "warehouse"
    spark = session("local[2]", app="tidelog-bench")
    try:
        reconcile(logs, "2026-01-01", wh, spark=spark)
    finally:
        spark.stop()
    errors = 0
    t0 = time.monotonic()
    info = sqlserver.start(wh)
    start_s = time.monotonic() - t0
    times, answers = [], {}
    try:
        for i in range(RUNS):
            q = QUERIES[i % len(QUERIES)]
            t0 = time.monotonic()
            answers[q] = sqlserver.query(info, q).rows
            times.append(time.monotonic() - t0)
    finally:
        sqlserver.stop(wh)
    errors += answers[QUERIES[0]] != [("consistent", entries)]
    # the cold path as a user meets it: `tidelog sql` in a new process, no server
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "ops.cli.main", "sql", QUERIES[0], "--warehouse", str(wh), "--json"],
                       capture_output=True, text=True)
    cold_s = time.monotonic() - t0
    errors += p.returncode != 0
    shutil.rmtree(work, ignore_errors=True)
    times.sort()
    return {"workload": NAME, "entries": 3 * entries, "queries": RUNS,
            "server_query_s_p50": round(percentile(times, 50), 3), "server_query_s_p90": round(percentile(times, 90), 3),
            "server_query_s_max": round(times[-1], 3), "server_start_s": round(start_s, 1),
            "cold_query_s": round(cold_s, 1), "target_server_query_s": 2.0, "errors": errors}
