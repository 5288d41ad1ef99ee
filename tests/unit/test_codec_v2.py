"""Codec v2, the record batch (TLE2): docs/design/batch-format.md §5 and step 1.

Round trips, single-bit corruption, truncation at every length, mixed TLE1/TLE2 walks,
peek_ids on both formats, the encoder's limits. Hypothesis prints the failing example and a
reproduction blob (print_blob) on failure; `--hypothesis-seed=N` replays a run.
"""

from __future__ import annotations

import zlib

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

from broker.store import codec
from broker.store.codec import BatchRecord

PROPS = settings(max_examples=150, deadline=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ = settings(max_examples=400, deadline=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow])

WALK2_READS = ("head", "messages", "meta", "frame")
BOTH_OK = (codec.END, codec.MARKER)

# --- strategies ----------------------------------------------------------------------------

word = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc")), min_size=1, max_size=8)
props_st = st.builds(
    lambda keys, tags, user: codec.message_properties(keys=keys or None, tags=tags, user=user),
    st.lists(word, max_size=3), st.one_of(st.none(), word.filter(lambda t: "||" not in t)),
    st.dictionaries(word.filter(lambda n: n not in (codec.PROP_KEYS, codec.PROP_TAGS)), word, max_size=3))
record_st = st.builds(BatchRecord, st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                      st.binary(min_size=16, max_size=16), props_st, st.binary(max_size=4096))
topic_st = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=40).filter(
    lambda t: len(t.encode()) <= codec.TOPIC_BYTES_MAX)
u64 = st.integers(0, 2**63)


def rec(i: int, body: bytes = b"b", props: bytes = b"") -> BatchRecord:
    return BatchRecord(i, 1_700_000_000_000 + i, i.to_bytes(16, "big"), props, body)


def batch(index=7, phys=4096, n=3, topic="orders", qid=2, base_qoff=100, body=b"payload"):
    return codec.encode_batch(index, 3, phys, base_qoff, 1_700_000_000_123, topic, qid,
                              [rec(i, body * (i + 1), codec.message_properties(keys=f"k{i}"))
                               for i in range(n)])


def tle1(index=7, phys=4096, body=b"hello", qoff=11):
    return codec.encode(index, 3, phys, qoff, 1_700_000_000_000, 1_699_999_999_000,
                        bytes(range(16)), 2, 0x5, b"orders", codec.message_properties(keys="a"), body)


# --- layout and round trip -----------------------------------------------------------------


def test_layout_is_what_the_docstring_says():
    raw = batch()
    size, magic, head_crc = codec.PREFIX.unpack_from(raw)
    assert size == len(raw) and magic == codec.BATCH_MAGIC and raw[4:8] == b"TLE2"
    assert head_crc == zlib.crc32(raw[12:56])  # the broker-assigned fields and records_crc
    records_crc = int.from_bytes(raw[52:56], "big")
    assert records_crc == zlib.crc32(raw[56:])  # the producer's part, to the end
    assert [int.from_bytes(raw[a:a + 8], "big") for a in (12, 20, 28, 36, 44)] == \
        [7, 3, 4096, 100, 1_700_000_000_123]
    assert int.from_bytes(raw[56:58], "big") == 0 and int.from_bytes(raw[58:60], "big") == 3
    assert int.from_bytes(raw[60:64], "big") == 2 and raw[64] == 6 and raw[65:71] == b"orders"
    assert int.from_bytes(raw[71:75], "big") == codec.RECORD_SIZE + len(
        codec.message_properties(keys="k0")) + len(b"payload")
    # the first 52 bytes mean what TLE1's mean: peek and peek_ids read both alike
    assert codec.BATCH_HEAD_SIZE == 56 and codec.RECORD_SIZE == 38 and codec.BATCH_SIZE_MIN == 104


def test_head_and_zone_make_the_entry_for_a_gathering_write():
    recs = [rec(0), rec(1, b"")]
    zone, crc = codec.encode_zone("t", 9, recs)
    head = codec.encode_head(1, 2, 3, 4, 5, crc, len(zone))
    assert len(head) == codec.BATCH_HEAD_SIZE and crc == zlib.crc32(zone)
    assert head + zone == codec.encode_batch(1, 2, 3, 4, 5, b"t", 9, recs)
    assert [r.rel for r in codec.walk_records(zone)] == [10, 10 + 39]


