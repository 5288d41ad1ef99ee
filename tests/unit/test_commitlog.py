import os

import pytest

from broker.store import codec
from broker.store.checkpoint import Checkpoint, CheckpointFile
from broker.store.commitlog import CommitLog, EntryTooLarge, StoreNotWritable
from broker.store.files import DiskFull

from .storeutil import append, item

SEG = 4096


def open_log(path, cp=None, seg=SEG):
    cl = CommitLog(path, seg, positions_per_file=64)
    report = cl.recover(cp)
    return cl, report


def test_append_read_by_offset_and_index(tmp_path):
    cl, _ = open_log(tmp_path)
    first, places = append(cl, [item(i) for i in range(5)], 1, 5)
    assert first == 0 and places[0] == 0 and cl.tail.next_index == 5
    for i, phys in enumerate(places):
        e = codec.decode(cl.read_entry(phys), 0, base_offset=phys)
        assert e.index == i and e.term == 1 and e.body == item(i).body
        assert cl.read_by_index(i) == e
    assert cl.read_by_index(5) is None


def test_segments_roll_with_end_marker(tmp_path):
    cl, _ = open_log(tmp_path)
    size = codec.HEADER_SIZE + 1 + 1000
    n = 10
    _, places = append(cl, [item(i, 1000) for i in range(n)], 0, 0)
    per_seg = (SEG - 8) // size
    assert places[per_seg] == SEG  # the first entry that did not fit starts segment 2
    names = sorted(os.listdir(tmp_path / "commitlog"))
    assert names[:2] == ["%020d" % 0, "%020d" % SEG]
    marker = cl.read(places[per_seg - 1] + size, 8)
    assert codec.peek(marker) == (SEG - per_seg * size, codec.BLANK_MAGIC)
    assert [cl.read_by_index(i).index for i in range(n)] == list(range(n))


def test_entry_larger_than_segment_is_refused(tmp_path):
    cl, _ = open_log(tmp_path)
    with pytest.raises(EntryTooLarge):
        append(cl, [item(0, SEG)], 0, 0)
    assert cl.tail.offset == 0


def test_reopen_continues(tmp_path):
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 500) for i in range(20)], 2, 0)
    tail = cl.tail
    cl.flush()
    cl.close()
    cl2, report = open_log(tmp_path)
    assert cl2.tail == tail and report.cut_offset is None and report.full_scan
    first, _ = append(cl2, [item(20)], 2, 0)
    assert first == 20


def write_then_crash(tmp_path, n=30, checkpoint_after=20):
    """n entries written, the checkpoint covering the first `checkpoint_after`."""
    cl, _ = open_log(tmp_path)
    places = []
    for i in range(n):
        _, p = append(cl, [item(i, 300)], 1, 0)
        places += p
        if i + 1 == checkpoint_after:
            t = cl.flush()
            cp = Checkpoint(t.offset, t.next_index, t.last_term)
            cl.positions.sync()
    cl.flush()
    cl.close()
    return cp, places


def test_recovery_cuts_segment_torn_mid_entry(tmp_path):
    cp, places = write_then_crash(tmp_path)
    last = places[-1]
    seg_base = last - last % SEG
    path = tmp_path / "commitlog" / ("%020d" % seg_base)
    with open(path, "r+b") as f:  # the last entry was only half written
        f.seek(last - seg_base + 150)
        f.write(bytes(SEG - (last - seg_base + 150)))
    cl, report = open_log(tmp_path, cp)
    assert report.cut_offset == last and "CRC" in report.cut_reason
    assert cl.tail.next_index == 29
    assert [cl.read_by_index(i).index for i in range(29)] == list(range(29))
    assert cl.read(last, 64) == bytes(64)  # the torn bytes are gone


def test_recovery_cuts_flipped_bytes_in_last_entry(tmp_path):
    cp, places = write_then_crash(tmp_path)
    last = places[-1]
    seg_base = last - last % SEG
    path = tmp_path / "commitlog" / ("%020d" % seg_base)
    with open(path, "r+b") as f:
        f.seek(last - seg_base + 200)
        f.write(b"\xff\xfe")
    cl, report = open_log(tmp_path, cp)
    assert report.cut_offset == last and report.cut_reason == "CRC mismatch"
    assert cl.tail.next_index == 29 and cl.tail.offset == last
    first, p = append(cl, [item(99, 300)], 1, 0)
    assert first == 29 and p == [last]


