"""The client port's accept loop: connections are counted (broker/limits.py) when the kernel
hands them over, before any TLS state exists, and a TLS handshake that fails is logged.

Why not `loop.create_server(ssl=...)`: there the protocol sees a connection only after its
handshake succeeded, so connections still in their handshake are counted by nothing (5,000
that never finish cost ~250 MiB until the handshake timeout), and a refused handshake (a
client certificate from another CA) leaves no trace. Here each accepted socket is admitted
(or closed at once) by its source address, then `connect_accepted_socket` runs the handshake
under `HANDSHAKE_TIMEOUT_S`; a failure releases the admission and is logged once a second.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import time

from broker.ratelog import RateLimitedLog
from broker.tasks import cancel_and_wait

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
BACKLOG = 1024
ACCEPT_RETRY_S = 0.1  # out of file descriptors: wait for some to close
FAIL_LOG_S = 1.0


class Admission:
    """A connection from accept until it closes: what the limits count (source, peer)."""
    __slots__ = ("source", "peer")

    def __init__(self, source: str, peer: str):
        self.source, self.peer = source, peer


def listen_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class Listener:
    def __init__(self, host: str, port: int, protocol_factory, limits, ssl_ctx: ssl.SSLContext | None):
        """`protocol_factory(admission)` makes a connection's protocol; raises OSError when
        host:port cannot be listened on."""
        self.sock = listen_socket(host, port)
        self.port = self.sock.getsockname()[1]
        self.factory, self.limits, self.ssl_ctx = protocol_factory, limits, ssl_ctx
        self._task: asyncio.Task | None = None
        self._opening: set[asyncio.Task] = set()
        self._failures = RateLimitedLog(log, FAIL_LOG_S)  # failed handshakes, a line a second per reason
        self._emfile_logged_at = float("-inf")

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._accept_loop())
        self._task.add_done_callback(self._stopped)

    def _stopped(self, task: asyncio.Task) -> None:
        if not task.cancelled() and task.exception() is not None:  # a bug: say so loudly
            log.error("the accept loop on port %d ended: %r; no new connections are taken",
                      self.port, task.exception())

    async def close(self) -> None:
        """Stop accepting; connections being opened are dropped."""
        await cancel_and_wait(self._task, *self._opening)
        self.sock.close()

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self.sock)
            except OSError as e:
                if e.errno in (errno.ECONNABORTED, errno.EINTR, errno.EAGAIN):
                    continue  # that connection is gone already
                # out of descriptors or memory, or a network error accept(2) says to retry
                # after: never stop accepting (the broker would look alive and take no client)
                now = time.monotonic()
                if now - self._emfile_logged_at >= FAIL_LOG_S:
                    log.error("cannot accept connections: %s; retrying", e.strerror or e)
                    self._emfile_logged_at = now
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            adm = Admission(str(addr[0]), f"{addr[0]}:{addr[1]}")
            if self.limits.admit(adm) is not None:  # refused (the limits log it, rate-limited)
                conn.close()
                continue
            t = loop.create_task(self._open(conn, adm))
            self._opening.add(t)
            t.add_done_callback(self._opening.discard)

    async def _open(self, conn: socket.socket, adm: Admission) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                lambda: self.factory(adm), conn, ssl=self.ssl_ctx,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.ssl_ctx is not None else None)
        except asyncio.CancelledError:
            self.limits.release(adm)
            conn.close()
            raise
        except (OSError, asyncio.TimeoutError, ConnectionError) as e:  # ssl.SSLError is an OSError
            self.limits.release(adm)
            conn.close()
            self._handshake_failed(adm, e)

    def _handshake_failed(self, adm: Admission, e: BaseException) -> None:
        if not isinstance(e, (ssl.SSLError, asyncio.TimeoutError)):
            # closed before or during the handshake: a port probe (deploy's "is it listening?"), a
            # client giving up -- nothing was refused
            log.debug("connection from %s closed during the TLS handshake: %r", adm.peer, e)
            return
        why = getattr(e, "reason", None) or str(e) or type(e).__name__
        self._failures.warning(why, "refused a connection from %s: TLS handshake failed: %s", adm.peer, why)
