"""The Raft core's rules, case by case (the simulation covers their combinations)."""

import pytest

from replication.raft import messages as m
from replication.raft.acks import PendingAcks
from replication.raft.progress import State, after_compare
from replication.raft.quorum import majority, quorum_index

from .raft_harness import Group

# --- DLedger's COMPARE decision -------------------------------------------------------------


@pytest.mark.parametrize("case, args, want", [
    ("same end", (10, 0, 10, True, 0, 10), (State.APPEND, 10)),
    ("follower longer past the match", (10, 0, 10, True, 0, 15), (State.TRUNCATE, 10)),
    ("follower far behind the leader's begin", (10, 5, 10, False, 0, 3), (State.TRUNCATE, 5)),
    ("follower starts after the leader's end", (10, 0, 10, False, 20, 30), (State.TRUNCATE, 0)),
    ("compare point before the follower's begin", (4, 0, 10, False, 5, 8), (State.TRUNCATE, 0)),
    ("follower shorter: ask about its end", (10, 0, 10, False, 0, 6), (State.COMPARE, 6)),
    ("mismatch inside both: step back", (8, 0, 10, False, 0, 9), (State.COMPARE, 7)),
    ("stepped back below the leader's begin", (5, 5, 10, False, 0, 9), (State.TRUNCATE, 5)),
    ("empty follower", (3, 0, 3, False, 0, -1), (State.TRUNCATE, 0)),
])
def test_after_compare(case, args, want):
    assert after_compare(*args) == want, case


