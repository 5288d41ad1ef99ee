"""codec.walk: the one rule for walking CommitLog bytes (entries, end-of-segment markers, zero
fill, partial and corrupt entries)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.store import codec

READS = ("entry", "header", "meta", "frame")


def raw_entry(i: int, phys: int, body: bytes = b"x" * 10, topic: bytes = b"t", props: bytes = b"") -> bytes:
    return codec.encode(i, 1, phys, i, 5, 6, i.to_bytes(16, "big"), 0, 0, topic, props, body)


def layout(bodies, base=0, fill=64, seg_end=None):
    """Entries with the given bodies from offset `base`, then a marker to `seg_end` (if any),
    then `fill` zero bytes. Returns (buf, [entry offsets], marker offset or None)."""
    out, offs = bytearray(), []
    for i, b in enumerate(bodies):
        offs.append(base + len(out))
        out += raw_entry(i, base + len(out), b)
    marker = None
    if seg_end is not None:
        marker = len(out)
        out += codec.encode_blank(seg_end - len(out))
        out += bytes(seg_end - len(out))
    return bytes(out) + bytes(fill), offs, marker


def items(w):
    return [(p, it) for p, it in w]


@pytest.mark.parametrize("read", READS)
def test_entries_then_zero_fill_end(read):
    buf, offs, _ = layout([b"a" * n for n in (0, 5, 300)])
    w = codec.walk(buf, read=read, base=0)
    got = items(w)
    assert [p for p, _ in got] == offs
    assert w.stop.kind == codec.END and w.stop.pos == offs[-1] + codec.HEADER_SIZE + 1 + 300
    if read == "entry":
        assert [e.body for _, e in got] == [b"", b"a" * 5, b"a" * 300]


@pytest.mark.parametrize("read", READS)
def test_marker_stops_with_its_size(read):
    buf, offs, marker = layout([b"a"] * 3, fill=0, seg_end=1000)
    w = codec.walk(buf, read=read, segment_end=1000)
    assert [p for p, _ in w] == offs
    assert w.stop == codec.Stop(codec.MARKER, marker, 1000 - marker)


def test_marker_of_the_wrong_size_is_corrupt_when_the_segment_end_is_known():
    buf, _, marker = layout([b"a"], fill=0, seg_end=500)
    assert codec.walk(buf).__iter__() is not None
    w = codec.walk(buf, segment_end=600)
    list(w)
    assert w.stop.kind == codec.CORRUPT and w.stop.pos == marker and "marker" in w.stop.reason
    w = codec.walk(buf)  # segment end unknown: the marker's own size says where it ends
    list(w)
    assert w.stop == codec.Stop(codec.MARKER, marker, 500 - marker)


@pytest.mark.parametrize("read", READS)
def test_partial_entry_says_how_many_bytes_it_needs(read):
    buf, offs, _ = layout([b"a" * 50, b"b" * 50], fill=0)
    w = codec.walk(buf, 0, len(buf) - 7, read=read)
    assert [p for p, _ in w] == offs[:1]
    assert w.stop == codec.Stop(codec.PARTIAL, offs[1], len(buf) - offs[1])
    w = codec.walk(buf, 0, offs[1] + 5, read=read)  # not even size and magic
    list(w)
    assert w.stop == codec.Stop(codec.PARTIAL, offs[1], codec.BLANK_SIZE_MIN)


def test_entry_that_would_not_leave_room_for_the_marker_is_corrupt():
    buf, offs, _ = layout([b"a" * 50], fill=0)
    w = codec.walk(buf, segment_end=len(buf) + 4)
    list(w)
    assert w.stop.kind == codec.CORRUPT and w.stop.pos == 0 and "impossible" in w.stop.reason
    w = codec.walk(buf, segment_end=len(buf) + 4, read="meta")
    list(w)
    assert w.stop.kind == codec.CORRUPT


def test_segment_without_room_for_a_marker_is_corrupt():
    buf, offs, _ = layout([b"a" * 50], fill=4)
    w = codec.walk(buf, len(buf) - 4, segment_end=len(buf))
    assert [p for p, _ in w] == []
    assert w.stop.kind == codec.CORRUPT and "without an end-of-segment marker" in w.stop.reason


@pytest.mark.parametrize("read", READS)
def test_mid_entry_start_is_corrupt(read):
    buf, offs, _ = layout([b"a" * 50, b"b" * 50])
    w = codec.walk(buf, offs[0] + 20, read=read)
    assert items(w) == []
    assert w.stop.kind == codec.CORRUPT and w.stop.pos == offs[0] + 20


def test_crc_and_misplaced_entries_are_corrupt_where_read_checks_them():
    buf, offs, _ = layout([b"a" * 50, b"b" * 50])
    bad = bytearray(buf)
    bad[offs[1] + codec.HEADER_SIZE + 3] ^= 1  # a body byte of the second entry
    for read in ("entry", "header"):
        w = codec.walk(bad, read=read)
        assert [p for p, _ in w] == offs[:1]
        assert w.stop == codec.Stop(codec.CORRUPT, offs[1], 0, "CRC mismatch")
        w = codec.walk(bad, read=read, verify=False)
        assert [p for p, _ in w] == offs and w.stop.kind == codec.END
    for read in ("meta", "frame"):  # framing only
        w = codec.walk(bad, read=read)
        assert [p for p, _ in w] == offs
    w = codec.walk(buf, base=100)  # the entries name offsets 0.., not 100..
    list(w)
    assert w.stop.kind == codec.CORRUPT and "names offset" in w.stop.reason
    w = codec.walk(buf, base=100, read="header")
    list(w)
    assert w.stop.kind == codec.CORRUPT and "names offset" in w.stop.reason


def test_size_max():
    buf, offs, _ = layout([b"a" * 50, b"b" * 500])
    for read in READS:
        w = codec.walk(buf, read=read, size_max=200)
        assert [p for p, _ in w] == offs[:1]
        assert w.stop.kind == codec.CORRUPT and w.stop.pos == offs[1]


# --- properties --------------------------------------------------------------------------

bodies_st = st.lists(st.binary(max_size=300), max_size=12)
topics_st = st.sampled_from([b"t", b"topic", "t\u00e9".encode()])


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=bodies_st, topic=topics_st, base=st.integers(0, 1 << 40), marker=st.booleans(),
       slack=st.integers(codec.BLANK_SIZE_MIN, 200), fill=st.integers(8, 100),
       read=st.sampled_from(READS))
def test_valid_entries_marker_and_zero_fill_walk_back_exactly(bodies, topic, base, marker, slack,
                                                              fill, read):
    out, want = bytearray(), []
    for i, b in enumerate(bodies):
        raw = codec.encode(i, 2, base + len(out), i, 3, 4, b"m" * 16, 1, 0, topic,
                           codec.message_properties(keys=f"k{i}"), b)
        want.append((len(out), codec.decode(raw, 0)))
        out += raw
    seg_end = len(out) + slack if marker else None
    end_at = len(out)
    if marker:
        out += codec.encode_blank(slack) + bytes(slack - codec.BLANK_SIZE_MIN)
    else:
        out += bytes(fill)
    w = codec.walk(bytes(out), base=base, segment_end=seg_end, read=read)
    got = list(w)
    assert [p for p, _ in got] == [p for p, _ in want]
    if read == "entry":
        assert [e for _, e in got] == [e for _, e in want]
    elif read == "frame":
        assert [n for _, n in got] == [e.size for _, e in want]
    elif read == "header":
        assert [h[3] for _, h in got] == list(range(len(bodies)))
    else:
        assert [m[0] for _, m in got] == [e.size for _, e in want]
    if marker:
        assert w.stop == codec.Stop(codec.MARKER, end_at, slack)
    else:
        assert w.stop == codec.Stop(codec.END, end_at)
    # every prefix of the bytes: the same entries that fit, then PARTIAL (or the real stop)
    cut = end_at - 1 if end_at else 0
    w = codec.walk(bytes(out), 0, cut, read=read)
    got = list(w)
    assert all(p + (e if read == "frame" else e[0]) <= cut for p, e in got) if read != "entry" else True
    assert w.stop.kind in (codec.PARTIAL, codec.END)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=400), pos=st.integers(0, 50), read=st.sampled_from(READS),
       verify=st.booleans(), seg=st.one_of(st.none(), st.integers(0, 500)),
       base=st.one_of(st.none(), st.integers(0, 1000)))
def test_arbitrary_bytes_end_in_a_stop_and_never_raise(data, pos, read, verify, seg, base):
    pos = min(pos, len(data))
    w = codec.walk(data, pos, read=read, verify=verify, segment_end=seg, base=base)
    last = pos
    for p, _ in w:
        assert p >= last
        last = p
    assert isinstance(w.stop, codec.Stop)
    assert w.stop.kind in (codec.END, codec.MARKER, codec.PARTIAL, codec.CORRUPT)
    assert pos <= w.stop.pos <= len(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(bodies=st.lists(st.binary(max_size=120), min_size=1, max_size=6),
       flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(1, 255)), min_size=1, max_size=4))
def test_damaged_logs_end_in_a_stop_and_keep_the_good_prefix(bodies, flips):
    buf, offs, _ = layout(bodies, fill=32)
    bad = bytearray(buf)
    first = len(bad)
    for at, x in flips:
        at %= len(bad)
        bad[at] ^= x
        first = min(first, at)
    w = codec.walk(bytes(bad))
    got = list(w)
    # every entry that ends before the first damaged byte is read back
    assert [p for p, _ in got][:sum(1 for k, o in enumerate(offs) if o + codec.HEADER_SIZE + 1 + len(bodies[k]) <= first)] \
        == [o for k, o in enumerate(offs) if o + codec.HEADER_SIZE + 1 + len(bodies[k]) <= first]
    assert w.stop.kind in (codec.END, codec.MARKER, codec.PARTIAL, codec.CORRUPT)
