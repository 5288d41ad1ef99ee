"""Connection bounds: how many connections (in all, per source address) and how long a
connection may take to send a frame or to authenticate.

Counting happens at accept (Connection.connection_made asks `admit`, connection_lost calls
`release`); a refused connection is aborted before it reads a byte. Under a flood of
refusals the log gets one line per REFUSAL_LOG_S, not one per connection. The timed bounds
are checked by `sweep`, which the broker's housekeeping calls every few seconds:

- idle: nothing read for connection_idle_timeout_ms and nothing in flight -> closed;
- frame deadline: a frame whose first byte came more than frame_deadline_ms ago and is still
  not whole -> aborted. Trickling bytes does not help (the clock starts at the frame's first
  byte), and the time reading was paused by the broker itself does not count;
- auth deadline (secure brokers only): no user and no member proven auth_deadline_ms after
  the connection opened -> aborted.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

REFUSAL_LOG_S = 1.0
SWEEP_LOG_LINES_MAX = 10  # per kind and sweep; then one line with the count


class ConnectionLimits:
    def __init__(self, config):
        self.config = config
        self.open = 0
        self.per_source: dict[str, int] = {}
        self._admitted: set = set()
        self.refused_total = 0
        self._refused = 0  # since the last refusal log line
        self._refused_last = ""
        self._refused_logged_at = float("-inf")

    def admit(self, conn) -> str | None:
        """None to accept `conn` (counted until release), else why it is refused."""
        cfg = self.config
        src = conn.source
        n = self.per_source.get(src, 0)
        if self.open >= cfg.connections_max:
            why = f"{self.open} connections open: connections_max={cfg.connections_max}"
        elif n >= cfg.connections_per_source_max:
            why = (f"{n} connections open from {src}: "
                   f"connections_per_source_max={cfg.connections_per_source_max}")
        else:
            self.open += 1
            self.per_source[src] = n + 1
            self._admitted.add(conn)
            return None
        self.refused_total += 1
        self._refused += 1
        self._refused_last = f"{conn.peer}: {why}"
        self._log_refusals(time.monotonic())
        return why

    def release(self, conn) -> None:
        if conn not in self._admitted:
            return
        self._admitted.discard(conn)
        self.open -= 1
        n = self.per_source[conn.source] - 1
        if n:
            self.per_source[conn.source] = n
        else:
            del self.per_source[conn.source]

    def _log_refusals(self, now: float, force: bool = False) -> None:
        if self._refused and (force or now - self._refused_logged_at >= REFUSAL_LOG_S):
            log.warning("refused %d connection(s) since the last report (%d in all); the last: %s",
                        self._refused, self.refused_total, self._refused_last)
            self._refused = 0
            self._refused_logged_at = now

    def sweep(self, connections, now: float | None = None) -> None:
        """Close connections that are idle, late with a frame or late to authenticate."""
        now = time.monotonic() if now is None else now
        cfg = self.config
        self._log_refusals(now, force=True)
        idle_s = cfg.connection_idle_timeout_ms / 1000
        frame_s = cfg.frame_deadline_ms / 1000
        auth_s = cfg.auth_deadline_ms / 1000
        late_frame, late_auth = [], []
        for c in list(connections):
            if c.closed:
                continue
            since = c.decoder.partial_since
            if since is not None and not c.reading_paused and now - since > frame_s:
                late_frame.append(c)
            elif (c.principal is None and c.member is None and now - c.opened_at > auth_s
                  and c.broker.config.secure):
                late_auth.append(c)
            elif c.inflight == 0 and now - c.last_active > idle_s:
                c.log.info("closing idle connection from %s", c.peer)
                c.close()
        _abort_all(late_frame, f"a frame not whole within frame_deadline_ms={cfg.frame_deadline_ms}")
        _abort_all(late_auth, f"not authenticated within auth_deadline_ms={cfg.auth_deadline_ms}")


def _abort_all(conns: list, why: str) -> None:
    for c in conns[:SWEEP_LOG_LINES_MAX]:
        log.warning("closing connection from %s: %s", c.peer, why)
    if len(conns) > SWEEP_LOG_LINES_MAX:
        log.warning("closing %d more connections: %s", len(conns) - SWEEP_LOG_LINES_MAX, why)
    for c in conns:
        c.abort()
