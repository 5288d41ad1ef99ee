"""Runs the Raft core inside a broker: ticks, the peer transport, persistence through the
store's role-named API, and the answers to clients waiting for a quorum.

The order of a Ready's effects is decided in ready.py (`apply_ready`, shared with the
simulation and the unit harness); `StorePorts` below does its I/O here:
  1. the hard state (term, vote) is written and fsynced;
  2. the log changes (reset / truncate_suffix / append_as_follower) are written;
  3. messages are sent -- with `flush: sync`, only once the writes of step 2 are fsynced
     (they wait in the outbox until `on_flushed`), so an ack never promises more than the
     disk holds;
  4. the commit index is applied: the store may show entries up to it to consumers, and
     the leader answers the clients whose appends it now covers.
A leader counts its own appends toward the quorum only once they are durable under the
flush policy (`flush: sync`: after the group-commit fsync).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from collections import deque
from broker.protocol.codes import BadRequest, Code, Req
from broker.ratelog import RateLimitedLog
from broker.store.commitlog import FollowerMismatch, NewEntry, StoreNotWritable
from broker.store.files import DiskFull
from broker.system import NOOP_TOPIC
from broker.tasks import cancel_and_wait
from replication.base import Done, Ports, Replication
from replication.errors import NotLeader
from replication.raft import lane, wire
from replication.raft.leader_lane import LeaderAnswers, LeaderLane, leader_answers
from replication.raft.acks import PendingAcks
from replication.raft.core import RaftConfig, Role
from replication.raft.node import RaftNode
from replication.raft.ready import Outbox, apply_ready, release
from replication.raft.state import HardStateFile
from replication.raft.storelog import StoreLog
from replication.raft.transport import PeerLink

log = logging.getLogger(__name__)



class RaftDriver(Replication):
    mode = "raft"
    dispatch_after_flush = False  # the commit index, never the flush, says what consumers see

    def __init__(self, ports: Ports):
        super().__init__(ports)
        self.store = ports.store
        cfg = self.bcfg = ports.config
        self.sync = cfg.flush == "sync"
        self.addresses = {p.id: p.address for p in cfg.peers}
        self._drops = RateLimitedLog(log)  # dropped messages: a line a second per kind
        member = cfg.member_credentials()
        self.links = {pid: PeerLink(pid, addr, cfg.frame_bytes_max, credentials=member,
                                    on_connected=self._link_up)
                      for pid, addr in self.addresses.items() if pid != cfg.node_id}
        self.state_file = HardStateFile(ports.data_dir / "raft_state.json")
        self.acks = PendingAcks()
        self.io = StorePorts(self)  # apply_ready's ports over the store
        self.local_waiting: deque = deque()  # leader, sync: (end offset, last index) to fsync
        self.node: RaftNode | None = None
        self._ticker: asyncio.Task | None = None
        self._period = cfg.raft_tick_ms / 1000
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_tick_at = 0.0  # (loop time) when the core's next tick is due
        self._wake_at = 0.0  # when the tick loop wakes next
        self._wake: asyncio.Future | None = None  # resolved to wake it sooner (_rearm)
        self.clock = {"ticks": 0, "wakes": 0}  # ticks run, and times the tick loop woke (status)
        # a follower indexes what is committed at or after this time.monotonic(), the first time
        # one interval after start like every later time (a catch-up is not indexed all at once)
        self._dispatch_at = time.monotonic() + self.bcfg.raft_follower_dispatch_interval_ms / 1000
        self.elections_won = 0
        self.lane_pushes = 0  # pushes the follower lane took (lane.py)
        # the follower lane (lane.py): flush: async only (with sync, answers wait for the fsync)
        self.lane_on = cfg.raft_follower_lane and lane.follower_pushes is not None and not self.sync
        # the leader lane (leader_lane.py): flush: async only (with sync, pushes follow the fsync)
        self.leader_lane = LeaderLane(self) if cfg.raft_leader_lane and not self.sync else None
        self.leader_lane_pushes = 0  # sends it pushed
        self.leader_lane_answers = 0  # followers' answers it took (LeaderAnswers)

    def raft_config(self) -> RaftConfig:
        c = self.bcfg
        return RaftConfig(
            node_id=c.node_id, voters=tuple(p.id for p in c.peers),
            election_ticks=c.ticks(c.raft_election_timeout_ms),
            heartbeat_ticks=c.ticks(c.raft_heartbeat_interval_ms),
            push_timeout_ticks=c.ticks(c.raft_push_timeout_ms),
            max_pending_entries=c.raft_max_pending_entries,
            push_batch_bytes_max=c.raft_push_batch_bytes_max,
            ticks_per_second=max(1, 1000 // c.raft_tick_ms),
            peer_push_quota_bytes_per_s=c.raft_peer_push_quota_bytes_per_s,
            peer_push_throttle_point_bytes=c.raft_peer_push_throttle_point_bytes,
            leadership_transfer_lag_entries_max=c.leadership_transfer_lag_entries_max,
            transfer_timeout_ticks=c.ticks(c.leadership_transfer_timeout_ms),
            preferred_leader=c.preferred_leader, pre_vote=c.raft_pre_vote,
            check_quorum=c.raft_check_quorum)

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        self._new_core()
        self._loop = asyncio.get_running_loop()
        self._next_tick_at = self._loop.time() + self._period
        self._ticker = asyncio.create_task(self._tick_loop())

    def _new_core(self) -> None:
        self.node = RaftNode(self.raft_config(), StoreLog(self.store.commitlog), self.state_file.load(),
                             self.store.committed_index, random.Random())
        self.io.outbox.clear()
        self.local_waiting.clear()

    async def stop(self) -> None:
        await cancel_and_wait(self._ticker)
        self._loop = None  # the clock stops: no ticks run from here on (_clock), so a node
        # shutting down does not campaign or step down on the ticks since its loop stopped
        for done in self.acks.term_changed(None):
            done(Code.TERM_CHANGED, "the broker is stopping: the append may or may not commit")
        for link in self.links.values():
            link.close()

    # --- the clock -------------------------------------------------------------------------------

    async def _tick_loop(self) -> None:
        """Ticks the core every raft_tick_ms -- but an idle node sleeps through the ticks that
        would only count (RaftNode.quiet_ticks, see _quiet) and runs them when it wakes or
        before its next input (_clock), so the core sees the same ticks in the same order
        (the raft simulation's lazy_ticks runs give the same runs as a tick per step). An idle
        leader's loop wakes for its heartbeats; an idle follower's at its election deadline,
        which each heartbeat moves on (its inputs run its ticks)."""
        loop = self._loop
        while True:
            try:
                quiet = self._quiet()
            except Exception:
                log.exception("raft tick loop: could not tell the quiet ticks; ticking")
                quiet = 0
            self._wake_at = self._next_tick_at + self._period * quiet
            self._wake = loop.create_future()
            timer = loop.call_at(self._wake_at, _wake_up, self._wake)
            try:
                await self._wake
            finally:
                timer.cancel()
            self.clock["wakes"] += 1
            try:
                # a timer's wake runs the ticks up to its time: libuv's clock counts whole ms,
                # so it may wake a fraction of a ms early (then it would only sleep again)
                self._clock(self._wake_at if self._wake.result() is None else None)
                store = self.store
                if (not self.node.is_leader and store.confirm_offset > store.cqs.dispatched_offset
                        and time.monotonic() >= self._dispatch_at):
                    self._follower_dispatch()
                for done in self.acks.expired(time.monotonic()):
                    done(Code.WAIT_QUORUM_ACK_TIMEOUT, "no quorum acked in wait_quorum_ack_timeout_ms:"
                         " the append may or may not commit")
            except Exception:
                log.exception("raft tick failed; continuing")

    def _quiet(self) -> int:
        """Ticks the loop may sleep through: the core's quiet ones, none while sends wait for
        a quorum (their deadline is checked on every tick), and a follower with committed
        entries to index wakes for its next raft_follower_dispatch_interval_ms."""
        quiet = self.node.quiet_ticks()
        if quiet and self.acks:
            return 0
        store = self.store
        if quiet and not self.node.is_leader and store.confirm_offset > store.cqs.dispatched_offset:
            quiet = min(quiet, int(max(0.0, self._dispatch_at - time.monotonic()) / self._period))
        return quiet

    def _clock(self, until: float | None = None) -> None:
        """Run the ticks that are due, those the loop slept through included: before any
        input, so that the core never sees an input at a stale tick (its read lease, a
        follower's election timer and a push's timeout count ticks)."""
        if self._loop is None:
            return  # not started
        now = self._loop.time() if until is None else max(until, self._loop.time())
        while now >= self._next_tick_at:
            self._next_tick_at += self._period
            self.clock["ticks"] += 1
            try:  # (a tick's failure is the tick's: the input that ran it goes on)
                self.node.tick()
                self._process()
            except Exception:
                log.exception("raft tick failed; continuing")

    def _rearm(self) -> None:
        """After an input: if the loop sleeps through ticks and the core now has something
        to do sooner (an entry to push, a send waiting for its quorum), wake it."""
        wake = self._wake
        if wake is not None and not wake.done() and self._wake_at > self._next_tick_at and \
                self._next_tick_at + self._period * self._quiet() < self._wake_at:
            wake.set_result("input")

    # --- inputs ----------------------------------------------------------------------------------

    def on_frame(self, body, sender: str | None = None) -> None:
        """`sender`: the member the connection's certificate proves (None without TLS)."""
        try:
            msg = wire.decode(body)
        except BadRequest as e:
            return self._dropped("undecodable", "a raft message that does not decode (from %s): %s", sender, e)
        if msg.src not in self.addresses or msg.src == self.node.id:
            return self._dropped("stranger", "a raft message from %r, not a member of this group", msg.src)
        if self.bcfg.secure and msg.src != sender:
            return self._dropped("impostor", "a raft message claiming to be from %s on a connection whose "
                                 "certificate proves %s", msg.src, sender)
        if self.ports.faults.blocks(msg.src):
            return
        self._clock()
        self.node.step(msg)
        self._process()

    def _dropped(self, kind: str, fmt: str, *args) -> None:
        """Log a dropped message, at most once a second per kind (a flood is a line a second)."""
        self._drops.warning(kind, "dropping " + fmt, *args)

    def _send(self, to: str, msg) -> None:
        if not self.ports.faults.blocks(to):
            self.links[to].send(msg)

    def _send_encoded(self, to: str, parts: tuple) -> None:
        """_send of a message encoded already that is no APPEND push (PeerLink.send_encoded)."""
        if not self.ports.faults.blocks(to):
            self.links[to].send_encoded(parts)

    def _send_append(self, to: str, parts: tuple, term: int, last: int) -> None:
        """_send of an APPEND push encoded already (PeerLink.send_append)."""
        if not self.ports.faults.blocks(to):
            self.links[to].send_append(parts, term, last)

    def on_flushed(self, offset: int) -> None:
        """The CommitLog is durable up to `offset`: release what waited for it."""
        self._clock()
        release(self.io, offset)
        last = None
        while self.local_waiting and self.local_waiting[0][0] <= offset:
            last = self.local_waiting.popleft()[1]
        if last is not None:
            self.node.local_appended(last)
            self._process()

    # --- the leader's writes ------------------------------------------------------------------

    def leader_append(self, items: list, done: Done | None = None):
        """Append as the leader; `done` is answered once a quorum holds it (or it fails)."""
        self._clock()
        node = self.node
        if not node.accepting_writes:
            code = Code.LEADER_TRANSFERRING if node.is_leader else Code.NOT_LEADER
            raise NotLeader(self.leader_address(), code)
        batch = self.store.put(items, term=node.term)
        last = batch.indexes[-1]
        if done is not None:
            deadline = time.monotonic() + self.bcfg.wait_quorum_ack_timeout_ms / 1000
            self.acks.add(last, node.term, deadline, done)
        if self.sync:  # the entries wait for the fsync, and the tick may push them first
            self._rearm()  # (the other paths reach _process, which rearms)
            self.local_waiting.append((batch.end_offset, last))
            self.ports.request_flush()
        elif node.peers:
            # at once: the pushes leave in this pass. Nothing can commit here (the new entries
            # need a follower's answer, and every earlier one counted as soon as it was
            # written), so no `done` runs before the caller has finished its bookkeeping
            if self._lane_pushed(last):
                self._rearm()
                return batch
            try:
                self._local_appended(last)
            except Exception:  # e.g. reading the entries back for a push: the entry is stored,
                # so the send must not fail here; the tick pushes again (as when this ran as
                # a callback of its own)
                log.exception("pushing new entries failed; the next tick tries again")
                self._rearm()
        else:  # a group of one commits here: from the next pass, after the caller's bookkeeping
            asyncio.get_running_loop().call_soon(self._local_appended, last)
        return batch

    def _lane_pushed(self, last: int) -> bool:
        """The leader lane pushed the entries up to `last` (leader_lane.py). A failure is a
        bug: the lane goes off for good in this process, and the core's path pushes what the
        lane did not (Progress only ever records a push as sent, never as held: a push lost
        here is resent after its timeout, and nothing commits on the lane's word)."""
        ll = self.leader_lane
        if ll is None:
            return False
        try:
            return ll.push_new(last)
        except Exception:
            self.leader_lane = None
            log.exception("the raft leader lane failed; it is off until the broker restarts")
            return False

    def append(self, items: list, done: Done | None):
        """The broker's entry point for sends: (PutBatch, whether `done` will be called).
        A send's answer goes out before the commit's dispatch (see _committed)."""
        return self.leader_append(items, SendAck(done) if done is not None else None), done is not None

    def check(self, kind: str, headers: dict | None = None) -> None:
        """Only the leader serves reads and writes (the broker's serve_or_raise); reads and
        group queries only while it holds its read lease (RaftNode.read_lease_held: no other
        node can have been elected yet), so a deposed leader stops serving them before a new
        leader can exist (issue 13, item 8)."""
        self._clock()  # (the read lease counts ticks)
        if not self.node.is_leader:
            raise NotLeader(self.leader_address())
        if kind in ("read", "group") and not self.node.read_lease_held:
            raise NotLeader(self.leader_address(), why=f"{self.bcfg.node_id} leads but has not heard from a "
                            "quorum within its read lease: it may have been replaced; retry")

    @property
    def accepting_writes(self) -> bool:
        return self.node.accepting_writes

    @property
    def role_name(self) -> str:
        return self.node.role.value

    def on_dispatched(self, touched) -> None:
        pass

    def retention_holders(self) -> list:
        return self.store.holders_for_replicas(self.follower_watermarks()) if self.node.is_leader else []

    def _link_up(self, peer: str) -> None:
        self._clock()
        self.node.link_up(peer)  # (links connect only to send, which needs a node)
        self._process()
        self.after_input()

    def _local_appended(self, last: int) -> None:
        self.node.local_appended(last)
        self._process()

    def after_input(self) -> None:
        """Pushes and answers leave now, not a loop pass later: one write per peer per read."""
        for link in self.links.values():
            link.flush()

    def append_system(self, topic: str, body: bytes, done: Done | None = None) -> None:
        item = NewEntry(topic, 0, 0, int(time.time() * 1000), os.urandom(16), b"", body)
        self.leader_append([item], done)

    def commit_system(self, topic: str, body: bytes, done: Done) -> None:
        """Through the log: every member applies it once committed (the dispatcher's
        system stage); `done` once a quorum holds it."""
        self.append_system(topic, body, done)

    def share_auto_created(self, topic: str, body: bytes) -> None:
        self.append_system(topic, body)  # the others learn it from the log, before the messages

    def handlers(self) -> dict:
        return {Req.RAFT: self._raft_frame}

    def _raft_frame(self, conn, f) -> None:
        if conn.decoder.lane is None:  # the next frames may take a lane (it lets go of the
            # connection when this node's role is not its own any more)
            node = self.node
            if self.lane_on and node.role is Role.FOLLOWER:
                conn.decoder.lane = lane.FollowerLane(self, conn)
            elif self.leader_lane is not None and node.leading is not None and leader_answers is not None:
                conn.decoder.lane = LeaderAnswers(self, conn)
        self.on_frame(f.body, conn.member)

    def transfer_leader(self, target: str) -> str | None:
        self._clock()
        err = self.node.transfer_leader(target)
        self._process()
        return err

    # --- Ready ---------------------------------------------------------------------------------

    def _process(self) -> None:
        """Apply the core's Ready (ready.py decides the order; these ports do the I/O)."""
        try:
            apply_ready(self.node, self.io)
        except (FollowerMismatch, DiskFull, StoreNotWritable, OSError, ValueError) as e:
            self.persist_failed(e)
        self._rearm()

    def persist_failed(self, e: Exception) -> None:
        """A step's writes failed (nothing of it was sent): the core restarts from the disk."""
        log.error("could not persist a raft step (%s): restarting the raft core from what "
                  "is on disk; nothing of that step was said to anyone", e)
        self._fail_acks("this node stopped leading: the append may or may not commit")
        self._new_core()

    def _role_changed(self) -> None:
        node = self.node
        if node.is_leader:
            log.info("leading term %d (log ends at %d, committed %d)", node.term,
                     node.log.last_index(), node.commit_index)
            self._follower_dispatch()  # what it held as a follower, before it serves reads
            self.store.recompute_queue_offsets()
        else:
            self._fail_acks("leadership moved before a quorum held the append: it may or may not commit")
            self.local_waiting.clear()
        self.ports.role_changed()

    def _fail_acks(self, why: str) -> None:
        for done in self.acks.term_changed(None):
            done(Code.TERM_CHANGED, why)

    def _committed(self, index: int) -> None:
        store = self.store
        store.set_committed(index)
        if not self.node.is_leader:
            # Off the replication path: a follower serves no reads, so its ConsumeQueues and
            # key index are built from the tick loop every raft_follower_dispatch_interval_ms
            # (many pushes at once), or at once when raft_follower_dispatch_lag_bytes_max of
            # committed entries wait; and completely when it becomes the leader
            # (_role_changed), before it serves anything.
            if store.confirm_offset - store.cqs.dispatched_offset >= self.bcfg.raft_follower_dispatch_lag_bytes_max:
                self._follower_dispatch()
            return
        dones = self.acks.committed(index, self.node.term)
        # Sends are answered first, then the dispatch (lazily when only sends committed: a
        # request that reads runs it first, Broker.schedule_dispatch), then the rest: admin
        # answers read what the dispatch applies (topic configs, ACLs).
        rest = None
        for done in dones:
            if type(done) is SendAck:
                done.done(Code.SUCCESS, None)
            elif rest is None:
                rest = [done]
            else:
                rest.append(done)
        if rest is None:
            self.ports.schedule_dispatch()
            return
        self.ports.dispatch_now()
        for done in rest:
            done(Code.SUCCESS, None)

    def _follower_dispatch(self) -> None:
        self._dispatch_at = time.monotonic() + self.bcfg.raft_follower_dispatch_interval_ms / 1000
        self.ports.dispatch_now()

    def follower_watermarks(self) -> dict[str, int]:
        lead = self.node.leading
        return {} if lead is None else {p.peer: p.watermark for p in lead.progress.values()}

    # --- status --------------------------------------------------------------------------------

    @property
    def leader_id(self) -> str | None:
        return self.node.leader_id if self.node else None

    def leader_address(self) -> str | None:
        lid = self.leader_id
        return self.addresses.get(lid) if lid else None

    def status(self) -> dict:
        self._clock()
        s = self.node.status()
        s["leader_address"] = self.leader_address()
        s["peers"] = dict(self.addresses)
        s["elections_won"] = self.elections_won
        s["clock"] = dict(self.clock)
        s["lane_pushes"] = self.lane_pushes
        s["leader_lane_pushes"] = self.leader_lane_pushes
        s["leader_lane_answers"] = self.leader_lane_answers
        return s


def _wake_up(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


class SendAck:
    """A send's `done`: answered before the dispatch of the commit that covers it."""
    __slots__ = ("done",)

    def __init__(self, done: Done):
        self.done = done

    def __call__(self, code: int, error: str | None) -> None:
        self.done(code, error)


class StorePorts:
    """apply_ready's ports over the broker: the hard-state file, the store's role-named
    writes, the group-commit flusher and the peer links (marks are CommitLog offsets)."""

    def __init__(self, driver: RaftDriver):
        self.d = driver
        self.outbox = Outbox()

    def save_hard_state(self, hs) -> None:
        self.d.state_file.write(hs)  # atomic, fsynced (HardStateFile)

    def reset_to(self, first) -> None:
        log.warning("log reset to index %d: it no longer overlaps the leader's", first[0])
        self.d.store.reset_to(first[2])

    def truncate_from(self, index: int) -> None:
        log.info("truncating the uncommitted suffix from index %d", index)
        self.d.store.truncate_suffix(index)

    def append(self, entries) -> None:
        self.d.store.append_as_follower([e[2] for e in entries])

    def unsynced_mark(self) -> int | None:
        # flush: sync only (a truncation alone leaves nothing unsynced: recovering the cut
        # entries would only make the leader compare again)
        cl = self.d.store.commitlog
        return cl.tail.offset if self.d.sync and cl.tail.offset > cl.flushed.offset else None

    def request_flush(self) -> None:
        self.d.ports.request_flush()

    def send(self, to: str, msg) -> None:
        self.d._send(to, msg)

    def role_changed(self, is_leader: bool) -> None:
        self.d._role_changed()

    def committed(self, index: int) -> None:
        self.d._committed(index)

    def append_noop(self) -> None:
        self.d.elections_won += 1
        self.d.append_system(NOOP_TOPIC, b"")

