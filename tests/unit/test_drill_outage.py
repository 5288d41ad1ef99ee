"""The name-server outage figures and liveness verdict of a drill (ops/drill/outage.py), on
crafted step timelines and histories: the window every name server was down, what was
acknowledged in it, and when a stopped workload or a new leader nobody found is a problem."""

from ops.drill import outage
from ops.drill.checker import Op, check

NS = ["ns-n0", "ns-n1"]


def steps(kills=(("ns-n0", 10.0, 10.1), ("ns-n1", 10.1, 10.3)), leader=None, back=((14.0, 14.6), (14.6, 15.2))):
    out = [{"at_s": a, "done_s": d, "step": "kill -9", "node": n} for n, a, d in kills]
    if leader:
        out.append({"at_s": 10.6, "done_s": 10.7, "step": "kill -9", "node": leader})
        out.append({"at_s": 14.0, "done_s": 14.4, "step": "heal", "node": None, "detail": f"restart {leader}"})
        back = tuple((a + 0.4, d + 0.4) for a, d in back)
    for (a, d), n in zip(back, reversed(NS)):  # heal: the latest kill first
        out.append({"at_s": a, "done_s": d, "step": "heal", "node": None, "detail": f"restart {n}"})
    return out


def acks(times, group="g0", t0_before=0.05):
    return [Op(i, t0=t - t0_before, t1=t, outcome="ok", queue=0, offset=i, group=group) for i, t in enumerate(times)]


def test_the_window_ends_when_the_name_servers_restarted_together_serve():
    s = steps(back=())
    s.append({"at_s": 14.0, "done_s": 15.5, "step": "heal", "node": None, "detail": "restart name servers"})
    assert outage.window(s, NS) == (10.3, 15.5)


def test_the_window_runs_from_the_last_kill_to_the_first_name_server_back():
    assert outage.window(steps(), NS) == (10.3, 14.6)
    assert outage.window(steps(leader="g1-n0"), NS) == (10.3, 15.0)  # the leader restarts first
    assert outage.window(steps()[:3], NS) == (10.3, 14.6)  # one name server back is enough
    one_only = [s for s in steps() if s.get("node") != "ns-n1"]
    assert outage.window(one_only, NS) is None  # never every name server down
    failed = steps()
    failed[1]["error"] = "RuntimeError: no such process"
    assert outage.window(failed, NS) is None
    assert outage.window(steps(back=()), NS) == (10.3, None)  # none came back (the drill uses its heal time)


def test_sends_that_went_on_are_fine_and_a_stop_is_a_liveness_problem():
    ops = acks([9.0 + 0.1 * i for i in range(70)])  # 9.0 .. 15.9, every 0.1 s
    fig = outage.figures(ops, 10.3, 14.6)
    assert fig["acks"] == 43 and fig["acks_by_group"] == {"g0": 43} and fig["longest_ack_gap_s"] <= 0.11
    assert fig["namesrv_down_s"] == 4.3 and outage.problems("kill-namesrv", fig) == []
    stopped = [o for o in ops if not 11.0 < o.t1 < 14.0]  # 3 s without an acknowledgement
    fig = outage.figures(stopped, 10.3, 14.6)
    assert fig["longest_ack_gap_s"] > outage.KNOWN_ROUTES_GAP_MAX_S
    (p,) = outage.problems("kill-namesrv", fig)
    assert "no acknowledgement for" in p and "every name server was down" in p
    none = outage.figures([o for o in ops if not 10.3 <= o.t1 <= 14.6], 10.3, 14.6)
    assert none["acks"] == 0 and none["longest_ack_gap_s"] == 4.3
    assert "no send was acknowledged" in outage.problems("kill-namesrv", none)[0]


def test_kill_namesrv_and_leader_wants_the_new_leader_found_without_the_name_servers():
    g0 = acks([9.0 + 0.1 * i for i in range(70)], "g0")
    g1_before = acks([9.0 + 0.1 * i for i in range(17)], "g1")  # g1 acks until its leader dies at 10.7
    g1_after = acks([12.5 + 0.1 * i for i in range(10)], "g1")  # ... and again from 12.5 (new leader 12.0)
    for i, o in enumerate(g1_before + g1_after):
        o.id = 1000 + i
    fig = outage.figures(g0 + g1_before + g1_after, 10.3, 15.0, "g1", 12.0)
    assert fig["target_acks_after_new_leader"] == 10 and fig["acks_by_group"]["g1"] == 14
    assert outage.problems("kill-namesrv-and-leader", fig) == []
    # the clients never reached g1's new leader while the name servers were away: a finding
    fig = outage.figures(g0 + g1_before, 10.3, 15.0, "g1", 12.0)
    (p,) = outage.problems("kill-namesrv-and-leader", fig)
    assert "did not find the new leader" in p and "g1" in p
    # a leader elected just before the name servers came back: too soon to tell, no problem
    fig = outage.figures(g0 + g1_before, 10.3, 15.0, "g1", 14.5)
    assert outage.problems("kill-namesrv-and-leader", fig) == []
    # no new leader while they were down: noted, not a failure
    fig = outage.figures(g0 + g1_before, 10.3, 15.0, "g1", None)
    assert "not tested" in fig["note"] and outage.problems("kill-namesrv-and-leader", fig) == []


def test_the_checker_tells_groups_apart():
    """Across groups the same (queue, offset) is two places: each op is checked where its group
    acknowledged it, and a message read in another group than the one that acked it is misplaced."""
    ops = acks([1.0, 2.0], "g0") + acks([1.5, 2.5], "g1")
    for i, o in enumerate(ops):
        o.id, o.offset = i, i % 2  # g0 q0 offsets 0, 1; g1 q0 offsets 0, 1
    from ops.drill.checker import Read
    reads = [Read(o.id, o.queue, o.offset, o.group) for o in ops]
    r = check(ops, reads)
    assert r.ok and r.figures["ok_by_group"] == {"g0": 2, "g1": 2}, r.anomalies
    assert r.figures["longest_ack_gap_s_by_group"] == {"g0": 1.0, "g1": 1.0}
    swapped = [Read(ops[2].id, 0, 0, "g0"), Read(ops[0].id, 0, 0, "g1")] + reads[1:2] + reads[3:]
    r = check(ops, swapped)
    assert r.counts["wrong_offset"] == 2 and r.anomalies["wrong_offset"][0]["group"] == "g0"
