import random
import zlib

import pytest
from hypothesis import given, settings, strategies as st

from broker.store import codec


def make(index=7, term=3, body=b"hello", props=b"", topic=b"orders", phys=4096):
    return codec.encode(index, term, phys, 11, 1_700_000_000_000, 1_699_999_999_000,
                        bytes(range(16)), 2, 0x5, topic, props, body)


def test_round_trip_every_field():
    props = codec.message_properties(keys=["k1", "k2"], tags="paid", user={"region": "eu"})
    raw = make(props=props, body=b"x" * 1000)
    e = codec.decode(raw, 0, base_offset=4096)
    assert (e.index, e.term, e.phys_offset, e.queue_offset) == (7, 3, 4096, 11)
    assert (e.store_ts_ms, e.born_ts_ms) == (1_700_000_000_000, 1_699_999_999_000)
    assert e.msg_id == bytes(range(16)) and e.queue_id == 2 and e.flags == 5
    assert e.topic == "orders" and e.body == b"x" * 1000 and e.size == len(raw)
    assert e.keys == ["k1", "k2"] and e.tags == "paid" and e.props()["region"] == "eu"
    assert len(raw) == codec.entry_size(6, len(props), 1000)


def test_layout_is_what_the_docstring_says():
    raw = make()
    size, magic, crc = codec.PREFIX.unpack_from(raw)
    assert size == len(raw) and magic == codec.ENTRY_MAGIC
    assert crc == zlib.crc32(raw[12:])  # the CRC covers everything after itself
    assert int.from_bytes(raw[12:20], "big") == 7  # index
    assert int.from_bytes(raw[20:28], "big") == 3  # term
    assert raw[codec.HEADER_SIZE:codec.HEADER_SIZE + 6] == b"orders"


@settings(max_examples=300, deadline=None, print_blob=True)
@given(data=st.binary(max_size=70_000), start=st.integers(0, 2**32 - 1), at=st.integers(0, 63))
def test_the_logs_crc32_is_zlibs(data, start, at):
    """codec.crc32 (zlib-ng's when installed) gives zlib's values -- what every log already
    written and every other reader holds -- on bytes and slices of memoryviews, chained too."""
    mv = memoryview(data)[at:]
    assert codec.crc32(mv) == zlib.crc32(mv)
    assert codec.crc32(mv, start) == zlib.crc32(mv, start)


@pytest.mark.parametrize("size", [32 << 10, 64 << 10, (256 << 10) + 7, 1 << 20, (16 << 20) + 3])
@pytest.mark.parametrize("at", [0, 1, 13])
def test_the_logs_crc32_is_zlibs_on_batch_sizes(size, at):
    """Sizes whole batches and pushes have, at odd offsets (SIMD code paths switch on size
    and alignment): zlib's values."""
    data = memoryview(random.Random(size + at).randbytes(size + at))[at:]
    assert codec.crc32(data) == zlib.crc32(data)
    assert codec.crc32(data[:-5], 0x12345678) == zlib.crc32(data[:-5], 0x12345678)


def test_the_logs_crc32_is_zlib_ngs_when_installed():
    """(zlib-ng is a dependency: the fast CRC is what a broker installed from this tree runs.)"""
    zlib_ng = pytest.importorskip("zlib_ng.zlib_ng")
    assert codec.crc32 is zlib_ng.crc32


@pytest.mark.parametrize("at", list(range(4, 96, 3)) + [100, 120])
def test_any_flipped_byte_is_detected(at):
    raw = bytearray(make(body=b"payload" * 4))
    raw[at] ^= 0x40
    with pytest.raises(codec.CorruptEntry):
        codec.decode(raw, 0, base_offset=4096)


def test_truncated_entry_and_header():
    raw = make()
    with pytest.raises(codec.CorruptEntry, match="truncated entry"):
        codec.decode(raw[:-1])
    with pytest.raises(codec.CorruptEntry, match="truncated header"):
        codec.decode(raw[:50])


def test_entry_at_wrong_offset_is_rejected():
    with pytest.raises(codec.CorruptEntry, match="names offset"):
        codec.decode(make(phys=4096), 0, base_offset=8192)


def test_random_bytes_never_decode_silently(rng):
    for _ in range(2000):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 200)))
        try:
            e = codec.decode(junk)
        except codec.CorruptEntry:
            continue
        pytest.fail(f"junk decoded as {e}")


def test_iter_entries_and_blank():
    buf = make(index=1) + make(index=2)
    assert [e.index for e in codec.iter_entries(buf)] == [1, 2]
    assert codec.peek(codec.encode_blank(100)) == (100, codec.BLANK_MAGIC)


def test_properties_validation():
    with pytest.raises(ValueError, match="reserved"):
        codec.message_properties(user={"KEYS": "x"})
    with pytest.raises(ValueError, match="separator"):
        codec.encode_properties({"a": "b\x01"})
    with pytest.raises(ValueError, match="no spaces"):
        codec.message_properties(keys=["a b"])
    assert codec.decode_properties(codec.encode_properties({"a": "1", "b": ""})) == {"a": "1", "b": ""}
    assert codec.tag_hash(None) == 0 and codec.tag_hash("t") != 0


def test_check_verifies_without_decoding():
    raw = make(body=b"abc" * 50)
    assert codec.check(raw) == (len(raw), 7, 3, 4096)
    bad = bytearray(raw)
    bad[100] ^= 1
    with pytest.raises(codec.CorruptEntry, match="CRC"):
        codec.check(bad)
    with pytest.raises(codec.CorruptEntry, match="truncated"):
        codec.check(raw[:40])
