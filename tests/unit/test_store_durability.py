"""Durability of the store under bad interleavings and failed fsyncs.

Checkpoint and flushed offsets must never name more than what is on disk, and never a place
in the middle of an entry: recovery trusts them. The interleavings are forced, not raced:
the "other thread" runs inside a hook at the exact point where it would have to run.
"""

import dataclasses
import errno
import itertools
import json
import os
import random
import shutil
import signal
import tempfile
import threading
import types
from pathlib import Path

import pytest

from broker.server import Broker
from broker.store import checkpoint as checkpoint_mod, codec, message_store as ms
from broker.store.checkpoint import Checkpoint, CheckpointFile
from broker.store.commitlog import CommitLog, StoreNotWritable
from broker.store.files import FsyncFailed
from broker.store.flusher import Flusher
from broker.store.message_store import MessageStore, StoreOptions

from .pagecache import PowerLoss
from .storeutil import append, item, put_item

SEG = 4096
OPTS = StoreOptions(segment_bytes=8192, cq_records_per_file=16, index_slots=64,
                    index_entries_max=256, positions_per_file=32)


def open_log(path, cp=None, seg=SEG):
    cl = CommitLog(path, seg, positions_per_file=64)
    return cl, cl.recover(cp)


def open_store(path, commitlog_format: int = 1):
    """Format 1 by default: these tests count entries as messages (the CommitLog's cuts and
    flushes do not depend on the format; the power-loss run below covers both)."""
    s = MessageStore(path, dataclasses.replace(OPTS, commitlog_format=commitlog_format))
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
    broker = types.SimpleNamespace(store=s, offsets=None)
    s.put([put_item(i, 300) for i in range(12)])
    s.dispatch()
    s.checkpoint()
    stale = s.checkpoint_snapshot()  # the loop thread, before the truncation
    assert stale[0].flushed_offset == s.commitlog.tail.offset
    cut_at = s.commitlog.position(5)[0]
    s.truncate_to_offset(cut_at)  # checkpoints at once
    s.put([put_item(i, 777) for i in range(5, 12)])  # other sizes: old boundaries fall mid-entry
    s.dispatch()
    s.checkpoint()
    good_tail = s.commitlog.tail
    Broker._write_checkpoint(broker, stale, None)  # the background thread, late
    on_disk = checkpoint_mod.read(tmp_path / "checkpoint")
    assert on_disk.flushed_offset == good_tail.offset, on_disk
    assert on_disk.next_index == good_tail.next_index
    # nor the ConsumeQueue manifest of that snapshot: its dispatched offset is mid-entry now
    manifest = json.loads((tmp_path / "consumequeue" / "manifest.json").read_text())
    assert manifest["dispatched_offset"] == good_tail.offset, manifest
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


def test_a_new_checkpoint_file_is_made_durable_in_its_directory(tmp_path, monkeypatch):
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd_path(fd)), real(fd))[1])
    f = CheckpointFile(tmp_path / "checkpoint")
    f.load()
    f.close()
    assert str(tmp_path) in synced


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


# --- power loss on the real store (tests/unit/pagecache.py) --------------------------------

POWER_SEEDS = int(os.environ.get("TIDELOG_POWER_SEEDS", "200"))  # TIDELOG_POWER_SEED=n: just n
POWER_STEPS = 40


def open_sim_store(path, fmt: int):
    s = MessageStore(path, dataclasses.replace(OPTS, commitlog_format=fmt))
    # no background zero-filling: what is on disk must depend on the seed alone
    s.key_index.preparer = None
    s.open()  # the store orders its own checkpoint writes and cuts (no Broker here)
    return s


