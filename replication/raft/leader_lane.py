"""The raft leader's steady-state push of the entries it just wrote (issue 15, W=1).

After every send the leader's core (LeaderSide.local_appended) computes the commit index and
runs one dispatcher per follower; each builds a Push, the Ready carries them out, and
apply_ready hands them to the wire encoder and the peer links: ~70 us of Python in a W=1
round trip, every bit of it on the path to the first follower. In the steady state there is
nothing to decide: every follower in APPEND, caught up (its next index is the first new
entry), none of its pushes timed out, room in its window, no byte quota, no transfer, no
message held behind an fsync. Then this lane does what those steps would do -- the same
Progress changes, the same seqs, the same bytes to each link in the same order -- without the
objects in between, and gives up (returns False: the core's path runs) on anything else.
tests/unit/test_leader_lane.py runs seeded streams of sends, answers and ticks through a
leader with and without it and holds them to the same bytes and state.
"""

from __future__ import annotations

from replication.raft import messages as m
from replication.raft import wire
from replication.raft.leader import SENT_TRACKED_EXTRA
from replication.raft.progress import State

APPEND = int(m.PushType.APPEND)


class LeaderLane:
    def __init__(self, driver):
        self.d = driver
        self._head = (-1, b"")  # (term, wire.push_head of this node in it)

    def push_new(self, last: int) -> bool:
        """The log was appended up to `last` (written: flush async): push the new entries to
        every follower as LeaderSide.local_appended would, or return False having changed
        nothing (the caller runs the core's path)."""
        d = self.d
        node = d.node
        lead = node.leading
        if lead is None or lead.transfer is not None or d.io.outbox or not node.ready_record().empty():
            return False
        first = lead.local_index + 1
        n = last - first + 1
        cfg = node.cfg
        if n <= 0 or n > cfg.push_batch_entries_max or last > m.INDEX_MAX:
            return False
        log_view = node.log
        if first < log_view.begin_index() or last != log_view.last_index():
            return False
        # (what log.entries returns for each follower: at least one, then up to the byte bound)
        entries = d.store.commitlog.recent_entries(first, n, cfg.push_batch_bytes_max)
        if entries is None or len(entries) != n:
            return False
        now = node.now
        window = cfg.max_pending_entries
        for p in lead.progress.values():  # LeaderSide._dispatch's conditions, in the steady state
            if p.state is not State.APPEND or p.write_index != first or p.pending_entries + n > window:
                return False
            if p.pending and now - min(sent for _, sent in p.pending.values()) >= cfg.push_timeout_ticks:
                return False  # (a timeout: the core resends from the watermark)
            if log_view.bytes_after(p.watermark) > cfg.peer_push_throttle_point_bytes:
                return False  # (the quota applies: the core decides what fits)
        # the steady state: LeaderSide.local_appended, then one push per follower
        lead.local_index = max(lead.local_index, last)
        lead._maybe_commit()  # (never moves here: no follower holds the new entries yet)
        if self._head[0] != node.term:
            self._head = (node.term, wire.push_head(node.id, node.term))
        head = self._head[1]
        pack_entry = wire.ENTRY.pack
        body = []
        size = 0
        for index, term, data in entries:
            body += (pack_entry(index, term, len(data)), data)
            size += len(data)
        commit = node.commit_index
        pushes = [(p, (head, wire.PUSH.pack(APPEND, commit, node.seq + k, n), *body))
                  for k, p in enumerate(lead.progress.values(), 1)]  # (the seqs next_seq gives below)
        kept = window + SENT_TRACKED_EXTRA
        tps = cfg.ticks_per_second
        for p, parts in pushes:  # each sent, then noted (a send that fails notes nothing)
            d._send_append(p.peer, parts, node.term, last)
            seq = node.next_seq()
            if now - p.quota_window_tick >= tps:  # (LeaderSide._quota_left's window)
                p.quota_window_tick, p.quota_bytes = now, 0
            p.push_sent(seq, now, kept)
            p.pending[first] = (last, now)
            p.pending_entries += n
            p.write_index = last + 1
            p.quota_bytes += size
            p.commit_sent = commit
        d.leader_lane_pushes += 1
        if not node.ready_record().empty():  # (a commit _maybe_commit found after all)
            d._process()
        return True
