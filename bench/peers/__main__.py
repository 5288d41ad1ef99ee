"""`make bench-peers`: Tidelog and NATS JetStream side by side, in one run, through one client loop.

    python -m bench.peers [--reps 1] [--n 100000] [--n-w1 10000] [--cap 60] [--systems "nats1 standalone"]

Env (the flags override), prefixed so that a shell's generic N or OUT is never picked up:
PEERS_REPS (1), PEERS_N (100000 messages at W=256), PEERS_N_W1 (10000 at W=1), PEERS_CAP (60 s per
run), PEERS_SYSTEMS ("nats3 nats1 nats3sync raft raftsync standalone ms"), PEERS_WARMUP (2000
unmeasured messages), PEERS_PAYLOAD (1024 bytes), PEERS_UVLOOP=1 (both clients on uvloop; default:
asyncio's loop), NATS_BIN (nats-server; default: on PATH), PEERS_WORK (data, logs; default: a temp
dir, removed unless a run failed or PEERS_KEEP=1), PEERS_OUT (also append every JSON line there).
`make bench-peers REPS=3 N=... SYSTEMS=...` sets these from make's command line (the Makefile).

stdout: one JSON line per run (compare.sh's bench.py fields plus system_key), then one per ratio
(compare.sh's: {"ratio", "window", "tidelog", "nats", "x"}, medians of msgs/s over REPS). stderr:
progress and a table of medians. nats-py must be importable (make bench-peers puts the bench
venv's site-packages on PYTHONPATH). Exit 1 if a run failed, had errors, or lost acknowledged
messages.

Every server started here is stopped on a normal exit, an exception, SIGTERM, SIGINT and SIGHUP
(the handler turns the first into SystemExit, so the `with` blocks unwind, and ignores the next
ones while they do). If this process is SIGKILLed: nats-server dies with it (a parent-death
signal, nats_cluster.py) and reaper.py stops the Tidelog brokers (and any nats-server) left
under the work dir.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

from bench.peers import loop, reaper, report, systems
from bench.peers.nats_cluster import nats_bin, version


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    env = lambda name, default=None: os.environ.get("PEERS_" + name, default)
    ap = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=int(env("REPS", "1")))
    ap.add_argument("--n", type=int, default=int(env("N", "100000")), help="messages at W=256")
    ap.add_argument("--n-w1", type=int, default=int(env("N_W1", "10000")), help="messages at W=1")
    ap.add_argument("--cap", type=float, default=float(env("CAP", "60")), help="seconds per run at most")
    ap.add_argument("--systems", default=env("SYSTEMS") or systems.DEFAULT)
    ap.add_argument("--warmup", type=int, default=int(env("WARMUP", "2000")))
    ap.add_argument("--payload", type=int, default=int(env("PAYLOAD", "1024")))
    ap.add_argument("--uvloop", action="store_true", default=env("UVLOOP", "0") == "1")
    ap.add_argument("--work", default=env("WORK"), help="data and logs (default: a temp dir)")
    ap.add_argument("--out", default=env("OUT"), help="also append every JSON line to this file")
    a = ap.parse_args(argv)
    if a.reps < 1 or a.n < 1 or a.n_w1 < 1 or a.cap <= 0:
        ap.error("REPS, N, N_W1 must be >= 1 and CAP > 0")
    try:
        a.systems = systems.parse(a.systems)
    except ValueError as e:
        ap.error(str(e))
    return a


def run_loop(coro, use_uvloop: bool):
    if use_uvloop:
        import uvloop
        return uvloop.run(coro)
    return asyncio.run(coro)


def bad(rec: dict) -> str | None:
    """Why a run's record is not a clean run, or None."""
    if rec["errors"]:
        return f"{rec['errors']} errors"
    if rec["n_acked"] == 0:
        return "nothing acknowledged"
    if rec["stream_msgs"] is not None and rec["stream_msgs"] < rec["n_acked"] + rec["warmup_acked"]:
        return f"stream holds {rec['stream_msgs']} < {rec['n_acked'] + rec['warmup_acked']} acknowledged"
    return None


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def on_stop_signal(signum, _frame) -> None:
    """make / timeout / Ctrl-C: unwind (every `with` stops its servers); further signals are
    ignored so that they cannot cut the cleanup short."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    note(f"bench-peers: {signal.Signals(signum).name}: stopping every server started here")
    sys.exit(128 + signum)


def main(argv=None) -> int:
    args = parse_args(argv)
    for s in STOP_SIGNALS:
        signal.signal(s, on_stop_signal)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tidelog-bench-peers-"))
    work.mkdir(parents=True, exist_ok=True)
    work = work.resolve()
    reaper_pipe = reaper.start(work)  # closed by the kernel when we exit, however we do
    try:
        return run(args, work)
    finally:
        os.close(reaper_pipe)


def run(args: argparse.Namespace, work: Path) -> int:
    out = open(args.out, "a") if args.out else None
    need_nats = any(s.kind == "nats" for s in args.systems)
    binary = nats_bin() if need_nats else None
    nats_ver = version(binary) if binary else ""
    if need_nats:
        import nats  # noqa: F401  (fail now, not after the first Tidelog group)

    def emit(obj: dict) -> None:
        line = json.dumps(obj)
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    rows, failed = [], []
    note(f"bench-peers: {' '.join(s.key for s in args.systems)} x {args.reps}, N={args.n} (W=256) "
         f"N_W1={args.n_w1} cap {args.cap:.0f}s, {nats_ver or 'no NATS'}, work {work}")
    try:
        for rep in range(1, args.reps + 1):
            for s in args.systems:
                note(f"rep {rep}: {s.key}")
                try:
                    with systems.running(s, work, binary, nats_ver) as t:
                        for window, n in ((1, args.n_w1), (256, args.n)):
                            rec = run_loop(loop.measure(t, window, n, args.cap, args.warmup, args.payload),
                                           args.uvloop)
                            rec["rep"] = rep
                            rows.append(rec)
                            emit(rec)
                            why = bad(rec)
                            if why:
                                failed.append(f"{t.name} W={window}: {why}")
                            note(f"  {t.name} W={window}: {rec['n_acked']} acked in {rec['wall_s']}s = "
                                 f"{rec['msgs_per_s']:.0f} msg/s, p50 {rec['lat_ms_p50']} p99 {rec['lat_ms_p99']} ms, "
                                 f"errors {rec['errors']}" + (f"  FAILED: {why}" if why else ""))
                except Exception as e:
                    failed.append(f"{s.key}: {e!r}")
                    note(f"  {s.key} failed: {e!r}")
                    traceback.print_exc(file=sys.stderr)
        summaries = report.summarize(rows)
        lines = report.ratios(summaries)
        for r in lines:
            emit(r)
        print("\n" + report.table(summaries), file=sys.stderr)
        if lines:
            print("\nTidelog / NATS, msgs/s (median over REPS):\n" + report.ratio_table(lines), file=sys.stderr)
        busy = [r["machine_busy_frac"] for r in rows if r.get("machine_busy_frac") is not None]
        if busy:
            print(f"\nmachine: {os.cpu_count()} cpus; busy {min(busy):.2f}-{max(busy):.2f} of all cores during "
                  f"the runs (client and servers share them: only ratios from one run compare)", file=sys.stderr)
    finally:
        if out:
            out.close()
        keep = failed or os.environ.get("PEERS_KEEP") == "1" or args.work
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    if failed:
        print("FAILED:\n  " + "\n  ".join(failed) + f"\n(logs under {work})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
