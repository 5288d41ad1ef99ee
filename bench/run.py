"""`make bench`: one JSON line per workload on stdout.

The broker runs as its own process (ops.localbroker) on loopback; this process is the client.
Every message is individually acknowledged; latency runs from the send call to its ack.
Each workload warms up, then measures until `duration_s` or `messages` runs out.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import uvloop

from broker.client import Admin, Producer, TidelogError
from ops.localbroker import LocalBroker

TOPIC = "bench"
QUEUES = 8
WARMUP_S = 0.5


@dataclass(frozen=True)
class Workload:
    name: str
    flush: str
    conns: int
    window: int
    payload: int = 1024

    @property
    def full_name(self) -> str:
        return f"{self.name}-{self.flush}"


WORKLOADS = [
    Workload(name, flush, conns, window)
    for flush in ("async", "sync")
    for name, conns, window in (("send-c1-w1", 1, 1), ("send-c1-w256", 1, 256), ("send-c4-w256", 4, 256))
]


def cpu_steal_s() -> float:
    """CPU time the hypervisor gave to someone else (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def percentile(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return 0.0
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100 * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


async def run_workload(w: Workload, address: str, broker_pid: int, duration_s: float,
                       messages: int) -> dict:
    producers = [Producer([address], send_timeout_ms=10_000) for _ in range(w.conns)]
    body = b"x" * w.payload
    lat: list[float] = []
    errors = 0
    measuring = False
    stop_at = 0.0
    sent = 0

    async def worker(p: Producer):
        nonlocal errors, sent
        perf = time.perf_counter
        while True:
            if measuring and (sent >= messages or perf() >= stop_at):
                return
            t0 = perf()
            try:
                await p.send_async(TOPIC, body)
            except TidelogError:
                errors += measuring
                continue
            if measuring:
                lat.append(perf() - t0)
                sent += 1

    # warm up: connections, routes, page cache
    measuring = False
    warm = [asyncio.create_task(worker(p)) for p in producers for _ in range(w.window)]
    await asyncio.sleep(WARMUP_S)
    server = psutil.Process(broker_pid)
    s0 = server.cpu_times()
    steal0 = cpu_steal_s()
    c0 = time.process_time()
    t0 = time.perf_counter()
    stop_at = t0 + duration_s
    measuring = True
    await asyncio.gather(*warm)
    wall = time.perf_counter() - t0
    c1 = time.process_time()
    s1 = server.cpu_times()
    steal1 = cpu_steal_s()
    for p in producers:
        await p.aclose()
    lat.sort()
    n = len(lat)
    return {
        "workload": w.full_name, "mode": "standalone", "replicas": 1, "flush": w.flush,
        "payload": w.payload, "conns": w.conns, "window": w.window, "n_acked": n, "errors": errors,
        "wall_s": round(wall, 3), "msgs_per_s": round(n / wall, 1),
        "MB_per_s": round(n * w.payload / wall / 1e6, 2),
        "lat_ms_p50": round(percentile(lat, 50) * 1e3, 3),
        "lat_ms_p99": round(percentile(lat, 99) * 1e3, 3),
        "lat_ms_p999": round(percentile(lat, 99.9) * 1e3, 3),
        "client_cpu_s": round(c1 - c0, 3),
        "server_cpu_s": round((s1.user + s1.system) - (s0.user + s0.system), 3),
        # this machine is a VM: CPU the host took away during the run explains slow runs
        "cpu_steal_s": round(steal1 - steal0, 3),
    }


def main(names: list[str], duration_s: float, messages: int, data_dir: Path) -> int:
    chosen = [w for w in WORKLOADS if not names or w.full_name in names or w.name in names]
    if not chosen:
        print(f"no such workload; choose from {[w.full_name for w in WORKLOADS]}", file=sys.stderr)
        return 2
    data_dir = Path(data_dir).resolve()
    failed = 0
    for flush in ("async", "sync"):
        group = [w for w in chosen if w.flush == flush]
        if not group:
            continue
        root = data_dir / f"standalone-{flush}"
        shutil.rmtree(root, ignore_errors=True)
        broker = LocalBroker(root, flush=flush, segment_bytes=256 << 20, log_level="WARNING")
        try:
            broker.start()
            with Admin([broker.address]) as a:
                a.create_topic(TOPIC, QUEUES)
            for w in group:
                print(f"bench: {w.full_name} ...", file=sys.stderr, flush=True)
                result = uvloop.run(run_workload(w, broker.address, broker.pid, duration_s, messages))
                failed += result["errors"] > 0
                print(json.dumps(result), flush=True)
        finally:
            broker.stop()
            shutil.rmtree(root, ignore_errors=True)
    return 1 if failed else 0
