"""The raft leader's steady state, its two halves (issue 15, W=1): the push of the entries
a send just wrote (LeaderLane), and the followers' SUCCESS answers (LeaderAnswers).

After every send the leader's core (LeaderSide.local_appended) computes the commit index and
runs one dispatcher per follower; each builds a Push, the Ready carries them out, and
apply_ready hands them to the wire encoder and the peer links: ~70 us of Python in a W=1
round trip, every bit of it on the path to the first follower. In the steady state there is
nothing to decide: every follower in APPEND, caught up (its next index is the first new
entry), none of its pushes timed out, room in its window, no byte quota, no transfer, no
message held behind an fsync. Then this lane does what those steps would do -- the same
Progress changes, the same seqs, the same bytes to each link in the same order -- without the
objects in between, and gives up (returns False: the core's path runs) on anything else.

An answer costs the general path ~45 us before the core sees it (the frame layer, the
broker's dispatch, the wire decoder's message, the node's step); LeaderAnswers reads a run of
them in C and hands each to LeaderSide.append_held, the core's own handling of it.

tests/unit/test_leader_lane.py runs seeded streams of sends, answers and ticks through a
leader with and without both and holds them to the same bytes and state.
"""

from __future__ import annotations

import logging

from broker.store import native
from replication.raft import messages as m
from replication.raft import wire
from replication.raft.leader import SENT_TRACKED_EXTRA
from replication.raft.progress import State

# not built (no C compiler where this was installed) or TIDELOG_NO_C_EXT: the Python path only
leader_answers = getattr(native.zonewalk(), "leader_answers", None)

log = logging.getLogger(__name__)
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


class LeaderAnswers:
    """FrameReader.lane for a connection a follower answers a leader on (RaftDriver puts it on
    once a RAFT frame came through the general path there, while this node leads): its
    SUCCESS answers to APPEND pushes of the current term, read in C
    (broker/store/_zonewalk.c `leader_answers`) and given to the core as on_response would
    (LeaderSide.append_held), without a Frame or a message. Anything else -- another term or
    kind of answer, a stranger, a partial frame, a node that no longer leads -- is left in
    the buffer for the Python path."""

    def __init__(self, driver, conn):
        self.d = driver
        self.conn = conn
        self.frame_max = driver.bcfg.frame_bytes_max
        self.secure = driver.bcfg.secure
        self.members = {pid.encode(): pid for pid in driver.links}  # the peers, by their UTF-8
        self._took = 0

    def __call__(self, view, start: int, end: int) -> int:
        """Bytes of buf[start:end] taken (whole frames from `start`); 0: none. A failure is a
        bug: both leader lanes go off for good in this process; answers it had not applied
        are lost, as on a network that drops them (the pushes time out and go again)."""
        try:
            return self._take(view, start, end)
        except Exception:
            self.d.leader_lane = None
            self.conn.decoder.lane = None
            log.exception("the raft leader lane failed; it is off until the broker restarts")
            return self._took

    def _take(self, view, start: int, end: int) -> int:
        self._took = 0
        d = self.d
        conn = self.conn
        node = d.node
        if d.leader_lane is None or node is None or node.leading is None:
            conn.decoder.lane = None  # (the general path puts the right lane back)
            return 0
        p = conn.principal
        if conn.closed or p is None or (self.secure and p.member is None) or d.ports.faults.isolated:
            return 0  # (Broker.handle's gates)
        r = leader_answers(view, start, end, node.term, self.frame_max)
        if r is None:
            return 0
        took, raw, answers = r
        src = self.members.get(raw)
        if src is None or (self.secure and src != conn.member) or d.ports.faults.blocks(src):
            return 0  # (RaftDriver.on_frame drops them, naming why)
        self._took = took
        d.leader_lane_answers += len(answers)
        for index, seq in answers:  # what on_frame does for each: the ticks due, the step, the Ready
            try:
                d._clock()
                lead = d.node.leading
                if lead is not None:  # (a tick may have ended its lead: the core ignores them then)
                    lead.append_held(src, index, seq)
                d._process()
            except Exception:  # what an answer runs (a send's callbacks among them) is contained
                # per answer, as Broker.handle contains a request: not the lane's failure
                log.exception("raft answer from %s failed", src)
        d.after_input()  # what the answers released leaves now (Broker.handle's last step)
        return took
