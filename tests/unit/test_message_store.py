import os
import shutil
from pathlib import Path

import pytest

from broker.store import codec, message_store as ms
from broker.store.message_store import MessageStore, StoreOptions

from .storeutil import put_item

OPTS = StoreOptions(segment_bytes=8192, cq_records_per_file=16, index_slots=64,
                    index_entries_max=256, positions_per_file=32)


@pytest.fixture(autouse=True, params=[1, 2], ids=["tle1", "tle2"])
def commitlog_format(request, monkeypatch):
    """Every test here runs with the leader writing an entry per message (1) and record
    batches (2): the store's readers take both."""
    monkeypatch.setitem(OPTS.__dict__, "commitlog_format", request.param)
    return request.param


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
        out += list(codec.iter_messages(r.data, from_queue_offset=offset))
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
    assert r.count == 10  # the matching messages (a batch ships whole: the consumer filters)
    got = [e for e in codec.iter_messages(r.data) if e.tags == "odd"]
    assert [int(e.body[:8]) for e in got] == list(range(1, 20, 2))
    r = s.get("t", 0, 0, 100, 250)
    first = next(codec.iter_messages(r.data))
    # at least one entry, then stop at the byte bound: all of the first entry's messages
    assert r.data == s.commitlog.read_entry(first.phys_offset)
    assert r.count == r.next_offset == len(list(codec.iter_messages(r.data)))


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
    kept = b.queue_offsets[b.phys_offsets.index(last)]  # the damaged entry goes whole (a batch too)
    assert kept == (9 if OPTS.commitlog_format == 1 else 5)
    assert [e.queue_offset for e in pull_all(s)] == list(range(kept))
    assert s.put([put_item(77)]).queue_offsets == [kept]


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
        list(codec.iter_messages(r.data))
    after = next(q for q, p in zip(b.queue_offsets, b.phys_offsets) if p > victim)  # the next entry
    assert [e.queue_offset for e in pull_all(s, offset=after)] == list(range(after, 10))


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
    s.checkpoint()  # retention keeps what no durable checkpoint says was dispatched
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
    s.checkpoint()
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


# --- regressions found by the power-loss harness (tests/unit/test_store_durability.py) -------

import contextlib  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402

from broker.store import checkpoint as checkpoint_mod  # noqa: E402


@contextlib.contextmanager
def deadline(seconds=5):
    """A loop that does not advance fails the test instead of hanging it."""
    def fire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_dispatch_from_mid_entry_raises_instead_of_looping(tmp_path):
    s = open_store(tmp_path)
    for i in range(10):  # an entry each, in either format
        s.put([put_item(i, 100)])
    s.cqs.dispatched_offset = s.commitlog.position(3)[0] + 10  # inside entry 3
    with deadline(), pytest.raises(ms.DamagedConsumeQueue, match="offset"):
        s.dispatch()
    with deadline(), pytest.raises(ms.DamagedConsumeQueue):
        s.recompute_queue_offsets()
    s.close()


def test_dispatch_over_a_zero_hole_before_the_end_raises_instead_of_looping(tmp_path):
    s = open_store(tmp_path)
    for i in range(10):  # an entry each, in either format
        s.put([put_item(i, 100)])
    phys, size, _ = s.commitlog.position(4)
    seg = s.commitlog.segments.find(phys)
    seg.pwrite(phys - seg.base, bytes(size))  # entry 4 never reached the disk
    s.commitlog.tail_cache.clear()  # read from the files (as after a restart): not from memory
    with deadline(), pytest.raises(ms.DamagedConsumeQueue, match="never written"):
        s.dispatch()
    assert s.cqs.dispatched_offset == 0  # nothing half-written
    s.close()


FORCED = dict(now_s=2e9, local_hour=9, disk_ratio=0.99)  # every segment expired, the disk nearly full


def put_segments(s, n=40, size=900):
    """n messages of `size` bytes, each its own entry (~8 a segment of 8 KiB); their ends."""
    return [s.put([put_item(i, size, keys=[f"k{i}"])]).end_offset for i in range(n)]


