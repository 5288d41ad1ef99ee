"""The raft follower's steady state, taken straight from the read buffer (issue 15, W=1).

A follower spends most of a round trip's CPU on a push it has nothing to decide about: an
APPEND of the current term from the leader it follows, continuing its verified log. The
lane takes such frames before the frame decoder builds anything (FrameReader.lane): C
(broker/store/_zonewalk.c `follower_pushes`) reads and checks them -- the frame, the push,
every entry as `codec_batch.check_entry` and `CommitLog.append_as_follower` would, the
placement `_place` would give -- and this module applies the result the way the core's
path would leave it: the entries written (`CommitLog.append_checked_as_follower`), the state
`RaftNode._from_leader` and `FollowerSide.on_push` set, one SUCCESS answer per push, the
commit index. Anything else -- another leader or term, a probe, a gap, a roll to the next
segment, a damaged entry, a partial frame, `flush: sync` (answers wait for the fsync), a
buffered gap, a node not following -- is left in the buffer for the Python path (the
core stays the authority: the lane only ever takes less). tests/unit/test_raft_lane.py
feeds seeded streams of pushes through both and holds them to the same bytes, answers and
state. The leader's half of the plan (docs/design/native-path.md) is not built.
"""

from __future__ import annotations

import logging

from broker.store import native
from broker.store.commitlog import StoreNotWritable
from broker.store.files import DiskFull
from replication.raft import messages as m
from replication.raft import wire
from replication.raft.core import Role

# not built (no C compiler where this was installed) or TIDELOG_NO_C_EXT: the Python path only
follower_pushes = getattr(native.zonewalk(), "follower_pushes", None)

log = logging.getLogger(__name__)
STORE_ERRORS = (DiskFull, StoreNotWritable, OSError)  # a write that failed (CommitLog._undo's)
APPEND, SUCCESS = int(m.PushType.APPEND), int(m.PushCode.SUCCESS)


class FollowerLane:
    """FrameReader.lane for one connection of a raft follower (RaftDriver installs it on a
    connection once a RAFT frame came through the general path there)."""

    def __init__(self, driver, conn):
        self.d = driver
        self.conn = conn
        self.frame_max = driver.bcfg.frame_bytes_max
        self._leader: tuple[str, bytes] | None = None  # (id, its UTF-8) of the last leader seen
        self._head = (-1, b"")  # (term, wire.response_head of this node in it)
        self.secure = driver.bcfg.secure
        self._stage = 0  # of the take under way: 0 checking, 1 writing, 2 written and applied
        self._took = 0

    def __call__(self, view, start: int, end: int) -> int:
        """Bytes of buf[start:end] taken (whole frames from `start`); 0: none, the Python
        path reads them. A write that fails (a full disk: what the store raises) restarts the
        core from the disk, as after any failed step, and answers nothing (the leader sends
        again). Any other failure is a bug: the lane goes off for good in this process --
        before the write the Python path reads the frames; from the write on they count as
        taken, and the core restarts from the disk (it may have missed state the write made)."""
        self._stage = 0
        try:
            return self._take(view, start, end)
        except Exception as e:
            self.conn.decoder.lane = None
            if not (self._stage == 1 and isinstance(e, STORE_ERRORS)):
                self.d.lane_on = False
                log.exception("the raft follower lane failed; it is off until the broker restarts")
            if self._stage:
                try:
                    self.d.persist_failed(e)
                except Exception:  # (as Broker.handle contains a failing request)
                    log.exception("restarting the raft core failed")
            return self._took if self._stage else 0

    def _take(self, view, start: int, end: int) -> int:
        d = self.d
        if not self._open():
            if d.node is not None and d.node.role is not Role.FOLLOWER:
                self.conn.decoder.lane = None  # (RaftDriver._raft_frame puts the lane of the
                # node's role now on the connection at its next RAFT frame)
            return 0
        d._clock()  # the ticks due first (the general path's order); they may change the role
        node = d.node
        if node.role is not Role.FOLLOWER or node.leader_id is None:
            return 0
        lid = node.leader_id
        fol = node.following
        store = d.store
        cl = store.commitlog
        tail = cl.tail
        if (fol.buffer or fol.verified != tail.next_index - 1 or store.disk_full_reason is not None
                or cl.unwritable_reason is not None):
            return 0
        if self.secure and self.conn.member != lid:
            return 0  # (the general path drops it, naming the impostor)
        if self.d.ports.faults.blocks(lid):
            return 0
        if self._leader is None or self._leader[0] != lid:
            self._leader = (lid, lid.encode())
        r = follower_pushes(view, start, end, node.term, self._leader[1], fol.probe_seq, tail.next_index,
                            tail.last_term, tail.offset, cl.segment_end(tail.offset), self.frame_max)
        if r is None:
            return 0
        took, raws, places, terms, pushes = r
        self._took, self._stage = took, 1
        # what RaftNode._from_leader and FollowerSide.on_push / _apply_append set for each push
        node.heard_leader_tick = node.now
        node.election_elapsed = 0
        top = max(p[0] for p in pushes)
        if top > fol.last_seq:
            fol.last_seq = top
        cl.append_checked_as_follower(raws, places, terms)
        fol.verified = tail.next_index + len(raws) - 1
        self._stage = 2
        begin = node.log.begin_index()
        if self._head[0] != node.term:  # (the answers' head: this node, this term)
            self._head = (node.term, wire.response_head(node.id, node.term))
        head = self._head[1]
        for seq, leader_commit, push_last in pushes:  # per push, as apply_ready: answer, commit
            # (m.PushResponse(node.id, node.term, APPEND, SUCCESS, push_last, begin, push_last, seq))
            d._send_encoded(lid, wire.push_response_parts(head, APPEND, SUCCESS, push_last, begin, push_last, seq))
            c = min(leader_commit, push_last)  # FollowerSide.advance_commit (verified = push_last)
            if c > node.commit_index:
                node.commit_index = c
                d._committed(c)
        d.lane_pushes += len(pushes)
        d._rearm()
        d.after_input()  # the answers leave now (no frame may be left for Broker.handle)
        return took

    def _open(self) -> bool:
        """The connection and node may take the lane now (Broker.handle's gates for a RAFT
        frame, RaftDriver.on_frame's and the store's: otherwise the Python path answers)."""
        d = self.d
        conn = self.conn
        p = conn.principal
        return (d.lane_on and d.node is not None and d.node.role is Role.FOLLOWER and not d.io.outbox
                and not conn.closed
                and p is not None and (p.member is not None or not self.secure)
                and not d.ports.faults.isolated)
