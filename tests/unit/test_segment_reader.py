"""The reconcile job's segment reader on crafted segments of both formats (TLE1 entries, TLE2
record batches of 1..4 records): good, a flipped byte (CRC), broken framing (resync), a
truncated copy, a batch whose records cannot be framed, a log written across the upgrade."""

from __future__ import annotations

import struct
import zlib

import pytest

from broker.store import codec
from spark_jobs import craft
from spark_jobs.craft import E, encode_log, log
from spark_jobs.segment_reader import COLUMNS, read_columns, read_segment

SEG = 1 << 16

both = pytest.mark.parametrize("fmt", craft.FORMATS, ids=lambda f: f"TLE{f}")


def one_segment(entries, fmt=1) -> bytearray:
    (seg,) = encode_log(entries, SEG, fmt)
    return seg[1]


def entries_of(rows):
    return [r for r in rows if r.kind == "entry"]


def firsts(rows):
    """One row per entry: its first message (batch_pos 0), or the entry as a whole (NULL)."""
    return [r for r in rows if r.kind == "entry" and not r.batch_pos]


def offsets(data) -> list[int]:
    """Where each entry of a clean segment starts."""
    return [at for at, _ in codec.walk2(bytes(data), read="frame")]


def want(entries, fmt):
    return [(e.index, k) for e in entries for k in range(e.records(fmt))]


def columns_agree(data, base=0):
    rows = read_segment(bytes(data), base)
    assert read_columns(bytes(data), base) == {f: [r[i] for r in rows] for i, f in enumerate(COLUMNS)}
    return rows


@both
def test_clean_segment_reads_every_message_with_its_fields(fmt):
    entries = log(10, term=3, keys=("k1", "k2"))
    data = one_segment(entries, fmt)
    rows = columns_agree(data)
    assert [(r.index, r.batch_pos) for r in rows] == want(entries, fmt)
    assert all(r.crc_ok and r.term == 3 and r.problem is None for r in rows)
    assert [r.queue_offset for r in rows] == list(range(len(rows)))  # base + k, one queue
    assert {r.msg_id for r in rows} == {craft.msg_id(i, 3, k).hex() for i, k in want(entries, fmt)}
    e4 = [r for r in rows if r.index == 4]
    assert all(r.keys == ["k1", "k2"] and r.topic == "orders" for r in e4)
    assert {(r.phys_offset, r.size, r.crc, r.store_ts_ms) for r in e4} == {(e4[0].phys_offset, e4[0].size, e4[0].crc,
                                                                            craft.BASE_TS_MS + 4)}
    assert [r.phys_offset for r in firsts(rows)] == offsets(data)
    assert firsts(rows)[1].phys_offset == firsts(rows)[0].size


@both
def test_segments_roll_with_a_marker_and_each_reads_alone(fmt):
    entries = log(2000)
    segs = encode_log(entries, SEG, fmt)
    assert len(segs) > 1
    got = [(r.index, r.batch_pos) for base, data in segs for r in read_segment(bytes(data), base)]
    assert got == want(entries, fmt)


@both
def test_flipped_byte_is_a_bad_crc_row_with_its_index_from_its_neighbours(fmt):
    entries = log(10)
    data = one_segment(entries, fmt)
    at5 = offsets(data)[5]
    data[at5 + 12 + 7] ^= 0x01  # the low byte of the index field: index 5 -> 4
    rows = columns_agree(data)
    bad = [r for r in rows if not r.crc_ok]
    assert [(r.index, r.batch_pos) for r in bad] == want(entries[5:6], fmt)
    assert {r.problem for r in bad} == {"CRC mismatch" if fmt == 1 else "head CRC mismatch"}
    assert [(r.index, r.batch_pos) for r in rows] == want(entries, fmt)


@both
def test_broken_framing_is_a_problem_and_reading_resumes_at_the_next_good_entry(fmt):
    entries = log(10)
    data = one_segment(entries, fmt)
    at = offsets(data)
    data[at[3] + 5] ^= 0xFF  # magic of entry 3
    rows = columns_agree(data)
    (p,) = [r for r in rows if r.kind == "problem"]
    assert p.phys_offset == at[3] and p.size == at[4] - at[3] and "bad magic" in p.problem
    assert [r.index for r in firsts(rows)] == list(range(10))
    (lost,) = [r for r in entries_of(rows) if not r.crc_ok]
    assert (lost.index, lost.term, lost.batch_pos, lost.problem) == (3, None, None, "lost in a damaged region")
    assert [(r.index, r.batch_pos) for r in entries_of(rows) if r.crc_ok] == want(entries[:3] + entries[4:], fmt)


