"""broker/store/codec_kafka.py: a Kafka batch stored as a TLE2 zone reads back byte for byte,
as Tidelog messages under every codec, and damaged framing is a CorruptEntry."""

import pytest

from broker.kafka import records as kr
from broker.store import codec_kafka as ck
from broker.store.codec import CorruptEntry, Entry, crc32


@pytest.mark.parametrize("codec", sorted(kr.CODECS))
def test_a_stored_kafka_batch_reads_back(codec):
    recs = [kr.Record(0, 0, b"order-1", b"v0", [("trace", b"abc"), ("bin", b"\xff")]),
            kr.Record(1, 5, None, None, []), kr.Record(2, 9, b"has space", b"v2", [])]
    batch = kr.encode(recs, base_timestamp=1_700_000_000_000, producer_id=3, producer_epoch=0,
                      base_sequence=10, compression=codec)
    parts, crc, size = ck.encode_zone(b"orders", 2, batch)
    zone = b"".join(parts)
    assert len(zone) == size and crc32(zone) == crc
    z = ck.read_zone(zone)
    assert (z.count, z.queue_id, z.topic, z.producer_id, z.base_sequence) == (3, 2, "orders", 3, 10)
    assert bytes(ck.batch(zone)) == batch
    msgs = list(ck.messages(zone, 0, len(zone), phys_offset=4096))
    assert [m[1] for m in msgs] == [1_700_000_000_000, 1_700_000_000_005, 1_700_000_000_009]
    assert [m[4] for m in msgs] == [b"v0", b"", b"v2"]
    assert len({m[2] for m in msgs}) == 3 and all(len(m[2]) == 16 for m in msgs)
    props = [Entry(0, 0, 0, 0, 0, 0, m[2], 0, 0, "orders", m[3], m[4], 0).props() for m in msgs]
    assert props[0] == {"KEYS": "order-1", "h:trace": "abc"}  # (a header that is not UTF-8 is left out)
    assert props[1] == {} and props[2] == {}  # a key with a space cannot be a KEYS value


def test_damaged_framing_is_a_corrupt_entry():
    batch = kr.encode([kr.Record(0, 0, b"k", b"v", [])])
    zone = b"".join(ck.encode_zone(b"t", 0, batch)[0])
    for bad in (zone[:-1], zone + b"x", zone[:9], bytes([zone[0] ^ 1]) + zone[1:],
                zone[:3] + bytes([zone[3] + 1]) + zone[4:]):
        with pytest.raises(CorruptEntry):
            list(ck.messages(bad, 0, len(bad), 0))
