"""The master-slave node core (replication/master_slave/core.py): decisions and the order of
the effects they return."""

import pytest

from replication.master_slave import roles
from replication.master_slave.core import (FENCES_MAX, Lead, NodeCore, Refused, Reset, RoleChanged, SaveEpochs,
                                           SaveRole, StartLink, StepDown, StopLink, Truncate)
from replication.master_slave.epochs import EpochList
from replication.master_slave.master import MasterConfig
from replication.master_slave.roles import MASTER, SLAVE, View
from replication.master_slave.state import RoleState

IDS = ("n0", "n1", "n2")


def core(me="n0", **cfg) -> NodeCore:
    return NodeCore(me, IDS, MasterConfig(**cfg))


def kinds(effects):
    return [type(e) for e in effects]


def slave_view(node, epoch=1, seen=1, master="n0", end=100):
    return View(node, SLAVE, epoch, seen, master, end)


def test_a_slave_starts_following_its_master_and_saves_its_role():
    c = core("n1")
    effects = c.start(RoleState(SLAVE, "n0", 3), EpochList([(1, 0), (2, 50)]))
    assert kinds(effects) == [StopLink, SaveRole, StartLink, RoleChanged]
    assert effects[1].state == RoleState(SLAVE, "n0", 3)
    assert effects[2].master == "n0"
    assert (c.role, c.master, c.epoch_seen, c.restart_pending) == (SLAVE, "n0", 3, None)


def test_a_restarting_master_waits_without_a_quorum_and_keeps_its_role_on_disk():
    c = core()
    assert c.start(RoleState(MASTER, "n0", 2), EpochList([(2, 0)])) == []
    assert c.restart_pending == "not decided yet"
    d = c.restart_step([], 10)  # nobody answers
    assert d.what == "wait" and d.first
    assert kinds(d.effects) == [StopLink, StartLink, RoleChanged]  # no SaveRole: still master on disk
    assert d.effects[1].master is None
    again = c.restart_step([], 10)
    assert again.what == "wait" and not again.first and again.effects == []


def test_a_restarting_master_records_then_opens_an_epoch():
    c = core()
    c.start(RoleState(MASTER, "n0", 2), EpochList([(2, 0)]))
    views = [slave_view("n1", 2, 2, "n0", 10)]
    d = c.restart_step(views, 10)
    assert (d.what, d.arg) == ("record", 3)
    short = c.restart_recorded(3, 1, 10, 10, 0, 5)
    assert short.what == "wait" and "only 1 of the 2" in short.arg
    d = c.restart_recorded(3, 2, 10, 10, 0, 5)
    assert d.what == "open"
    assert kinds(d.effects) == [StopLink, SaveEpochs, SaveRole, Lead, RoleChanged]
    assert d.effects[1].epochs == ((2, 0), (3, 10))  # epochs on disk before the role says master
    assert d.effects[2].state == RoleState(MASTER, "n0", 3)
    assert (c.role, c.restart_pending, c.mcore.written) == (MASTER, None, 10)


def test_a_restarting_master_follows_a_newer_one():
    c = core()
    c.start(RoleState(MASTER, "n0", 2), EpochList([(2, 0)]))
    d = c.restart_step([View("n1", MASTER, 3, 3, "n1", 20)], 10)
    assert (d.what, d.arg) == ("follow", "n1")
    assert SaveRole in kinds(d.effects) and c.restart_pending is None and c.master == "n1"


def test_the_rules_are_called_through_the_roles_module(monkeypatch):
    monkeypatch.setattr(roles, "restart_decision", lambda me, views, n: ("open", 7))
    monkeypatch.setattr(roles, "restart_quorum", lambda n: 1)
    c = core()
    c.start(RoleState(MASTER, "n0", 2), EpochList())
    d = c.restart_step([], 0)
    assert (d.what, d.arg) == ("record", 7)
    assert c.restart_recorded(7, 1, 0, 0, 0, 0).what == "open"


