"""broker/kafka/fetch.py's conversion of native entries into Kafka batches."""

from broker.kafka import records as kr
from broker.kafka.fetch import TIMESTAMP_MAX, native_batch
from broker.store import codec


def msg(born: int, body: bytes, props: bytes = b"") -> codec.Message:
    return codec.Message(0, 0, 0, 5, 0, born, bytes(16), 0, 0, "t", props, body, 0, 0)


def test_a_born_time_past_kafkas_int64_is_clamped_not_a_crash():
    """A native born_ts_ms is a u64; Kafka's timestamps are int64: before the clamp, encoding
    raised and every Fetch at that offset aborted the consumer's connection."""
    b = native_batch([msg(2 ** 64 - 1, b"far"), msg(1000, b"near", codec.message_properties(keys=["k1"]))], 5)
    h = kr.head(b)
    recs = list(kr.records(kr.Batch(h, b)))
    assert h.base_offset == 5 and [r.value for r in recs] == [b"far", b"near"]
    assert h.base_timestamp == 1000 and recs[0].timestamp_delta == TIMESTAMP_MAX - 1000
    assert recs[1].key == b"k1"


def test_a_compression_bomb_is_refused_at_the_bound_for_every_codec():
    """A few KB of zstd can hold hundreds of MB of zeros: each codec inflates into a bounded
    buffer (records.DECOMPRESSED_BYTES_MAX) and refuses past it, instead of filling memory."""
    import pytest

    for c in (kr.GZIP, kr.SNAPPY, kr.LZ4, kr.ZSTD):
        bomb = kr.encode([kr.Record(0, 0, None, b"\0" * (kr.DECOMPRESSED_BYTES_MAX + 1024), [])], compression=c)
        with pytest.raises(kr.InvalidRecord, match="inflate past"):
            list(kr.records(kr.Batch(kr.head(bomb), bomb)))
        ok = kr.encode([kr.Record(0, 0, None, b"x" * 1000, [])], compression=c)
        assert [len(r.value) for r in kr.records(kr.Batch(kr.head(ok), ok))] == [1000]