@pytest.mark.parametrize("disk_ratio", [0.1, 0.8, 0.99])
def test_retention_never_deletes_what_the_dispatcher_has_not_read(tmp_path, disk_ratio):
    """Issue 39: retention asked only for `flushed`, and forced retention deleted the oldest
    segment regardless; nothing moved the dispatched offset, read_from gave b"" below the new
    log start and every later dispatch did nothing: acknowledged messages never indexed."""
    from broker.store.retention import RetentionPolicy
    s = open_store(tmp_path)
    ends = put_segments(s)
    s.dispatch(ends[4])  # the dispatcher lags: 5 of 40 indexed
    s.checkpoint()
    p = s.run_retention(RetentionPolicy(), [], now_s=2e9, local_hour=4, disk_ratio=disk_ratio)
    assert s.commitlog.min_offset <= s.cqs.dispatched_offset == ends[4]
    assert not p.delete and "dispatched offset" in p.held
    s.dispatch()
    s.checkpoint()
    assert s.queue_bounds("t", 0) == (0, 40)
    p = s.run_retention(RetentionPolicy(), [], now_s=2e9, local_hour=4, disk_ratio=disk_ratio)
    assert p.delete and s.commitlog.min_offset > 0
    lo, hi = s.queue_bounds("t", 0)
    assert 0 < lo and hi == 40
    assert [e.queue_offset for e in pull_all(s, offset=lo)] == list(range(lo, 40))
    assert s.lookup_key("t", "k39", 0, 2**62, 2) and not s.lookup_key("t", "k0", 0, 2**62, 2)
    s.close()


def test_retention_keeps_what_no_durable_checkpoint_says_was_dispatched(tmp_path):
    """A kill -9 re-dispatches (and re-applies system entries) from the last checkpoint's
    dispatched offset: those entries must still be there."""
    from broker.store.retention import RetentionPolicy
    s = open_store(tmp_path)
    put_segments(s)
    s.dispatch()
    s.commitlog.flush()
    assert not s.run_retention(RetentionPolicy(), [], **FORCED).delete  # open's checkpoint: 0
    assert s.retention_floor().limit() == "checkpointed"
    s.checkpoint()
    assert s.run_retention(RetentionPolicy(), [], **FORCED).delete
    s.close()


def test_retention_keeps_what_is_not_committed(tmp_path):
    """A replicated store: nothing past the commit point goes, however far the log is written."""
    from broker.store.retention import RetentionPolicy
    s = open_store(tmp_path, replicated=True)
    put_segments(s)
    s.set_committed(3)
    s.dispatch()
    s.checkpoint()
    p = s.run_retention(RetentionPolicy(), [], **FORCED)
    assert not p.delete and "past the committed offset" in p.held, p.held
    assert s.retention_floor().offset == s.confirm_offset == s.commitlog.position(3)[0] + s.commitlog.position(3)[1]
    s.close()


def test_a_log_start_past_the_dispatcher_is_an_error_not_a_silent_stop(tmp_path):
    """Whatever moved the log's start past the dispatched offset (here: deleting segments
    behind the store's back), dispatch raises a named error instead of indexing nothing
    forever, and a restart reports the gap and indexes from the log start on."""
    from broker.store.dispatch import LogStartPassedDispatch
    s = open_store(tmp_path)
    ends = put_segments(s)
    s.dispatch(ends[2])
    s.checkpoint()
    cl = s.commitlog
    assert cl.delete_segments_before(cl.tail.offset - 9000)  # not through run_retention
    assert cl.recent_bytes(0, 1 << 20) == []  # nothing deleted comes back from memory
    with pytest.raises(LogStartPassedDispatch, match="deleted before they were indexed"):
        s.dispatch()
    with pytest.raises(LogStartPassedDispatch):
        s.check_log_start("a test")
    start = cl.min_offset
    s.close()
    s = MessageStore(tmp_path, OPTS)
    report = s.open()
    assert report.dispatch_gap == s.dispatch_gap and f"starts at {start}" in s.dispatch_gap
    assert s.stats()["dispatch_gap"] == s.dispatch_gap
    lo, hi = s.queue_bounds("t", 0)
    assert hi == 40 and [e.queue_offset for e in pull_all(s, offset=lo)] == list(range(lo, 40))
    assert s.commitlog.read(s.commitlog.position(s.commitlog.first_index)[0], 8)
    s.close()


