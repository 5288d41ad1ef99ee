"""Runs master-slave replication inside a broker (`mode: master-slave`).

A node is master or slave. The master appends sends to its store (each entry carries the
master's epoch as its term), streams its CommitLog to every connected slave (ha_server.py)
and, with `ha_replication: sync`, answers a send only once the required replicas hold it
(master.py). A slave copies its master's log byte for byte (ha_client.py), shows consumers
no more than the master's high watermark, and pulls topic configs and consumer offsets
from the master every `metadata_sync_interval_ms`.

Roles change only here, one change at a time (`switching`): at start-up (a master first
asks the others whether it was replaced while it was down), on `tidelog admin promote`
(HA_ROLE requests: promote / fence / follow), and when a probe of the other members finds
a master of a newer epoch (fencing). Who-is-master rules are pure, in roles.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from broker.protocol.codes import Code, Req
from broker.protocol.ha import HARole, Metadata
from broker.store import codec
from broker.store.commitlog import NewEntry
from broker.topics import TopicConfig
from broker.system import EPOCH_TOPIC
from replication.base import Ports, Replication
from replication.errors import NotLeader, SlaveNotAvailable
from replication.master_slave import promotion, wire
from replication.master_slave.epochs import EpochList
from replication.master_slave.ha_client import MasterLink
from replication.master_slave.ha_server import HAServer
from replication.master_slave.master import MasterConfig, MasterCore
from replication.master_slave.peers import PeerCallError, Peers
from replication.master_slave.roles import (MASTER, SLAVE, View, restart_decision, restart_quorum,
                                            whom_to_follow)
from replication.master_slave.state import HAFiles, RoleState, reconcile_epochs

log = logging.getLogger(__name__)

TICK_S = 0.05
PROBE_UNSETTLED_S = 0.2  # a slave that has no master looks for one this often


class MasterSlaveDriver(Replication):
    mode = "master-slave"

    def __init__(self, ports: Ports):
        super().__init__(ports)
        self.store = ports.store
        self.cfg = cfg = ports.config
        self.me = cfg.node_id
        self.addresses = {p.id: p.address for p in cfg.peers}
        self.ha_addresses = {p.id: cfg.ha_address_of(p) for p in cfg.peers}
        self.peers = Peers({k: v for k, v in self.addresses.items() if k != self.me}, cfg.frame_bytes_max,
                           ports.faults)
        self.files = HAFiles(ports.data_dir / "ha")
        self.sync_flush = cfg.flush == "sync"
        self.entry_bytes_max = min(cfg.segment_bytes, codec.HEADER_SIZE + codec.TOPIC_BYTES_MAX
                                   + codec.PROPS_BYTES_MAX + cfg.message_body_bytes_max)
        host, port = cfg.ha_address_of(next(p for p in cfg.peers if p.id == self.me)).rsplit(":", 1)
        self.server = HAServer(self, host.strip("[]"), int(port))
        self.epochs = EpochList()
        self.master_epochs = EpochList()  # the master's, from the last WELCOME
        self.role = SLAVE
        self.master: str | None = None
        self.epoch_seen = 0
        self.core: MasterCore | None = None
        self.link: MasterLink | None = None
        self.fenced_until = 0.0
        self.lag_at_loss: int | None = None
        self.promotions = 0
        self.restart_pending: str | None = None  # was master; why it may not open an epoch yet
        self.promoting = False  # telling the members of a new epoch, before leading it
        self.switching = asyncio.Lock()
        self._ticker: asyncio.Task | None = None
        self._jobs: dict[str, asyncio.Task] = {}
        self._next_probe = 0.0
        self._next_metadata = 0.0
        self._metadata_synced_at: float | None = None
        self._released: list = []  # sends the replicas hold, answered at the end of the pass
        self._progress_due = False

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self.epochs, changed = reconcile_epochs(self.files.load_epochs(), self.store.commitlog)
        if changed:
            self.files.save_epochs(self.epochs)
        st = self.files.load_role() or RoleState(self.cfg.role, self.me if self.cfg.role == MASTER else None)
        self.epoch_seen = max(st.epoch_seen, self.epochs.last_epoch)
        await self.server.start()
        if st.role == MASTER:
            self.restart_pending = "not decided yet"
            async with self.switching:
                await self._restart_as_master()
        else:
            await self.become_slave(st.master if st.master != self.me else None)
        self._ticker = asyncio.create_task(self._tick_loop())

    async def _restart_as_master(self) -> None:
        """This node was master when it stopped: lead again (a new epoch), follow a newer
        master, or wait as a slave without a master (roles.restart_decision). Called at start
        and by every probe while it waits; holds `switching`."""
        views, down = await self.peers.views()
        me = View(self.me, MASTER, self.epochs.last_epoch, self.epoch_seen, self.me,
                  self.store.commitlog.tail.offset)
        what, arg = restart_decision(me, views, len(self.addresses))
        if what == "follow":
            self.restart_pending = None
            log.warning("this node was master, but %s has taken over (a newer epoch): following it", arg)
            await self.become_slave(arg)
            return
        if what == "open":
            recorded, _ = await promotion.record_epoch(self, views, arg)
            need = restart_quorum(len(self.addresses))
            if recorded < need:
                what, arg = "wait", (f"only {recorded} of the {need} members needed (this node "
                                     f"included) recorded epoch {arg}")
            else:
                self.restart_pending = None
                if down:
                    log.info("starting as master; %s did not answer", ", ".join(down))
                self.epoch_seen = max(self.epoch_seen, arg)
                await self.become_master(arg)
                return
        first = self.restart_pending != arg
        self.restart_pending = arg
        if first:
            log.warning("this node was master, but does not lead again yet: %s", arg)
            await self.become_slave(None)

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        for t in list(self._jobs.values()):
            t.cancel()
        await asyncio.gather(*self._jobs.values(), return_exceptions=True)
        if self.core is not None:
            self._fail_waiting("the broker is stopping before the slaves acknowledged the send: "
                               "it may or may not be kept")
        if self.link is not None:
            await self.link.stop()
        await self.server.stop()
        self.peers.close()

    # --- roles -----------------------------------------------------------------------------------

    def view(self) -> View:
        return View(self.me, self.role, self.epochs.last_epoch, self.epoch_seen, self.master,
                    self.store.commitlog.tail.offset, self.fenced)

    @property
    def fenced(self) -> bool:
        return self.role == MASTER and time.monotonic() < self.fenced_until

    @property
    def accepting_writes(self) -> bool:
        return self.role == MASTER and not self.fenced

    @property
    def role_name(self) -> str:
        return self.role

    async def become_master(self, epoch: int) -> None:
        if self.link is not None:
            await self.link.stop()
            self.link = None
        store, cl = self.store, self.store.commitlog
        visible = store.confirm_offset
        self.role, self.master, self.epoch_seen = MASTER, self.me, epoch
        self.restart_pending = None
        self.fenced_until = 0.0
        start = cl.tail.offset
        self.epochs.open(epoch, start)
        self.files.save_epochs(self.epochs)
        self.files.save_role(RoleState(MASTER, self.me, epoch))
        mcfg = MasterConfig(
            sync=self.cfg.ha_replication == "sync", in_sync_replicas=self.cfg.in_sync_replicas,
            min_in_sync_replicas=self.cfg.min_in_sync_replicas, auto_degrade=self.cfg.ha_auto_degrade,
            fallbehind_max_bytes=self.cfg.ha_slave_fallbehind_max_bytes,
            ack_timeout_ms=self.cfg.slave_ack_timeout_ms,
            housekeeping_ms=self.cfg.ha_housekeeping_interval_ms,
            silent_ms=2 * self.cfg.ha_heartbeat_interval_ms)
        self.core = MasterCore(mcfg, cl.tail.offset, self.durable_end(), visible)
        self.core.now_ms = _ms()
        if mcfg.sync:
            store.set_confirm_offset(self.core.confirm)
        else:
            store.external_confirm = None  # consumers see what the flush policy confirms
        store.recompute_queue_offsets()
        body = json.dumps({"epoch": epoch, "node": self.me}).encode()
        try:
            store.put([NewEntry(EPOCH_TOPIC, 0, 0, int(time.time() * 1000), os.urandom(16), b"", body)],
                      term=epoch)
        except OSError as e:  # the epoch is open all the same; its first send will start it
            log.error("could not write the epoch marker: %s", e)
        self._progress(self.core.local(cl.tail.offset, self.durable_end()))
        self.ports.schedule_dispatch()
        log.info("master of epoch %d from offset %d (replication %s, %d of %d replicas required)",
                 epoch, start, self.cfg.ha_replication, self.core.required(), len(self.addresses))
        self.ports.role_changed()

    async def become_slave(self, master: str | None) -> None:
        if self.core is not None:
            self._fail_waiting("this node stopped being master before the slaves acknowledged the "
                               "send: it may or may not be kept")
            self.server.drop_all()
            self.store.set_confirm_offset(self.store.confirm_offset)  # what consumers saw stays
            self.core = None
        if self.link is not None:
            await self.link.stop()
            self.link = None
        self.role, self.master = SLAVE, master
        self.fenced_until = 0.0
        if master is not None:
            self.restart_pending = None
        if self.restart_pending is None:  # a waiting master keeps its role on disk
            self.files.save_role(RoleState(SLAVE, master, self.epoch_seen))
        if master is not None:
            self.link = MasterLink(self, master, self.ha_addresses[master])
            self.link.start()
            log.info("following master %s (%s)", master, self.ha_addresses[master])
        else:
            log.info("slave without a master yet: looking for one among %s", ", ".join(self.peers.addresses))
        self.ports.role_changed()

    def _fail_waiting(self, why: str) -> None:
        for done in self.core.fail_all():
            done(Code.TERM_CHANGED, why)

    # --- requests ----------------------------------------------------------------------------------

    def check(self, kind: str, headers: dict | None = None) -> None:
        """Raise NotLeader unless this node serves a request of `kind`: "write" (sends, topic
        changes), "commit" (offset commits), "group" (heartbeats, offset queries) or "read"
        (pulls, lookups). A slave serves reads when asked to (header read_from=slave), and
        reads and group requests when its master is down."""
        if self.role == MASTER:
            if kind in ("write", "commit") and self.fenced:
                raise NotLeader(None, Code.LEADER_TRANSFERRING)
            return
        alive = self.link is not None and self.link.connected
        if kind == "write":
            raise NotLeader(self.master_address() if alive else None,
                            why="this node is a slave; send to the master "
                                f"({self.master_address() if alive else 'unreachable'})")
        if alive and not (kind == "read" and headers and headers.get("read_from") == "slave"):
            raise NotLeader(self.master_address(), why=f"ask the master {self.master}")

    def master_address(self) -> str | None:
        return self.addresses.get(self.master) if self.master else None

    def append(self, items: list, done):
        """Store a send as master: (PutBatch, whether `done` will be called)."""
        if not self.accepting_writes:
            self.check("write")
        core = self.core
        if core.cfg.sync:
            why = core.admit(_ms())
            if why is not None:
                raise SlaveNotAvailable(why)
        batch = self.store.put(items, term=self.epochs.last_epoch)
        self._progress(core.local(self.store.commitlog.tail.offset, self.durable_end()))
        self.server.wake_all()
        waits = core.cfg.sync and done is not None and core.wait(batch.end_offset, _ms(), done)
        return batch, waits

    def durable_end(self) -> int:
        cl = self.store.commitlog
        return cl.flushed.offset if self.sync_flush else cl.tail.offset

    def confirm_for_slaves(self) -> int:
        """The watermark slaves may show consumers (what this master's consumers see)."""
        return self.store.confirm_offset

    # --- master side ---------------------------------------------------------------------------

    def refuse_slave(self, hello: wire.Hello) -> wire.Welcome | None:
        if hello.node not in self.addresses or hello.node == self.me:
            return wire.Welcome(self.me, error=f"{hello.node!r} is not a member of this group")
        if self.ports.faults.blocks(hello.node):
            return wire.Welcome(self.me, error=f"fault injection: {self.me} drops traffic with {hello.node}")
        if self.role != MASTER:
            return wire.Welcome(self.me, error=f"{self.me} is not the master" + (
                " yet (a promotion is under way)" if self.promoting else ""),
                master=None if self.promoting else self.master)
        if hello.epoch_seen > self.epochs.last_epoch:
            self.spawn("probe", self._probe())  # someone newer exists: find out now
            return wire.Welcome(self.me, error=f"{hello.node} has seen epoch {hello.epoch_seen}, "
                                f"newer than this master's {self.epochs.last_epoch}")
        return None

    def on_faults_changed(self, drop_peers) -> None:
        for node in drop_peers:
            self.server.drop(node)

    def on_slave_connected(self, node: str) -> None:
        if self.core is not None:
            self.core.connect(node, self.addresses[node], _ms())

    def on_slave_gone(self, node: str) -> None:
        if self.core is not None:
            self.core.disconnect(node)
            log.warning("slave %s disconnected (%d of %d required replicas in sync)", node,
                        self.core.in_sync_count(), self.core.required())

    def on_report(self, node: str, offset: int) -> None:
        if self.core is not None:
            self._progress(self.core.report(node, offset, _ms()))

    def _progress(self, released: list) -> None:
        """Replicas moved: raise the watermark, then answer the sends it covers -- once per
        loop pass, however many reports and flushes came in it."""
        self._released.extend(released)
        if not self._progress_due:
            self._progress_due = True
            asyncio.get_running_loop().call_soon(self._answer_progress)

    def _answer_progress(self) -> None:
        self._progress_due = False
        core, released, self._released = self.core, self._released, []
        if core is not None and core.cfg.sync and core.confirm != self.store.external_confirm:
            self.store.set_confirm_offset(core.confirm)
            self.ports.dispatch_now()  # consumers see it before the producer hears of it
            self.server.wake_all()
        for done in released:  # held by the replicas even if this node was demoted since
            done(Code.SUCCESS, None)

    # --- slave side ----------------------------------------------------------------------------

    def hello(self) -> wire.Hello:
        cl = self.store.commitlog
        return wire.Hello(self.me, self.epochs.to_list(), cl.min_offset, cl.tail.offset, self.epoch_seen)

    def on_welcome(self, master: str, w: wire.Welcome) -> None:
        if w.epoch < self.epoch_seen:
            raise wire.HAProtocolError(f"{master} is master of epoch {w.epoch}, but epoch "
                                       f"{self.epoch_seen} exists: it is out of date")
        self.master_epochs = EpochList(w.epochs)
        if w.epoch > self.epoch_seen:
            self.epoch_seen = w.epoch
            self.files.save_role(RoleState(SLAVE, master, w.epoch))
        cl = self.store.commitlog
        if w.reset:
            log.warning("this log shares nothing usable with master %s's (epochs %s vs %s): "
                        "dropping it (%d bytes) and copying the master's from offset %d",
                        master, self.epochs.to_list(), w.epochs, cl.tail.offset - cl.min_offset, w.start)
            self.store.restart_at(w.start, w.first_index)
            self.epochs = EpochList()
            self.files.save_epochs(self.epochs)
        elif w.truncate_to is not None:
            end, idx = cl.tail.offset, cl.tail.next_index
            n = self.store.truncate_to_offset(w.truncate_to)
            self.epochs.truncate(w.truncate_to)
            self.files.save_epochs(self.epochs)
            log.warning("cut this log at offset %d (the fork point with master %s): %d entries "
                        "(index %d..%d, %d bytes) were written after it by a master that lost its "
                        "place, and are gone", w.truncate_to, master, n, idx - n, idx - 1,
                        end - w.truncate_to)
        if cl.tail.offset != w.start:
            raise wire.HAProtocolError(f"after the handshake this log ends at {cl.tail.offset}, "
                                       f"the master streams from {w.start}")

    def on_refused(self, master: str, w: wire.Welcome) -> None:
        log.warning("master %s refused this slave: %s", master, w.error)
        if w.master and w.master != master and w.master != self.me and w.master in self.addresses:
            self.spawn("switch", self._switch_master(w.master))
        else:
            self._next_probe = 0.0

    def on_stream(self, stream, entries: list[bytes]) -> None:
        store = self.store
        if entries:
            changed = self._learn_epochs(entries)
            store.append_as_follower(entries)
            if changed:
                self.files.save_epochs(self.epochs)
            if self.sync_flush:
                self.ports.request_flush()
            else:
                self.link.report(store.commitlog.tail.offset)
        self._show(stream.confirm)

    def _learn_epochs(self, entries: list[bytes]) -> bool:
        last = self.epochs.last_epoch if self.epochs.entries else -1
        if codec.peek_ids(entries[-1])[1] <= last:
            return False
        pos = self.store.commitlog.tail.offset
        for raw in entries:
            _, term, phys = codec.peek_ids(raw)
            if term > (self.epochs.last_epoch if self.epochs.entries else -1):
                start = self.master_epochs.start_of(term)
                self.epochs.open(term, pos if start is None else start)
            pos = phys + len(raw)
        return True

    def _show(self, master_confirm: int) -> None:
        """Let consumers of this slave see up to the master's watermark (and what is here)."""
        limit = min(master_confirm, self.durable_end())
        if limit > (self.store.external_confirm or 0):
            self.store.set_confirm_offset(limit)
            self.ports.schedule_dispatch()

    def on_master_lost(self, master: str) -> None:
        s = self.link.stream if self.link is not None else None
        if s is not None:
            self.lag_at_loss = max(0, s.master_end - self.durable_end())
        log.warning("lost the connection to master %s (this log %d bytes behind it then)", master,
                    self.lag_at_loss or 0)
        self._next_probe = 0.0
        self.ports.role_changed()

    def on_flushed(self, offset: int) -> None:
        if self.core is not None:
            self._progress(self.core.local(self.store.commitlog.tail.offset, self.durable_end()))
        elif self.link is not None and self.sync_flush:
            self.link.report(self.durable_end())
            if self.link.stream is not None:
                self._show(self.link.stream.confirm)

    def on_dispatched(self, touched) -> None:
        if self.role == SLAVE and any(t not in self.ports.topics.topics for t, _ in touched):
            self._next_metadata = 0.0  # a topic the master created: fetch its config now

    async def _switch_master(self, master: str) -> None:
        async with self.switching:
            if self.role == SLAVE and self.master != master:
                await self.become_slave(master)

    # --- housekeeping ------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        cfg = self.cfg
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            try:
                if self.core is not None:
                    expired, silent = self.core.tick(_ms())
                    for done, code, why in expired:
                        done(code, why)
                    for node in silent:
                        log.warning("slave %s reported nothing for %d ms: dropping it", node,
                                    cfg.ha_housekeeping_interval_ms)
                        self.server.drop(node)
                    if self.fenced_until and now >= self.fenced_until:
                        self.fenced_until = 0.0
                        log.warning("the switchover did not complete in time: taking writes again")
                if self.link is not None:
                    self.link.housekeeping(now, cfg.ha_heartbeat_interval_ms / 1000,
                                           cfg.ha_housekeeping_interval_ms / 1000)
                connected = self.link is not None and self.link.connected
                if now >= self._next_probe and (self.role == MASTER or not connected):
                    self._next_probe = now + (cfg.ha_probe_interval_ms / 1000 if self.role == MASTER
                                              else PROBE_UNSETTLED_S)
                    self.spawn("probe", self._probe())
                if connected and now >= self._next_metadata:
                    self._next_metadata = now + cfg.metadata_sync_interval_ms / 1000
                    self.spawn("metadata", self.sync_metadata())
            except Exception:
                log.exception("master-slave housekeeping failed; continuing")

    def spawn(self, name: str, coro) -> None:
        t = self._jobs.get(name)
        if t is not None and not t.done():
            coro.close()
            return
        t = self._jobs[name] = asyncio.ensure_future(coro)
        t.add_done_callback(lambda t: t.cancelled() or t.exception() is None or
                            log.error("%s failed: %r", name, t.exception()))

    async def _probe(self) -> None:
        if self.restart_pending is not None:
            async with self.switching:
                if self.restart_pending is not None and self.role == SLAVE:
                    await self._restart_as_master()
            return
        views, _ = await self.peers.views()
        async with self.switching:
            target = whom_to_follow(self.view(), views)
            if target is None or target not in self.addresses or target == self.me:
                return
            if self.role == MASTER:
                log.warning("%s is master of a newer epoch: this node stops taking writes and follows it",
                            target)
            await self.become_slave(target)

    async def sync_metadata(self) -> None:
        """Copy the master's topic configs and consumer offsets (RocketMQ's SlaveSynchronize)."""
        if self.role != SLAVE or self.master is None:
            return
        try:
            m = await self.peers.call(self.master, Req.GET_METADATA, None, 5.0, Metadata)
            topics = [TopicConfig(**t) for t in m.topics]
            offsets = m.offsets
        except (PeerCallError, TypeError) as e:
            log.warning("metadata sync from %s failed: %s", self.master, e)
            return
        if self.role != SLAVE:
            return
        for t in topics:
            self.ports.topics.apply(t.__dict__)
        if offsets != self.ports.offsets.offsets:
            self.ports.offsets.offsets = offsets
            self.ports.offsets.dirty = True
        self._metadata_synced_at = time.monotonic()

    def metadata(self) -> Metadata:
        return Metadata([t.__dict__ for t in self.ports.topics.topics.values()],
                        self.ports.offsets.offsets)

    # --- promotion (replication/master_slave/promotion.py) ------------------------------------

    async def handle_role_request(self, req: HARole) -> dict:
        return await promotion.handle(self, req)

    def lag(self) -> int | None:
        link = self.link
        if link is not None and link.connected and link.stream is not None:
            return max(0, link.stream.master_end - self.durable_end())
        return self.lag_at_loss

    # --- status and retention --------------------------------------------------------------------------

    def status(self) -> dict:
        now = time.monotonic()
        s = {"role": self.role, "node_id": self.me, "epoch": self.epochs.last_epoch,
             "epoch_seen": self.epoch_seen, "epochs": self.epochs.to_list(), "master": self.master,
             "master_address": self.master_address(), "fenced": self.fenced,
             "ha_replication": self.cfg.ha_replication, "ha_address": self.ha_addresses[self.me],
             "peers": dict(self.addresses), "promotions": self.promotions,
             "waiting_to_lead": self.restart_pending}
        if self.core is not None:
            s.update(self.core.status(_ms()))
        else:
            link = self.link
            st = link.stream if link is not None else None
            s.update({
                "max_offset": self.store.commitlog.tail.offset,
                "connected": bool(link and link.connected),
                "last_read_ms_ago": round((now - link.last_read) * 1000) if link and link.last_read else None,
                "last_write_ms_ago": round((now - link.last_write) * 1000) if link and link.last_write else None,
                "master_max_offset": st.master_end if st else None,
                "lag_bytes": self.lag(),
                "confirm_offset": self.store.confirm_offset,
                "metadata_synced_s_ago": None if self._metadata_synced_at is None
                else round(now - self._metadata_synced_at, 1),
            })
        return s

    def retention_holders(self) -> list:
        if self.core is None:
            return []
        return self.store.holders_for_offsets({f"slave {s.node}": s.ack for s in self.core.slaves.values()
                                               if s.ack >= 0})


def _ms() -> int:
    return int(time.monotonic() * 1000)