@PROPS
@given(records=st.lists(record_st, min_size=1, max_size=64), topic=topic_st,
       qid=st.integers(0, 2**32 - 1), index=u64, term=u64, phys=u64, base_qoff=u64, ts=u64)
def test_round_trip_and_every_message_field(records, topic, qid, index, term, phys, base_qoff, ts):
    raw = codec.encode_batch(index, term, phys, base_qoff, ts, topic, qid, records)
    b = codec.decode_batch(raw, base_offset=phys)
    assert b == codec.Batch(index, term, phys, base_qoff, ts, qid, topic, tuple(records), len(raw),
                            zlib.crc32(raw[56:]))
    h = codec.check_batch(raw)
    assert (h.size, h.index, h.count, h.queue_id) == (len(raw), index, len(records), qid)
    msgs = list(codec.iter_messages(raw))
    assert len(msgs) == len(records)
    for k, (m, r) in enumerate(zip(msgs, records)):
        assert (m.index, m.term, m.phys_offset, m.store_ts_ms, m.size) == (index, term, phys, ts, len(raw))
        assert (m.queue_offset, m.batch_pos, m.queue_id, m.topic) == (base_qoff + k, k, qid, topic)
        assert (m.flags, m.born_ts_ms, m.msg_id, m.properties, m.body) == tuple(r)
        assert m.keys == codec.keys_of(r.properties) and m.tags == codec.tag_of(r.properties)
    assert codec.peek_ids(raw) == (index, term, phys)
    assert codec.peek(raw) == (len(raw), codec.BATCH_MAGIC)


def test_a_tle1_entry_reads_as_a_batch_of_one():
    raw = tle1()
    e = codec.decode(raw)
    (m,) = codec.iter_messages(raw)
    assert tuple(m) == tuple(e) + (0,) and m.batch_pos == 0 and m.keys == ["a"]
    ((_, h),) = list(codec.walk2(raw))
    assert (h.size, h.index, h.term, h.phys_offset, h.base_queue_offset, h.count, h.queue_id) == \
        (len(raw), 7, 3, 4096, 11, 1, 2)
    ((_, meta),) = list(codec.walk2(raw, read="meta"))
    assert meta == codec.BatchMeta(len(raw), codec.ENTRY_MAGIC, 4096, 11, 1_700_000_000_000, 1, 2, 6,
                                   codec.HEADER_SIZE)
    assert raw[meta.topic_at:meta.topic_at + meta.topic_len] == b"orders"


def test_iter_messages_from_a_queue_offset_inside_a_batch():
    buf = tle1(index=1, phys=0, qoff=99) + batch(index=2, phys=len(tle1()), n=5, base_qoff=100)
    got = [(m.index, m.queue_offset, m.batch_pos) for m in codec.iter_messages(buf, from_queue_offset=102)]
    assert got == [(2, 102, 2), (2, 103, 3), (2, 104, 4)]
    assert [m.queue_offset for m in codec.iter_messages(buf)] == list(range(99, 105))


# --- corruption and truncation -------------------------------------------------------------

REASONS = ("head CRC", "records CRC", "framing")


