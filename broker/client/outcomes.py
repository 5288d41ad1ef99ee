"""What the producer tells each message (broker/client/producer.py): its SendResult, one
attempt's meaning, the send's `stored` (settle), the errors a batch's futures get, and
ProducerBufferFull (the buffer_bytes_max bound). No sockets, no tasks: they only set futures."""

from __future__ import annotations

import asyncio
import itertools
import os
import struct
import time
from typing import NamedTuple

from broker.client.accumulator import Batch
from broker.client.errors import ConnectError, NotSent, SendError, TidelogError
from broker.protocol import frame as fr
from broker.protocol import send as sp
from broker.protocol.codes import NOT_STORED, STORED_NOT_CONFIRMED, BadRequest, Code, Req

# What one attempt says about the message (attempt_said, code_said); settle() turns the
# attempts of one send into the `stored` its SendError reports.
NOT_STORED_SAID = "not stored"
UNKNOWN = "unknown"
STORED = "stored"


class SendResult(NamedTuple):
    msg_id: str  # 32 hex characters
    topic: str
    queue_id: int
    queue_offset: int
    phys_offset: int
    index: int
    store_ts_ms: int
    attempts: int = 1
    possible_duplicate: bool = False  # an earlier attempt's outcome was unknown
    broker_name: str | None = None  # the group that stored it (ClusterProducer; None: one group)


class MessageIds:
    """Unique 16-byte ids: 8 random bytes per producer + a counter."""

    def __init__(self):
        self._prefix = os.urandom(8)
        self._count = itertools.count(int(time.time() * 1000) << 16)
        self._pack = struct.Struct(">Q").pack

    def next(self) -> bytes:
        return self._prefix + self._pack(next(self._count) & 0xFFFFFFFFFFFFFFFF)


class Handed(NamedTuple):
    """A message handed over to the producer, waiting for (or travelling in) its batch."""
    fut: asyncio.Future
    msg_id: bytes
    flags: int
    props: bytes
    body: bytes


class ProducerBufferFull(SendError):
    """The messages handed over and not yet answered hold `buffer_bytes_max` bytes: this one
    was refused (send_nowait: at once; send_async: after waiting send_timeout_ms for room).
    Code SYSTEM_BUSY, stored=False: nothing was sent."""

    def __init__(self, message: str):
        super().__init__(Code.SYSTEM_BUSY, message, stored=False, attempts=0)


def attempt_said(e: Exception, sent: bool) -> str:
    """An attempt that ended in a client-side error. Before the request was handed to a
    connection (route lookup, connect), or NotSent (lost before it was written): nothing was
    stored. After (a timeout, a connection lost once it was written): unknown."""
    if not sent or isinstance(e, (NotSent, ConnectError)):
        return NOT_STORED_SAID
    return UNKNOWN


def code_said(code: int) -> str:
    """An attempt the broker answered with `code` (not SUCCESS)."""
    if code in STORED_NOT_CONFIRMED:
        return STORED
    if code in NOT_STORED:
        return NOT_STORED_SAID
    return UNKNOWN  # OUTCOME_UNKNOWN, SYSTEM_ERROR, a code this client does not know


def settle(said) -> bool | None:
    """The send's `stored`: True if any attempt stored it, False only if every attempt
    certainly did not, else None (unknown)."""
    if STORED in said:
        return True
    if UNKNOWN in said:
        return None
    return False


def closed_error(stored: bool | None = False, attempts: int = 0) -> SendError:
    """A message the closed producer will not send (again): stored as its attempts say."""
    why = ("nothing was stored" if stored is False else
           "an attempt was written before: outcome unknown (may be stored)" if stored is None else
           "an attempt stored it")
    return SendError(Code.NOT_CONNECTED, f"the producer was closed; no retry is sent: {why}",
                     stored=stored, attempts=attempts)


def bug_error(e: BaseException, stored: bool | None) -> SendError:
    """What a message gets when the producer itself failed (a bug): never a bare exception
    escaping into a task nobody awaits."""
    err = SendError(Code.SYSTEM_ERROR, f"the producer failed ({type(e).__name__}: {e}): "
                    + ("nothing was sent" if stored is False else "outcome unknown (may be stored)"),
                    stored=stored)
    err.__cause__ = e
    return err


def fail(items: list, e: BaseException) -> None:
    """Every message of a batch ends with `e`: one exception object per future (one object
    raised from many awaits would pile up their tracebacks), each SendError with its own
    message's `result` when the answer carried the batch's."""
    for i, h in enumerate(items):
        if h.fut.done():
            continue  # cancelled after it was sent: the others still get their outcome
        if isinstance(e, asyncio.CancelledError):
            h.fut.cancel()
        elif len(items) == 1 or not isinstance(e, TidelogError):
            h.fut.set_exception(e)
        else:
            h.fut.set_exception(_copy(e, i))


def _copy(e: TidelogError, i: int) -> TidelogError:
    c = BaseException.__new__(type(e))  # the same class: a SendConnectError stays a ConnectError
    c.__dict__.update(e.__dict__)
    c.args = e.args
    r = getattr(e, "result", None)
    if isinstance(r, sp.SendBatchResponse):  # stored, not confirmed: where this one is
        c.result = sp.SendResponse(r.queue_id, r.first_queue_offset + i, r.phys_offsets[i],
                                   sp.indexes(r.first_index, r.phys_offsets)[i], r.store_ts_ms)
    return c


def resolve(b: Batch, code: int, f: fr.Frame, attempts: int, unknown: bool) -> None:
    """A SUCCESS answer: each message's own result, at its place in the batch."""
    topic, items = b.topic, b.items
    try:
        if code == Req.SEND:
            h = items[0]
            if not h.fut.done():
                h.fut.set_result(SendResult(h.msg_id.hex(), topic, *sp.decode_response(f.body),
                                            attempts, unknown))
            return
        qid, offset, index, ts, phys = sp.decode_batch_response(f.body)
        if len(phys) != len(items):
            raise BadRequest(f"SEND_BATCH answer for {len(phys)} messages, {len(items)} were sent")
    except BadRequest as e:
        return fail(items, SendError(Code.SYSTEM_ERROR, f"outcome unknown (may be stored): {e}",
                                     stored=None, attempts=attempts))
    indexes = sp.indexes(index, phys)
    new = tuple.__new__  # SendResult's own __new__ is a Python function: this runs per message
    for i, h in enumerate(items):
        if not h.fut.done():
            h.fut.set_result(new(SendResult, (h.msg_id.hex(), topic, qid, offset + i, phys[i], indexes[i],
                                              ts, attempts, unknown, None)))
