"""The slave's end of the HA connection (RocketMQ's HAClient): connect to the master's HA
address, HELLO with this log's epochs and end, apply the WELCOME (cut the log at the fork
point, or start over), report the end offset, then append what the master streams and report
again after each append. Any mismatch closes the connection; the next attempt begins with a
new handshake, which is how a slave resynchronizes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

from broker.client.connection import parse_bootstrap
from broker.store.commitlog import FollowerMismatch, StoreNotWritable
from broker.store.files import DiskFull
from broker.tasks import cancel_and_wait
from broker.security.tls import MemberMismatch, require_member
from replication.master_slave import wire
from replication.master_slave.ha_server import (HANDSHAKE_TIMEOUT_S, open_stream, read_handshake, set_buffer,
                                                take_over)
from replication.master_slave.slave import SlaveStream, StreamMismatch

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 2.0
RETRY_S = 0.5


class Refused(Exception):
    def __init__(self, welcome: wire.Welcome):
        self.welcome = welcome
        super().__init__(welcome.error)


class MasterLink:
    def __init__(self, driver, master: str, ha_address: str):
        self.d = driver
        self.master = master
        self.host, self.port = parse_bootstrap([ha_address])[0]
        self.writer: asyncio.StreamWriter | None = None
        self.stream: SlaveStream | None = None
        self.connected = False
        self.connected_since = 0.0
        self.last_read = 0.0
        self.last_write = 0.0
        self.reported = -1
        self.task: asyncio.Task | None = None
        self.failures = 0
        self._ended: asyncio.Future | None = None  # the streaming session's end (_on_data)

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        await cancel_and_wait(self.task)
        self._close()

    async def _run(self) -> None:
        while True:
            try:
                await self._session()
            except Refused as e:
                self.d.on_refused(self.master, e.welcome)
            except (DiskFull, StoreNotWritable) as e:  # (first: DiskFull is an OSError)
                log.error("cannot store what master %s sends (%s); retrying", self.master, e)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, wire.HAProtocolError,
                    StreamMismatch, FollowerMismatch, ValueError) as e:
                self.failures += 1
                if self.failures == 1 or self.connected or self.failures % 20 == 0:
                    log.warning("HA connection to master %s (%s:%d): %s", self.master, self.host,
                                self.port, e or type(e).__name__)
            finally:
                was = self.connected
                self._close()
                if was:
                    self.d.on_master_lost(self.master)
            await asyncio.sleep(RETRY_S)

    async def _session(self) -> None:
        d = self.d
        if d.ports.faults.blocks(self.master):
            raise ConnectionError("fault injection: traffic with the master is dropped")
        # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a stop()'s cancel that lands as
        # the connect ends, and the loop in _run would go on (broker/tasks.py)
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            reader, self.writer = await self._connect()
        self.writer.write(wire.encode_handshake(d.hello()))
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            welcome = await read_handshake(reader, wire.Welcome)
        if welcome.error is not None:
            raise Refused(welcome)
        if welcome.node != self.master:
            raise wire.HAProtocolError(f"{self.host}:{self.port} is {welcome.node}, not {self.master}")
        d.on_welcome(self.master, welcome)
        self.stream = SlaveStream(welcome.start, d.entry_bytes_max)
        self.connected, self.failures = True, 0
        self.connected_since = self.last_read = time.monotonic()
        self.report(d.durable_end(), force=True)
        # from here the master's bytes are appended in the protocol's callback, not by a task
        # woken through the stream a loop pass later (a SYNC send waits for this report)
        self._ended = asyncio.get_running_loop().create_future()
        proto = take_over(self.writer, self._on_data)
        try:
            await self._ended  # raises why the session ended
        finally:
            proto.on_data = None

    def _on_data(self, data: bytes, error: Exception | None = None) -> None:
        """Bytes from the master (b"": the connection ended, `error` why)."""
        if self._ended.done():
            return
        d = self.d
        try:
            if not data:
                raise error or ConnectionError("the master closed the connection")
            if d.ports.faults.blocks(self.master):
                raise ConnectionError("fault injection: traffic with the master is dropped")
            self.last_read = time.monotonic()
            entries = self.stream.feed(data, self.last_read)
            d.on_stream(self.stream, entries)
        except Exception as e:  # the session ends with it (_run says why)
            self._ended.set_exception(e)

    async def _connect(self):
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            set_buffer(sock, socket.SO_RCVBUF, self.d.cfg.ha_socket_buffer_bytes)  # before connect
            sock.setblocking(False)
            await asyncio.get_running_loop().sock_connect(sock, (self.host, self.port))
        except BaseException:
            sock.close()
            raise
        creds = self.d.cfg.member_credentials()
        if creds is None:
            return await open_stream(sock)
        # mutual TLS: this slave proves it is the member its HELLO names (ha_server checks), and
        # the master must prove it is the member this slave follows (any certificate the CA
        # issued for this address would pass the hostname check: nodes share hosts)
        reader, writer = await open_stream(sock, ssl=creds.ssl_context(), server_hostname=self.host,
                                           ssl_handshake_timeout=10)
        try:
            require_member(writer, self.master)
        except MemberMismatch:
            writer.transport.abort()
            raise
        return reader, writer

    def report(self, offset: int, force: bool = False) -> None:
        if self.writer is not None and self.connected and (force or offset != self.reported):
            self.writer.write(wire.encode_report(offset))
            self.reported = offset
            self.last_write = time.monotonic()

    def housekeeping(self, now: float, heartbeat_s: float, silence_s: float) -> None:
        if not self.connected:
            return
        if now - self.last_read > silence_s:
            log.warning("master %s sent nothing for %.1f s: dropping the connection", self.master,
                        now - self.last_read)
            # abort: over TLS a close would wait for the silent master's close_notify; the
            # session sees the end of the stream and starts over
            self.writer.transport.abort()
        elif now - self.last_write >= heartbeat_s:
            self.report(self.d.durable_end(), force=True)

    def _close(self) -> None:
        self.connected = False
        if self.writer is not None:
            self.writer.close()
            self.writer = None
