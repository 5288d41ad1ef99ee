"""When a broker node talks to each name server, pure: no sockets, no clock (time enters as
`now_ms`). The driver is broker/registrar.py; docs/design/name-server.md §4 is the plan.

Per name server: connect, then register at once (on every (re)connect: a name server that
restarted is empty), every `register_interval_ms` after, and at once whenever the node's role
or its topics change (BrokerController's registerBrokerAll on a role change, and
TopicConfigManager.createTopicInSendMessageMethod: "send one registration to every name
server at once") -- or its standing: its term or epoch, or whom it follows (`observe`). A name
server routes a leader only once most of the group's registered nodes say they follow it at
its term (broker/namesrv/core.py N3), so a follower's registration must say so promptly. One registration in flight per name server: a change while one is in
flight sends another as soon as it is answered (it carries the state at send time). A failed
connect or request is retried after a backoff doubling from RECONNECT_MIN_MS to
RECONNECT_MAX_MS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

RECONNECT_MIN_MS = 250
RECONNECT_MAX_MS = 5000


class Action(NamedTuple):
    kind: str  # "connect" or "register"
    address: str


@dataclass
class _Link:
    connected: bool = False
    busy: bool = False  # a connect or a registration in flight
    due_ms: int = 0  # the next connect (disconnected) or registration (connected)
    dirty: bool = False  # a change arrived while a registration was in flight
    backoff_ms: int = RECONNECT_MIN_MS


class RegistrarCore:
    def __init__(self, addresses, register_interval_ms: int, now_ms: int = 0):
        self.interval_ms = register_interval_ms
        self.links = {a: _Link(due_ms=now_ms) for a in addresses}
        self.standing = None  # what observe() saw last

    def due(self, now_ms: int) -> list[Action]:
        """What to start now; each action is reported back with connected/connect_failed or
        registered/register_failed."""
        out = []
        for a, l in self.links.items():
            if l.busy or l.due_ms > now_ms:
                continue
            l.busy = True
            out.append(Action("register" if l.connected else "connect", a))
        return out

    def next_due_ms(self) -> int | None:
        """When due() next has something, unless an event comes first (None: only events)."""
        times = [l.due_ms for l in self.links.values() if not l.busy]
        return min(times) if times else None

    def connected(self, address: str, now_ms: int) -> None:
        l = self.links[address]
        l.connected, l.busy, l.due_ms, l.dirty = True, False, now_ms, False  # register at once
        l.backoff_ms = RECONNECT_MIN_MS

    def connect_failed(self, address: str, now_ms: int) -> None:
        self._retry_later(self.links[address], now_ms)

    def disconnected(self, address: str, now_ms: int) -> None:
        """The connection closed (the name server stopped, a network fault): reconnect soon."""
        l = self.links[address]
        if l.connected:
            l.connected = False
            if not l.busy:
                l.due_ms = now_ms + l.backoff_ms

    def registered(self, address: str, now_ms: int) -> None:
        l = self.links[address]
        l.busy = False
        l.backoff_ms = RECONNECT_MIN_MS
        if not l.connected:  # lost while the answer was on its way
            l.due_ms = now_ms + l.backoff_ms
        else:
            l.due_ms = now_ms if l.dirty else now_ms + self.interval_ms
        l.dirty = False

    def register_failed(self, address: str, now_ms: int) -> None:
        """No answer in time, or refused: the driver closes the connection; start over."""
        l = self.links[address]
        l.connected = False
        self._retry_later(l, now_ms)

    def changed(self, now_ms: int) -> None:
        """The role or the topics changed: every connected name server hears of it now."""
        for l in self.links.values():
            if not l.connected:
                continue  # it registers on connect anyway
            if l.busy:
                l.dirty = True
            else:
                l.due_ms = now_ms

    def observe(self, standing, now_ms: int) -> bool:
        """The node's standing now (its role, term, epoch and leader, as the registration would
        say them): a change is registered everywhere now, as `changed`. True if it changed. The
        first call only records it (the first registrations carry it anyway)."""
        if standing == self.standing:
            return False
        first, self.standing = self.standing is None, standing
        if not first:
            self.changed(now_ms)
        return not first

    def _retry_later(self, l: _Link, now_ms: int) -> None:
        l.busy, l.dirty = False, False
        l.due_ms = now_ms + l.backoff_ms
        l.backoff_ms = min(RECONNECT_MAX_MS, l.backoff_ms * 2)
