"""The broker node: an asyncio TCP server in front of the message store.

Threads: the event loop does all reading, writing and bookkeeping; the flusher thread only
fsyncs the CommitLog (and hops back with `call_soon_threadsafe`); checkpoints and offset
files are written by the default executor from snapshots taken on the loop.

Housekeeping runs from one 100 ms ticker: sync-flush and long-poll timeouts, checkpoints,
consumer-offset persistence, disk-usage guard, retention and idle connections.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import logging
import os
import sys
import time
from pathlib import Path

import broker as broker_pkg
from broker.config import BrokerConfig
from broker.connection import Connection, unsupported_version
from broker.faults import FaultSwitch
from broker.groups import ConsumerGroups
from broker.limits import ConnectionLimits
from broker.listener import Listener
from broker.offsets import OffsetManager
from broker.processors.admin import handlers as admin_handlers
from broker.processors.pull import PullProcessor
from broker.processors.send import SendProcessor
from broker.registrar import Registrar, registration
from broker.protocol import admin as ap
from broker.protocol import frame as fr
from broker.protocol.codes import BadRequest, Code, Req
from broker.security.guard import GATED, Denied, Guard
from broker.security.tls import peer_member, server_context
from broker.system import SystemEntries
from replication.base import Done, Ports, Replication
from replication.errors import NotLeader
from replication.master_slave.driver import MasterSlaveDriver
from replication.raft.driver import RaftDriver
from broker.store.flusher import Flusher
from broker.store.message_store import DamagedConsumeQueue, MessageStore
from broker.topics import TopicManager

log = logging.getLogger(__name__)

TICK_S = 0.1
# Indexing committed entries is deferred (schedule_dispatch) for at most DISPATCH_DEFER_S or
# DISPATCH_DEFER_MAX commits, whichever comes first. A dispatch has a fixed cost (~30 us here,
# reading the log back, the ConsumeQueue and key-index writes) that a W=1 stream paid per send;
# measured on a standalone broker at W=1 (medians of 5): indexing at once 187 us of broker CPU
# a message, p99 0.45 ms; every 8 commits 162 us, p99 0.52 ms; every 10 ms 160 us, p99 0.90 ms
# (one send in ~40 waited for a 40-entry dispatch).
DISPATCH_DEFER_S = 0.01
DISPATCH_DEFER_MAX = 8
DISK_CHECK_S = 1.0
IDLE_CHECK_S = 1.0  # idle connections, frame and auth deadlines (broker/limits.py)


class DataDirInUse(RuntimeError):
    pass


class Broker:
    def __init__(self, config: BrokerConfig):
        config.require_security()
        self.config = config
        self.data_dir = Path(config.data_dir)
        self.store = MessageStore(self.data_dir, config.store_options())
        self.topics = TopicManager(self.data_dir / "config" / "topics.json",
                                   config.auto_create_topic_enable, config.default_topic_queues,
                                   config.topic_queues_max)
        self.offsets = OffsetManager(self.data_dir / "config" / "consumer_offsets.json")
        self.groups = ConsumerGroups(config.consumer_expire_ms)
        self.connections: set[Connection] = set()
        self.limits = ConnectionLimits(config)
        self.guard = Guard(config)
        self.faults = FaultSwitch()  # drills on provider local (broker/faults.py)
        self.send_proc = SendProcessor(self)
        self.pull_proc = PullProcessor(self)
        self.handlers = admin_handlers(self)
        self.handlers[Req.PULL] = self.pull_proc.handle
        self.system = SystemEntries(self.topics, self.offsets, acl=self.guard.acl_store)  # users and roles set at runtime
        self.store.on_system_entry = self.system.apply  # the dispatcher's last stage
        self.store.before_checkpoint = self.offsets.persist  # (topic configs and ACLs are saved as applied)
        ports = Ports(self.store, config, self.data_dir, self.faults, self.topics, self.offsets, self.system,
                      request_flush=lambda: self.flusher.request(), schedule_dispatch=self.schedule_dispatch,
                      dispatch_now=self.dispatch_now, role_changed=self.on_role_changed,
                      persist_offsets=self.persist_offsets)
        self.repl: Replication = MODES[config.mode](ports)
        self.handlers.update(self.repl.handlers())
        self.flusher: Flusher | None = None
        self.server: Listener | None = None
        self.kafka_server: Listener | None = None  # kafka_listener (broker/kafka/)
        self.kafka = None  # its KafkaService
        self.loop: asyncio.AbstractEventLoop | None = None
        self.started_at = time.time()
        self.stats_sent = 0
        self._dispatch_owed = 0  # schedule_dispatch calls since the last dispatch
        self._dispatch_timer: asyncio.TimerHandle | None = None
        self._dispatch_failing = False
        self._dispatch_damaged: str | None = None  # why indexing stopped (until a restart)
        self._ticker: asyncio.Task | None = None
        self._background: set[asyncio.Future] = set()
        self._busy: set[str] = set()
        self._offset_waiters: list = []  # done(code, error) of commits waiting for their fsync
        self._offsets_writing = False
        self._lock_fd = -1
        self.listen_port: int | None = None
        self.open_report = None
        self.registrar: Registrar | None = None  # name servers (config.namesrv_addresses)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        # the files first: opening the store re-applies the system entries after its last
        # checkpoint (topic configs and, in raft mode, offsets, which reach the files only at
        # checkpoints) on top of what the files hold
        self.topics.load()
        self.offsets.load()
        if self.config.kafka_listen is not None:  # before the store opens: its re-dispatch feeds
            from broker.kafka.service import KafkaService  # the Kafka producers' state
            self.kafka = KafkaService(self)
        self.open_report = self.store.open()
        if self.kafka is not None:
            self.kafka.opened()
        self.flusher = Flusher(self.store.commitlog, self.config.flush == "sync",
                               self.config.flush_interval_ms, self._flushed_from_thread)
        self.flusher.start()
        ssl_ctx = None
        if self.config.secure:
            t = self.config.tls
            ssl_ctx = server_context(t.ca_file, t.cert_file, t.key_file)
        elif self.config.insecure:
            log.warning("INSECURE: insecure: true -- no TLS and no authentication on %s; anyone who can "
                        "reach this port can read, write and administer this broker (and forge "
                        "replication traffic)", self.config.listen)
        try:  # connections are counted at accept, before TLS (broker/listener.py)
            self.server = Listener(self.config.host, self.config.port, lambda adm: Connection(self, adm),
                                   self.limits, ssl_ctx)
        except OSError as e:
            self.flusher.stop()
            self.store.close()
            os.close(self._lock_fd)
            raise OSError(e.errno, f"cannot listen on {self.config.listen}: {e.strerror}") from None
        self.listen_port = self.server.port
        if self.config.kafka_listen is not None:
            self._start_kafka(ssl_ctx)
        self.server.start()
        try:
            await self.repl.start()
        except OSError:
            await self.server.close()
            if self.kafka_server is not None:
                await self.kafka_server.close()
            self.flusher.stop()
            self.store.close()
            os.close(self._lock_fd)
            raise
        self._ticker = asyncio.create_task(self._housekeeping())
        if self.config.namesrv_addresses:
            # what clients dial: the peers' address of this node, or (standalone) the port it got
            address = self.config.peer_address if self.config.peers else f"{self.config.host}:{self.listen_port}"
            self.registrar = Registrar(self.config, lambda: registration(self.config, self.repl, self.topics, address))
            self.topics.on_change = self.registrar.changed  # create/update/auto-create/replicated
            self.registrar.start()
        self._write_runfile()
        log.info("broker %s (%s, flush %s, version %s) listening on %s:%d, data in %s",
                 self.config.broker_name, self.config.mode, self.config.flush,
                 broker_pkg.__version__, self.config.host, self.listen_port, self.data_dir)

    def _start_kafka(self, ssl_ctx) -> None:
        """The Kafka protocol listener (broker/kafka/): the same limits, TLS and users."""
        from broker.kafka.connection import KafkaConnection

        host, port = self.config.kafka_listen
        try:
            self.kafka_server = Listener(host, port, lambda adm: KafkaConnection(self, self.kafka, adm),
                                         self.limits, ssl_ctx)
        except OSError as e:
            self.server.sock.close()
            self.flusher.stop()
            self.store.close()
            os.close(self._lock_fd)
            raise OSError(e.errno, f"cannot listen on kafka_listener {self.config.kafka_listener}: "
                                   f"{e.strerror}") from None
        self.kafka.listening_on(self.kafka_server.port)
        self.kafka_server.start()

    async def stop(self) -> None:
        """Stop serving; every acknowledged message is on disk and checkpointed."""
        if self.server is None:
            return
        if self.registrar is not None:  # routes drop this node before it stops answering
            self.topics.on_change = None
            await self.registrar.stop()
        await self.server.close()
        if self.kafka_server is not None:
            await self.kafka_server.close()
            await self.kafka.cluster.close()
        await self.repl.stop()
        for c in list(self.connections):
            if not c.closed:
                c.transport.pause_reading()  # no new requests; answer what is in flight
        if self._ticker:
            self._ticker.cancel()
        for t in list(self._background):
            await asyncio.gather(t, return_exceptions=True)
        self.flusher.request()
        deadline = time.monotonic() + 2
        while (self.send_proc.waiters or self._offsets_writing) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        self.pull_proc.tick(time.monotonic(), everything=True)
        if self.kafka is not None:
            self.kafka.fetcher.stop()
        for c in list(self.connections):
            c.close()
        self.flusher.stop()
        if self._dispatch_timer is not None:  # the dispatch below covers it; the store closes
            self._dispatch_timer.cancel()
            self._dispatch_timer = None
        try:
            self.store.dispatch()
            self.offsets.persist()
        except OSError as e:  # both are redone from the log / were acked only when written
            log.error("final dispatch or offsets write failed: %s", e)
        self.store.close()
        (self.data_dir / "broker.json").unlink(missing_ok=True)
        os.close(self._lock_fd)
        self.server = None
        log.info("broker %s stopped", self.config.broker_name)

    def _take_lock(self) -> None:
        self._lock_fd = os.open(self.data_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise DataDirInUse(f"data_dir {self.data_dir} is in use by another broker") from None

    def _write_runfile(self) -> None:
        info = {"pid": os.getpid(), "host": self.config.host, "port": self.listen_port,
                "kafka_port": self.kafka_server.port if self.kafka_server is not None else None,
                "broker_name": self.config.broker_name, "version": broker_pkg.__version__,
                "started_at": self.started_at}
        tmp = self.data_dir / "broker.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(self.data_dir / "broker.json")

    # --- requests --------------------------------------------------------------------------

    def handle(self, conn: Connection, frames: list[fr.Frame]) -> None:
        sends = []
        if conn.auth is None:  # the first request on this connection: who is it?
            self.guard.on_connect(conn, peer_member(conn.transport) if self.config.secure else None)
        guard = self.guard
        for f in frames:
            if f.version > fr.PROTOCOL_VERSION or f.version < fr.MIN_VERSION:
                unsupported_version(conn, f)
                continue
            if f.flags & fr.FLAG_RESPONSE:
                log.debug("ignoring a response frame from client %s", conn.peer)
                continue
            code = f.code
            if self.faults.isolated and code != Req.FAULT and code != Req.AUTH:
                continue  # a drill cut this node off: no answer, as with a pulled cable (the
                # drill's own switch -- FAULT, after authenticating -- still gets through)
            if code == Req.SEND or code == Req.SEND_BATCH or code == Req.SEND_ZONE:
                if conn.principal is None and guard.gate(conn, f):
                    continue
                sends.append(f)
                continue
            if f.flags & fr.FLAG_ONEWAY and code not in ONEWAY_OK:
                continue  # nobody wants the answer: a oneway PULL or query would only cost reads
            if self._dispatch_owed and code != Req.RAFT:
                self.dispatch_now()  # whatever this request reads sees every answered send
            h = self.handlers.get(code)
            try:
                if (conn.principal is None or code in GATED) and guard.gate(conn, f):
                    continue
                if h is None:
                    conn.respond(f, Code.REQUEST_CODE_NOT_SUPPORTED, error=f"request code {code} is not supported")
                else:
                    h(conn, f)
            except BadRequest as e:
                conn.respond(f, Code.BAD_REQUEST, error=str(e))
            except Denied as e:
                conn.respond(f, e.code, error=str(e))
            except NotLeader as e:
                conn.respond(f, e.code, error=str(e),
                             headers={"leader": e.leader_address} if e.leader_address else None)
            except Exception as e:  # a bug must not take the connection or the broker down
                log.exception("request %s from %s failed", code, conn.peer)
                conn.respond(f, Code.SYSTEM_ERROR, error=f"{type(e).__name__}: {e}")
        if sends:
            try:
                self.send_proc.handle(conn, sends)
            except Exception as e:
                log.exception("send from %s failed", conn.peer)
                for f in sends:
                    conn.respond(f, Code.SYSTEM_ERROR, error=f"{type(e).__name__}: {e}")
        self.repl.after_input()

    # --- dispatch and flush ------------------------------------------------------------------

    def schedule_dispatch(self) -> None:
        """Index what became visible (ConsumeQueues, key index) lazily, yet before anyone can
        see it missing: at once when a long poll waits; otherwise before this loop reads the
        next request other than a send or a raft message (handle), at the
        DISPATCH_DEFER_MAX-th call, or within DISPATCH_DEFER_S. Sends and raft traffic read no
        queue; every other request, a PULL or a query right after its send's answer among
        them, finds the messages indexed."""
        if self.pull_proc.parked or (self.kafka is not None and self.kafka.fetcher.parked):
            self.dispatch_now()
            return
        self._dispatch_owed += 1
        if self._dispatch_owed >= DISPATCH_DEFER_MAX:
            self.dispatch_now()
            return
        if self._dispatch_timer is None:
            self._dispatch_timer = self.loop.call_later(DISPATCH_DEFER_S, self._dispatch)

    def _dispatch(self) -> None:
        self._dispatch_timer = None
        if self._dispatch_owed:
            self.dispatch_now()

    def dispatch_now(self) -> None:
        self._dispatch_owed = 0
        if self._dispatch_damaged is not None:
            return
        try:
            touched = self.store.dispatch()
        except DamagedConsumeQueue as e:  # never seen in tests: a bug, not a disk fault
            self._dispatch_damaged = str(e)
            log.error("indexing stopped: %s; consumers see nothing new until the broker restarts "
                      "(recovery rebuilds the ConsumeQueues from the CommitLog); sends are still stored", e)
            return
        except OSError as e:  # e.g. no space for a new ConsumeQueue file: retried each tick
            if not self._dispatch_failing:
                log.error("indexing new messages failed (%s); consumers will not see them until "
                          "it succeeds; retrying", e)
            self._dispatch_failing = True
            return
        if self._dispatch_failing:
            log.warning("indexing works again")
            self._dispatch_failing = False
        if touched:
            self.pull_proc.on_dispatched(touched)
            if self.kafka is not None:
                try:  # (a bug in the Kafka layer must not reach whoever triggered this dispatch)
                    self.kafka.fetcher.on_dispatched(touched)
                except Exception:
                    log.exception("kafka: answering parked fetches failed")
            self.repl.on_dispatched(touched)

    def _flushed_from_thread(self, tail, error) -> None:
        self.loop.call_soon_threadsafe(self._flushed, tail.offset, error)

    def _flushed(self, offset: int, error) -> None:
        self.send_proc.on_flushed(offset, error)
        self.repl.on_flushed(offset)
        if self.repl.dispatch_after_flush:
            self.schedule_dispatch()

    # --- replication hooks ------------------------------------------------------------------

    def serve_or_raise(self, kind: str, headers: dict | None = None) -> None:
        """Raise NotLeader unless this node serves a request of `kind` ("write", "commit",
        "group" or "read"): a raft group's leader serves everything, a master-slave group's
        master too, and its slaves some reads (see MasterSlaveDriver.check)."""
        self.repl.check(kind, headers)

    def on_role_changed(self) -> None:
        if self.registrar is not None:
            self.registrar.changed()  # a new leader is routable within one round trip
        if self.kafka is not None:
            self.kafka.on_role_changed()  # what it stored uncommitted may be cut
        try:
            self.serve_or_raise("read")
        except NotLeader:
            self.pull_proc.tick(time.monotonic(), everything=True)  # they ask the new leader
            if self.kafka is not None:
                self.kafka.fetcher.stop()  # answered now: NOT_LEADER_OR_FOLLOWER

    # --- housekeeping ------------------------------------------------------------------------

    async def _housekeeping(self) -> None:
        cfg = self.config
        now = time.monotonic()
        due = {"checkpoint": now + cfg.checkpoint_interval_ms / 1000, "disk": now, "retention": now + cfg.retention_check_interval_ms / 1000,
               "idle": now + IDLE_CHECK_S}
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            try:
                self.send_proc.tick(now)
                self.pull_proc.tick(now)
                self.store.flush_tails()
                if self._dispatch_failing:
                    self.schedule_dispatch()
                if now >= due["disk"]:
                    due["disk"] = now + DISK_CHECK_S
                    self._check_disk()
                if now >= due["checkpoint"]:
                    due["checkpoint"] = now + cfg.checkpoint_interval_ms / 1000
                    offsets = self.offsets.snapshot() if self.offsets.dirty else None
                    self._in_background(self._write_checkpoint, self.store.checkpoint_snapshot(), offsets)
                if now >= due["retention"]:
                    due["retention"] = now + cfg.retention_check_interval_ms / 1000
                    self.run_retention()
                if now >= due["idle"]:
                    due["idle"] = now + IDLE_CHECK_S
                    self.limits.sweep(self.connections, now)
            except Exception:
                log.exception("housekeeping failed; continuing")

    def _write_checkpoint(self, snapshot, offsets: tuple[int, bytes] | None) -> None:
        """Offsets first: in raft mode they are applied from the log, and the checkpoint's
        dispatched offset says which entries need not be applied again after a crash. The
        store drops a snapshot taken before a later checkpoint or a cut of the log
        (MessageStore.write_checkpoint)."""
        if offsets is not None:
            self.offsets.write(offsets)
        self.store.write_checkpoint(snapshot)

    def spawn(self, coro) -> None:
        """Run a request's coroutine (e.g. a promotion) alongside; stop() waits for it."""
        t = asyncio.ensure_future(coro)
        self._background.add(t)
        t.add_done_callback(self._background.discard)

    def _in_background(self, fn, *args) -> None:
        """Run fn in the executor unless the previous run of it is still going."""
        if fn.__name__ in self._busy:
            return
        self._busy.add(fn.__name__)
        fut = self.loop.run_in_executor(None, fn, *args)
        self._background.add(fut)

        def done(f, name=fn.__name__):
            self._busy.discard(name)
            self._background.discard(f)
            if not f.cancelled() and f.exception() is not None:
                log.error("background %s failed: %s", name, f.exception())

        fut.add_done_callback(done)

    def persist_offsets(self, done: Done) -> None:
        """Write the consumer offsets, then done(code, error) (commits meanwhile share a write)."""
        self._offset_waiters.append(done)
        if not self._offsets_writing:
            self._write_offsets()

    def _write_offsets(self) -> None:
        waiters, self._offset_waiters = self._offset_waiters, []
        self._offsets_writing = True
        fut = self.loop.run_in_executor(None, self.offsets.write, self.offsets.snapshot())

        def done(fut):
            err = None if fut.cancelled() else fut.exception()
            if err is not None:
                log.error("writing consumer offsets failed: %s", err)
            if err is None:
                code, why = Code.SUCCESS, None
            else:
                full = isinstance(err, OSError) and err.errno == errno.ENOSPC
                code, why = Code.DISK_FULL if full else Code.SYSTEM_ERROR, f"offsets not persisted: {err}"
            for answer in waiters:
                answer(code, why)
            self._offsets_writing = False
            if self._offset_waiters:
                self._write_offsets()

        fut.add_done_callback(done)

    def _check_disk(self) -> None:
        ratio = self.store.disk_usage_ratio()
        limit = self.config.disk_usage_ratio_write_max
        was = self.store.disk_full_reason
        if ratio >= limit:
            self.store.disk_full_reason = (f"disk usage {ratio:.1%} of {self.data_dir} is at or past "
                                           f"disk_usage_ratio_write_max={limit:.0%}")
            if was is None:
                log.error("refusing sends: %s", self.store.disk_full_reason)
                self.run_retention()
        elif was is not None:
            self.store.disk_full_reason = None
            log.warning("disk usage %.1f%% is below the limit again: accepting sends", ratio * 100)

    def run_retention(self):
        holders = self.store.holders_for(self.offsets.all()) + self.repl.retention_holders()
        return self.store.run_retention(self.config.retention_policy(), holders)

    # --- status ------------------------------------------------------------------------------

    def status(self) -> ap.Status:
        role = self.repl.role_name
        return ap.Status(
            broker_name=self.config.broker_name, version=broker_pkg.__version__,
            protocol_version=fr.PROTOCOL_VERSION, mode=self.config.mode, role=role,
            listen=f"{self.config.host}:{self.listen_port}",
            uptime_s=round(time.time() - self.started_at, 3), flush=self.config.flush,
            store={**self.store.stats(), "flush_rounds": self.flusher.rounds if self.flusher else 0,
                   "dispatch_error": self._dispatch_damaged,
                   "sent_messages": self.stats_sent, "send_batches": self.send_proc.batches},
            topics=len(self.topics.topics),
            connections=len(self.connections),
            replication=self.repl.status())