def test_quorum_math():
    assert [majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert quorum_index([9, 7, 3], 3) == 7
    assert quorum_index([9, 7, -1, -1, -1], 5) == -1
    assert quorum_index([9, 7, 3, 8, 1], 5) == 7


def test_pending_acks_complete_in_order_and_fail_by_term_or_time():
    a = PendingAcks()
    for i, tok in ((3, "x"), (5, "y"), (9, "z")):
        a.add(i, 2, 100 + i, tok)
    assert a.committed(6, 2) == ["x", "y"] and a.committed(6, 2) == []
    assert a.expired(108) == [] and a.expired(109) == ["z"]
    a.add(11, 2, 200, "p")
    a.add(12, 3, 200, "q")
    assert a.term_changed(3) == ["p"] and a.term_changed(None) == ["q"] and len(a) == 0
    with pytest.raises(ValueError):
        a.add(5, 3, 1, "late")
        a.add(4, 3, 1, "earlier index")


# --- scenarios ---------------------------------------------------------------------------


def write(g, leader, n, tag="w"):
    for k in range(n):
        g.append(leader, b"%s%d" % (tag.encode(), k))
    g.deliver()


def follower_of(g, leader):
    return next(i for i in g.ids if i != leader)


def replicated(entries: int):
    """A 3-node group with a leader and `entries` entries everywhere: (group, leader, a follower)."""
    g = Group(3)
    lead = g.until_leader()
    write(g, lead, entries)
    g.tick(5)
    return g, lead, follower_of(g, lead)


def test_elects_one_leader_and_replicates():
    g = Group(3)
    lead = g.until_leader()
    write(g, lead, 5)
    g.tick(5)
    assert all(g.datas(i) == g.datas(lead) for i in g.ids)
    assert all(g.nodes[i].commit_index == g.logs[lead].last_index() for i in g.ids)


def test_deposed_leaders_longer_divergent_suffix_is_truncated():
    g = Group(3)
    old = g.until_leader()
    write(g, old, 3, "ok")
    g.tick(5)
    committed = g.datas(old)
    g.isolate(old)  # its next writes reach nobody: uncommitted
    write(g, old, 6, "lost")
    assert g.nodes[old].commit_index == len(committed) - 1
    g.tick(60)
    new = g.leader()
    assert new not in (None, old)
    write(g, new, 2, "new")
    g.heal()
    g.tick(60)
    assert g.datas(old) == g.datas(new) and b"lost0" not in g.datas(old)
    assert g.datas(new)[:len(committed)] == committed
    assert g.pushes_to(old, m.PushType.TRUNCATE), "the match point was found and the rest cut"


def test_follower_far_behind_a_leader_that_deleted_old_entries_is_reset():
    g, lead, lag = replicated(3)
    g.crash(lag)
    write(g, lead, 10, "more")
    g.tick(5)
    other = next(i for i in g.ids if i not in (lead, lag))
    for i in (lead, other):  # retention deleted the head of the log on both live nodes
        log = g.logs[i]
        log.items, log.begin = log.items[8:], log.begin + 8
    g.restart(lag)
    g.tick(40)
    assert g.logs[lag].begin == g.logs[lead].begin and g.datas(lag) == g.datas(lead)


def test_disjoint_logs_start_over_from_the_leaders_begin():
    g, lead, x = replicated(4)
    g.crash(x)
    g.logs[x].reset_to(500)  # a follower whose log lies entirely after the leader's
    g.logs[x].append([(500, 0, b"stray")])
    g.logs[x].flush()
    g.restart(x)
    g.tick(40)
    assert g.datas(x) == g.datas(lead) and g.logs[x].begin == g.logs[lead].begin


def test_commit_needs_an_entry_of_the_current_term():
    """Raft's rule: an older term's entry held by a majority still does not commit until the
    new leader has an entry of its own term there too."""
    g = Group(3)
    old = g.until_leader()
    write(g, old, 2)
    g.tick(5)
    a, b = (i for i in g.ids if i != old)
    g.isolate(b)
    g.append(old, b"tail0")  # its push reaches `a`: held by a majority (old, a) ...
    for src, to, msg in [q for q in g.queue if q[1] == a]:
        g.nodes[a].step(msg)
        g.process(a)
    g.queue.clear()
    g.crash(old)  # ... but the old leader dies before hearing so: not committed
    committed_before = g.nodes[a].commit_index
    tail_index = g.logs[a].last_index()
    assert g.datas(a)[-1] == b"tail0" and committed_before < tail_index
    g.heal()
    g.hold_noop = True
    for _ in range(200):
        g.tick()
        if g.nodes[a].is_leader:
            break
    assert g.nodes[a].is_leader  # only `a` can win: it holds the longest log
    g.tick(20)
    assert g.datas(b)[-1] == b"tail0"  # replicated to everyone up...
    assert g.nodes[a].commit_index == committed_before  # ...and still not committed
    g.hold_noop = False
    g.append(a, b"noop")
    g.tick(10)
    assert g.nodes[a].commit_index == g.logs[a].last_index() == tail_index + 1


def test_partitioned_node_does_not_disrupt_when_it_returns():
    g = Group(3)
    lead = g.until_leader()
    term = g.nodes[lead].term
    x = follower_of(g, lead)
    g.isolate(x)
    g.tick(200)  # x times out again and again, but only pre-votes: its term stays
    assert g.nodes[x].term == term
    g.heal()
    g.tick(20)
    assert g.leader() == lead and g.nodes[lead].term == term


def test_without_pre_vote_the_returning_node_would_disrupt():
    g = Group(3, pre_vote=False, check_quorum=False)
    lead = g.until_leader()
    term = g.nodes[lead].term
    x = follower_of(g, lead)
    g.isolate(x)
    g.tick(200)
    assert g.nodes[x].term > term + 3  # the counterfactual the pre-vote prevents


def test_candidate_with_a_shorter_log_cannot_win():
    g, lead, behind = replicated(3)
    g.isolate(behind)
    write(g, lead, 3, "more")
    g.tick(5)
    g.crash(lead)
    g.heal()
    g.tick(100)
    assert g.leader() not in (None, behind)


def test_out_of_order_appends_wait_duplicates_are_repeated_and_gaps_time_out():
    g = Group(3, push_timeout_ticks=15)
    lead = g.until_leader()
    g.tick(5)
    f = follower_of(g, lead)
    node = g.nodes[f]
    term, end = node.term, g.logs[f].last_index()
    e = lambda i: (i, term, b"e%d" % i)  # noqa: E731
    ahead = m.Push(lead, term, m.PushType.APPEND, -1, (e(end + 2),), seq=10_000)
    node.step(ahead)
    assert node.ready().messages == []  # waits for end + 1
    node.step(ahead)
    (to, resp), = node.ready().messages
    assert resp.code == m.PushCode.REPEATED_PUSH
    for _ in range(16):
        node.tick()
    codes = [msg.code for _, msg in node.ready().messages if isinstance(msg, m.PushResponse)]
    assert codes == [m.PushCode.INCONSISTENT_STATE]


def test_follower_applies_commit_only_up_to_what_matches():
    g, lead, f = replicated(3)
    node = g.nodes[f]
    node.step(m.Heartbeat(lead, node.term, 10_000))
    node.ready()
    assert node.commit_index == g.logs[f].last_index()


def test_leadership_transfer_and_its_refusals():
    g, lead, target = replicated(3)
    assert "not a follower" in g.nodes[lead].transfer_leader("zz")
    assert g.nodes[lead].transfer_leader(lead) is None     # to itself: already done, writes go on
    assert g.nodes[lead].accepting_writes and g.leader() == lead
    assert g.nodes[lead].transfer_leader(target) is None
    assert not g.nodes[lead].accepting_writes  # writes stop during the hand-over
    # to itself while handing over: not "it leads already" (it will not for long)
    assert f"transfer to {target} is under way" in g.nodes[lead].transfer_leader(lead)
    g.process(lead)
    g.tick(30)
    assert g.leader() == target
    # a lagging target is refused
    g2 = Group(3, leadership_transfer_lag_entries_max=2)
    lead2 = g2.until_leader()
    lagger = follower_of(g2, lead2)
    g2.isolate(lagger)
    write(g2, lead2, 5)
    assert "lags" in g2.nodes[lead2].transfer_leader(lagger)


def test_transfer_that_does_not_happen_in_time_lets_the_leader_resume():
    g = Group(3, transfer_timeout_ticks=15)
    lead = g.until_leader()
    target = follower_of(g, lead)
    g.isolate(target)
    assert g.nodes[lead].transfer_leader(target) is None
    g.tick(16)
    assert g.leader() == lead and g.nodes[lead].accepting_writes


def test_preferred_leader_takes_leadership_back():
    g = Group(3, preferred_leader="c", transfer_timeout_ticks=20)
    g.until_leader()
    g.tick(150)
    assert g.leader() == "c"


def test_check_quorum_makes_a_cut_off_leader_step_down():
    g = Group(3)
    lead = g.until_leader()
    g.isolate(lead)
    g.tick(25)
    assert not g.nodes[lead].is_leader


def test_late_copies_of_probes_and_of_voided_appends_are_ignored():
    g, lead, f = replicated(3)
    node, log = g.nodes[f], g.logs[f]
    term, end = node.term, log.last_index()
    seq0 = max(p.seq for p in g.pushes_to(f, m.PushType.APPEND))
    late_truncate = m.Push(lead, term, m.PushType.TRUNCATE, -1, ((1, term, b"x"),), seq=1)
    node.step(late_truncate)
    r = node.ready()
    assert r.truncate_from is None and r.messages == [] and log.last_index() == end
    node.step(m.Push(lead, term, m.PushType.COMPARE, -1, ((end, term, b""),), seq=seq0 + 10))
    node.ready()
    voided = m.Push(lead, term, m.PushType.APPEND, -1, ((end + 1, term, b"y"),), seq=seq0 + 5)
    node.step(voided)  # sent before the probe above: the leader no longer counts on it
    assert node.ready().append == []


def test_push_quota_caps_the_rate_to_a_follower_far_behind():
    """DLedger's quota: above the throttle point of lag, at most quota bytes per second."""
    g = Group(3, ticks_per_second=10, peer_push_quota_bytes_per_s=1000,
              peer_push_throttle_point_bytes=2000, max_pending_entries=10_000,
              push_batch_entries_max=10_000)
    lead = g.until_leader()
    lagger = follower_of(g, lead)
    g.isolate(lagger)
    for k in range(60):
        g.append(lead, b"x" * 100)  # 6000 bytes the lagger lacks
    g.deliver()
    g.heal()
    g.sent.clear()
    g.tick(10)  # one second
    pushed = sum(len(e[2]) for _, to, msg in g.sent if to == lagger and isinstance(msg, m.Push)
                 and msg.type == m.PushType.APPEND for e in msg.entries)
    assert 0 < pushed <= 1000 + 100  # the quota (one entry may straddle it)
    g.tick(80)
    assert g.datas(lagger) == g.datas(lead)  # it does catch up, at the capped rate


def test_a_commit_index_alone_waits_for_the_tick_and_appends_carry_it():
    """At W=1 a COMMIT push per follower after every commit doubled the round trip's
    messages; the commit index rides on the next append, or goes out from the next tick."""
    g, lead, f = replicated(3)
    g.sent.clear()
    g.append(lead, b"one")
    g.deliver()
    last = g.logs[lead].last_index()
    assert g.nodes[lead].commit_index == last  # committed on the leader...
    assert g.pushes_to(f, m.PushType.COMMIT) == []  # ...and nobody told yet, by itself
    assert g.nodes[f].commit_index < last
    g.append(lead, b"two")  # the next append carries it
    g.deliver()
    appends = g.pushes_to(f, m.PushType.APPEND)
    assert appends[-1].commit_index >= last and g.nodes[f].commit_index >= last
    g.tick()  # and with nothing more to append, the tick says it
    assert g.pushes_to(f, m.PushType.COMMIT)[-1].commit_index == g.logs[lead].last_index()
    assert g.nodes[f].commit_index == g.logs[lead].last_index()


def test_a_truncate_below_which_the_follower_lost_its_tail_is_refused_and_only_a_reset_restarts():
    """A TRUNCATE cuts after a point the follower said it holds. If a power cut has since
    taken that point (and more), the follower must not restart its log there (dropping the
    entries it still holds before it): it says INCONSISTENT_STATE and the leader compares
    again. A RESET (the leader's first entry: it holds nothing before) does restart it."""
    g, lead, f = replicated(6)
    node, log = g.nodes[f], g.logs[f]
    term, end = node.term, log.last_index()
    seq = max(p.seq for p in g.pushes_to(f, m.PushType.APPEND)) + 1
    gone = end + 3
    node.step(m.Push(lead, term, m.PushType.TRUNCATE, -1, ((gone, term, b"x"),), seq=seq))
    r = node.ready()
    assert r.reset_to is None and r.truncate_from is None and r.append == []
    (_, answer), = r.messages
    assert answer.code == m.PushCode.INCONSISTENT_STATE and answer.end_index == end
    node.step(m.Push(lead, term, m.PushType.TRUNCATE, -1, ((end + 1, term, b"y"),), seq=seq + 1))
    r = node.ready()  # only the point itself is gone: what is left still matches, extend it
    assert r.reset_to is None and r.append == [(end + 1, term, b"y")]
    assert r.messages[0][1].code == m.PushCode.SUCCESS
    node.step(m.Push(lead, term, m.PushType.RESET, -1, ((gone, term, b"x"),), seq=seq + 2))
    r = node.ready()
    assert r.reset_to == gone and r.append == [(gone, term, b"x")]
    assert r.messages[0][1].code == m.PushCode.SUCCESS


def test_an_unanswered_truncate_goes_back_to_compare_instead_of_being_resent():
    """DLedger: a truncate that fails goes back to COMPARE. The follower may have lost its
    tail since it answered the COMPARE; a TRUNCATE resent blind would find a log that no
    longer holds its point. The leader compares again, then cuts, and the logs converge."""
    g = Group(3)
    old = g.until_leader()
    write(g, old, 3, "ok")
    g.tick(5)
    g.isolate(old)
    write(g, old, 6, "lost")
    g.tick(60)
    new = g.leader()
    assert new not in (None, old)
    write(g, new, 2, "new")
    g.drop_if = lambda src, to, msg: to == old and isinstance(msg, m.Push) and msg.type == m.PushType.TRUNCATE
    g.heal()
    g.tick(3 * g.cfg["push_timeout_ticks"])
    probes = [msg.type for _, to, msg in g.sent if to == old and isinstance(msg, m.Push)
              and msg.type in m.PROBES]
    first = probes.index(m.PushType.TRUNCATE)
    assert m.PushType.COMPARE in probes[first:], probes
    assert probes[first:].count(m.PushType.TRUNCATE) >= 2, probes  # it did try again
    g.drop_if = None
    g.tick(60)
    assert g.datas(old) == g.datas(new) and b"lost0" not in g.datas(old)


def test_a_new_link_to_a_follower_resends_at_once_not_after_the_push_timeout():
    """A new leader's first COMPARE often goes out before its link to a follower is connected
    (the driver drops it and connects). When the connection opens, the leader probes again at
    once (link_up); without it the follower waits out the push timeout (1 s by default), since
    a heartbeat's answer does not move a follower out of COMPARE."""
    g = Group(3, push_timeout_ticks=50)
    old = g.until_leader()
    write(g, old, 3)
    g.tick(3)
    g.drop_if = lambda src, to, msg: isinstance(msg, m.Push) and msg.type == m.PushType.COMPARE
    g.crash(old)
    g.tick(40)
    lead = g.leader()
    assert lead not in (None, old)
    f = next(i for i in g.ids if i not in (lead, old))
    p = g.nodes[lead].leading.progress[f]
    assert p.state == State.COMPARE and p.probe_seq, "its probe went out on a link that was not there"
    g.drop_if = None
    g.tick(5)
    assert p.state == State.COMPARE, "a heartbeat's answer does not end the wait"
    g.nodes[lead].link_up(f)
    g.process(lead)
    g.deliver()
    g.tick(3)  # far below the push timeout
    assert p.state == State.APPEND and g.datas(f) == g.datas(lead)
