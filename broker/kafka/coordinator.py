"""Kafka's classic consumer-group protocol, the coordinator's side, pure: no sockets, no clock.

After Kafka's GroupCoordinator (core/.../group/GroupCoordinator.scala) and the protocol guide:
the clients choose the assignment (the leader member runs its assignor); the coordinator only
gathers members, elects a leader, numbers generations and hands out what the leader assigned.

States and what moves a group between them:

    Empty ----join----------> PreparingRebalance --every known member rejoined, or the
      ^                        ^   |               rebalance timeout passed (the silent ones
      |                        |   |               are removed): generation + 1, a leader,
      |     a member joins,    |   v               the joins answered
      |     leaves or expires  |  CompletingRebalance --the leader's SyncGroup: every
      |                        |   |                     waiting SyncGroup answered
      +---last member leaves---+   v
                                  Stable

JoinGroup from a member without an id (v4+): MEMBER_ID_REQUIRED with the id to use (KIP-394),
so a client that dies between the two calls leaves no ghost member. Heartbeat, SyncGroup and
OffsetCommit check the member and the generation (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION) and
answer REBALANCE_IN_PROGRESS while one is on, which makes the client rejoin.

A call that must wait (JoinGroup until the rebalance completes, SyncGroup until the leader
assigns) gives back no answer now: the answer comes out of a later call or `tick` as a Reply
carrying the `token` the driver passed in (its connection and correlation id).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

# Kafka error codes used here
NONE, UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL = 0, 25, 22, 23
REBALANCE_IN_PROGRESS, INVALID_SESSION_TIMEOUT, MEMBER_ID_REQUIRED, GROUP_MAX_SIZE_REACHED = 27, 26, 79, 81
COORDINATOR_NOT_AVAILABLE = 15
FORGOTTEN_MAX = 100_000  # forgotten groups whose last generation is kept
PENDING_MS = 60_000  # a member id handed out by MEMBER_ID_REQUIRED must join within this

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"


class Bounds(NamedTuple):
    session_timeout_ms_min: int = 6_000  # group.min.session.timeout.ms
    session_timeout_ms_max: int = 1_800_000  # group.max.session.timeout.ms
    members_max: int = 1000  # group.max.size
    groups_max: int = 10_000
    initial_rebalance_delay_ms: int = 0  # group.initial.rebalance.delay.ms (Kafka: 3000)


class Reply(NamedTuple):
    token: Any
    api: str  # "join" or "sync"
    body: dict


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: list  # [(name, metadata bytes)] in the member's order of preference
    last_heard_ms: int
    group_instance_id: str | None = None
    join_token: Any = None  # a JoinGroup waiting for the rebalance
    sync_token: Any = None  # a SyncGroup waiting for the leader
    assignment: bytes = b""
    rejoined: bool = False  # joined since the rebalance began


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    rebalance_deadline_ms: int = 0
    delay_until_ms: int = 0  # the first rebalance of an empty group waits this long for more members
    pending: dict = field(default_factory=dict)  # id handed out by MEMBER_ID_REQUIRED, not joined yet -> when


class Coordinator:
    def __init__(self, bounds: Bounds = Bounds(), id_prefix: str = ""):
        self.bounds = bounds
        self.groups: dict[str, Group] = {}
        self._ids = itertools.count(1)
        # the generation of each group forgotten once empty: a generation is never handed out
        # twice, so an old member's SyncGroup or commit cannot land in a new generation
        self._forgotten: dict[str, int] = {}
        self._prefix = id_prefix  # makes member ids unique across coordinators (node and term)

    # --- JoinGroup ---------------------------------------------------------------------------

    def join(self, token, now_ms: int, group_id: str, member_id: str, client_id: str, client_host: str,
             session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str, protocols: list,
             group_instance_id: str | None = None, require_known_member_id: bool = True) -> list[Reply]:
        b = self.bounds
        if not b.session_timeout_ms_min <= session_timeout_ms <= b.session_timeout_ms_max:
            return [Reply(token, "join", _join_error(INVALID_SESSION_TIMEOUT, member_id))]
        g = self.groups.get(group_id)
        if g is None:
            if len(self.groups) >= b.groups_max:
                return [Reply(token, "join", _join_error(COORDINATOR_NOT_AVAILABLE, member_id))]
            g = self.groups[group_id] = Group(group_id, generation=self._forgotten.pop(group_id, 0))
        names = [p[0] for p in protocols]
        if not names or (g.members and (protocol_type != g.protocol_type or not self._common(g, names))):
            return [Reply(token, "join", _join_error(INCONSISTENT_GROUP_PROTOCOL, member_id))]
        if not member_id:
            if len(g.members) + len(g.pending) >= b.members_max:
                return [Reply(token, "join", _join_error(GROUP_MAX_SIZE_REACHED, member_id))]
            member_id = f"{client_id or 'member'}-{self._prefix}{next(self._ids)}"
            if require_known_member_id:
                g.pending[member_id] = now_ms
                return [Reply(token, "join", _join_error(MEMBER_ID_REQUIRED, member_id))]
        elif member_id not in g.members and member_id not in g.pending:
            return [Reply(token, "join", _join_error(UNKNOWN_MEMBER_ID, member_id))]
        g.pending.pop(member_id, None)
        out: list[Reply] = []
        m = g.members.get(member_id)
        if m is None:
            m = g.members[member_id] = Member(member_id, client_id, client_host, session_timeout_ms,
                                              rebalance_timeout_ms, protocol_type, list(protocols), now_ms,
                                              group_instance_id)
            changed = True
        else:
            changed = m.protocols != list(protocols)
            m.protocols, m.session_timeout_ms = list(protocols), session_timeout_ms
            m.rebalance_timeout_ms, m.last_heard_ms = rebalance_timeout_ms, now_ms
            if m.join_token is not None:  # a join answered by this newer one (the client gave up on it)
                out.append(Reply(m.join_token, "join", _join_error(REBALANCE_IN_PROGRESS, member_id)))
        m.join_token = token
        m.rejoined = True
        if g.protocol_type is None:
            g.protocol_type = protocol_type
        if g.state == STABLE and not changed and member_id != g.leader:
            # a follower rejoining with the same metadata: answer from the current generation
            m.join_token, m.rejoined = None, False
            return out + [Reply(token, "join", self._join_answer(g, m))]
        if g.state != PREPARING:
            out += self._prepare(g, now_ms, initial=g.state == EMPTY)
        return out + self._maybe_complete(g, now_ms)

    def _common(self, g: Group, names: list) -> bool:
        return any(all(n in {p[0] for p in m.protocols} for m in g.members.values()) for n in names)

    def _prepare(self, g: Group, now_ms: int, initial: bool = False) -> list[Reply]:
        """Start a rebalance: pending SyncGroups are told to rejoin."""
        out = []
        for m in g.members.values():
            if m.sync_token is not None:
                out.append(Reply(m.sync_token, "sync", {"error_code": REBALANCE_IN_PROGRESS, "assignment": b""}))
                m.sync_token = None
            if m.join_token is None:
                m.rejoined = False
        g.state = PREPARING
        timeout = max((m.rebalance_timeout_ms for m in g.members.values()), default=0)
        delay = self.bounds.initial_rebalance_delay_ms if initial else 0
        g.rebalance_deadline_ms = now_ms + max(timeout, delay)
        g.delay_until_ms = now_ms + delay
        return out

    def _maybe_complete(self, g: Group, now_ms: int, timed_out: bool = False) -> list[Reply]:
        if g.state != PREPARING:
            return []
        if now_ms < g.delay_until_ms and not timed_out:
            return []
        if not timed_out and not all(m.rejoined for m in g.members.values()):
            return []
        out = []
        for mid in [mid for mid, m in g.members.items() if not m.rejoined]:
            del g.members[mid]  # did not rejoin within the rebalance timeout
        if not g.members:
            self._empty(g)
            return out
        g.generation += 1
        g.protocol = self._choose(g)
        if g.leader not in g.members:
            g.leader = next(iter(g.members))
        g.state = COMPLETING
        for m in g.members.values():
            m.assignment = b""
            if m.join_token is not None:
                out.append(Reply(m.join_token, "join", self._join_answer(g, m)))
                m.join_token = None
            m.rejoined = False
            m.last_heard_ms = now_ms
        return out

    def _choose(self, g: Group) -> str:
        """The protocol every member supports that most members prefer (Kafka's vote)."""
        common = [p[0] for p in next(iter(g.members.values())).protocols
                  if all(p[0] in {q[0] for q in m.protocols} for m in g.members.values())]
        votes = {n: 0 for n in common}
        for m in g.members.values():
            first = next(q[0] for q in m.protocols if q[0] in votes)
            votes[first] += 1
        return max(common, key=lambda n: votes[n])

    def _join_answer(self, g: Group, m: Member) -> dict:
        members = []
        if m.member_id == g.leader:
            members = [{"member_id": x.member_id, "group_instance_id": x.group_instance_id,
                        "metadata": dict(x.protocols)[g.protocol]} for x in g.members.values()]
        return {"error_code": NONE, "generation_id": g.generation, "protocol_type": g.protocol_type,
                "protocol_name": g.protocol, "leader": g.leader, "member_id": m.member_id, "members": members}

    def _empty(self, g: Group) -> None:
        g.state, g.leader, g.protocol = EMPTY, None, None
        g.protocol_type = None
        g.generation += 1  # Kafka bumps it when the last member goes: old commits are refused

    # --- SyncGroup, Heartbeat, LeaveGroup ------------------------------------------------------

    def _check(self, group_id: str, member_id: str, generation: int):
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return None, UNKNOWN_MEMBER_ID
        if generation != g.generation:
            return g, ILLEGAL_GENERATION
        return g, NONE

    def sync(self, token, now_ms: int, group_id: str, member_id: str, generation: int,
             assignments: dict[str, bytes]) -> list[Reply]:
        g, err = self._check(group_id, member_id, generation)
        if err:
            return [Reply(token, "sync", {"error_code": err, "assignment": b""})]
        m = g.members[member_id]
        m.last_heard_ms = now_ms
        if g.state == PREPARING:
            return [Reply(token, "sync", {"error_code": REBALANCE_IN_PROGRESS, "assignment": b""})]
        if g.state == STABLE:
            return [Reply(token, "sync", self._sync_answer(g, m))]
        out = []
        if m.sync_token is not None:
            out.append(Reply(m.sync_token, "sync", {"error_code": REBALANCE_IN_PROGRESS, "assignment": b""}))
        m.sync_token = token
        if member_id == g.leader:
            for x in g.members.values():
                x.assignment = assignments.get(x.member_id, b"")
            g.state = STABLE
            for x in g.members.values():
                if x.sync_token is not None:
                    out.append(Reply(x.sync_token, "sync", self._sync_answer(g, x)))
                    x.sync_token = None
        return out

    def _sync_answer(self, g: Group, m: Member) -> dict:
        return {"error_code": NONE, "protocol_type": g.protocol_type, "protocol_name": g.protocol,
                "assignment": m.assignment}

    def heartbeat(self, now_ms: int, group_id: str, member_id: str, generation: int) -> int:
        g, err = self._check(group_id, member_id, generation)
        if err:
            return err
        g.members[member_id].last_heard_ms = now_ms
        return REBALANCE_IN_PROGRESS if g.state == PREPARING else NONE

    def leave(self, now_ms: int, group_id: str, member_ids: list[str]) -> tuple[list[int], list[Reply]]:
        """The error of each member's leave, and the answers the rebalance it starts releases."""
        g = self.groups.get(group_id)
        errors, out = [], []
        for mid in member_ids:
            if g is None or mid not in g.members:
                errors.append(UNKNOWN_MEMBER_ID)
                continue
            errors.append(NONE)
            out += self._remove(g, mid, now_ms)
        return errors, out

    def _remove(self, g: Group, member_id: str, now_ms: int) -> list[Reply]:
        m = g.members.pop(member_id)
        out = []
        if m.join_token is not None:
            out.append(Reply(m.join_token, "join", _join_error(UNKNOWN_MEMBER_ID, member_id)))
        if m.sync_token is not None:
            out.append(Reply(m.sync_token, "sync", {"error_code": UNKNOWN_MEMBER_ID, "assignment": b""}))
        if g.leader == member_id:
            g.leader = next(iter(g.members), None)
        if not g.members:
            self._empty(g)
            return out
        if g.state != PREPARING:
            out += self._prepare(g, now_ms)
        return out + self._maybe_complete(g, now_ms)

    # --- time ------------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[Reply]:
        """Members whose session expired leave; rebalances whose timeout passed complete; ids
        handed out and never used expire after PENDING_MS; a group left empty is forgotten
        (its offsets stay: they are the broker's, not the coordinator's)."""
        out = []
        for g in list(self.groups.values()):
            for mid in [mid for mid, at in g.pending.items() if now_ms - at > PENDING_MS]:
                del g.pending[mid]
            for mid in [mid for mid, m in g.members.items()
                        if m.join_token is None and m.sync_token is None
                        and now_ms - m.last_heard_ms > m.session_timeout_ms]:
                if mid in g.members:
                    out += self._remove(g, mid, now_ms)
            if g.state == PREPARING:
                out += self._maybe_complete(g, now_ms, timed_out=now_ms >= g.rebalance_deadline_ms)
            if g.state == EMPTY and not g.members and not g.pending:
                del self.groups[g.group_id]
                self._forgotten[g.group_id] = g.generation
                while len(self._forgotten) > FORGOTTEN_MAX:  # (the oldest: long dead)
                    del self._forgotten[next(iter(self._forgotten))]
        return out

    # --- offsets -----------------------------------------------------------------------------------

    def may_commit(self, group_id: str, member_id: str, generation: int) -> int:
        """May this OffsetCommit be stored? A group that is not managed here (generation -1 and
        no member: a consumer that assigns its own partitions) may always commit."""
        g = self.groups.get(group_id)
        if generation < 0 and not member_id:
            return NONE if g is None or g.state == EMPTY else UNKNOWN_MEMBER_ID
        g, err = self._check(group_id, member_id, generation)
        if err:
            return err
        return REBALANCE_IN_PROGRESS if g.state == COMPLETING else NONE

    def describe(self, group_id: str) -> dict:
        g = self.groups.get(group_id)
        if g is None:
            return {"group_id": group_id, "group_state": "Dead", "protocol_type": "", "protocol_data": "",
                    "members": []}
        return {"group_id": group_id, "group_state": g.state, "protocol_type": g.protocol_type or "",
                "protocol_data": g.protocol or "",
                "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                             "client_id": m.client_id, "client_host": m.client_host,
                             "member_metadata": dict(m.protocols).get(g.protocol, b""),
                             "member_assignment": m.assignment} for m in g.members.values()]}


def _join_error(code: int, member_id: str) -> dict:
    return {"error_code": code, "generation_id": -1, "protocol_type": None, "protocol_name": None,
            "leader": "", "member_id": member_id, "members": []}
