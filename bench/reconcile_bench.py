"""The `reconcile` bench row: 3 replicas x N entries of 1 KiB, reconciled by the Spark job
(local[2]), against the same files read and CRC-checked by a plain sequential Python scan
(logreader.iter_entries, one process). Spark's start-up is reported apart from the job.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from broker.store.files import NAME_DIGITS
from broker.store.logreader import iter_entries
from spark_jobs import craft

SEGMENT = 64 << 20
PAYLOAD = 1024
NAME = "reconcile-3replicas"


def make_logs(out: Path, entries: int) -> Path:
    """One log encoded once, written as three replicas' directories."""
    body = bytes(range(256)) * (PAYLOAD // 256)
    log = (craft.E(i, 1 + i // 100_000, body=body) for i in range(entries))
    segs = craft.encode_log(log, SEGMENT)
    nodes = [craft.Node(n, [], entries - 1) for n in ("r1", "r2", "r3")]
    base = craft.write_cluster(out, "bench", nodes, segment_bytes=SEGMENT)  # checkpoint, node.json
    for n in nodes:
        cl = base / n.id / "commitlog"
        shutil.rmtree(cl)
        cl.mkdir()
        for off, buf in segs:
            (cl / f"{off:0{NAME_DIGITS}d}").write_bytes(buf)
    return base


def run(data_dir: Path, entries: int) -> dict:
    from spark_jobs.reconcile import reconcile
    from spark_jobs.warehouse import session

    work = Path(data_dir) / "reconcile"
    shutil.rmtree(work, ignore_errors=True)
    t0 = time.monotonic()
    base = make_logs(work / "logs", entries)
    gen_s = time.monotonic() - t0

    t0 = time.monotonic()
    scanned = sum(1 for n in ("r1", "r2", "r3") for _ in iter_entries(base / n))
    scan_s = time.monotonic() - t0

    t0 = time.monotonic()
    spark = session("local[2]", app="tidelog-bench")
    start_s = time.monotonic() - t0
    try:
        t0 = time.monotonic()
        r = reconcile(work / "logs", "2026-01-01", work / "warehouse", spark=spark)
        job_s = time.monotonic() - t0
    finally:
        spark.stop()
    (c,) = r["clusters"]
    total = 3 * entries
    ok = c["verdict"] == "clean" and c["entries"] == total and scanned == total
    shutil.rmtree(work, ignore_errors=True)
    return {"workload": NAME, "replicas": 3, "entries_per_replica": entries, "entries": total,
            "payload": PAYLOAD, "bytes": total * (PAYLOAD + 91 + len("orders")),
            "spark_s": round(job_s, 2), "spark_entries_per_s": round(total / job_s),
            "spark_start_s": round(start_s, 2),
            "python_scan_s": round(scan_s, 2), "python_scan_entries_per_s": round(total / scan_s),
            "generate_s": round(gen_s, 2), "phases_s": c["timings_s"], "target_s": 60 if entries >= 1_000_000 else None,
            "verdict": c["verdict"], "errors": 0 if ok else 1}
