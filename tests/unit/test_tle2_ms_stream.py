"""The slave's stream splitter on record batches (TLE2, docs/design/batch-format.md "Master-
slave HA"): a batch is one entry, handed on whole whatever the chunking; the size bound
admits every batch a master of the same configuration writes."""

import random
import types

import pytest

from broker.store import codec, codec_batch
from broker.store.commitlog import CommitLog
from broker.store.message_store import BATCH_GROUP_BYTES
from replication.master_slave import wire
from replication.master_slave.driver import entry_bytes_bound
from replication.master_slave.slave import SlaveStream, StreamMismatch

from .storeutil import append, body_of, item
from .test_ms_stream import frames, raw_entries

SEG = 4096


def mixed_master_log(tmp_path, rng):
    """TLE1 entries, then TLE2 batches of 1..6 records (the format switched), over several
    segments."""
    cl = CommitLog(tmp_path / "m", SEG, positions_per_file=64)
    cl.recover(None)
    append(cl, [item(i, rng.randrange(0, 700)) for i in range(8)], 3, 0)
    q = 8
    for _ in range(20):
        n = rng.randrange(1, 7)
        recs = [codec_batch.BatchRecord(0, 1, i.to_bytes(16, "big"), b"", body_of(i, rng.randrange(0, 300)))
                for i in range(q, q + n)]
        cl.append_batches_as_leader([codec_batch.encode_zone("t", 0, recs)], [q], 3, 0)
        q += n
    return cl


def test_stream_hands_on_whole_batches_in_any_chunking(tmp_path, seed):
    rng = random.Random(seed)
    cl = mixed_master_log(tmp_path, rng)
    assert len(cl.segments.files) > 3
    data = frames(cl, 0, rng)
    s = SlaveStream(0, SEG)
    got, pos = [], 0
    while pos < len(data):
        n = rng.randrange(1, 3000)
        got += s.feed(data[pos:pos + n])
        pos += n
    assert got == raw_entries(cl)  # whole entries: a batch never split into its records
    assert sum(codec.peek(e)[1] == codec.BATCH_MAGIC for e in got) == 20
    follower = CommitLog(tmp_path / "s", SEG, positions_per_file=64)
    follower.recover(None)
    follower.append_as_follower(got)
    assert [f.pread(0, SEG) for f in follower.segments.files] == [f.pread(0, SEG) for f in cl.segments.files]


def test_a_batch_is_not_handed_on_until_its_last_byte_arrives(tmp_path):
    cl = mixed_master_log(tmp_path, random.Random(1))
    # a batch right after another entry in the same segment
    k = next(k for k in range(9, 28) if sum(cl.position(k - 1)[:2]) == cl.position(k)[0])
    p, size, _ = cl.position(k)
    start = cl.position(k - 1)[0]
    s = SlaveStream(start, SEG)
    got = s.feed(wire.encode_header(start, p + size - 1 - start, 3, cl.tail.offset, 0)
                 + cl.read(start, p + size - 1 - start))
    assert got == [cl.read(start, p - start)] and s.pending_at == p
    got = s.feed(wire.encode_header(p + size - 1, 1, 3, cl.tail.offset, 0) + cl.read(p + size - 1, 1))
    assert got == [cl.read(p, size)]


def test_a_batch_over_the_bound_is_a_mismatch(tmp_path):
    cl = mixed_master_log(tmp_path, random.Random(2))
    p, size, _ = max((cl.position(i) for i in range(8, 28)), key=lambda x: x[1])
    s = SlaveStream(p, size - 1)
    with pytest.raises(StreamMismatch, match="size"):
        s.feed(wire.encode_header(p, size, 3, cl.tail.offset, 0) + cl.read(p, size))


def config(**kw):
    """The fields entry_bytes_bound reads, zone_bytes_max derived as BrokerConfig does."""
    from broker.config import BrokerConfig
    ns = types.SimpleNamespace(**{"frame_bytes_max": 16 << 20, "batch_bytes_max": 4 << 20,
                                  "batch_messages_max": 1024, **kw})
    ns.batch_group_bytes = BrokerConfig.batch_group_bytes.fget(ns)
    ns.zone_bytes_max = BrokerConfig.zone_bytes_max.fget(ns)
    return ns


def test_the_bound_admits_the_largest_batch_of_either_kind():
    cfg = config(segment_bytes=1 << 30, message_body_bytes_max=4096)
    bound = entry_bytes_bound(cfg)
    big = codec_batch.encode_batch(0, 0, 0, 0, 0, "t" * codec.TOPIC_BYTES_MAX, 0, [
        codec_batch.BatchRecord(0, 0, bytes(16), b"p" * codec.PROPS_BYTES_MAX, bytes(4096))])
    tle1 = codec.encode(0, 0, 0, 0, 0, 0, bytes(16), 0, 0, b"t" * codec.TOPIC_BYTES_MAX,
                        b"p" * codec.PROPS_BYTES_MAX, bytes(4096))
    assert len(big) > len(tle1) and bound >= len(big)  # one message: 12 bytes over TLE1
    # a run of small messages filling BATCH_GROUP_BYTES (MessageStore's cut)
    n = BATCH_GROUP_BYTES // (codec.RECORD_SIZE + 1000) - 1
    rest = BATCH_GROUP_BYTES - n * (codec.RECORD_SIZE + 1000) - codec.RECORD_SIZE
    run = codec_batch.encode_batch(0, 0, 0, 0, 0, "t" * codec.TOPIC_BYTES_MAX, 0, [
        codec_batch.BatchRecord(0, 0, bytes(16), b"", bytes(1000))] * n
        + [codec_batch.BatchRecord(0, 0, bytes(16), b"", bytes(rest))])
    assert bound >= len(run) > BATCH_GROUP_BYTES
    assert entry_bytes_bound(config(segment_bytes=65536, message_body_bytes_max=4096)) <= 65536
