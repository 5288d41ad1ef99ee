"""broker/kafka/records.py: RecordBatch v2 round trips under every codec, and every malformed
batch is refused with the Kafka error a client expects (never another exception)."""

import random
import struct

import pytest
from hypothesis import given, settings, strategies as st

from crc32c import crc32c

from broker.kafka import records as kr

recs = st.lists(st.builds(lambda k, v, hs: (k, v, hs),
                          st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=60)),
                          st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))),
                                   max_size=3)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(recs, st.sampled_from(sorted(kr.CODECS)), st.integers(0, 2**40))
def test_round_trip_under_every_codec(items, codec, ts):
    rs = [kr.Record(i, i * 3, k, v, hs) for i, (k, v, hs) in enumerate(items)]
    data = kr.encode(rs, base_timestamp=ts, producer_id=7, producer_epoch=1, base_sequence=40, compression=codec)
    [b] = kr.split(data)
    assert (b.head.records_count, b.head.compression, b.head.producer_id, b.head.base_sequence) == (len(rs), codec, 7, 40)
    assert list(kr.records(b)) == rs
    buf = bytearray(data)
    kr.place(buf, 1234, 5)  # outside the CRC: still valid
    [b2] = kr.split(buf)
    assert (b2.head.base_offset, b2.head.partition_leader_epoch) == (1234, 5)


def test_malformed_batches_get_kafka_codes():
    good = kr.encode([kr.Record(0, 0, b"k", b"v", [])])
    bad_crc = bytearray(good)
    bad_crc[-1] ^= 1
    old_magic = bytearray(good)
    old_magic[16] = 1
    for data, code in [(bad_crc, kr.CORRUPT_MESSAGE), (old_magic, kr.UNSUPPORTED_FOR_MESSAGE_FORMAT),
                       (good[:40], kr.CORRUPT_MESSAGE), (good + good[:50], kr.CORRUPT_MESSAGE)]:
        with pytest.raises(kr.InvalidRecord) as e:
            kr.split(bytes(data))
        assert e.value.code == code, (data, e.value)


@settings(max_examples=1500, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.integers(0, 2**32))
def test_damaged_records_are_refused_by_name(junk, seed):
    """A batch whose CRC was recomputed over damaged records: the records reader refuses it
    with InvalidRecord, whatever the damage."""
    rng = random.Random(seed)
    base = bytearray(kr.encode([kr.Record(i, i, b"key%d" % i, b"v" * i, [("h", b"x")]) for i in range(3)]))
    body = base[kr.HEAD_SIZE:]
    for _ in range(rng.randint(1, 4)):
        at = rng.randrange(len(body))
        body[at:at + 1] = junk[:rng.randint(0, 3)]
    tail = bytes(base[kr.CRC_FROM:kr.HEAD_SIZE]) + bytes(body)
    batch = struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc32c(tail)) + tail
    try:
        for b in kr.split(batch):
            list(kr.records(b))
    except kr.InvalidRecord as e:
        assert e.code in (kr.CORRUPT_MESSAGE, kr.INVALID_RECORD), e
