"""One client connection on the broker: framing, write coalescing and back-pressure.

The transport reads straight into the connection's reused frame buffer (BufferedProtocol),
so a read costs no allocation. Every response produced while handling one read (or one flush completion) goes out in a
single write. A connection stops reading while it has more than `connection_inflight_max`
requests waiting (sync flush, long polling) or while its socket's send buffer is full, so a
fast producer cannot make the broker buffer without bound.

Answers are bounded too (issue 14): a 44-byte PULL may be answered with 1 MiB, so the frames
of one read go to the broker a few big-answer requests at a time (FRAME_BUDGET), and once
the answers not yet sent pass `connection_unsent_bytes_max` and the socket is full, the rest
wait in the read buffer, reading stops, and handling goes on from there when the socket
drains (resume_writing). Connections are counted and refused by broker/limits.py, which
also closes those that are idle, late with a frame or late to authenticate.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

from broker.protocol import frame as fr
from broker.protocol.codes import Code, Req

log = logging.getLogger(__name__)

# Frames handed to Broker.handle at once: up to FRAME_BUDGET cheap ones (sends, oneway: small
# answers, and sends are stored as one batch), ending at the first other one (a PULL's answer
# may be pull_bytes_max); the unsent bytes are checked between them, so they pass
# connection_unsent_bytes_max by one answer at most.
FRAME_BUDGET = 4096
COSTLY_FRAME_COST = FRAME_BUDGET
CHEAP_CODES = frozenset({Req.SEND, Req.SEND_BATCH, Req.SEND_ZONE})


CLOSE_GRACE_S = 5.0  # close(): how long unsent answers may wait for a peer that does not read


class Closing:
    """How a client connection of either protocol (this one, broker/kafka/connection.py) ends:
    needs `closed`, `transport`, `flush()` and `_drop_unsent()`."""

    def close(self) -> None:
        """Close once what is answered is sent -- or after CLOSE_GRACE_S anyway: a peer that does
        not read must not keep its slot and its unsent bytes for ever."""
        if not self.closed:
            self.flush()
            self.transport.close()
            self.closed = True
            if self.transport.get_write_buffer_size():
                asyncio.get_running_loop().call_later(CLOSE_GRACE_S, self.transport.abort)

    def abort(self) -> None:
        """Close at once, dropping unsent answers: for a peer that breaks a bound (it may not
        be reading, and close() would wait for it to)."""
        if not self.closed:
            self._drop_unsent()
            self.transport.abort()
            self.closed = True


class Connection(asyncio.BufferedProtocol):
    def __init__(self, broker, admission=None):
        self.broker = broker
        # what broker/limits.py counted for this connection: the listener's Admission (taken at
        # accept), or the connection itself when it admits on connection_made
        self.admission = admission
        self.decoder = fr.FrameReader(broker.config.frame_bytes_max, initial=fr.READ_MIN,
                                      cheap_codes=CHEAP_CODES, costly=COSTLY_FRAME_COST)
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.source = "?"  # the peer's address without the port: what per-source limits count
        self.out: list[bytes] = []
        self._out_counted = 0  # out[:_out_counted] is _out_bytes long (see unsent_bytes)
        self._out_bytes = 0
        self.closed = False
        self.inflight = 0
        self._inflight_max = broker.config.connection_inflight_max
        self._unsent_max = broker.config.connection_unsent_bytes_max
        self._write_paused = False
        self._reading_paused = False
        self._paused_at = 0.0
        self._held = False  # whole frames wait in the read buffer until the socket drains
        self.opened_at = self.last_active = time.monotonic()
        self.log = log
        # who is on the other end (broker/security/): the user a SCRAM exchange proved, or the
        # group member whose certificate the TLS handshake verified; None: not authenticated
        self.principal = None
        self.member: str | None = None
        self.auth = None  # a SCRAM exchange in progress

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        adm = self.admission
        if adm is not None:  # admitted at accept, before TLS (broker/listener.py)
            self.source, self.peer = adm.source, adm.peer
        else:
            peer = transport.get_extra_info("peername")
            if peer:
                self.source, self.peer = str(peer[0]), f"{peer[0]}:{peer[1]}"
            if self.broker.limits.admit(self) is not None:  # refused (limits logs it, rate-limited)
                self.closed = True
                transport.abort()
                return
            self.admission = self
        self.broker.connections.add(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.decoder.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        """Frames are handled before returning (their bodies live in the read buffer), unless
        the answers pile up: then reading stops and resume_writing goes on."""
        self.last_active = now = time.monotonic()
        self.decoder.fill(nbytes, now)
        self._handle_frames()

    def _handle_frames(self) -> None:
        dec = self.decoder
        while True:
            frames = dec.frames(FRAME_BUDGET)
            if frames:
                self.broker.handle(self, frames)
            if dec.error is not None:
                self.fail(dec.error)
                return
            if not dec.more or self.closed:
                break
            if self.unsent_bytes() > self._unsent_max:
                self.flush()
                if self._write_paused:  # the socket is full too: wait for resume_writing
                    self._held = True
                    self._update_reading()
                    return
        self._held = False
        self.flush()

    def unsent_bytes(self) -> int:
        """Answers produced and not yet taken by the kernel."""
        out = self.out
        if self._out_counted < len(out):
            self._out_bytes += sum(map(len, itertools.islice(out, self._out_counted, None)))
            self._out_counted = len(out)
        return self._out_bytes + self.transport.get_write_buffer_size()

    def eof_received(self) -> bool:
        err = self.decoder.eof_error()
        if err is not None:
            self.fail(err)
        self.flush()
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.out.clear()
        self.decoder.lane = None  # (it refers back to this connection)
        self.broker.connections.discard(self)
        if self.admission is not None:
            self.broker.limits.release(self.admission)

    def pause_writing(self) -> None:
        self._write_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._held and not self.closed:
            self._handle_frames()
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
        self._out_counted = self._out_bytes = 0

    def fail(self, err: fr.FrameError) -> None:
        """A frame we cannot read: say why (if we can) and close after the answer is sent."""
        log.warning("closing connection from %s: %s (%s)", self.peer, err, err.code.name)
        if not self.closed:
            self.out.append(fr.encode_response(err.code, err.corr_id or 0, b"", {"error": str(err)}))
            self.close()

    close = Closing.close
    abort = Closing.abort

    def _drop_unsent(self) -> None:
        self.out.clear()

    @property
    def reading_paused(self) -> bool:
        return self._reading_paused

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
        want_pause = self._write_paused or self.inflight > self._inflight_max or self._held
        if want_pause and not self._reading_paused:
            self.transport.pause_reading()
            self._reading_paused = True
            self._paused_at = time.monotonic()
        elif not want_pause and self._reading_paused:
            self.transport.resume_reading()
            self._reading_paused = False
            self.decoder.postpone(time.monotonic() - self._paused_at)  # our pause, not its lateness


def unsupported_version(conn: Connection, req: fr.Frame) -> None:
    conn.out.append(fr.encode_response(
        Code.UNSUPPORTED_VERSION, req.corr_id, b"",
        {"error": f"protocol version {req.version} is not supported",
         "supported": f"{fr.MIN_VERSION}-{fr.PROTOCOL_VERSION}"},
        min(max(req.version, fr.MIN_VERSION), fr.PROTOCOL_VERSION)))
