"""A follower's handling of pushes (DLedger's EntryHandler), inside the pure core.

`verified` is how far this log is known to match the current leader's: set by a COMPARE
that matched, a TRUNCATE, or appends on top of a verified log, and forgotten when the
leader or term changes (or the process restarts). An APPEND is taken only onto a fully
verified log, and the leader's commit index is applied only up to `verified`, so a
divergent suffix is never appended to nor marked committed.

A TRUNCATE cuts after a point the follower said it holds; if that point is gone (a power
cut since lost it) the follower says so and the leader compares again. Only a RESET, sent at
the leader's first entry, may restart a log that does not overlap the leader's.

The leader numbers its pushes (`seq`); a probe (COMPARE, TRUNCATE, RESET) older than a push
already seen from the same leader (a COMMIT aside: it changes no log) is a late copy and is
ignored (a late TRUNCATE would cut entries appended after it), and so is an APPEND older
than the last probe taken (the leader dropped it when it went back to probing; taking it
would change the log under the probe).

Appends that arrive ahead of a gap wait in `buffer` (bounded); a duplicate of a waiting one
gets REPEATED_PUSH; if the gap is not filled within `push_timeout_ticks` they are answered
INCONSISTENT_STATE, which sends the leader back to COMPARE.
"""

from __future__ import annotations

from replication.raft import messages as m


