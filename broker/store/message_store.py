"""The message store: CommitLog + ConsumeQueues + key index + checkpoint, as one object.

Data path: `put` appends to the CommitLog (the single writer is the event-loop thread) and
assigns queue offsets; the flusher makes it durable; `dispatch` copies what is confirmed
(written for `flush: async`, fsynced for `flush: sync`, committed once replication sets
`external_confirm`) into the ConsumeQueues and the key index, which is all that consumers
see; `get` serves pulls by queue offset.

Recovery order on `open`: CommitLog (cut any torn tail after the checkpoint), then the
ConsumeQueues and key index (cut what points past the log, re-dispatch from the manifest,
or rebuild from the CommitLog when damaged), then a fresh checkpoint.

The log's start moves in four places, and none leaves the dispatcher behind it: retention
(cleaner.py) deletes nothing past what was dispatched and checkpointed; `reset_to` and
`restart_at` drop the log and its indexes together and dispatch from the new first entry
(`reset_to` applies what it held committed first); a cut (`truncate_*`) never goes below
the first entry; recovery starts the position index at the first segment and scans from the
first entry (recovery.py). Should the start ever pass the dispatched offset anyway,
`dispatch` raises LogStartPassedDispatch and `open` names the gap (`dispatch_gap`, in
`stats`) and goes on from the start -- never a silent stop.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from broker.store import codec, codec_batch
from broker.store.checkpoint import Checkpoint, CheckpointFile
from broker.store.cleaner import Cleaner
from broker.store.commitlog import CommitLog, NewEntry, ZoneItem
from broker.store.recovery import RecoveryReport
from broker.store.consume_queue import ConsumeQueueSet
from broker.store.dispatch import DamagedConsumeQueue, Dispatch, LogStartPassedDispatch
from broker.store.files import DiskFull, Preparer
from broker.store.key_index import KeyIndex, id_hash, key_for, key_hash

log = logging.getLogger(__name__)

def cq_open_files_max(configured: int) -> int:
    """The ConsumeQueue descriptor bound, at most half the process's fd limit: the rest is
    for connections, CommitLog segments and index files."""
    import resource
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or configured <= soft // 2:
        return configured
    bound = max(8, soft // 2)
    log.warning("consume_queue_open_files_max %d is more than half the fd limit %d: using %d",
                configured, soft, bound)
    return bound


# format 2: a run of messages to one queue becomes one batch up to this many zone bytes (a
# single larger message is a batch of its own; BrokerConfig.batch_group_bytes lowers it when
# frames are smaller)
BATCH_GROUP_BYTES = 1 << 20


@dataclass(frozen=True)
class StoreOptions:
    segment_bytes: int = 1 << 30
    flush: str = "async"  # "sync": group commit, acks wait for fsync
    flush_interval_ms: int = 500
    cq_records_per_file: int = 300_000
    index_slots: int = 500_000
    index_entries_max: int = 2_000_000
    message_index_enable: bool = True
    positions_per_file: int = 1 << 20
    replicated: bool = False  # consumers see only what replication marked committed
    consume_queue_open_files_max: int = 256  # ConsumeQueue files kept open (LRU)
    commitlog_format: int = 2  # what a leader writes: 1 an entry per message, 2 record batches
    batch_group_bytes: int = BATCH_GROUP_BYTES  # format 2: runs of sends cut at this many zone bytes


PutItem = NewEntry  # what the send path hands the store (the wire's SendRequest fits)


class PutBatch(NamedTuple):
    first_index: int
    phys_offsets: list[int]  # per message: its entry's (a batch's messages share it)
    queue_offsets: list[int]
    end_offset: int  # the CommitLog offset that must be confirmed before acking
    store_ts_ms: int
    indexes: list[int]  # per message: its entry's log index (the last: what a quorum must hold)


# outcomes of get(), named as RocketMQ's GetMessageStatus
FOUND = "FOUND"
NO_NEW_MESSAGE = "NO_NEW_MESSAGE"
NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
OFFSET_OVERFLOW = "OFFSET_OVERFLOW"
NO_SUCH_QUEUE = "NO_SUCH_QUEUE"


class GetResult(NamedTuple):
    status: str
    data: bytes  # whole entries, in queue order
    count: int
    next_offset: int
    min_offset: int
    max_offset: int


class CheckpointSnapshot(tuple):
    """(checkpoint, ConsumeQueue manifest), as a 2-tuple, carrying the CommitLog's
    `cut_generation` when it was taken (write_checkpoint drops it after a cut)."""

    def __new__(cls, cp: Checkpoint, manifest: dict, cut_generation: int):
        self = super().__new__(cls, (cp, manifest))
        self.cut_generation = cut_generation
        return self


@dataclass
class OpenReport:
    commitlog: RecoveryReport
    indexes_rebuilt: bool  # ConsumeQueues and key index rebuilt from the whole CommitLog
    redispatched_entries: int
    dispatch_gap: str | None = None  # the log started past the dispatched offset (logged)


class MessageStore(Dispatch, Cleaner):
    def __init__(self, directory: Path, options: StoreOptions = StoreOptions()):
        self.directory = Path(directory)
        self.options = options
        self.preparer = Preparer()
        self.commitlog = CommitLog(self.directory, options.segment_bytes, options.positions_per_file)
        self.cqs = ConsumeQueueSet(self.directory / "consumequeue", options.cq_records_per_file,
                                   cq_open_files_max(options.consume_queue_open_files_max))
        self.key_index = KeyIndex(self.directory / "index", options.index_slots,
                                  options.index_entries_max, self.preparer)
        self.cp_file = CheckpointFile(self.directory / "checkpoint")
        # a cut of the log waits for a checkpoint write in progress, and a snapshot taken
        # before the cut is then dropped (write_checkpoint): the manifest and checkpoint on
        # disk never describe the log from before a cut that a later checkpoint replaced
        self.commitlog.cut_guard = self.cp_file.lock
        self.next_queue_offset: dict[tuple[str, int], int] = {}
        self.committed_index = -1
        self.external_confirm: int | None = None  # replication's commit point, if any
        self.disk_full_reason: str | None = None
        self._sync = options.flush == "sync"
        self._topic_names: dict[bytes, str] = {}
        self.on_system_entry = None  # callback(topic, body) for committed "%..." entries
        # callback(topic, queue_id, producer_id, epoch, base_sequence, count, base_queue_offset)
        # for each Kafka batch dispatched (broker/kafka/idempotence.py)
        self.on_kafka_batch = None
        self._confirm_index_stale = False
        # the dispatched offset of the last checkpoint written (its manifest is durable): a
        # restart dispatches and applies again from there, so retention keeps it
        self.checkpointed_dispatch = -1
        self.dispatch_gap: str | None = None  # entries this node never indexed (logged as error)
        # the owner's state that system entries were applied to, made durable (the broker's
        # consumer offsets): checkpoint() calls it first, since a checkpoint's dispatched
        # offset says which entries a restart need not apply again
        self.before_checkpoint: Callable[[], None] | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def open(self) -> OpenReport:
        self.directory.mkdir(parents=True, exist_ok=True)
        cp = self.cp_file.load()
        report = self.commitlog.recover(cp)
        if cp is not None:
            self.committed_index = cp.committed_index
        if self.options.replicated:  # dispatch nothing beyond the last known commit point
            self.external_confirm = self.commitlog.min_offset
            self.set_committed(min(self.committed_index, self.commitlog.tail.next_index - 1))
        cq_ok = self.cqs.load()
        idx_ok = self.key_index.load()
        tail = self.commitlog.tail.offset
        rebuild = not cq_ok or not idx_ok
        if rebuild and tail > self.commitlog.min_offset:
            log.warning("rebuilding %s from the CommitLog",
                        " and ".join(n for n, ok in (("ConsumeQueues", cq_ok), ("key index", idx_ok)) if not ok))
        n = 0
        try:
            if not rebuild:
                for cq in self.cqs.queues.values():
                    cq.truncate_from_phys(tail)
                start = min(self.cqs.dispatched_offset, tail)
                if start < self.commitlog.min_offset:
                    self._gap(f"the CommitLog starts at {self.commitlog.min_offset}, past the "
                              f"dispatched offset {start} of the last checkpoint: entries in between "
                              f"were deleted before they were indexed and their system entries applied "
                              f"here; going on from the log start")
                n = self._redispatch(max(start, self.commitlog.start_offset))
        except DamagedConsumeQueue as e:
            log.warning("%s: rebuilding the ConsumeQueues and key index", e)
            rebuild = True
        if rebuild:
            self.cqs.reset_all()
            self.key_index.reset()
            n = self._redispatch(self.commitlog.start_offset)
        floor = self.commitlog.min_offset
        for cq in self.cqs.queues.values():
            cq.forget_before_phys(floor)  # records of segments that retention deleted
        self.next_queue_offset = {k: cq.max_offset for k, cq in self.cqs.queues.items()}
        self.checkpoint()
        if report.cut_offset is not None or rebuild:
            log.info("store recovered: %d entries checked, cut=%s, %d re-dispatched",
                     report.entries_checked, report.cut_offset, n)
        return OpenReport(report, rebuild, n, self.dispatch_gap)

    def _gap(self, what: str) -> None:
        self.dispatch_gap = what
        log.error("%s", what)

    def check_log_start(self, after: str) -> None:
        """The log never starts past what the dispatcher read (see the module's docstring)."""
        if self.cqs.dispatched_offset < self.commitlog.min_offset:
            raise LogStartPassedDispatch(f"after {after} the CommitLog starts at "
                                         f"{self.commitlog.min_offset}, past the dispatched "
                                         f"offset {self.cqs.dispatched_offset}")

    def _redispatch(self, start: int) -> int:
        """Dispatch everything from `start` to the end of the log; how many entries."""
        self.cqs.dispatched_offset = start
        first = self.commitlog.first_index_at_or_after(start)
        self.dispatch(self.confirm_offset, rebuilding=True)
        return self.commitlog.first_index_at_or_after(self.cqs.dispatched_offset) - first

    def close(self) -> None:
        try:
            self.checkpoint()
        except OSError as e:  # e.g. a full disk: safe, recovery re-checks from the last one
            log.error("final checkpoint failed (%s): the next start re-checks the log from "
                      "the previous checkpoint", e)
        self.preparer.shutdown()
        self.commitlog.close()
        self.cqs.close()
        self.key_index.close()
        self.cp_file.close()

    # --- writes ------------------------------------------------------------------------

    def put(self, items: list[PutItem], term: int = 0) -> PutBatch:
        """Append messages as the leader; raises DiskFull / StoreNotWritable untouched."""
        if self.disk_full_reason is not None:
            raise DiskFull(errno.ENOSPC, self.disk_full_reason)
        if self.options.commitlog_format == 2:
            return self._put_batches(items, term)
        if any(type(it) is ZoneItem for it in items):  # an entry per message, as format 1 writes
            items = [e for it in items for e in (it.entries() if type(it) is ZoneItem else (it,))]
        nqo = self.next_queue_offset
        qoffs = []
        assigned: dict[tuple[str, int], int] = {}
        for it in items:
            key = (it.topic, it.queue_id)
            q = assigned.get(key)
            if q is None:
                q = nqo.get(key, 0)
            assigned[key] = q + 1
            qoffs.append(q)
        now = int(time.time() * 1000)
        first, places = self.commitlog.append_as_leader(items, qoffs, term, now)
        nqo.update(assigned)  # only once the append succeeded
        return PutBatch(first, places, qoffs, self.commitlog.tail.offset, now,
                        list(range(first, first + len(items))))

    def _put_batches(self, items: list, term: int) -> PutBatch:
        """Format 2: a ZoneItem (a SEND_ZONE) is one record batch as received; each run of
        other consecutive messages to one queue is one record batch, cut at
        BATCH_GROUP_BYTES (one entry: one write, one position, one replicated entry)."""
        nqo = self.next_queue_offset
        if len(items) == 1:  # one SEND or one SEND_ZONE (every send at W=1): one entry, directly
            it = items[0]
            key = (it.topic, it.queue_id)
            q = nqo.get(key, 0)
            if type(it) is ZoneItem:
                n, zone = len(it.bodies), (it.zone, it.records_crc)
            else:
                n, zone = 1, codec_batch.encode_zone(it.topic, it.queue_id, (it[2:],))
            now = int(time.time() * 1000)
            first, places = self.commitlog.append_batches_as_leader((zone,), (q,), term, now)
            nqo[key] = q + n  # only once the append succeeded
            return PutBatch(first, places * n, list(range(q, q + n)), self.commitlog.tail.offset, now,
                            [first] * n)
        assigned: dict[tuple[str, int], int] = {}
        runs: list[list] = []  # [topic, queue_id, [items] or a ZoneItem, zone bytes]
        # a batch is never split across segments: small ones waste little at a segment's end
        bound, fixed = min(self.options.batch_group_bytes, self.options.segment_bytes // 8), codec.RECORD_SIZE
        last = None
        for it in items:
            if type(it) is ZoneItem:
                last = None
                runs.append([it.topic, it.queue_id, it, 0])
                continue
            n = fixed + len(it.properties) + len(it.body)
            if (last is not None and last[0] == it.topic and last[1] == it.queue_id
                    and last[3] + n <= bound and len(last[2]) < codec.BATCH_COUNT_MAX):
                last[2].append(it)
                last[3] += n
            else:
                last = [it.topic, it.queue_id, [it], n]
                runs.append(last)
        zones, bases, counts = [], [], []
        encode = codec_batch.encode_zone
        for topic, qid, run, _ in runs:
            key = (topic, qid)
            q = assigned.get(key)
            if q is None:
                q = nqo.get(key, 0)
            n = run.count if type(run) is ZoneItem else len(run)
            assigned[key] = q + n
            bases.append(q)
            counts.append(n)
            zones.append((run.zone, run.records_crc) if type(run) is ZoneItem else
                         encode(topic, qid, [it[2:] for it in run]))
        now = int(time.time() * 1000)
        first, places = self.commitlog.append_batches_as_leader(zones, bases, term, now)
        nqo.update(assigned)  # only once the append succeeded
        phys, qoffs, indexes = [], [], []
        for k, n in enumerate(counts):
            phys += [places[k]] * n
            qoffs += range(bases[k], bases[k] + n)
            indexes += [first + k] * n
        return PutBatch(first, phys, qoffs, self.commitlog.tail.offset, now, indexes)

    # --- replication (a follower's log follows its leader's) ---------------------------------

    def append_as_follower(self, raws: list[bytes]) -> None:
        if self.disk_full_reason is not None:
            raise DiskFull(errno.ENOSPC, self.disk_full_reason)
        self.commitlog.append_as_follower(raws)

    def truncate_suffix(self, index: int) -> None:
        """Cut uncommitted entries from `index` on (never below what was dispatched)."""
        pos = self.commitlog.position(index)
        if pos is not None and pos[0] < self.cqs.dispatched_offset:
            raise ValueError(f"refusing to cut index {index}: consumers already saw it")
        if index < self.commitlog.tail.next_index:
            self.commitlog.truncate_suffix(index)
            self.checkpoint()  # the next recovery starts at or before the cut

    def truncate_to_offset(self, offset: int) -> int:
        """Cut the log at `offset` even below what consumers saw (a master-slave replica
        whose suffix forked from the master's): the ConsumeQueues lose the cut messages
        and queue offsets continue after what is left. Returns the entries removed."""
        if offset >= self.commitlog.tail.offset:
            return 0
        n = self.commitlog.truncate_to(offset)
        # where the log ends now: before `offset` when that was the first entry after an
        # end-of-segment marker (the marker goes with the cut; see CommitLog.follows_at)
        end = self.commitlog.tail.offset
        for cq in self.cqs.queues.values():
            cq.truncate_from_phys(end)
        self.cqs.dispatched_offset = min(self.cqs.dispatched_offset, end)
        if self.external_confirm is not None:
            self.external_confirm = min(self.external_confirm, end)
        self.committed_index = min(self.committed_index, self.commitlog.tail.next_index - 1)
        # from the log, not the ConsumeQueues: entries kept below the cut that were not
        # dispatched yet hold queue offsets too
        self.check_log_start("a cut")
        self.recompute_queue_offsets()
        self.checkpoint()
        return n

    def reset_to(self, first_raw: bytes) -> None:
        """The log restarts with the leader's entry `first_raw` (no overlap any more: a raft
        follower behind its leader's retention). What this log holds committed is dispatched
        first -- its system entries applied -- since after the reset it is gone."""
        try:
            index = codec_batch.check_entry(first_raw)[1]
        except codec.CorruptEntry:
            self.commitlog.reset(first_raw)  # raises FollowerMismatch: nothing changed
            raise
        try:
            self.dispatch()
        except (DamagedConsumeQueue, OSError) as e:
            log.error("dispatching the committed entries before the log reset failed: %s", e)
        applied = self.commitlog.first_index_at_or_after(self.cqs.dispatched_offset)
        if index > applied:
            self._gap(f"the log restarts at the leader's entry {index}: entries {applied}..{index - 1} "
                      f"were never applied on this node (the leader's retention deleted them before "
                      f"they were copied here); their messages are not in this node's queues, and "
                      f"system entries among them (%TOPIC%, %OFFSET%, %ACL%) are not applied here")
        self.commitlog.reset(first_raw)
        self._restarted()

    def restart_at(self, offset: int, index: int) -> None:
        """The log is dropped; it goes on with entry `index` at `offset` (master-slave: a
        slave that shares nothing with its master starts over from the master's log; its
        system state comes with the metadata sync, not from its log)."""
        self.commitlog.restart_at(offset, index)
        self._restarted()

    def _restarted(self) -> None:
        """The ConsumeQueues and key index go with the log; dispatch starts at its first entry
        (inside its segment when the log restarted there: the bytes before it are zeros)."""
        self.cqs.reset_all()
        self.key_index.reset()
        start = self.commitlog.start_offset
        self.cqs.dispatched_offset = start
        self.next_queue_offset.clear()
        self.committed_index = -1
        self.external_confirm = start
        self.checkpoint()

    def set_committed(self, index: int) -> None:
        """Consumers may see entries up to `index` (the quorum holds them)."""
        pos = self.commitlog.position(index)
        if pos is not None:
            self.committed_index = index
            self.external_confirm = pos[0] + pos[1]

    def set_confirm_offset(self, offset: int) -> None:
        """Consumers may see entries that end at or before `offset` (master-slave: what the
        required replicas hold); the checkpoint records the matching index."""
        if offset != self.external_confirm:
            self.external_confirm = offset
            self._confirm_index_stale = True

    def drop_confirm_offset(self) -> None:
        """Consumers see what the flush policy confirms again (an ASYNC master): no
        replication watermark, and none left for the next checkpoint to translate."""
        self.external_confirm = None
        self._confirm_index_stale = False

    @property
    def confirm_offset(self) -> int:
        """How far consumers may see: written (async), fsynced (sync) or committed."""
        if self.external_confirm is not None:
            return self.external_confirm
        return self.commitlog.flushed.offset if self._sync else self.commitlog.tail.offset

    # --- reads -------------------------------------------------------------------------

    def queue_bounds(self, topic: str, queue_id: int) -> tuple[int, int]:
        cq = self.cqs.find(topic, queue_id)
        return (0, 0) if cq is None else (cq.min_offset, cq.max_offset)

    def get(self, topic: str, queue_id: int, offset: int, max_messages: int, max_bytes: int,
            tag_hashes: frozenset[int] | None = None) -> GetResult:
        cq = self.cqs.find(topic, queue_id)
        if cq is None:
            return GetResult(NO_SUCH_QUEUE if offset else NO_NEW_MESSAGE, b"", 0, 0, 0, 0)
        lo, hi = cq.min_offset, cq.max_offset
        if offset < lo:
            return GetResult(OFFSET_TOO_SMALL, b"", 0, lo, lo, hi)
        if offset > hi:
            return GetResult(OFFSET_OVERFLOW, b"", 0, hi, lo, hi)
        if offset == hi:
            return GetResult(NO_NEW_MESSAGE, b"", 0, hi, lo, hi)
        records = cq.get(offset, max_messages)
        parts, runs = [], []  # runs: [start, length] of contiguous CommitLog ranges
        total, count, consumed = 0, 0, 0
        shipped = -1  # the entry last shipped: a batch's units all name it, it ships once
        for phys, size, tag in records:
            if phys != shipped and count and total + size > max_bytes:
                break
            consumed += 1
            if tag_hashes is not None and tag not in tag_hashes:
                continue
            count += 1
            if phys == shipped:
                continue
            shipped = phys
            if runs and runs[-1][0] + runs[-1][1] == phys:
                runs[-1][1] += size
            else:
                runs.append([phys, size])
            total += size
        if consumed == len(records) and records and records[-1][0] == shipped and offset + consumed < hi:
            # whole batches only: the units past the bound that name the last entry shipped
            # are messages the consumer gets with it, so next_offset goes past them too
            more = True
            while more and offset + consumed < hi:
                units = cq.get(offset + consumed, 256)
                more = bool(units)
                for phys, _, tag in units:
                    if phys != shipped:
                        more = False
                        break
                    consumed += 1
                    count += tag_hashes is None or tag in tag_hashes
        for phys, length in runs:
            data = self.commitlog.read(phys, length)
            if len(data) < length:  # below the log start: the queue forgets it, the reader is told
                cq.forget_before_phys(self.commitlog.min_offset)
                if offset < cq.min_offset:
                    return GetResult(OFFSET_TOO_SMALL, b"", 0, cq.min_offset, cq.min_offset, hi)
                break
            parts.append(data)
        if not count:
            return GetResult(NO_MATCHED_MESSAGE, b"", 0, offset + consumed, lo, hi)
        return GetResult(FOUND, b"".join(parts), count, offset + consumed, lo, hi)

    def lookup_key(self, topic: str, key: str, begin_ms: int, end_ms: int,
                   limit: int) -> list[codec.Entry]:
        found = self._lookup(key_hash(key_for(topic, key)), begin_ms, end_ms, limit * 2)
        out = [e for e in found if e.topic == topic and key in e.keys]
        return sorted(out, key=lambda e: (e.store_ts_ms, e.index))[:limit]

    def lookup_id(self, msg_id: bytes, begin_ms: int = 0, end_ms: int = 2**62) -> codec.Entry | None:
        found = [e for e in self._lookup(id_hash(msg_id), begin_ms, end_ms, 8) if e.msg_id == msg_id]
        return min(found, key=lambda e: e.index) if found else None

    def _lookup(self, h: int, begin_ms: int, end_ms: int, limit: int) -> list[codec.Entry]:
        """The messages of the entries the key index names for `key` (codec_batch.Message:
        Entry's fields and batch_pos; a batch gives all its messages, the caller filters) for
        the key hash `h` (key_index.key_hash / id_hash)."""
        out = []
        tail = self.confirm_offset
        for phys in dict.fromkeys(self.key_index.lookup(h, begin_ms, end_ms, limit)):
            if not self.commitlog.min_offset <= phys < tail:
                continue
            try:
                msgs = list(codec_batch.iter_messages(self.commitlog.read_entry(phys)))
            except codec.CorruptEntry:
                continue
            if msgs and msgs[0].phys_offset == phys and begin_ms <= msgs[0].store_ts_ms <= end_ms:
                out += msgs
        return out

    # --- checkpoint --------------------------------------------------------------------

    def flush_tails(self) -> None:
        """Write the index records held in memory (writer's thread; the broker's tick)."""
        self.commitlog.positions.flush_tail()
        for cq in self.cqs.queues.values():
            cq.records.flush_tail()

    def checkpoint_snapshot(self) -> CheckpointSnapshot:
        """Taken on the writer's thread; `write_checkpoint` may then run on any thread. The
        snapshot is stamped with its ticket (the order snapshots are taken in) and the log's
        cut generation, so a write of it that comes too late is dropped."""
        self.flush_tails()
        f = self.commitlog.flushed
        if self._confirm_index_stale:
            self._confirm_index_stale = False
            self.committed_index = self.commitlog.first_index_at_or_after(self.external_confirm) - 1
        cp = self.cp_file.stamp(Checkpoint(f.offset, f.next_index, f.last_term, self.committed_index))
        return CheckpointSnapshot(cp, self.cqs.snapshot(), self.commitlog.cut_generation)

    def write_checkpoint(self, snap) -> bool:
        """Write a snapshot's index files, ConsumeQueue manifest and checkpoint, under the
        checkpoint file's lock (a cut of the log waits meanwhile). Dropped (False) when a
        snapshot taken after it was written already, or when the log was cut since it was
        taken (the cut's own checkpoint may not be written yet): its manifest could name a
        dispatched offset inside an entry written after the cut."""
        cp, manifest = snap
        gen = getattr(snap, "cut_generation", None)  # None: a plain (cp, manifest) tuple
        with self.cp_file.lock:
            if self.cp_file.is_stale(cp) or (gen is not None and gen != self.commitlog.cut_generation):
                log.info("dropping a checkpoint snapshot (offset %d) taken before a later "
                         "checkpoint or cut", cp.flushed_offset)
                return False
            self.commitlog.positions.sync()
            self.key_index.sync()
            self.cqs.sync_and_write_manifest(manifest)
            written = self.cp_file.write(cp)
            if written:
                self.checkpointed_dispatch = manifest["dispatched_offset"]
            return written

    def checkpoint(self) -> None:
        self.commitlog.flush()
        if self.before_checkpoint is not None:  # what was applied is durable before the manifest says so
            self.before_checkpoint()
        self.write_checkpoint(self.checkpoint_snapshot())

    # --- status ------------------------------------------------------------------------

    def stats(self) -> dict:
        cl = self.commitlog
        return {
            "min_offset": cl.min_offset,
            "max_offset": cl.tail.offset,
            "flushed_offset": cl.flushed.offset,
            "confirm_offset": self.confirm_offset,
            "dispatched_offset": self.cqs.dispatched_offset,
            "dispatch_gap": self.dispatch_gap,
            "first_index": cl.first_index,
            "next_index": cl.tail.next_index,
            "last_term": cl.tail.last_term,
            "committed_index": self.committed_index,
            "segments": len(cl.segments.files),
            "flush": self.options.flush,
            "writable": cl.unwritable_reason is None and self.disk_full_reason is None,
            "not_writable_reason": cl.unwritable_reason or self.disk_full_reason,
        }
