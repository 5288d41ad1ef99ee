"""The master's end of the HA connections (RocketMQ's AcceptSocketService + HAConnection):
every node listens on its HA address; a master answers a slave's HELLO with a WELCOME that
says where the slave's log agrees with its own (epochs.sync_plan), then streams its CommitLog
from there in TRANSFER frames of at most `ha_transfer_batch_bytes`, and reads the slave's
8-byte offset reports. A node that is not the master refuses, naming the master it knows.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from types import SimpleNamespace

from broker.limits import ConnectionLimits
from broker.listener import Listener
from broker.security.tls import member_server_context, peer_member
from broker.tasks import cancel_and_wait
from replication.master_slave import wire
from replication.master_slave.epochs import EpochList

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
WRITE_BUFFER_HIGH = 512 << 10  # bytes queued on a slave's socket before the pump waits
DRAIN_BYTES_MAX = 1 << 20  # log bytes written to a slave's socket before the pump drains (and yields)
# a slave that goes on reporting but has acknowledged none of the bytes this link sent it for
# this long (or ha_housekeeping_interval_ms, if longer) is cut off; it reconnects and resumes from
# its log's end. (make test once saw a slave sit 20 s at a segment's end, 1 MB behind, reporting
# the same offset: a link that moves no log is no link.) The slave hands its whole entries on at
# each frame's end, every 256 KiB and every second (slave.HANDON_BYTES, HANDON_S), so a slow link
# moves its reports too -- unless one entry (a store batch: up to ~1 MiB) takes this long to
# arrive (under ~100 KB/s at 10 s, ~50 KB/s at the default 20 s): then it is cut each time.
STALL_S = 10.0


async def read_handshake(reader: asyncio.StreamReader, cls):
    head = await reader.readexactly(4)
    n = int.from_bytes(head, "big")
    if n > wire.HANDSHAKE_BYTES_MAX:
        raise wire.HAProtocolError(f"handshake of {n} bytes exceeds {wire.HANDSHAKE_BYTES_MAX}")
    msg, _ = wire.decode_handshake(head + await reader.readexactly(n), cls)
    return msg


def set_buffer(sock, option: int, size: int | None) -> None:
    """Bound a socket's kernel buffer (ha_socket_buffer_bytes), else leave it autotuned."""
    if size is not None and sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, option, size)


