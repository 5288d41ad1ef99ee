"""Consumer-group offsets, persisted in `<data_dir>/config/consumer_offsets.json`.

A commit is acknowledged only once the file holding it has been replaced and fsynced
(commits that arrive while one write is running share the next write), so an acknowledged
commit survives a broker crash.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from broker.store.files import write_atomic

log = logging.getLogger(__name__)


class OffsetManager:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.offsets: dict[str, dict[str, dict[int, int]]] = {}
        self.dirty = False
        self._seq = self._written_seq = 0
        self._write_lock = threading.Lock()

    def load(self) -> None:
        if not self.path.exists():
            return
        try:
            raw = json.loads(self.path.read_text())
            self.offsets = {g: {t: {int(q): int(o) for q, o in qs.items()} for t, qs in ts.items()}
                            for g, ts in raw["offsets"].items()}
        except (ValueError, KeyError, AttributeError) as e:
            bad = self.path.with_suffix(".damaged")
            self.path.rename(bad)
            log.error("consumer offsets file was damaged (%s): moved to %s; groups restart "
                      "from their configured position", e, bad)

    def commit(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        self.offsets.setdefault(group, {}).setdefault(topic, {}).update(offsets)
        self.dirty = True

    def query(self, group: str, topic: str, queue_ids) -> dict[int, int]:
        have = self.offsets.get(group, {}).get(topic, {})
        return {q: have.get(q, -1) for q in queue_ids}

    def all(self):
        for g, ts in self.offsets.items():
            for t, qs in ts.items():
                for q, o in qs.items():
                    yield g, t, q, o

    def snapshot(self) -> tuple[int, bytes]:
        """The file's next contents (taken on the event-loop thread); clears `dirty`."""
        self.dirty = False
        self._seq += 1
        return self._seq, json.dumps({"version": 1, "offsets": self.offsets}).encode()

    def write(self, snapshot: tuple[int, bytes]) -> None:
        """Write a snapshot (any thread); an older one than already written is skipped, so
        two writers in flight never leave the file older than an acknowledged commit."""
        seq, data = snapshot
        with self._write_lock:
            if seq <= self._written_seq:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, data)
            self._written_seq = seq

    def persist(self) -> None:
        """The offsets on disk now (the caller's thread). Also when nothing changed since the
        last snapshot but that snapshot's write (the periodic checkpoint's, in the executor)
        has not finished: a checkpoint that relies on this must not find it still in flight."""
        if self.dirty or self._written_seq < self._seq:
            self.write(self.snapshot())
