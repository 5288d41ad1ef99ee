"""HTML pages for the reports the Airflow plugin serves (ops/airflow_plugin.py): a drill run's
report (verdict, figures, anomalies, fault timeline, leader changes, the plot), a nightly
reconcile's verdicts with its Data Docs pages, any other run's task summaries, and an index.

Pure functions of plain data (no Airflow, no files): every value is escaped here.
"""

from __future__ import annotations

import json
from html import escape
from urllib.parse import quote

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px 24px;color:#1b1f24}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:22px 0 6px} .sub{color:#57606a;margin-bottom:10px}
.ok{color:#1a7f37;font-weight:600} .bad{color:#cf222e;font-weight:600}
.pill{display:inline-block;padding:1px 9px;border-radius:10px;font-weight:600;font-size:13px}
.pill.ok{background:#dafbe1} .pill.bad{background:#ffebe9}
table{border-collapse:collapse;margin:4px 0 8px} td,th{border:1px solid #d0d7de;padding:3px 9px;text-align:left}
th{background:#f6f8fa} td.n{text-align:right;font-variant-numeric:tabular-nums}
img{max-width:100%;border:1px solid #d0d7de} code{background:#f6f8fa;padding:1px 4px;border-radius:4px}
pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:360px} a{color:#0969da}
"""

# the figures an SRE reads first, in order, with their units
FIGURES = (("ok", "acknowledged sends", ""), ("failed", "failed (not stored)", ""),
           ("unknown", "outcome unknown", ""), ("acks_per_s", "acks per second", ""),
           ("time_to_new_leader_s_max", "longest time to a new leader", "s"),
           ("longest_ack_gap_s", "longest gap between acks", "s"),
           ("heal_s_max", "longest heal (undoing a fault: a restart takes seconds)", "s"),
           ("recovery_s_max", "longest recovery (healed to healthy)", "s"),
           ("catch_up_s", "every replica caught up, after the drain", "s"),
           ("latency_ms_p50", "latency p50", "ms"), ("latency_ms_p99", "latency p99", "ms"),
           ("leader_changes", "leader changes", ""), ("final_verdict", "verdict after the drill", ""))
SAFETY = ("lost", "wrong_offset", "duplicated", "unexpected", "reordered", "divergent")


def e(x) -> str:
    return escape("" if x is None else str(x))


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}</body></html>")


def pill(ok: bool, yes: str = "OK", no: str = "FAILED") -> str:
    return f"<span class='pill {'ok' if ok else 'bad'}'>{e(yes if ok else no)}</span>"


def table(header: list[str], rows: list[list], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td class='n'>{c}</td>" if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def drill_section(rep: dict, plot_url: str | None) -> str:
    """One drill's report: what an SRE reads the next morning."""
    f, counts = rep.get("figures") or {}, rep.get("counts") or {}
    out = [f"<h2>{e(rep.get('nemesis'))} on {e(rep.get('cluster'))}/{e(rep.get('group'))} "
           f"{pill(bool(rep.get('ok')), 'no safety violation', 'SAFETY VIOLATION')}</h2>",
           f"<div class='sub'>{e(rep.get('mode'))} group, provider {e(rep.get('provider'))}, "
           f"{e(rep.get('duration_s'))} s at {e(rep.get('rate'))} sends/s, faults of {e(rep.get('fault_s'))} s; "
           f"drill {e(rep.get('run_id'))}; replay with <code>tidelog drill ... --seed {e(rep.get('seed'))}</code></div>"]
    out.append(table(["figure", "value"], [[e(label), e(f.get(k)) + (f" {unit}" if unit and f.get(k) is not None else "")]
                                           for k, label, unit in FIGURES if k in f], numeric={1}))
    out.append("<h2>Anomalies</h2>")
    out.append(table(["check", "count"], [[e(k), (f"<span class='bad'>{e(counts.get(k, 0))}</span>"
                                                 if counts.get(k) else "0")] for k in SAFETY], numeric={1}))
    for kind, examples in (rep.get("anomalies") or {}).items():
        if examples:
            out.append(f"<div class='bad'>{e(kind)}: {len(examples)} example(s)</div><pre>"
                       + e("\n".join(json.dumps(x, default=str) for x in examples[:10])) + "</pre>")
    for p in rep.get("drain_problems") or []:
        out.append(f"<div class='bad'>drain: {e(p)}</div>")
    out.append("<h2>Fault timeline</h2>")
    out.append(table(["at (s)", "fault", "node", "what", "leader before", "new leader after (s)", "heal began (s)",
                      "healed at (s)", "healthy at (s)", "verdict after"],
                     [[e(x.get("at_s")), e(x.get("kind")), e(x.get("node")), e(x.get("detail")),
                       e(x.get("leader_before")), e(x.get("time_to_new_leader_s")), e(x.get("heal_began_s")),
                       e(x.get("healed_at_s")), e(x.get("healthy_at_s")), e(x.get("verdict_after"))]
                      for x in rep.get("faults") or []],
                     numeric={0, 5, 6, 7, 8}))
    changes = rep.get("leader_changes") or []
    if changes:
        out.append("<div class='sub'>leaders: " + " → ".join(
            f"{e(who or 'none')} at {e(t)} s" for t, who in changes) + "</div>")
    if plot_url:
        out.append(f"<h2>Acks and latency</h2><img alt='drill plot' src='{e(plot_url)}'>")
    return "\n".join(out)


def reconcile_section(result: dict, validation: dict | None, docs: list[tuple[str, str]]) -> str:
    """The nightly reconcile: each cluster's verdict, the GX result and its Data Docs pages."""
    out = [f"<h2>Reconcile of {e(result.get('run_date'))} "
           f"{pill(result.get('verdict') == 'clean', 'clean', str(result.get('verdict')))}</h2>"]
    rows = [[e(c.get("cluster")), e(c.get("verdict")), e(c.get("entries")),
             e(", ".join(f"{k} {v}" for k, v in sorted((c.get("statuses") or {}).items()))),
             e(c.get("divergence_rows"))] for c in result.get("clusters") or []]
    out.append(table(["cluster", "verdict", "entries", "statuses", "divergence rows"], rows, numeric={2, 4}))
    if validation is not None:
        out.append(f"<h2>Great Expectations {pill(bool(validation.get('success')), 'passed', 'failed')}</h2>")
    else:
        out.append("<h2>Great Expectations <span class='bad'>no passing checkpoint in this run</span></h2>"
                   "<div class='sub'>the gx_checkpoint task's log lists every failed expectation</div>")
    if docs:
        out.append("<ul>" + "".join(f"<li><a href='{e(url)}'>{e(name)}</a></li>" for name, url in docs) + "</ul>")
    q = f"SELECT * FROM tidelog.replica_summary WHERE run_date = '{result.get('run_date')}'"
    out.append(f"<div class='sub'>query: <code>tidelog sql \"{e(q)}\"</code></div>")
    return "\n".join(out)


def summaries_section(summaries: dict[str, object]) -> str:
    """What each task of any other run returned."""
    if not summaries:
        return "<div class='sub'>no task of this run has returned a summary yet</div>"
    return "\n".join(f"<h2>{e(task)}</h2><pre>{e(json.dumps(v, indent=1, default=str))}</pre>"
                     for task, v in summaries.items())


def run_page(dag_id: str, run_id: str, state: str | None, sections: list[str]) -> str:
    head = (f"<h1>{e(dag_id)}</h1><div class='sub'>run {e(run_id)}"
            + (f" — {e(state)}" if state else "") + "</div>")
    return page(f"{dag_id} {run_id}", head + "\n".join(sections))


def run_url(prefix: str, dag_id: str, run_id: str) -> str:
    return f"{prefix}/runs/{quote(dag_id, safe='')}/{quote(run_id, safe='')}"


def index_page(prefix: str, runs: list[dict], docs_url: str | None) -> str:
    """Recent drill and reconcile runs, each linked to its report; the Data Docs."""
    rows = [[e(r["dag_id"]), f"<a href='{e(run_url(prefix, r['dag_id'], r['run_id']))}'>{e(r['run_id'])}</a>",
             e(r.get("state")), e(r.get("start"))] for r in runs]
    docs = (f"<p><a href='{e(docs_url)}'>Great Expectations Data Docs</a> (every validation of the reconciled "
            f"tables)</p>") if docs_url else "<p>No Data Docs yet: run tidelog_reconcile_nightly.</p>"
    return page("Tidelog reports", "<h1>Tidelog reports</h1>" + docs
                + "<h2>Recent runs</h2>" + (table(["DAG", "run", "state", "started"], rows) if rows
                                            else "<div class='sub'>no drill or reconcile run yet</div>"))
