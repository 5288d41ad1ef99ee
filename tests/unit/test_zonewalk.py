"""broker/store/_zonewalk.c is a fast path of codec_batch's per-record walks: on every zone,
valid or damaged (bytes flipped, cut, appended; at an offset inside a bigger buffer), it gives
exactly what the Python code gives or None (then the Python code runs and names the problem),
and on a valid zone it does give the answer (the fast path is taken). Both ways of running
codec_batch -- with the C module and without it -- agree with each other.
Hypothesis prints the failing example and a blob on failure; `--hypothesis-seed=N` replays."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.store import codec_batch
from broker.store.codec import CorruptEntry
from broker.store.key_index import ID_SEED, id_hash

zonewalk = pytest.importorskip("broker.store._zonewalk", reason="the C fast path is not built here")

SETTINGS = settings(max_examples=500, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow])

record_st = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                      st.binary(min_size=16, max_size=16), st.binary(max_size=40), st.binary(max_size=200))


def python_only(fn, *args):
    """fn(*args) with the C module off: the result, or the CorruptEntry's reason."""
    saved, codec_batch._zonewalk = codec_batch._zonewalk, None
    try:
        return fn(*args)
    except CorruptEntry as e:
        return ("corrupt", e.reason)
    except Exception as e:  # e.g. struct.error from a head past the buffer: C must not hide it
        return ("error", type(e).__name__)
    finally:
        codec_batch._zonewalk = saved


def damaged(zone: bytes, flips, cut: int, tail: bytes) -> bytes:
    z = bytearray(zone)
    for at, byte in flips:
        z[at % len(z)] = byte
    return bytes(z[:len(z) - cut % (len(z) + 1)]) + tail


@SETTINGS
@given(records=st.lists(record_st, min_size=1, max_size=8), topic=st.sampled_from(["t", "orders", "x" * 60]),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
       cut=st.integers(0, 10**6), tail=st.binary(max_size=5), prefix=st.binary(max_size=7))
def test_c_and_python_walks_agree(records, topic, flips, cut, tail, prefix):
    zone, _ = codec_batch.encode_zone(topic, 1, records)
    want = python_only(codec_batch.frame_records, zone)
    assert zonewalk.frame_records(zone, 0, -1) == want  # valid: the fast path answers
    ids = python_only(codec_batch.record_ids, zone, 0, len(zone))
    assert zonewalk.record_ids(zone, 0, len(zone), -1) == ids
    hashed = zonewalk.record_ids(zone, 0, len(zone), ID_SEED)
    assert hashed == ([id_hash(i) for i in ids[0]], ids[1])
    for z in (damaged(zone, flips, cut, tail), prefix + damaged(zone, flips, cut, tail)):
        pos = len(z) - len(damaged(zone, flips, cut, tail))
        for end in (len(z), len(z) - 1, len(z) + 3):
            py = python_only(codec_batch.frame_records, z, pos, end)
            c = zonewalk.frame_records(z, pos, end)
            assert c is None or c == py, (c, py)
            py_ids = python_only(codec_batch.record_ids, z, pos, end)
            c_ids = zonewalk.record_ids(memoryview(z), pos, end, -1)
            assert c_ids is None or c_ids == py_ids, (c_ids, py_ids)
            c_hashed = zonewalk.record_ids(z, pos, end, 7)
            py_hashed = python_only(codec_batch.record_ids, z, pos, end, 7)
            assert c_hashed is None or c_hashed == py_hashed


def test_the_fast_path_is_taken_and_hashes_like_the_key_index():
    zone, _ = codec_batch.encode_zone("t", 0, [(0, 1, bytes([k % 256]) * 16, b"", b"x" * k) for k in range(300)])
    bodies, props = zonewalk.frame_records(bytearray(zone), 0, len(zone))
    assert bodies == list(range(300)) and props == 0
    hashes, props = codec_batch.record_ids(zone, 0, len(zone), ID_SEED)
    assert hashes == [zlib.crc32(b"#id#" + bytes([k % 256]) * 16) for k in range(300)] and props == 0


def test_props_over_the_limit_are_not_passed_by_the_fast_path():
    """A record whose lengths agree but whose props_len is over PROPS_BYTES_MAX: corrupt for
    the Python walk, so the C walk must not answer (random damage rarely builds this)."""
    from broker.store.codec import PROPS_BYTES_MAX, RECORD, RECORD_SIZE, ZONE_HEAD
    plen = PROPS_BYTES_MAX + 1
    zone = ZONE_HEAD.pack(0, 1, 0, 1) + b"t" + RECORD.pack(RECORD_SIZE + plen, 0, 0, bytes(16), plen, 0) + bytes(plen)
    assert python_only(codec_batch.frame_records, zone)[0] == "corrupt"
    assert zonewalk.frame_records(zone, 0, -1) is None


# one field of a valid record replaced by something the layout cannot hold or only the
# Python encoder takes (one at a time: a second odd field would hide a missing check)
odd_field_st = st.one_of(
    st.tuples(st.just(0), st.sampled_from([-1, 2**32, 2**40, True])),  # flags
    st.tuples(st.just(1), st.sampled_from([-1, 2**64, True])),  # born_ts_ms
    st.tuples(st.just(2), st.sampled_from([b"x" * 15, b"x" * 17, bytearray(16)])),  # msg_id
    st.tuples(st.just(3), st.sampled_from([b"p" * 32768, bytearray(b"pp"), memoryview(b"p")])),  # properties
    st.tuples(st.just(4), st.sampled_from([bytearray(b"body"), memoryview(b"body")])))  # body


def with_odd_field(record, odd):
    r = list(record)
    r[odd[0]] = odd[1]
    return tuple(r)


@SETTINGS
@given(records=st.lists(record_st, min_size=1, max_size=6), odd=st.lists(st.tuples(record_st, odd_field_st), max_size=1),
       topic=st.sampled_from([b"t", b"orders", b"x" * 127, b"x" * 128, b""]),
       queue_id=st.sampled_from([0, 5, 2**32 - 1, 2**32, -1]), as_list=st.booleans())
def test_c_encoding_is_the_python_encoding(records, odd, topic, queue_id, as_list):
    """Whatever the input, the C encoder gives the Python encoder's (zone, crc) or None -- and
    None only where the Python encoder refuses (BatchLimitError) or sees input it alone takes."""
    recs = [list(r) if as_list else r for r in records + [with_odd_field(r, f) for r, f in odd]]
    want = python_only(codec_batch.encode_zone, topic, queue_id, recs)
    got = zonewalk.encode_zone(topic, queue_id, recs)
    # without its CRC (codec_batch computes it with zlib-ng's when installed): the same zone
    assert zonewalk.encode_zone(topic, queue_id, recs, False) == (None if got is None else (got[0], None))
    if got is not None:
        assert got == want
        assert codec_batch.encode_zone(topic, queue_id, recs) == got  # C zone, zlib-ng's CRC if installed
    elif not odd and 1 <= len(topic) <= 127 and 0 <= queue_id < 2**32:
        pytest.fail(f"the fast path refused plain valid records: {want!r:.200}")
