"""CommitLog recovery over record batches (TLE2, docs/design/batch-format.md "Recovery"): a
batch is one entry and one POSITION record; a torn or corrupt batch is cut at its start,
whole; logs of either format, or both, recover alike."""

import os
import struct
import zlib

import pytest

from broker.store import codec, codec_batch
from broker.store.checkpoint import Checkpoint
from broker.store.commitlog import CommitLog

from .storeutil import append, body_of, item

SEG = 4096


def open_log(path, cp=None):
    cl = CommitLog(path, SEG, positions_per_file=64)
    return cl, cl.recover(cp)


def records(first: int, n: int, size: int = 120):
    return [codec_batch.BatchRecord(0, 1000 + i, i.to_bytes(16, "big"),
                                    codec.message_properties(keys=f"k{i}", tags="a" if i % 2 else "b"),
                                    body_of(i, size)) for i in range(first, first + n)]


def append_batches(cl, sizes, term=1, first_qoff=0, size=120):
    """One batch per count in `sizes` (queue offsets run on from `first_qoff`): (first index,
    phys offsets)."""
    zones, bases, q = [], [], first_qoff
    for n in sizes:
        zones.append(codec_batch.encode_zone("t", 0, records(q, n, size)))
        bases.append(q)
        q += n
    return cl.append_batches_as_leader(zones, bases, term, 0)


def write_log(path, fmt, n=12, term=1):
    """n entries of format `fmt` (2: batches of 1..5 records, crossing segments); returns the
    log, still open, with everything flushed."""
    cl, _ = open_log(path)
    if fmt == 1:
        for i in range(n):
            append(cl, [item(i, 300)], term, 0)
    else:
        q = 0
        for i in range(n):
            k = 1 + i % 5
            append_batches(cl, [k], term, q)
            q += k
    cl.flush()
    return cl


def positions(cl):
    return [cl.position(i) for i in range(cl.first_index, cl.tail.next_index)]


def segment_of(path, phys):
    base = phys - phys % SEG
    return path / "commitlog" / ("%020d" % base), phys - base


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_full_scan_rebuilds_one_position_per_entry(tmp_path, fmt):
    cl = write_log(tmp_path, fmt)
    tail, pos = cl.tail, positions(cl)
    assert len(cl.segments.files) > 1  # the scan follows end-of-segment markers
    cl.close()
    for p in (tmp_path / "positions").iterdir():  # lose the position index: a full rebuild
        p.unlink()
    cl2, report = open_log(tmp_path)
    assert report.full_scan and report.cut_offset is None and report.entries_checked == 12
    assert cl2.tail == tail and positions(cl2) == pos


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_checkpoint_at_a_batch_boundary_is_trusted(tmp_path, fmt):
    cl = write_log(tmp_path, fmt, n=6)
    cp = Checkpoint(cl.tail.offset, cl.tail.next_index, cl.tail.last_term)
    if fmt == 1:
        append(cl, [item(i, 300) for i in range(6, 10)], 1, 0)
    else:
        append_batches(cl, [3, 1, 2, 4], 1, 100)
    cl.flush()
    good = cl.tail
    cl.close()
    cl2, report = open_log(tmp_path, cp)
    assert not report.full_scan and report.scanned_from == cp.flushed_offset
    assert report.entries_checked == 4 and cl2.tail == good


def test_a_checkpoint_inside_a_batch_is_not_trusted(tmp_path):
    """A stale checkpoint (from before a truncation) names an offset inside a longer batch
    written after the cut: recovery scans everything instead of cutting good batches."""
    cl, _ = open_log(tmp_path)
    append_batches(cl, [2] * 8, 1)
    cl.flush()
    stale = Checkpoint(cl.tail.offset, cl.tail.next_index, cl.tail.last_term)
    cl.truncate_suffix(3)
    append_batches(cl, [5] * 8, 2, 6, size=200)
    cl.flush()
    good = cl.tail
    starts = {p for p, _, _ in positions(cl)}
    assert stale.flushed_offset not in starts and stale.flushed_offset < good.offset
    cl.close()
    cl2, report = open_log(tmp_path, stale)
    assert report.full_scan and report.cut_offset is None and cl2.tail == good
    assert [cl2.read_by_index(i).base_queue_offset for i in range(11)] == [0, 2, 4] + list(range(6, 46, 5))