def test_reopen_after_retention_starts_the_log_index_at_the_first_segment(tmp_path):
    """Retention deletes whole position files; the records of deleted entries that share a
    file with kept ones stayed, and a restart took the first of them for the log's first
    entry (a raft leader would have shipped entries it no longer has)."""
    from broker.store.retention import RetentionPolicy
    s = open_store(tmp_path)
    put_segments(s, 60)
    s.dispatch()
    s.checkpoint()
    assert s.run_retention(RetentionPolicy(), [], **FORCED).delete
    first = s.commitlog.first_index
    s.close()
    s = open_store(tmp_path)
    cl = s.commitlog
    assert cl.first_index == first and cl.position(first)[0] == cl.min_offset == cl.start_offset
    assert cl.first_index % OPTS.positions_per_file, "the case needs a record file shared with deleted entries"
    s.close()


def test_a_log_reset_inside_a_segment_dispatches_from_its_first_entry(tmp_path):
    """reset_to an entry in the middle of a segment (a follower behind its leader, whose log
    had restarted there): the dispatcher started at the segment's base, in zeros."""
    lead = open_store(tmp_path / "lead")
    put_segments(lead, 20)
    phys = lead.commitlog.position(10)[0]
    assert phys % OPTS.segment_bytes
    f = open_store(tmp_path / "f", replicated=True)
    f.reset_to(lead.commitlog.read_entry(phys))
    assert f.cqs.dispatched_offset == phys == f.commitlog.start_offset > f.commitlog.min_offset
    f.append_as_follower([lead.commitlog.read_entry(lead.commitlog.position(i)[0]) for i in range(11, 20)])
    f.set_committed(19)
    f.dispatch()
    assert f.queue_bounds("t", 0)[1] == 20 and f.dispatch_gap and "entries 0..9" in f.dispatch_gap
    f.close()
    f = open_store(tmp_path / "f", replicated=True)
    assert f.commitlog.first_index == 10 and f.commitlog.tail.next_index == 20
    f.close()
    lead.close()


@pytest.mark.parametrize("at", [5000, OPTS.segment_bytes - 300])  # inside a segment; near its end: a roll
def test_a_log_restarted_inside_a_segment_survives_restarts_and_a_scan_of_everything(tmp_path, at):
    """restart_at: zeros from the segment's base to the first entry (or to the marker that
    closes the segment when the entry did not fit). A scan of everything began at the base,
    took the zeros for the end of the log and cut the whole log; an empty restarted log came
    back at offset 0, index 0."""
    s = open_store(tmp_path)
    s.restart_at(at, 10)
    s.close()
    s = open_store(tmp_path)
    assert (s.commitlog.tail.offset, s.commitlog.tail.next_index) == (at, 10)
    for i in range(3):
        s.put([put_item(i, 200)])
    s.dispatch()
    tail = s.commitlog.tail
    s.close()
    s = open_store(tmp_path)
    assert s.commitlog.tail == tail and s.queue_bounds("t", 0) == (0, 3)
    s.close()
    shutil.rmtree(tmp_path / "positions")  # and the checkpoint no longer vouches for anything
    (tmp_path / "checkpoint").unlink()
    s = MessageStore(tmp_path, OPTS)
    report = s.open()
    assert report.commitlog.full_scan and report.commitlog.cut_offset is None
    assert s.commitlog.tail == tail and s.commitlog.first_index == 10
    assert [e.queue_offset for e in pull_all(s)] == [0, 1, 2]
    s.close()


def test_reset_to_applies_the_committed_system_entries_it_holds_first(tmp_path):
    """A follower reset by its leader drops its log: committed entries it had not dispatched
    yet (a follower dispatches lazily) would never be applied here."""
    from broker.store.commitlog import NewEntry
    lead = open_store(tmp_path / "lead")
    for i in range(20):
        lead.put([NewEntry("%ACL%", 0, 0, 0, i.to_bytes(16, "big"), b"", b"change-%d" % i)])
    f = open_store(tmp_path / "f", replicated=True)
    applied = []
    f.on_system_entry = lambda topic, body: applied.append(bytes(body))
    raw = [lead.commitlog.read_entry(lead.commitlog.position(i)[0]) for i in range(20)]
    f.append_as_follower(raw[:12])
    f.set_committed(8)
    f.reset_to(raw[15])
    assert applied == [b"change-%d" % i for i in range(9)]
    assert "entries 9..14 were never applied on this node" in f.dispatch_gap
    f.close()
    lead.close()