def test_a_master_steps_down_for_a_newer_master_failing_its_waiting_sends():
    c = core()
    c.lead(1, 0, 0, 0, 0)
    c.mcore.wait(100, 0, "token")
    target, effects = c.on_views([View("n1", MASTER, 2, 2, "n1", 50)], 10)
    assert target == "n1"
    assert kinds(effects) == [StepDown, StopLink, SaveRole, StartLink, RoleChanged]
    assert effects[0].waiting == ("token",)
    assert c.mcore is None and c.role == SLAVE


def test_follow_requests_keep_one_master_per_epoch():
    c = core("n1")
    c.start(RoleState(SLAVE, "n0", 1), EpochList([(1, 0)]))
    assert kinds(c.on_follow("n2", 2)) == [StopLink, SaveRole, StartLink, RoleChanged]
    assert kinds(c.on_follow("n2", 2)) == [SaveRole]  # the same promise again
    with pytest.raises(Refused, match="already has master n2"):
        c.on_follow("n0", 2)
    with pytest.raises(Refused, match="older than 2"):
        c.on_follow("n0", 1)
    with pytest.raises(Refused, match="cannot follow"):
        c.on_follow("n1", 3)


def test_hello_refusals():
    c = core("n1")
    c.start(RoleState(SLAVE, "n0", 1), EpochList([(1, 0)]))
    assert c.refuse_hello("x", 0).error == "'x' is not a member of this group"
    assert "fault injection" in c.refuse_hello("n2", 0, blocked=True).error
    r = c.refuse_hello("n2", 0)
    assert (r.error, r.master) == ("n1 is not the master", "n0")
    c.promoting = True
    assert c.refuse_hello("n2", 0).master is None
    c.promoting = False
    c.lead(2, 10, 10, 0, 0)
    assert c.refuse_hello("n2", 2) is None
    r = c.refuse_hello("n2", 5)
    assert r.probe and "has seen epoch 5" in r.error


def test_welcome_cuts_at_the_fork_point_and_saves_epochs_after_the_cut():
    c = core("n1")
    c.start(RoleState(SLAVE, "n0", 2), EpochList([(1, 0), (2, 50)]))
    effects = c.on_welcome("n0", 3, [[1, 0], [3, 40]], 40, 40, False)
    assert kinds(effects) == [SaveRole, Truncate, SaveEpochs]
    assert effects[0].state == RoleState(SLAVE, "n0", 3)
    assert effects[1].offset == 40 and effects[2].epochs == ((1, 0),)
    assert c.master_epochs.to_list() == [[1, 0], [3, 40]]


def test_welcome_reset_and_an_out_of_date_master():
    c = core("n1")
    c.start(RoleState(SLAVE, "n0", 4), EpochList([(4, 0)]))
    with pytest.raises(Refused, match="out of date"):
        c.on_welcome("n0", 3, [[3, 0]], 0, None, False)
    effects = c.on_welcome("n0", 5, [[5, 0]], 0, None, True)
    assert kinds(effects) == [SaveRole, Reset, SaveEpochs]
    assert effects[1].old_epochs == ((4, 0),) and effects[2].epochs == ()


def test_streamed_entries_open_epochs_where_the_master_started_them():
    c = core("n1")
    c.start(RoleState(SLAVE, "n0", 1), EpochList([(1, 0)]))
    c.on_welcome("n0", 3, [[1, 0], [3, 30]], 20, None, False)
    assert c.knows_term(1) and not c.knows_term(3)
    assert c.on_entries([(1, 20)]) == []
    effects = c.on_entries([(1, 25), (3, 32)])  # the master's epoch 3 starts at 30
    assert effects == [SaveEpochs(((1, 0), (3, 30)))]
    assert c.on_entries([(4, 40)])[0].epochs[-1] == (4, 40)  # unknown to the master's list: here


