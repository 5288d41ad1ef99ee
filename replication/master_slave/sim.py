"""A seeded, single-threaded simulation of a master-slave group, with checkers.

Each node runs the same pure node core as the broker (core.NodeCore: roles, admission,
promotion and fencing decisions, epochs, MasterCore) over an in-memory log whose entries are
one offset long, and carries out the effects the core returns in the order it returns them
(role and epoch files, cuts, links, leading). What the asyncio driver does with sockets and
files, the model does with a message queue, a page cache and its "disk" fields:

- the network delays messages; an HA session is a TCP stream: in order, and a dropped
  message (a partition) breaks it, which each side notices by silence (housekeeping);
- replication: SYNC (a master acknowledges a send once it and `in_sync_replicas - 1` slaves
  hold it fsynced) or, with `replication="async"`, ASYNC (once the master alone holds it
  fsynced), half the seeds with the master's self-fence (MasterConfig.async_fence_replicas);
- storage: every node fsyncs on its own schedule (flush: sync). A kill -9 keeps the page
  cache; a power loss keeps the fsynced prefix plus a random part of the rest (torn writes);
  an fsync that fails is fatal to the node, which then loses power (the store's rule);
  epoch and role files are written atomically and fsynced, as HAFiles does;
- nemeses: kill / power loss / restart, SIGSTOP pauses, partitions (ASYNC runs also cut the
  master off from everyone else: a failover its slaves must not call clean), and two scripted
  sequences: restart in isolation (pause the slaves, the master stores a tail alone, kill
  it, resume, promote, pause again, restart the old master cut off, heal) and a lagging
  failover (one slave paused while the master and the other slave go on, then both killed
  at once, leaving only the lagging slave to promote);
- an operator switches over now and then to a slave of the master, in two steps (the fence,
  then catching up, recording and leading: see sim_operator.py; with `overlap`, often, and
  another starting while one is on, each with its own fence id), killed half the time
  between recording its epoch and leading (everyone then follows a master that never opened
  its epoch); and it promotes a slave when no master has been seen for a while (never with force):
  the most caught-up one, as `tidelog drill --failover promote` does, or -- half the time, as
  a careless operator might -- any slave, which the promotion rules must refuse when unsafe;
  with `failover_crash` (ASYNC runs: 0.5) that promotion too is killed between recording its
  epoch and leading, while the old master may be down: back, the old master must not follow
  a node that never led.

Checkers (sim_checks.py), after every step: a node that starts leading an epoch in a clean
promotion holds every acknowledged send (not lost already by an unclean one); one master per
epoch; two logs that hold an entry of one epoch at one offset hold the same entry (epoch
histories are prefixes); every epoch list agrees with its log. At the end the faults heal,
and the group must settle on one master, bring every node level with it, acknowledge a new
send, and hold every acknowledged send -- except, in ASYNC, those an unclean promotion said
it may lose, never more than the bound it gave; and no node followed, by its own probe, a
node that never led the epoch it followed it for.

    python -m replication.master_slave.sim --seed 42 [--nodes 3] [--ticks 2000] [--verbose]
        [--overlap 0.5] [--replication async] [--failover_crash 0.5]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
from dataclasses import dataclass, field, replace

from replication.master_slave import core as C
from replication.master_slave import roles
from replication.master_slave.epochs import EpochList
from replication.master_slave.master import MasterConfig
from replication.master_slave.roles import MASTER, SLAVE, View
from replication.master_slave.state import RoleState
from replication.master_slave.sim_checks import Checks, SafetyViolation  # noqa: F401 (simrun's)
from replication.master_slave.sim_operator import OVERLAP_SWITCHOVER, Operator

HB = 10  # ticks between heartbeats (a tick is ~10 ms)
SILENT = 2 * HB
HOUSEKEEPING = 6 * HB
ACK_TIMEOUT = 50
PROBE = 10
HEAL_TICKS = 1500
STREAM_BATCH = 8
ISOLATE_MASTER = 0.004  # ASYNC runs: per tick, cut the master off from every other node
FAILOVER_CRASH = 0.5  # ASYNC runs: the chance a failover's promoter dies before it leads


@dataclass
class Faults:
    kill: float = 0.002  # per node per tick
    power: float = 0.002  # power loss: the page cache is gone
    restart: float = 0.03  # per down node per tick
    pause: float = 0.003
    resume: float = 0.03
    partition: float = 0.003
    heal: float = 0.01
    fsync_fail: float = 0.0005  # per fsync
    drop: float = 0.002  # per message (breaks its session)
    delay_max: int = 6
    send: float = 0.4  # a client send per tick
    switchover: float = 0.002  # per tick with a master: a planned promotion of one of its slaves
    overlap: float = 0.0  # the chance that a switchover starts while another is in progress
    scripted: str | None = None  # a sequence run once: "isolated-restart" or "lagging-failover"
    isolate_master: float = 0.0  # per tick: a partition that cuts the master off from the rest
    failover_crash: float = 0.0  # a failover's promoter is killed between recording and leading


@dataclass
class Session:
    sid: int
    master: str
    slave: str
    pos: int = 0  # the master's next offset to stream
    broken: bool = False


@dataclass
class Node:
    id: str
    up: bool = True
    paused: bool = False
    log: list = field(default_factory=list)  # (epoch, message id); entry i is offset i
    synced: int = 0  # the fsynced prefix
    # on disk (atomic, fsynced): what the core's SaveEpochs / SaveRole effects wrote
    epochs_disk: tuple = ()
    role_disk: str = SLAVE
    master_disk: str | None = None
    seen_disk: int = 0
    # in memory
    core: C.NodeCore | None = None
    sessions: dict = field(default_factory=dict)  # master side: slave -> Session
    link: Session | None = None  # slave side
    welcomed: bool = False
    master_end: int = 0
    last_heard: int = 0
    next_probe: int = 0
    next_hb: int = 0
    waiting: dict = field(default_factory=dict)  # message id -> send time (a master's)

    @property
    def leads(self) -> bool:
        return self.up and self.core.role == MASTER

    @property
    def mcore(self):
        return self.core.mcore

    def view(self) -> View:
        return self.core.view(len(self.log))


class Sim(Operator, Checks):
    def __init__(self, seed: int, n_nodes: int = 3, ticks: int = 2000, faults: Faults | None = None,
                 verbose: bool = False, in_sync_replicas: int | None = None, overlap: float = 0.0,
                 replication: str = "sync", failover_crash: float | None = None):
        self.seed = seed
        self.rng = random.Random(seed)
        self.ticks = ticks
        self.faults = faults or Faults(
            scripted=self.rng.choice((None, None, None, "isolated-restart", "lagging-failover")),
            delay_max=self.rng.choice((2, 6, 20)))
        if overlap:  # an operator (or two) switching over often, a switchover starting while another is on
            self.faults = replace(self.faults, overlap=overlap,
                                  switchover=max(self.faults.switchover, OVERLAP_SWITCHOVER))
        self.verbose = verbose
        self.ids = tuple("n%d" % i for i in range(n_nodes))
        self.required = in_sync_replicas or min(n_nodes, self.rng.choice((2, 2, 3)))
        window = self.rng.choice((4, 1 << 30))
        if replication not in ("sync", "async"):
            raise ValueError(f"replication must be sync or async, not {replication!r}")
        self.sync = replication == "sync"
        # (the draws of a SYNC run stay as they were: its seeds replay as before)
        self.self_fence = not self.sync and self.rng.random() < 0.5
        if not self.sync:
            self.faults = replace(self.faults, isolate_master=ISOLATE_MASTER, failover_crash=FAILOVER_CRASH)
        if failover_crash is not None:
            self.faults = replace(self.faults, failover_crash=failover_crash)
        self.mcfg = MasterConfig(sync=self.sync, in_sync_replicas=self.required, ack_timeout_ms=ACK_TIMEOUT,
                                 housekeeping_ms=HOUSEKEEPING, silent_ms=SILENT, fallbehind_max_bytes=window,
                                 async_fence_replicas=roles.restart_quorum(n_nodes) if self.self_fence else 0,
                                 append_bytes_max=1)  # (one entry a send, one offset an entry)
        self.nodes = {i: Node(i) for i in self.ids}
        self.now = 0
        self.net: list = []  # heap of (deliver tick, seq, dst, session id or None, kind, payload)
        self._seq = 0
        self._sid = 0
        self.blocked: set[frozenset] = set()
        self.acked: dict[str, int] = {}  # message id -> tick acknowledged
        self.sent_in: dict[str, int] = {}  # message id -> the epoch it was stored in
        self.owner: dict[int, str] = {}  # epoch -> the node that led it
        self.leads: list = []  # sim_checks.LeadRecord, in the order they began
        self.verdicts: dict = {}  # node -> what its failover, about to lead, may lose (roles.AsyncLoss)
        self.follows: list = []  # (tick, node, whom it followed by its own probe, for which epoch)
        self.lost = 0  # acknowledged sends the settled group lost (ASYNC, unclean promotions)
        self.last_master_seen = 0
        self.healing = False
        self.script: list = []
        self.switching: list[tuple] = []  # switchovers between their two steps
        self._fence_ids = 0
        self.next_mid = 0
        first = self.nodes[self.ids[0]]
        first.role_disk = MASTER  # as deploy configures it: n0 master, the others its slaves
        for n in self.nodes.values():
            n.master_disk = first.id
            self._start(n)

    # --- logging and checks ------------------------------------------------------------------

    def log(self, text: str) -> None:
        if self.verbose:
            print(f"[{self.now:5d}] {text}")

    # --- lifecycle ------------------------------------------------------------------------------

    def _start(self, n: Node) -> None:
        n.up, n.paused = True, False
        n.sessions, n.link, n.waiting = {}, None, {}
        n.welcomed = False
        # HAFiles + reconcile_epochs: epochs past the log's end go; an epoch in the log that
        # the file misses is added where its first entry is
        epochs = EpochList(n.epochs_disk)
        changed = epochs.truncate(len(n.log) + 1)
        for i, (e, _) in enumerate(n.log):
            if e > epochs.last_epoch:
                epochs.open(e, i)
                changed = True
        if changed:
            n.epochs_disk = tuple(tuple(x) for x in epochs.entries)
        n.core = C.NodeCore(n.id, self.ids, self.mcfg)
        n.next_probe = self.now
        self._apply(n, n.core.start(RoleState(n.role_disk, n.master_disk, n.seen_disk), epochs))
        self.log(f"{n.id} starts ({n.role_disk} on disk, log {len(n.log)}, synced {n.synced}, "
                 f"epochs {n.core.epochs.to_list()}, seen {n.core.epoch_seen})")

    def _down(self, n: Node, power: bool) -> None:
        n.up = False
        if power:
            torn = self.rng.randrange(len(n.log) - n.synced + 1)
            n.log = n.log[:n.synced + torn]
            n.synced = len(n.log)  # what survived is on disk now
        self._close_all(n)
        self.log(f"{n.id} {'loses power' if power else 'is killed'} (log {len(n.log)})")

    def _close_all(self, n: Node) -> None:
        for s in n.sessions.values():
            s.broken = True
        n.sessions = {}
        self._close_link(n)

    def _close_link(self, n: Node) -> None:
        if n.link is not None:
            n.link.broken = True
            n.link = None
        n.welcomed = False

    # --- the core's effects -------------------------------------------------------------------

    def _apply(self, n: Node, effects) -> None:
        """Carry out what the core decided, in its order (as driver.py does)."""
        for e in effects:
            t = type(e)
            if t is C.SaveRole:
                n.role_disk, n.master_disk, n.seen_disk = e.state.role, e.state.master, e.state.epoch_seen
            elif t is C.SaveEpochs:
                n.epochs_disk = e.epochs
            elif t is C.Truncate:
                self.log(f"{n.id} cuts its log at {e.offset} (had {len(n.log)})")
                del n.log[e.offset:]
                n.synced = min(n.synced, e.offset)
            elif t is C.Reset:
                self.log(f"{n.id} drops its log ({len(n.log)}) to start over at {e.start}")
                n.log, n.synced = [], 0
            elif t is C.StepDown:
                n.waiting = {}
                for s in n.sessions.values():
                    s.broken = True
                n.sessions = {}
            elif t is C.StopLink:
                self._close_link(n)
            elif t is C.StartLink:
                self.log(f"{n.id} follows {e.master}")  # the link opens at its next tick
            elif t is C.Lead:
                self._lead(n, e.epoch)
            elif t is C.RoleChanged:
                pass
            else:
                raise AssertionError(f"unknown effect {e!r}")

    # --- roles ------------------------------------------------------------------------------------

    def _views(self, n: Node) -> tuple[list[View], list[str]]:
        views, down = [], []
        for o in self.nodes.values():
            if o is n:
                continue
            if o.up and not o.paused and not self._cut(n.id, o.id):
                views.append(o.view())
            else:
                down.append(o.id)
        return views, down

    def _probe(self, n: Node) -> None:
        views, _ = self._views(n)
        core = n.core
        if core.restart_pending is not None:
            d = core.restart_step(views, len(n.log))
            if d.what == "follow":
                self._followed(n, d.arg, views)
            if d.what == "record":
                recorded = self._record(n, views, d.arg)
                d = core.restart_recorded(d.arg, recorded, len(n.log), n.synced, 0, self.now)
            self._apply(n, d.effects)
            return
        target, effects = core.on_views(views, len(n.log), self.now)
        if target is not None:
            self._followed(n, target, views)
        self._apply(n, effects)

    # --- the network ----------------------------------------------------------------------------

    def _cut(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.blocked

    def _send(self, dst: str, s: Session, kind: str, payload) -> None:
        self._seq += 1
        t = self.now + 1 + self.rng.randrange(self.faults.delay_max + 1)
        # a stream keeps its order: never before the session's previous message
        t = max(t, getattr(s, "_last", 0))
        s._last = t
        heapq.heappush(self.net, (t, self._seq, dst, s, kind, payload))

    def _deliver(self, faults: bool = True) -> None:
        held = []
        while self.net and self.net[0][0] <= self.now:
            item = heapq.heappop(self.net)
            _, _, dst, s, kind, payload = item
            n = self.nodes[dst]
            src = s.master if dst == s.slave else s.slave
            if s.broken or not n.up:
                continue
            if self._cut(src, dst) or (faults and self.rng.random() < self.faults.drop):
                s.broken = True  # the stream is gone; both sides find out by silence
                continue
            if n.paused:
                held.append(item)  # the kernel buffers it
                continue
            getattr(self, "_on_" + kind)(n, s, payload)
        for item in held:
            heapq.heappush(self.net, (self.now + 1, *item[1:]))

    # --- master side --------------------------------------------------------------------------

    def _on_hello(self, n: Node, s: Session, hello) -> None:
        epochs, end, seen = hello
        refusal = n.core.refuse_hello(s.slave, seen)
        if refusal is not None:
            if refusal.probe:
                n.next_probe = self.now  # someone heard of a newer epoch
            self._send(s.slave, s, "refused", refusal.master)
            s.broken = True
            return
        plan = n.core.plan_for(epochs, 0, end, 0, 0, len(n.log))
        old = n.sessions.get(s.slave)
        if old is not None:
            old.broken = True
        n.sessions[s.slave] = s
        s.pos = plan.start
        n.mcore.connect(s.slave, s.slave, self.now)
        epochs = n.core.epochs
        self._send(s.slave, s, "welcome", (plan, epochs.to_list(), epochs.last_epoch))

    def _on_report(self, n: Node, s: Session, offset: int) -> None:
        if n.mcore is not None and n.sessions.get(s.slave) is s:
            self._release(n, n.mcore.report(s.slave, offset, self.now))

    def _local(self, n: Node) -> None:
        self._release(n, n.mcore.local(len(n.log), n.synced))

    def _release(self, n: Node, mids) -> None:
        for m in mids:
            if n.waiting.pop(m, None) is not None:
                self.acked[m] = self.now

    def _client_send(self) -> None:
        masters = [n for n in self.nodes.values() if n.leads and not n.paused]
        if not masters:
            return
        n = self.rng.choice(masters)
        if n.core.fenced() or n.mcore.admit(self.now) is not None:
            return  # LEADER_TRANSFERRING or SLAVE_NOT_AVAILABLE: not stored
        self.next_mid += 1
        mid = f"m{self.next_mid}"
        n.log.append((n.core.epochs.last_epoch, mid))
        self.sent_in[mid] = n.core.epochs.last_epoch
        self._local(n)
        if n.mcore.wait(len(n.log), self.now, mid):
            n.waiting[mid] = self.now
        else:
            self.acked[mid] = self.now

    # --- slave side ---------------------------------------------------------------------------

    def _on_refused(self, n: Node, s: Session, master_hint) -> None:
        if n.link is s:
            n.link = None
            if master_hint and master_hint not in (n.id, n.core.master):
                self._apply(n, n.core.on_switch(master_hint))
            n.next_probe = self.now

    def _on_welcome(self, n: Node, s: Session, w) -> None:
        if n.link is not s:
            return
        plan, epochs, epoch = w
        try:
            effects = n.core.on_welcome(s.master, epoch, epochs, plan.start, plan.truncate_to, plan.reset)
        except C.Refused:
            n.link, s.broken = None, True
            return
        self._apply(n, effects)
        if len(n.log) != plan.start:
            n.link, s.broken = None, True
            return
        n.welcomed, n.last_heard = True, self.now
        self._send(s.master, s, "report", n.synced)

    def _on_stream(self, n: Node, s: Session, msg) -> None:
        if n.link is not s or not n.welcomed:
            return
        start, entries, master_end = msg
        n.last_heard, n.master_end = self.now, master_end
        if entries:
            if start != len(n.log):
                n.link, s.broken = None, True
                return
            effects = n.core.on_entries((e, start + i) for i, (e, _) in enumerate(entries))
            n.log.extend(entries)
            self._apply(n, effects)

    # --- a node's tick ------------------------------------------------------------------------

    def _tick_node(self, n: Node) -> None:
        f = self.faults
        core = n.core
        if self.rng.random() < 0.3:  # its flusher
            if len(n.log) > n.synced and not self.healing and self.rng.random() < f.fsync_fail:
                self.log(f"{n.id}: fsync fails: the store stops")
                self._down(n, power=True)
                return
            n.synced = len(n.log)
            if core.mcore is not None:
                self._local(n)
            elif n.link is not None and n.welcomed:
                self._send(n.link.master, n.link, "report", n.synced)
        if core.mcore is not None:
            for s in list(n.sessions.values()):
                if s.broken:
                    continue
                chunk = n.log[s.pos:s.pos + STREAM_BATCH]
                if chunk or self.now >= n.next_hb:
                    self._send(s.slave, s, "stream", (s.pos, chunk, len(n.log)))
                    s.pos += len(chunk)
            if self.now >= n.next_hb:
                n.next_hb = self.now + HB
            expired, silent, lapsed = core.tick(self.now)
            for mid, _, _ in expired:
                n.waiting.pop(mid, None)
            for node in silent:
                if core.mcore is not None:
                    core.mcore.disconnect(node)
                s = n.sessions.pop(node, None)
                if s is not None:
                    s.broken = True
            if lapsed:
                self.log(f"{n.id}: the switchover's fence lapsed: it stops taking writes")
                self._apply(n, core.fence_lapsed(self.now))
        elif n.link is not None:
            if n.welcomed and self.now >= n.next_hb:
                n.next_hb = self.now + HB
                self._send(n.link.master, n.link, "report", n.synced)
            if self.now - n.last_heard > HOUSEKEEPING:
                core.on_master_lost(n.link.master, core.lag(n.master_end, n.synced) if n.welcomed else None)
                self._close_link(n)
                n.next_probe = self.now
        elif core.master is not None and core.restart_pending is None:
            self._sid += 1
            n.link = Session(self._sid, core.master, n.id)
            n.welcomed, n.last_heard = False, self.now
            self._send(core.master, n.link, "hello",
                       (EpochList(core.epochs.to_list()), len(n.log), core.epoch_seen))
        if self.now >= n.next_probe and (core.role == MASTER or n.link is None
                                         or core.restart_pending is not None):
            n.next_probe = self.now + PROBE
            self._probe(n)

    # --- the loop -----------------------------------------------------------------------------

    def step(self, faults: bool) -> None:
        self.now += 1
        if faults:
            if self.faults.scripted:
                self._scripted()
            self._faults_step()
        self._deliver(faults)
        for n in self.nodes.values():
            if n.up and not n.paused:
                self._tick_node(n)
        for sw in [sw for sw in self.switching if sw[0] <= self.now]:
            self._switchover_end(sw)
        self._operator()
        if faults and self.rng.random() < self.faults.send:
            self._client_send()
        if self.now % 25 == 0:
            self._check_logs()

    def run(self) -> dict:
        for _ in range(self.ticks):
            self.step(faults=True)
        self.log("--- faults stop: heal")
        self.healing = True
        self.blocked = set()
        for n in self.nodes.values():
            if not n.up:
                self._start(n)
            n.paused = False
        probe_mid = None
        for _ in range(HEAL_TICKS):
            self.step(faults=False)
            masters = [n for n in self.nodes.values() if n.leads]
            if len(masters) != 1:
                continue
            m = masters[0]
            if probe_mid is None or (probe_mid not in self.acked and probe_mid not in m.waiting):
                if m.mcore.admit(self.now) is None:  # (again, if the last one timed out)
                    self._client_send()
                    probe_mid = f"m{self.next_mid}"
                continue
            level = all(n.log == m.log for n in self.nodes.values())
            if probe_mid in self.acked and level:
                break
        else:
            self._check_follows()  # (the likelier cause, when it fails)
            masters = [n.id for n in self.nodes.values() if n.leads]
            self.fail(f"no progress after healing: masters {masters}, logs "
                      + ", ".join(f"{n.id}:{len(n.log)}/{n.core.role}/{n.core.master}/{n.core.restart_pending}"
                                  for n in self.nodes.values())
                      + f", probe acked: {probe_mid in self.acked}")
        self._check_logs()
        self._check_follows()
        self._check_losses({mid for _, mid in m.log})
        return {"seed": self.seed, "acked": len(self.acked), "lost": self.lost, "epochs": len(self.owner),
                "end": len(m.log), "ticks": self.now}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--overlap", type=float, default=0.0,
                    help="switch over often, a switchover starting with this chance while another is on")
    ap.add_argument("--replication", choices=("sync", "async"), default="sync",
                    help="async: masters acknowledge alone (half the seeds fencing themselves), the master "
                         "is cut off now and then, and failovers' promoters die before leading")
    ap.add_argument("--failover_crash", type=float, default=None,
                    help="the chance a failover's promoter is killed between recording and leading "
                         f"(default: {FAILOVER_CRASH} with --replication async, else 0)")
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args(argv)
    try:
        print(Sim(a.seed, a.nodes, a.ticks, verbose=a.verbose, overlap=a.overlap, replication=a.replication,
                  failover_crash=a.failover_crash).run())
    except SafetyViolation as e:
        print(f"SAFETY VIOLATION: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
