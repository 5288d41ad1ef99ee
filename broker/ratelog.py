"""A warning that a peer can trigger at will (a refused login, a forged frame, a failed TLS
handshake) is logged at most once per `interval_s` for each kind, and the next line says how
many were not: a flood is a line a second, never a full disk."""

from __future__ import annotations

import logging
import time

KINDS_MAX = 4096  # kinds may be named by what peers send: the table stays bounded


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 1.0):
        self.logger, self.interval_s = logger, interval_s
        self._kinds: dict[str, tuple[float, int]] = {}  # kind -> (last logged, skipped since)

    def warning(self, kind: str, fmt: str, *args) -> None:
        now = time.monotonic()
        last, skipped = self._kinds.get(kind, (float("-inf"), 0))
        if now - last < self.interval_s:
            self._kinds[kind] = (last, skipped + 1)
            return
        if len(self._kinds) >= KINDS_MAX:
            self._kinds.clear()
        self._kinds[kind] = (now, 0)
        if skipped:
            fmt, args = fmt + " (%d more like it not logged)", (*args, skipped)
        self.logger.warning(fmt, *args)
