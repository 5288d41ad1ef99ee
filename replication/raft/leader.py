"""The leader's side of the core: one dispatcher per follower (DLedger's EntryDispatcher),
the quorum ack (QuorumAckChecker), heartbeats, check-quorum and leadership transfer.

Commit rule (Raft's): the commit index is the highest index that a majority holds (the
leader counts what its driver reported as persisted) *and* whose entry is of the current
term; entries of earlier terms commit with it. A new leader's driver appends a no-op of the
new term first, so earlier entries commit without waiting for a client write.

Read lease: a follower that answers a push sent at tick `s` heard this leader at or after
`s`, so it refuses (pre-)votes and does not campaign until `s + election_ticks` on its own
clock. When a majority (this leader included) has answered pushes sent at or after `s`,
no other node can be elected before then; the lease ends `lease_margin_ticks` earlier
(tick phase and clock-rate drift between nodes). It is measured from when the push was
*sent*, never from when the answer arrived. Heartbeats go out as COMMIT pushes so that
their answers carry the push's seq. A TimeoutNow lets its target win at once: no lease
from then until the target answers a push sent after it.
"""

from __future__ import annotations

from replication.raft import messages as m
from replication.raft.progress import NEVER, Progress, State, after_compare
from replication.raft.quorum import majority, quorum_index

LEASE_DRIFT_PERCENT = 10  # of the election timeout: clock-rate difference between nodes
SENT_TRACKED_EXTRA = 64  # pushes tracked for the lease per follower, beyond max_pending_entries
FOREVER = 10**18


def lease_margin_ticks(election_ticks: int) -> int:
    """One tick for the phase between two nodes' tick counters, plus the drift allowance."""
    return 1 + election_ticks * LEASE_DRIFT_PERCENT // 100


