"""One client connection on the broker: framing, write coalescing and back-pressure.

The transport reads straight into the connection's reused frame buffer (BufferedProtocol),
so a read costs no allocation. Every response produced while handling one read (or one flush completion) goes out in a
single write. A connection stops reading while it has more than `connection_inflight_max`
requests waiting (sync flush, long polling) or while its socket's send buffer is full, so a
fast producer cannot make the broker buffer without bound.
"""

from __future__ import annotations

import asyncio
import logging
import time

from broker.protocol import frame as fr
from broker.protocol.codes import Code

log = logging.getLogger(__name__)


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker):
        self.broker = broker
        self.decoder = fr.FrameReader(broker.config.frame_bytes_max)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.out: list[bytes] = []
        self.closed = False
        self.inflight = 0
        self._inflight_max = broker.config.connection_inflight_max
        self._write_paused = False
        self._reading_paused = False
        self.last_active = time.monotonic()
        self.log = log
        # who is on the other end (broker/security/): the user a SCRAM exchange proved, or the
        # group member whose certificate the TLS handshake verified; None: not authenticated
        self.principal = None
        self.member: str | None = None
        self.auth = None  # a SCRAM exchange in progress

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        """Frames are handled before returning: their bodies live in the read buffer."""
        self.last_active = time.monotonic()
        frames = self.decoder.buffer_updated(nbytes)
        if frames:
            self.broker.handle(self, frames)
        if self.decoder.error is not None:
            self.fail(self.decoder.error)
        self.flush()

    def eof_received(self) -> bool:
        err = self.decoder.eof_error()
        if err is not None:
            self.fail(err)
        self.flush()
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.out.clear()
        self.broker.connections.discard(self)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        self._update_reading()

    # --- responses -----------------------------------------------------------------------

    def respond(self, req: fr.Frame, code: int, body: bytes = b"", error: str | None = None,
                headers: dict | None = None) -> None:
        if req.flags & fr.FLAG_ONEWAY:
            return
        if error is not None:
            headers = {**(headers or {}), "error": error}
        self.out.append(fr.encode_response(code, req.corr_id, body, headers, req.version))

    def queue(self, data: bytes) -> None:
        self.out.append(data)

    def flush(self) -> None:
        if self.out and not self.closed:
            self.transport.writelines(self.out)  # a gathering write: nothing joined here
        self.out.clear()

    def fail(self, err: fr.FrameError) -> None:
        """A frame we cannot read: say why (if we can) and close after the answer is sent."""
        log.warning("closing connection from %s: %s (%s)", self.peer, err, err.code.name)
        if not self.closed:
            self.out.append(fr.encode_response(err.code, err.corr_id or 0, b"", {"error": str(err)}))
            self.flush()
            self.transport.close()
            self.closed = True

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.transport.close()
            self.closed = True

    # --- back-pressure -------------------------------------------------------------------

    def add_inflight(self, n: int) -> None:
        self.inflight += n
        if self.inflight > self._inflight_max:
            self._update_reading()

    def done_inflight(self, n: int) -> None:
        self.inflight -= n
        if self._reading_paused:
            self._update_reading()

    def _update_reading(self) -> None:
        if self.closed:
            return
        want_pause = self._write_paused or self.inflight > self._inflight_max
        if want_pause and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
        elif not want_pause and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False


def unsupported_version(conn: Connection, req: fr.Frame) -> None:
    conn.out.append(fr.encode_response(
        Code.UNSUPPORTED_VERSION, req.corr_id, b"",
        {"error": f"protocol version {req.version} is not supported",
         "supported": f"{fr.MIN_VERSION}-{fr.PROTOCOL_VERSION}"},
        min(max(req.version, fr.MIN_VERSION), fr.PROTOCOL_VERSION)))
