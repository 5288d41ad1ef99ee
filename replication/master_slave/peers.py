"""Requests from a master-slave node to the other members, over their client ports:
STATUS probes (whose views decide roles, see roles.py), metadata pulls, promotion steps.
One cached connection per member; a member that does not answer in time is "unreachable"."""

from __future__ import annotations

import asyncio
import logging

from broker.client.connection import ClientConnection, parse_bootstrap
from broker.client.errors import TidelogError
from broker.protocol import jsonbody
from broker.protocol.codes import Code, Req
from replication.master_slave.roles import View

log = logging.getLogger(__name__)


class PeerCallError(Exception):
    pass


class Peers:
    def __init__(self, addresses: dict[str, str], frame_bytes_max: int, faults=None, credentials=None):
        self.credentials = credentials  # this member's certificate, when security is on
        self.addresses = addresses  # node id -> client address, this node excluded
        self.frame_bytes_max = frame_bytes_max
        self.faults = faults  # broker/faults.py: a drill's partition drops calls too
        self.conns: dict[str, ClientConnection] = {}

    async def call(self, node: str, code: int, body=None, timeout_s: float = 1.0, answer=dict):
        """The JSON answer of `node` as `answer`, or PeerCallError (unreachable, an error
        code, or an answer that does not decode)."""
        if self.faults is not None and self.faults.blocks(node):
            await asyncio.sleep(timeout_s)  # what a partition looks like: no answer
            raise PeerCallError(f"{node}: no answer (fault injection)")
        conn = self.conns.get(node)
        try:
            if conn is None or conn.closed:
                host, port = parse_bootstrap([self.addresses[node]])[0]
                conn = self.conns[node] = await ClientConnection.open(host, port, timeout_s, self.frame_bytes_max,
                                                                      self.credentials, member=node)
            f = await conn.request(code, jsonbody.encode(body or {}), timeout_s)
        except TidelogError as e:
            if conn is not None:
                conn.close()
            self.conns.pop(node, None)
            raise PeerCallError(f"{node}: {e}") from None
        if f.code != Code.SUCCESS:
            raise PeerCallError(f"{node}: {Code(f.code).name if f.code in Code._value2member_map_ else f.code}: "
                                f"{f.headers.get('error', '')}")
        try:
            return jsonbody.decode(answer, f.body)
        except ValueError as e:
            raise PeerCallError(f"{node}: bad answer: {e}") from None

    async def views(self, timeout_s: float = 1.0) -> tuple[list[View], list[str]]:
        """Fresh views of every member that answers STATUS, and the ids of those that did not."""
        nodes = list(self.addresses)
        results = await asyncio.gather(*(self.call(n, Req.STATUS, None, timeout_s) for n in nodes),
                                       return_exceptions=True)
        views, down = [], []
        for node, r in zip(nodes, results):
            v = view_of(node, r) if isinstance(r, dict) else None
            if v is None:
                down.append(node)
                if not isinstance(r, PeerCallError) and isinstance(r, BaseException):
                    log.debug("probe of %s failed: %r", node, r)
            else:
                views.append(v)
        return views, down

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()


def view_of(node: str, status: dict) -> View | None:
    """A member's View from its STATUS answer (None if it is not in master-slave mode)."""
    r = status.get("replication") or {}
    if status.get("mode") != "master-slave" or r.get("role") not in ("master", "slave"):
        return None
    try:
        return View(node, r["role"], int(r["epoch"]), int(r["epoch_seen"]), r.get("master"),
                    int(status["store"]["max_offset"]), bool(r.get("fenced", False)))
    except (KeyError, TypeError, ValueError):
        return None
