"""What a leader knows about one follower, and DLedger's rules for finding the match point.

A follower's dispatcher is in one of three states (DLedger's EntryDispatcher):
COMPARE  probe (index, term) pairs, walking back from the leader's end, until the follower
         holds one (by the log-matching property, everything before it matches too);
TRUNCATE cut the follower's log after that point (at the leader's begin index a RESET, which
         may also restart a log that does not overlap); unanswered, compare again;
APPEND   push entries after the match point, pipelined: at most `max_pending_entries` in
         flight, resent from the watermark after `push_timeout_ticks` without progress.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum

NEVER = -(10**12)


class State(Enum):
    COMPARE = "compare"
    TRUNCATE = "truncate"
    APPEND = "append"


def after_compare(compare_index: int, leader_begin: int, leader_end: int, matched: bool,
                  follower_begin: int, follower_end: int) -> tuple[State, int]:
    """DLedger's doCompare decision, given the follower's answer about `compare_index`:
    (APPEND, match index) | (TRUNCATE, index to truncate at) | (COMPARE, next index to ask)."""
    truncate = None
    if matched:
        if compare_index == follower_end:
            return State.APPEND, compare_index  # same end: nothing to cut
        truncate = compare_index  # the follower has more after the match point
    elif follower_end < leader_begin or follower_begin > leader_end:
        truncate = leader_begin  # disjoint logs (e.g. a follower away for long): start over
    elif compare_index < follower_begin:
        truncate = leader_begin  # the follower starts after this point: start over
    elif compare_index > follower_end:
        compare_index = follower_end  # the follower is shorter: ask about its end
    else:
        compare_index -= 1  # mismatch inside both logs: step back
    if truncate is None and compare_index < leader_begin:
        truncate = leader_begin
    if truncate is not None:
        return State.TRUNCATE, truncate
    return State.COMPARE, compare_index


@dataclass
class Progress:
    peer: str
    state: State = State.COMPARE
    compare_index: int = -1  # -1: start from the leader's end
    write_index: int = 0  # APPEND: next index to push
    watermark: int = -1  # highest index the follower holds that matches ours (this term)
    pending: dict[int, tuple[int, int]] = field(default_factory=dict)  # first -> (last, sent tick)
    pending_entries: int = 0
    probe_seq: int = 0  # seq of the COMPARE/TRUNCATE in flight (0: none)
    probe_sent_tick: int = 0
    commit_sent: int = -1
    last_heard_tick: int = 0
    quota_window_tick: int = 0
    quota_bytes: int = 0
    # the read lease: (seq, sent tick) of pushes not yet answered, and the sent tick of the
    # latest push this follower answered (it heard us then, so it refuses votes until then
    # + its election timeout)
    sent: deque = field(default_factory=deque)
    answered_sent_tick: int = NEVER

    def push_sent(self, seq: int, tick: int, kept_max: int) -> None:
        self.sent.append((seq, tick))
        if len(self.sent) > kept_max:  # forgetting one only shortens the lease
            self.sent.popleft()

    def push_answered(self, seq: int) -> None:
        """An answer to push `seq`: credit its sent tick. Answers mostly come in order;
        older unanswered pushes are forgotten, and an answer to a forgotten one gives no
        credit (never more than it proves)."""
        sent = self.sent
        while sent and sent[0][0] < seq:
            sent.popleft()
        if sent and sent[0][0] == seq:
            self.answered_sent_tick = max(self.answered_sent_tick, sent.popleft()[1])

    def forget_sent_before(self, tick: int) -> None:
        """Pushes sent before `tick` could give no lease any more: stop tracking them."""
        sent = self.sent
        while sent and sent[0][1] < tick:
            sent.popleft()

    def to_compare(self) -> None:
        self.state = State.COMPARE
        self.compare_index = -1
        self.pending.clear()
        self.pending_entries = 0
        self.probe_seq = 0

    def to_append(self, match_index: int) -> None:
        self.state = State.APPEND
        self.watermark = max(self.watermark, match_index)
        self.write_index = match_index + 1
        self.pending.clear()
        self.pending_entries = 0
        self.probe_seq = 0

    def acked(self, last_index: int) -> None:
        """An APPEND up to `last_index` is held by the follower."""
        if last_index > self.watermark:
            self.watermark = last_index
        for first in [f for f, (last, _) in self.pending.items() if last <= self.watermark]:
            last, _ = self.pending.pop(first)
            self.pending_entries -= last - first + 1

    def go_back(self) -> None:
        """Resend everything after the watermark (an append got lost)."""
        self.pending.clear()
        self.pending_entries = 0
        self.write_index = self.watermark + 1

    def in_flight_lost(self) -> None:
        """What was sent got no answer (a push timeout) or went out on a link that is gone
        (a new connection): resend it on the next dispatch. A COMPARE is asked again; a
        TRUNCATE is not resent blind -- the follower may have lost its tail since it answered
        the COMPARE -- it goes back to COMPARE (DLedger: a failed truncate does the same);
        appends go from the watermark."""
        if self.state == State.TRUNCATE:
            self.to_compare()
        elif self.state == State.COMPARE:
            self.probe_seq = 0
        elif self.pending:
            self.go_back()
