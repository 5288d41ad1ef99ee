"""The store with record batches (commitlog_format 2, docs/design/batch-format.md): what a
consumer reads through `get` is exactly what was put, whatever the batch boundaries, pull
bounds, start offsets and tag filters; a follower takes a leader's batches byte for byte and
refuses damaged or misplaced ones with nothing written."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from broker.store import codec, codec_batch, message_store as ms
from broker.store.commitlog import FollowerMismatch
from broker.store.message_store import MessageStore, StoreOptions

from .storeutil import put_item

OPTS = dict(segment_bytes=16384, cq_records_per_file=64, index_slots=64, index_entries_max=4096,
            positions_per_file=64)
TAGS = ("a", "b", None)


def open_store(path, fmt=2, **kw):
    s = MessageStore(path, StoreOptions(**{**OPTS, "commitlog_format": fmt, **kw}))
    s.open()
    return s


def read_queue(s, queue_id, offset, max_messages, max_bytes, tags=None):
    """What a consumer gets from `offset` on: every message it accepts, pull by pull."""
    hashes = None if tags is None else frozenset(codec.tag_hash(t) for t in tags)
    out = []
    for _ in range(10_000):
        r = s.get("t", queue_id, offset, max_messages, max_bytes, hashes)
        if r.status not in (ms.FOUND, ms.NO_MATCHED_MESSAGE):
            return out, r.status
        assert r.next_offset > offset, "a pull must move on"
        got = list(codec.iter_messages(r.data, from_queue_offset=offset))
        assert all(offset <= m.queue_offset < r.next_offset for m in got), (offset, r.next_offset)
        out += [m for m in got if tags is None or m.tags in tags]
        offset = r.next_offset
    raise AssertionError("did not reach the end")


puts = st.lists(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 700), st.sampled_from(TAGS)),
                         min_size=1, max_size=30), min_size=1, max_size=8)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(puts=puts, start=st.integers(0, 40), max_messages=st.integers(1, 9),
       max_bytes=st.integers(1, 6000), tags=st.sampled_from([None, ("a",), ("b", None)]))
def test_a_consumer_reads_exactly_what_was_put(tmp_path_factory, puts, start, max_messages, max_bytes, tags):
    s = open_store(tmp_path_factory.mktemp("s"))
    try:
        sent = {0: [], 1: []}
        n = 0
        for batch in puts:
            items = []
            for qid, size, tag in batch:
                items.append(put_item(n, size, queue_id=qid, tags=tag, keys=[f"k{n}"] if n % 3 == 0 else None))
                n += 1
            b = s.put(items)
            for it, q in zip(items, b.queue_offsets):
                sent[it.queue_id].append((q, it))
            s.dispatch()
        for qid in (0, 1):
            assert [q for q, _ in sent[qid]] == list(range(len(sent[qid])))
            got, status = read_queue(s, qid, min(start, len(sent[qid])), max_messages, max_bytes, tags)
            assert status == ms.NO_NEW_MESSAGE
            want = [it for q, it in sent[qid][min(start, len(sent[qid])):]
                    if tags is None or codec.tag_of(it.properties) in tags]
            assert [(m.msg_id, m.body, m.properties) for m in got] == \
                   [(it.msg_id, it.body, it.properties) for it in want]
        # the key and id indexes name every message, whatever batch it rides in
        for qid in (0, 1):
            for q, it in sent[qid][:5]:
                found = s.lookup_id(it.msg_id)
                assert found is not None and (found.queue_offset, found.body) == (q, it.body)
                if codec.keys_of(it.properties):
                    [k] = codec.keys_of(it.properties)
                    assert [m.msg_id for m in s.lookup_key("t", k, 0, 2**62, 4)] == [it.msg_id]
    finally:
        s.close()


def test_runs_to_one_queue_become_one_entry_and_answers_name_it(tmp_path):
    s = open_store(tmp_path)
    items = [put_item(i, 50, queue_id=0) for i in range(5)] + [put_item(5, 50, queue_id=1)] + \
        [put_item(6, 50, queue_id=0)]
    b = s.put(items)
    assert b.first_index == 0 and b.indexes[-1] == 2
    assert b.indexes == [0] * 5 + [1, 2]
    assert b.queue_offsets == [0, 1, 2, 3, 4, 0, 5]
    assert len(set(b.phys_offsets)) == 3 and b.phys_offsets[:5] == [b.phys_offsets[0]] * 5
    from broker.protocol.send import indexes
    assert indexes(b.first_index, b.phys_offsets) == b.indexes  # what the client computes
    batch = s.commitlog.read_by_index(0)
    assert (batch.base_queue_offset, len(batch.records), batch.topic) == (0, 5, "t")
    s.close()


def test_a_pull_inside_a_batch_starts_exactly_there_and_ends_after_whole_batches(tmp_path):
    s = open_store(tmp_path)
    s.put([put_item(i, 10) for i in range(10)])
    s.dispatch()
    r = s.get("t", 0, 4, 2, 1 << 20)
    assert r.status == ms.FOUND and r.next_offset == 10 and r.count == 6
    assert [m.queue_offset for m in codec.iter_messages(r.data, from_queue_offset=4)] == list(range(4, 10))
    s.close()


def test_recompute_queue_offsets_counts_whole_batches(tmp_path):
    s = open_store(tmp_path)
    s.put([put_item(i, 10) for i in range(7)])  # not dispatched: a new leader's log
    s.next_queue_offset.clear()
    s.recompute_queue_offsets()
    assert s.next_queue_offset == {("t", 0): 7}
    s.close()


def test_system_batches_reach_the_system_callback_per_record(tmp_path):
    s = open_store(tmp_path)
    seen = []
    s.on_system_entry = lambda topic, body: seen.append((topic, bytes(body)))
    s.put([put_item(0, 8, topic="%sys"), put_item(1, 8, topic="%sys"), put_item(2, 8)])
    s.dispatch()
    assert [t for t, _ in seen] == ["%sys", "%sys"] and seen[1][1] == put_item(1, 8).body
    assert s.queue_bounds("t", 0) == (0, 1) and s.queue_bounds("%sys", 0) == (0, 0)
    s.close()


def _leader_entries(tmp_path, n_puts=6):
    leader = open_store(tmp_path / "leader")
    for k in range(n_puts):
        leader.put([put_item(k * 10 + i, 200 + 100 * k, queue_id=i % 2) for i in range(8)], term=1)
    cl = leader.commitlog
    raws = [cl.read(*cl.position(i)[:2]) for i in range(cl.tail.next_index)]
    return leader, raws


def test_a_follower_holds_the_leaders_batches_byte_for_byte(tmp_path):
    leader, raws = _leader_entries(tmp_path)
    f = open_store(tmp_path / "follower")
    f.append_as_follower(raws[:3])
    f.append_as_follower(raws[3:])
    assert f.commitlog.tail == leader.commitlog.tail
    assert [f.commitlog.read(*f.commitlog.position(i)[:2]) for i in range(len(raws))] == raws
    f.set_committed(len(raws) - 1)
    leader.dispatch()
    f.dispatch()
    assert f.queue_bounds("t", 0) == leader.queue_bounds("t", 0) == (0, 24)
    leader.close()
    f.close()


def _rehead(raw: bytes, **change) -> bytes:
    """`raw` with head fields changed and both CRCs good: well formed, but not what it was."""
    h = codec_batch.check_batch(raw)._asdict()
    h.update(change)
    zone = raw[codec.BATCH_HEAD_SIZE:]
    return codec_batch.encode_head(h["index"], h["term"], h["phys_offset"], h["base_queue_offset"],
                                   h["store_ts_ms"], h["records_crc"], len(zone)) + zone


def _misframed(raw: bytes) -> bytes:
    """`raw` (a batch of 2+ records) with its first two records' sizes moved by one byte each
    and both CRCs recomputed: every CRC good, the records' framing wrong."""
    h = codec_batch.check_batch(raw)
    zone = bytearray(raw[codec.BATCH_HEAD_SIZE:])
    recs = codec_batch.walk_records(bytes(zone))
    for r, d in zip(recs[:2], (1, -1)):
        zone[r.rel:r.rel + 4] = (r.size + d).to_bytes(4, "big")
    zone = bytes(zone)
    return codec_batch.encode_head(h.index, h.term, h.phys_offset, h.base_queue_offset, h.store_ts_ms,
                                   zlib.crc32(zone), len(zone)) + zone


