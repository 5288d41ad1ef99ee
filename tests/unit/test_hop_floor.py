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


def test_the_model_knob_parses_its_points_and_names_what_is_wrong():
    from bench.hop_floor import WORK_POINTS, parse_work
    assert parse_work(None) == {} and parse_work("") == {} and parse_work(" , ") == {}
    assert parse_work("leader_send=135, follower_after=0,client=7.5") == \
        {"leader_send": 135.0, "follower_after": 0.0, "client": 7.5}
    assert set(parse_work(",".join(f"{k}=1" for k in WORK_POINTS))) == set(WORK_POINTS)
    for bad, says in [("leader=5", "'leader' is not a work point; the points: client, leader_send"),
                      ("client", "'client' needs name=µs"), ("client=x", "'client=x' needs name=µs"),
                      ("client=-1", "'client=-1' needs"), ("client=nan", "needs"), ("client=1e9", "needs")]:
        with pytest.raises(ValueError, match=says):
            parse_work(bad)


def test_spin_burns_at_least_the_cpu_time_asked_for():
    import time
    from bench.hop_floor import spin
    for us in (0, 500, 3000):
        t0 = time.thread_time()
        spin(us)
        used = (time.thread_time() - t0) * 1e6
        assert used >= us and (us or used < 200), (us, used)
