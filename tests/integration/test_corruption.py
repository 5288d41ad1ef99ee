"""A corrupt segment: a torn tail is cut at restart; a flipped byte in flushed data is kept
and reported to the consumer, which can seek past it; nothing else is lost."""

import pytest

from broker.client import Consumer, CorruptMessage, Producer

from ..helpers import BrokerThread, poll_until


def flip(path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))


def test_flipped_byte_is_reported_and_skippable(tmp_path):
    with BrokerThread(tmp_path / "b") as b, Producer([b.address]) as p:
        rs = [p.send("t", b"message-%02d" % i, queue_id=0) for i in range(10)]
    victim = rs[4]
    seg = tmp_path / "b" / "commitlog" / ("%020d" % 0)
    flip(seg, victim.phys_offset + 100)
    with BrokerThread(tmp_path / "b") as b, Consumer([b.address], "g", "t", queues=[0]) as c:
        got = poll_until(c, 4)
        assert [m.queue_offset for m in got] == [0, 1, 2, 3]
        with pytest.raises(CorruptMessage, match="t/0 at queue offset 4: (records )?CRC mismatch") as e:
            poll_until(c, 1)
        c.seek(0, e.value.offset + 1)
        rest = poll_until(c, 5)
        assert [m.queue_offset for m in rest] == [5, 6, 7, 8, 9]


def test_torn_tail_after_a_crash_is_cut_and_logged(tmp_path, caplog):
    b = BrokerThread(tmp_path / "b", checkpoint_interval_ms=600_000)  # no checkpoint but ours
    with b, Producer([b.address]) as p:
        rs = [p.send("t", b"m%d" % i, queue_id=0) for i in range(5)]
        b.call(b.broker.store.checkpoint)
        tail_entry = p.send("t", b"written after the last checkpoint", queue_id=0)
        # a crash now: the broker stops without its final checkpoint
        b.broker.store.checkpoint = lambda: None
    seg = tmp_path / "b" / "commitlog" / ("%020d" % 0)
    flip(seg, tail_entry.phys_offset + 110)
    with BrokerThread(tmp_path / "b") as b2, Consumer([b2.address], "g", "t", queues=[0]) as c:
        got = poll_until(c, 5)
        assert [m.body for m in got] == [b"m%d" % i for i in range(5)]
        assert c.poll(timeout_ms=300) == []
    assert "recovery cut the CommitLog" in caplog.text and "CRC mismatch" in caplog.text
    assert rs[-1].queue_offset == 4