def test_open_with_a_manifest_naming_a_mid_entry_offset_rebuilds(tmp_path):
    s = open_store(tmp_path)
    fill(s, 10)
    s.cqs.dispatched_offset = s.commitlog.position(3)[0] + 10
    s.write_checkpoint(s.checkpoint_snapshot())
    s.close()
    with deadline():
        s2 = MessageStore(tmp_path, OPTS)
        report = s2.open()
    assert report.indexes_rebuilt
    assert [e.queue_offset for e in pull_all(s2, queue_id=0)] == list(range(5))
    s2.close()


def test_truncate_to_offset_never_hands_out_a_queue_offset_twice(tmp_path):
    """Entries below the cut that were not dispatched yet keep their queue offsets: the
    next put continues after them, not after what the ConsumeQueue holds."""
    s = open_store(tmp_path)
    for i in range(10):  # queue offsets 0..9 in queue 0, an entry each in either format
        s.put([put_item(i, 100)])
    s.dispatch(s.commitlog.position(3)[0])  # consumers saw 0..2
    s.truncate_to_offset(s.commitlog.position(6)[0])  # 0..5 stay
    b = s.put([put_item(10, 100)])
    assert b.queue_offsets == [6]
    s.dispatch()
    assert [e.queue_offset for e in pull_all(s)] == list(range(7))
    s.close()


def rolled_log(s):
    """Entries until one starts the second segment; its index."""
    i = 0
    while True:
        s.put([put_item(i, 700)])
        if s.commitlog.position(i)[0] >= OPTS.segment_bytes:
            return i
        i += 1


def test_truncate_to_an_entry_after_an_end_of_segment_marker(tmp_path):
    """The cut at entry k, the first of the second segment: the log ends where entry k-1
    ends (the marker goes too), and everything after the cut is measured from there."""
    s = open_store(tmp_path)
    k = rolled_log(s)
    s.put([put_item(i, 700) for i in range(k + 1, k + 4)])
    s.dispatch()
    at = s.commitlog.position(k)[0]
    assert at == OPTS.segment_bytes
    s.truncate_to_offset(at)
    tail = s.commitlog.tail
    prev = s.commitlog.position(k - 1)
    assert tail.offset == prev[0] + prev[1] < at and tail.next_index == k
    assert s.cqs.dispatched_offset <= tail.offset
    assert s.commitlog.follows_at(at) and s.commitlog.follows_at(tail.offset)
    # small entries fit in the first segment again: they are dispatched and pulled
    s.put([put_item(i, 50) for i in range(k, k + 6)])
    with deadline():
        s.dispatch()
    got = pull_all(s)
    assert [e.queue_offset for e in got] == list(range(k + 6))
    s.close()
    s2 = open_store(tmp_path)
    assert [e.queue_offset for e in pull_all(s2)] == list(range(k + 6))
    s2.close()


def test_write_checkpoint_drops_a_snapshot_older_than_a_later_checkpoint(tmp_path):
    """Without the Broker: a snapshot taken before a truncation and written after it (by a
    background thread) must not replace the truncation's checkpoint or manifest."""
    s = open_store(tmp_path)
    fill(s, 12)
    s.checkpoint()
    stale = s.checkpoint_snapshot()
    s.truncate_to_offset(s.commitlog.position(5)[0])
    s.put([put_item(i, 777) for i in range(5, 12)])
    s.dispatch()
    s.checkpoint()
    good = s.commitlog.tail
    s.write_checkpoint(stale)
    assert checkpoint_mod.read(tmp_path / "checkpoint").flushed_offset == good.offset
    import json
    manifest = json.loads((tmp_path / "consumequeue" / "manifest.json").read_text())
    assert manifest["dispatched_offset"] == good.offset
    s.close()


