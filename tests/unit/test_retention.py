import pytest

from broker.store.retention import Floor, Holder, RetentionPolicy, SegmentInfo, parse_delete_when, plan

H = 3600
SEGS = [SegmentInfo(i * 100, (i + 1) * 100, mtime_s=i * H) for i in range(6)]


def run(now_h, hour=4, disk=0.1, flushed=600, holders=(), dispatched=None, committed=None,
        checkpointed=None, **pol):
    floor = Floor(flushed, flushed if committed is None else committed,
                  flushed if dispatched is None else dispatched,
                  flushed if checkpointed is None else checkpointed)
    return plan(SEGS, now_s=now_h * H, local_hour=hour, disk_usage_ratio=disk, floor=floor,
                holders=list(holders), policy=RetentionPolicy(**{"file_reserved_hours": 10, **pol}))


def test_expired_prefix_at_delete_hour_only():
    assert [s.base for s in run(12).delete] == [0, 100, 200]
    assert run(12, hour=5).delete == []


def test_never_the_active_segment_or_unflushed():
    assert [s.base for s in run(1000).delete] == [0, 100, 200, 300, 400]
    assert [s.base for s in run(1000, flushed=250).delete] == [0, 100]


def test_disk_pressure():
    assert [s.base for s in run(12, hour=9, disk=0.8).delete] == [0, 100, 200]
    p = run(0, hour=9, disk=0.9)  # nothing expired, but the disk is nearly full
    assert [s.base for s in p.delete] == [0] and "force" in p.reason


@pytest.mark.parametrize("bound", ["dispatched", "committed", "checkpointed"])
def test_nothing_past_what_was_dispatched_committed_and_checkpointed(bound):
    """Issue 39: a segment goes only once every entry in it is indexed and applied, committed
    and recorded so by a durable checkpoint -- expired, clean threshold and forced alike
    (forced used to take the oldest segment whatever the dispatcher had read)."""
    for disk, now_h in ((0.1, 1000), (0.8, 1000), (0.99, 1000), (0.99, 0)):
        assert [s.base for s in run(now_h, disk=disk, **{bound: 250}).delete] == [0, 100][:2 if now_h else 1]
        p = run(now_h, disk=disk, **{bound: 99})
        assert p.delete == [] and p.reason == ""
        assert f"past the {bound} offset 99" in p.held, p.held


def test_floor_names_its_lowest_bound_and_a_kept_segment_says_why():
    f = Floor(flushed=500, committed=400, dispatched=120, checkpointed=300)
    assert f.offset == 120 and f.limit() == "dispatched"
    p = run(0, hour=9, disk=0.99, dispatched=50, committed=400)
    assert not p.delete and "segment 0" in p.held and "force threshold" in p.held
    assert run(0, hour=9, disk=0.1, dispatched=50).held == ""  # the policy wanted nothing


def test_holders_are_named():
    p = run(12, holders=[Holder("consumer group g on t/0", 150, 42), Holder("replica b", 500)])
    assert len(p.warnings) == 1 and "consumer group g" in p.warnings[0] and "42" in p.warnings[0]


def test_parse_delete_when():
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("01;13") == {1, 13}
    with pytest.raises(ValueError, match="not an hour"):
        parse_delete_when("25")
