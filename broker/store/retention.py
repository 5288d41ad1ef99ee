"""Retention: which CommitLog segments to delete, and why (a pure planner).

After RocketMQ's CleanCommitLogService:
- a segment expires `file_reserved_hours` after it was last written; expired segments are
  deleted during the daily `delete_when` hours;
- when disk usage passes `disk_usage_ratio_clean`, expired segments go at once, whatever
  the hour; past `disk_usage_ratio_force`, the oldest segments go even if not expired;
- the active (last) segment is never deleted, nor any segment that ends past the store's
  `Floor`: what is flushed, committed, dispatched (indexed, and its system entries applied)
  and recorded as dispatched by a durable checkpoint (a restart re-dispatches from there).
  This holds for the force threshold too: the dispatcher is fast, and a full disk with an
  undispatched tail is answered by the store refusing sends (DISK_FULL), not by deleting
  entries nobody indexed -- a `%ACL%` delete_user never applied lets the user log in;
- only a prefix of the log is deleted (oldest first).

Holders (consumer groups that have not consumed it, and later replicas that have not
copied it) never block a deletion that the policy asks for, but every deletion that takes
away data a holder still needs is named in a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


@dataclass(frozen=True)
class SegmentInfo:
    base: int
    end: int
    mtime_s: float


@dataclass(frozen=True)
class Holder:
    """Someone who still needs the log from `needs_from` on (a physical offset)."""

    name: str  # e.g. "consumer group billing on orders/2"
    needs_from: int
    pending: int = 0  # how many messages it has not consumed yet


class Floor(NamedTuple):
    """CommitLog offsets retention never deletes past (each: everything below it is ...)."""

    flushed: int  # ... fsynced
    committed: int  # ... confirmed: the replication's commit point, else the flush policy's
    dispatched: int  # ... in the ConsumeQueues and key index, its system entries applied
    checkpointed: int  # ... dispatched according to the last durable checkpoint

    @property
    def offset(self) -> int:
        return min(self)

    def limit(self) -> str:
        """Which bound holds the floor where it is (for the log)."""
        return min(self._fields, key=lambda name: getattr(self, name))


@dataclass(frozen=True)
class RetentionPolicy:
    file_reserved_hours: float = 72
    delete_hours: frozenset[int] = frozenset({4})
    disk_usage_ratio_clean: float = 0.75
    disk_usage_ratio_force: float = 0.85


@dataclass
class Plan:
    delete: list[SegmentInfo] = field(default_factory=list)
    reason: str = ""
    warnings: list[str] = field(default_factory=list)
    held: str = ""  # why a segment the policy would delete is kept (the floor), if one is

    @property
    def delete_before(self) -> int | None:
        return self.delete[-1].end if self.delete else None


def parse_delete_when(spec: str) -> frozenset[int]:
    """RocketMQ's `deleteWhen`: hours of the day separated by ';', e.g. "04" or "01;13"."""
    hours = set()
    for part in str(spec).split(";"):
        part = part.strip()
        if not part.isdigit() or not 0 <= int(part) <= 23:
            raise ValueError(f"delete_when: {part!r} is not an hour 0..23 (use e.g. \"04\" or \"01;13\")")
        hours.add(int(part))
    return frozenset(hours)


def plan(segments: list[SegmentInfo], *, now_s: float, local_hour: int,
         disk_usage_ratio: float, floor: Floor, holders: list[Holder],
         policy: RetentionPolicy) -> Plan:
    """Decide which prefix of `segments` (oldest first) to delete."""
    out = Plan()
    if len(segments) <= 1:
        return out
    older = segments[:-1]
    bound = floor.offset
    candidates = list(_prefix(older, lambda s: s.end <= bound))
    reserved_s = policy.file_reserved_hours * 3600
    aged = list(_prefix(older, lambda s: s.mtime_s + reserved_s <= now_s))  # what the policy alone would take
    expired = [s for s in aged if s.end <= bound]  # ... within the floor (a prefix of `candidates`)
    wanted = 0  # how many segments the policy alone would delete
    if disk_usage_ratio >= policy.disk_usage_ratio_force:
        # the expired ones, or else the oldest one; the next check goes on if still needed
        out.delete = expired or candidates[:1]
        wanted = max(1, len(aged))
        out.reason = (f"disk usage {disk_usage_ratio:.0%} is past the force threshold "
                      f"{policy.disk_usage_ratio_force:.0%}")
    elif disk_usage_ratio >= policy.disk_usage_ratio_clean or local_hour in policy.delete_hours:
        out.delete = expired
        wanted = len(aged)
        out.reason = (f"disk usage {disk_usage_ratio:.0%} is past {policy.disk_usage_ratio_clean:.0%}:"
                      f" expired segments go now" if disk_usage_ratio >= policy.disk_usage_ratio_clean
                      else f"older than file_reserved_hours={policy.file_reserved_hours:g} "
                           f"at delete hour {local_hour:02d}")
    if wanted > len(out.delete):
        kept = older[len(out.delete)]
        out.held = (f"segment {kept.base} ({out.reason}) is kept: it ends at {kept.end}, past the "
                    f"{floor.limit()} offset {bound} ({_floor_text(floor)})")
    if not out.delete:
        out.reason = ""
        return out
    cut = out.delete[-1].end
    assert cut <= bound, (cut, floor)  # the loop above stops there
    for h in holders:
        if h.needs_from < cut:
            what = f" ({h.pending} entries not yet read or copied)" if h.pending else ""
            out.warnings.append(f"{h.name} still needs offset {h.needs_from}{what}, "
                                f"below the new log start {cut}: that data is deleted")
    return out


def _floor_text(floor: Floor) -> str:
    return ", ".join(f"{k} {v}" for k, v in zip(floor._fields, floor))


def _prefix(items, pred):
    for it in items:
        if not pred(it):
            return
        yield it
