"""Retention: which CommitLog segments to delete, and why (a pure planner).

After RocketMQ's CleanCommitLogService:
- a segment expires `file_reserved_hours` after it was last written; expired segments are
  deleted during the daily `delete_when` hours;
- when disk usage passes `disk_usage_ratio_clean`, expired segments go at once, whatever
  the hour; past `disk_usage_ratio_force`, the oldest segments go even if not expired;
- the active (last) segment and anything not yet flushed are never deleted;
- only a prefix of the log is deleted (oldest first).

Holders (consumer groups that have not consumed it, and later replicas that have not
copied it) never block a deletion that the policy asks for, but every deletion that takes
away data a holder still needs is named in a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
         disk_usage_ratio: float, flushed_offset: int, holders: list[Holder],
         policy: RetentionPolicy) -> Plan:
    """Decide which prefix of `segments` (oldest first) to delete."""
    out = Plan()
    if len(segments) <= 1:
        return out
    candidates = [s for s in segments[:-1] if s.end <= flushed_offset]
    reserved_s = policy.file_reserved_hours * 3600
    expired = list(_prefix(candidates, lambda s: s.mtime_s + reserved_s <= now_s))
    if disk_usage_ratio >= policy.disk_usage_ratio_force:
        # the expired ones, or else the oldest one; the next check goes on if still needed
        out.delete = expired or candidates[:1]
        out.reason = (f"disk usage {disk_usage_ratio:.0%} is past the force threshold "
                      f"{policy.disk_usage_ratio_force:.0%}")
    elif disk_usage_ratio >= policy.disk_usage_ratio_clean and expired:
        out.delete = expired
        out.reason = (f"disk usage {disk_usage_ratio:.0%} is past {policy.disk_usage_ratio_clean:.0%}:"
                      f" expired segments go now")
    elif local_hour in policy.delete_hours and expired:
        out.delete = expired
        out.reason = (f"older than file_reserved_hours={policy.file_reserved_hours:g} "
                      f"at delete hour {local_hour:02d}")
    if out.delete:
        cut = out.delete[-1].end
        for h in holders:
            if h.needs_from < cut:
                what = f" ({h.pending} entries not yet read or copied)" if h.pending else ""
                out.warnings.append(f"{h.name} still needs offset {h.needs_from}{what}, "
                                    f"below the new log start {cut}: that data is deleted")
    return out


def _prefix(items, pred):
    for it in items:
        if not pred(it):
            return
        yield it
