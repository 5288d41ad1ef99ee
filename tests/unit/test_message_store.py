import os
import shutil

import pytest

from broker.store import codec, message_store as ms
from broker.store.message_store import MessageStore, StoreOptions

from .storeutil import put_item

OPTS = StoreOptions(segment_bytes=8192, cq_records_per_file=16, index_slots=64,
                    index_entries_max=256, positions_per_file=32)


def open_store(path, **kw):
    s = MessageStore(path, StoreOptions(**{**OPTS.__dict__, **kw}))
    s.open()
    return s


def fill(store, n, queues=2, size=100, keys=False):
    batch = store.put([put_item(i, size, queue_id=i % queues, keys=[f"k{i}"] if keys else None,
                                tags="even" if i % 2 == 0 else "odd") for i in range(n)])
    store.dispatch()
    return batch


def pull_all(store, topic="t", queue_id=0, offset=0):
    out = []
    while True:
        r = store.get(topic, queue_id, offset, 7, 1 << 20)
        if r.status != ms.FOUND:
            return out
        out += list(codec.iter_entries(r.data))
        offset = r.next_offset


def test_put_assigns_queue_offsets_and_get_returns_in_order(tmp_path):
    s = open_store(tmp_path)
    b = fill(s, 40)
    assert b.queue_offsets[:4] == [0, 0, 1, 1]
    got = pull_all(s, queue_id=1)
    assert [e.queue_offset for e in got] == list(range(20))
    assert [int(e.body[:8]) for e in got] == list(range(1, 40, 2))
    assert s.queue_bounds("t", 1) == (0, 20)
    assert s.get("t", 1, 20, 10, 1 << 20).status == ms.NO_NEW_MESSAGE
    assert s.get("t", 1, 21, 10, 1 << 20).status == ms.OFFSET_OVERFLOW
    assert s.get("nope", 0, 0, 10, 1 << 20).status == ms.NO_NEW_MESSAGE


def test_tag_filter_and_byte_bound(tmp_path):
    s = open_store(tmp_path)
    fill(s, 20, queues=1)
    r = s.get("t", 0, 0, 100, 1 << 20, frozenset({codec.tag_hash("odd")}))
    assert [int(e.body[:8]) for e in codec.iter_entries(r.data)] == list(range(1, 20, 2))
    r = s.get("t", 0, 0, 100, 250)
    assert r.count == 1  # at least one, then stop at the byte bound


def test_sync_mode_dispatches_only_flushed(tmp_path):
    s = open_store(tmp_path, flush="sync")
    s.put([put_item(i) for i in range(3)])
    s.dispatch()
    assert s.queue_bounds("t", 0) == (0, 0)  # nothing fsynced yet: consumers see nothing
    s.commitlog.flush()
    s.dispatch()
    assert s.queue_bounds("t", 0) == (0, 3)


def test_reopen_keeps_everything_and_queue_offsets_continue(tmp_path):
    s = open_store(tmp_path)
    fill(s, 30)
    s.close()
    s = open_store(tmp_path)
    assert [e.queue_offset for e in pull_all(s)] == list(range(15))
    b = s.put([put_item(100, queue_id=0)])
    assert b.queue_offsets == [15]


def test_consume_queue_rebuilt_when_missing(tmp_path):
    s = open_store(tmp_path)
    fill(s, 50)
    s.close()
    shutil.rmtree(tmp_path / "consumequeue")
    s = open_store(tmp_path)
    assert [e.queue_offset for e in pull_all(s, queue_id=0)] == list(range(25))
    assert [e.queue_offset for e in pull_all(s, queue_id=1)] == list(range(25))


def test_consume_queue_rebuilt_when_one_queue_is_damaged(tmp_path):
    s = open_store(tmp_path)
    fill(s, 50)
    s.close()
    qdir = tmp_path / "consumequeue" / "t" / "1"
    files = sorted(qdir.iterdir())
    with open(files[-1], "r+b") as f:  # the queue lost its tail: shorter than the manifest
        f.truncate(20 * 3)
    s = open_store(tmp_path)
    assert len(pull_all(s, queue_id=1)) == 25