MODES = {"standalone": Replication, "raft": RaftDriver, "master-slave": MasterSlaveDriver}
ONEWAY_OK = frozenset({Req.SEND, Req.SEND_BATCH, Req.SEND_ZONE, Req.RAFT})  # the requests that may be sent oneway


def run_until_signal(make) -> None:
    """Run the server `make()` returns (start() / stop()) on uvloop in the foreground until
    SIGTERM or SIGINT: the broker's and the name server's `tidelog ... start`."""
    import gc
    import signal

    import uvloop

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        server = make()
        await server.start()
        # what start-up made (modules, configs, recovered state) mostly lives as long as the
        # process: out of the collector's sight, a full collection no longer walks it (a full
        # collection of a master right after start: 42-62 ms with the loop stopped). Frozen
        # objects are still freed by reference counting; one that later ends in a reference
        # cycle stays (a leak bounded by what existed at start, once)
        gc.collect()
        gc.freeze()
        try:
            await stop.wait()
        finally:
            await server.stop()

    uvloop.run(main())


def run(config: BrokerConfig) -> None:
    """Run a broker in the foreground until SIGTERM or SIGINT (used by the CLI)."""
    # the flusher thread hands fsync completions back to the loop; with the default 5 ms
    # GIL switch interval a busy loop would hold every sync ack back by up to 5 ms
    sys.setswitchinterval(0.0005)
    from broker.fdlimit import raise_nofile_limit
    soft, hard = raise_nofile_limit()
    logging.getLogger(__name__).info("file descriptor limit %d (hard %d)", soft, hard)
    run_until_signal(lambda: Broker(config))