def test_recovery_reads_a_log_that_changed_format(tmp_path):
    """TLE1 entries, then TLE2 batches (commitlog_format moved to 2): one log, both read."""
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 300) for i in range(5)], 1, 0)
    append_batches(cl, [3, 4, 1], 2, 5)
    cl.flush()
    tail, pos = cl.tail, positions(cl)
    cl.close()
    cl2, report = open_log(tmp_path)
    assert report.full_scan and report.entries_checked == 8 and report.cut_offset is None
    assert cl2.tail == tail and positions(cl2) == pos
    assert isinstance(cl2.read_by_index(4), codec.Entry)
    assert cl2.read_by_index(7).records[0].msg_id == (12).to_bytes(16, "big")


def crash_after_batches(tmp_path):
    """Ten batches of 3, the checkpoint covering the first 7; the last batch's (phys, size)."""
    cl, _ = open_log(tmp_path)
    append_batches(cl, [3] * 7, 1)
    t = cl.flush()
    cp = Checkpoint(t.offset, t.next_index, t.last_term)
    cl.positions.sync()
    append_batches(cl, [3] * 3, 1, 21)
    cl.flush()
    last = cl.position(9)
    cl.close()
    return cp, last


def cut_whole(cl, report, last, why):
    """The last batch is gone whole (none of its records survives), the nine before it stay."""
    assert report.cut_offset == last[0] and why in report.cut_reason
    assert cl.tail.next_index == 9 and cl.tail.offset == last[0]
    assert cl.read(last[0], last[1]) == bytes(last[1])
    assert [cl.read_by_index(i).base_queue_offset for i in range(9)] == list(range(0, 27, 3))


def test_a_torn_last_batch_is_cut_whole(tmp_path):
    cp, last = crash_after_batches(tmp_path)
    path, rel = segment_of(tmp_path, last[0])
    with open(path, "r+b") as f:  # only its head and first records reached the disk
        f.seek(rel + last[1] // 2)
        f.write(bytes(last[1] - last[1] // 2))
    cl, report = open_log(tmp_path, cp)
    cut_whole(cl, report, last, "records CRC mismatch")
    first, places = append_batches(cl, [2], 1, 27)  # the log goes on where the batch began
    assert first == 9 and places == [last[0]]


def test_a_flipped_bit_in_a_batch_head_cuts_the_batch(tmp_path):
    cp, last = crash_after_batches(tmp_path)
    path, rel = segment_of(tmp_path, last[0])
    with open(path, "r+b") as f:  # a bit of its base queue offset (covered by head_crc)
        f.seek(rel + 43)
        b = f.read(1)
        f.seek(rel + 43)
        f.write(bytes([b[0] ^ 1]))
    cl, report = open_log(tmp_path, cp)
    cut_whole(cl, report, last, "head CRC mismatch")


def test_a_batch_file_cut_short_is_cut_whole(tmp_path):
    cp, last = crash_after_batches(tmp_path)
    path, rel = segment_of(tmp_path, last[0])
    os.truncate(path, rel + 70)
    cl, report = open_log(tmp_path, cp)
    assert cl.tail.next_index == 9 and report.cut_offset == last[0]


def test_a_batch_whose_records_do_not_frame_is_cut_though_its_crcs_hold(tmp_path):
    """A record_size that disagrees with its lengths, under good CRCs (a writer's bug, not
    a torn write): "head" reads the records' framing too, and recovery cuts there."""
    cl, _ = open_log(tmp_path)
    append_batches(cl, [2, 2], 1)
    zone, _ = codec_batch.encode_zone("t", 0, records(4, 2))
    bad = bytearray(zone)
    at = codec.ZONE_TOPIC_AT + 1  # the first record's record_size
    struct.pack_into(">I", bad, at, struct.unpack_from(">I", bad, at)[0] + 1)
    place = cl.tail.offset
    cl.append_batches_as_leader([(bytes(bad), zlib.crc32(bad))], [4], 1, 0)
    cl.flush()
    cl.close()
    cl2, report = open_log(tmp_path)
    assert report.cut_offset == place and "framing" in report.cut_reason
    assert cl2.tail.next_index == 2
