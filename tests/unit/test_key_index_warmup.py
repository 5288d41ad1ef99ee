"""A store's first key-index file and (without the C put, _zonewalk.index_put) numpy are made
off the event loop (key_index.py, KeyIndex.load): made in the first big put they stalled the
loop ~0.3 s (40 MB of zeros plus numpy's import), long enough for a new raft group's leader to miss check-quorum in its first
burst on a loaded box (measured: 8 of 13 fresh raft-3 groups re-elected during a 2 s W=256
burst, 0 of 8 with the warm-up). Here the put must take the prepared file: creating one on
the caller's thread fails the test."""

from __future__ import annotations

import pytest

from broker.store import key_index
from broker.store.files import DataFile, Preparer
from broker.store.key_index import KeyIndex


def _settled(preparer: Preparer) -> None:
    preparer.call(lambda: None).result(timeout=30)  # one thread: everything before it is done


@pytest.mark.parametrize("c_put", [True, False])
def test_first_file_and_numpy_are_ready_before_the_first_put(tmp_path, monkeypatch, c_put):
    if c_put and key_index._zonewalk is None:
        pytest.skip("the C fast path is not built here")
    if not c_put:
        monkeypatch.setattr(key_index, "_zonewalk", None)
    key_index._numpy.cache_clear()
    preparer = Preparer()
    ki = KeyIndex(tmp_path, slots=64, entries_max=1_000, preparer=preparer)
    try:
        assert ki.load()
        _settled(preparer)
        # numpy is imported ahead when the puts need it: not with the C put
        assert key_index._numpy.cache_info().currsize == (0 if c_put else 1), "numpy was (not) imported ahead"

        def no_create_here(*a, **k):
            raise AssertionError("the first index file was zero-filled in the put, not ahead")
        monkeypatch.setattr(DataFile, "create", no_create_here)
        ki.put_many([(list(range(100)), 4096, 1_700_000_000_000)])
        assert [f.count for f in ki.files] == [100]
        assert ki.lookup(7, 0, 2**62, 10) == [4096]
    finally:
        ki.close()
        preparer.shutdown()


def test_a_reopened_half_full_index_prepares_its_next_file(tmp_path, monkeypatch):
    ki = KeyIndex(tmp_path, slots=16, entries_max=100)  # no preparer: files made in the put
    ki.load()
    ki.put_many([(list(range(60)), 1, 1_700_000_000_000)])
    ki.close()
    preparer = Preparer()
    ki = KeyIndex(tmp_path, slots=16, entries_max=100, preparer=preparer)
    try:
        ki.load()
        _settled(preparer)
        monkeypatch.setattr(DataFile, "create", lambda *a, **k: (_ for _ in ()).throw(
            AssertionError("the next file was zero-filled in the put, not ahead")))
        ki.put_many([(list(range(60)), 2, 1_700_000_001_000)])  # rolls into a second file
        assert [f.count for f in ki.files] == [100, 20]
    finally:
        ki.close()
        preparer.shutdown()


def test_sync_writes_back_without_holding_the_gil(tmp_path, monkeypatch):
    """The checkpoint thread's sync must not use mmap.flush (msync holds the GIL in CPython
    3.11: the event loop stopped for the whole write-back, 60-90 ms on a busy index) but
    fdatasync of the file, which releases it."""
    import mmap
    import os

    class NoFlush(mmap.mmap):
        def flush(self, *a):
            raise AssertionError("mmap.flush(): msync holds the GIL for the whole write-back")
    monkeypatch.setattr(mmap, "mmap", NoFlush)
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real(fd))[1])
    ki = KeyIndex(tmp_path, slots=64, entries_max=1_000)
    try:
        ki.load()
        ki.put_many([(list(range(100)), 4096, 1_700_000_000_000)])
        synced.clear()  # (creating the file zero-filled and fdatasynced it, on the same fd number)
        ki.sync()
        assert synced == [ki.files[0].df.fd], "the index file was not written back"
    finally:
        ki.close()
    ki = KeyIndex(tmp_path, slots=64, entries_max=1_000)
    try:
        ki.load()
        assert ki.lookup(7, 0, 2**62, 10) == [4096]
    finally:
        ki.close()