@both
def test_truncated_copy_reports_where_it_stops(fmt):
    entries = log(10)
    data = one_segment(entries, fmt)
    at6 = offsets(data)[6]
    rows = columns_agree(data[:at6 + 20])
    assert [(r.index, r.batch_pos) for r in entries_of(rows)] == want(entries[:6], fmt)
    (p,) = [r for r in rows if r.kind == "problem"]
    assert p.phys_offset == at6 and "truncated" in p.problem


@both
def test_a_bad_first_entry_takes_its_index_from_the_next(fmt):
    data = one_segment([E(100 + i, 2) for i in range(4)], fmt)
    data[40] ^= 0x10  # inside entry 100's header (TLE1: its queue offset; TLE2: base_queue_offset)
    rows = columns_agree(data)
    assert [(r.index, r.crc_ok) for r in firsts(rows)] == [(100, False), (101, True), (102, True), (103, True)]
    assert {r.index for r in rows if not r.crc_ok} == {100}


@both
def test_columns_fast_path_agrees_with_the_row_reader(fmt):
    clean = one_segment(log(50, term=2, keys=("a", "b")), fmt)
    damaged = bytearray(clean)
    damaged[offsets(clean)[7] + 100] ^= 0x01
    for data in (clean, damaged):
        columns_agree(data)
    assert all(read_columns(bytes(clean), 0)["crc_ok"]) and not all(read_columns(bytes(damaged), 0)["crc_ok"])
    assert read_columns(bytes(clean), 0)["batch_pos"] == [k for e in log(50) for k in range(e.records(fmt))]


def test_a_batch_whose_records_cannot_be_framed_is_one_row_and_its_neighbours_keep_their_indexes():
    """A record_size that lies (its CRCs made good again, so only the framing can tell): the
    batch is one row with batch_pos NULL and the reason; the walk goes on at its end."""
    entries = [E(i, 1, count=3) for i in range(8)]
    data = one_segment(entries, 2)
    at5 = offsets(data)[5]
    size = struct.unpack_from(">I", data, at5)[0]
    rec0 = at5 + codec.BATCH_TOPIC_AT + len("orders")
    struct.pack_into(">I", data, rec0, struct.unpack_from(">I", data, rec0)[0] + 1)
    struct.pack_into(">I", data, at5 + 52, zlib.crc32(data[at5 + 56:at5 + size]))  # records_crc
    struct.pack_into(">I", data, at5 + 8, zlib.crc32(data[at5 + 12:at5 + 56]))  # head_crc
    rows = columns_agree(data)
    (bad,) = [r for r in rows if r.problem]
    assert (bad.kind, bad.index, bad.batch_pos, bad.crc_ok, bad.phys_offset, bad.size) == \
        ("entry", 5, None, False, at5, size)
    assert bad.problem.startswith("records cannot be framed: framing: record 0 of 3")
    assert [(r.index, r.batch_pos) for r in rows] == [(i, k) for i in range(5) for k in range(3)] + [(5, None)] + \
        [(i, k) for i in (6, 7) for k in range(3)]
    assert all(r.crc_ok for r in rows if r.index != 5)


def test_a_batch_with_a_lying_record_and_a_bad_crc_says_both():
    data = one_segment([E(i, 1, count=2) for i in range(4)], 2)
    at1 = offsets(data)[1]
    data[at1 + codec.BATCH_TOPIC_AT + len("orders") + 3] ^= 0x40  # record 0's size
    rows = columns_agree(data)
    (bad,) = [r for r in rows if not r.crc_ok]
    assert bad.index == 1 and bad.batch_pos is None
    assert "records cannot be framed" in bad.problem and "records CRC mismatch" in bad.problem


def test_a_log_written_across_the_upgrade_reads_both_formats_and_resyncs_on_either_magic():
    entries = [E(i, 1, format=1 if i < 5 else 2) for i in range(10)]
    data = one_segment(entries, 1)
    at = offsets(data)
    rows = columns_agree(data)
    assert [(r.index, r.batch_pos) for r in rows] == want(entries, 1) and all(r.crc_ok for r in rows)
    assert len(rows) > 10  # some batches hold several
    for broken, nxt in ((4, 5), (6, 7)):  # TLE1 followed by TLE2; TLE2 by TLE2
        damaged = bytearray(data)
        damaged[at[broken] + 6] ^= 0xFF
        rows = columns_agree(damaged)
        (p,) = [r for r in rows if r.kind == "problem"]
        assert p.phys_offset == at[broken] and p.size == at[nxt] - at[broken]
        assert [r.index for r in firsts(rows)] == list(range(10))
