import pytest

from broker.store.retention import Holder, RetentionPolicy, SegmentInfo, parse_delete_when, plan

H = 3600
SEGS = [SegmentInfo(i * 100, (i + 1) * 100, mtime_s=i * H) for i in range(6)]


def run(now_h, hour=4, disk=0.1, flushed=600, holders=(), **pol):
    return plan(SEGS, now_s=now_h * H, local_hour=hour, disk_usage_ratio=disk,
                flushed_offset=flushed, holders=list(holders),
                policy=RetentionPolicy(**{"file_reserved_hours": 10, **pol}))


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


def test_holders_are_named():
    p = run(12, holders=[Holder("consumer group g on t/0", 150, 42), Holder("replica b", 500)])
    assert len(p.warnings) == 1 and "consumer group g" in p.warnings[0] and "42" in p.warnings[0]


def test_parse_delete_when():
    assert parse_delete_when("04") == {4}
    assert parse_delete_when("01;13") == {1, 13}
    with pytest.raises(ValueError, match="not an hour"):
        parse_delete_when("25")