def test_recovery_of_file_cut_short(tmp_path):
    """A segment file truncated (not just zeroed) mid-entry."""
    cp, places = write_then_crash(tmp_path)
    last = places[-1]
    seg_base = last - last % SEG
    os.truncate(tmp_path / "commitlog" / ("%020d" % seg_base), last - seg_base + 40)
    cl, report = open_log(tmp_path, cp)
    assert cl.tail.next_index == 29 and report.cut_offset == last


def test_recovery_removes_segments_after_the_cut(tmp_path):
    cp, places = write_then_crash(tmp_path, n=40, checkpoint_after=5)
    victim = places[10]
    seg_base = victim - victim % SEG
    with open(tmp_path / "commitlog" / ("%020d" % seg_base), "r+b") as f:
        f.seek(victim - seg_base + 100)
        f.write(b"garbage")
    cl, report = open_log(tmp_path, cp)
    assert cl.tail.next_index == 10 and report.segments_removed >= 1
    assert max(int(n) for n in os.listdir(tmp_path / "commitlog")) <= seg_base


def test_recovery_never_drops_entries_before_checkpoint_even_if_positions_lost(tmp_path):
    cp, places = write_then_crash(tmp_path)
    for p in (tmp_path / "positions").iterdir():
        p.unlink()
    cl, report = open_log(tmp_path, cp)
    assert report.full_scan and cl.tail.next_index == 30
    assert cl.read_by_index(3).index == 3


def test_truncate_suffix(tmp_path):
    cl, _ = open_log(tmp_path)
    _, places = append(cl, [item(i, 700) for i in range(20)], 1, 0)
    cl.truncate_suffix(7)
    assert cl.tail.offset == places[7] and cl.tail.next_index == 7
    assert cl.read_by_index(7) is None and cl.read_by_index(6).index == 6
    first, p = append(cl, [item(7, 10)], 2, 0)
    assert first == 7 and p == [places[7]]
    cl.flush()
    cl.close()
    cl2, report = open_log(tmp_path)
    assert cl2.tail.next_index == 8 and report.cut_offset is None


def test_checkpoint_file_survives_a_torn_slot(tmp_path):
    f = CheckpointFile(tmp_path / "cp")
    assert f.load() is None
    f.write(Checkpoint(100, 5, 1, -1))
    f.write(Checkpoint(200, 9, 1, 3))
    f.close()
    raw = bytearray((tmp_path / "cp").read_bytes())
    raw[64 * (f.seq % 2) + 20] ^= 1  # tear the newest slot
    (tmp_path / "cp").write_bytes(bytes(raw))
    g = CheckpointFile(tmp_path / "cp")
    assert g.load() == Checkpoint(100, 5, 1, -1)


def test_disk_full_mid_write_undoes_everything(tmp_path, monkeypatch):
    """ENOSPC part-way through a batch: nothing of it stays, the log stays writable."""
    cl, _ = open_log(tmp_path)
    append(cl, [item(0, 300)], 0, 0)
    tail = cl.tail
    real_pwritev, real_pwrite = os.pwritev, os.pwrite

    def short_pwritev(fd, parts, pos):  # the first entry lands, then the disk is full
        return real_pwritev(fd, parts[:4], pos)

    def pwrite_zeros_only(fd, data, pos):  # overwriting with zeros needs no new space
        if bytes(data).count(0) != len(data):
            raise OSError(28, "No space left on device")
        return real_pwrite(fd, data, pos)

    monkeypatch.setattr(os, "pwritev", short_pwritev)
    monkeypatch.setattr(os, "pwrite", pwrite_zeros_only)
    with pytest.raises(DiskFull, match="nothing was stored"):
        append(cl, [item(i, 300) for i in range(1, 6)], 0, 0)
    monkeypatch.undo()
    assert cl.tail == tail and cl.unwritable_reason is None
    assert cl.read(tail.offset, 2000) == bytes(2000)  # the partial batch was zeroed
    first, _ = append(cl, [item(1, 300)], 0, 0)
    assert first == 1
    cl.flush()
    cl.close()
    cl2, report = open_log(tmp_path)
    assert cl2.tail.next_index == 2 and report.cut_offset is None


