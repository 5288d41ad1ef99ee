"""Retention in the storage-fault simulation (issue 39): a seeded run of the real store --
appends of messages and system entries, flushes, commit points that lag (a replicated store's
set_committed, or the flush policy's), a dispatcher that lags by a random amount, checkpoints
(also stale background ones), cuts, retention at random points (the delete hour, the clean
threshold, the force threshold, with a disk-usage ratio the run picks), kill -9s and power cuts
(tests/unit/pagecache.py) -- after every recovery, a full dispatch and a checker:

- every committed entry the log still holds is indexed: its messages in their ConsumeQueue
  (read back through `get`, in order, nothing missing, nothing extra) and its keys in the
  key index;
- every committed system entry, also every one retention deleted since, was applied;
- nothing a reader uses points below the log start: a pull below a queue's start is
  OFFSET_TOO_SMALL, a key lookup gives only entries the log holds;
- the store never found its log start past its dispatched offset (OpenReport.dispatch_gap),
  no exception escapes, and each retention deleted nothing past what was flushed, committed,
  dispatched and recorded as dispatched in the manifest on disk.

TIDELOG_RETENTION_SEED=n replays one seed (a failing run prints it and its steps);
TIDELOG_RETENTION_SEEDS sets how many run. The mutation test puts the old rule back (flushed
only, forced retention regardless of the dispatcher) and requires the checker to catch it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import time
import types

import pytest

from broker.server import Broker
from broker.store import checkpoint as checkpoint_mod, codec, message_store as ms, retention
from broker.store.commitlog import NewEntry
from broker.store.message_store import MessageStore

from .pagecache import PowerLoss
from .storeutil import put_item
from .test_store_durability import OPTS, SEED_DEADLINE_S, _too_long, crash, sim_dir  # noqa: F401

SEEDS = int(os.environ.get("TIDELOG_RETENTION_SEEDS", "120"))
STEPS = 60
MUTANT_SEEDS_MAX = 60  # the old rule must be caught within this many seeds
SYSTEM_TOPICS = ("%ACL%", "%TOPIC%", "%OFFSET%")
POLICY = retention.RetentionPolicy()  # 72 h, at 04, clean 0.75, force 0.85


class RetentionRun:
    """One seeded run; `mode`: "async" (consumers see what is written), "sync" (what is
    fsynced) or "replicated" (what the run says is committed, lagging behind the tail)."""

    def __init__(self, path, seed, monkeypatch, fmt: int, mode: str, checks: str = "all"):
        self.path, self.rng, self.fmt, self.mode = path, random_for(seed), fmt, mode
        # "all"; "end-state": not each deletion against the floor; "data": nor the store's
        # own word (its log start against its dispatched offset, a reported gap) -- only
        # what readers get back and what was applied
        self.floor_check, self.invariant_check = checks == "all", checks != "data"
        self.opts = dataclasses.replace(OPTS, commitlog_format=fmt, flush="sync" if mode == "sync" else "async",
                                        replicated=mode == "replicated")
        self.applied: set[bytes] = set()  # system entries applied (their effects are durable:
        # acl.json and topics.json are written as they are applied)
        self.store = self.open()
        crash(self.store)
        self.power = PowerLoss(path, self.rng)
        self.power.install(monkeypatch)
        self.store = self.open()
        self.model: list[tuple] = []  # entry i: ("sys", body) or its messages' (queue, body, key)
        self.committed = -1  # replicated: entries up to this index are committed
        self.durable = 0
        self.pending: list = []
        self.serial = 0
        self.log: list[str] = []
        self.reset_at = 0  # the log restarted here last (its queues with it)
        self.never_applied: set[bytes] = set()  # system entries dropped uncommitted by a restart

    def open(self) -> MessageStore:
        s = MessageStore(self.path, self.opts)
        s.key_index.preparer = None  # no background zero-filling: the disk depends on the seed alone
        s.on_system_entry = lambda topic, body: self.applied.add(bytes(body))
        report = s.open()
        assert report.dispatch_gap is None or not self.invariant_check, report.dispatch_gap
        return s

    # --- steps ---------------------------------------------------------------------------

    def step(self) -> None:
        r, s, cl = self.rng.random(), self.store, self.store.commitlog
        if r < 0.28:
            self.put_messages()
        elif r < 0.34:
            self.serial += 1
            body = b"sys-%d" % self.serial
            self.log.append("put system entry")
            s.put([NewEntry(self.rng.choice(SYSTEM_TOPICS), 0, 0, 0, bytes(16), b"", body)])
            self.model.append(("sys", body))
        elif r < 0.42:
            self.log.append("flush")
            self.flushed(cl.flush())
        elif r < 0.50 and self.mode == "replicated" and cl.tail.next_index > self.committed + 1:
            self.committed = self.rng.randint(self.committed + 1, cl.tail.next_index - 1)
            self.log.append(f"commit to {self.committed}")
            s.set_committed(self.committed)
        elif r < 0.60:
            self.dispatch_some()
        elif r < 0.65:
            self.log.append("checkpoint")
            s.checkpoint()
            self.flushed(cl.flushed)
        elif r < 0.69:
            self.log.append("snapshot for the background")
            self.pending.append(s.checkpoint_snapshot())
        elif r < 0.73 and self.pending:
            self.log.append("background checkpoint write")
            snap = self.pending.pop(0)
            Broker._write_checkpoint(types.SimpleNamespace(store=s, offsets=None), snap, None)
        elif r < 0.84:
            self.retention()
        elif r < 0.87 and cl.tail.next_index > cl.first_index:
            self.truncate()
        elif r < 0.89:
            self.restart_log()
        elif r < 0.94:
            self.log.append("kill -9")
            self.restart(power_cut=False)
        else:
            self.log.append("power cut")
            self.restart(power_cut=True)
        self.check_live()

    def put_messages(self) -> None:
        items, msgs = [], []
        for _ in range(self.rng.randint(1, 4)):
            self.serial += 1
            body = self.rng.randbytes(self.rng.choice([0, 10, 300, 1500, 3000]))
            q, key = self.rng.randrange(2), (f"k{self.serial}" if self.rng.random() < 0.5 else None)
            items.append(put_item(self.serial, 0, queue_id=q, keys=[key] if key else None)._replace(body=body))
            msgs.append((q, body, key))
        self.log.append(f"put {len(items)}")
        b = self.store.put(items)
        for _, run in itertools.groupby(zip(b.indexes, msgs), key=lambda im: im[0]):
            self.model.append(tuple(m for _, m in run))  # an entry: a message, or a batch

    def dispatch_some(self) -> None:
        """The dispatcher catches up all the way, or only part of the way (it lags)."""
        s, cl = self.store, self.store.commitlog
        lo = cl.first_index_at_or_after(s.cqs.dispatched_offset)
        hi = cl.first_index_at_or_after(s.confirm_offset)  # entries [lo, hi) are confirmed
        if hi > lo and self.rng.random() < 0.6:
            k = self.rng.randrange(lo, hi)
            phys, size, _ = cl.position(k)
            self.log.append(f"dispatch to entry {k}")
            s.dispatch(phys + size)
        else:
            self.log.append("dispatch")
            s.dispatch()

    def retention(self) -> None:
        s, cl = self.store, self.store.commitlog
        kind = self.rng.choice(["hour", "clean", "force"])
        expired = self.rng.random() < 0.6
        now = time.time() + (400 * 3600 if expired else 0)
        hour = 4 if kind != "hour" or self.rng.random() < 0.7 else 13
        ratio = {"hour": self.rng.uniform(0, 0.75), "clean": self.rng.uniform(0.75, 0.85),
                 "force": self.rng.uniform(0.85, 1.0)}[kind]
        self.log.append(f"retention ({kind}, {'expired' if expired else 'fresh'}, hour {hour}, disk {ratio:.2f})")
        manifest = self.manifest_dispatched()
        floor = min(cl.flushed.offset, s.confirm_offset, s.cqs.dispatched_offset, manifest)
        undispatched = [i for i in range(cl.first_index, cl.tail.next_index) if cl.position(i)[0] >= floor]
        s.run_retention(POLICY, [], now_s=now, local_hour=hour, disk_ratio=ratio)
        if self.floor_check:
            assert cl.min_offset <= floor, f"retention deleted up to {cl.min_offset}, past the floor {floor}"
            assert not undispatched or cl.first_index <= undispatched[0], (cl.first_index, undispatched[:1])

    def manifest_dispatched(self) -> int:
        try:
            m = json.loads((self.path / "consumequeue" / "manifest.json").read_text())
        except FileNotFoundError:
            return 0
        return m["dispatched_offset"]

    def truncate(self) -> None:
        """replicated: a raft follower cuts its uncommitted suffix (never what it dispatched);
        otherwise a master-slave replica cuts at a fork point (even below what consumers saw)."""
        s, cl = self.store, self.store.commitlog
        low = cl.first_index
        if self.mode == "replicated":
            low = max(low, self.committed + 1, cl.first_index_at_or_after(s.cqs.dispatched_offset))
        if low >= cl.tail.next_index:
            return
        k = self.rng.randrange(low, cl.tail.next_index)
        self.log.append(f"truncate to {k}")
        if self.mode == "replicated":
            s.truncate_suffix(k)
            s.recompute_queue_offsets()  # it leads again (RaftDriver on becoming leader)
        else:
            p = cl.position(k)
            s.truncate_to_offset(p[0])
        assert cl.tail.next_index == k
        del self.model[k:]
        self.durable = min(self.durable, k)
        self.committed = min(self.committed, k - 1)

    def restart_log(self) -> None:
        """The log restarts at a later entry, maybe inside a segment: replicated, a raft
        follower reset by a leader whose retention deleted what it needed next (reset_to);
        otherwise a slave that shares nothing with its master (restart_at)."""
        s, cl = self.store, self.store.commitlog
        n = cl.tail.next_index
        k = n + self.rng.randrange(4)
        off = cl.tail.offset + self.rng.choice([0, 8, 100, 5000, 9000])
        self.log.append(f"restart the log at entry {k}, offset {off}")
        if self.mode == "replicated":
            self.serial += 1
            body = self.rng.randbytes(self.rng.choice([10, 300]))
            key = f"k{self.serial}"
            seg_end = off - off % OPTS.segment_bytes + OPTS.segment_bytes
            size = codec.HEADER_SIZE + 1 + len(codec.message_properties(keys=[key])) + len(body)
            if off + size + codec.BLANK_SIZE_MIN > seg_end:  # where its leader put it
                off = seg_end
            raw = b"".join(codec.encode_parts(k, cl.tail.last_term, off, 0, 1, 1, bytes(16), 0, 0, b"t",
                                              codec.message_properties(keys=[key]), body))
            applied = cl.first_index_at_or_after(s.cqs.dispatched_offset)
            self.never_applied |= {e[1] for e in self.model[max(applied, self.committed + 1):n] if e[0] == "sys"}
            s.reset_to(raw)
            done = max(applied, self.committed + 1)  # it applies what it holds committed first
            assert k <= done or f"entries {done}..{k - 1} were never applied" in (s.dispatch_gap or ""), \
                (k, done, s.dispatch_gap)
            s.recompute_queue_offsets()  # it may lead later: after every entry of its log
            self.model[n:] = [("gone",)] * (k - n) + [((0, body, key),)]
            self.committed = k - 1
        else:
            applied = cl.first_index_at_or_after(s.cqs.dispatched_offset)
            self.never_applied |= {e[1] for e in self.model[applied:n] if e[0] == "sys"}
            s.restart_at(off, k)
            self.model[n:] = [("gone",)] * (k - n)
        self.reset_at = k
        self.durable = cl.flushed.next_index

    def flushed(self, tail) -> None:
        assert tail.next_index <= len(self.model), (tail, len(self.model))
        self.durable = max(self.durable, tail.next_index)

    def check_live(self) -> None:
        s, cl = self.store, self.store.commitlog
        if self.invariant_check:
            assert cl.min_offset <= s.cqs.dispatched_offset <= cl.tail.offset, \
                f"the log starts at {cl.min_offset}, the dispatcher is at {s.cqs.dispatched_offset}"
        assert cl.first_index <= cl.tail.next_index <= len(self.model)
        cp = checkpoint_mod.read(self.path / "checkpoint")
        assert cp is not None and cp.flushed_offset <= cl.flushed.offset, (cp, cl.flushed)

    # --- restarts and the checker --------------------------------------------------------

    def restart(self, power_cut: bool) -> None:
        crash(self.store)
        self.pending.clear()
        if power_cut:
            self.power.crash()
        self.store = s = self.open()
        cl = s.commitlog
        n = cl.tail.next_index
        assert self.durable <= n <= len(self.model), (self.durable, n, len(self.model))
        if not power_cut:
            assert n == len(self.model), (n, len(self.model))
        del self.model[n:]
        self.durable = n
        if self.mode == "replicated":  # the leader tells it again
            self.committed = min(self.committed, n - 1)
            if self.committed >= cl.first_index:
                s.set_committed(self.committed)
            s.recompute_queue_offsets()  # and it leads again: after every entry of its log
        self.check_indexed()

    def check_indexed(self) -> None:
        s, cl = self.store, self.store.commitlog
        first, n = cl.first_index, cl.tail.next_index
        for i in range(first, n):
            e = cl.read_by_index(i)
            assert e is not None and e.index == i, i
            if self.model[i][0] not in ("sys", "gone"):
                got = tuple(r.body for r in e.records) if hasattr(e, "records") else (e.body,)
                assert got == tuple(m[1] for m in self.model[i]), i
        s.dispatch()
        done = cl.first_index_at_or_after(s.cqs.dispatched_offset)  # entries [first, done) indexed
        assert done == cl.first_index_at_or_after(s.confirm_offset), (s.cqs.dispatched_offset, s.confirm_offset)
        for i in range(done):
            if self.model[i][0] == "sys" and self.model[i][1] not in self.never_applied:
                assert self.model[i][1] in self.applied, f"system entry {i} ({self.model[i][1]}) never applied"
        for q in range(2):
            cq = s.cqs.find("t", q)
            lo = cq.min_offset if cq is not None else 0
            if lo:
                assert s.get("t", q, lo - 1, 8, 1 << 20).status == ms.OFFSET_TOO_SMALL
            got = [m.body for m in pull(s, q, lo)]
            every = [m[1] for e in self.model[self.reset_at:done] if e[0] not in ("sys", "gone") for m in e if m[0] == q]
            held = [m[1] for e in self.model[max(first, self.reset_at):done] if e[0] not in ("sys", "gone")
                    for m in e if m[0] == q]
            assert len(got) >= len(held) and got == every[len(every) - len(got):], \
                f"queue {q}: {len(got)} messages readable, the log holds {len(held)} committed ones"
        for i in range(first, done):
            for m in () if self.model[i][0] in ("sys", "gone") else self.model[i]:
                if m[2] is not None:
                    found = s.lookup_key("t", m[2], 0, 2**62, 4)
                    assert any(x.body == m[1] for x in found), (i, m[2])
                    assert all(x.phys_offset >= cl.min_offset for x in found)

    def close(self) -> None:
        crash(self.store)


def random_for(seed: int):
    import random
    return random.Random(seed)


def pull(store, q, offset):
    out = []
    while True:
        r = store.get("t", q, offset, 64, 1 << 20)
        if r.status != ms.FOUND:
            return out
        got = list(codec.iter_messages(r.data, from_queue_offset=offset))
        assert [m.queue_offset for m in got] == list(range(offset, offset + len(got))), offset
        out += got
        offset = r.next_offset


MODES = ("async", "sync", "replicated")


def retention_run(sim_dir, seed, monkeypatch, quiet: bool = False, checks: str = "all") -> None:
    fmt, mode = 1 + seed % 2, MODES[(seed // 2) % 3]
    path = sim_dir / str(seed)
    with monkeypatch.context() as mp:
        signal.setitimer(signal.ITIMER_REAL, SEED_DEADLINE_S)
        run = None
        try:
            run = RetentionRun(path, seed, mp, fmt, mode, checks)
            for _ in range(STEPS):
                run.step()
            run.restart(power_cut=True)
        except BaseException:
            if not quiet:
                steps = "; ".join(run.log) if run else "(none)"
                print(f"retention run (format {fmt}, {mode}) failed with seed {seed} "
                      f"(TIDELOG_RETENTION_SEED={seed} replays it alone); steps: {steps}")
            raise
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            if run is not None:
                run.close()
            shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def alarm():
    old = signal.signal(signal.SIGALRM, _too_long)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_retention_at_random_points_never_strands_the_dispatcher(sim_dir, monkeypatch, alarm):
    seeds = ([int(os.environ["TIDELOG_RETENTION_SEED"])] if "TIDELOG_RETENTION_SEED" in os.environ
             else range(SEEDS))
    t0 = time.monotonic()
    for seed in seeds:
        retention_run(sim_dir, seed, monkeypatch)
    print(f"retention sim: {len(seeds)} seeds in {time.monotonic() - t0:.1f} s")


def old_rule(monkeypatch) -> None:
    """Issue 39's rule: only what is flushed bounds retention, forced retention included, and
    nothing checks the log start against the dispatcher (its b"" is taken as the end)."""
    monkeypatch.setattr(retention.Floor, "offset", property(lambda f: f.flushed))
    monkeypatch.setattr(MessageStore, "check_log_start", lambda self, after: None)
    monkeypatch.setattr(MessageStore, "_read_nothing", lambda self, pos, limit: None)


@pytest.mark.parametrize("checks", ["all", "end-state", "data"])
def test_the_sim_catches_the_old_retention_rule(sim_dir, monkeypatch, alarm, checks):
    """With fewer of the checker's checks (RetentionRun), down to "data": the damage itself
    -- messages never indexed, system entries never applied -- must show."""
    t0 = time.monotonic()
    with monkeypatch.context() as mp:
        old_rule(mp)
        for seed in range(MUTANT_SEEDS_MAX):
            try:
                retention_run(sim_dir, seed, monkeypatch, quiet=True, checks=checks)
            except AssertionError as e:
                print(f"the old rule caught at seed {seed} (seeds 0..{seed}, {time.monotonic() - t0:.1f} s): "
                      f"{str(e).splitlines()[0]:.200}")
                return
    pytest.fail(f"the sim ran {MUTANT_SEEDS_MAX} seeds with the old retention rule and saw nothing wrong")
