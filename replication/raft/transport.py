"""Raft messages between group members: one outgoing connection per peer, oneway RAFT
frames over the client port (broker/protocol/frame.py). A message sent while the link has no
connection waits for the one being opened (the first whatever its size, then up to
`HELD_BYTES_MAX` or `queued_bytes_max` in all, whichever is less) and goes out first on it:
a restarted peer's first answers would otherwise be lost and cost the leader a push timeout
(1 s) before it asks again. If that attempt fails they are dropped (Raft resends what
matters); the link reconnects with back-off.

A peer that stops reading (paused, swapping, its disk hung) must not make the leader
buffer without limit: each push timeout resends the window. So a link queues at most
`queued_bytes_max` bytes that the kernel has not taken; past that it drops messages, an
APPEND whose entries are still queued on the connection is not queued again, and a
connection on which nothing moved for `stall_reconnect_s` while full is closed (its
queue freed) and opened again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from broker.client.connection import ClientConnection, parse_bootstrap
from broker.client.errors import ConnectError
from broker.protocol.codes import Req
from replication.raft import messages as m
from replication.raft import wire

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 0.25  # a restarted peer is reached within this (each attempt is cheap)
QUEUED_BYTES_MAX = 16 << 20  # per peer; above a push batch (raft_push_batch_bytes_max)
HELD_BYTES_MAX = 1 << 20  # per peer: sent while connecting (probes, answers, a window's start)
STALL_RECONNECT_S = 10.0


class PeerLink:
    def __init__(self, peer_id: str, address: str, frame_bytes_max: int,
                 queued_bytes_max: int = QUEUED_BYTES_MAX, stall_reconnect_s: float = STALL_RECONNECT_S,
                 credentials=None, on_connected=None):
        self.on_connected = on_connected  # called with the peer's id after each new connection
        self.credentials = credentials  # this member's certificate (broker/config.py member_credentials)
        self.peer_id = peer_id
        self.host, self.port = parse_bootstrap([address])[0]
        self.frame_bytes_max = frame_bytes_max
        self.queued_bytes_max = queued_bytes_max
        self.stall_reconnect_s = stall_reconnect_s
        self.conn: ClientConnection | None = None
        self._connecting: asyncio.Task | None = None
        self._backoff = BACKOFF_MIN_S
        # APPEND pushes not yet taken by the kernel: (stream end, term, last index)
        self._appends: deque[tuple[int, int, int]] = deque()
        self._stall: tuple[int, float] | None = None  # (bytes taken by the kernel, since)
        self._held: list[list] = []  # encoded messages waiting for the connection being opened
        self._held_bytes = 0
        self.dropped = 0  # no connection (held past HELD_BYTES_MAX, or the attempt failed)
        self.overflowed = 0  # over queued_bytes_max
        self.repeats_skipped = 0  # an APPEND still queued
        self.stall_reconnects = 0
        self.closed = False

    def send(self, msg) -> None:
        """Queue `msg` for the peer: held while a connection is being opened, dropped past
        the caps (send_append for an APPEND push)."""
        if isinstance(msg, m.Push) and msg.type == m.PushType.APPEND and msg.entries:
            self.send_append(wire.encode_parts(msg), msg.term, msg.entries[-1][0])
        else:
            self.send_encoded(wire.encode_parts(msg))

    def send_append(self, parts: tuple, term: int, last: int) -> None:
        """An APPEND push of `term` up to entry `last`, encoded (wire.encode_parts): not
        queued again while a push of the same term up to `last` or beyond waits in the queue."""
        conn = self.conn
        if conn is None or conn.closed:
            return self._hold(parts)
        if not self._room(conn):
            return
        appends = self._appends
        if any(t == term and sent >= last for _, t, sent in appends):
            self.repeats_skipped += 1  # a resend of entries still waiting to go out
            return
        conn.oneway(Req.RAFT, parts)
        appends.append((conn.queued_total, term, last))

    def send_encoded(self, parts: tuple) -> None:
        """`send` of a message encoded already (wire.encode_parts) that is no APPEND push."""
        conn = self.conn
        if conn is None or conn.closed:
            return self._hold(parts)
        if self._room(conn):
            conn.oneway(Req.RAFT, parts)

    def _room(self, conn: ClientConnection) -> bool:
        """The open connection's queue has room (else the message is counted as overflowed)."""
        queued = conn.queued_bytes()
        taken = conn.queued_total - queued  # stream position the kernel has reached
        appends = self._appends
        while appends and appends[0][0] <= taken:
            appends.popleft()
        if queued >= self.queued_bytes_max:
            self.overflowed += 1
            self._check_stall(conn, taken)
            return False
        self._stall = None
        return True

    def _hold(self, parts: tuple) -> None:
        """No connection: keep the message for the one being opened (up to HELD_BYTES_MAX)."""
        if self.closed:
            return
        size = sum(map(len, parts))
        held_max = min(HELD_BYTES_MAX, self.queued_bytes_max)  # they are queued on the connection once open
        if not self._held or self._held_bytes + size <= held_max:  # a window's start may pass it alone
            self._held.append(parts)
            self._held_bytes += size
        else:
            self.dropped += 1
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())

    def _check_stall(self, conn: ClientConnection, taken: int) -> None:
        now = time.monotonic()
        if self._stall is None or self._stall[0] != taken:
            self._stall = (taken, now)
        elif now - self._stall[1] >= self.stall_reconnect_s:
            log.warning("raft link to %s: %d bytes queued and none taken for %.0f s: reconnecting",
                        self.peer_id, conn.queued_bytes(), now - self._stall[1])
            self.stall_reconnects += 1
            self._drop_connection()

    def _drop_connection(self) -> None:
        self.conn.abort()  # close() would keep the queue until the peer reads it
        self.conn = None
        self._appends.clear()
        self._stall = None

    def flush(self) -> None:
        conn = self.conn
        if conn is not None:
            conn.flush()

    def queued_bytes(self) -> int:
        conn = self.conn
        return conn.queued_bytes() if conn is not None and not conn.closed else 0

    async def _connect(self) -> None:
        try:
            while not self.closed:
                try:
                    self.conn = await ClientConnection.open(self.host, self.port, 1.0, self.frame_bytes_max,
                                                            self.credentials, member=self.peer_id)
                    self._appends.clear()
                    self._stall = None
                    self._backoff = BACKOFF_MIN_S
                    held, self._held, self._held_bytes = self._held, [], 0
                    for parts in held:  # in the order they were sent, before anything newer
                        self.conn.oneway(Req.RAFT, parts)
                    if self.on_connected is not None:
                        self.on_connected(self.peer_id)
                    return
                except ConnectError as e:
                    log.debug("raft link to %s: %s", self.peer_id, e)
                    self.dropped += len(self._held)  # not reachable now: what waited is dropped
                    self._held, self._held_bytes = [], 0
                    await asyncio.sleep(self._backoff)
                    self._backoff = min(BACKOFF_MAX_S, self._backoff * 2)
        finally:
            self._connecting = None

    def close(self) -> None:
        self.closed = True
        if self._connecting is not None:
            self._connecting.cancel()
        if self.conn is not None:
            self.conn.close()