class LeaderSide:
    def __init__(self, node):
        self.node = node
        self.progress = {p: Progress(p, last_heard_tick=node.now) for p in node.peers}
        # what this node's driver reported as appended + persisted (its log, at election)
        self.local_index = node.log.last_index()
        # every entry from here on is of this term (only this leader appends in it): the
        # commit rule's term check needs no log read for them
        self.own_from = self.local_index + 1
        self.transfer: tuple[str, int] | None = None  # (target, deadline tick)
        self._timeout_now_sent = False
        self._timeout_now: tuple[str, int] | None = None  # (target, tick): no lease until it
        # answers a push sent after that tick
        self._since_heartbeat = 0
        self._since_quorum_check = 0
        self._last_transfer_try = -(10**12)

    def start(self) -> None:
        self._heartbeat()

    # --- inputs ------------------------------------------------------------------------------

    def tick(self) -> None:
        node, cfg = self.node, self.node.cfg
        self._since_heartbeat += 1
        if self._since_heartbeat >= cfg.heartbeat_ticks:
            self._heartbeat()
        self._since_quorum_check += 1
        if cfg.check_quorum and self._since_quorum_check >= cfg.election_ticks:
            self._since_quorum_check = 0
            live = 1 + sum(1 for p in self.progress.values()
                           if node.now - p.last_heard_tick < cfg.election_ticks)
            if live < majority(len(cfg.voters)):
                return node.step_down()  # cut off from a majority: stop taking writes
        if self.transfer is not None and node.now >= self.transfer[1]:
            self.transfer = None  # the transfer did not happen in time: carry on leading
        self._maybe_prefer()
        for p in self.progress.values():
            self._dispatch(p, commit_alone=True)

    def quiet_ticks(self) -> int:
        """RaftNode.quiet_ticks for a leader: none while anything is in flight, unsent or
        unsaid (a follower behind, probing, or not told the commit index: tick() pushes or
        times it out), a transfer is on or a preferred leader may take over; otherwise until
        the next heartbeat or check-quorum."""
        node, cfg = self.node, self.node.cfg
        if self.transfer is not None or cfg.preferred_leader not in (None, node.id):
            return 0
        last = node.log.last_index()
        for p in self.progress.values():
            if p.state != State.APPEND or p.write_index <= last or p.pending or p.commit_sent < node.commit_index:
                return 0
        quiet = cfg.heartbeat_ticks - self._since_heartbeat - 1
        if cfg.check_quorum:
            quiet = min(quiet, cfg.election_ticks - self._since_quorum_check - 1)
        return max(0, quiet)

    def local_appended(self, last_index: int) -> None:
        self.local_index = max(self.local_index, last_index)
        self._maybe_commit()
        for p in self.progress.values():
            self._dispatch(p)

    def link_up(self, peer: str) -> None:
        """A new connection to `peer`: whatever was in flight went out on a link that no longer
        exists (or was dropped for want of one), so resend it now, not after the push timeout."""
        p = self.progress.get(peer)
        if p is not None:
            p.in_flight_lost()
            self._dispatch(p, commit_alone=True)

    def on_response(self, r) -> None:
        if r.__class__ is m.PushResponse and r.type == m.PushType.APPEND and r.code == m.PushCode.SUCCESS:
            return self.append_held(r.src, r.index, r.seq)  # (the steady state's answer)
        p = self.progress.get(r.src)
        if p is None:
            return
        p.last_heard_tick = self.node.now
        if isinstance(r, m.PushResponse):
            self._on_push_response(p, r)
            self._dispatch(p)
        elif r.needs_probe and p.state == State.APPEND:  # a follower that restarted, caught up
            p.to_compare()
            self._dispatch(p)

    def append_held(self, peer: str, index: int, seq: int) -> None:
        """A follower's SUCCESS answer to APPEND push `seq`: it holds the log up to `index`
        (on_response's steady state, also taken by the leader lane without a message)."""
        p = self.progress.get(peer)
        if p is None:
            return
        p.last_heard_tick = self.node.now
        p.push_answered(seq)  # whatever the state: it heard us in this term
        if p.state == State.APPEND:
            p.acked(index)
            if p.watermark > self.node.commit_index:  # else the quorum index cannot move
                self._maybe_commit()
        self._dispatch(p)

    def start_transfer(self, target: str) -> str | None:
        p = self.progress.get(target)
        if p is None:
            return f"{target} is not a follower of this group"
        lag = self.node.log.last_index() - p.watermark
        if lag > self.node.cfg.leadership_transfer_lag_entries_max:
            return (f"{target} lags {lag} entries, more than "
                    f"leadership_transfer_lag_entries_max={self.node.cfg.leadership_transfer_lag_entries_max}")
        self.transfer = (target, self.node.now + self.node.cfg.transfer_timeout_ticks)
        self._timeout_now_sent = False
        self._dispatch(p)
        return None

    # --- replication -------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        """A COMMIT push to every follower: it does what a Heartbeat does (the follower's
        timer, the commit index, "probe me" as INCONSISTENT_STATE), and its answer names
        the push, which renews the read lease from the tick it was sent."""
        self._since_heartbeat = 0
        node = self.node
        forget_before = node.now - (node.cfg.election_ticks - lease_margin_ticks(node.cfg.election_ticks))
        for p in self.progress.values():
            p.forget_sent_before(forget_before)
            self._push(p, m.PushType.COMMIT)

    def _push(self, p: Progress, kind: m.PushType, entries=()) -> int:
        node = self.node
        seq = node.next_seq()
        node.send(p.peer, m.Push(node.id, node.term, kind, node.commit_index, tuple(entries), seq))
        p.push_sent(seq, node.now, node.cfg.max_pending_entries + SENT_TRACKED_EXTRA)
        return seq

    # --- the read lease ------------------------------------------------------------------------

    def lease_end_tick(self) -> int:
        """The first tick at which another node might be elected, less the margin: this
        leader serves reads only before it."""
        cfg = self.node.cfg
        need = majority(len(cfg.voters)) - 1  # followers besides this leader
        if need <= 0:
            return FOREVER  # a group of one: nobody else can be elected
        if self._timeout_now is not None:
            target, sent_tick = self._timeout_now
            if self.progress[target].answered_sent_tick <= sent_tick:
                return NEVER  # it may be campaigning with our blessing (no lease check)
            self._timeout_now = None  # it answered a later push in our term: it did not
        sent = sorted((p.answered_sent_tick for p in self.progress.values()), reverse=True)
        return sent[need - 1] + cfg.election_ticks - lease_margin_ticks(cfg.election_ticks)

    def lease_held(self) -> bool:
        return self.node.now < self.lease_end_tick()

    def _dispatch(self, p: Progress, commit_alone: bool = False) -> None:
        """Send `p` what it needs next. A commit index with no entries to carry it goes out
        only from the tick (`commit_alone`): a steady stream of appends carries it, and
        sending it at once would double the messages and wake-ups of every round trip at
        W=1 (a COMMIT push and its answer per follower after each commit) for followers that
        serve no reads -- they learn it within a tick."""
        node, cfg, log = self.node, self.node.cfg, self.node.log
        last = log.last_index()
        if p.write_index > last and not p.pending and not commit_alone and p.state == State.APPEND \
                and self.transfer is None:
            return  # caught up, nothing in flight (every answer at W=1): nothing to send
        begin = log.begin_index()
        if (p.state == State.APPEND and p.write_index < begin) or \
                (p.state == State.TRUNCATE and p.compare_index < begin):
            # retention deleted what this follower needs next (or the point a TRUNCATE was to
            # cut at): find where it stands again; COMPARE ends in a TRUNCATE at our begin,
            # which resets its log there (DLedger: a missing entry sends it back to COMPARE)
            p.to_compare()
        if p.state != State.APPEND:
            if p.probe_seq:
                if node.now - p.probe_sent_tick < cfg.push_timeout_ticks:
                    return  # a probe is in flight
                p.in_flight_lost()
            if last < begin:
                return  # nothing held to compare with
            if p.state == State.COMPARE:
                if p.compare_index < 0 or not begin <= p.compare_index <= last:
                    p.compare_index = last
                entry = (p.compare_index, log.term_at(p.compare_index), b"")
                p.probe_seq = self._push(p, m.PushType.COMPARE, [entry])
            else:  # TRUNCATE: compare_index holds the index to truncate at; at our begin it
                # may restart a log that does not overlap ours (RESET), nowhere else
                kind = m.PushType.RESET if p.compare_index == begin else m.PushType.TRUNCATE
                p.probe_seq = self._push(p, kind, log.entries(p.compare_index, 1, 1 << 62))
            p.probe_sent_tick = node.now
            return
        if p.pending:
            oldest = min(sent for _, sent in p.pending.values())
            if node.now - oldest >= cfg.push_timeout_ticks:
                p.in_flight_lost()  # no answer in time: resend from the watermark
        while p.write_index <= last and p.pending_entries < cfg.max_pending_entries:
            budget = self._quota_left(p)
            if budget <= 0:
                break
            entries = log.entries(p.write_index,
                                  min(cfg.push_batch_entries_max, cfg.max_pending_entries - p.pending_entries),
                                  min(cfg.push_batch_bytes_max, budget))
            if not entries:
                break
            self._push(p, m.PushType.APPEND, entries)
            first, last_sent = entries[0][0], entries[-1][0]
            p.pending[first] = (last_sent, node.now)
            p.pending_entries += len(entries)
            p.write_index = last_sent + 1
            p.quota_bytes += sum(len(e[2]) for e in entries)
            p.commit_sent = node.commit_index
        if commit_alone and p.write_index > last and not p.pending and p.commit_sent < node.commit_index:
            p.commit_sent = node.commit_index
            self._push(p, m.PushType.COMMIT)  # appends are sparse: say the commit index alone
        if self.transfer is not None and self.transfer[0] == p.peer and not self._timeout_now_sent \
                and p.watermark >= last:
            self._timeout_now_sent = True
            self._timeout_now = (p.peer, node.now)
            node.send(p.peer, m.TimeoutNow(node.id, node.term))

    def _quota_left(self, p: Progress) -> int:
        """DLedger's peer push quota: above the throttle point of lag, a byte rate cap."""
        cfg, now = self.node.cfg, self.node.now
        if now - p.quota_window_tick >= cfg.ticks_per_second:
            p.quota_window_tick, p.quota_bytes = now, 0
        if self.node.log.bytes_after(p.watermark) <= cfg.peer_push_throttle_point_bytes:
            return 1 << 62
        return cfg.peer_push_quota_bytes_per_s - p.quota_bytes

    def _on_push_response(self, p: Progress, r: m.PushResponse) -> None:
        log = self.node.log
        p.push_answered(r.seq)  # whatever the code: it heard us in this term
        if r.type == m.PushType.APPEND:  # (SUCCESS: append_held)
            if r.code == m.PushCode.INCONSISTENT_STATE:
                p.to_compare()
        elif r.type == m.PushType.COMMIT:
            if r.code == m.PushCode.INCONSISTENT_STATE and p.state == State.APPEND:
                p.to_compare()
        elif r.type in m.PROBES:
            if r.seq != p.probe_seq:
                return  # an answer to an older probe
            p.probe_seq = 0
            if r.type != m.PushType.COMPARE:  # TRUNCATE / RESET
                if r.code == m.PushCode.SUCCESS:
                    p.to_append(r.index)
                    self._maybe_commit()
                else:
                    p.to_compare()
                return
            state, index = after_compare(p.compare_index, log.begin_index(), log.last_index(),
                                         r.code == m.PushCode.SUCCESS, r.begin_index, r.end_index)
            if state == State.APPEND:
                p.to_append(index)
                self._maybe_commit()
            else:
                p.state, p.compare_index = state, index

    def _maybe_commit(self) -> None:
        node = self.node
        marks = [p.watermark if p.state == State.APPEND else -1 for p in self.progress.values()]
        marks.append(self.local_index)
        qi = quorum_index(marks, len(node.cfg.voters))
        if qi > node.commit_index and (qi >= self.own_from or node.log.term_at(qi) == node.term):
            node.set_commit(qi)

    def _maybe_prefer(self) -> None:
        node, cfg = self.node, self.node.cfg
        pref = cfg.preferred_leader
        if pref is None or pref == node.id or self.transfer is not None:
            return
        if node.now - self._last_transfer_try < 2 * cfg.transfer_timeout_ticks:
            return
        p = self.progress[pref]
        if p.state == State.APPEND and p.watermark >= node.log.last_index() >= 0:
            self._last_transfer_try = node.now
            self.start_transfer(pref)

    def status(self) -> dict:
        last = self.node.log.last_index()
        return {"transfer_to": self.transfer[0] if self.transfer else None,
                "followers": {p.peer: {"state": p.state.value, "watermark": p.watermark,
                                       "lag": max(0, last - p.watermark),
                                       "in_flight": p.pending_entries}
                              for p in self.progress.values()}}