def test_promotion_problems_quorum_and_lead():
    c = core("n1", in_sync_replicas=2)
    c.start(RoleState(SLAVE, "n0", 1), EpochList([(1, 0)]))
    assert c.failover_problems([], ["n0", "n2"], 100, None) == [
        "unreachable n2 may hold acknowledged messages that no reachable node has "
        "(each send waits for 1 slave(s))"]
    c.on_master_lost("n0", 0)
    p = c.failover_problems([], ["n0", "n2"], 100, c.lag(None, 100))
    assert p == ["unreachable n2 may hold acknowledged messages that no reachable node has "
                 "(each send waits for 1 slave(s))"]
    views = [slave_view("n2", 1, 1, "n0", 100)]
    assert c.failover_problems(views, ["n0"], 100, 0) == []
    assert c.new_epoch(views, 100) == 2
    assert "only 1 of the 2" in c.promotion_shortfall(2, 1)
    assert c.promotion_shortfall(2, 2) is None
    effects = c.promoted(2, 100, 100, 90, 7)
    assert kinds(effects) == [StopLink, SaveEpochs, SaveRole, Lead, RoleChanged]
    assert (c.role, c.epoch_seen, c.promotions, c.mcore.confirm) == (MASTER, 2, 1, 90)


def test_fence_and_its_lapse():
    c = core()
    with pytest.raises(Refused, match="not the master"):
        c.fence(100, 0)
    c.lead(1, 0, 0, 0, 0)
    c.fence(100, 1000)
    assert c.fenced() and c.view(0).fenced
    c.fence(0, 1060)  # lifted by the promoter, which gave up before recording an epoch
    assert not c.fenced() and c.tick(5000)[2] is False and c.role == MASTER
    c.fence(100, 6000)
    assert c.tick(6050)[2] is False and c.fence_lapsed(6050) == []
    # lapsed: still fenced (no writes) until fence_lapsed runs (the driver, under its lock)
    assert c.tick(6100)[2] is True and c.fenced() and c.role == MASTER
    # then the switchover's outcome is unknown: the master steps down (its waiting sends are
    # answered TERM_CHANGED), keeps its role on disk, and leads again only as a restarting
    # master would
    effects = c.fence_lapsed(6200)
    assert kinds(effects) == [StepDown, StopLink, StartLink, RoleChanged], effects
    assert c.role == SLAVE and c.master is None and not c.fenced()
    assert "switchover fenced this master" in c.restart_pending
    d = c.restart_step([slave_view("n1", 1, 1, "n0", 0)], 0)  # 2 of 3 answer: a majority
    assert d.what == "record" and d.arg == 2
    c2 = core()
    c2.lead(1, 0, 0, 0, 0)
    c2.fence(100, 0)
    assert c2.tick(100)[2] is True
    c2.on_follow("n2", 2)  # the promoter's follow took the lock first: nothing left to undo
    assert c2.fence_lapsed(150) == [] and c2.master == "n2" and c2.restart_pending is None
    c3 = core()
    c3.lead(1, 0, 0, 0, 0)
    c3.fence(100, 0)
    c3.fence_lapsed(100)
    said = slave_view("n1", 1, 2, "n2", 0)  # n1 recorded n2's epoch 2
    assert c3.restart_step([said], 0).what == "wait"  # n2 may lead it, or have died before it led
    d = c3.restart_step([said, View("n2", MASTER, 2, 2, "n2", 1)], 0)
    assert (d.what, d.arg) == ("follow", "n2")


