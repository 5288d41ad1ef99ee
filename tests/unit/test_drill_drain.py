"""The drain's idea of where each queue ends: every node is asked and the highest end wins, so
a follower still catching up (healthy, within its lag bound) cannot make a drill stop reading
early and report acknowledged messages as lost (a real run did, before this)."""

import pytest

from broker.client.errors import TidelogError
from broker.protocol.topics import QueueInfo, TopicInfo
from ops.drill import workload


class FakeAdmin:
    answers: dict = {}

    def __init__(self, bootstrap, **_):
        (self.address,) = bootstrap

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def describe_topic(self, topic):
        a = self.answers[self.address]
        if isinstance(a, Exception):
            raise a
        return TopicInfo(topic, len(a), len(a), 6, [QueueInfo(q, lo, hi) for q, (lo, hi) in enumerate(a)])


def test_the_highest_end_of_every_queue_wins(monkeypatch):
    monkeypatch.setattr(workload, "Admin", FakeAdmin)
    FakeAdmin.answers = {"n1": [(0, 160), (0, 158)],        # a lagging follower, asked first
                         "n2": [(0, 221), (0, 220)],        # the leader
                         "n3": TidelogError("connection refused")}
    assert workload.queue_ranges(["n1", "n2", "n3"], "t") == {0: (0, 221), 1: (0, 220)}


def test_no_node_answering_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(workload, "Admin", FakeAdmin)
    FakeAdmin.answers = {"n1": TidelogError("connection refused"), "n2": TidelogError("TOPIC_NOT_EXIST")}
    with pytest.raises(TidelogError, match="no node described topic t: n1: connection refused; n2: TOPIC_NOT_EXIST"):
        workload.queue_ranges(["n1", "n2"], "t")
