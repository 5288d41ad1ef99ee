"""Raft messages between group members: one outgoing connection per peer, oneway RAFT
frames over the client port (broker/protocol/frame.py). A message to a peer that cannot be
reached is dropped (Raft resends what matters); the link reconnects with back-off."""

from __future__ import annotations

import asyncio
import logging

from broker.client.connection import ClientConnection, parse_bootstrap
from broker.client.errors import ConnectError
from broker.protocol.codes import Req
from replication.raft import wire

log = logging.getLogger(__name__)

BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 1.0


class PeerLink:
    def __init__(self, peer_id: str, address: str, frame_bytes_max: int):
        self.peer_id = peer_id
        self.host, self.port = parse_bootstrap([address])[0]
        self.frame_bytes_max = frame_bytes_max
        self.conn: ClientConnection | None = None
        self._connecting: asyncio.Task | None = None
        self._backoff = BACKOFF_MIN_S
        self.dropped = 0
        self.closed = False

    def send(self, msg) -> None:
        conn = self.conn
        if conn is not None and not conn.closed:
            conn.oneway(Req.RAFT, wire.encode_parts(msg))
            return
        self.dropped += 1
        if self._connecting is None and not self.closed:
            self._connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        try:
            while not self.closed:
                try:
                    self.conn = await ClientConnection.open(self.host, self.port, 1.0, self.frame_bytes_max)
                    self._backoff = BACKOFF_MIN_S
                    return
                except ConnectError as e:
                    log.debug("raft link to %s: %s", self.peer_id, e)
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