def test_write_checkpoint_drops_a_snapshot_taken_before_a_cut_whose_checkpoint_is_pending(tmp_path):
    s = open_store(tmp_path)
    fill(s, 12)
    s.checkpoint()
    before = checkpoint_mod.read(tmp_path / "checkpoint")
    s.put([put_item(i, 100) for i in range(12, 15)])
    s.commitlog.flush()
    stale = s.checkpoint_snapshot()
    s.commitlog.truncate_suffix(5)  # the CommitLog's part of a truncation only
    s.write_checkpoint(stale)
    assert checkpoint_mod.read(tmp_path / "checkpoint") == before
    s.close()


def test_a_cut_waits_for_a_checkpoint_write_in_progress_without_the_broker(tmp_path):
    s = open_store(tmp_path)
    fill(s, 12)
    s.checkpoint()
    stale = s.checkpoint_snapshot()
    real_write = s.cqs.sync_and_write_manifest
    in_write, newer_written = threading.Event(), threading.Event()

    def sync_and_write_manifest(snapshot):
        if threading.current_thread().name == "background":
            in_write.set()
            newer_written.wait(0.5)  # the cut's own manifest must not be written meanwhile
            real_write(snapshot)
        else:
            real_write(snapshot)
            newer_written.set()

    s.cqs.sync_and_write_manifest = sync_and_write_manifest
    bg = threading.Thread(target=s.write_checkpoint, args=(stale,), name="background")
    bg.start()
    assert in_write.wait(5)
    cut = threading.Thread(target=s.truncate_to_offset, args=(s.commitlog.position(5)[0],))
    cut.start()
    bg.join()
    cut.join()
    import json
    manifest = json.loads((tmp_path / "consumequeue" / "manifest.json").read_text())
    assert manifest["dispatched_offset"] <= s.commitlog.tail.offset
    assert checkpoint_mod.read(tmp_path / "checkpoint").flushed_offset == s.commitlog.tail.offset
    s.close()


@pytest.mark.parametrize("flush", ["async", "sync"])
def test_commitlog_segments_start_sparse_and_are_never_zero_filled(tmp_path, flush):
    """Zero-filling segments (ahead, or the first one at start) cost as much CPU as writing
    the data and its fdatasync held up the group commit (files.py has the measurements):
    every segment starts sparse and gets its blocks from the writes."""
    seg = 1 << 20
    s = open_store(tmp_path, flush=flush, segment_bytes=seg, positions_per_file=4096)
    try:
        first = tmp_path / "commitlog" / f"{0:020d}"
        assert os.stat(first).st_blocks * 512 < seg // 4, "the first segment was zero-filled at start"
        n = 0
        while s.commitlog.tail.offset < seg + seg // 2:  # on into the second segment, past its half
            s.put([put_item(n + i, 1000) for i in range(50)])
            n += 50
        s.commitlog.flush()  # flush: sync shows consumers what is flushed
        s.dispatch()
        s.preparer.call(lambda: None).result(timeout=30)  # anything submitted in the background is done
        names = sorted(p.name for p in (tmp_path / "commitlog").iterdir())
        assert not [x for x in names if not x.isdigit()], f"files prepared ahead: {names}"
        assert len(names) == 2
        assert os.stat(tmp_path / "commitlog" / names[1]).st_blocks * 512 < seg, "the second segment was zero-filled"
        assert len(pull_all(s, queue_id=0)) + len(pull_all(s, queue_id=1)) == n
    finally:
        s.close()


def test_a_slave_promoted_to_async_master_still_takes_checkpoints(tmp_path):
    """A slave's watermark (set_confirm_offset) not yet checkpointed, then its promotion to an
    ASYNC master drops it: the next checkpoint raised TypeError (it translated the watermark,
    now None, to an index; seen as "housekeeping failed" in make test's failover drill)."""
    s = open_store(tmp_path)
    fill(s, 10)
    s.set_confirm_offset(s.commitlog.position(5)[0])
    s.drop_confirm_offset()
    s.write_checkpoint(s.checkpoint_snapshot())
    assert s.confirm_offset == s.commitlog.tail.offset  # the flush policy's (async: written)
    s.close()
    driver = (Path(__file__).parents[2] / "replication/master_slave/driver.py").read_text()
    assert "external_confirm =" not in driver, "the driver sets the watermark only through the store"
