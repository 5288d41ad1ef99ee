"""apply_ready (replication/raft/ready.py): the order in which a Ready's effects happen."""

import pytest

from replication.raft import messages as m
from replication.raft.core import HardState, Ready
from replication.raft.ready import Outbox, apply_ready, release


class FakeNode:
    def __init__(self, r: Ready, is_leader=False):
        self.r, self.is_leader = r, is_leader

    def ready(self):
        r, self.r = self.r, Ready()
        return r


class Recorder:
    """Ports that log every call; the log's written end is `written`, durable `synced`."""

    def __init__(self, fail_on=None):
        self.outbox = Outbox()
        self.calls = []
        self.written = self.synced = -1
        self.fail_on = fail_on

    def _call(self, *c):
        if c[0] == self.fail_on:
            raise OSError(f"{c[0]} failed")
        self.calls.append(c)

    def save_hard_state(self, hs):
        self._call("hard_state", hs)

    def reset_to(self, first):
        self._call("reset_to", first[0])
        self.written = self.synced = first[0] - 1
        self.written = first[0]

    def truncate_from(self, index):
        self._call("truncate_from", index)
        self.written = index - 1
        self.synced = min(self.synced, self.written)

    def append(self, entries):
        self._call("append", [e[0] for e in entries])
        self.written = entries[-1][0]

    def unsynced_mark(self):
        return self.written if self.written > self.synced else None

    def request_flush(self):
        self._call("request_flush")

    def send(self, to, msg):
        self._call("send", to, type(msg).__name__)

    def role_changed(self, is_leader):
        self._call("role_changed", is_leader)

    def committed(self, index):
        self._call("committed", index)

    def append_noop(self):
        self._call("append_noop")

    def flushed(self):
        self.synced = self.written
        return release(self, self.synced)

    def kinds(self):
        return [c[0] for c in self.calls]


def vote(granted=True):
    return m.VoteResponse("b", 2, granted)


def ack(index):
    return m.PushResponse("b", 2, m.PushType.APPEND, m.PushCode.SUCCESS, index, 0, index, 1)


def entries(lo, hi, term=2):
    return [(i, term, b"x%d" % i) for i in range(lo, hi + 1)]


def test_the_vote_is_fsynced_before_it_is_sent():
    p = Recorder()
    apply_ready(FakeNode(Ready(hard_state=HardState(2, "a"), messages=[("a", vote())])), p)
    assert p.kinds() == ["hard_state", "send"]


def test_an_ack_waits_for_the_fsync_of_what_it_acknowledges():
    p = Recorder()
    r = Ready(append=entries(0, 2), messages=[("a", ack(2))], commit_index=1)
    apply_ready(FakeNode(r), p)
    # written, flush requested, the commit (a quorum's fact) applied -- nothing sent yet
    assert p.kinds() == ["append", "request_flush", "committed"]
    assert len(p.outbox) == 1
    assert release(p, 1) == 0  # durable short of the mark: still waiting
    assert p.flushed() == 1
    assert p.calls[-1] == ("send", "a", "PushResponse")


def test_a_message_needing_nothing_waits_behind_one_that_waits():
    """A COMPARE answered from an entry not yet fsynced vouches for it as well."""
    p = Recorder()
    apply_ready(FakeNode(Ready(append=entries(0, 0), messages=[("a", ack(0))])), p)
    apply_ready(FakeNode(Ready(messages=[("a", vote(False)), ("c", vote(False))])), p)
    assert "send" not in p.kinds() and len(p.outbox) == 3
    p.flushed()
    assert [c[1:] for c in p.calls if c[0] == "send"] == [
        ("a", "PushResponse"), ("a", "VoteResponse"), ("c", "VoteResponse")]


def test_without_writes_messages_go_out_at_once():
    p = Recorder()
    apply_ready(FakeNode(Ready(messages=[("a", vote())], commit_index=3)), p)
    assert p.kinds() == ["send", "committed"]


def test_a_failed_write_says_nothing_and_applies_nothing():
    p = Recorder(fail_on="append")
    r = Ready(hard_state=HardState(3, None), append=entries(0, 1), messages=[("a", ack(1))],
              commit_index=0, role_changed=True)
    with pytest.raises(OSError):
        apply_ready(FakeNode(r), p)
    assert p.kinds() == ["hard_state"] and not p.outbox


def test_a_failed_hard_state_write_says_nothing():
    p = Recorder(fail_on="hard_state")
    with pytest.raises(OSError):
        apply_ready(FakeNode(Ready(hard_state=HardState(2, "a"), messages=[("a", vote())])), p)
    assert p.calls == [] and not p.outbox


def test_order_of_a_full_ready():
    p = Recorder()
    r = Ready(hard_state=HardState(4, None), truncate_from=5, append=entries(5, 6, term=4),
              messages=[("a", ack(6))], commit_index=4, role_changed=True, append_noop=True)
    apply_ready(FakeNode(r, is_leader=True), p)
    assert p.calls == [("hard_state", HardState(4, None)), ("truncate_from", 5), ("append", [5, 6]),
                       ("request_flush",), ("role_changed", True), ("committed", 4), ("append_noop",)]


def test_a_reset_restarts_the_log_with_the_first_entry():
    p = Recorder()
    apply_ready(FakeNode(Ready(reset_to=500, append=entries(500, 502), messages=[("a", ack(502))])), p)
    assert p.kinds() == ["reset_to", "append", "request_flush"]
    assert p.calls[0] == ("reset_to", 500) and p.calls[1] == ("append", [501, 502])


def test_a_cut_drops_what_waited_for_the_entries_it_removed():
    """Otherwise they vouch for entries that are gone, and wait for a mark past the log's end
    that no flush reaches: the node would go mute."""
    p = Recorder()
    apply_ready(FakeNode(Ready(append=entries(0, 9), messages=[("a", ack(9))])), p)
    assert len(p.outbox) == 1
    apply_ready(FakeNode(Ready(truncate_from=7, messages=[("c", ack(6))])), p)
    # nothing of the cut is unsynced (0..6 were not fsynced yet: the answer waits for them)
    assert [(n, to) for n, to, _ in p.outbox.q] == [(6, "c")]
    p.flushed()
    assert [c[1] for c in p.calls if c[0] == "send"] == ["c"]


def test_a_truncation_alone_needs_no_fsync():
    p = Recorder()
    p.written = p.synced = 9
    apply_ready(FakeNode(Ready(truncate_from=3, messages=[("a", ack(2))])), p)
    assert p.kinds() == ["truncate_from", "send"]
