"""Connection bounds: how many connections (in all, per source address) and how long a
connection may take to send a frame or to authenticate. (Skeleton: issue 14, filled in by
the bounds work.)"""

from __future__ import annotations

import time


class ConnectionLimits:
    def __init__(self, config):
        self.config = config

    def admit(self, conn) -> str | None:
        """None to accept `conn` (counted until release), else why it is refused."""
        return None

    def release(self, conn) -> None:
        pass

    def sweep(self, connections, now: float | None = None) -> None:
        """Close connections that are idle, late with a frame or late to authenticate."""
        now = time.monotonic() if now is None else now
        limit = self.config.connection_idle_timeout_ms / 1000
        for c in list(connections):
            if c.inflight == 0 and now - c.last_active > limit:
                c.log.info("closing idle connection from %s", c.peer)
                c.close()
