"""`make bench-peers`'s arithmetic (bench/peers/report.py): medians over repetitions per system
and window, and compare.sh's Tidelog/NATS ratio lines built from them."""

from __future__ import annotations

import json

from bench.peers import report
from bench.peers.__main__ import bad


def row(key, name, window, rate, *, acked=1000, errors=0, p50=1.0, servers=(10.0,)):
    return {"system_key": key, "server_version": name, "window": window, "msgs_per_s": rate,
            "n_acked": acked, "errors": errors, "lat_ms_p50": p50, "lat_ms_p99": p50 * 3,
            "client_cpu_us_per_msg": 40.0, "server_cpu_us_per_msg_each": list(servers)}


def test_median_over_reps_per_system_and_window():
    rows = [row("nats1", "nats v2.15.1 R1", 256, r, p50=r / 1000) for r in (30_000, 10_000, 20_000)]
    rows += [row("nats1", "nats v2.15.1 R1", 1, 2_000), row("nats1", "nats v2.15.1 R1", 1, 3_000)]
    s = report.summarize(rows)
    assert s[("nats1", 256)].msgs_per_s == 20_000 and s[("nats1", 256)].reps == 3
    assert s[("nats1", 256)].lat_ms_p50 == 20.0
    assert s[("nats1", 1)].msgs_per_s == 2_500          # even count: the mean of the middle two


def test_server_cpu_sums_the_processes_then_takes_the_median():
    rows = [row("raft", "tidelog raft3", 256, 1, servers=(10, 5, 5)),
            row("raft", "tidelog raft3", 256, 1, servers=(30, 1, 1)),
            row("raft", "tidelog raft3", 256, 1, servers=(1, 1, 1))]
    assert report.summarize(rows)[("raft", 256)].server_cpu_us_per_msg == 20


def test_a_run_that_acked_nothing_has_no_rate_but_keeps_its_errors():
    rows = [row("standalone", "tidelog standalone", 1, 0.0, acked=0, errors=7),
            row("standalone", "tidelog standalone", 1, 4_000, errors=1)]
    s = report.summarize(rows)[("standalone", 1)]
    assert (s.msgs_per_s, s.reps, s.errors) == (4_000, 1, 8)


def test_ratio_lines_are_compare_sh_pairs_in_its_order():
    rows = []
    for w, scale in ((1, 1), (256, 20)):
        rows += [row("nats3", "nats v2.15.1 R3", w, 1_000 * scale), row("nats1", "nats v2.15.1 R1", w, 2_000 * scale),
                 row("nats3sync", "nats v2.15.1 R3 sync", w, 500 * scale),
                 row("raft", "tidelog raft3", w, 900 * scale), row("raftsync", "tidelog raft3-sync", w, 600 * scale),
                 row("standalone", "tidelog standalone", w, 3_000 * scale), row("ms", "tidelog ms-sync", w, 1_370 * scale)]
    lines = report.ratios(report.summarize(rows))
    assert [(r["ratio"], r["window"]) for r in lines] == [
        (label, w) for w in (1, 256) for label in ("tidelog raft3 / nats R3", "tidelog raft3-sync / nats R3 sync",
                                                   "tidelog standalone / nats R1", "tidelog ms-sync / nats R3")]
    first = lines[0]
    assert first == {"ratio": "tidelog raft3 / nats R3", "window": 1, "tidelog": 900, "nats": 1000, "x": 0.9}
    assert [r["x"] for r in lines[4:]] == [0.9, 1.2, 1.5, 1.37]
    assert all(json.loads(json.dumps(r)) == r for r in lines)
    text = report.table(report.summarize(rows))
    assert "tidelog ms-sync" in text and "nats v2.15.1 R3 sync" in text


def test_no_ratio_without_both_sides_or_with_a_zero_rate():
    only = report.summarize([row("standalone", "tidelog standalone", 1, 4_000), row("nats3", "nats R3", 1, 1_000),
                             row("raft", "tidelog raft3", 1, 0.0, acked=0)])
    assert report.ratios(only) == []


def test_a_run_is_bad_on_errors_on_nothing_acked_or_on_a_short_stream():
    ok = {"errors": 0, "n_acked": 100, "warmup_acked": 10, "stream_msgs": 110}
    assert bad(ok) is None and bad({**ok, "stream_msgs": None}) is None
    assert "errors" in bad({**ok, "errors": 2})
    assert "nothing" in bad({**ok, "n_acked": 0})
    assert "109 < 110" in bad({**ok, "stream_msgs": 109})
