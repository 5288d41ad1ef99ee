"""`make run`, part two: a local 3-node raft group (infra/examples/local-raft3.yaml), a short
kill-leader drill through the same code as `tidelog drill`, its figures, a clean stop."""

from __future__ import annotations

from pathlib import Path

import click
import yaml

from infra import spec as sp
from ops import deploy
from ops.drill.run import drill

EXAMPLE = Path(__file__).resolve().parents[1] / "infra" / "examples" / "local-raft3.yaml"


def say(msg: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + msg)


def run(data_dir: Path, duration_s: float = 12.0, rate: float = 200.0) -> tuple[list[tuple], list[str]]:
    """(summary rows, problems)."""
    d = yaml.safe_load(EXAMPLE.read_text())
    d["state_dir"] = str(Path(data_dir).resolve() / "platform")
    spec = sp.from_dict(d, str(EXAMPLE))
    rows, problems = [], []
    say(f"deploying {spec.name}: 3 raft nodes on 127.0.0.11-13 (spec {EXAMPLE.name})")
    try:
        r = deploy.deploy(spec)
        g = r["status"]["groups"][0]
        say(f"group {g['name']} healthy, leader {g['leader']}; drill: kill -9 the leader, "
            f"{duration_s:g}s of acknowledged sends at {rate:g}/s")
        rep = drill(spec, "kill-leader", duration_s, rate, Path(data_dir).resolve() / "drill-reports",
                    log=lambda m: click.echo(f"    {m.strip()}"))
    finally:
        deploy.stop(spec)
    f = rep["figures"]
    rows += [("drill: sends acknowledged", f["ok"]), ("drill: failed / unknown", f"{f['failed']} / {f['unknown']}"),
             ("drill: acknowledged but lost", rep["counts"]["lost"]),
             ("drill: time to a new leader (s)", f["time_to_new_leader_s_max"]),
             ("drill: longest gap between acks (s)", f["longest_ack_gap_s"]),
             ("drill: recovery after restart (s)", f["recovery_s_max"])]
    if not rep["ok"]:
        problems += [f"drill {kind}: {ex}" for kind, exs in rep["anomalies"].items() for ex in exs[:3]]
    say(f"drill report: {rep['report_dir']}/report.json, plot: {rep['plot']}")
    return rows, problems