def test_each_switchover_lifts_only_its_own_fence():
    """Two switchovers fence one master (two operators, or a retry): the one that gives up
    must not let the master take writes the other, caught up only to the end it was told at
    its fence, would lead without (sim seed 284, 3 nodes, with overlapping switchovers)."""
    c = core()
    c.lead(1, 0, 0, 0, 0)
    c.fence(100, 1000, "n1:a")
    c.fence(100, 1010, "n2:b")
    c.fence(0, 1020, "n1:a")  # n1 gave up
    assert c.fenced() and c.view(0).fenced
    c.fence(0, 1030, "n1:a")  # its retry of the lift: still n2's fence
    c.fence(0, 1030)  # an older build's lift names no fence: not n2's either
    assert c.fenced()
    c.fence(0, 1040, "n2:b")
    assert not c.fenced() and c.tick(5000)[2] is False
    # the first fence to lapse lapses the master (that switchover's outcome is unknown)
    c.fence(100, 6000, "n1:c")
    c.fence(500, 6000, "n2:d")
    assert c.tick(6099)[2] is False and c.tick(6100)[2] is True
    c.fence(100, 6100, "n1:c")  # a switchover renewing its own fence moves its own lapse only
    assert c.tick(6150)[2] is False and c.tick(6200)[2] is True
    # a follow ends them all
    c.on_follow("n1", 2)
    assert not c.fences and not c.fenced()
    # bounded: an unending stream of fence ids cannot grow the master's state
    c = core()
    c.lead(1, 0, 0, 0, 0)
    for i in range(FENCES_MAX):
        c.fence(100, 7000, f"x:{i}")
    with pytest.raises(Refused, match="fenced by 16 switchovers"):
        c.fence(100, 7000, "x:one-more")
    c.fence(200, 7000, "x:0")  # renewing one it holds is not a new one


def test_following_a_master_found_by_a_probe_counts_its_epoch_as_heard():
    """(sim seed 1128, 2 nodes) a slave that followed a master of epoch 10 found by a probe,
    and was promoted before any WELCOME, opened epoch 10 again."""
    c = core("n1")
    c.start(RoleState(SLAVE, None, 9), EpochList([(9, 0)]))
    target, effects = c.on_views([View("n0", MASTER, 10, 10, "n0", 20)], 15)
    assert target == "n0" and c.epoch_seen == 10
    assert next(e for e in effects if type(e) is SaveRole).state == RoleState(SLAVE, "n0", 10)
    assert c.new_epoch([], 15) == 11


def test_a_restarting_master_whose_newer_epoch_left_no_entry_anywhere_leads_again():
    """(sim seed 1002) the others heard of an epoch this node opened and then lost: with every
    member answering and no log holding an entry of it, waiting for its master never ends."""
    me = View("n0", MASTER, 2, 3, "n0", 25)
    seen_only = [View("n1", SLAVE, 2, 3, "n0", 25), View("n2", SLAVE, 2, 3, "n0", 25)]
    assert roles.restart_decision(me, seen_only, 3) == ("open", 4)
    what, why = roles.restart_decision(me, seen_only[:1], 3)  # n2 does not answer: it may hold some
    assert what == "wait" and "heard of an epoch newer" in why
    holds = [View("n1", SLAVE, 3, 3, "n0", 30), seen_only[1]]
    assert roles.restart_decision(me, holds, 3)[0] == "wait"


def test_a_switchover_whose_new_master_dies_before_leading_leaves_promotable_slaves():
    """CI seed 3466594307 (kill-during-transfer, SYNC): n2 recorded epoch 2 on n0 (the master,
    fenced) and n1, then died before it led. Everyone followed a master that never wrote,
    and every failover was refused as "never copied from a master": the group stayed down.
    In SYNC the others prove what is here; in ASYNC the new master may have acknowledged
    alone before this node copied anything from it, so it stays "never copied" -- also when
    its lag behind the old master was known, and when the old link's loss is reported late."""
    for sync in (True, False):
        s = core("n1", sync=sync, in_sync_replicas=2)
        s.start(RoleState(SLAVE, "n0", 1), EpochList([(1, 0)]))
        s.on_master_lost("n0", 0)  # it had been in step with n0
        s.on_follow("n2", 2)
        s.on_master_lost("n0", 0)  # the old link winds down after the switch: says nothing of n2
        views = [slave_view("n0", 1, 2, "n2", 100)]
        problems = s.failover_problems(views, ["n2"], 100, s.lag(None, 100))
        if sync:
            assert problems == []
        else:
            assert problems and "never copied" in problems[0]
    m = core("n0", sync=True, in_sync_replicas=2)  # the old master, stepped down, promoted back
    m.start(RoleState(SLAVE, None, 0), EpochList([]))
    m.lead(1, 0, 0, 0, 0)
    m.on_follow("n2", 2)
    assert m.role == SLAVE
    assert m.failover_problems([slave_view("n1", 1, 2, "n2", 100)], ["n2"], 100, m.lag(None, 100)) == []


