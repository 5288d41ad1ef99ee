"""Runs master-slave replication inside a broker (`mode: master-slave`).

A node is master or slave. The master appends sends to its store (each entry carries the
master's epoch as its term), streams its CommitLog to every connected slave (ha_server.py)
and, with `ha_replication: sync`, answers a send only once the required replicas hold it
(master.py). A slave copies its master's log byte for byte (ha_client.py), shows consumers
no more than the master's high watermark, and pulls topic configs and consumer offsets
from the master every `metadata_sync_interval_ms`.

Roles change one change at a time (`switching`): at start-up (a master first asks the
others whether it was replaced while it was down), on `tidelog admin promote` (HA_ROLE
requests: promote / fence / follow), when a probe of the other members finds a master
of a newer epoch (fencing), and when a switchover's fence lapses. Every decision is made by
the pure node core (core.NodeCore, over the rules of roles.py and epochs.py and
MasterCore), which the seeded simulation (sim.py) drives too: this driver does the
I/O -- STATUS probes, HA sockets, store operations, files, timers -- feeds the results in,
and carries out the effects the core returns, in their order (`apply`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time

from broker.protocol.codes import Code, Req
from broker.protocol.acl import SyncedMetadata
from broker.protocol.ha import HARole
from broker.store import codec
from broker.store.commitlog import NewEntry
from broker.topics import TopicConfig
from broker.system import EPOCH_TOPIC
from broker.tasks import cancel_and_wait
from replication.base import Ports, Replication
from replication.errors import NotLeader, SlaveNotAvailable
from replication.master_slave import promotion, wire
from replication.master_slave.epochs import EpochList
from replication.master_slave.ha_client import MasterLink
from replication.master_slave.ha_server import HAServer
from replication.master_slave.master import MasterConfig, MasterCore
from replication.master_slave.peers import PeerCallError, Peers
from replication.master_slave.core import (Lead, NodeCore, Refused, Reset, RoleChanged, SaveEpochs,
                                           SaveRole, StartLink, StepDown, StopLink, Truncate)
from replication.master_slave.roles import MASTER, SLAVE, View, restart_quorum
from replication.master_slave.state import HAFiles, RoleState, reconcile_epochs

log = logging.getLogger(__name__)

TICK_S = 0.05
PROBE_UNSETTLED_S = 0.2  # a slave that has no master looks for one this often


def entry_bytes_bound(cfg) -> int:
    """The largest entry a master of this configuration can write, either format: the slave's
    stream refuses a size above it as garbage rather than wait for that many bytes. A TLE1
    entry holds one message; a TLE2 batch (docs/design/batch-format.md) is a head and a zone
    of at most cfg.zone_bytes_max. Never more than a segment holds."""
    tle1 = codec.HEADER_SIZE + codec.TOPIC_BYTES_MAX + codec.PROPS_BYTES_MAX + cfg.message_body_bytes_max
    return min(cfg.segment_bytes, max(tle1, codec.BATCH_HEAD_SIZE + cfg.zone_bytes_max))


def master_config(cfg) -> MasterConfig:
    """The master's rules from broker.yaml (the same on every member: a promoter bounds an
    ASYNC failover's loss by its own `ha_async_self_fence`)."""
    return MasterConfig(
        sync=cfg.ha_replication == "sync", in_sync_replicas=cfg.in_sync_replicas,
        min_in_sync_replicas=cfg.min_in_sync_replicas, auto_degrade=cfg.ha_auto_degrade,
        fallbehind_max_bytes=cfg.ha_slave_fallbehind_max_bytes,
        ack_timeout_ms=cfg.slave_ack_timeout_ms,
        housekeeping_ms=cfg.ha_housekeeping_interval_ms,
        silent_ms=2 * cfg.ha_heartbeat_interval_ms,
        async_fence_replicas=restart_quorum(len(cfg.peers)) if cfg.ha_async_self_fence else 0,
        append_bytes_max=entry_bytes_bound(cfg))


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
                           ports.faults, cfg.member_credentials())
        self.files = HAFiles(ports.data_dir / "ha")
        self.sync_flush = cfg.flush == "sync"
        self.entry_bytes_max = entry_bytes_bound(cfg)
        host, port = cfg.ha_address_of(next(p for p in cfg.peers if p.id == self.me)).rsplit(":", 1)
        self.server = HAServer(self, host.strip("[]"), int(port))
        self.node = NodeCore(self.me, list(self.addresses), master_config(cfg))  # every decision (core.py)
        self.link: MasterLink | None = None
        self.switching = asyncio.Lock()
        self._ticker: asyncio.Task | None = None
        self._jobs: dict[str, asyncio.Task] = {}
        self._stopping = False  # stop() began: spawn starts nothing (a job would outlive it)
        self._next_probe = 0.0
        self._next_metadata = 0.0
        self._metadata_synced_at: float | None = None
        self._released: list = []  # sends the replicas hold, answered at the end of the pass
        self._progress_due = False

    # the core's state, read-only here
    @property
    def core(self) -> MasterCore | None:
        return self.node.mcore

    @property
    def role(self) -> str:
        return self.node.role

    @property
    def leader_id(self) -> str | None:
        return self.master

    @property
    def master(self) -> str | None:
        return self.node.master

    @property
    def epochs(self) -> EpochList:
        return self.node.epochs

    @property
    def epoch_seen(self) -> int:
        return self.node.epoch_seen

    @property
    def restart_pending(self) -> str | None:
        return self.node.restart_pending

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        epochs, changed = reconcile_epochs(self.files.load_epochs(), self.store.commitlog)
        if changed:
            self.files.save_epochs(epochs)
        st = self.files.load_role() or RoleState(self.cfg.role, self.me if self.cfg.role == MASTER else None)
        effects = self.node.start(st, epochs)
        await self.server.start()
        if self.node.restart_pending is not None:
            async with self.switching:
                await self._restart_as_master()
        else:
            await self.apply(effects)
        self._ticker = asyncio.create_task(self._tick_loop())

    async def _restart_as_master(self) -> None:
        """This node was master when it stopped: lead again (a new epoch), follow a newer
        master, or wait as a slave without a master (NodeCore.restart_step). Called at start
        and by every probe while it waits; holds `switching`."""
        views, down = await self.peers.views()
        node, cl = self.node, self.store.commitlog
        d = node.restart_step(views, cl.tail.offset)
        if d.what == "follow":
            log.warning("this node was master, but %s has taken over (a newer epoch): following it", d.arg)
            await self.apply(d.effects)
            return
        if d.what == "record":
            recorded, _ = await promotion.record_epoch(self, views, d.arg)
            d = node.restart_recorded(d.arg, recorded, cl.tail.offset, self.durable_end(),
                                      self.store.confirm_offset, _ms())
            if d.what == "open":
                if down:
                    log.info("starting as master; %s did not answer", ", ".join(down))
                await self.apply(d.effects)
                return
        if d.first:
            log.warning("this node was master, but does not lead again yet: %s", d.arg)
        await self.apply(d.effects)

    async def stop(self) -> None:
        self._stopping = True  # (the server serves until its own stop below: a refusal heard
        # meanwhile would spawn a switch that runs on after this node stopped)
        await cancel_and_wait(self._ticker, *self._jobs.values())
        if self.core is not None:
            for done in self.core.fail_all():
                done(Code.TERM_CHANGED, "the broker is stopping before the slaves acknowledged the "
                     "send: it may or may not be kept")
        if self.link is not None:
            await self.link.stop()
        await self.server.stop()
        self.peers.close()

    # --- the core's effects ----------------------------------------------------------------------

    async def apply(self, effects) -> None:
        """Carry out the core's effects in their order (see core.py)."""
        for e in effects:
            t = type(e)
            if t is StopLink:
                if self.link is not None:
                    await self.link.stop()
                    self.link = None
            elif t is StartLink:
                if e.master is not None:
                    self.link = MasterLink(self, e.master, self.ha_addresses[e.master])
                    self.link.start()
                    log.info("following master %s (%s)", e.master, self.ha_addresses[e.master])
                else:
                    log.info("slave without a master yet: looking for one among %s",
                             ", ".join(self.peers.addresses))
            elif t is StepDown:
                for done in e.waiting:
                    done(Code.TERM_CHANGED, "this node stopped being master before the slaves "
                         "acknowledged the send: it may or may not be kept")
                self.server.drop_all()
                self.store.set_confirm_offset(self.store.confirm_offset)  # what consumers saw stays
            elif t is Lead:
                self._lead(e)
            elif t is RoleChanged:
                self.ports.role_changed()
            else:
                self._apply_file(e)

    def _apply_file(self, e) -> None:
        t = type(e)
        if t is SaveRole:
            self.files.save_role(e.state)
        elif t is SaveEpochs:
            self.files.save_epochs(EpochList(e.epochs))
        else:
            raise TypeError(f"effect {e!r} cannot be carried out here")

    def _lead(self, e: Lead) -> None:
        """The core made this node master of `e.epoch` (its MasterCore exists)."""
        store, cl, core = self.store, self.store.commitlog, self.core
        if core.cfg.sync:
            store.set_confirm_offset(core.confirm)
        else:
            store.drop_confirm_offset()  # consumers see what the flush policy confirms
        store.recompute_queue_offsets()
        body = json.dumps({"epoch": e.epoch, "node": self.me}).encode()
        try:
            store.put([NewEntry(EPOCH_TOPIC, 0, 0, int(time.time() * 1000), os.urandom(16), b"", body)],
                      term=e.epoch)
        except OSError as err:  # the epoch is open all the same; its first send will start it
            log.error("could not write the epoch marker: %s", err)
        self._progress(core.local(cl.tail.offset, self.durable_end()))
        self.ports.schedule_dispatch()
        log.info("master of epoch %d from offset %d (replication %s, %d of %d replicas required)",
                 e.epoch, e.start, self.cfg.ha_replication, core.required(), len(self.addresses))

    # --- roles -----------------------------------------------------------------------------------

    def view(self) -> View:
        return self.node.view(self.store.commitlog.tail.offset)

    @property
    def fenced(self) -> bool:
        return self.node.fenced()

    @property
    def accepting_writes(self) -> bool:
        return self.role == MASTER and not self.fenced

    @property
    def role_name(self) -> str:
        return self.role

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
        why = core.admit(_ms())  # SYNC: enough replicas in sync; ASYNC: None unless it fences itself
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
        blocked = hello.node in self.addresses and self.ports.faults.blocks(hello.node)
        r = self.node.refuse_hello(hello.node, hello.epoch_seen, blocked)
        if r is None:
            return None
        if r.probe:
            self.spawn("probe", self._probe())  # someone newer exists: find out now
        return wire.Welcome(self.me, error=r.error, master=r.master)

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
        moved = core is not None and core.cfg.sync and core.confirm != self.store.external_confirm
        if moved:
            self.store.set_confirm_offset(core.confirm)
        for done in released:  # held by the replicas even if this node was demoted since
            done(Code.SUCCESS, None)
        if moved:
            # indexed lazily, as a raft leader does (Broker.schedule_dispatch: before the next
            # request that reads, at once for a parked long poll), so a consumer never pulls
            # behind an answer the producer got; one dispatch covers many reports
            self.ports.schedule_dispatch()
            self.server.wake_all()

    # --- slave side ----------------------------------------------------------------------------

    def hello(self) -> wire.Hello:
        cl = self.store.commitlog
        return wire.Hello(self.me, self.epochs.to_list(), cl.min_offset, cl.tail.offset, self.epoch_seen)

    def on_welcome(self, master: str, w: wire.Welcome) -> None:
        try:
            effects = self.node.on_welcome(master, w.epoch, w.epochs, w.start, w.truncate_to, w.reset)
        except Refused as e:
            raise wire.HAProtocolError(str(e)) from None
        cl = self.store.commitlog
        for e in effects:
            if type(e) is Reset:
                log.warning("this log shares nothing usable with master %s's (epochs %s vs %s): "
                            "dropping it (%d bytes) and copying the master's from offset %d", master,
                            [list(x) for x in e.old_epochs], w.epochs, cl.tail.offset - cl.min_offset, e.start)
                self.store.restart_at(e.start, w.first_index)
            elif type(e) is Truncate:
                end, idx = cl.tail.offset, cl.tail.next_index
                n = self.store.truncate_to_offset(e.offset)
                log.warning("cut this log at offset %d (the fork point with master %s): %d entries "
                            "(index %d..%d, %d bytes) were written after it by a master that lost its "
                            "place, and are gone", e.offset, master, n, idx - n, idx - 1, end - e.offset)
            else:
                self._apply_file(e)
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
            effects = [] if self.node.knows_term(codec.peek_ids(entries[-1])[1]) else \
                self.node.on_entries(self._terms(entries))
            store.append_as_follower(entries)
            for e in effects:
                self._apply_file(e)
            if self.sync_flush:
                self.ports.request_flush()
            else:
                self.link.report(store.commitlog.tail.offset)
        self._show(stream.confirm)

    def _terms(self, entries: list[bytes]) -> list[tuple[int, int]]:
        """(term, start offset) of each entry, as they will be appended."""
        out, pos = [], self.store.commitlog.tail.offset
        for raw in entries:
            _, term, phys = codec.peek_ids(raw)
            out.append((term, pos))
            pos = phys + len(raw)
        return out

    def _show(self, master_confirm: int) -> None:
        """Let consumers of this slave see up to the master's watermark (and what is here)."""
        limit = min(master_confirm, self.durable_end())
        if limit > (self.store.external_confirm or 0):
            self.store.set_confirm_offset(limit)
            self.ports.schedule_dispatch()

    def on_master_lost(self, master: str) -> None:
        s = self.link.stream if self.link is not None else None
        self.node.on_master_lost(master, max(0, s.master_end - self.durable_end()) if s is not None else None)
        log.warning("lost the connection to master %s (this log %d bytes behind it then)", master,
                    self.node.lag_at_loss or 0)
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
            await self.apply(self.node.on_switch(master))

    # --- housekeeping ------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        cfg = self.cfg
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            try:
                expired, silent, lapsed = self.node.tick(_ms())
                for done, code, why in expired:
                    done(code, why)
                for node in silent:
                    log.warning("slave %s reported nothing for %d ms: dropping it", node,
                                cfg.ha_housekeeping_interval_ms)
                    self.server.drop(node)
                if lapsed:  # still fenced (writes refused) until fence_lapsed steps down
                    log.warning("the switchover that fenced this master did not complete within "
                                "leadership_transfer_timeout_ms: it stops taking writes and asks the "
                                "members whether a new master leads before it leads again")
                    self.spawn("fence-lapsed", self._fence_lapsed())
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
        if self._stopping or (t is not None and not t.done()):
            coro.close()
            return
        t = self._jobs[name] = asyncio.ensure_future(coro)
        t.add_done_callback(lambda t: t.cancelled() or t.exception() is None or
                            log.error("%s failed: %r", name, t.exception()))
        t.add_done_callback(lambda t: self._jobs.pop(name) if self._jobs.get(name) is t else None)

    async def _fence_lapsed(self) -> None:
        async with self.switching:  # (a follow may have come first: then there is nothing to do)
            await self.apply(self.node.fence_lapsed(_ms()))

    async def _probe(self) -> None:
        if self.restart_pending is not None:
            async with self.switching:
                if self.restart_pending is not None and self.role == SLAVE:
                    await self._restart_as_master()
            return
        views, _ = await self.peers.views()
        async with self.switching:
            was_master = self.role == MASTER
            target, effects = self.node.on_views(views, self.store.commitlog.tail.offset, _ms())
            if not effects:
                return
            if target is None:  # (roles.promoted_elsewhere)
                log.warning("%s: this node stops taking writes and asks the members before it leads again",
                            self.restart_pending)
            elif was_master:
                log.warning("%s is master of a newer epoch: this node stops taking writes and follows it",
                            target)
            await self.apply(effects)

    async def sync_metadata(self) -> None:
        """Copy the master's topic configs, consumer offsets (RocketMQ's SlaveSynchronize) and
        runtime users and roles (acl.json: a promoted slave enforces the same users)."""
        if self.role != SLAVE or self.master is None:
            return
        try:
            m = await self.peers.call(self.master, Req.GET_METADATA, None, 5.0, SyncedMetadata)
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
        acl = getattr(self.ports.system, "acl", None)
        if m.acl is not None and acl is not None:
            try:
                acl.replace(m.acl)
            except (ValueError, TypeError, AttributeError, KeyError, OSError) as e:
                log.warning("metadata sync from %s: its users and roles were not copied: %s", self.master, e)
        self._metadata_synced_at = time.monotonic()

    def metadata(self) -> SyncedMetadata:
        acl = getattr(self.ports.system, "acl", None)
        return SyncedMetadata([t.__dict__ for t in self.ports.topics.topics.values()],
                              self.ports.offsets.offsets, acl.state() if acl is not None else None)

    # --- promotion (replication/master_slave/promotion.py) ------------------------------------

    async def handle_role_request(self, req: HARole) -> dict:
        return await promotion.handle(self, req)

    def lag(self) -> int | None:
        link = self.link
        connected = link is not None and link.connected and link.stream is not None
        return self.node.lag(link.stream.master_end if connected else None, self.durable_end())

    # --- status and retention --------------------------------------------------------------------------

    def status(self) -> dict:
        now = time.monotonic()
        s = {"role": self.role, "node_id": self.me, "epoch": self.epochs.last_epoch,
             "epoch_seen": self.epoch_seen, "epochs": self.epochs.to_list(), "master": self.master,
             "master_address": self.master_address(), "fenced": self.fenced,
             "ha_replication": self.cfg.ha_replication, "ha_address": self.ha_addresses[self.me],
             "peers": dict(self.addresses), "promotions": self.node.promotions,
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
