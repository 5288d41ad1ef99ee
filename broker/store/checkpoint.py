"""The store checkpoint: how far the CommitLog is known to be on disk.

The file holds two 64-byte slots written alternately, so a torn write of one slot leaves the
other intact; the valid slot with the higher sequence number wins. Slot layout (big-endian):

    off  size  field
      0     4  magic            "TCP1"
      4     4  crc              CRC-32 of bytes [8, 64) of the slot
      8     8  seq              incremented on every write
     16     8  flushed_offset   every CommitLog byte below it was fsynced; an entry boundary
     24     8  next_index       index of the entry that starts at flushed_offset
     32     8  last_term        term of the last entry below flushed_offset (0 if none)
     40     8  committed_index  highest index known committed, -1 for none (replication)
     48     8  written_ts_ms    when this slot was written
     56     8  reserved (zero)

Recovery scans the CommitLog from flushed_offset: nothing below it needs re-checking.

Writes come from the writer's thread (a truncation checkpoints at once) and from a background
thread (the periodic checkpoint, written from a snapshot taken earlier on the writer's
thread). They are serialized, and an older snapshot loses: each snapshot carries a `ticket`
in the order it was taken (`stamp`; a snapshot written where it is taken gets one at write
time), and a write whose ticket is below the last written one is dropped. Otherwise a
snapshot taken before a truncation could land after the truncation's checkpoint and name
an offset past the cut, or in the middle of an entry written since.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path

from broker.store.files import fsync_dir

MAGIC = 0x54435031  # "TCP1"
SLOT = struct.Struct(">II QQQQqQ 8x")
SLOT_SIZE = SLOT.size  # 64

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Checkpoint:
    flushed_offset: int = 0
    next_index: int = 0
    last_term: int = 0
    committed_index: int = -1
    ticket: int | None = field(default=None, compare=False)  # snapshot order; not stored


def newest(raw: bytes) -> tuple[int, Checkpoint] | None:
    """(seq, checkpoint) of the newest valid slot in a checkpoint file's bytes."""
    best = None
    for i in range(2):
        slot = raw[i * SLOT_SIZE:(i + 1) * SLOT_SIZE]
        if len(slot) < SLOT_SIZE:
            continue
        magic, crc, seq, flushed, nxt, term, committed, _ts = SLOT.unpack(slot)
        if magic != MAGIC or zlib.crc32(slot[8:]) != crc:
            continue
        if best is None or seq > best[0]:
            best = (seq, Checkpoint(flushed, nxt, term, committed))
    return best


def read(path: Path) -> Checkpoint | None:
    """A checkpoint file read without opening it for writing (tools, the reconcile job)."""
    try:
        best = newest(Path(path).read_bytes()[:2 * SLOT_SIZE])
    except OSError:
        return None
    return best[1] if best else None


class CheckpointFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.seq = 0
        self._fd = -1
        # held by a whole checkpoint write (reentrant: MessageStore's write_checkpoint may run
        # inside it, index files first, this file last) and by a CommitLog cut (see server.py)
        self.lock = threading.RLock()
        self._tickets = 0  # handed out, in the order snapshots are taken
        self._written_ticket = 0

    def load(self) -> Checkpoint | None:
        """The newest valid checkpoint, or None when there is none (or both slots are bad)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if created:  # else a power cut can take the file, and every checkpoint in it, away
            fsync_dir(self.path.parent)
        best = newest(os.pread(self._fd, 2 * SLOT_SIZE, 0))
        if best is None:
            return None
        self.seq = best[0]
        return best[1]

    def stamp(self, cp: Checkpoint) -> Checkpoint:
        """`cp` with the next ticket: call it on the thread that took the snapshot, right
        after taking it, when the snapshot is written later on another thread."""
        with self.lock:
            self._tickets += 1
            return replace(cp, ticket=self._tickets)

    def is_stale(self, cp: Checkpoint) -> bool:
        """Whether a snapshot taken after `cp` was written already (hold `lock` to act on it)."""
        with self.lock:
            return cp.ticket is not None and cp.ticket < self._written_ticket

    def write(self, cp: Checkpoint) -> bool:
        """Write `cp` into the older slot and fsync it; False (nothing written) when a
        snapshot taken after it was written already."""
        with self.lock:
            if cp.ticket is None:
                self._tickets += 1
                ticket = self._tickets
            else:
                ticket = cp.ticket
            if ticket < self._written_ticket:
                log.info("dropping a checkpoint snapshot (offset %d) older than the one on disk",
                         cp.flushed_offset)
                return False
            seq = self.seq + 1
            body = SLOT.pack(0, 0, seq, cp.flushed_offset, cp.next_index, cp.last_term,
                             cp.committed_index, int(time.time() * 1000))[8:]
            slot = struct.pack(">II", MAGIC, zlib.crc32(body)) + body
            os.pwrite(self._fd, slot, (seq % 2) * SLOT_SIZE)
            os.fdatasync(self._fd)
            self.seq = seq
            self._written_ticket = ticket
            return True

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
