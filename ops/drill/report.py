"""The drill's report: `report.json` and `drill.png` (acks per second and latency over time,
fault windows shaded, the steps of a combined fault marked, leader changes marked, the time
every name server was down hatched)."""

from __future__ import annotations

import json
from pathlib import Path

from ops.drill.checker import Op


def write_json(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(path)


def plot(path: Path, ops: list[Op], faults: list[dict], leaders: list[tuple[float, str | None]],
         title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    end = max([o.t1 or o.t0 for o in ops] + [0.0]) + 1
    secs = int(end) + 1
    acks = [0] * secs
    for o in ops:
        if o.outcome == "ok":
            acks[int(o.t1)] += 1
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    ax1.step(range(secs), acks, where="post", color="tab:blue", label="acks/s")
    ax1.set_ylabel("acknowledged sends / s")
    ok = [(o.t1, (o.t1 - o.t0) * 1000) for o in ops if o.outcome == "ok"]
    bad = [(o.t1, (o.t1 - o.t0) * 1000, o.outcome) for o in ops if o.outcome in ("fail", "unknown")]
    if ok:
        ax2.scatter([t for t, _ in ok], [ms for _, ms in ok], s=3, color="tab:blue", label="ok")
    for kind, color in (("fail", "tab:red"), ("unknown", "tab:orange")):
        pts = [(t, ms) for t, ms, k in bad if k == kind]
        if pts:
            ax2.scatter([t for t, _ in pts], [ms for _, ms in pts], s=12, marker="x", color=color, label=kind)
    ax2.set_yscale("log")
    ax2.set_ylabel("latency (ms)")
    ax2.set_xlabel("seconds since the drill started")
    for f in faults:
        for ax in (ax1, ax2):
            ax.axvspan(f["at_s"], f.get("healed_at_s") or end, color="tab:red", alpha=0.12)
        out = f.get("namesrv_outage")
        if out:  # every name server down: hatched, with what was acknowledged meanwhile
            ax1.axvspan(out["namesrv_down_at_s"], out["namesrv_back_at_s"], ymax=0.08, fill=False, hatch="///",
                        edgecolor="tab:purple", linewidth=0)
            ax1.annotate(f"name servers down: {out['acks']} acks, longest gap {out['longest_ack_gap_s']} s",
                         (out["namesrv_down_at_s"], 0.09), xycoords=("data", "axes fraction"), fontsize=7,
                         color="tab:purple")
        ax1.annotate(f"{f['kind']} {f['node']}", (f["at_s"], max(acks + [1])), fontsize=8, va="top")
        steps = f.get("steps") or []
        if len(steps) > 1:  # a sequence (or overlapping faults): each step a tick on the latency axis,
            groups: list[list[dict]] = []  # steps less than 0.2 s apart share one label
            for s in steps:
                if groups and s["at_s"] - groups[-1][0]["at_s"] < 0.2:
                    groups[-1].append(s)
                else:
                    groups.append([s])
            for g in groups:
                color = "tab:red" if any("error" in s for s in g) else "dimgray"
                ax2.axvline(g[0]["at_s"], color=color, linestyle=":", linewidth=0.8)
                label = ", ".join(f"{s['step']} {s.get('node') or ''}".strip() for s in g)
                ax2.annotate(label, (g[0]["at_s"], 0.98), fontsize=6, color=color, rotation=90, va="top",
                             ha="right", xycoords=("data", "axes fraction"))
    for t, leader in leaders:  # leader changes (None: no leader seen)
        if leader is not None and t > 0.5:
            for ax in (ax1, ax2):
                ax.axvline(t, color="tab:green", linestyle="--", linewidth=1)
            ax1.annotate(f"leader {leader}", (t, 0), fontsize=8, color="tab:green", rotation=90, va="bottom")
    ax1.legend(loc="upper right", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
