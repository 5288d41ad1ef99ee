"""bench/hop_floor.py's client: a leader that goes away fails what waits for it, so the row
ends (with errors) instead of hanging `make bench` on a future nobody will answer."""

import asyncio

import pytest
import uvloop

from bench.hop_floor import Client


def test_a_lost_connection_fails_the_sends_waiting_on_it():
    async def scenario():
        accepted = asyncio.Event()
        held = []

        def on_connect(reader, writer):
            held.append(writer)
            accepted.set()
        server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = Client()
        await client.connect(port)
        await accepted.wait()
        fut = client.send(b"x" * 1024)  # never answered
        held[0].close()  # the "leader" dies
        with pytest.raises(ConnectionError, match="closed the connection"):
            await asyncio.wait_for(fut, 10)
        with pytest.raises(ConnectionError, match="no connection"):  # and what is sent after it
            await asyncio.wait_for(client.send(b"y"), 10)
        client.transport.close()
        server.close()
        await server.wait_closed()

    uvloop.run(scenario())