class PowerRun:
    """Random appends, flushes, checkpoints (also stale background ones written late),
    truncations (also during a flush's fsync), kill -9s and power cuts against one store;
    checks the live store's flushed offset and checkpoint after every step and every
    recovery against a model of the log."""

    def __init__(self, path, seed, monkeypatch, fmt: int):
        self.path, self.rng, self.fmt = path, random.Random(seed), fmt
        self.store = open_sim_store(path, fmt)
        crash(self.store)
        self.power = PowerLoss(path, self.rng)
        self.power.install(monkeypatch)
        self.store = open_sim_store(path, fmt)
        self.model: list[tuple] = []  # entry i: its messages' (queue id, body)
        self.durable = 0  # entries 0..durable-1 were reported flushed
        self.pending: list = []  # stamped snapshots not yet written (the background thread)
        self.serial = 0
        self.log: list[str] = []

    def step(self) -> None:
        r, s, cl = self.rng.random(), self.store, self.store.commitlog
        if r < 0.36:
            items, msgs = [], []
            for _ in range(self.rng.randint(1, 4)):
                self.serial += 1
                body = self.rng.randbytes(self.rng.choice([0, 10, 300, 1500, 3000]))
                q = self.rng.randrange(2)
                items.append(put_item(self.serial, 0, queue_id=q)._replace(body=body))
                msgs.append((q, body))
            self.log.append(f"put {len(items)}")
            b = s.put(items)
            for _, run in itertools.groupby(zip(b.indexes, msgs), key=lambda im: im[0]):
                self.model.append(tuple(m for _, m in run))  # an entry: a message, or a batch
        elif r < 0.48:
            self.log.append("flush")
            self.flushed(cl.flush())
        elif r < 0.54:
            self.log.append("checkpoint")
            s.dispatch()
            s.checkpoint()
            self.flushed(cl.flushed)
        elif r < 0.61:
            self.log.append("snapshot for the background")
            self.pending.append(s.checkpoint_snapshot())
        elif r < 0.67 and self.pending:
            self.log.append("background checkpoint write")
            snap = self.pending.pop(0)
            if self.rng.random() < 0.5:  # the Broker's background path, else the store's own
                broker = types.SimpleNamespace(store=s, offsets=None)
                Broker._write_checkpoint(broker, snap, None)
            else:
                s.write_checkpoint(snap)
        elif r < 0.74 and cl.tail.next_index > 0:
            self.truncate()
        elif r < 0.78 and cl.tail.next_index > 0:
            # a flusher round: it reads the tail, and the cut happens during its fsync
            real = cl.segments.sync_dirty

            def cut_during_fsync():
                cl.segments.sync_dirty = real
                self.truncate()
                real()

            cl.segments.sync_dirty = cut_during_fsync
            self.log.append("flush racing a cut")
            try:
                self.flushed(cl.flush())
            finally:
                cl.segments.sync_dirty = real  # when the round had nothing to fsync
        elif r < 0.85:
            self.log.append("kill -9")
            self.restart(power_cut=False)
        elif r < 0.93:
            self.log.append("power cut")
            self.restart(power_cut=True)
        else:
            self.log.append("dispatch")
            s.dispatch()
        self.check_live()

    def flushed(self, tail) -> None:
        assert tail.next_index <= len(self.model), (tail, len(self.model))
        self.durable = max(self.durable, tail.next_index)

    def truncate(self) -> None:
        s, cl = self.store, self.store.commitlog
        k = self.rng.randrange(cl.tail.next_index)
        at_start = self.rng.random() < 0.5
        self.log.append(f"truncate to {k} ({'its start' if at_start else 'where k-1 ends'})")
        if self.rng.random() < 0.5:
            s.dispatch()  # else entries below the cut may not be dispatched yet
        # entry k's start (after an end-of-segment marker when it opened a segment), or
        # where entry k-1 ends: the same cut
        p = cl.position(k - 1) if k and not at_start else (cl.position(k)[0], 0)
        s.truncate_to_offset(p[0] + p[1])
        assert cl.tail.next_index == k
        del self.model[k:]
        self.durable = min(self.durable, k)

    def check_live(self) -> None:
        """Neither the flushed offset nor the checkpoint on disk name more than the log
        holds, and the checkpoint names where an entry ends."""
        cl = self.store.commitlog
        assert cl.flushed.offset <= cl.tail.offset and cl.flushed.next_index <= cl.tail.next_index, \
            (cl.flushed, cl.tail)
        cp = checkpoint_mod.read(self.path / "checkpoint")
        assert cp is not None and cp.flushed_offset <= cl.flushed.offset, (cp, cl.flushed)
        if cp.next_index > cl.first_index:
            phys, size, _term = cl.position(cp.next_index - 1)
            end = phys + size
            if end != cp.flushed_offset:  # only an end-of-segment marker may lie between
                assert cp.flushed_offset % OPTS.segment_bytes == 0, (cp, phys, size)
                assert codec.peek(cl.read(end, 8)) == (cp.flushed_offset - end, codec.BLANK_MAGIC)

    def restart(self, power_cut: bool) -> None:
        crash(self.store)
        self.pending.clear()
        if power_cut:
            self.power.crash()
        self.store = s = open_sim_store(self.path, self.fmt)
        cl = s.commitlog
        n = cl.tail.next_index
        assert self.durable <= n <= len(self.model), (self.durable, n, len(self.model))
        if not power_cut:  # the page cache kept everything
            assert n == len(self.model), (n, len(self.model))
        for i in range(n):
            e = cl.read_by_index(i)  # an Entry (format 1) or a Batch (2)
            got = tuple((e.queue_id, r.body) for r in e.records) if hasattr(e, "records") else \
                ((e.queue_id, e.body),)
            assert e.index == i and got == self.model[i], i
        walked = [e.index for _at, e, _why in cl._walk(cl.min_offset) if e is not None]
        assert walked == list(range(n))
        s.dispatch()
        for q in range(2):
            got = [(e.queue_id, e.body) for e in pull(s, q)]
            assert got == [m for entry in self.model[:n] for m in entry if m[0] == q], q
        del self.model[n:]
        assert cl.flushed == cl.tail
        self.durable = cl.flushed.next_index  # recovery says all of it is flushed now

    def close(self) -> None:
        crash(self.store)


