"""File descriptors (issue 14): ConsumeQueue files open on demand under an LRU bound, and
running out of descriptors (EMFILE) refuses one operation without making the store
unwritable or unrecoverable."""

import errno
import os
import resource

import pytest

from broker.fdlimit import NOFILE_CAP, raise_nofile_limit
from broker.store import codec
from broker.store.commitlog import CommitLog, StoreNotWritable
from broker.store.consume_queue import RECORD, ConsumeQueueSet
from broker.store.files import OpenFiles, TooManyOpenFiles, open_fd
from broker.store.message_store import MessageStore, StoreOptions

from .storeutil import append, item, put_item

SEG = 4096


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def emfile_for(monkeypatch, under, exists_ok=False):
    """os.open fails with EMFILE for paths under `under` (only new files unless exists_ok);
    returns the list of refused paths."""
    real_open, refused = os.open, []

    def fake_open(path, flags, mode=0o777, **kw):
        p = str(path)
        if p.startswith(str(under)) and (exists_ok or not os.path.exists(p) or p.endswith(".prep")):
            refused.append(p)
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", fake_open)
    return refused


def test_consume_queues_hold_at_most_open_files_max_descriptors(tmp_path):
    """400 queues, bound 16: the process holds at most 16 more descriptors than before, and
    every queue still reads back what was written, also after a reopen."""
    before = open_fds()
    cqs = ConsumeQueueSet(tmp_path, records_per_file=64, open_files_max=16)
    cqs.load()
    for q in range(400):
        cq = cqs.get_or_create(f"topic{q}", 0)
        cq.write(0, RECORD.pack(1000 + q, 77, 0) * 3)
        cq.records.flush_tail()  # to the file (RecordFile holds appends in memory)
        assert len(cqs.open_files) <= 16
    assert open_fds() - before <= 16
    for q in range(400):
        assert cqs.find(f"topic{q}", 0).get(0, 5) == [(1000 + q, 77, 0)] * 3
    assert open_fds() - before <= 16
    cqs.sync_and_write_manifest(cqs.snapshot())  # closed dirty files are fsynced too
    assert all(not cq.records.files._dirty for cq in cqs.queues.values())
    cqs.close()
    assert open_fds() == before
    again = ConsumeQueueSet(tmp_path, records_per_file=64, open_files_max=16)
    assert again.load()  # agrees with the manifest
    assert open_fds() - before <= 16
    assert again.find("topic399", 0).get(0, 5) == [(1399, 77, 0)] * 3
    assert again.find("topic0", 0).max_offset == 3
    again.close()


def test_an_open_out_of_descriptors_closes_idle_files_and_retries(tmp_path, monkeypatch):
    pool = OpenFiles(8)
    cqs = ConsumeQueueSet(tmp_path, records_per_file=64, open_files_max=8)
    cqs.open_files = pool
    for q in range(5):
        cq = cqs.get_or_create(f"t{q}", 0)
        cq.records.files.pool = pool
    for q in range(5):
        cq = cqs.find(f"t{q}", 0)
        cq.write(0, RECORD.pack(1, 2, 0))
        cq.records.flush_tail()
    assert len(pool) == 5
    real_open, calls = os.open, []

    def once_emfile(path, flags, mode=0o777, **kw):
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode, **kw)

    monkeypatch.setattr(os, "open", once_emfile)
    fd = open_fd(tmp_path / "x", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    assert len(calls) == 2 and len(pool) == 0  # the idle ones went, the retry worked
    monkeypatch.setattr(os, "open", lambda *a, **k: (_ for _ in ()).throw(OSError(errno.EMFILE, "Too many open files")))
    with pytest.raises(TooManyOpenFiles, match="file descriptor limit"):
        open_fd(tmp_path / "y", os.O_RDWR | os.O_CREAT)
    monkeypatch.undo()
    assert cqs.find("t3", 0).get(0, 1) == [(1, 2, 0)]  # reopened on demand
    cqs.close()


def test_emfile_at_a_segment_roll_leaves_the_log_writable_and_recoverable(tmp_path, monkeypatch):
    """The roll cannot open the next segment: that append fails with a retriable StoreBusy,
    nothing of it is stored, no half-made segment is left; once descriptors are free the
    same append succeeds, and a restart recovers every acknowledged entry."""
    cl = CommitLog(tmp_path, SEG, positions_per_file=64)
    cl.recover(None)
    acked = []
    i = 0
    while cl.tail.offset < SEG - 600:  # fill the first segment almost up
        append(cl, [item(i, 300)], 0, 0)
        acked.append(i)
        i += 1
    tail = cl.tail
    refused = emfile_for(monkeypatch, tmp_path / "commitlog")
    for _ in range(2):  # each try is refused the same way, and changes nothing
        with pytest.raises(StoreNotWritable, match="retry"):
            append(cl, [item(k, 300) for k in range(i, i + 3)], 0, 0)
        assert cl.tail == tail and cl.unwritable_reason is None
    assert refused
    assert sorted(os.listdir(tmp_path / "commitlog")) == ["%020d" % 0]
    monkeypatch.undo()
    append(cl, [item(k, 300) for k in range(i, i + 3)], 0, 0)  # the fds are back: it works
    acked += [i, i + 1, i + 2]
    assert cl.tail.offset > SEG and cl.unwritable_reason is None
    cl.flush()
    cl.close()
    cl2 = CommitLog(tmp_path, SEG, positions_per_file=64)
    report = cl2.recover(None)
    assert report.cut_offset is None
    assert [int.from_bytes(cl2.read_by_index(k).msg_id, "big") for k in range(len(acked))] == acked
    cl2.close()


def test_a_store_with_thousands_of_queues_stays_under_its_descriptor_bound(tmp_path):
    before = open_fds()
    opts = StoreOptions(segment_bytes=1 << 20, cq_records_per_file=64, index_slots=64,
                        index_entries_max=8192, positions_per_file=1024,
                        consume_queue_open_files_max=32)
    store = MessageStore(tmp_path, opts)
    store.open()
    for q in range(2000):
        store.put([put_item(q, 50, topic=f"auto{q}")])
    store.dispatch()
    store.checkpoint()
    peak = open_fds() - before
    assert peak <= 32 + 16, peak  # + segments, positions, index, checkpoint
    store.close()
    again = MessageStore(tmp_path, opts)
    again.open()
    assert open_fds() - before <= 32 + 16
    for q in (0, 999, 1999):
        assert again.get(f"auto{q}", 0, 0, 10, 1 << 20).count == 1
    again.close()


def test_raise_nofile_limit_lifts_the_soft_limit_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if soft > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        got = raise_nofile_limit()
        want = hard if hard != resource.RLIM_INFINITY and hard <= NOFILE_CAP else NOFILE_CAP
        assert got == (want, hard) == resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
