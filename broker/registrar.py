"""A broker node registering with its name servers: one persistent connection per name server
(its close is what tells the name server the node is gone, rule N4), all in parallel
(BrokerOuterAPI.registerBrokerAll). What to send when is registrar_core.py's; this module
does the I/O. Failures are logged rate-limited and retried; they never touch the data path.

A leading node lists every topic it holds and, when its config has auto_create_topic_enable, the
auto-creation template (broker/namesrv/__init__.py TEMPLATE_TOPIC, RocketMQ's TBW102): producers
route topics nobody holds yet to the groups that list it. The broker calls `changed()` on every
topic change, an auto-creation on first send included, so the new topic is routed one round trip
after it was made.

A registration also says the node's standing: its role, term (raft) or epoch (master-slave) and
whom it follows. A name server routes a leader only once most of the group's registered nodes
say they follow it at its term (broker/namesrv/core.py N3), so the standing is looked at every
STANDING_POLL_MS and a change is registered at once (RegistrarCore.observe): a follower that
voted in a new term, or learnt its new leader, says so within that, not a register_interval_ms
later. Role changes are also signalled by the broker (`changed`).

On a secure cluster the connection presents this node's member certificate
(tidelog-member:<node_id>, tidelog-group:<broker_name>), which is what a name server takes
registrations from; no user login.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Callable, NamedTuple

from broker.client.connection import ClientConnection, parse_bootstrap
from broker.client.errors import TidelogError
from broker.namesrv import TEMPLATE_TOPIC
from broker.protocol import jsonbody
from broker.protocol import namesrv as ns
from broker.protocol.codes import Code, Req, name
from broker.protocol.topics import PERM_RW
from broker.ratelog import RateLimitedLog
from broker.registrar_core import RegistrarCore
from broker.tasks import cancel_and_wait

log = logging.getLogger(__name__)

FAIL_LOG_S = 30.0  # one line per name server and kind of failure this often
UNREGISTER_TIMEOUT_S = 1.0  # a clean stop does not wait longer for name servers
# how often the node's standing (role, term/epoch, leader) is compared with the last one: a new
# leader is routed once its followers re-register, so this is part of a failover's reroute time
STANDING_POLL_MS = 100


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _why(e: Exception):
    """An I/O failure says what it is; anything else (a bug) also names its type."""
    return e if isinstance(e, (TidelogError, OSError)) else f"{type(e).__name__}: {e}"


class _Link(ClientConnection):
    """A client connection that says when it closes (a name server stopped or restarted)."""
    on_lost: Callable[[], None] | None = None

    def connection_lost(self, exc) -> None:
        super().connection_lost(exc)
        if self.on_lost is not None:
            self.on_lost()


class Standing(NamedTuple):
    """What a registration says of the node's place in its group."""
    role: str  # leader|follower|master|slave|standalone
    term: int  # raft: its current term
    epoch: int  # master-slave: a master's epoch; a slave's, the newest it has followed
    leader_id: str  # whom it follows at that term/epoch (itself when it leads; "" none known)


def standing(config, repl) -> Standing:
    me = config.node_id or config.broker_name
    if config.mode == "raft":
        node = getattr(repl, "node", None)
        if repl.role_name == "leader":
            return Standing("leader", node.term if node is not None else 0, 0, me)
        # a candidate leads nothing; a follower that has just voted knows no leader yet
        leader = (getattr(node, "leader_id", None) or "") if node is not None else ""
        return Standing("follower", node.term if node is not None else 0, 0, leader)
    if config.mode == "master-slave":
        epochs = getattr(repl, "epochs", None)
        last = epochs.last_epoch if epochs is not None else 0
        if repl.accepting_writes:
            return Standing("master", 0, last, me)
        # a slave (or a fenced master: not routable) reports the newest epoch it has recorded
        # a master of -- what a promotion's quorum recorded (replication/master_slave/roles.py)
        seen = getattr(repl, "epoch_seen", 0)
        master = getattr(repl, "master", None)
        return Standing("slave", 0, max(last, seen if isinstance(seen, int) else 0),
                        master if isinstance(master, str) and master != me else "")
    return Standing("standalone", 0, 0, me)


# a leader's topic list, kept per TopicManager until its topics change: the standing is read
# every STANDING_POLL_MS, and a list of thousands of topics is not remade each time
_LISTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _listed(config, topics) -> list[ns.TopicQueues]:
    key = (topics.version, id(topics.topics), len(topics.topics), config.auto_create_topic_enable,
           config.default_topic_queues)
    try:
        hit = _LISTED.get(topics)
    except TypeError:  # not weakly referable (a test's stand-in): no cache
        hit = None
    if hit is not None and hit[0] == key:
        return hit[1]
    listed = [ns.TopicQueues(t.name, t.write_queues, t.read_queues, t.perm) for t in topics.topics.values()]
    if config.auto_create_topic_enable and TEMPLATE_TOPIC not in topics.topics:
        # this group creates unknown topics on first send: producers learn it from the
        # template's route (TBW102: BrokerController registers it with its topic configs)
        q = config.default_topic_queues
        listed.append(ns.TopicQueues(TEMPLATE_TOPIC, q, q, PERM_RW))
    try:
        _LISTED[topics] = (key, listed)
    except TypeError:
        pass
    return listed


def registration(config, repl, topics, address: str) -> ns.RegisterBroker:
    """What this node tells the name servers now: who it is, where clients reach it
    (`address`), its standing (role, term/epoch, whom it follows) and -- when it leads -- every
    topic with its queue counts, plus the auto-creation template (TEMPLATE_TOPIC) when its
    config creates topics on first send."""
    st = standing(config, repl)
    listed = _listed(config, topics) if st.role in ns.LEADING_ROLES else []
    return ns.RegisterBroker(config.cluster_name, config.broker_name, config.node_id or config.broker_name,
                             address, config.mode, st.role, st.term, st.epoch, topics.version, listed,
                             st.leader_id)