@pytest.mark.parametrize("damage", ["head crc", "records crc", "index", "phys", "older term", "records framing"])
def test_a_follower_refuses_a_damaged_or_misplaced_batch_and_writes_nothing(tmp_path, damage):
    leader, raws = _leader_entries(tmp_path, 3)
    f = open_store(tmp_path / "follower")
    f.append_as_follower(raws[:1])
    second = raws[1]
    if damage == "head crc":
        bad = bytearray(second)
        bad[20] ^= 1  # in the term: under head_crc
        second = bytes(bad)
    elif damage == "records crc":
        second = second[:-1] + bytes([second[-1] ^ 1])  # a body byte: under records_crc
    elif damage == "index":
        second = _rehead(second, index=2)
    elif damage == "phys":
        second = _rehead(second, phys_offset=codec_batch.check_batch(second).phys_offset + 8)
    elif damage == "older term":
        second = _rehead(second, term=0)
    else:  # what recovery would cut: a replica must not store it
        second = _misframed(second)
        w = codec_batch.walk2(second, read="head")
        assert list(w) == [] and w.stop.kind == codec.CORRUPT and "framing" in w.stop.reason
    tail = f.commitlog.tail
    with pytest.raises(FollowerMismatch):
        f.append_as_follower([second, raws[2]])
    assert f.commitlog.tail == tail  # nothing written, not even the good entry after it
    f.append_as_follower(raws[1:])
    assert f.commitlog.tail == leader.commitlog.tail
    leader.close()
    f.close()


