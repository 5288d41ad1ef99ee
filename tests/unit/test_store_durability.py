"""Durability of the store under bad interleavings and failed fsyncs.

Checkpoint and flushed offsets must never name more than what is on disk, and never a place
in the middle of an entry: recovery trusts them. The interleavings are forced, not raced:
the "other thread" runs inside a hook at the exact point where it would have to run.
"""

import errno
import os
import threading
import types

import pytest

from broker.server import Broker
from broker.store import checkpoint as checkpoint_mod, codec, message_store as ms
from broker.store.checkpoint import Checkpoint, CheckpointFile
from broker.store.commitlog import CommitLog, StoreNotWritable
from broker.store.files import FsyncFailed
from broker.store.flusher import Flusher
from broker.store.message_store import MessageStore, StoreOptions

from .storeutil import append, item, put_item

SEG = 4096
OPTS = StoreOptions(segment_bytes=8192, cq_records_per_file=16, index_slots=64,
                    index_entries_max=256, positions_per_file=32)


def open_log(path, cp=None, seg=SEG):
    cl = CommitLog(path, seg, positions_per_file=64)
    return cl, cl.recover(cp)


def open_store(path):
    s = MessageStore(path, OPTS)
    s.open()
    return s


def indexes(cl):
    return [cl.read_by_index(i).index for i in range(cl.first_index, cl.tail.next_index)]


# --- Bug 2: flushed / checkpoint going backwards past a truncation ---------------------------


def test_flusher_round_started_before_a_cut_cannot_raise_flushed_above_it(tmp_path):
    """The flusher reads the tail, fsyncs; meanwhile the writer's thread cuts the log. The
    round must not set `flushed` to the tail it read before the cut."""
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 300) for i in range(10)], 1)
    in_fsync, go = threading.Event(), threading.Event()
    real_sync = cl.segments.sync_dirty

    def sync_dirty():
        if threading.current_thread().name == "tidelog-flusher" and not in_fsync.is_set():
            in_fsync.set()
            assert go.wait(5)
        real_sync()

    cl.segments.sync_dirty = sync_dirty
    flushed_reports = []
    f = Flusher(cl, sync=True, interval_ms=5, on_flushed=lambda t, e: flushed_reports.append(t))
    f.start()
    f.request()
    assert in_fsync.wait(5)
    cl.truncate_suffix(4)  # the writer's thread, while the flusher's fsync is in progress
    cut = cl.tail
    go.set()
    f.stop()
    assert f.error is None
    assert cl.flushed.offset <= cl.tail.offset == cut.offset
    assert all(t.offset <= cut.offset for t in flushed_reports)
    # what a checkpoint taken now would say is where an entry ends, and recovery agrees
    fl = cl.flushed
    cl.close()
    cl2, report = open_log(tmp_path, Checkpoint(fl.offset, fl.next_index, fl.last_term))
    assert cl2.tail == cut and report.cut_offset is None and indexes(cl2) == [0, 1, 2, 3]


def test_a_later_flush_after_the_cut_advances_normally(tmp_path):
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 300) for i in range(10)], 1)
    cl.truncate_suffix(4)
    append(cl, [item(i, 500) for i in range(4, 7)], 2)
    assert cl.flush() == cl.tail and cl.flushed == cl.tail


def test_checkpoint_snapshot_older_than_a_truncation_loses(tmp_path):
    """The broker's periodic checkpoint is snapshotted on the loop thread and written in the
    background; a truncation checkpoints synchronously in between. The older snapshot,
    written last, must not replace the truncation's checkpoint."""
    s = open_store(tmp_path)
    s.put([put_item(i, 300) for i in range(12)])
    s.dispatch()
    s.checkpoint()
    broker = types.SimpleNamespace(store=s, offsets=None)
    stale = Broker._checkpoint_snapshot(broker)  # the loop thread, before the truncation
    assert stale[0].flushed_offset == s.commitlog.tail.offset
    cut_at = s.commitlog.position(5)[0]
    s.truncate_to_offset(cut_at)  # checkpoints at once
    s.put([put_item(i, 777) for i in range(5, 12)])  # other sizes: old boundaries fall mid-entry
    s.checkpoint()
    good_tail = s.commitlog.tail
    Broker._write_checkpoint(broker, stale, None)  # the background thread, late
    on_disk = checkpoint_mod.read(tmp_path / "checkpoint")
    assert on_disk.flushed_offset == good_tail.offset, on_disk
    assert on_disk.next_index == good_tail.next_index
    s.close()
    s2 = open_store(tmp_path)
    cl = s2.commitlog
    assert cl.tail == good_tail
    bodies = [len(cl.read_by_index(i).body) for i in range(cl.tail.next_index)]
    assert bodies == [300] * 5 + [777] * 7
    s2.close()