def _standing_of(r: ns.RegisterBroker) -> Standing:
    return Standing(r.role, r.term, r.epoch, r.leader_id or "")


def certificate_problem(config) -> str | None:
    """Why name servers will refuse this node's registrations for its certificate (it names
    no group, or another one), or None. Said once at start, so the cause is in the log."""
    tls = getattr(config, "tls", None)
    if not getattr(config, "secure", False) or tls is None:
        return None
    from broker.security import ca
    try:
        cert = ca.load_cert(tls.cert_file)
    except ca.CaError as e:
        return str(e)
    group = ca.cert_group(cert)
    if group == config.broker_name:
        return None
    what = "names no broker group" if group is None else f"names broker group {group!r}"
    return (f"{tls.cert_file} {what}, but this node's broker_name is {config.broker_name!r}: name servers "
            f"take a group's registrations only from certificates naming it (tidelog-group:<broker_name>); "
            f"re-issue it (tidelog deploy or upgrade re-issue such certificates)")


class Registrar:
    def __init__(self, config, snapshot: Callable[[], ns.RegisterBroker]):
        """`snapshot()`: the registration to send now (registration() over the broker's parts)."""
        self.config = config
        self.snapshot = snapshot
        self.credentials = config.member_credentials()
        self.addresses = {f"{h}:{p}": (h, p) for h, p in parse_bootstrap(list(config.namesrv_addresses))}
        self.core = RegistrarCore(list(self.addresses), config.register_interval_ms, _now_ms())
        self.conns: dict[str, _Link] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._log = RateLimitedLog(log, FAIL_LOG_S)
        self._timeout_s = config.register_timeout_ms / 1000
        problem = certificate_problem(config)
        if problem is not None:
            log.error("registering with name servers will be refused: %s", problem)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    def changed(self) -> None:
        """The role or the topics changed: register everywhere now."""
        self.core.changed(_now_ms())
        self._wake.set()

    async def stop(self) -> None:
        """UNREGISTER everywhere we are connected (bounded), then close."""
        await cancel_and_wait(self._task)
        await cancel_and_wait(*self._running)
        me = self.snapshot()
        body = jsonbody.encode(ns.NodeRef(me.broker_name, me.node_id))
        live = [c for c in self.conns.values() if not c.closed]
        if live:
            await asyncio.gather(*(c.request(Req.UNREGISTER_BROKER, body, UNREGISTER_TIMEOUT_S) for c in live),
                                 return_exceptions=True)  # (each request fails by itself after the timeout)
        for c in self.conns.values():
            c.close()
        self.conns.clear()

    def _observe(self, now_ms: int) -> None:
        try:
            self.core.observe(_standing_of(self.snapshot()), now_ms)
        except Exception as e:  # a bug must not stop the registrations: the period still runs
            self._log.warning("standing", "reading this node's standing failed: %s", _why(e))

    async def _loop(self) -> None:
        while True:
            now = _now_ms()
            self._observe(now)
            for act in self.core.due(now):
                work = self._connect(act.address) if act.kind == "connect" else self._register(act.address)
                t = asyncio.ensure_future(work)
                self._running.add(t)
                t.add_done_callback(self._running.discard)
            nxt = self.core.next_due_ms()
            poll = _now_ms() + STANDING_POLL_MS
            wait_s = max(0.0, (min(poll, nxt) if nxt is not None else poll) - _now_ms()) / 1000
            try:
                async with asyncio.timeout(wait_s):  # (not wait_for: broker/tasks.py)
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def _connect(self, address: str) -> None:
        host, port = self.addresses[address]
        try:
            conn = await _Link.open(host, port, self._timeout_s, credentials=self.credentials)
        except Exception as e:  # a bug too: a task that dies silently would leave the link busy forever
            self._log.warning(f"connect {address}", "cannot connect to name server %s: %s; retrying",
                              address, _why(e))
            self.core.connect_failed(address, _now_ms())
        else:
            conn.on_lost = lambda: self._lost(address, conn)
            self.conns[address] = conn
            self.core.connected(address, _now_ms())
            if conn.closed:
                self._lost(address, conn)
        self._wake.set()

    def _lost(self, address: str, conn: _Link) -> None:
        if self.conns.get(address) is conn:
            del self.conns[address]
            self.core.disconnected(address, _now_ms())
            self._wake.set()

    async def _register(self, address: str) -> None:
        conn = self.conns.get(address)
        try:
            req = self.snapshot()
            if conn is None or conn.closed:
                raise ConnectionError("not connected")
            f = await conn.request(Req.REGISTER_BROKER, jsonbody.encode(req), self._timeout_s)
            if f.code != Code.SUCCESS:
                raise ConnectionError(f"{name(f.code)}: {f.headers.get('error', '')}")
        except Exception as e:  # as in _connect: never leave the link busy
            self._log.warning(f"register {address}", "registering %s/%s with name server %s failed: %s; "
                              "retrying", self.config.broker_name, self.config.node_id or self.config.broker_name,
                              address, _why(e))
            if conn is not None:
                self.conns.pop(address, None)
                conn.abort()
            self.core.register_failed(address, _now_ms())
        else:
            log.debug("registered with %s as %s (term %d, epoch %d, %d topics)", address, req.role,
                      req.term, req.epoch, len(req.topics))
            self.core.registered(address, _now_ms())
        self._wake.set()
