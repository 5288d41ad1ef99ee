"""ClientConnection.request(on_done=...): the hook runs in the same loop pass as the answer
(or the loss, or the timeout) -- a done-callback would run a pass later, and at W=1 each pass
is a poll and ~10 us of loop per round trip -- exactly once, with the future settled."""

import asyncio

import uvloop

from broker.client.connection import ClientConnection
from broker.client.errors import ConnectionLost, NotSent, RequestTimeout
from broker.protocol import frame as fr
from broker.protocol.codes import Code, Req


class Transport:
    def __init__(self):
        self.written = []

    def writelines(self, parts):
        self.written.append(b"".join(parts))

    def get_write_buffer_size(self):
        return 0

    def close(self):
        pass

    def abort(self):
        pass


def connection() -> ClientConnection:
    c = ClientConnection(fr.FRAME_BYTES_MAX_DEFAULT)
    c.connection_made(Transport())
    c.address = "test:1"
    return c


def test_the_hook_runs_in_the_pass_the_answer_arrives():
    async def run():
        c = connection()
        seen = []
        fut = c.request(Req.SEND, b"x", 5.0, on_done=lambda f: seen.append(f.result().code), flush=False)
        assert not c.transport.written  # flush=False: the caller flushes
        c.flush()
        assert len(c.transport.written) == 1
        c.data_received(fr.encode_response(Code.SUCCESS, 1, b"ok"))
        assert seen == [Code.SUCCESS] and fut.done()  # no loop pass in between
        c.data_received(fr.encode_response(Code.SUCCESS, 1, b"again"))  # a stray duplicate
        assert seen == [Code.SUCCESS]
    uvloop.run(run())


def test_the_hook_gets_a_loss_a_timeout_and_a_closed_connection():
    async def run():
        c = connection()
        got = {}
        hook = lambda name: (lambda f: got.setdefault(name, []).append(type(f.exception())))
        c.request(Req.SEND, b"a", 5.0, on_done=hook("lost"))
        c._flush()  # written: its outcome is unknown when the connection goes
        c.request(Req.SEND, b"b", 5.0, on_done=hook("unsent"), flush=False)
        c.connection_lost(None)
        assert got == {"lost": [ConnectionLost], "unsent": [NotSent]}
        c.request(Req.SEND, b"c", 5.0, on_done=hook("closed"))
        assert got["closed"] == [NotSent]  # at once: nothing was sent

        t = connection()
        t.request(Req.SEND, b"d", 0.01, on_done=hook("late"))
        await asyncio.sleep(0.2)  # the sweep expires it
        assert got["late"] == [RequestTimeout]
        t.data_received(fr.encode_response(Code.SUCCESS, 1, b""))  # too late: nothing more
        assert got["late"] == [RequestTimeout]
    uvloop.run(run())
