"""Live consumers per group, from their heartbeats (for client-side queue allocation, and for
DESCRIBE_GROUP: where each member's heartbeats come from and what it reads)."""

from __future__ import annotations

from typing import NamedTuple


class Member(NamedTuple):
    last_heartbeat_ms: float
    address: str = ""           # the peer its heartbeats came from
    topics: tuple[str, ...] = ()


class ConsumerGroups:
    def __init__(self, expire_ms: int):
        self.expire_ms = expire_ms
        self.members: dict[str, dict[str, Member]] = {}

    def heartbeat(self, group: str, client_id: str, now_ms: float, address: str = "",
                  topics: tuple[str, ...] = ()) -> list[str]:
        self.members.setdefault(group, {})[client_id] = Member(now_ms, address, tuple(topics))
        return self.live(group, now_ms)

    def live(self, group: str, now_ms: float) -> list[str]:
        return sorted(self.live_members(group, now_ms))

    def live_members(self, group: str, now_ms: float) -> dict[str, Member]:
        """The group's members heard from within expire_ms (the others are forgotten here)."""
        g = self.members.get(group, {})
        for cid in [c for c, m in g.items() if now_ms - m.last_heartbeat_ms > self.expire_ms]:
            del g[cid]
        if not g:
            self.members.pop(group, None)
        return g

    def names(self, now_ms: float) -> list[str]:
        """Groups with a live member."""
        return [g for g in list(self.members) if self.live_members(g, now_ms)]

    def leave(self, group: str, client_id: str) -> None:
        self.members.get(group, {}).pop(client_id, None)
