"""Live consumers per group, from their heartbeats (for client-side queue allocation)."""

from __future__ import annotations


class ConsumerGroups:
    def __init__(self, expire_ms: int):
        self.expire_ms = expire_ms
        self.members: dict[str, dict[str, float]] = {}

    def heartbeat(self, group: str, client_id: str, now_ms: float) -> list[str]:
        self.members.setdefault(group, {})[client_id] = now_ms
        return self.live(group, now_ms)

    def live(self, group: str, now_ms: float) -> list[str]:
        g = self.members.get(group, {})
        for cid in [c for c, seen in g.items() if now_ms - seen > self.expire_ms]:
            del g[cid]
        return sorted(g)

    def leave(self, group: str, client_id: str) -> None:
        self.members.get(group, {}).pop(client_id, None)
