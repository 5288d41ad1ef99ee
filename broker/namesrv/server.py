"""The name server process: the broker's listener/connection stack (TLS, connection limits,
frame bounds, SCRAM through the Guard) in front of the pure RouteTable (core.py).

broker/connection.py's Connection serves any owner with `config` (frame and connection
bounds), `limits`, `connections` and `handle(conn, frames)`: this class is one, as Broker is.

Who may do what (docs/design/name-server.md §4):
- REGISTER_BROKER / UNREGISTER_BROKER: only a connection whose TLS client certificate (from the
  cluster CA) names `tidelog-member:<node_id>` and `tidelog-group:<broker_name>` of the body
  (core.py `refusal`, rule N0; NO_PERMISSION otherwise, logged as a refusal). A user login --
  even admin -- never may: a forged registration would steer producers to another address.
  Such a user is answered NO_PERMISSION (it is authenticated, it lacks the right); a connection
  with neither a member certificate nor a login is answered AUTH_FAILED, counted as a failed
  login (Guard.unauthenticated: the third closes the connection). The registered address's host
  must be the IP the connection comes from (NO_PERMISSION otherwise). Which leader claim is
  routed is the core's rule N3 (the group's own members must vouch for it).
- GET_TOPIC_ROUTE / GET_CLUSTER_INFO: any authenticated principal (a user of any role, or a member).
  The auto-creation template (TEMPLATE_TOPIC) is routed like any topic unless this name server's
  auto_create_topic_enable is off; creating a topic still needs pub on it, checked by the broker
  that creates it on the first send.
- `insecure: true`: everyone may do everything (warned about at start).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import os
import time
from pathlib import Path

from broker.acl_store import AclStore
from broker.config import parse_hostport
from broker.connection import Connection, unsupported_version
from broker.limits import ConnectionLimits
from broker.listener import Listener
from broker.namesrv import TEMPLATE_TOPIC
from broker.namesrv.config import NamesrvConfig
from broker.namesrv.core import Bounds, RouteTable, refusal
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol import namesrv as ns
from broker.protocol.codes import BadRequest, Code, Req
from broker.protocol.topics import TopicName
from broker.security import acl
from broker.security.guard import Guard
from broker.security.tls import peer_group, peer_member, server_context
from broker.tasks import cancel_and_wait

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0  # idle connections, frame and auth deadlines (broker/limits.py)
# users come from the config only for now (runtime ACL_UPDATE to name servers is §4's Q2): an
# overlay file that never exists keeps the Guard's runtime store empty
NO_ACL_FILE = Path("/dev/null/tidelog-namesrv-acl.json")


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class _Connections(set):
    """The open connections; a connection leaving (Connection.connection_lost discards it)
    drops what registered on it (rule N4)."""

    def __init__(self, on_closed):
        super().__init__()
        self._on_closed = on_closed

    def discard(self, conn) -> None:
        if conn in self:
            super().discard(conn)
            self._on_closed(conn)


class NameServer:
    def __init__(self, config: NamesrvConfig):
        config.require_security()
        self.config = config
        self.core = RouteTable(config.namesrv_id, config.broker_expire_ms,
                               Bounds(config.routes_topics_max, config.groups_max, config.nodes_per_group_max))
        self.connections = _Connections(self._connection_closed)
        self.limits = ConnectionLimits(config)
        self.guard = Guard(config, store=AclStore(NO_ACL_FILE))
        self.server: Listener | None = None
        self.listen_port: int | None = None
        self.started_ms = _now_ms()
        self._ticker: asyncio.Task | None = None
        self._next_conn_id = 0

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        cfg = self.config
        ssl_ctx = None
        if cfg.secure:
            ssl_ctx = server_context(cfg.tls.ca_file, cfg.tls.cert_file, cfg.tls.key_file)
        else:
            log.warning("INSECURE: insecure: true -- no TLS and no authentication on %s; anyone who can "
                        "reach this port can read routes and register brokers (steering producers "
                        "to any address)", cfg.listen)
        try:
            self.server = Listener(cfg.host, cfg.port, lambda adm: Connection(self, adm), self.limits, ssl_ctx)
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on {cfg.listen}: {e.strerror}") from None
        self.listen_port = self.server.port
        self.server.start()
        self.started_ms = _now_ms()
        if cfg.pid_file is not None:  # only now: a launcher waiting for it knows the port is ours
            tmp = cfg.pid_file.with_name(cfg.pid_file.name + ".tmp")
            tmp.write_text(f"{os.getpid()}\n")
            tmp.replace(cfg.pid_file)
        self._ticker = asyncio.create_task(self._housekeeping())
        log.info("name server %s listening on %s:%d (broker_expire_ms %d, scan every %d ms)",
                 cfg.namesrv_id, cfg.host, self.listen_port, cfg.broker_expire_ms, cfg.scan_interval_ms)

    async def stop(self) -> None:
        if self.server is None:
            return
        await self.server.close()
        if self.config.pid_file is not None:
            self.config.pid_file.unlink(missing_ok=True)
        await cancel_and_wait(self._ticker)
        for c in list(self.connections):
            c.close()
        self.server = None
        log.info("name server %s stopped", self.config.namesrv_id)

    async def _housekeeping(self) -> None:
        scan_s = self.config.scan_interval_ms / 1000
        now = time.monotonic()
        due_scan, due_sweep = now + scan_s, now + SWEEP_INTERVAL_S
        while True:
            await asyncio.sleep(min(scan_s, SWEEP_INTERVAL_S))
            now = time.monotonic()
            try:
                if now >= due_scan:
                    due_scan = now + scan_s
                    for d in self.core.expire(_now_ms()):
                        log.warning("dropped %s/%s: %s", d.broker_name, d.node_id, d.why)
                if now >= due_sweep:
                    due_sweep = now + SWEEP_INTERVAL_S
                    self.limits.sweep(self.connections, now)
            except Exception:
                log.exception("housekeeping failed; continuing")

    def _connection_closed(self, conn) -> None:
        conn_id = getattr(conn, "ns_id", None)
        if conn_id is None:
            return
        for d in self.core.connection_closed(conn_id):
            log.info("dropped %s/%s: its connection from %s closed", d.broker_name, d.node_id, conn.peer)

    # --- requests ----------------------------------------------------------------------------

    def handle(self, conn: Connection, frames: list[fr.Frame]) -> None:
        if conn.auth is None:
            self._on_connect(conn)
        for f in frames:
            if f.version > fr.PROTOCOL_VERSION or f.version < fr.MIN_VERSION:
                unsupported_version(conn, f)
                continue
            if f.flags & (fr.FLAG_RESPONSE | fr.FLAG_ONEWAY):
                continue  # nothing here is oneway; a response frame is nobody's answer
            try:
                self._one(conn, f)
            except BadRequest as e:
                conn.respond(f, Code.BAD_REQUEST, error=str(e))
            except Exception as e:  # a bug must not take the connection or the name server down
                log.exception("request %s from %s failed", f.code, conn.peer)
                conn.respond(f, Code.SYSTEM_ERROR, error=f"{type(e).__name__}: {e}")

    def _on_connect(self, conn: Connection) -> None:
        self._next_conn_id += 1
        conn.ns_id = self._next_conn_id
        conn.ns_group = None  # the broker group its certificate names (N0)
        self.guard.on_connect(conn, None)  # users log in with SCRAM as on a broker
        if self.config.secure:
            member = peer_member(conn.transport)
            if member is not None:  # any node of any group: which one is checked per request
                conn.member = member
                conn.ns_group = peer_group(conn.transport)
                conn.principal = acl.Acl.member(member)

    def _one(self, conn: Connection, f: fr.Frame) -> None:
        code = f.code
        if code == Req.REGISTER_BROKER or code == Req.UNREGISTER_BROKER:
            if self._refuse_registrant(conn, f):
                return
            if code == Req.REGISTER_BROKER:
                return self._register(conn, f)
            r = jsonbody.decode(ns.NodeRef, f.body)
            if self._not_that_member(conn, f, r.broker_name, r.node_id):
                return
            if self.core.unregister(r.broker_name, r.node_id):
                log.info("%s/%s unregistered (a clean stop)", r.broker_name, r.node_id)
            return conn.respond(f, Code.SUCCESS, b"{}")
        if (conn.principal is None or code == Req.AUTH) and self.guard.gate(conn, f):
            return  # AUTH, or not authenticated yet (answered AUTH_FAILED)
        if code == Req.GET_TOPIC_ROUTE:
            return self._route(conn, f)
        if code == Req.GET_CLUSTER_INFO:
            return conn.respond(f, Code.SUCCESS, jsonbody.encode(self.core.cluster_info(_now_ms())))
        conn.respond(f, Code.REQUEST_CODE_NOT_SUPPORTED,
                     error=f"request code {code} is not supported by a name server")

    def _refuse_registrant(self, conn: Connection, f: fr.Frame) -> bool:
        if not self.config.secure or conn.member is not None:
            return False
        if conn.principal is None:
            # counted as a failed login: a connection that keeps trying is closed like one
            # guessing passwords, not left to the auth deadline
            self.guard.unauthenticated(conn, f, "registering needs a broker node's member certificate "
                                       "(tidelog-member:<node_id>, tidelog-group:<broker_name> from the "
                                       "cluster CA) in the TLS handshake")
        else:
            self.guard.refused(conn, f"{conn.principal} tried to register a broker", kind="register by a user")
            conn.respond(f, Code.NO_PERMISSION, error=f"{conn.principal} may not register or unregister "
                         "brokers: only a broker node's member certificate (tidelog-member:<node_id>, "
                         "tidelog-group:<broker_name>) may")
        return True

    def _not_that_member(self, conn: Connection, f: fr.Frame, broker_name: str, node_id: str) -> bool:
        """N0: the certificate must name this node and this group."""
        if not self.config.secure:
            return False
        why = refusal(broker_name, node_id, conn.member, conn.ns_group)
        if why is None:
            return False
        self.guard.refused(conn, f"member {conn.member} (group {conn.ns_group}) tried to "
                           f"register as {broker_name}/{node_id}", kind="register as another")
        conn.respond(f, Code.NO_PERMISSION, error=why)
        return True

    def _not_its_address(self, conn: Connection, f: fr.Frame, r: ns.RegisterBroker) -> bool:
        """On a secure name server a node registers the IP it connects from (or, connecting
        over loopback, a loopback address): a member certificate does not let it steer clients
        to another host."""
        if not self.config.secure:
            return False
        try:
            name = parse_hostport(r.address)[0]
        except ValueError:
            name = None
        try:
            host = _unmapped(ipaddress.ip_address(name))
            peer = _unmapped(ipaddress.ip_address(conn.source))
        except ValueError:
            if name and not name[0].isdigit() and ":" not in name:
                # a DNS name (specs allow them): not resolved here (this is the event loop), so
                # not checked -- the member certificate and the group pin still hold
                return False
            host = peer = None
        # a loopback connection comes from this host, whose loopback aliases (a local cluster's
        # 127.x.y.z nodes) it may name: the kernel picks 127.0.0.1 as their source
        if host is not None and (host == peer or host.is_loopback and peer.is_loopback):
            return False
        self.guard.refused(conn, f"member {conn.member} tried to register address {r.address}",
                           kind="register another address")
        conn.respond(f, Code.NO_PERMISSION, error=f"address {r.address!r}: its host must be the IP address "
                     f"this connection comes from ({conn.source}): a node registers only where it is")
        return True

    def _register(self, conn: Connection, f: fr.Frame) -> None:
        r = jsonbody.decode(ns.RegisterBroker, f.body)
        if self._not_that_member(conn, f, r.broker_name, r.node_id) or self._not_its_address(conn, f, r):
            return
        before = self.core.leader_of(r.broker_name)
        known = r.broker_name in self.core.groups and r.node_id in self.core.groups[r.broker_name].nodes
        result = self.core.register(r, conn.ns_id, _now_ms())
        if not known:
            log.info("%s/%s registered: %s %s at %s (term %d, epoch %d, %d topics)", r.broker_name,
                     r.node_id, r.mode, r.role, r.address, r.term, r.epoch, len(r.topics))
        if result.leader_address != before:
            log.info("group %s: leader %s (was %s)", r.broker_name, result.leader_address, before)
        conn.respond(f, Code.SUCCESS, jsonbody.encode(result))

    def _route(self, conn: Connection, f: fr.Frame) -> None:
        r = jsonbody.decode(TopicName, f.body)
        if r.topic == TEMPLATE_TOPIC and not self.config.auto_create_topic_enable:
            return conn.respond(f, Code.TOPIC_NOT_EXIST, error=f"{TEMPLATE_TOPIC}: topic auto-creation through "
                                "this name server is off (its auto_create_topic_enable: false)")
        route = self.core.route(r.topic)
        if route is not None:
            return conn.respond(f, Code.SUCCESS, jsonbody.encode(route))
        if _now_ms() - self.started_ms < self.config.startup_grace_ms:
            return conn.respond(f, Code.SYSTEM_BUSY, error=f"topic {r.topic} has no route yet: this name "
                                "server started moments ago and brokers are still registering; retry")
        conn.respond(f, Code.TOPIC_NOT_EXIST, error=f"no broker group holds topic {r.topic}")


def _unmapped(ip):
    return getattr(ip, "ipv4_mapped", None) or ip


def run(config: NamesrvConfig) -> None:
    """Run a name server in the foreground until SIGTERM or SIGINT (used by the CLI)."""
    from broker.server import run_until_signal

    run_until_signal(lambda: NameServer(config))
