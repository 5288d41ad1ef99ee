"""The broker groups of the name-server simulation (broker/namesrv/sim.py): what each member
would tell a name server, driven by a scripted history instead of real replication cores.

A group's history is the rules its replication follows, reduced to what a registration says
(role, term or epoch, whom the node follows):
- raft: an election needs a majority of the members up, running and not cut off (the
  "component"); its voters take the new term at once and learn the leader a moment later (the
  first append); a leader cut off keeps claiming its old term (no check-quorum) until it steps
  down or rejoins; with pre-vote off a cut-off follower's term runs ahead, and its return
  forces an election above it (replication/raft/node.py: pre-vote is on by default);
- master-slave: a promotion needs `promotion_quorum` members of the component (the one
  surviving node of a pair, replication/master_slave/roles.py), which record the new epoch and
  whom they follow; the old master, fenced if it is reachable, else left claiming its epoch (a
  paused or cut-off master of a pair: the forced promotion's split brain);
- standalone: one node, always its own leader.
Crashes close the node's connections; pauses (SIGSTOP) keep them open, so name servers keep
the node until it expires; a restarted node leads nothing until it hears from its group.

Forgers hold real certificates: a node of another group (`cross`: its certificate names that
group), or a node taken out of this group whose certificate still names it (`in`), sending
made-up claims: a leader with a huge term, a leader of the group's current term, a follower
with a huge term, a follower vouching for a stale leader, a follower of rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from broker.protocol import namesrv as ns

HUGE = (1 << 63) - 1
LEARN_MAX_MS = 150  # a voter hears its new leader (the first append) within this
MODES = {"raft3": ("raft", 3), "raft5": ("raft", 5), "ms2": ("master-slave", 2), "ms3": ("master-slave", 3),
         "standalone": ("standalone", 1)}
FORGER_STYLES = ("leader-huge", "leader-current", "leader-stale", "follower-huge", "vouch-stale", "low")


def promotion_quorum(members: int) -> int:
    return 1 if members <= 2 else members // 2 + 1  # as replication/master_slave/roles.py


@dataclass
class Member:
    id: str
    group: str
    address: str
    rank: int = 0  # raft: the term; master-slave: the epoch it leads or has recorded a master of
    role: str = "follower"
    leader_id: str = ""
    up: bool = True
    paused: bool = False
    cut: bool = False  # cut off from the rest of its group (not from the name servers)
    core: object = None  # its RegistrarCore while it runs
    links: dict = field(default_factory=dict)  # name-server id -> Link
    pending: dict = field(default_factory=dict)  # name-server id -> registration deadline (ms)
    wake_at: int = -1
    signalled_role: str = ""  # the role its broker last told its registrar of

    @property
    def running(self) -> bool:
        return self.up and not self.paused


@dataclass
class Forger:
    id: str
    cert_group: str  # what its certificate names
    target: str  # the group it registers in
    style: str
    links: dict = field(default_factory=dict)


class GroupSim:
    """One group's members and its scripted history; `leader` is who really leads now."""

    def __init__(self, name: str, kind: str, index: int, rng, pre_vote: bool):
        self.name, self.kind, self.rng, self.pre_vote = name, kind, rng, pre_vote
        self.mode, size = MODES[kind]
        self.members = [Member(f"{name}-n{i}", name, f"10.0.{index}.{i + 1}:10911") for i in range(size)]
        self.by_id = {m.id: m for m in self.members}
        self.leader: str | None = None
        self.forger: Forger | None = None
        self.rebuilding = False  # every node down, to come back with empty data
        first = self.members[0]
        first.role, first.leader_id = self.lead_role, first.id
        if self.mode != "standalone":
            first.rank = 1
            for m in self.members[1:]:
                m.rank, m.role, m.leader_id = 1, self.follow_role, first.id
        self.leader = first.id

    @property
    def lead_role(self) -> str:
        return {"raft": "leader", "master-slave": "master"}.get(self.mode, "standalone")

    @property
    def follow_role(self) -> str:
        return "slave" if self.mode == "master-slave" else "follower"

    def registration(self, m: Member) -> ns.RegisterBroker:
        term, epoch = (m.rank, 0) if self.mode == "raft" else (0, m.rank)
        leading = m.role in ns.LEADING_ROLES
        topics = [ns.TopicQueues(f"t-{self.name}", 4, 4)] if leading else []
        return ns.RegisterBroker("sim", self.name, m.id, m.address, self.mode, m.role, term, epoch, 0,
                                 topics, m.leader_id)

    def component(self) -> list[Member]:
        return [m for m in self.members if m.running and not m.cut]

    def current(self) -> Member | None:
        """The real leader, if it still leads the component."""
        m = self.by_id.get(self.leader) if self.leader else None
        return m if m is not None and m in self.component() and m.role == self.lead_role else None

    # --- the history (each returns the members whose standing changed, and later learnings) ----

    def elect(self, now_ms: int, learn) -> list[Member]:
        """A raft election or a master-slave promotion in the component, if it may have one."""
        comp = self.component()
        if self.mode == "standalone" or not comp:
            return []
        need = len(self.members) // 2 + 1 if self.mode == "raft" else promotion_quorum(len(self.members))
        if len(comp) < need:
            return []
        c = self.rng.choice(comp)
        new = max(m.rank for m in comp) + 1
        changed = []
        for m in comp:
            m.role, m.leader_id = self.follow_role, ""
            if self.mode == "raft" or m is c:
                m.rank = new
            changed.append(m)
        c.role, c.leader_id = self.lead_role, c.id
        self.leader = c.id
        # master-slave: the promotion's quorum records the epoch (and its master) first
        others = [m for m in comp if m is not c]
        self.rng.shuffle(others)
        now = others[:need - 1] if self.mode == "master-slave" else []
        for m in now:
            m.rank, m.leader_id = new, c.id
        for m in others[len(now):]:
            learn(m, now_ms + self.rng.randint(0, LEARN_MAX_MS))
        return changed

    def learn(self, m: Member) -> bool:
        """`m` hears from the component's leader: it follows it at its rank."""
        cur = self.current()
        if cur is None or m is cur or not m.running or m.cut or m.rank > cur.rank:
            return False
        if (m.rank, m.role, m.leader_id) == (cur.rank, self.follow_role, cur.id):
            return False
        m.rank, m.role, m.leader_id = cur.rank, self.follow_role, cur.id
        return True

    def rejoin(self, m: Member, now_ms: int, learn) -> list[Member]:
        """`m` is back in the component (healed, resumed, restarted)."""
        cur = self.current()
        if self.mode == "standalone":
            m.role, m.leader_id = self.lead_role, m.id
            self.leader = m.id
            return [m]
        if cur is not None and cur is not m and m.rank > cur.rank and self.mode == "raft":
            return self.elect(now_ms, learn)  # a term that ran ahead disrupts the group (no pre-vote)
        if cur is not None and cur is not m:
            learn(m, now_ms + self.rng.randint(0, LEARN_MAX_MS))
        return []

    def restart(self, m: Member) -> None:
        """A restarted node leads nothing until it hears from its group (raft: a follower; a
        master-slave master restarting waits as a slave without a master)."""
        m.up, m.paused = True, False
        if self.mode != "standalone":
            m.role, m.leader_id = self.follow_role, ""
        if self.leader == m.id and self.mode != "standalone":
            self.leader = None

    def run_ahead(self, m: Member) -> bool:
        """Pre-vote off: a cut-off follower campaigns again and again."""
        if self.mode != "raft" or self.pre_vote or not m.cut or m.role == self.lead_role:
            return False
        m.rank, m.leader_id = m.rank + 1, ""
        return True

    def step_down(self, m: Member) -> bool:
        """A cut-off leader that noticed (check-quorum): it leads nothing now."""
        if self.mode == "standalone" or not m.cut or m.role != self.lead_role:
            return False
        m.role, m.leader_id = self.follow_role, ""
        return True

    def heal_all(self, now_ms: int, learn) -> list[Member]:
        """The faults are over: the group settles on one leader everyone follows."""
        for m in self.members:
            m.cut = False
        cur = self.current()
        if self.mode == "standalone":
            return self.rejoin(self.members[0], now_ms, learn)
        if cur is None or any(m.rank > cur.rank for m in self.members):
            return self.elect(now_ms, learn)
        for m in self.members:
            if m is not cur:
                learn(m, now_ms + self.rng.randint(0, LEARN_MAX_MS))
        return []

    # --- forgers -----------------------------------------------------------------------------

    def forged(self, f: Forger, target: "GroupSim") -> ns.RegisterBroker:
        """What forger `f` sends to name servers about `target` now."""
        top = max(m.rank for m in target.members)
        stale = [m for m in target.members if m.role == target.lead_role and m.id != target.leader]
        claim, rank, leader = {
            "leader-huge": (True, HUGE, f.id), "leader-current": (True, top, f.id),
            "leader-stale": (True, max(0, top - 1), f.id), "follower-huge": (False, HUGE, ""),
            "vouch-stale": (False, stale[0].rank if stale else top, stale[0].id if stale else target.leader or ""),
            "low": (False, 0, ""),
        }[f.style]
        role = target.lead_role if claim else target.follow_role
        term, epoch = (rank, 0) if target.mode == "raft" else (0, rank)
        topics = [ns.TopicQueues(f"evil-{f.id}", 8, 8), ns.TopicQueues(f"t-{target.name}", 64, 64)] if claim else []
        address = f"10.9.{len(f.id) % 250}.9:10911"
        return ns.RegisterBroker("sim", target.name, f.id, address, target.mode, role, term, epoch, 0,
                                 topics, leader)
