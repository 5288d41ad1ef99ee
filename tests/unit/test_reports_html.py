"""The report pages the Airflow plugin serves: what a drill report shows, and that every value
from a report (node names, anomaly examples, run ids) is escaped."""

from __future__ import annotations

from ops import reports_html as h


def report(**over) -> dict:
    rep = {"run_id": "20261123-225232-2130", "cluster": "prod", "group": "g0", "mode": "raft", "provider": "local",
           "nemesis": "kill-leader", "seed": 767952130, "duration_s": 10.0, "rate": 100.0, "fault_s": 2.5, "ok": True,
           "figures": {"ok": 1000, "failed": 0, "unknown": 0, "acks_per_s": 100.1, "time_to_new_leader_s_max": 1.681,
                       "longest_ack_gap_s": 1.598, "recovery_s_max": 0.468, "latency_ms_p99": 1531.29,
                       "final_verdict": "healthy"},
           "counts": {"lost": 0, "duplicated": 0}, "anomalies": {},
           "faults": [{"kind": "kill-leader", "node": "h1", "detail": "kill -9 pid 7496", "at_s": 1.263,
                       "leader_before": "h1", "healed_at_s": 4.36, "healthy_at_s": 4.828,
                       "verdict_after": "healthy", "time_to_new_leader_s": 0.791}],
           "leader_changes": [[0.0, "h1"], [1.419, None], [2.054, "h3"]], "drain_problems": []}
    rep.update(over)
    return rep


def test_a_green_drill_shows_figures_faults_leaders_and_the_plot():
    s = h.drill_section(report(), "/tidelog/runs/d/r/drills/x/drill.png")
    assert "no safety violation" in s and "SAFETY VIOLATION" not in s
    assert "longest time to a new leader</td><td class='n'>1.681 s" in s
    assert "kill -9 pid 7496" in s and "<td class='n'>0.791</td>" in s       # the fault timeline
    assert "h1 at 0.0 s → none at 1.419 s → h3 at 2.054 s" in s               # leader changes
    assert "--seed 767952130" in s and "src='/tidelog/runs/d/r/drills/x/drill.png'" in s


def test_a_red_drill_names_its_anomalies_with_examples():
    s = h.drill_section(report(ok=False, counts={"lost": 2}, anomalies={"lost": [{"msg_id": "a1"}, {"msg_id": "a2"}]}),
                        None)
    assert "SAFETY VIOLATION" in s and "<span class='bad'>2</span>" in s
    assert "lost: 2 example(s)" in s and "a2" in s and "<img" not in s


def test_values_from_reports_and_urls_are_escaped():
    s = h.drill_section(report(cluster="<script>x</script>", faults=[{"node": "h1'><img src=x>"}]), None)
    assert "<script>" not in s and "&lt;script&gt;" in s and "<img src=x>" not in s
    page = h.index_page("/tidelog", [{"dag_id": "d", "run_id": "manual__<b>'", "state": "success"}], None)
    assert "manual__<b>" not in page and "/tidelog/runs/d/manual__%3Cb%3E%27" in page


def test_a_reconcile_run_links_its_data_docs_pages():
    s = h.reconcile_section({"run_date": "2026-11-23", "verdict": "clean",
                             "clusters": [{"cluster": "prod", "verdict": "clean", "entries": 42,
                                           "statuses": {"consistent": 42}, "divergence_rows": 0}]},
                            {"success": True}, [("reconciled_log · prod", "/tidelog/data-docs/v.html")])
    assert "clean" in s and "consistent 42" in s and "passed" in s
    assert "<a href='/tidelog/data-docs/v.html'>reconciled_log · prod</a>" in s
    red = h.reconcile_section({"run_date": "2026-11-23", "verdict": "findings", "clusters": []}, None, [])
    assert "no passing checkpoint" in red
