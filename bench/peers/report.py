"""Medians over repetitions, the Tidelog/NATS ratios and the human table: pure functions of the
runs' JSON records (bench/peers/loop.py makes them), so a results file can be re-read later.

The pairs are the ones ../shared/peers/compare.sh prints, in its order and with its labels:
raft-3 against NATS R3, raft-3 with flush sync against NATS R3 with `sync_interval: always`
(both fsync before the ack), standalone against NATS R1, master-slave SYNC against NATS R3.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

WINDOWS = (1, 256)


class Pair(NamedTuple):
    tidelog: str   # system key (bench/peers/systems.py)
    nats: str
    label: str     # "tidelog raft3 / nats R3"


PAIRS = (
    Pair("raft", "nats3", "tidelog raft3 / nats R3"),
    Pair("raftsync", "nats3sync", "tidelog raft3-sync / nats R3 sync"),
    Pair("standalone", "nats1", "tidelog standalone / nats R1"),
    Pair("ms", "nats3", "tidelog ms-sync / nats R3"),
)


class Summary(NamedTuple):
    """One system at one window, medians over its repetitions."""
    key: str
    name: str
    window: int
    reps: int
    msgs_per_s: float
    lat_ms_p50: float | None
    lat_ms_p99: float | None
    client_cpu_us_per_msg: float | None
    server_cpu_us_per_msg: float | None   # all of the system's server processes together
    errors: int                           # summed over the repetitions


def _median(values) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def summarize(rows: list[dict]) -> dict[tuple[str, int], Summary]:
    """(system key, window) -> Summary. A run that acknowledged nothing has no rate to take the
    median of; it still counts its errors."""
    groups: dict[tuple[str, int], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["system_key"], r["window"]), []).append(r)
    out = {}
    for (key, w), rs in groups.items():
        ok = [r for r in rs if r.get("n_acked")]
        out[(key, w)] = Summary(
            key, rs[0]["server_version"], w, len(ok),
            _median(r["msgs_per_s"] for r in ok) or 0.0,
            _median(r.get("lat_ms_p50") for r in ok), _median(r.get("lat_ms_p99") for r in ok),
            _median(r.get("client_cpu_us_per_msg") for r in ok),
            _median(sum(r.get("server_cpu_us_per_msg_each") or [0]) for r in ok),
            sum(r.get("errors", 0) for r in rs))
    return out


def ratios(summaries: dict[tuple[str, int], Summary]) -> list[dict]:
    """compare.sh's ratio lines: median msgs/s of Tidelog over NATS, per pair present, per window."""
    out = []
    for w in WINDOWS:
        for p in PAIRS:
            a, b = summaries.get((p.tidelog, w)), summaries.get((p.nats, w))
            if a and b and a.msgs_per_s > 0 and b.msgs_per_s > 0:
                out.append({"ratio": p.label, "window": w, "tidelog": round(a.msgs_per_s),
                            "nats": round(b.msgs_per_s), "x": round(a.msgs_per_s / b.msgs_per_s, 2)})
    return out


def table(summaries: dict[tuple[str, int], Summary]) -> str:
    fmt = lambda v, spec: "-" if v is None else format(v, spec)
    lines = [f"{'system':30} {'W':>4} {'reps':>4} {'msgs/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
             f"{'client us':>9} {'servers us':>10} {'errors':>6}"]
    for s in sorted(summaries.values(), key=lambda s: (s.name, s.window)):
        lines.append(f"{s.name:30} {s.window:>4} {s.reps:>4} {s.msgs_per_s:>9.0f} {fmt(s.lat_ms_p50, '7.2f')} "
                     f"{fmt(s.lat_ms_p99, '7.2f')} {fmt(s.client_cpu_us_per_msg, '9.1f')} "
                     f"{fmt(s.server_cpu_us_per_msg, '10.1f')} {s.errors:>6}")
    return "\n".join(lines)


def ratio_table(lines: list[dict]) -> str:
    return "\n".join(f"{r['ratio']:36} W={r['window']:<4} {r['tidelog']:>7} / {r['nats']:>7} = {r['x']:.2f}x"
                     for r in lines)