class SlaveLink:
    """One connected slave: its pump (CommitLog -> socket) and its reports (socket -> core)."""

    def __init__(self, driver, node: str, reader, writer, start: int):
        self.d = driver
        self.node = node
        self.reader, self.writer = reader, writer
        self.next = start  # the next CommitLog offset to send
        self.wake = asyncio.Event()
        self.sent_confirm = -1
        self.last_write = 0.0
        self.closed = False
        self.bytes_sent = 0
        self.start = start
        self.acked, self.acked_at = start, time.monotonic()  # the slave's last new report, and when
        self.stall_s = max(STALL_S, driver.cfg.ha_housekeeping_interval_ms / 1000)
        self.idle = False  # the pump waits for news: poke() may write in its place
        self._ended: asyncio.Future | None = None  # why the link ended (run, _on_reports)
        self._reports = b""  # the part of a report that has arrived

    async def run(self) -> None:
        first = await self.reader.readexactly(8)
        self.acked = wire.decode_report(first)  # range-checked (OFFSET_MAX)
        self.d.on_report(self.node, self.acked)
        self.writer.transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        # from here the slave's reports are read in the protocol's callback, not by a task
        # woken through the stream a loop pass later (a SYNC send waits for its report)
        self._ended = asyncio.get_running_loop().create_future()
        proto = take_over(self.writer, self._on_reports)
        pump = asyncio.ensure_future(self._pump())
        try:
            done, _ = await asyncio.wait({pump, self._ended}, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                t.result()  # why the link ended (a slave that went away, a log it cannot follow)
        finally:
            proto.on_data = None
            if not self._ended.cancel():
                self._ended.exception()  # (retrieved: the pump's end came first)
            await cancel_and_wait(pump)

    def _on_reports(self, data: bytes, error: Exception | None = None) -> None:
        """Bytes from the slave (b"": the connection ended, `error` why): its 8-byte offset reports."""
        if self._ended.done():
            return
        try:
            if not data:
                raise error or ConnectionError("the slave closed the connection")
            size = wire.REPORT.size
            buf = self._reports + data if self._reports else data
            whole = len(buf) - len(buf) % size
            self._reports = buf[whole:]
            if whole:
                offset = wire.decode_report(buf, whole - size)
                if offset > self.d.store.commitlog.tail.offset:
                    raise wire.HAProtocolError(f"slave reports offset {offset}, past this log's end "
                                               f"{self.d.store.commitlog.tail.offset}")
                self.d.on_report(self.node, offset)
                self._check_moving(offset)
        except Exception as e:  # the link ends with it (run)
            self._ended.set_exception(e)

    def _check_moving(self, offset: int) -> None:
        """Cut a link on which the slave's reports stand still while bytes this link wrote
        wait for them (a report below `start` on an idle link -- a SYNC-flush slave whose
        last fsync is behind its log -- waits for nothing: nothing was sent)."""
        now = time.monotonic()
        if offset > self.acked or self.next <= max(offset, self.start):
            self.acked, self.acked_at = offset, now
        elif now - self.acked_at >= self.stall_s:
            self.close()  # abort: whatever is queued for it goes
            raise ConnectionError(f"slave {self.node} stayed at offset {offset} for {now - self.acked_at:.0f} s "
                                  f"while this link had written up to {self.next}: dropping the link; it "
                                  "reconnects and resumes from its log's end")

    async def _pump(self) -> None:
        heartbeat_s = self.d.cfg.ha_heartbeat_interval_ms / 1000
        w = self.writer
        while True:
            if self._send_new():
                await w.drain()
                continue
            if time.monotonic() - self.last_write >= heartbeat_s:
                w.write(self._header(self.next, 0))  # a heartbeat
                await w.drain()
                continue
            self.wake.clear()
            self.idle = True
            try:
                async with asyncio.timeout(heartbeat_s):  # (not wait_for: broker/tasks.py)
                    await self.wake.wait()
            except TimeoutError:
                pass
            finally:
                self.idle = False

    def _send_new(self) -> bool:
        """Write what the slave has not been sent: the log from `next` (at most DRAIN_BYTES_MAX
        a call: one call never holds the loop longer), else the news of a moved watermark.
        True if it wrote anything."""
        d = self.d
        cl = d.store.commitlog
        batch = d.cfg.ha_transfer_batch_bytes
        w = self.writer
        sent = 0
        while sent < DRAIN_BYTES_MAX and self.next < cl.tail.offset:
            seg = cl.segments.find(self.next)
            if seg is None:
                raise ConnectionError(f"offset {self.next} is no longer in this log (it starts at "
                                      f"{cl.min_offset}): the slave must start over")
            parts = cl.recent_bytes(self.next, batch)  # what was just written: from memory
            if parts:
                n = sum(map(len, parts))
                w.writelines((self._header(self.next, n), *parts))
            else:
                n = min(batch, cl.tail.offset - self.next, seg.base + seg.size - self.next)
                data = seg.pread(self.next - seg.base, n)
                n = len(data)
                w.writelines((self._header(self.next, n), data))
            self.next += n
            self.bytes_sent += n
            sent += n
        if sent:
            return True
        if d.confirm_for_slaves() != self.sent_confirm:
            w.write(self._header(self.next, 0))  # news of the watermark
            return True
        return False

    def poke(self) -> None:
        """New log or a moved watermark: an idle pump's work, done now rather than a loop pass
        later (a send waits for the slave's report of it: at W=1 the pass and the pump's wake-up
        were a good part of the master's work a message). A pump that drains (the socket's
        buffer is full) or has not started sends it when it loops; so does one woken here after
        this write filled the buffer or left log unsent (more than DRAIN_BYTES_MAX was new), or
        because this write failed (it fails there, ending the link the way the pump does)."""
        transport = self.writer.transport
        if not self.idle or self.closed or transport.is_closing() or \
                transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
            self.wake.set()
            return
        try:
            self._send_new()
        except Exception:  # (OSError, ConnectionError): the pump meets it again and ends the link
            self.wake.set()
            return
        if self.next < self.d.store.commitlog.tail.offset or transport.get_write_buffer_size() > WRITE_BUFFER_HIGH:
            self.wake.set()  # more than one call sends (DRAIN_BYTES_MAX), or the pump drains

    def _header(self, offset: int, size: int) -> bytes:
        d = self.d
        self.sent_confirm = d.confirm_for_slaves()
        self.last_write = time.monotonic()
        return wire.encode_header(offset, size, d.epochs.last_epoch, d.store.commitlog.tail.offset,
                                  self.sent_confirm)

    def close(self) -> None:
        """Drop the link now: abort, not close -- over TLS a close waits for the peer's
        close_notify, and a silent (paused) slave never sends one, so the link would stay."""
        if not self.closed:
            self.closed = True
            self.writer.transport.abort()


class _Reader(asyncio.StreamReader):
    def take_buffered(self) -> bytes:
        """What was received and not read yet (the stream's buffer), now the caller's; a
        transport the full buffer had paused reads again."""
        data = bytes(self._buffer)
        self._buffer.clear()
        self._maybe_resume_transport()
        return data


class HAStream(asyncio.StreamReaderProtocol):
    """An HA connection's protocol: a stream (reader, writer) for the handshake; once the link
    streams, the bytes go to `on_data(data, error=None)` instead (b"" when the connection
    ends; `error`: why, when it broke), in the
    transport's callback rather than through a reading task a loop pass later. Both ends: the
    master's report reader (SlaveLink), the slave's log reader (ha_client.MasterLink)."""

    def __init__(self, callback=None):
        self.reader = _Reader()  # (StreamReaderProtocol holds its reader weakly)
        super().__init__(self.reader, callback)
        self.on_data = None

    def data_received(self, data: bytes) -> None:
        if self.on_data is not None:
            self.on_data(data)
        else:
            super().data_received(data)

    def eof_received(self):
        if self.on_data is not None:
            self.on_data(b"")
        return super().eof_received()

    def connection_lost(self, exc) -> None:
        if self.on_data is not None:
            self.on_data(b"", exc)
        super().connection_lost(exc)


def take_over(writer: asyncio.StreamWriter, on_data) -> HAStream:
    """Send the connection's bytes to `on_data` from now on, first what its stream holds."""
    proto = writer.transport.get_protocol()
    reader = proto.reader
    proto.on_data = on_data
    pending = reader.take_buffered()
    if pending:
        on_data(pending)
    if reader.exception() is not None or reader.at_eof():  # it ended already
        on_data(b"", reader.exception())
    return proto


async def open_stream(sock, **tls) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """asyncio.open_connection(sock=sock, **tls) with an HAStream protocol."""
    loop = asyncio.get_running_loop()
    proto = HAStream()
    transport, _ = await loop.create_connection(lambda: proto, sock=sock, **tls)
    return proto.reader, asyncio.StreamWriter(transport, proto, proto.reader, loop)


class _HAProtocol(HAStream):
    """HAServer's: gives its admission back when the connection closes."""

    def __init__(self, callback, limits, admission):
        super().__init__(callback)
        self._limits, self._admission = limits, admission

    def connection_lost(self, exc) -> None:
        self._limits.release(self._admission)
        super().connection_lost(exc)


class HAServer:
    def __init__(self, driver, host: str, port: int):
        self.d = driver
        self.host, self.port = host, port
        self.server: asyncio.Server | None = None
        self.links: dict[str, SlaveLink] = {}
        self.tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        try:
            cfg = self.d.cfg
            ssl_ctx = None
            if cfg.secure:  # members only: a certificate from the cluster CA is required
                ssl_ctx = member_server_context(cfg.tls.ca_file, cfg.tls.cert_file, cfg.tls.key_file)
            # counted at accept, before TLS: anyone who can reach this port must not be able to
            # hold thousands of handshakes (broker/listener.py); a group has few members
            n = len(cfg.peers)
            limits = ConnectionLimits(SimpleNamespace(connections_max=4 * n + 8, connections_per_source_max=8))
            self.server = Listener(self.host, self.port, lambda adm: _HAProtocol(self._on_connection, limits, adm),
                                   limits, ssl_ctx)
            self.server.start()
        except OSError as e:
            raise OSError(e.errno, f"cannot listen on the HA address {self.host}:{self.port}: "
                          f"{e.strerror}") from None

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.close()
        self.drop_all()
        await cancel_and_wait(*self.tasks)

    def drop(self, node: str) -> None:
        link = self.links.get(node)
        if link is not None:
            link.close()

    def drop_all(self) -> None:
        for link in list(self.links.values()):
            link.close()

    def wake_all(self) -> None:
        for link in self.links.values():
            link.poke()

    async def _on_connection(self, reader, writer) -> None:
        self.tasks.add(asyncio.current_task())
        peer = writer.get_extra_info("peername")
        set_buffer(writer.get_extra_info("socket"), socket.SO_SNDBUF, self.d.cfg.ha_socket_buffer_bytes)
        node = None
        try:
            async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
                hello = await read_handshake(reader, wire.Hello)
            if self.d.cfg.secure:
                proven = peer_member(writer)
                if proven != hello.node:
                    log.warning("refused HA connection from %s: its HELLO names %s but its certificate "
                                "proves %s", peer, hello.node, proven or "no member")
                    writer.write(wire.encode_handshake(wire.Welcome(
                        self.d.me, error=f"HELLO names {hello.node} but the certificate is "
                        f"{proven or 'not a member'}'s")))
                    await writer.drain()
                    return
            node = hello.node
            refusal = self.d.refuse_slave(hello)
            if refusal is not None:
                writer.write(wire.encode_handshake(refusal))
                await writer.drain()
                log.info("refused HA connection from %s (%s): %s", node, peer, refusal.error)
                return
            welcome = self._welcome(hello)
            writer.write(wire.encode_handshake(welcome))
            await writer.drain()
            old = self.links.get(node)
            if old is not None:
                old.close()
            link = self.links[node] = SlaveLink(self.d, node, reader, writer, welcome.start)
            log.info("slave %s (%s) connected: its log ends at %d; %s", node, peer, hello.end_offset,
                     "it starts over from this log's first entry" if welcome.reset else
                     f"it cuts its log at {welcome.truncate_to} first" if welcome.truncate_to is not None
                     else f"streaming from {welcome.start}")
            self.d.on_slave_connected(node)
            await link.run()
        except (asyncio.IncompleteReadError, ConnectionError, OSError, asyncio.TimeoutError,
                wire.HAProtocolError) as e:
            if node is not None:
                log.warning("HA connection of slave %s closed: %s", node, e or type(e).__name__)
        except asyncio.CancelledError:
            pass
        finally:
            if node is not None and self.links.get(node) is not None and self.links[node].writer is writer:
                del self.links[node]
                self.d.on_slave_gone(node)
            writer.close()
            self.tasks.discard(asyncio.current_task())

    def _welcome(self, hello: wire.Hello) -> wire.Welcome:
        d = self.d
        cl = d.store.commitlog
        first = cl.position(cl.first_index)
        first_entry = first[0] if first is not None else cl.tail.offset
        try:
            theirs = EpochList(hello.epochs)
        except ValueError as e:
            raise wire.HAProtocolError(f"slave {hello.node}: {e}") from None
        plan = d.node.plan_for(theirs, hello.min_offset, hello.end_offset, cl.min_offset, first_entry,
                               cl.tail.offset)
        return wire.Welcome(d.me, d.epochs.last_epoch, d.epochs.to_list(), plan.start,
                            cl.first_index_at_or_after(plan.start), plan.truncate_to, plan.reset)
