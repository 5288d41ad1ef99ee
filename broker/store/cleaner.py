"""Retention on the store (MessageStore's half that deletes the CommitLog's oldest segments;
after RocketMQ's CleanCommitLogService). `retention.plan` decides; this half gives it the
segments, the holders and the store's `Floor`, deletes what it planned, and moves the
ConsumeQueues and the key index past the new log start.

The floor is what makes a deletion safe for the dispatcher: nothing goes that is not
flushed, committed, dispatched (ConsumeQueue units and key-index entries written, system
entries applied) and recorded as dispatched by a durable checkpoint -- a kill -9 after the
deletion re-dispatches from that checkpoint's offset, which must still be in the log.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from broker.store import retention

log = logging.getLogger("broker.store.message_store")


class LogStartPastFloor(AssertionError):
    """Retention was about to delete past the store's floor (a planner bug): nothing deleted."""


class Cleaner:
    """Mixed into MessageStore: uses its commitlog, cqs, key_index, confirm_offset,
    checkpointed_dispatch and check_log_start."""

    def disk_usage_ratio(self) -> float:
        u = shutil.disk_usage(self.directory)
        return u.used / u.total if u.total else 0.0

    def holders_for(self, offsets) -> list[retention.Holder]:
        """Consumer groups as retention holders: offsets = [(group, topic, queue_id, offset)]."""
        out = []
        for group, topic, qid, off in offsets:
            cq = self.cqs.find(topic, qid)
            if cq is None or off >= cq.max_offset:
                continue
            phys = cq.phys_at(max(off, cq.min_offset))
            if phys is not None:
                out.append(retention.Holder(f"consumer group {group} on {topic}/{qid}", phys,
                                            cq.max_offset - off))
        return out

    def holders_for_replicas(self, watermarks: dict[str, int]) -> list[retention.Holder]:
        """Followers as retention holders: each still needs the entries after its watermark
        (deleting them means it will be reset and copy the whole log again)."""
        out = []
        for peer, mark in watermarks.items():
            pos = self.commitlog.position(mark + 1)
            if pos is not None:
                out.append(retention.Holder(f"replica {peer}", pos[0],
                                            self.commitlog.tail.next_index - mark - 1))
        return out

    def holders_for_offsets(self, ends: dict[str, int]) -> list[retention.Holder]:
        """Slaves as retention holders: each still needs the log from its end offset on."""
        tail = self.commitlog.tail
        return [retention.Holder(name, end, tail.next_index - self.commitlog.first_index_at_or_after(end))
                for name, end in ends.items() if end < tail.offset]

    def retention_floor(self) -> retention.Floor:
        return retention.Floor(self.commitlog.flushed.offset, self.confirm_offset,
                               self.cqs.dispatched_offset, self.checkpointed_dispatch)

    def run_retention(self, policy: retention.RetentionPolicy, holders: list[retention.Holder],
                      now_s: float | None = None, local_hour: int | None = None,
                      disk_ratio: float | None = None) -> retention.Plan:
        now_s = time.time() if now_s is None else now_s
        local_hour = time.localtime(now_s).tm_hour if local_hour is None else local_hour
        disk_ratio = self.disk_usage_ratio() if disk_ratio is None else disk_ratio
        segs = [retention.SegmentInfo(f.base, f.base + f.size, os.stat(f.path).st_mtime)
                for f in self.commitlog.segments.files]
        floor = self.retention_floor()
        p = retention.plan(segs, now_s=now_s, local_hour=local_hour, disk_usage_ratio=disk_ratio,
                           floor=floor, holders=holders, policy=policy)
        if p.held:  # past the force threshold: sends get DISK_FULL at disk_usage_ratio_write_max
            (log.warning if disk_ratio >= policy.disk_usage_ratio_force else log.info)("retention: %s", p.held)
        if not p.delete:
            return p
        if p.delete_before > floor.offset:
            raise LogStartPastFloor(f"retention planned to delete up to {p.delete_before}, past the "
                                    f"floor {floor}: nothing deleted")
        for w in p.warnings:
            log.warning("retention: %s", w)
        gone = self.commitlog.delete_segments_before(p.delete_before)
        floor_now = self.commitlog.min_offset
        for cq in self.cqs.queues.values():
            cq.forget_before_phys(floor_now)
        self.key_index.delete_before_phys(floor_now)
        self.check_log_start("retention")
        log.info("retention deleted %d segment(s) %s (%s); the log now starts at %d",
                 len(gone), ", ".join(g.name for g in gone), p.reason, floor_now)
        return p