class FollowerSide:
    def __init__(self, node):
        self.node = node
        self.verified = -1
        self.last_seq = 0  # the highest push seq seen from this leader: probes are ordered
        self.probe_seq = 0  # the last COMPARE/TRUNCATE taken: older appends are void
        self.buffer: dict[int, tuple[m.Push, int]] = {}  # first index -> (push, arrival tick)
        self.buffered_entries = 0
        # the log's shape as changed by this input, before the driver applies it
        self._cut_from: int | None = None
        self._begin: int | None = None
        self._added: dict[int, int] = {}  # index -> term of entries appended this input
        self._last: int | None = None

    # --- the log as this input leaves it ----------------------------------------------------

    def input_done(self) -> None:
        self._cut_from = self._begin = self._last = None
        self._added.clear()

    def last_index(self) -> int:
        return self.node.log.last_index() if self._last is None else self._last

    def begin_index(self) -> int:
        return self.node.log.begin_index() if self._begin is None else self._begin

    def term_at(self, index: int) -> int | None:
        if index in self._added:
            return self._added[index]
        if self._cut_from is not None and index >= self._cut_from:
            return None
        if index < self.begin_index() or index > self.last_index():
            return None
        return self.node.log.term_at(index)

    def _truncate(self, index: int) -> None:
        ready = self.node.ready_record()
        ready.truncate_from = index if ready.truncate_from is None else min(index, ready.truncate_from)
        self._cut_from = index if self._cut_from is None else min(index, self._cut_from)
        self._last = index - 1
        for i in [i for i in self._added if i >= index]:
            del self._added[i]

    def _reset(self, index: int) -> None:
        ready = self.node.ready_record()
        ready.reset_to, ready.truncate_from, ready.append = index, None, []
        self._cut_from = -1
        self._begin = index
        self._last = index - 1
        self._added.clear()

    def _append(self, entries) -> None:
        self.node.ready_record().append.extend(entries)
        for idx, term, _ in entries:
            self._added[idx] = term
        self._last = entries[-1][0]

    # --- events ------------------------------------------------------------------------------

    def leader_changed(self) -> None:
        self.verified = -1
        self.last_seq = self.probe_seq = 0
        self.buffer.clear()
        self.buffered_entries = 0

    def tick(self) -> None:
        if not self.buffer:
            return
        timeout = self.node.cfg.push_timeout_ticks
        for first in [f for f, (_, t) in self.buffer.items() if self.node.now - t >= timeout]:
            push, _ = self.buffer.pop(first)
            self.buffered_entries -= len(push.entries)
            self._answer(push, m.PushCode.INCONSISTENT_STATE, push.entries[-1][0])

    def reject_stale(self, push: m.Push) -> None:
        self._answer(push, m.PushCode.TERM_STALE, push.entries[-1][0] if push.entries else -1)

    def advance_commit(self, leader_commit: int) -> None:
        self.node.set_commit(min(leader_commit, self.verified))

    def on_push(self, push: m.Push) -> None:
        t = push.type
        if t in m.PROBES:
            if push.seq < self.last_seq:
                return  # a late copy of a probe the leader has already moved past
            self.probe_seq = push.seq
        elif t == m.PushType.APPEND and push.seq < self.probe_seq:
            return  # sent before the leader started probing: it dropped these itself
        if t != m.PushType.COMMIT:  # it changes no log (and is the heartbeat): no probe is late for it
            self.last_seq = max(self.last_seq, push.seq)
        if t == m.PushType.APPEND:
            self._on_append(push)
        elif t == m.PushType.COMMIT:
            code = m.PushCode.INCONSISTENT_STATE if self.needs_probe(push.commit_index) else m.PushCode.SUCCESS
            self._answer(push, code, self.last_index())
        elif t == m.PushType.COMPARE:
            self._drop_buffer()
            idx, term, _ = push.entries[0]
            matched = self.term_at(idx) == term
            if matched:
                self.verified = idx
            self._answer(push, m.PushCode.SUCCESS if matched else m.PushCode.INCONSISTENT_STATE, idx)
        else:  # TRUNCATE / RESET
            self._drop_buffer()
            idx, term, _ = push.entries[0]
            if self.term_at(idx) == term:  # we hold the match point: cut only what follows
                if idx < self.last_index():
                    self._truncate(idx + 1)
            elif t == m.PushType.TRUNCATE and idx != self.last_index() + 1:
                # the match point we reported is gone (a power cut took it and more since): a
                # TRUNCATE never restarts a log, only a RESET (the leader has nothing before it)
                # may. (At our end + 1 it extends what still matches: taken, as before.)
                self._answer(push, m.PushCode.INCONSISTENT_STATE, idx)
                return
            else:
                if self.begin_index() <= idx <= self.last_index():
                    self._truncate(idx)
                elif not self.begin_index() <= idx <= self.last_index() + 1:
                    self._reset(idx)  # no overlap: restart the log at the leader's begin
                self._append(push.entries[:1])
            self.verified = idx
            self._answer(push, m.PushCode.SUCCESS, idx)
        self.advance_commit(push.commit_index)

    def needs_probe(self, leader_commit: int) -> bool:
        """Our log may hold the leader's commit point but is not verified against it (e.g.
        after a restart with nothing new to append): the leader must COMPARE us."""
        return self.verified < min(leader_commit, self.last_index())

    def _drop_buffer(self) -> None:
        self.buffer.clear()
        self.buffered_entries = 0

    def _answer(self, push: m.Push, code: m.PushCode, index: int) -> None:
        node = self.node
        node.send(push.src, m.PushResponse(node.id, node.term, push.type, code, index,
                                           self.begin_index(), self.last_index(), push.seq))

    def _on_append(self, push: m.Push) -> None:
        first = push.entries[0][0]
        end = self.last_index()
        if first > end + 1:  # ahead of a gap: wait for the gap to fill
            if first in self.buffer:
                return self._answer(push, m.PushCode.REPEATED_PUSH, push.entries[-1][0])
            if self.buffered_entries + len(push.entries) <= self.node.cfg.follower_buffer_entries_max:
                self.buffer[first] = (push, self.node.now)
                self.buffered_entries += len(push.entries)
            return  # (over the bound: dropped; the leader resends after its timeout)
        self._apply_append(push)
        while self.last_index() + 1 in self.buffer:
            nxt, _ = self.buffer.pop(self.last_index() + 1)
            self.buffered_entries -= len(nxt.entries)
            self._apply_append(nxt)

    def _apply_append(self, push: m.Push) -> None:
        end = self.last_index()
        if self.verified < end:  # not known to match this leader: compare first
            return self._answer(push, m.PushCode.INCONSISTENT_STATE, push.entries[-1][0])
        new = []
        for e in push.entries:
            if e[0] <= end:
                if self.term_at(e[0]) != e[1]:
                    return self._answer(push, m.PushCode.INCONSISTENT_STATE, e[0])
            else:
                new.append(e)
        if new:
            self._append(new)
            self.verified = self.last_index()
        self._answer(push, m.PushCode.SUCCESS, push.entries[-1][0])