def test_consume_queue_rebuilt_when_manifest_corrupt(tmp_path):
    s = open_store(tmp_path)
    fill(s, 10)
    s.close()
    (tmp_path / "consumequeue" / "manifest.json").write_text("{not json")
    s = open_store(tmp_path)
    assert len(pull_all(s)) == 5


def test_consume_queue_follows_a_cut_commitlog(tmp_path):
    s = open_store(tmp_path)
    fill(s, 5, queues=1)
    s.checkpoint()
    b = s.put([put_item(i) for i in range(5, 10)])  # after the checkpoint, then a crash
    s.dispatch()
    last = b.phys_offsets[-1]
    seg = tmp_path / "commitlog" / ("%020d" % (last - last % 8192))
    with open(seg, "r+b") as f:
        f.seek(last % 8192 + 120)
        f.write(b"\x00\x01")
    s = open_store(tmp_path)  # the crashed instance is simply abandoned
    assert [e.queue_offset for e in pull_all(s)] == list(range(9))
    assert s.put([put_item(77)]).queue_offsets == [9]


def test_corruption_below_the_checkpoint_is_kept_and_reported_not_cut(tmp_path):
    """Flushed (acknowledged) data is never truncated: a bad entry there is a read error."""
    s = open_store(tmp_path)
    b = fill(s, 10, queues=1)
    s.close()
    victim = b.phys_offsets[4]
    seg = tmp_path / "commitlog" / ("%020d" % (victim - victim % 8192))
    with open(seg, "r+b") as f:
        f.seek(victim % 8192 + 120)
        f.write(b"\x00\x01")
    s = open_store(tmp_path)
    assert s.queue_bounds("t", 0) == (0, 10)
    r = s.get("t", 0, 4, 1, 1 << 20)
    with pytest.raises(codec.CorruptEntry, match="CRC"):
        codec.decode(r.data)
    assert [e.queue_offset for e in pull_all(s, offset=5)] == list(range(5, 10))


def test_key_and_id_lookup(tmp_path):
    s = open_store(tmp_path)
    b = fill(s, 30, keys=True)
    ts = b.store_ts_ms
    found = s.lookup_key("t", "k7", ts - 10, ts + 10, 5)
    assert [int(e.body[:8]) for e in found] == [7]
    assert s.lookup_key("t", "k7", ts + 5000, ts + 9000, 5) == []
    assert s.lookup_key("other", "k7", 0, 2**62, 5) == []
    e = s.lookup_id((12).to_bytes(16, "big"))
    assert e is not None and int(e.body[:8]) == 12
    assert s.lookup_id(b"\xff" * 16) is None


def test_key_index_rebuilt_when_damaged(tmp_path):
    s = open_store(tmp_path)
    fill(s, 20, keys=True)
    s.close()
    idx = sorted((tmp_path / "index").iterdir())[0]
    with open(idx, "r+b") as f:
        f.seek(32)
        f.write(b"\xff\xff\xff\xff")  # slots field: damaged header
    s = open_store(tmp_path)
    assert len(s.lookup_key("t", "k3", 0, 2**62, 5)) == 1


