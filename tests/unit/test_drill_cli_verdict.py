"""`tidelog drill`'s verdict line and exit status from the drill's report: safety first, then
liveness (a workload that stopped while every name server was down). The drill itself is
replaced by canned reports: this tests the command's reading of them, not a drill."""

import pytest
from click.testing import CliRunner

from ops.cli import platform_cmds
from ops.drill import run as drill_run

FIGURES = {"ops": 10, "ok": 10, "failed": 0, "unknown": 0, "reads": 10, "faults": 1,
           "time_to_new_leader_s_max": None, "longest_ack_gap_s": 0.1, "recovery_s_max": 1.0,
           "latency_ms_p50": 1, "latency_ms_p99": 2, "latency_ms_max": 3}


def report(ok: bool, live_problems: list[str] | None) -> dict:
    r = {"run_id": "r1", "nemesis": "kill-namesrv", "seed": 7, "ok": ok, "figures": FIGURES,
         "counts": {"lost": 0 if ok else 1}, "anomalies": {} if ok else {"lost": [{"op": 1}]},
         "report_dir": "/x", "plot": "/x/drill.png"}
    if live_problems is not None:
        r["liveness"] = {"ok": not live_problems, "problems": live_problems}
    return r


@pytest.mark.parametrize("ok,live,verdict,status", [
    (True, None, "OK", 0),                                   # a report from before liveness
    (True, [], "OK", 0),
    (True, ["no send acknowledged while every name server was down"], "LIVENESS FAILURE", 1),
    (False, ["no send acknowledged while every name server was down"], "SAFETY VIOLATION", 1),
    (False, [], "SAFETY VIOLATION", 1),
])
def test_verdict_and_exit_status(monkeypatch, tmp_path, ok, live, verdict, status):
    monkeypatch.setattr(platform_cmds, "load_spec", lambda path, group=None: object())
    monkeypatch.setattr(drill_run, "drill", lambda *a, **k: report(ok, live))
    res = CliRunner().invoke(platform_cmds.drill, ["--spec", str(tmp_path / "s.yaml"), "--duration", "1"])
    assert res.exit_code == status, res.output
    assert f"seed 7): {verdict}" in res.output
    for problem in live or []:
        assert f"! liveness: {problem}" in res.output