def test_a_follower_resets_to_a_leaders_batch(tmp_path):
    leader, raws = _leader_entries(tmp_path, 4)
    f = open_store(tmp_path / "follower")
    f.reset_to(raws[2])
    f.append_as_follower(raws[3:])
    assert f.commitlog.tail == leader.commitlog.tail
    with pytest.raises(FollowerMismatch):
        f.reset_to(raws[2][:-1] + bytes([raws[2][-1] ^ 1]))
    leader.close()
    f.close()


def test_both_formats_in_one_log_read_as_one(tmp_path):
    s = open_store(tmp_path, fmt=1)
    s.put([put_item(i, 30) for i in range(3)])
    s.close()
    s = open_store(tmp_path, fmt=2)
    s.put([put_item(i, 30) for i in range(3, 9)])
    s.dispatch()
    got, _ = read_queue(s, 0, 0, 4, 1 << 20)
    assert [int(m.body[:8]) for m in got] == list(range(9))
    assert [m.queue_offset for m in got] == list(range(9))
    s.close()
    s = open_store(tmp_path, fmt=2)  # recovery reads both, queue offsets continue
    assert s.put([put_item(9, 30)]).queue_offsets == [9]
    s.close()


def test_a_batch_too_large_for_a_segment_is_cut_into_several(tmp_path):
    s = open_store(tmp_path)
    b = s.put([put_item(i, 1000) for i in range(12)])  # 12 KB: over segment_bytes / 8
    assert b.indexes[-1] > b.first_index
    for i in range(b.first_index, b.indexes[-1] + 1):
        assert s.commitlog.position(i)[1] <= OPTS["segment_bytes"] // 8 + codec.BATCH_HEAD_SIZE + 1100
    s.dispatch()
    got, _ = read_queue(s, 0, 0, 100, 1 << 20)
    assert len(got) == 12
    s.close()


def test_one_message_larger_than_the_group_bound_is_a_batch_of_its_own(tmp_path):
    s = open_store(tmp_path)
    b = s.put([put_item(0, 10), put_item(1, 5000), put_item(2, 10)])
    assert b.indexes == [0, 1, 2]
    s.close()


def test_a_pull_bounded_inside_a_large_batch_still_ends_after_it(tmp_path):
    s = open_store(tmp_path, segment_bytes=1 << 20)
    b = s.put([put_item(i, 0) for i in range(1000)])
    assert b.indexes[-1] == b.first_index  # one batch
    s.dispatch()
    r = s.get("t", 0, 5, 3, 1 << 20)
    assert (r.status, r.count, r.next_offset) == (ms.FOUND, 995, 1000)
    assert len(list(codec.iter_messages(r.data, from_queue_offset=5))) == 995
    s.close()


def test_batches_fit_frames_as_well_as_segments():
    """A record batch travels whole (a raft push, a slave's stream, a pull answer): the zone
    bound and the store's cut for runs stay under frame_bytes_max, and the zone bound admits
    any batch SEND_BATCH admits."""
    from broker.config import from_dict
    small = from_dict({"data_dir": "/tmp/x", "insecure": True, "frame_bytes_max": 256 << 10,
                       "message_body_bytes_max": 64 << 10, "batch_bytes_max": 64 << 10,
                       "pull_bytes_max": 128 << 10})
    assert small.zone_bytes_max <= (256 << 10) - (64 << 10)
    assert small.store_options().batch_group_bytes <= small.zone_bytes_max
    d = from_dict({"data_dir": "/tmp/x", "insecure": True})
    full = codec.ZONE_TOPIC_AT + codec.TOPIC_BYTES_MAX + d.batch_bytes_max + d.batch_messages_max * codec.RECORD_SIZE
    assert d.zone_bytes_max >= full and d.zone_bytes_max <= d.frame_bytes_max - (64 << 10)
