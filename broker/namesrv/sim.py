"""A seeded, single-threaded simulation of name servers and the broker groups that register
with them (docs/design/name-server.md §10), with checkers.

Two or three name servers run the real route table (core.RouteTable) behind the real rule for
who may register (core.refusal, fed the sender's certificate as the driver reads it); every
group member runs the real RegistrarCore (broker/registrar_core.py: connect, register at once,
on every change of its standing, every register_interval_ms, back off) over simulated
connections; the groups' histories are scripted (sim_groups.py): elections, failovers,
master-slave promotions (a pair's by its one survivor), crashes, pauses, members cut off from
their group (a partitioned old leader that keeps registering), raft terms that run ahead with
pre-vote off, and forgers with real certificates (a node of another group; a node taken out of
this group). The network delays and loses messages (a lost request or answer times out, and the
registrar drops the connection), connections close, name servers restart empty, nodes expire.
Time is a simulated clock in ms; everything happens in one seeded order.

Checkers, after every change to a name server's table:
- membership: a group's entry holds only nodes whose certificate names that group;
- no forged leader: a group's leader is never a forger while one of its honest members is
  registered there, and no forged topic is routed to anyone but a lone forger;
- not stale now: the leader's rank is not below what more than half of the group's honest
  registered nodes report;
- not stale ever: once more than half of a group's honest members were registered at once
  following one leader at its rank, no lower rank leads that group at that name server while
  its entry lives;
and at the end, after the last fault: every name server routes every group to its real leader
within register_interval_ms + RECONNECT_MAX_MS + SLACK_MS; then every replicated group fails
over once more, in a quiet network, and is rerouted within REROUTE_MS -- far less than
register_interval_ms: its followers re-register as soon as they follow the new leader.

    python -m broker.namesrv.sim --seed 42 [--nodes 3] [--verbose]     (--nodes: name servers)
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from dataclasses import dataclass, field

from broker.namesrv import core as C
from broker.namesrv.sim_groups import FORGER_STYLES, LEARN_MAX_MS, Forger, GroupSim, Member
from broker.protocol.codes import BadRequest
from broker.registrar import STANDING_POLL_MS
from broker.registrar_core import RECONNECT_MAX_MS, RegistrarCore

__all__ = ["SafetyViolation", "Sim", "main"]

REGISTER_INTERVAL_MS = 3000
REGISTER_TIMEOUT_MS = 4000  # above two slow messages: a slow answer is not a lost one
EXPIRE_MS = 8000
SCAN_MS = 500
FAULTS_MS = 20_000
SLACK_MS = 1500  # delays, a voter learning its leader, the standing poll
FORGE_EVERY_MS = 700
DELAY_MS = (1, 60)
SLOW_MS = (200, 1500)  # now and then a message waits this long (in order: TCP)
SLOW_SHARE = 0.05
FAULT_EVERY_MS = 400  # mean time between scripted faults
# a failover with no fault: a voter learns its leader, its registrar looks, one registration in
# flight is answered, the next arrives -- with room
REROUTE_MS = LEARN_MAX_MS + STANDING_POLL_MS + 4 * DELAY_MS[1] + 150


class SafetyViolation(AssertionError):
    pass


@dataclass
class NameServer:
    id: str
    core: C.RouteTable
    up: bool = True
    life: int = 0  # bumped at every restart: connections to an earlier life are dead
    links: dict = field(default_factory=dict)  # its open connections, in the order they opened (a set's order is not seeded)


@dataclass(eq=False)  # by identity: a key of NameServer.links
class Link:
    conn_id: int
    owner: object  # Member or Forger
    ns: NameServer
    life: int
    cert_member: str
    cert_group: str
    open: bool = True
    last_ms: int = 0  # messages on one connection arrive in order


class Sim:
    def __init__(self, seed: int, nodes: int = 2, verbose: bool = False, faults_ms: int = FAULTS_MS):
        self.seed, self.verbose = seed, verbose
        self.rng = rng = random.Random(seed)
        self.now = 0
        self.faults_ms = faults_ms
        self.loss = rng.choice([0.0, 0.02, 0.08])
        self.nss = [NameServer(f"ns{i}", self._table(f"ns{i}")) for i in range(nodes)]
        kinds = ["raft3", "raft5", "ms2", "ms3", "standalone"]
        count = rng.choice([2, 3])
        self.groups: dict[str, GroupSim] = {}
        pre_vote = rng.random() < 0.7
        for i in range(count):
            name = f"g{i}"
            self.groups[name] = GroupSim(name, rng.choice(kinds), i, rng, pre_vote)
        self.forgers: list[Forger] = []
        names = list(self.groups)
        for _ in range(rng.choice([0, 1, 1, 2])):
            target = rng.choice(names)
            g = self.groups[target]
            if rng.random() < 0.5 and len(names) > 1:  # a node of another group
                home = rng.choice([n for n in names if n != target])
                self.forgers.append(Forger(f"{home}-x{len(self.forgers)}", home, target, "leader-huge"))
            elif g.mode != "standalone" and g.forger is None:  # taken out of this group, certificate kept
                f = Forger(f"{target}-old{len(self.forgers)}", target, target, rng.choice(FORGER_STYLES))
                g.forger = f
                self.forgers.append(f)
        self.cert_group = {m.id: g.name for g in self.groups.values() for m in g.members}
        self.cert_group.update({f.id: f.cert_group for f in self.forgers})
        self.honest = {g.name: {m.id for m in g.members} for g in self.groups.values()}
        self.vouched: dict[tuple, tuple] = {}  # (ns, life, group) -> the highest rank a majority followed
        self._events: list = []
        self._seq = 0
        self._conn = 0
        self.healing = False
        self.log(f"seed {seed}: {nodes} name servers, groups "
                 + ", ".join(f"{g.name}={g.kind}" for g in self.groups.values())
                 + f", pre-vote {'on' if pre_vote else 'off'}, loss {self.loss}, forgers "
                 + (", ".join(f"{f.id}->{f.target}:{f.style}" for f in self.forgers) or "none"))

    def _table(self, ns_id: str) -> C.RouteTable:
        return C.RouteTable(ns_id, EXPIRE_MS)

    def log(self, msg: str) -> None:
        if self.verbose:
            print(f"{self.now:>6} {msg}")

    def fail(self, msg: str) -> None:
        raise SafetyViolation(f"seed {self.seed} at {self.now} ms: {msg} (replay: .venv/bin/python -m "
                              f"broker.namesrv.sim --seed {self.seed} --nodes {len(self.nss)} --verbose)")

    # --- the event queue ---------------------------------------------------------------------------

    def at(self, when: int, fn, *args) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, fn, args))

    def _delay(self) -> int:
        lo, hi = SLOW_MS if not self.healing and self.rng.random() < SLOW_SHARE else DELAY_MS
        return self.rng.randint(lo, hi)

    def _lost(self) -> bool:
        return not self.healing and self.rng.random() < self.loss

    def _send(self, link: Link, fn, *args) -> None:
        """Deliver on `link` later, in order; a lost message breaks nothing by itself (the
        sender's timeout does)."""
        if self._lost():
            return
        link.last_ms = max(link.last_ms, self.now) + self._delay()
        self.at(link.last_ms, fn, link, *args)

    # --- members: the registrar core and its connections ---------------------------------------------

    def drive(self, m: Member) -> None:
        if not m.running or m.core is None:
            return
        g = self.groups[m.group]
        for ns_id, deadline in list(m.pending.items()):
            if deadline <= self.now:  # no answer in time: the driver drops the connection
                del m.pending[ns_id]
                self._close(m.links.pop(ns_id, None))
                m.core.register_failed(ns_id, self.now)
        if m.role != m.signalled_role:  # the broker's on_role_changed -> Registrar.changed
            m.signalled_role = m.role
            m.core.changed(self.now)
        m.core.observe((m.role, m.rank, m.leader_id), self.now)  # the registrar's standing poll
        for act in m.core.due(self.now):
            ns = self._ns(act.address)
            if act.kind == "connect":
                link = Link(self._new_conn(), m, ns, ns.life, m.id, m.group)
                if ns.up:
                    ns.links[link] = None
                self.at(self.now + self._delay(), self._connected, link)
            else:
                link = m.links.get(act.address)
                if link is None or not link.open:
                    m.core.register_failed(act.address, self.now)
                    continue
                m.pending[act.address] = self.now + REGISTER_TIMEOUT_MS
                self._send(link, self._arrive, g.registration(m))
        nxt = m.core.next_due_ms()
        soon = min([d for d in m.pending.values()] + ([nxt] if nxt is not None else []), default=None)
        if soon is not None and (m.wake_at <= self.now or soon < m.wake_at):
            m.wake_at = max(soon, self.now + 1)
            self.at(m.wake_at, self._wake, m)

    def _noticed(self, m: Member) -> None:
        """`m`'s standing changed: its registrar sees it at its next look (a role change at
        once in the broker; the rest within STANDING_POLL_MS: modelled as all within it)."""
        self.at(self.now + self.rng.randint(1, STANDING_POLL_MS), self.drive, m)

    def _wake(self, m: Member) -> None:
        m.wake_at = -1
        self.drive(m)

    def _ns(self, ns_id: str) -> NameServer:
        return next(n for n in self.nss if n.id == ns_id)

    def _new_conn(self) -> int:
        self._conn += 1
        return self._conn

    def _connected(self, link: Link) -> None:
        m, ok = link.owner, link.ns.up and link.ns.life == link.life and link.open
        if isinstance(m, Forger):
            if ok:
                m.links[link.ns.id] = link
            return
        if m.up and m.paused:  # a paused process finishes its connect when it runs again
            self.at(self.now + 50, self._connected, link)
            return
        if not m.running or m.core is None:
            self._close(link)
            return
        if ok:
            m.links[link.ns.id] = link
            m.core.connected(link.ns.id, self.now)
        else:
            m.core.connect_failed(link.ns.id, self.now)
        self.drive(m)

    def _close(self, link: Link | None, notify: bool = False) -> None:
        if link is None or not link.open:
            return
        link.open = False
        ns = link.ns
        ns.links.pop(link, None)
        if ns.up and ns.life == link.life:
            for d in ns.core.connection_closed(link.conn_id):
                self.log(f"{ns.id}: dropped {d.broker_name}/{d.node_id}: {d.why}")
            self.check(ns)
        m = link.owner
        if notify and isinstance(m, Member) and m.running and m.core is not None and m.links.get(ns.id) is link:
            del m.links[ns.id]
            m.core.disconnected(ns.id, self.now)
            self.drive(m)

    def _arrive(self, link: Link, req) -> None:
        """A registration reaches its name server: the driver's checks, then the core."""
        ns = link.ns
        if not (link.open and ns.up and ns.life == link.life):
            return
        why = C.refusal(req.broker_name, req.node_id, link.cert_member, link.cert_group)
        ok = why is None
        if ok:
            try:
                ns.core.register(req, link.conn_id, self.now)
            except BadRequest:
                ok = False
            self.check(ns)
        if isinstance(link.owner, Member):
            self._send(link, self._answer, ok)

    def _answer(self, link: Link, ok: bool) -> None:
        m = link.owner
        if not (link.open and m.running and m.core is not None and m.links.get(link.ns.id) is link):
            return
        if m.pending.pop(link.ns.id, None) is None:
            return
        if ok:
            m.core.registered(link.ns.id, self.now)
        else:  # refused: the driver closes the connection and starts over
            del m.links[link.ns.id]
            self._close(link)
            m.core.register_failed(link.ns.id, self.now)
        self.drive(m)

    def _forge(self, f: Forger) -> None:
        req = self.groups[f.cert_group].forged(f, self.groups[f.target])
        for ns in self.nss:
            link = f.links.get(ns.id)
            if link is None or not link.open:
                f.links.pop(ns.id, None)
                if ns.up:
                    link = Link(self._new_conn(), f, ns, ns.life, f.id, f.cert_group)
                    ns.links[link] = None
                    self.at(self.now + self._delay(), self._connected, link)
                continue
            self._send(link, self._arrive, req)
        self.at(self.now + FORGE_EVERY_MS, self._forge, f)

    # --- faults ------------------------------------------------------------------------------------

    def _learn_later(self, m: Member, when: int) -> None:
        self.at(when, self._learn, m)

    def _learn(self, m: Member) -> None:
        if self.groups[m.group].learn(m):
            self.log(f"{m.id} follows {m.leader_id} at {m.rank}")
            self._noticed(m)

    def _start(self, m: Member) -> None:
        m.core = RegistrarCore([n.id for n in self.nss], REGISTER_INTERVAL_MS, self.now)
        m.pending.clear()
        self.drive(m)

    def _crash(self, m: Member) -> None:
        m.up, m.core = False, None
        for link in list(m.links.values()):
            self._close(link)
        m.links.clear()
        m.pending.clear()
        g = self.groups[m.group]
        if g.leader == m.id:
            g.leader = None

    def _fault(self) -> None:
        if self.now >= self.faults_ms:
            return
        rng = self.rng
        g = rng.choice(list(self.groups.values()))
        m = rng.choice(g.members)
        kind = rng.choice(["elect", "elect", "crash", "restart", "pause", "resume", "cut", "heal",
                           "run-ahead", "step-down", "ns-restart", "conn-drop"] + ["rebuild"] * (rng.random() < 0.1))
        changed: list[Member] = []
        if g.rebuilding:
            kind = "none"
        self.log(f"fault {kind} {g.name}/{m.id}")
        if kind == "rebuild" and g.forger is None:
            # every node stops and comes back with empty data: terms and epochs start over. (A
            # node taken out of the group that keeps registering keeps the group's entry, and
            # its fence, alive: see docs/design/name-server.md §4)
            g.rebuilding = True
            for x in g.members:
                if x.up:
                    self._crash(x)
            self.at(self.now + rng.randint(100, 3000), self._rebuilt, g)
        elif kind == "elect":
            changed = g.elect(self.now, self._learn_later)
        elif kind == "crash" and m.up:
            self._crash(m)
        elif kind == "restart" and not m.up:
            g.restart(m)
            self._start(m)
            changed = g.rejoin(m, self.now, self._learn_later)
        elif kind == "pause" and m.running:
            m.paused = True
            if g.leader == m.id:
                g.leader = None
        elif kind == "resume" and m.up and m.paused:
            m.paused = False
            changed = [m] + g.rejoin(m, self.now, self._learn_later)
        elif kind == "cut":
            m.cut = True
        elif kind == "heal" and m.cut:
            m.cut = False
            changed = g.rejoin(m, self.now, self._learn_later)
        elif kind == "run-ahead" and g.run_ahead(m):
            changed = [m]
        elif kind == "step-down" and g.step_down(m):
            changed = [m]
        elif kind == "ns-restart":
            self._ns_down(rng.choice(self.nss), rng.randint(100, 4000))
        elif kind == "conn-drop":
            links = [link for link in m.links.values() if link.open]
            if links:
                self._close(rng.choice(links), notify=True)
        for c in changed:
            self._noticed(c)
        self.at(self.now + int(rng.expovariate(1 / FAULT_EVERY_MS)) + 1, self._fault)

    def _rebuilt(self, g: GroupSim) -> None:
        if not g.rebuilding:
            return  # (the heal did it already)
        self.log(f"{g.name} rebuilt from scratch")
        g.rebuilding = False
        for m in g.members:
            m.rank, m.paused, m.cut = 0, False, False
            g.restart(m)
            self._start(m)
        for m in g.elect(self.now, self._learn_later) or g.rejoin(g.members[0], self.now, self._learn_later):
            self._noticed(m)

    def _ns_down(self, ns: NameServer, for_ms: int) -> None:
        if not ns.up:
            return
        self.log(f"{ns.id} stops for {for_ms} ms")
        ns.up = False
        for link in list(ns.links):
            self._close(link, notify=True)
        self.at(self.now + for_ms, self._ns_up, ns)

    def _ns_up(self, ns: NameServer) -> None:
        if ns.up:
            return
        ns.up, ns.life, ns.core = True, ns.life + 1, self._table(ns.id)  # empty, as a restart is
        self.log(f"{ns.id} starts empty")

    def _scan(self, ns: NameServer) -> None:
        if ns.up:
            for d in ns.core.expire(self.now):
                self.log(f"{ns.id}: expired {d.broker_name}/{d.node_id}")
            self.check(ns)
        self.at(self.now + SCAN_MS, self._scan, ns)

    # --- checkers ---------------------------------------------------------------------------------

    def check(self, ns: NameServer) -> None:
        for key in [k for k in self.vouched if k[0] == ns.id and (k[1] != ns.life or k[2] not in ns.core.groups)]:
            del self.vouched[key]  # that entry is gone: its history with it (as its fence)
        for name, entry in ns.core.groups.items():
            for nid in entry.nodes:
                if self.cert_group.get(nid) != name:
                    self.fail(f"{ns.id}: group {name} holds node {nid}, whose certificate names "
                              f"{self.cert_group.get(nid)!r}")
            honest = [n for n in entry.nodes.values() if n.node_id in self.honest[name]]
            key = (ns.id, ns.life, name)
            for x in honest:
                if x.claims:
                    v = 1 + sum(1 for h in honest if not h.claims and h.rank == x.rank and h.leader_id == x.node_id)
                    if 2 * v > len(self.groups[name].members):
                        self.vouched[key] = max(self.vouched.get(key, C.NO_RANK), x.rank)
            lid = entry.leader_id
            if lid is None:
                continue
            x = entry.nodes[lid]
            if lid not in self.honest[name] and honest:
                self.fail(f"{ns.id}: group {name} is routed to forger {lid} while honest "
                          f"{[h.node_id for h in honest]} are registered")
            ahead = [h.node_id for h in honest if h.rank > x.rank]
            if 2 * len(ahead) > len(honest):
                self.fail(f"{ns.id}: group {name}'s leader {lid} at {x.rank} is behind {ahead}, "
                          f"more than half of the honest nodes registered")
            floor = self.vouched.get(key, C.NO_RANK)
            if x.rank < floor:
                self.fail(f"{ns.id}: group {name}'s leader {lid} at {x.rank}, but a majority of its "
                          f"members followed a leader at {floor} here")
        for topic, per_group in ns.core.topics.items():
            if topic.startswith("evil-"):
                for name in per_group:
                    lid = ns.core.groups[name].leader_id
                    if lid is not None and lid in self.honest[name]:
                        self.fail(f"{ns.id}: forged topic {topic} routed to {name}'s leader {lid}")

    def _converged(self, when: str, within_ms: int) -> None:
        for ns in self.nss:
            for g in self.groups.values():
                entry = ns.core.groups.get(g.name)
                got = entry.leader_id if entry else None
                if got != g.leader:
                    nodes = {n.node_id: (n.role, n.rank, n.leader_id) for n in entry.nodes.values()} if entry else {}
                    self.fail(f"{ns.id}: group {g.name} routed to {got}, not its leader {g.leader}, "
                              f"{within_ms} ms {when}; registered {nodes}")
                route = ns.core.route(f"t-{g.name}")
                want = g.by_id[g.leader].address
                if route is None or [r.leader for r in route.groups] != [want]:
                    self.fail(f"{ns.id}: route of t-{g.name} is {route}, not to {want}")

    def _until(self, end: int) -> int:
        events = 0
        while self._events and self._events[0][0] <= end:
            self.now, _, fn, args = heapq.heappop(self._events)
            fn(*args)
            events += 1
        self.now = end
        return events

    # --- running ------------------------------------------------------------------------------------

    def _heal(self) -> None:
        self.healing = True
        self.log("--- faults stop: heal")
        for ns in self.nss:
            if not ns.up:
                self._ns_up(ns)
        for g in self.groups.values():
            self._rebuilt(g)
            for m in g.members:
                if not m.up:
                    g.restart(m)
                    self._start(m)
                m.paused = False
            for m in g.heal_all(self.now, self._learn_later) + g.members:
                self._noticed(m)

    def run(self) -> dict:
        for g in self.groups.values():
            for m in g.members:
                self._start(m)
        for ns in self.nss:
            self.at(SCAN_MS, self._scan, ns)
        for f in self.forgers:
            self.at(self.rng.randint(0, FORGE_EVERY_MS), self._forge, f)
        self.at(self.rng.randint(0, FAULT_EVERY_MS), self._fault)
        self.at(self.faults_ms, self._heal)
        events = self._until(self.faults_ms + REGISTER_INTERVAL_MS + RECONNECT_MAX_MS + SLACK_MS)
        self._converged("after the last fault", REGISTER_INTERVAL_MS + RECONNECT_MAX_MS + SLACK_MS)
        # a failover in a quiet cluster: the new leader's followers re-register as soon as they
        # follow it (RegistrarCore.observe), not a register_interval_ms later
        self.log("--- a failover in every replicated group")
        for g in self.groups.values():
            for m in g.elect(self.now, self._learn_later):
                self._noticed(m)
        events += self._until(self.now + REROUTE_MS)
        self._converged("after a failover with no fault", REROUTE_MS)
        return {"seed": self.seed, "namesrvs": len(self.nss), "groups": {g.name: g.kind for g in self.groups.values()},
                "forgers": len(self.forgers), "events": events}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=2, help="name servers (2 or 3)")
    ap.add_argument("--verbose", "-v", action="store_true")
    a = ap.parse_args(argv)
    try:
        print(Sim(a.seed, a.nodes, verbose=a.verbose).run())
    except SafetyViolation as e:
        print(f"SAFETY VIOLATION: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
