"""One Raft node: roles, terms, votes (with pre-vote and a leader lease), and routing.

Pure: it takes ticks (`tick`), peer messages (`step`), the leader's own appends
(`local_appended`) and operator requests (`transfer_leader`), and gives back a Ready
(`ready()`), which the driver must apply completely before the next input. The leader's
replication lives in leader.py, the follower's handling of pushes in follower.py.

Terms stay within 0..TERM_MAX (messages.py) by construction: a message with any number out of
its bound is dropped before it is looked at (counted in `status()`), a hard state beyond it
is refused at construction, and a node at TERM_MAX does not campaign (its next term would not
be accepted by any peer); so the hard state this core asks the driver to persist is always
one that loads again.
"""

from __future__ import annotations

import random

from replication.raft import messages as m
from replication.raft.core import HardState, LogView, RaftConfig, Ready, Role
from replication.raft.follower import FollowerSide
from replication.raft.leader import LeaderSide
from replication.raft.quorum import majority

NEVER = -(10**12)


class RaftNode:
    def __init__(self, cfg: RaftConfig, log: LogView, hard: HardState, commit_index: int,
                 rng: random.Random):
        self.cfg = cfg
        self.id = cfg.node_id
        self.peers = [v for v in cfg.voters if v != cfg.node_id]
        self.log = log
        self.rng = rng
        if not isinstance(hard.term, int) or not 0 <= hard.term <= m.TERM_MAX:
            raise ValueError(f"hard state term {hard.term!r} is outside 0..TERM_MAX={m.TERM_MAX}")
        self.term = hard.term
        self._restarted = hard.term > 0
        self.voted_for = hard.voted_for
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self.commit_index = commit_index
        self.now = 0
        self.election_elapsed = 0
        self.election_timeout = self._random_timeout()
        self.heard_leader_tick = NEVER
        self.votes: dict[str, bool] = {}
        self.leading: LeaderSide | None = None
        self.following = FollowerSide(self)
        self._ready = Ready()
        self._seq = 0
        self.refused_messages = 0  # messages dropped for a number out of bounds
        self.last_refused: str | None = None  # why the last one was
        self.campaigns_refused = 0  # elections not started: the term is at TERM_MAX

    # --- the driver's interface ------------------------------------------------------------

    def ready(self) -> Ready:
        r, self._ready = self._ready, Ready()
        self.following.input_done()
        return r

    def tick(self) -> None:
        self.now += 1
        if self.role == Role.LEADER:
            self.leading.tick()
            return
        self.following.tick()
        self.election_elapsed += 1
        if self.election_elapsed >= self.election_timeout:
            self._campaign(pre=self.cfg.pre_vote)

    def quiet_ticks(self) -> int:
        """How many of the next ticks would only count: no message, no change of role or
        term, nothing in a Ready. A driver may sleep through them and run them late, all at
        once, before its next input (an idle node need not wake every tick): a follower's
        until its election timeout, a leader's until its next heartbeat (LeaderSide)."""
        if self.role == Role.LEADER:
            return self.leading.quiet_ticks()
        if self.following.buffer:
            return 0  # waiting appends time out on ticks
        return max(0, self.election_timeout - self.election_elapsed - 1)

    def step(self, msg: m.Message) -> None:
        bad = m.out_of_bounds(msg, entries=False)  # (a push's entries: the wire decoder checked them)
        if bad is not None:  # never adopted: the wire decoder refuses these before us
            field, value, limit = bad
            self.refused_messages += 1
            self.last_refused = (f"{type(msg).__name__} from {msg.src!r}: {field} {value} is out "
                                 f"of range, the limit is {limit}")
            return
        cls = msg.__class__
        if msg.term == self.term and (cls is m.Push or cls is m.PushResponse):
            # the steady state, first: what the chain below does with a push (from the
            # leader) or a push's answer (to it) of the current term
            if cls is m.Push:
                self._from_leader(msg)
            elif self.role == Role.LEADER:
                self.leading.on_response(msg)
            return
        if isinstance(msg, m.VoteRequest):
            self._on_vote_request(msg)
        elif isinstance(msg, m.VoteResponse):
            self._on_vote_response(msg)
        elif msg.term > self.term and not isinstance(msg, m.HeartbeatResponse | m.PushResponse):
            # a leader of a newer term speaks: follow it
            self._become_follower(msg.term, msg.src)
            self._from_leader(msg)
        elif msg.term > self.term:
            self._become_follower(msg.term, None)  # an answer from a newer term: step down
        elif isinstance(msg, m.Push | m.Heartbeat | m.TimeoutNow):
            self._from_leader(msg)
        elif self.role == Role.LEADER and msg.term == self.term:
            self.leading.on_response(msg)

    def local_appended(self, last_index: int) -> None:
        """The leader's driver appended (and, per the flush policy, persisted) up to here."""
        if self.role == Role.LEADER:
            self.leading.local_appended(last_index)

    def link_up(self, peer: str) -> None:
        """The driver opened a new connection to `peer` (see LeaderSide.link_up)."""
        if self.role == Role.LEADER:
            self.leading.link_up(peer)

    def transfer_leader(self, target: str) -> str | None:
        """Start moving leadership to `target`; an error message, or None when started."""
        if self.role != Role.LEADER:
            return f"{self.id} is not the leader (the leader is {self.leader_id})"
        if target == self.id:
            if self.leading.transfer is not None:  # leading now, but not for long
                return f"{self.id} leads, but a transfer to {self.leading.transfer[0]} is under way: retry once it ends"
            return None  # it leads already: nothing to move (an operator's retry is not an error)
        return self.leading.start_transfer(target)

    @property
    def is_leader(self) -> bool:
        return self.role == Role.LEADER

    @property
    def read_lease_held(self) -> bool:
        """This leader may serve reads: no other node can have been elected yet (leader.py's
        read lease; it ends before the earliest time a new leader could win)."""
        return self.role == Role.LEADER and self.leading.lease_held()

    @property
    def accepting_writes(self) -> bool:
        return self.role == Role.LEADER and self.leading.transfer is None

    def status(self) -> dict:
        out = {"id": self.id, "role": self.role.value, "term": self.term, "leader": self.leader_id,
               "commit_index": self.commit_index, "begin_index": self.log.begin_index(),
               "end_index": self.log.last_index(), "voted_for": self.voted_for}
        if self.refused_messages:
            out.update(refused_messages=self.refused_messages, last_refused=self.last_refused)
        if self.term >= m.TERM_MAX:
            out["problem"] = (f"term {self.term} is at TERM_MAX={m.TERM_MAX}: this node cannot "
                              f"campaign ({self.campaigns_refused} elections not started; a forged or "
                              "corrupt term). Stop the group; in raft_state.json of each member at "
                              "this term set \"term\" to one more than the highest term in any "
                              "member's CommitLog and \"voted_for\" to null; start it again")
        if self.leading is not None:
            out.update(self.leading.status())
        return out

    # --- plumbing used by the two sides ----------------------------------------------------

    def send(self, to: str, msg: m.Message) -> None:
        self._ready.messages.append((to, msg))

    def next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @property
    def seq(self) -> int:
        """The last push id next_seq gave (the leader lane numbers its pushes before sending)."""
        return self._seq

    def set_commit(self, index: int) -> None:
        if index > self.commit_index:
            self.commit_index = index
            self._ready.commit_index = index

    def ready_record(self) -> Ready:
        return self._ready

    # --- roles -------------------------------------------------------------------------------

    def _random_timeout(self) -> int:
        return self.cfg.election_ticks + self.rng.randrange(self.cfg.election_ticks)

    def _persist_hard_state(self) -> None:
        assert 0 <= self.term <= m.TERM_MAX, f"term {self.term} outside 0..TERM_MAX"
        self._ready.hard_state = HardState(self.term, self.voted_for)

    def _reset_election_timer(self) -> None:
        self.election_elapsed = 0
        self.election_timeout = self._random_timeout()

    def _become_follower(self, term: int, leader: str | None) -> None:
        assert term <= m.TERM_MAX, f"term {term} over TERM_MAX (step checks every message)"
        new_term = term > self.term
        if new_term:
            self.term = term
            self.voted_for = None
            self._persist_hard_state()
        if self.role != Role.FOLLOWER or leader != self.leader_id or new_term:
            self._ready.role_changed = True
            self.following.leader_changed()  # what we verified was against another leadership
        self.role = Role.FOLLOWER
        self.leader_id = leader
        self.leading = None
        self._reset_election_timer()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader_id = self.id
        self.leading = LeaderSide(self)
        self._ready.role_changed = True
        self._ready.append_noop = True
        self.leading.start()

    def step_down(self) -> None:
        """Check-quorum failed or a transfer handed over: follow whoever comes next."""
        self._become_follower(self.term, None)

    def _campaign(self, pre: bool, transfer: bool = False) -> None:
        self._reset_election_timer()
        if self.term >= m.TERM_MAX:  # term + 1 would be refused by every peer (and by load)
            self.campaigns_refused += 1
            if self.role != Role.FOLLOWER:
                self._become_follower(self.term, None)
            return
        if pre:
            self.role = Role.PRE_CANDIDATE
            term = self.term + 1
        else:
            self.role = Role.CANDIDATE
            self.term += 1
            self.voted_for = self.id
            self._persist_hard_state()
            term = self.term
        self._ready.role_changed = True
        self.leader_id = None
        self.votes = {self.id: True}
        if len(self.cfg.voters) == 1:
            return self._campaign(False) if pre else self._become_leader()
        last = self.log.last_index()
        last_term = (self.log.term_at(last) or 0) if last >= 0 else 0
        for p in self.peers:
            self.send(p, m.VoteRequest(self.id, term, last, last_term, pre, transfer))

    def _lease_held(self) -> bool:
        """We heard from a live leader within the election timeout (or are the leader).
        A node that restarted less than an election timeout ago counts as having heard one:
        before the restart it may have answered a leader whose read lease counts on it (a
        node that never had a term cannot have)."""
        if self.role == Role.LEADER or (self.now < self.cfg.election_ticks and self._restarted):
            return True
        # not "and leader_id is not None": a newer term learned from a vote's answer forgets
        # the leader, not the promise made to it (seed 816333782: n0 answered n2's push, took
        # term 4 from a refused pre-vote's answer, then voted n1 in while n2's lease counted on it)
        return self.now - self.heard_leader_tick < self.cfg.election_ticks

    def _log_ok(self, last_index: int, last_term: int) -> bool:
        mine = self.log.last_index()
        my_term = (self.log.term_at(mine) or 0) if mine >= 0 else 0
        return (last_term, last_index) >= (my_term, mine)

    def _on_vote_request(self, r: m.VoteRequest) -> None:
        if r.pre_vote:
            granted = r.term > self.term and self._log_ok(r.last_index, r.last_term) \
                and not self._lease_held()
            self.send(r.src, m.VoteResponse(self.id, r.term if granted else self.term, granted, True))
            return
        if r.term < self.term or (self._lease_held() and not r.transfer):
            self.send(r.src, m.VoteResponse(self.id, self.term, False))
            return
        if r.term > self.term:
            self._become_follower(r.term, None)
        granted = self.voted_for in (None, r.src) and self._log_ok(r.last_index, r.last_term)
        if granted:
            self.voted_for = r.src
            self._persist_hard_state()
            self._reset_election_timer()
        self.send(r.src, m.VoteResponse(self.id, self.term, granted))

    def _on_vote_response(self, r: m.VoteResponse) -> None:
        if r.term > self.term and not (r.pre_vote and r.granted):
            self._become_follower(r.term, None)
            return
        want = Role.PRE_CANDIDATE if r.pre_vote else Role.CANDIDATE
        if self.role != want or (not r.pre_vote and r.term != self.term):
            return
        self.votes[r.src] = r.granted
        need = majority(len(self.cfg.voters))
        if sum(self.votes.values()) >= need:
            self._campaign(False) if r.pre_vote else self._become_leader()
        elif sum(1 for v in self.votes.values() if not v) >= need:
            self._become_follower(self.term, None)

    def _from_leader(self, msg) -> None:
        """A Push, Heartbeat or TimeoutNow from the leader of our term (or an older one)."""
        if msg.term < self.term:
            if isinstance(msg, m.Push):
                self.following.reject_stale(msg)
            elif isinstance(msg, m.Heartbeat):
                self.send(msg.src, m.HeartbeatResponse(self.id, self.term, False))
            return
        if self.role != Role.FOLLOWER or self.leader_id != msg.src:
            self._become_follower(msg.term, msg.src)
        self.heard_leader_tick = self.now
        self.election_elapsed = 0
        if isinstance(msg, m.Push):
            self.following.on_push(msg)
        elif isinstance(msg, m.Heartbeat):
            self.following.advance_commit(msg.commit_index)
            self.send(msg.src, m.HeartbeatResponse(self.id, self.term, True,
                                                   self.following.needs_probe(msg.commit_index)))
        else:  # TimeoutNow: the leader hands over to us
            self._campaign(pre=False, transfer=True)
