"""Stopping a task stops it. On Python 3.11, asyncio.wait_for swallows a cancel that lands
just as what it waits for completes: it returns that result, or raises that error, instead of
CancelledError (CPython gh-86296, rewritten in 3.12). A retry loop around it that catches the
error outlives `task.cancel()`, and the `await` that stops it waits forever. It froze a
master-slave failover: a slave told to follow the promoted node stopped its link to the dead
master, the link's connect had just been refused, the stop never returned, the slave held the
role lock with the new epoch recorded in memory only, the promotion timed out on it, and the
restarted old master followed the node that never led (seen in make test's drills)."""

from __future__ import annotations

import asyncio
import random
import socket
from types import SimpleNamespace

import pytest

from replication.master_slave import ha_client
from replication.master_slave.ha_client import MasterLink


def closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens: every connect is refused at once
    return port


def fake_driver():
    cfg = SimpleNamespace(ha_socket_buffer_bytes=1 << 16, member_credentials=lambda: None)
    faults = SimpleNamespace(blocks=lambda node: False)
    return SimpleNamespace(cfg=cfg, ports=SimpleNamespace(faults=faults), on_master_lost=lambda m: None,
                           on_refused=lambda m, w: None)


def test_a_link_stops_whenever_it_is_stopped_while_its_connects_are_refused(monkeypatch, seed):
    monkeypatch.setattr(ha_client, "RETRY_S", 0)  # reconnect at once: a stop lands anywhere in the loop
    rng = random.Random(seed)
    port = closed_port()

    async def main() -> list[int]:
        hung = []
        for i in range(300):
            link = MasterLink(fake_driver(), "m", f"127.0.0.1:{port}")
            link.start()
            for _ in range(rng.randrange(40)):
                await asyncio.sleep(0)
            stopping = asyncio.ensure_future(link.stop())
            done, _ = await asyncio.wait({stopping}, timeout=2)
            if not done:
                hung.append(i)
                for _ in range(200):  # end it for the next round (a cancel may be swallowed again)
                    link.task.cancel()
                    if (await asyncio.wait({stopping}, timeout=0.01))[0]:
                        break
        return hung

    hung = asyncio.run(main())
    assert not hung, f"stop() never returned for {len(hung)} of 300 links (first at {hung[:5]})"


def test_cancel_and_wait_ends_a_loop_that_swallows_its_cancels(monkeypatch):
    """broker.tasks.cancel_and_wait against a retry loop whose wait_for waits on something that
    fails at once (3.11 swallows most cancels there): a cancel again ends it at its sleep.
    Only one of the loop's four suspension points lets a cancel through, so each cancel fails
    with odds 3/4 and the count of cancels it takes is random: a loop counts as left running
    only after 60 s (thousands of cancels), never after a short time a loaded CI box can
    spend descheduled (CI once saw 1 of 20 "left running" at 2 s and 50 ms per cancel)."""
    from broker import tasks
    from broker.tasks import cancel_and_wait

    monkeypatch.setattr(tasks, "RECANCEL_S", 0.005)

    async def refused():
        raise ConnectionRefusedError

    async def stubborn():
        while True:
            try:
                await asyncio.wait_for(refused(), 5)
            except OSError:
                pass
            await asyncio.sleep(0)  # the retry's pause

    async def main() -> tuple[int, int]:
        plain = ours = 0
        for i in range(20):
            for use_ours in (False, True):
                t = asyncio.ensure_future(stubborn())
                for _ in range(i % 5):
                    await asyncio.sleep(0)
                if use_ours:
                    stopping = asyncio.ensure_future(cancel_and_wait(t, None))
                else:
                    t.cancel()
                    stopping = asyncio.ensure_future(asyncio.gather(t, return_exceptions=True))
                done, _ = await asyncio.wait({stopping}, timeout=60 if use_ours else 0.1)
                if done:
                    if use_ours:
                        ours += 1
                    else:
                        plain += 1
                else:
                    await cancel_and_wait(t)
                    stopping.cancel()
        return plain, ours

    plain, ours = asyncio.run(main())
    assert ours == 20, f"cancel_and_wait left {20 - ours} of 20 loops running"
    assert plain < 20, "a plain cancel stopped every loop: the 3.11 behaviour this guards against is gone"


def test_the_servers_and_clients_never_wait_with_wait_for():
    """asyncio.timeout runs in the caller's task and lets a cancel through; broker/tasks.py."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = [f"{p.relative_to(root)}:{n}" for pkg in ("broker", "replication", "ops")
             for p in sorted((root / pkg).rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if "asyncio.wait_for(" in line and not line.lstrip().startswith("#")]
    assert not found, found


def test_a_master_slave_driver_starts_no_job_while_it_stops():
    """Its server serves until stop() reaches server.stop(): a master's refusal heard then
    (on_refused: "follow h3") spawned a switch that ran on after stop() returned -- a stopped
    broker that still changes its role. stop() now makes spawn start nothing."""
    from broker.tasks import cancel_and_wait
    from replication.master_slave import driver as ms_driver

    async def main():
        d = ms_driver.MasterSlaveDriver.__new__(ms_driver.MasterSlaveDriver)  # the parts stop() uses
        d._ticker, d._jobs, d._stopping, d.link = None, {}, False, None
        d.me, d.addresses = "h1", {"h1": "a:1", "h2": "a:2", "h3": "a:3"}
        d.node = SimpleNamespace(mcore=None)
        d.peers = SimpleNamespace(close=lambda: None)
        switches = []

        async def switch_master(master):
            switches.append(master)
            await asyncio.sleep(3600)
        d._switch_master = switch_master

        async def server_stop():  # the refusal arrives while the server closes
            d.on_refused("h2", SimpleNamespace(error="not the master", master="h3"))
            await asyncio.sleep(0)
        d.server = SimpleNamespace(stop=server_stop)

        d.spawn("probe", asyncio.sleep(3600))  # a job running before the stop is cancelled by it
        await d.stop()
        await asyncio.sleep(0.01)  # a job spawned in the stop would have started by now
        left = [name for name, t in d._jobs.items() if not t.done()]
        await cancel_and_wait(*d._jobs.values())
        return left, switches

    left, switches = asyncio.run(main())
    assert not left and not switches, f"jobs left running after stop(): {left}; switches started: {switches}"
