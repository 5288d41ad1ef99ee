"""What `make bench` (bench/run.py) and `make bench-peers` (bench/peers) measure with alike:
the windowed send loop of ../shared/peers/bench.py's `run_conn` ("async" mode) and a process's
CPU time to the nanosecond."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import time


class Window:
    """One measured phase: sends stop at `stop_at` or once `budget` sends were issued (shared
    by every connection of the phase); latencies of the acknowledged ones, and the errors."""

    def __init__(self, stop_at: float, budget: int, lat=None):
        self.stop_at, self.budget = stop_at, budget
        self.lat = [] if lat is None else lat  # seconds from issue to ack, one per ack
        self.errors = 0


async def run_window(send, payload: bytes, window: int, m: Window, settle_s: float = 15.0) -> None:
    """Keep at most `window` sends in flight until the phase ends, then wait (at most
    `settle_s`) for the outstanding ones: those still unanswered count as errors. `send(payload)`
    returns a future of the ack, or an awaitable of one (nats-py's publish_async)."""
    sem = asyncio.Semaphore(window)
    perf = time.perf_counter
    outstanding = 0
    idle = asyncio.Event()
    idle.set()

    def done(f: asyncio.Future, t0: float) -> None:
        nonlocal outstanding
        outstanding -= 1
        if f.cancelled() or f.exception() is not None:
            m.errors += 1
        else:
            m.lat.append(perf() - t0)
        sem.release()
        if outstanding == 0:
            idle.set()

    while True:
        await sem.acquire()
        if m.budget <= 0 or perf() >= m.stop_at:
            sem.release()
            break
        m.budget -= 1
        t0 = perf()
        try:
            fut = send(payload)
            if not isinstance(fut, asyncio.Future):
                fut = await fut
        except Exception:  # refused at once (the client's error, whichever client)
            m.errors += 1
            sem.release()
            continue
        outstanding += 1
        idle.clear()
        fut.add_done_callback(lambda f, t0=t0: done(f, t0))
    try:
        await asyncio.wait_for(idle.wait(), timeout=settle_s)
    except asyncio.TimeoutError:
        m.errors += outstanding


@contextlib.contextmanager
def frozen_heap():
    """Measure with what the process holds at the start of a row (its imports, the cluster
    tooling, earlier rows) out of the collector's sight, as the brokers freeze theirs after
    start (broker/server.py): a row counts what a message costs the client, the collection of
    its own garbage included, not full collections walking a heap whose size depends on what
    else the process imported. Not what ../shared/peers/bench.py does: its fresh interpreter
    freezes nothing, and there each full collection walks its imports (~55k objects; ~1 us a
    message more at raft-3 W=256). Unfrozen after, so the next run freezes what is live then
    and this one's leftovers are not kept for ever."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def process_cpu_s(pid: int) -> float:
    """utime + stime of one whole process (every thread, the ones that ended too), to the
    nanosecond: Linux's process CPU clock for `pid` (CPUCLOCK_SCHED = 2); /proc ticks (10 ms,
    which round a short run's follower to zero) if the clock is refused; 0 once it is gone."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0
