"""One Kafka client connection on the broker: size-prefixed frames, answers in request order.

Kafka's framing is a 4-byte signed size, then the request (its header, then its body); a
client may pipeline requests and reads the answers in the order it sent them (kafka-python
and aiokafka check the correlation ids in order), so each request takes a *slot* when it is
read and answers fill slots in any order (a Produce with acks=all waits for the replicas,
a Metadata right behind it does not); `flush` writes the filled prefix. A Produce with
acks=0 takes no slot: nothing is ever answered.

It is counted, swept (idle, late with a frame, late to authenticate) and closed by the same
broker/limits.py as a native connection, and carries the same `principal` / `auth` for the
Guard, so the ACL checks are the native ones.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from broker.connection import Closing

log = logging.getLogger(__name__)

SIZE_MIN = 8  # api_key, api_version, correlation_id: the least a request header holds


class _Partial:
    """What broker/limits.py reads of a connection's decoder: since when a frame is partial."""
    __slots__ = ("partial_since",)

    def __init__(self):
        self.partial_since: float | None = None


class KafkaConnection(asyncio.Protocol):
    def __init__(self, broker, service, admission=None):
        self.broker, self.service, self.admission = broker, service, admission
        self.frame_max = broker.config.frame_bytes_max
        self.buf = bytearray()
        self.slots: deque = deque()  # [answer parts or None], in request order
        self.decoder = _Partial()
        self.transport: asyncio.Transport | None = None
        self.peer = self.source = "?"
        self.closed = False
        self.inflight = 0
        self._inflight_max = broker.config.connection_inflight_max
        self.reading_paused = False
        self._write_paused = False
        self._held = 0  # bytes of answers made and not yet written (behind an unanswered one)
        self._unsent_max = broker.config.connection_unsent_bytes_max
        self.opened_at = self.last_active = time.monotonic()
        self.log = log
        self.principal = None  # as a native Connection's (broker/security/guard.py)
        self.member: str | None = None  # (never: Kafka clients are users)
        self.auth = None
        self.sasl: str | None = None  # the mechanism SaslHandshake chose

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.admission is not None:  # admitted at accept, before TLS (broker/listener.py)
            self.source, self.peer = self.admission.source, self.admission.peer
        self.broker.connections.add(self)
        self.service.on_connect(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = now = time.monotonic()
        buf = self.buf
        buf += data
        pos, n = 0, len(buf)
        while n - pos >= 4 and not self.closed:
            size = int.from_bytes(buf[pos:pos + 4], "big", signed=True)
            if size < SIZE_MIN or size > self.frame_max:
                self.service.refused(self, f"a request of {size} bytes (the bound is 8..frame_bytes_max="
                                           f"{self.frame_max}): closing")
                self.abort()
                return
            if n - pos - 4 < size:
                break
            frame = bytes(buf[pos + 4:pos + 4 + size])
            pos += 4 + size
            self.service.handle(self, frame)
        del buf[:pos]
        self.decoder.partial_since = None if not buf else (self.decoder.partial_since or now)
        self.flush()

    def eof_received(self) -> bool:
        self.flush()
        return False

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.slots.clear()
        self.broker.connections.discard(self)
        if self.admission is not None:
            self.broker.limits.release(self.admission)

    def pause_writing(self) -> None:
        self._pause(True)

    def resume_writing(self) -> None:
        self._pause(False)

    # --- answers -------------------------------------------------------------------------

    def slot(self) -> list:
        """The place of the next answer, in request order (fill it with `answer`)."""
        s = [None]
        self.slots.append(s)
        return s

    def answer(self, slot: list, parts: list) -> None:
        slot[0] = parts
        self._held += sum(map(len, parts))
        if self._held > self._unsent_max and not self.reading_paused:
            self._pause(None)  # answers wait behind an earlier one: read no more meanwhile

    def flush(self) -> None:
        slots = self.slots
        if self.closed or not slots or slots[0][0] is None:
            return
        out = []
        while slots and slots[0][0] is not None:
            out += slots.popleft()[0]
        self._held -= sum(map(len, out))
        self.transport.writelines(out)
        if self.reading_paused:
            self._pause(None)

    close = Closing.close
    abort = Closing.abort

    def _drop_unsent(self) -> None:
        self.slots.clear()

    # --- back-pressure (SendProcessor.put counts answers in flight) ------------------------

    def add_inflight(self, n: int) -> None:
        self.inflight += n
        if self.inflight > self._inflight_max:
            self._pause(None)

    def done_inflight(self, n: int) -> None:
        self.inflight -= n
        if self.reading_paused:
            self._pause(None)

    def _pause(self, writing: bool | None) -> None:
        if writing is not None:
            self._write_paused = writing
        if self.closed:
            return
        want = self._write_paused or self.inflight > self._inflight_max or self._held > self._unsent_max
        if want != self.reading_paused:
            (self.transport.pause_reading if want else self.transport.resume_reading)()
            self.reading_paused = want
