"""The master's end of an HA link (replication/master_slave/ha_server.py SlaveLink) against
slaves on a real loopback connection: one that goes on reporting but never acknowledges what it
was sent is cut after STALL_S (make test once saw a slave sit 20 s at a segment's end, 1 MB
behind its master, reporting the same offset every heartbeat: its silence rule counts any byte
as life, the master's any report); a slave that reads slowly through a real SlaveStream, and an
idle one whose reports stay below where the link started (a SYNC-flush slave's last fsync),
keep their links."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from broker.store.message_store import MessageStore, StoreOptions
from replication.master_slave import ha_server, wire
from replication.master_slave.slave import SlaveStream

from .storeutil import put_item

STALL_S = 0.5


def cut_for_standing_still(why) -> bool:
    """The link's own cut; any other end (the test's slave closing it) is not."""
    return isinstance(why, ConnectionError) and "stayed at offset" in str(why)


def store_with_entries(path, n: int) -> MessageStore:
    s = MessageStore(path, StoreOptions(segment_bytes=1 << 20))
    s.open()
    for i in range(n):  # an entry each (~1.1 KB)
        s.put([put_item(i, 1000)])
    return s


def run_link(tmp_path, monkeypatch, slave, for_s: float, start: int | None = 0, n: int = 300, on_report=None,
             links=None, heartbeat_ms: int = 100, batch_bytes: int = 64 << 10):
    """Serve one SlaveLink from `start` to `slave(reader, writer, end)` (a coroutine that
    returns when the connection ends or `for_s` passes); returns (why the link ended or None,
    what `slave` returned). start=None: where the log ends (nothing to send)."""
    monkeypatch.setattr(ha_server, "STALL_S", STALL_S)
    store = store_with_entries(tmp_path, n)
    end = store.commitlog.tail.offset
    start = end if start is None else start
    d = SimpleNamespace(store=store, on_report=lambda node, offset: on_report and on_report(offset),
                        confirm_for_slaves=lambda: 0,
                        epochs=SimpleNamespace(last_epoch=1),
                        cfg=SimpleNamespace(ha_transfer_batch_bytes=batch_bytes, ha_heartbeat_interval_ms=heartbeat_ms,
                                            ha_housekeeping_interval_ms=100))
    ended = []
    served = []  # the link's task

    async def on_conn(reader, writer):
        served.append(asyncio.current_task())
        link = ha_server.SlaveLink(d, "s1", reader, writer, start)
        if links is not None:
            links.append((link, store))
        try:
            await link.run()
        except Exception as e:
            ended.append(e)
        finally:
            writer.transport.abort()

    async def main():
        # the HA listener's protocol (its report callback), without the listener's admission
        no_limits = SimpleNamespace(release=lambda admission: None)
        server = await asyncio.get_running_loop().create_server(
            lambda: ha_server._HAProtocol(on_conn, no_limits, None), "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
        try:
            async with asyncio.timeout(for_s):
                return await slave(reader, writer, end)
        except TimeoutError:
            return None
        finally:
            writer.transport.abort()
            server.close()
            await asyncio.wait(served, timeout=5)  # the link sees its end (or why it cut it)

    try:
        got = asyncio.run(main())
    finally:
        store.close()
    return (ended[0] if ended else None), got


def test_a_slave_that_reports_but_acknowledges_nothing_is_cut_off(tmp_path, monkeypatch):
    async def stuck(reader, writer, end):  # reads everything, reports where it began
        writer.write(wire.encode_report(0))
        got = 0
        while True:
            try:
                async with asyncio.timeout(0.1):
                    data = await reader.read(1 << 16)
            except TimeoutError:
                data = b"-"
            except ConnectionError:  # the master aborted the link
                return got
            if not data:
                return got
            got += len(data)
            writer.write(wire.encode_report(0))

    why, got = run_link(tmp_path, monkeypatch, stuck, for_s=5.0)
    assert got and got > 0, "the master sent nothing"
    assert cut_for_standing_still(why) and "stayed at offset 0" in str(why), \
        f"the link was not cut for standing still ({STALL_S} s) within 5 s: {why!r}"


def test_a_slave_on_a_slow_link_keeps_its_link(tmp_path, monkeypatch):
    """~40 KB/s: one 64 KiB frame takes longer than STALL_S to arrive, but the entries in it
    are handed on (and reported) every handon_s (here 0.1 s; 1 s against at least 10 s in production),
    far below handon_bytes."""
    async def slow(reader, writer, end):
        s = SlaveStream(0, 1 << 20, handon_s=0.1)
        writer.write(wire.encode_report(0))
        t0 = time.monotonic()
        try:
            while s.pending_at < end and time.monotonic() - t0 < 2.5:
                data = await reader.read(2048)
                if not data:
                    break
                s.feed(data, time.monotonic())
                writer.write(wire.encode_report(s.pending_at))  # the end of its log: every whole entry
                await asyncio.sleep(0.05)
        except ConnectionError:  # the master cut the link
            pass
        return s.pending_at

    why, got = run_link(tmp_path, monkeypatch, slow, for_s=4.0)
    assert not cut_for_standing_still(why), f"a slave moving at ~40 KB/s lost its link: {why}"
    assert got and got > 64 << 10, f"it got {got} bytes: not past one frame"  # (it ends the link itself)


def test_an_idle_slave_reporting_below_the_links_start_keeps_its_link(tmp_path, monkeypatch):
    async def idle(reader, writer, end):
        writer.write(wire.encode_report(0))  # its fsync is behind its log, which ends at `end`
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:
            await asyncio.sleep(0.1)
            writer.write(wire.encode_report(0))
        return "kept"

    why, got = run_link(tmp_path, monkeypatch, idle, for_s=4.0, start=None)
    assert not cut_for_standing_still(why) and got == "kept", why


def test_reports_split_across_reads_and_many_in_one_read_are_all_taken(tmp_path, monkeypatch):
    """The link reads the slave's reports in its protocol's callback: a report that arrives a
    few bytes at a time counts once whole, of several in one read the last counts, and the
    master pushes what follows them at once (SlaveLink.poke)."""
    reported = []

    async def choppy(reader, writer, end):
        writer.write(wire.encode_report(0))
        got = 0
        while got < end:
            data = await reader.read(1 << 16)
            if not data:
                break
            got += len(data)
        # 3 reports, the middle one split over three writes; then 2 in one write
        r = wire.encode_report
        for part in (r(1000)[:3], r(1000)[3:] + r(2000)[:5], r(2000)[5:]):
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(r(3000) + r(end))
        await asyncio.sleep(0.3)
        return end if got > end else None  # (what it read: the log and the frames' headers)

    why, got = run_link(tmp_path, monkeypatch, choppy, for_s=4.0, on_report=reported.append)
    assert not cut_for_standing_still(why), why
    assert got, "the master did not push the whole log"
    assert reported[0] == 0 and reported[1:] == [1000, 2000, got], reported


def test_a_report_past_the_log_end_or_the_slave_closing_ends_the_link(tmp_path, monkeypatch):
    async def liar(reader, writer, end):
        writer.write(wire.encode_report(0))
        await asyncio.sleep(0.1)
        writer.write(wire.encode_report(end + 1))
        await asyncio.sleep(0.5)
        return "sent"

    why, _ = run_link(tmp_path, monkeypatch, liar, for_s=3.0)
    assert isinstance(why, wire.HAProtocolError) and "past this log's end" in str(why), repr(why)

    async def leaver(reader, writer, end):
        writer.write(wire.encode_report(0))
        await asyncio.sleep(0.1)
        writer.close()
        await asyncio.sleep(0.5)
        return "closed"

    why, got = run_link(tmp_path, monkeypatch, leaver, for_s=3.0)
    # (the end of the stream, or the reset that the master's next write met: its own reason)
    assert got == "closed" and isinstance(why, ConnectionError), repr(why)


async def caught_up(reader, writer, end, links):
    """A slave reads the whole log; returns once the master's pump has sent it all and waits:
    (its SlaveStream, the master's SlaveLink, the master's store)."""
    writer.write(wire.encode_report(0))
    s = SlaveStream(0, 1 << 20)
    while s.pending_at < end:
        s.feed(await reader.read(1 << 16), time.monotonic())
    link, store = links[0]
    while not link.idle:
        await asyncio.sleep(0.01)
    return s, link, store


def test_new_entries_leave_from_the_append_when_the_pump_is_idle(tmp_path, monkeypatch):
    """poke() (the master's append calls it through HAServer.wake_all) writes what is new in
    the same call when the pump waits for news, not a loop pass later; the slave gets it."""
    links = []
    seen = {}

    async def reader_of_all(reader, writer, end):
        s, link, store = await caught_up(reader, writer, end, links)
        store.put([put_item(10_000, 1000)])
        new_end = store.commitlog.tail.offset
        link.poke()  # no await between: the write happened here or not at all
        seen["next"], seen["new_end"] = link.next, new_end
        while s.pending_at < new_end:
            data = await reader.read(1 << 16)
            if not data:
                break
            s.feed(data, time.monotonic())
        return s.pending_at

    why, got = run_link(tmp_path, monkeypatch, reader_of_all, for_s=4.0, n=20, links=links)
    assert seen and seen["next"] == seen["new_end"], f"poke() left the new entry to the pump: {seen}"
    assert got == seen["new_end"], (got, seen)


def test_more_new_log_than_one_write_call_reaches_the_slave_before_a_heartbeat(tmp_path, monkeypatch):
    """An append of more than DRAIN_BYTES_MAX: poke() writes one call's worth and wakes the
    pump for the rest, which would otherwise wait for the pump's heartbeat timeout (here 5 s)
    -- and a SYNC send for the slave's report of it."""
    monkeypatch.setattr(ha_server, "DRAIN_BYTES_MAX", 4 << 10)
    links = []

    async def reader_of_all(reader, writer, end):
        s, link, store = await caught_up(reader, writer, end, links)
        for i in range(20):  # ~22 KB: five calls' worth
            store.put([put_item(10_000 + i, 1000)])
        new_end = store.commitlog.tail.offset
        link.poke()
        t0 = time.monotonic()
        while s.pending_at < new_end and time.monotonic() - t0 < 2.0:
            try:
                async with asyncio.timeout(0.1):
                    data = await reader.read(1 << 16)
            except TimeoutError:
                continue
            if not data:
                break
            s.feed(data, time.monotonic())
        return s.pending_at, new_end

    why, got = run_link(tmp_path, monkeypatch, reader_of_all, for_s=6.0, n=20, links=links, heartbeat_ms=5000,
                        batch_bytes=2 << 10)  # frames of 2 KiB: a call writes two
    assert got is not None and got[0] == got[1], f"the slave got to {got} within 2 s (a heartbeat is 5 s): {why!r}"
