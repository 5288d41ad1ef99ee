"""The master's end of an HA link (replication/master_slave/ha_server.py SlaveLink) against a
slave that goes on reporting but never acknowledges what it was sent: the link is cut after
STALL_S (make test once saw a slave sit 20 s at a segment's end, 1 MB behind its master,
reporting the same offset every heartbeat: its silence rule counts any byte as life, the
master's counts any report), and a slave that acknowledges keeps its link."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from broker.store.message_store import MessageStore, StoreOptions
from replication.master_slave import ha_server, wire

from .storeutil import put_item


def store_with_entries(path, n: int) -> MessageStore:
    s = MessageStore(path, StoreOptions(segment_bytes=1 << 20))
    s.open()
    s.put([put_item(i, 1000) for i in range(n)])
    return s


async def serve_one(store, on_report):
    """A SlaveLink over a real loopback connection; returns (link task, slave reader, writer)."""
    d = SimpleNamespace(store=store, node=None, on_report=on_report, confirm_for_slaves=lambda: 0,
                        epochs=SimpleNamespace(last_epoch=1),
                        cfg=SimpleNamespace(ha_transfer_batch_bytes=64 << 10, ha_heartbeat_interval_ms=100))
    links = []

    async def on_conn(reader, writer):
        link = ha_server.SlaveLink(d, "s1", reader, writer, 0)
        links.append(link)
        try:
            await link.run()
        finally:
            writer.transport.abort()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(wire.encode_report(0))
    while not links:
        await asyncio.sleep(0.01)
    return server, links[0], reader, writer


def run_slave(tmp_path, monkeypatch, acknowledges: bool, for_s: float):
    monkeypatch.setattr(ha_server, "STALL_S", 0.5)
    store = store_with_entries(tmp_path, 300)  # ~300 KB: several transfers
    end = store.commitlog.tail.offset

    async def main():
        server, link, reader, writer = await serve_one(store, lambda node, offset: None)
        got = 0
        t0 = time.monotonic()
        ended = None
        try:
            while time.monotonic() - t0 < for_s:
                try:
                    async with asyncio.timeout(0.1):
                        data = await reader.read(1 << 16)
                except TimeoutError:
                    data = b"-"
                except ConnectionError as e:
                    ended = e
                    break
                if not data:
                    ended = "closed"
                    break
                if data != b"-":
                    got += len(data)
                # a slave that holds every byte sent (acknowledges) or none of them (is stuck)
                writer.write(wire.encode_report(min(end, link.next) if acknowledges else 0))
        finally:
            writer.transport.abort()
            server.close()
        return ended, got

    try:
        return asyncio.run(main())
    finally:
        store.close()


def test_a_slave_that_reports_but_acknowledges_nothing_is_cut_off(tmp_path, monkeypatch):
    ended, got = run_slave(tmp_path, monkeypatch, acknowledges=False, for_s=5.0)
    assert got > 0, "the master sent nothing"
    assert ended is not None, "the master kept a link that moved no log for 5 s (STALL_S is 0.5 s)"


def test_a_slave_that_acknowledges_keeps_its_link(tmp_path, monkeypatch):
    ended, got = run_slave(tmp_path, monkeypatch, acknowledges=True, for_s=2.0)
    assert ended is None, f"a slave acknowledging everything lost its link: {ended}"
    assert got > 300_000