def pull(store, q):
    out, offset = [], 0
    while True:
        r = store.get("t", q, offset, 64, 1 << 20)
        if r.status != ms.FOUND:
            return out
        out += list(codec.iter_messages(r.data, from_queue_offset=offset))
        offset = r.next_offset


@pytest.fixture
def sim_dir(tmp_path):
    """A directory on tmpfs when there is one: the runs create and remove many files."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    d = Path(tempfile.mkdtemp(prefix="tidelog-power-", dir=shm))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


SEED_DEADLINE_S = 10  # a run takes ~50 ms; one that loops must fail, not hang the suite


class RunTooLong(Exception):
    pass


def _too_long(signum, frame):
    raise RunTooLong(f"a run took over {SEED_DEADLINE_S} s (a recovery or dispatch loop that "
                     "does not advance?)")


def power_run(sim_dir, seed, monkeypatch, fmt: int) -> None:
    path = sim_dir / str(seed)
    with monkeypatch.context() as mp:
        signal.setitimer(signal.ITIMER_REAL, SEED_DEADLINE_S)
        run = None
        try:
            run = PowerRun(path, seed, mp, fmt)
            for _ in range(POWER_STEPS):
                run.step()
            run.restart(power_cut=True)
        except BaseException:
            steps = "; ".join(run.log) if run else "(none)"
            print(f"power-loss run (format {fmt}) failed with seed {seed} (TIDELOG_POWER_SEED={seed} replays "
                  f"it alone); steps: {steps}")
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if run is not None:
                run.close()
    shutil.rmtree(path)


@pytest.mark.parametrize("fmt", [1, 2])
def test_power_loss_keeps_every_flushed_entry_and_a_consistent_prefix(sim_dir, monkeypatch, fmt):
    seeds = ([int(os.environ["TIDELOG_POWER_SEED"])] if "TIDELOG_POWER_SEED" in os.environ
             else range(POWER_SEEDS))
    old = signal.signal(signal.SIGALRM, _too_long)
    try:
        for seed in seeds:
            power_run(sim_dir / f"f{fmt}", seed, monkeypatch, fmt)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