def _flip(raw: bytes, bit: int) -> bytes:
    bad = bytearray(raw)
    bad[bit // 8] ^= 1 << (bit % 8)
    return bytes(bad)


def _assert_refused(bad: bytes, bit: int):
    with pytest.raises(codec.CorruptEntry) as ei:
        codec.check_batch(bad)
    assert any(r in ei.value.reason for r in REASONS), (bit, ei.value.reason)
    with pytest.raises(codec.CorruptEntry):
        list(codec.iter_messages(bad))
    for read in ("head", "messages"):
        w = codec.walk2(bad + bytes(16), read=read)
        assert list(w) == [] and w.stop.kind in (codec.CORRUPT, codec.PARTIAL), (bit, read, w.stop)


def test_every_single_bit_flip_in_a_small_batch_is_refused():
    raw = batch(n=2, body=b"ab")
    for bit in range(8 * 8, 8 * len(raw)):
        _assert_refused(_flip(raw, bit), bit)


@PROPS
@given(records=st.lists(record_st, min_size=1, max_size=8), topic=topic_st, data=st.data())
def test_any_single_bit_flip_from_offset_8_is_refused(records, topic, data):
    raw = codec.encode_batch(5, 1, 0, 0, 9, topic, 0, records)
    bit = data.draw(st.integers(64, 8 * len(raw) - 1), label="bit")
    _assert_refused(_flip(raw, bit), bit)


def test_without_verify_the_framing_still_names_a_lie():
    raw = bytearray(batch(n=2))
    first = codec.BATCH_TOPIC_AT + 6
    raw[first + 3] ^= 1  # record 0's size, its CRCs recomputed: only the framing can tell
    zone = bytes(raw[56:])
    fixed = codec.encode_head(7, 3, 4096, 100, 1, zlib.crc32(zone), len(zone)) + zone
    codec.check_batch(fixed)  # the CRCs and the head hold...
    with pytest.raises(codec.CorruptEntry, match="framing: record 0"):
        codec.decode_batch(fixed)
    with pytest.raises(codec.CorruptEntry, match="framing"):
        codec.walk_records(zone)
    w = codec.walk2(fixed)
    assert list(w) == [] and w.stop.kind == codec.CORRUPT and "framing" in w.stop.reason


@pytest.mark.parametrize("zone_fix,reason", [
    (lambda z: z[:2] + (0).to_bytes(2, "big") + z[4:], "0 records"),
    (lambda z: (1).to_bytes(2, "big") + z[2:], "compression"),
    (lambda z: (0x200).to_bytes(2, "big") + z[2:], "reserved attribute"),
    (lambda z: (0x100).to_bytes(2, "big") + z[2:], "Kafka batch of magic"),  # (ATTR_KAFKA, native records)
    (lambda z: z[:8] + b"\x00" + z[9:], "topic length"),
    (lambda z: z[:2] + (9).to_bytes(2, "big") + z[4:], "cannot fit"),
    (lambda z: z[:2] + (2).to_bytes(2, "big") + z[4:], "record 1 of 2"),
    (lambda z: z + b"x", "end at"),
])
def test_zone_head_lies_are_framing_errors(zone_fix, reason):
    zone = zone_fix(codec.encode_zone("t", 0, [rec(0, b"b" * 50)])[0])
    raw = codec.encode_head(1, 1, 0, 0, 0, zlib.crc32(zone), len(zone)) + zone
    with pytest.raises(codec.CorruptEntry, match=reason):
        codec.decode_batch(raw)


def test_truncation_at_every_length_is_partial_or_corrupt():
    for raw in (batch(n=3), tle1()):
        for cut in range(len(raw)):
            part = raw[:cut]
            for read in WALK2_READS:
                w = codec.walk2(part, read=read)
                assert list(w) == [] and w.stop.kind in (codec.PARTIAL, codec.END), (cut, read, w.stop)
                w = codec.walk2(part, segment_end=cut + 8 if cut % 2 else None, read=read)
                list(w)
                assert w.stop.kind in (codec.PARTIAL, codec.CORRUPT, codec.END), (cut, read, w.stop)
            with pytest.raises(codec.CorruptEntry):
                list(codec.iter_messages(part)) if cut else codec.check_batch(part)
            if raw[4:8] == b"TLE2":
                with pytest.raises(codec.CorruptEntry):
                    codec.check_batch(part)


@FUZZ
@given(data=st.binary(max_size=400), pos=st.integers(0, 50), read=st.sampled_from(WALK2_READS),
       verify=st.booleans(), seg=st.one_of(st.none(), st.integers(0, 500)),
       base=st.one_of(st.none(), st.integers(0, 1000)), magic=st.booleans())
@example(data=batch()[:200], pos=0, read="head", verify=True, seg=None, base=None, magic=False)
def test_arbitrary_bytes_walk2_ends_in_a_stop_and_never_raises(data, pos, read, verify, seg, base, magic):
    if magic and len(data) >= 8:  # steer the fuzzer into TLE2 parsing
        data = data[:4] + b"TLE2" + data[8:]
    pos = min(pos, len(data))
    w = codec.walk2(data, pos, read=read, verify=verify, segment_end=seg, base=base)
    for _ in w:
        pass
    assert w.stop.kind in (codec.END, codec.MARKER, codec.PARTIAL, codec.CORRUPT)
    assert pos <= w.stop.pos <= len(data)
    for fn in (codec.check_batch, codec.decode_batch, codec.walk_records,
               lambda d: list(codec.iter_messages(d))):
        try:
            fn(data)
        except codec.CorruptEntry:
            pass


# --- walking mixed logs --------------------------------------------------------------------


def mixed_log(kinds, base=0):
    """Entries of the given kinds ('1': TLE1, digit n >= 2: a TLE2 batch of n) laid out from
    `base`, with consecutive indexes and queue offsets. Returns (buf, [(offset, bytes)])."""
    out, parts, index, qoff = bytearray(), [], 0, 0
    for k in kinds:
        phys = base + len(out)
        if k == 1:
            raw = codec.encode(index, 1, phys, qoff, 5, 6, index.to_bytes(16, "big"), 0, 0, b"t",
                               b"", b"x" * (index % 7))
            qoff += 1
        else:
            raw = codec.encode_batch(index, 1, phys, qoff, 5, "t", 0, [rec(i) for i in range(k)])
            qoff += k
        parts.append((len(out), raw))
        out += raw
        index += 1
    return bytes(out), parts


@PROPS
@given(kinds=st.lists(st.integers(1, 5), max_size=12), base=st.integers(0, 1 << 40),
       marker=st.booleans(), slack=st.integers(codec.BLANK_SIZE_MIN, 100), read=st.sampled_from(WALK2_READS))
def test_mixed_tle1_tle2_buffers_walk_as_each_entry_alone(kinds, base, marker, slack, read):
    buf, parts = mixed_log(kinds, base)
    seg_end = len(buf) + slack if marker else None
    tail = codec.encode_blank(slack) + bytes(slack - 8) if marker else bytes(slack)
    w = codec.walk2(buf + tail, base=base, segment_end=seg_end, read=read)
    got = list(w)
    alone = []
    for off, raw in parts:
        w1 = codec.walk2(raw, base=base + off, read=read)
        ((p, item),) = list(w1)
        assert p == 0 and w1.stop == codec.Stop(codec.PARTIAL, len(raw), codec.BLANK_SIZE_MIN)
        alone.append((off, item))
    assert got == alone
    assert w.stop == (codec.Stop(codec.MARKER, len(buf), slack) if marker else codec.Stop(codec.END, len(buf)))
    if read == "messages":
        flat = [m for _, ms in got for m in ms]
        assert flat == list(codec.iter_messages(buf))
        assert [m.queue_offset for m in flat] == list(range(sum(kinds)))
    if read == "meta":
        assert [m.count for _, m in got] == kinds


def test_walk2_agrees_with_walk_on_tle1_logs():
    buf, parts = mixed_log([1] * 6, base=1000)
    buf += bytes(32)
    old = [(p, h) for p, h in codec.walk(buf, base=1000, read="header")]
    new = list(codec.walk2(buf, base=1000))
    assert [p for p, _ in old] == [p for p, _ in new]
    assert [(h[0], h[3], h[4], h[5], h[6]) for _, h in old] == \
        [(h.size, h.index, h.term, h.phys_offset, h.base_queue_offset) for _, h in new]
    old_w, new_w = codec.walk(buf), codec.walk2(buf)
    list(old_w), list(new_w)
    assert old_w.stop == new_w.stop
    assert [n for _, n in codec.walk(buf, read="frame")] == [n for _, n in codec.walk2(buf, read="frame")]


def test_todays_walk_and_classify_still_stop_at_tle2_as_a_bad_magic():
    buf, parts = mixed_log([1, 3, 1])
    w = codec.walk(buf)
    assert [p for p, _ in w] == [0]
    assert w.stop == codec.Stop(codec.CORRUPT, parts[1][0], 0, f"bad magic 0x{codec.BATCH_MAGIC:08x}")
    assert codec.classify(buf, parts[1][0], len(buf)).kind == codec.CORRUPT
    assert codec.classify2(buf, parts[1][0], len(buf)) is None
    with pytest.raises(codec.CorruptEntry, match="bad magic"):
        codec.check(parts[1][1])
    with pytest.raises(codec.CorruptEntry, match="bad magic"):
        codec.check_batch(parts[0][1])


def test_walk2_rules_for_tle2_sizes_and_places():
    raw = batch(phys=0)
    short = (codec.BATCH_SIZE_MIN - 1).to_bytes(4, "big") + raw[4:]
    w = codec.walk2(short)
    list(w)
    assert w.stop.kind == codec.CORRUPT and "impossible" in w.stop.reason
    for read in WALK2_READS:
        w = codec.walk2(raw + bytes(8), read=read, size_max=len(raw) - 1)
        assert list(w) == [] and w.stop.kind == codec.CORRUPT
        w = codec.walk2(raw, read=read, segment_end=len(raw) + 4)  # no room for the marker
        assert list(w) == [] and w.stop.kind == codec.CORRUPT
    w = codec.walk2(raw, base=64)
    assert list(w) == [] and "names offset 0, found at 64" in w.stop.reason
    w = codec.walk2(_flip(raw, 8 * 60), verify=False)  # queue_id: no framing rule covers it
    assert len(list(w)) == 1
    with pytest.raises(ValueError, match="read="):
        codec.walk2(raw, read="entry")


@pytest.mark.parametrize("which", ["tle1", "tle2"])
def test_peek_ids_agrees_on_both_formats(which):
    raw = tle1(index=42, phys=8192) if which == "tle1" else batch(index=42, phys=8192)
    assert codec.peek_ids(raw) == (42, 3, 8192)
    assert codec.peek(raw) == (len(raw), codec.ENTRY_MAGIC if which == "tle1" else codec.BATCH_MAGIC)
    ((_, h),) = list(codec.walk2(raw, base=8192))
    assert codec.peek_ids(raw) == (h.index, h.term, h.phys_offset)


# --- the encoder's limits ------------------------------------------------------------------


@pytest.mark.parametrize("args,field", [
    (("t", 0, []), "count"),
    (("t", 0, [rec(0, b"")] * (codec.BATCH_COUNT_MAX + 1)), "count"),
    (("x" * (codec.TOPIC_BYTES_MAX + 1), 0, [rec(0)]), "topic"),
    (("é" * 64, 0, [rec(0)]), "topic"),
    (("", 0, [rec(0)]), "topic"),
    (("t", 2**32, [rec(0)]), "queue_id"),
    (("t", -1, [rec(0)]), "queue_id"),
    (("t", 0, [rec(0), rec(1, props=b"p" * (codec.PROPS_BYTES_MAX + 1))]), "record 1 properties"),
    (("t", 0, [BatchRecord(0, 0, b"short", b"", b"")]), "record 0 msg_id"),
    (("t", 0, [BatchRecord(2**32, 0, b"m" * 16, b"", b"")]), "record 0 flags"),
    (("t", 0, [BatchRecord(0, -1, b"m" * 16, b"", b"")]), "record 0 born_ts_ms"),
])
def test_encoder_refuses_what_the_layout_cannot_hold(args, field):
    with pytest.raises(codec.BatchLimitError) as ei:
        codec.encode_zone(*args)
    assert isinstance(ei.value, ValueError) and ei.value.field == field and "limit" in str(ei.value)


def test_limits_at_their_edges_are_accepted():
    zone, _ = codec.encode_zone("x" * codec.TOPIC_BYTES_MAX, 2**32 - 1,
                                [rec(0, props=b"p" * codec.PROPS_BYTES_MAX)])
    assert len(codec.walk_records(zone)) == 1
    zone, _ = codec.encode_zone("t", 0, [rec(0, b"")] * codec.BATCH_COUNT_MAX)
    assert len(codec.walk_records(zone)) == codec.BATCH_COUNT_MAX
    with pytest.raises(codec.BatchLimitError, match="index"):
        codec.encode_head(-1, 0, 0, 0, 0, 0, 100)
    with pytest.raises(codec.BatchLimitError, match="records_crc"):
        codec.encode_head(0, 0, 0, 0, 0, 2**32, 100)