def test_retention_deletes_expired_prefix_and_keeps_queues_consistent(tmp_path, caplog):
    s = open_store(tmp_path)
    fill(s, 200, queues=1)
    s.commitlog.flush()
    segs = s.commitlog.segments.files
    assert len(segs) > 3
    old = 1_000_000.0
    for f in segs[:3]:
        os.utime(f.path, (old, old))
    from broker.store.retention import RetentionPolicy
    policy = RetentionPolicy(file_reserved_hours=1, delete_hours=frozenset({4}))
    holders = s.holders_for([("g1", "t", 0, 0)])
    p = s.run_retention(policy, holders, now_s=old + 7200, local_hour=3, disk_ratio=0.1)
    assert not p.delete  # not the delete hour
    p = s.run_retention(policy, holders, now_s=old + 7200, local_hour=4, disk_ratio=0.1)
    assert len(p.delete) == 3 and "consumer group g1" in caplog.text
    lo, hi = s.queue_bounds("t", 0)
    assert lo > 0 and hi == 200
    assert s.get("t", 0, 0, 10, 1 << 20).status == ms.OFFSET_TOO_SMALL
    got = pull_all(s, offset=lo)
    assert [e.queue_offset for e in got] == list(range(lo, 200))
    s.close()
    s = open_store(tmp_path)
    assert s.queue_bounds("t", 0) == (lo, 200)
    assert len(pull_all(s, offset=lo)) == 200 - lo


def test_disk_full_flag_refuses_writes(tmp_path):
    s = open_store(tmp_path)
    s.disk_full_reason = "disk usage 97% is past disk_usage_ratio_write_max 95%"
    with pytest.raises(OSError, match="disk usage"):
        s.put([put_item(0)])
    s.disk_full_reason = None
    assert s.put([put_item(0)]).queue_offsets == [0]


def test_retention_names_a_replica_that_has_not_copied_what_goes(tmp_path, caplog):
    s = open_store(tmp_path)
    fill(s, 200, queues=1)
    s.commitlog.flush()
    for f in s.commitlog.segments.files[:3]:
        os.utime(f.path, (1_000_000.0, 1_000_000.0))
    from broker.store.retention import RetentionPolicy
    holders = s.holders_for_replicas({"n2": 10})  # n2 holds up to index 10 only
    assert holders[0].needs_from == s.commitlog.position(11)[0]
    s.run_retention(RetentionPolicy(file_reserved_hours=1, delete_hours=frozenset({4})), holders,
                    now_s=1_000_000.0 + 7200, local_hour=4, disk_ratio=0.1)
    assert "replica n2 still needs" in caplog.text


def test_truncate_to_offset_takes_back_what_consumers_saw(tmp_path):
    """A master-slave replica whose suffix forked: the cut messages leave the ConsumeQueues
    too, and queue offsets go on from what is left."""
    s = open_store(tmp_path)
    b = fill(s, 30)
    cut = b.phys_offsets[20]
    assert s.truncate_to_offset(cut) == 10
    assert s.queue_bounds("t", 0) == (0, 10) and s.cqs.dispatched_offset == cut
    assert [int(e.body[:8]) for e in pull_all(s, queue_id=0)] == list(range(0, 20, 2))
    b2 = s.put([put_item(100, queue_id=0)])
    assert b2.queue_offsets == [10] and b2.first_index == 20
    s.dispatch()
    s.close()
    again = open_store(tmp_path)
    assert [int(e.body[:8]) for e in pull_all(again, queue_id=0)][-2:] == [18, 100]
    again.close()


def test_restart_at_drops_the_log(tmp_path):
    s = open_store(tmp_path)
    fill(s, 10)
    s.restart_at(16384, 77)
    assert s.commitlog.tail.offset == 16384 and s.commitlog.tail.next_index == 77
    assert s.queue_bounds("t", 0) == (0, 0) and s.commitlog.min_offset == 16384
    s.close()


def test_key_index_files_are_prepared_ahead(tmp_path):
    """The next index file is zero-filled in the background once the current one is half
    full, and taken over (renamed) when it fills, instead of being written on the loop."""
    s = open_store(tmp_path)
    ki = s.key_index
    fill(s, 100, keys=True)  # 200 index entries (key + id): 256 per file
    assert ki._ahead is not None
    ki._ahead.result()
    assert ki._prep_path.exists()
    fill(s, 50, keys=True)  # 100 more: the first file fills, the second stays under half
    assert len(ki.files) == 2 and ki._ahead is None and not ki._prep_path.exists()
    assert s.lookup_key("t", "k42", 0, 2**62, 5)
    s.close()
