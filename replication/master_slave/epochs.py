"""Epochs of a master-slave group, after RocketMQ 5's EpochFileCache: which master wrote
which stretch of the CommitLog.

Every time a node starts acting as master (promotion, or a master's restart) it opens a new
epoch: one more than any epoch it has heard of, starting at its log's end offset at that
moment. Every entry it writes carries the epoch in the codec's term field, and its first
entry is an `%EPOCH%` marker. A node's epoch list is a list of (epoch, start offset) pairs,
strictly increasing in both.

The fork point of two logs (RocketMQ's consistent point): walk the slave's epochs from the
newest; the first one that the master also has, with the same start offset, was written by
one master in both logs, and each log holds a prefix of what that master wrote. So the logs
agree up to the smaller of the two ends of that epoch (an epoch ends where the next one
starts, or at the log's end), and may differ after it.

Pure: no files (replication/master_slave/state.py persists the list).
"""

from __future__ import annotations

from typing import NamedTuple

from broker.protocol.codes import BadRequest

# Bounds (inclusive) of an epoch and of a CommitLog offset, the one place they are defined: the
# HA wire (wire.py) and HA_ROLE (broker/protocol/ha.py) check them on decode and encode, the
# epoch list and the promotion rules (roles.py) refuse to go past them. The TRANSFER header's
# epoch field is a u32: 2**31 leaves room for "one more than any epoch heard of" to fit, and
# is far beyond real promotions (one a second for 68 years). Offsets are u64 on the wire and
# i64 in the codec: 2**62 bytes (4 EiB) is more than a CommitLog will ever hold.
EPOCH_MAX = 2**31
OFFSET_MAX = 2**62


class EpochLimitError(BadRequest):
    """An epoch (or an offset of the epoch list) past its bound: refused, never recorded. A
    BadRequest, so an HA_ROLE that leads to one is answered BAD_REQUEST with this text."""


def check_epoch(epoch, what: str = "epoch") -> int:
    if type(epoch) is not int or not 0 <= epoch <= EPOCH_MAX:
        raise EpochLimitError(f"{what} {epoch!r} is out of range, the limit is 0..EPOCH_MAX={EPOCH_MAX}")
    return epoch


def check_offset(offset, what: str = "offset") -> int:
    if type(offset) is not int or not 0 <= offset <= OFFSET_MAX:
        raise EpochLimitError(f"{what} {offset!r} is out of range, the limit is 0..OFFSET_MAX={OFFSET_MAX}")
    return offset


class Epoch(NamedTuple):
    epoch: int
    start: int  # the CommitLog offset where this epoch's master began writing


class EpochList:
    def __init__(self, entries=()):
        self.entries: list[Epoch] = [Epoch(check_epoch(int(e)), check_offset(int(s), "epoch start"))
                                     for e, s in entries]
        for a, b in zip(self.entries, self.entries[1:]):
            if not (b.epoch > a.epoch and b.start >= a.start):
                raise ValueError(f"epochs out of order: {a} then {b}")

    def __len__(self) -> int:
        return len(self.entries)

    def __eq__(self, other) -> bool:
        return isinstance(other, EpochList) and self.entries == other.entries

    def __repr__(self) -> str:
        return f"EpochList({self.entries})"

    @property
    def last_epoch(self) -> int:
        return self.entries[-1].epoch if self.entries else 0

    def find(self, epoch: int) -> int | None:
        for i, e in enumerate(self.entries):
            if e.epoch == epoch:
                return i
        return None

    def start_of(self, epoch: int) -> int | None:
        i = self.find(epoch)
        return None if i is None else self.entries[i].start

    def end_of(self, i: int, log_end: int) -> int:
        return self.entries[i + 1].start if i + 1 < len(self.entries) else log_end

    def open(self, epoch: int, start: int) -> None:
        """A new epoch starts at `start` (the log's end when its master began)."""
        check_epoch(epoch)
        check_offset(start, "epoch start")
        if self.entries and (epoch <= self.last_epoch or start < self.entries[-1].start):
            raise ValueError(f"epoch {epoch} at {start} cannot follow {self.entries[-1]}")
        self.entries.append(Epoch(epoch, start))

    def truncate(self, offset: int) -> bool:
        """The log was cut at `offset`: forget epochs that no longer have an entry (those
        that start at or after it). True if anything changed."""
        keep = [e for e in self.entries if e.start < offset]
        changed = len(keep) != len(self.entries)
        self.entries = keep
        return changed

    def to_list(self) -> list[list[int]]:
        return [[e.epoch, e.start] for e in self.entries]


def consistent_point(slave: EpochList, slave_end: int, master: EpochList,
                     master_end: int) -> int | None:
    """The offset up to which the slave's log agrees with the master's, or None when they
    share no epoch (the slave must start over from the master's log)."""
    for i in range(len(slave.entries) - 1, -1, -1):
        s = slave.entries[i]
        j = master.find(s.epoch)
        if j is not None and master.entries[j].start == s.start:
            return min(slave.end_of(i, slave_end), master.end_of(j, master_end))
    return None


class Plan(NamedTuple):
    start: int  # where the master starts streaming
    truncate_to: int | None  # the slave cuts its log here first (None: nothing to cut)
    reset: bool  # the slave drops its whole log: the first entry streamed starts it again


def sync_plan(slave: EpochList, slave_min: int, slave_end: int, master: EpochList,
              master_min: int, master_first_entry: int, master_end: int) -> Plan:
    """How a slave that connects gets in line with the master (decided by the master).

    `master_first_entry` is where the master's first entry starts (streams begin at an
    entry); a slave that shares no epoch with the master, or whose agreeing prefix the master
    has already deleted, starts over from there."""
    empty = slave_end == slave_min
    cp = consistent_point(slave, slave_end, master, master_end)
    if cp is None:
        if empty and slave_end == master_first_entry:
            return Plan(master_first_entry, None, False)
        return Plan(master_first_entry, None, True)
    if cp < master_min or cp < slave_min:
        return Plan(master_first_entry, None, True)
    return Plan(cp, cp if cp < slave_end else None, False)