def test_a_master_told_of_a_promotion_whose_master_does_not_answer_stops_and_waits():
    """Issue 39 item 5: n1's promotion recorded epoch 2 on n2 and n1 died before it led. The
    master n0 hears it from n2: it stops taking writes (its waiting sends fail) but follows
    nobody -- before the fix it followed n1, a slave, and the group had no master until an
    operator promoted one. Its role stays master on disk; it asks as a restarting master: it
    waits while n1 does not answer, and leads epoch 3 once n1 is back as the slave it was."""
    c = core()
    c.lead(1, 0, 0, 0, 0)
    c.mcore.wait(100, 0, "token")
    said = slave_view("n2", 1, 2, "n1", 100)
    target, effects = c.on_views([said], 100)
    assert target is None and kinds(effects) == [StepDown, StopLink, StartLink, RoleChanged]  # no SaveRole
    assert effects[0].waiting == ("token",) and effects[2].master is None
    assert c.role == SLAVE and c.master is None and c.mcore is None and "n1" in c.restart_pending
    assert c.restart_step([said], 100).what == "wait"
    d = c.restart_step([said, slave_view("n1", 1, 1, "n0", 100)], 100)
    assert (d.what, d.arg) == ("record", 3)
    assert c.restart_recorded(3, 3, 100, 100, 100, 5).what == "open" and c.role == MASTER
    # a master that answers is followed, as before
    c2 = core()
    c2.lead(1, 0, 0, 0, 0)
    assert c2.on_views([said, View("n1", MASTER, 2, 2, "n1", 100)], 100)[0] == "n1"


def test_an_async_failover_reports_what_it_may_lose_and_the_self_fence_bounds_it():
    """Issue 39 item 4 (roles.async_loss through the core): the bound is the window plus one
    append, and only with a self-fence whose quorum meets every promotion quorum."""
    views = [slave_view("n2", 1, 1, "n0", 100)]
    for cfg, bound in (({}, None), ({"async_fence_replicas": 2, "fallbehind_max_bytes": 64,
                                     "append_bytes_max": 8}, 72), ({"async_fence_replicas": 1}, None)):
        c = core("n1", sync=False, **cfg)
        c.start(RoleState(SLAVE, "n0", 1), EpochList([(1, 0)]))
        c.on_master_lost("n0", 30)
        assert c.failover_problems(views, ["n0"], 100, c.lag(None, 100)) == []
        loss = c.failover_loss(views, ["n0"], 100, c.lag(None, 100))
        assert (loss.master, loss.at_last_report, loss.bytes_max) == ("n0", 30, bound), cfg
    assert core("n1").failover_loss(views, ["n0"], 100, 0) is None  # SYNC


def test_a_master_that_members_recorded_for_a_higher_epoch_it_never_led_leads_again_above_it():
    """(sim seed 378766826, failover_crash) n2, waiting to lead again, was promoted, had n0
    record it as master of epoch 12 and died before it led: back with epoch 10 on disk, it
    opened epoch 11 with n1, and n0, which had recorded 12, refused its WELCOME for good (and
    n2 refused n0's HELLO: n0 had seen a newer epoch). Now n2, hearing that a member recorded
    it for an epoch newer than the one it leads, steps down and opens one above it."""
    m = core("n2")
    m.lead(11, 0, 0, 0, 0)
    n0 = slave_view("n0", 10, 12, "n2", 30)
    target, effects = m.on_views([n0, slave_view("n1", 11, 11, "n2", 30)], 30)
    assert target is None and StepDown in kinds(effects) and SaveRole not in kinds(effects)
    assert "recorded this node as master of epoch 12" in m.restart_pending
    d = m.restart_step([n0, slave_view("n1", 11, 11, "n2", 30)], 30)
    assert (d.what, d.arg) == ("record", 13)
    ok = core("n2")
    ok.lead(12, 0, 0, 0, 0)
    assert ok.on_views([n0], 30) == (None, [])  # it leads that epoch: nothing to do
