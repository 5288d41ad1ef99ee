"""The reconcile job's segment reader on crafted segments: good, a flipped byte (CRC), broken
framing (resync), a truncated copy."""

from __future__ import annotations

from broker.store import codec
from spark_jobs.craft import E, encode_log, log
from spark_jobs.segment_reader import read_segment

SEG = 1 << 16


def one_segment(entries) -> bytearray:
    (seg,) = encode_log(entries, SEG)
    return seg[1]


def entries_of(rows):
    return [r for r in rows if r.kind == "entry"]


def test_clean_segment_reads_every_entry_with_its_fields():
    data = one_segment(log(10, term=3, keys=("k1", "k2")))
    rows = read_segment(bytes(data), 0)
    assert [r.index for r in rows] == list(range(10)) and all(r.crc_ok and r.term == 3 for r in rows)
    assert rows[4].keys == ["k1", "k2"] and rows[4].topic == "orders" and rows[4].queue_offset == 4
    assert rows[1].phys_offset == rows[0].size and all(r.problem is None for r in rows)


def test_segments_roll_with_a_marker_and_each_reads_alone():
    segs = encode_log(log(2000), SEG)
    assert len(segs) > 1
    got = [r.index for base, data in segs for r in read_segment(bytes(data), base)]
    assert got == list(range(2000))


def test_flipped_byte_is_a_bad_crc_row_with_its_index_from_its_neighbours():
    data = one_segment(log(10))
    e5 = codec.decode(data, sum(codec.decode(data, 0).size for _ in range(5)))
    data[e5.phys_offset + 12 + 7] ^= 0x01  # the low byte of the index field: index 5 -> 4
    rows = read_segment(bytes(data), 0)
    bad = [r for r in rows if not r.crc_ok]
    assert [r.index for r in bad] == [5] and bad[0].problem == "CRC mismatch"
    assert [r.index for r in rows] == list(range(10))


def test_broken_framing_is_a_problem_and_reading_resumes_at_the_next_good_entry():
    data = one_segment(log(10))
    size = codec.decode(data, 0).size
    data[3 * size + 5] ^= 0xFF  # magic of entry 3
    rows = read_segment(bytes(data), 0)
    (p,) = [r for r in rows if r.kind == "problem"]
    assert p.phys_offset == 3 * size and p.size == size and "bad magic" in p.problem
    ents = entries_of(rows)
    assert [r.index for r in ents] == list(range(10))
    (lost,) = [r for r in ents if not r.crc_ok]
    assert lost.index == 3 and lost.term is None and lost.problem == "lost in a damaged region"


def test_truncated_copy_reports_where_it_stops():
    data = one_segment(log(10))
    size = codec.decode(data, 0).size
    rows = read_segment(bytes(data[:6 * size + 20]), 0)
    assert [r.index for r in entries_of(rows)] == list(range(6))
    (p,) = [r for r in rows if r.kind == "problem"]
    assert p.phys_offset == 6 * size and "truncated" in p.problem


def test_a_bad_first_entry_takes_its_index_from_the_next():
    data = one_segment([E(100 + i, 2) for i in range(4)])
    data[40] ^= 0x10  # inside entry 100's header (store timestamp)
    rows = read_segment(bytes(data), 0)
    assert [(r.index, r.crc_ok) for r in rows] == [(100, False), (101, True), (102, True), (103, True)]


def test_columns_fast_path_agrees_with_the_row_reader():
    from spark_jobs.segment_reader import COLUMNS, read_columns

    clean = one_segment(log(50, term=2, keys=("a", "b")))
    damaged = bytearray(clean)
    damaged[codec.decode(clean, 0).size * 7 + 100] ^= 0x01
    for data in (clean, damaged):
        rows = read_segment(bytes(data), 0)
        cols = read_columns(bytes(data), 0)
        assert cols == {f: [r[i] for r in rows] for i, f in enumerate(COLUMNS)}
    assert all(read_columns(bytes(clean), 0)["crc_ok"]) and not all(read_columns(bytes(damaged), 0)["crc_ok"])