def test_other_write_errors_make_the_log_refuse_writes(tmp_path, monkeypatch):
    cl, _ = open_log(tmp_path)

    def eio(fd, parts, pos):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "pwritev", eio)
    with pytest.raises(StoreNotWritable):
        append(cl, [item(0)], 0, 0)
    monkeypatch.undo()
    with pytest.raises(StoreNotWritable, match="Input/output error"):
        append(cl, [item(0)], 0, 0)
    assert cl.tail.next_index == 0


def test_follower_appends_the_leaders_bytes_at_the_same_offsets(tmp_path):
    leader, _ = open_log(tmp_path / "l")
    follower, _ = open_log(tmp_path / "f")
    for term, n in ((1, 6), (2, 9)):
        first, places = append(leader, [item(i, 700) for i in range(leader.tail.next_index,
                                                                      leader.tail.next_index + n)], term, 0)
        raws = [leader.read(p, codec.peek(leader.read(p, 8))[0]) for p in places]
        follower.append_as_follower(raws)  # rolls segments exactly where the leader did
    assert follower.tail == leader.tail
    for seg in leader.segments.files:
        mine = follower.segments.find(seg.base)
        assert mine.pread(0, seg.size) == seg.pread(0, seg.size)
    assert follower.read_by_index(10) == leader.read_by_index(10)


def test_follower_refuses_entries_that_do_not_fit(tmp_path):
    leader, _ = open_log(tmp_path / "l")
    follower, _ = open_log(tmp_path / "f")
    _, places = append(leader, [item(i) for i in range(3)], 1, 0)
    raws = [leader.read(p, codec.peek(leader.read(p, 8))[0]) for p in places]
    from broker.store.commitlog import FollowerMismatch
    with pytest.raises(FollowerMismatch, match="cannot follow"):
        follower.append_as_follower(raws[1:])  # a gap
    bad = bytearray(raws[0])
    bad[-1] ^= 1
    with pytest.raises(FollowerMismatch, match="CRC"):
        follower.append_as_follower([bytes(bad)])
    assert follower.tail.next_index == 0
    follower.append_as_follower(raws)
    assert follower.tail == leader.tail


def test_reset_restarts_the_log_at_the_leaders_offset(tmp_path):
    leader, _ = open_log(tmp_path / "l")
    _, places = append(leader, [item(i, 900) for i in range(12)], 1, 0)
    raws = [leader.read(p, codec.peek(leader.read(p, 8))[0]) for p in places]
    follower, _ = open_log(tmp_path / "f")
    append(follower, [item(i, 50) for i in range(3)], 0, 0)  # unrelated old data
    follower.reset(raws[7])
    follower.append_as_follower(raws[8:])
    assert follower.first_index == 7 and follower.tail == leader.tail
    assert follower.read_by_index(9) == leader.read_by_index(9)
    follower.flush()
    follower.positions.sync()
    from broker.store.checkpoint import Checkpoint
    cp = Checkpoint(follower.flushed.offset, follower.flushed.next_index, follower.flushed.last_term)
    follower.close()
    again, report = open_log(tmp_path / "f", cp)
    assert again.tail == leader.tail and report.cut_offset is None


def test_truncating_at_a_segment_start_also_removes_the_end_marker(tmp_path):
    """The log must end where the last kept entry ends, so the next entry is placed by the
    same rule as on the master or leader (here: it fits in the first segment again)."""
    cl, _ = open_log(tmp_path)
    _, places = append(cl, [item(i, 700) for i in range(8)], 1, 0)
    first_in_seg2 = next(i for i, p in enumerate(places) if p >= SEG)
    end_before = places[first_in_seg2 - 1] + codec.HEADER_SIZE + 1 + 700
    cl.truncate_suffix(first_in_seg2)
    assert cl.tail.offset == end_before and len(cl.segments.files) == 1
    assert cl.read(end_before, 8) == bytes(8)  # the marker is gone
    _, p = append(cl, [item(first_in_seg2, 10)], 2, 0)
    assert p == [end_before]