def test_checkpoint_file_orders_writes_by_snapshot_ticket(tmp_path):
    f = CheckpointFile(tmp_path / "checkpoint")
    assert f.load() is None
    old = f.stamp(Checkpoint(1000, 10, 1))
    assert f.write(Checkpoint(500, 5, 1))  # unstamped: a snapshot taken now
    assert not f.write(old)
    newer = f.stamp(Checkpoint(600, 6, 1))
    assert f.write(newer)
    f.close()
    assert checkpoint_mod.read(tmp_path / "checkpoint") == Checkpoint(600, 6, 1)


def test_concurrent_checkpoint_writes_keep_a_valid_newest_slot(tmp_path):
    """Two threads writing at once must not both take the same slot and sequence number."""
    f = CheckpointFile(tmp_path / "checkpoint")
    f.load()
    start = threading.Barrier(4)

    def writer(k):
        start.wait()
        for i in range(200):
            f.write(Checkpoint(k * 100_000 + i, i, 0))

    threads = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert f.seq == 800
    seq, _ = checkpoint_mod.newest((tmp_path / "checkpoint").read_bytes())
    assert seq == 800
    f.close()


def test_recovery_never_starts_mid_entry_when_the_checkpoint_is_wrong(tmp_path):
    """A checkpoint naming an offset where an entry ended before a truncation, which is now
    inside a longer entry: recovery must not scan from there (it would cut good entries)."""
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 200) for i in range(10)], 1)
    cl.flush()
    stale = Checkpoint(cl.tail.offset, cl.tail.next_index, cl.tail.last_term)
    cl.truncate_suffix(3)
    append(cl, [item(i, 450) for i in range(3, 14)], 2)
    cl.flush()
    good = cl.tail
    # the stale offset is inside an entry of the new log (and in the same segment)
    starts = {cl.position(i)[0] for i in range(good.next_index)}
    assert stale.flushed_offset not in starts and stale.flushed_offset < good.offset
    cl.close()
    cl2, report = open_log(tmp_path, stale)
    assert report.full_scan and report.cut_offset is None
    assert cl2.tail == good
    assert [len(cl2.read_by_index(i).body) for i in range(14)] == [200] * 3 + [450] * 11


def test_recovery_rejects_a_checkpoint_past_the_end_of_the_log(tmp_path):
    """The checkpoint names the end of an entry that was cut (its bytes are zeros now)."""
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 200) for i in range(10)], 1)
    cl.flush()
    stale = Checkpoint(cl.tail.offset, cl.tail.next_index, cl.tail.last_term)
    cl.truncate_suffix(6)
    good = cl.tail
    cl.close()
    cl2, report = open_log(tmp_path, stale)
    assert cl2.tail == good and report.full_scan
    assert indexes(cl2) == list(range(6))


def test_recovery_trusts_a_checkpoint_that_is_an_entry_boundary(tmp_path):
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 200) for i in range(10)], 1)
    cl.flush()
    cp = Checkpoint(cl.tail.offset, cl.tail.next_index, cl.tail.last_term)
    append(cl, [item(i, 200) for i in range(10, 15)], 1)
    cl.flush()
    good = cl.tail
    cl.close()
    cl2, report = open_log(tmp_path, cp)
    assert not report.full_scan and report.scanned_from == cp.flushed_offset
    assert report.entries_checked == 5 and cl2.tail == good
    assert codec.HEADER_SIZE < cp.flushed_offset


# --- Bug 5: an fsync error is final; recovery fsyncs what it re-read -----------------------


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def fail_fsync_of(monkeypatch, predicate):
    """os.fsync/os.fdatasync raise EIO for files whose path matches; returns the failures."""
    failures = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def fake(fd, real=real):
            path = fd_path(fd)
            if predicate(path):
                failures.append(path)
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            return real(fd)

        monkeypatch.setattr(os, name, fake)
    return failures


def is_segment(path: str) -> bool:
    return "/commitlog/" in path


def crash(store):
    """kill -9: the process is gone, its writes stay in the page cache, nothing is closed
    cleanly (no final flush or checkpoint)."""
    store.preparer.shutdown()
    store.commitlog.close()
    store.cqs.close()
    store.key_index.close()
    store.cp_file.close()


def test_a_failed_fsync_never_counts_as_flushed(tmp_path, monkeypatch):
    s = open_store(tmp_path)
    s.put([put_item(i, 300) for i in range(5)])
    s.dispatch()
    s.checkpoint()
    good = s.commitlog.flushed
    assert good == s.commitlog.tail
    failures = fail_fsync_of(monkeypatch, is_segment)
    s.put([put_item(i, 300) for i in range(5, 10)])
    with pytest.raises(FsyncFailed):
        s.commitlog.flush()
    assert failures and s.commitlog.flushed == good
    # a later flush or checkpoint must not find "nothing dirty" and call it all flushed
    assert s.commitlog.flush() == good
    s.checkpoint()
    assert checkpoint_mod.read(tmp_path / "checkpoint").flushed_offset == good.offset
    # writes are refused with the store's I/O-error refusal; reads go on
    with pytest.raises(StoreNotWritable, match="fsync failed"):
        s.put([put_item(10)])
    with pytest.raises(StoreNotWritable, match="fsync failed"):
        s.commitlog.append_as_follower([s.commitlog.read_entry(0)])
    assert s.stats()["writable"] is False and "fsync" in s.stats()["not_writable_reason"]
    s.dispatch()
    r = s.get("t", 0, 0, 100, 1 << 20)
    assert r.status == ms.FOUND and r.count == 10
    # even if fsync works again, this process never calls those bytes flushed
    monkeypatch.undo()
    assert s.commitlog.flush() == good
    s.close()
    assert checkpoint_mod.read(tmp_path / "checkpoint").flushed_offset == good.offset
    # a restart re-reads the log and fsyncs it: then it is flushed, and writable again
    s2 = open_store(tmp_path)
    assert s2.commitlog.tail.next_index == 10 and s2.commitlog.flushed == s2.commitlog.tail
    s2.put([put_item(10)])
    s2.close()


