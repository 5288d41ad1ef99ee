"""frame_records (codec_batch.py) checks a zone's framing without building record heads (a
follower's check per append); it must reach walk_records' verdict -- the same CorruptEntry
reason, or none -- on every zone: valid ones (and the same body lengths and largest props),
and ones with bytes flipped, cut or appended.
Hypothesis prints the failing example and a blob on failure; `--hypothesis-seed=N` replays."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from broker.store import codec_batch
from broker.store.codec import CorruptEntry

SETTINGS = settings(max_examples=400, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow])

record_st = st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1),
                      st.binary(min_size=16, max_size=16), st.binary(max_size=40), st.binary(max_size=200))


def verdict(fn, zone: bytes):
    try:
        fn(zone)
    except CorruptEntry as e:
        return e.reason
    return None


@SETTINGS
@given(records=st.lists(record_st, min_size=1, max_size=8), topic=st.sampled_from(["t", "orders", "x" * 60]),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
       cut=st.integers(0, 10**6), tail=st.binary(max_size=5))
def test_frame_records_agrees_with_walk_records(records, topic, flips, cut, tail):
    zone, _ = codec_batch.encode_zone(topic, 1, records)
    heads = codec_batch.walk_records(zone)
    assert codec_batch.frame_records(zone) == ([r.body_len for r in heads], max(r.props_len for r in heads))
    z = bytearray(zone)
    for at, byte in flips:
        z[at % len(z)] = byte
    z = bytes(z[:len(z) - cut % (len(z) + 1)]) + tail
    walked = verdict(codec_batch.walk_records, z)
    framed = verdict(lambda b: codec_batch.frame_records(b, 0, len(b)), z)
    assert framed == walked