def test_truncate_to_an_offset(tmp_path):
    cl, _ = open_log(tmp_path)
    _, places = append(cl, [item(i, 500) for i in range(20)], 1, 0)
    with pytest.raises(ValueError, match="not an entry boundary"):
        cl.truncate_to(places[5] + 3)
    assert cl.truncate_to(cl.tail.offset) == 0
    assert cl.truncate_to(places[15]) == 5
    assert cl.tail.next_index == 15 and cl.tail.offset == places[15] and cl.tail.last_term == 1
    seg2 = next(i for i, p in enumerate(places) if p >= SEG)
    assert cl.truncate_to(places[seg2]) == 15 - seg2  # a segment start: back to the entry end
    assert cl.tail.offset == places[seg2 - 1] + codec.HEADER_SIZE + 1 + 500 < places[seg2]
    assert cl.tail.next_index == seg2
    cl.flush()
    cp = Checkpoint(cl.flushed.offset, cl.flushed.next_index, cl.flushed.last_term)
    cl.close()
    again, report = open_log(tmp_path, cp)  # nothing after the cut comes back
    assert again.tail.next_index == seg2 and report.cut_offset is None
    again.close()
    again, report = open_log(tmp_path, None)  # not even from a full scan
    assert again.tail.next_index == seg2


def test_a_follower_cut_at_an_entry_after_a_marker_follows_the_leader_from_there(tmp_path):
    """truncate_to the first entry of a segment leaves the tail where the previous entry
    ends (the marker goes too); a leader streaming from that entry's offset still follows
    (follows_at), and the follower's append puts it there by the same placement rule."""
    leader, _ = open_log(tmp_path / "leader")
    follower, _ = open_log(tmp_path / "follower")
    append(leader, [item(i, 700) for i in range(8)], 1)
    k = next(i for i in range(8) if leader.position(i)[0] >= SEG)
    follower.append_as_follower([leader.read_entry(leader.position(i)[0]) for i in range(8)])
    at = follower.position(k)[0]
    assert at == SEG
    follower.truncate_to(at)
    prev = follower.position(k - 1)
    assert follower.tail.offset == prev[0] + prev[1] < at
    assert follower.follows_at(at) and follower.follows_at(follower.tail.offset)
    assert not follower.follows_at(at + 1) and not follower.follows_at(follower.tail.offset - 1)
    follower.append_as_follower([leader.read_entry(leader.position(i)[0]) for i in range(k, 8)])
    assert follower.tail == leader.tail
    assert follower.read(0, leader.tail.offset) == leader.read(0, leader.tail.offset)
    assert follower.read(SEG, leader.tail.offset - SEG) == leader.read(SEG, leader.tail.offset - SEG)


def test_a_log_restarted_inside_a_segment_places_entries_as_its_leader_did(tmp_path):
    """restart_at an offset inside a segment, with no file left (a master-slave slave starting
    over from its master's epoch): the next entries are placed by the leader's rule -- the
    segment is the one starting at a multiple of segment_bytes, so an entry that does not fit
    before its end rolls there. It used to take the segment as starting at the offset itself:
    a leader append crashed on a negative end marker and a follower refused its leader's
    placement (FollowerMismatch). Found by test_recent_entries' property test."""
    leader, _ = open_log(tmp_path / "leader")
    _, places = append(leader, [item(i, 300) for i in range(7)], 1, 0)
    start, first = leader.tail.offset, leader.tail.next_index  # inside the first segment
    assert 0 < start < SEG and start % SEG
    _, more = append(leader, [item(i, 300) for i in range(7, 12)], 1, 0)
    assert more[-1] >= SEG  # the leader rolled into the next segment on the way
    raws = [leader.read_entry(p) for p in more]

    follower, _ = open_log(tmp_path / "follower")
    follower.restart_at(start, first)
    follower.append_as_follower(raws)  # the leader's offsets: accepted byte for byte
    assert follower.tail == leader.tail
    assert [follower.read_entry(p) for p in more] == raws

    other, _ = open_log(tmp_path / "other")
    other.restart_at(start, first)
    _, placed = append(other, [item(i, 300) for i in range(7, 12)], 1, 0)
    assert placed == more