def test_the_flusher_reports_a_failed_fsync_to_waiters_and_stops(tmp_path, monkeypatch):
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 300) for i in range(3)], 1)
    cl.flush()
    good = cl.flushed
    fail_fsync_of(monkeypatch, is_segment)
    reports = []
    done = threading.Event()

    def on_flushed(tail, err):
        reports.append((tail, err))
        done.set()

    f = Flusher(cl, sync=True, interval_ms=5, on_flushed=on_flushed)
    f.start()
    append(cl, [item(i, 300) for i in range(3, 6)], 1)
    f.request()
    assert done.wait(5)
    f.stop()
    assert len(reports) == 1 and reports[0][0] == good and isinstance(reports[0][1], FsyncFailed)
    assert isinstance(f.error, FsyncFailed) and cl.flushed == good


def test_a_failed_fsync_during_a_cut_fails_the_store_without_raising(tmp_path, monkeypatch):
    cl, _ = open_log(tmp_path)
    append(cl, [item(i, 300) for i in range(8)], 1)
    cl.flush()
    fail_fsync_of(monkeypatch, is_segment)
    cl.truncate_suffix(5)
    assert cl.tail.next_index == 5 and cl.flushed == cl.tail  # below the cut it was durable
    assert cl.fsync_error is not None
    append_refused = pytest.raises(StoreNotWritable)
    with append_refused:
        append(cl, [item(5)], 1)
    assert cl.flush() == cl.flushed


def test_recovery_fsyncs_what_it_re_read_before_the_checkpoint_calls_it_flushed(tmp_path, monkeypatch):
    s = open_store(tmp_path)
    s.put([put_item(i, 300) for i in range(4)])
    s.checkpoint()
    cp_before = checkpoint_mod.read(tmp_path / "checkpoint")
    s.put([put_item(i, 1500) for i in range(4, 14)])  # into a second segment; never fsynced
    tail = s.commitlog.tail
    assert tail.offset > OPTS.segment_bytes
    crash(s)
    events = []
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def record(fd, real=real):
            events.append(fd_path(fd))
            return real(fd)

        monkeypatch.setattr(os, name, record)
    real_write = CheckpointFile.write

    def write(self, cp):
        events.append(("checkpoint", cp.flushed_offset))
        return real_write(self, cp)

    monkeypatch.setattr(CheckpointFile, "write", write)
    s2 = open_store(tmp_path)
    assert s2.commitlog.tail == tail and s2.commitlog.flushed == tail
    first_cp = next(i for i, e in enumerate(events) if isinstance(e, tuple))
    assert events[first_cp] == ("checkpoint", tail.offset)
    synced = set(events[:first_cp])
    seg_dir = str(tmp_path / "commitlog")
    for f in s2.commitlog.segments.files:
        if f.base + f.size > cp_before.flushed_offset:
            assert str(f.path) in synced, (f.path, events)
    assert seg_dir in synced  # the directory too: a segment created just before the crash
    s2.close()


def test_recovery_with_a_failing_fsync_serves_reads_and_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    s = open_store(tmp_path)
    s.put([put_item(i, 300) for i in range(4)])
    s.checkpoint()
    cp_before = checkpoint_mod.read(tmp_path / "checkpoint")
    s.put([put_item(i, 300) for i in range(4, 9)])
    tail = s.commitlog.tail
    crash(s)
    fail_fsync_of(monkeypatch, is_segment)
    s2 = open_store(tmp_path)  # must not raise
    cl = s2.commitlog
    assert cl.tail == tail and cl.flushed.offset == cp_before.flushed_offset
    assert checkpoint_mod.read(tmp_path / "checkpoint").flushed_offset == cp_before.flushed_offset
    with pytest.raises(StoreNotWritable, match="fsync failed"):
        s2.put([put_item(9)])
    s2.dispatch()
    assert s2.get("t", 0, 0, 100, 1 << 20).count == 9
    s2.close()
    monkeypatch.undo()
    s3 = open_store(tmp_path)
    assert s3.commitlog.tail == tail and s3.commitlog.flushed == tail
    s3.close()
