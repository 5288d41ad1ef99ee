"""ConsumeQueues: per (topic, queue) the CommitLog position of every message, by queue offset.

Record (20 bytes, as RocketMQ): phys_offset u64 | size u32 | tag_hash u64 (0: no tag).
Slot n of a queue's RecordFile is the message with queue offset n, so a consumer's offset
maps to a CommitLog position with one read.

ConsumeQueues are derived data: the dispatcher writes them from the CommitLog, and the
manifest (`consumequeue/manifest.json`, replaced atomically at each checkpoint) records how
far that had got, and how many records each queue held then, with everything it lists
fsynced. Recovery re-dispatches from the manifest's offset; a queue that is missing or
shorter than the manifest says, or a missing or unreadable manifest, means damage, and
all queues are rebuilt from the CommitLog.

Their files share one `OpenFiles` pool: a queue's file is opened when it is read or written
and closed when `open_files_max` others were used since, so thousands of (auto-created)
topics hold a bounded number of descriptors (issue 14).
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

from broker.store.files import OpenFiles, fsync_dir, write_atomic
from broker.store.record_file import RecordFile

log = logging.getLogger(__name__)

RECORD = struct.Struct(">QIQ")
RECORDS_PER_FILE = 300_000  # RocketMQ's default: 6,000,000-byte files
OPEN_FILES_MAX = 256  # ConsumeQueue files kept open (config: consume_queue_open_files_max)
MANIFEST = "manifest.json"


class ConsumeQueue:
    def __init__(self, root: Path, topic: str, queue_id: int, records_per_file: int,
                 pool: OpenFiles | None = None):
        self.topic = topic
        self.queue_id = queue_id
        self.records = RecordFile(root / topic / str(queue_id), RECORD.size, records_per_file)
        self.records.files.pool = pool  # before load: its files open on demand
        self.min_offset = 0  # the first offset whose message is still in the CommitLog

    @property
    def max_offset(self) -> int:
        """The next queue offset (= the number of messages ever written to this queue)."""
        return self.records.count

    def load(self) -> None:
        self.records.load()
        self.min_offset = self.records.first

    def write(self, queue_offset: int, records: bytes) -> None:
        self.records.write_at(queue_offset, records)

    def get(self, offset: int, n: int) -> list[tuple[int, int, int]]:
        raw = self.records.read(offset, n)
        return list(RECORD.iter_unpack(raw[:len(raw) - len(raw) % RECORD.size]))

    def phys_at(self, offset: int) -> int | None:
        rec = self.get(offset, 1)
        return rec[0][0] if rec and rec[0][1] > 0 else None

    def truncate_from_phys(self, max_phys: int) -> None:
        """Drop the records of messages at or after CommitLog offset `max_phys`."""
        lo, hi = self.records.first, self.records.count
        while lo < hi:
            mid = (lo + hi) // 2
            p = self.phys_at(mid)
            if p is not None and p < max_phys:
                lo = mid + 1
            else:
                hi = mid
        self.records.truncate(lo)
        self.min_offset = min(self.min_offset, lo)

    def forget_before_phys(self, min_phys: int) -> None:
        """Retention: messages below `min_phys` are gone; move min_offset past them."""
        lo, hi = self.min_offset, self.records.count
        while lo < hi:
            mid = (lo + hi) // 2
            p = self.phys_at(mid)
            if p is not None and p >= min_phys:
                hi = mid
            else:
                lo = mid + 1
        self.min_offset = lo
        self.records.delete_before(lo)


class ConsumeQueueSet:
    """All ConsumeQueues of a store, and the manifest that makes their recovery cheap."""

    def __init__(self, root: Path, records_per_file: int = RECORDS_PER_FILE,
                 open_files_max: int = OPEN_FILES_MAX):
        self.root = Path(root)
        self.records_per_file = records_per_file
        self.open_files = OpenFiles(open_files_max)
        self.queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.dispatched_offset = 0  # every entry below it is in its queue

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        cq = self.queues.get(key)
        if cq is None:
            cq = ConsumeQueue(self.root, topic, queue_id, self.records_per_file, self.open_files)
            cq.load()
            self.queues[key] = cq  # only once loaded: a load that failed is tried again
        return cq

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def load(self) -> bool:
        """Open every queue; True when they agree with the manifest (False: rebuild)."""
        self.root.mkdir(parents=True, exist_ok=True)
        for tdir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for qdir in sorted(p for p in tdir.iterdir() if p.is_dir() and p.name.isdigit()):
                self.get_or_create(tdir.name, int(qdir.name))
        manifest = self._read_manifest()
        if manifest is None:
            return False
        self.dispatched_offset = manifest["dispatched_offset"]
        for topic, counts in manifest["queues"].items():
            for qid, count in counts.items():
                cq = self.find(topic, int(qid))
                if cq is None or cq.max_offset < count:
                    have = None if cq is None else cq.max_offset
                    log.warning("ConsumeQueue %s/%s has %s records, the manifest says %d: "
                                "rebuilding the ConsumeQueues", topic, qid, have, count)
                    return False
        return True

    def _read_manifest(self) -> dict | None:
        path = self.root / MANIFEST
        try:
            m = json.loads(path.read_text())
            if not isinstance(m.get("dispatched_offset"), int) or not isinstance(m.get("queues"), dict):
                raise ValueError("missing fields")
            return m
        except FileNotFoundError:
            return None
        except (ValueError, OSError) as e:
            log.warning("ConsumeQueue manifest %s is unreadable (%s)", path, e)
            return None

    def snapshot(self) -> dict:
        """What the manifest will say (taken on the event-loop thread)."""
        queues: dict[str, dict[str, int]] = {}
        for (topic, qid), cq in self.queues.items():
            queues.setdefault(topic, {})[str(qid)] = cq.max_offset
        return {"version": 1, "dispatched_offset": self.dispatched_offset, "queues": queues}

    def sync_and_write_manifest(self, snapshot: dict) -> None:
        """fsync every queue, then record `snapshot` (any thread), durably: the directory
        too, or a power cut can bring back an older manifest (and its lower dispatched
        offset) after retention deleted the segments above it."""
        for cq in list(self.queues.values()):
            cq.records.sync()
        write_atomic(self.root / MANIFEST, json.dumps(snapshot).encode())
        fsync_dir(self.root)

    def reset_all(self) -> None:
        for cq in self.queues.values():
            cq.records.reset(0)
            cq.min_offset = 0
        self.queues.clear()
        (self.root / MANIFEST).unlink(missing_ok=True)
        self.dispatched_offset = 0

    def close(self) -> None:
        for cq in self.queues.values():
            cq.records.close()
