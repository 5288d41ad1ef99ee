"""Regression tests for three Raft fixes: a live follower left behind the leader's retention
is reset (not stalled), the bytes queued to a peer that does not read stay bounded, and a
leader's read lease ends before anyone else can be elected."""

from replication.raft import messages as m
from replication.raft.progress import State

from .raft_harness import Group


def write(g, leader, n, tag="w"):
    for k in range(n):
        g.append(leader, b"%s%d" % (tag.encode(), k))
    g.deliver()


def drop_head(log, n):
    """What retention does to a MemLog: the first `n` entries are gone."""
    log.items, log.begin = log.items[n:], log.begin + n


# --- a live follower behind the leader's retention -------------------------------------------


def test_live_follower_behind_the_leaders_retention_is_reset_not_stalled():
    """The follower misses pushes for less than an election timeout, so it never campaigns
    or restarts and asks for no probe; the leader's pushes time out (it goes back to the
    watermark, below its first retained entry). It must probe and reset the follower there."""
    seed = 0
    print("seed", seed)
    g = Group(3, seed=seed, push_timeout_ticks=4)
    lead = g.until_leader()
    write(g, lead, 3)
    g.tick(5)
    lag = next(i for i in g.ids if i != lead)
    other = next(i for i in g.ids if i not in (lead, lag))
    g.isolate(lag)
    write(g, lead, 20, "more")
    g.tick(6)  # shorter than any election timeout (10..19): the lagger stays a quiet follower
    assert g.leader() == lead and g.nodes[lag].leader_id == lead
    assert g.nodes[lead].leading.progress[lag].state == State.APPEND
    for i in (lead, other):  # retention deleted what the lagger needs next, on both
        drop_head(g.logs[i], 10)
    begin = g.logs[lead].begin
    assert g.logs[lag].last_index() < begin - 1
    g.heal()
    g.tick(60)
    assert g.leader() == lead
    assert g.logs[lag].begin == begin and g.datas(lag) == g.datas(lead)
    assert g.nodes[lag].commit_index == g.logs[lead].last_index()
    assert g.nodes[lead].leading.progress[lag].watermark == g.logs[lead].last_index()
    truncs = g.pushes_to(lag, m.PushType.TRUNCATE)
    assert truncs and truncs[-1].entries[0][0] == begin, "reset at the leader's first retained entry"
