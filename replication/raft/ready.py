"""Applying a RaftNode's Ready: the one place that decides the order of its effects.

The broker's driver (driver.py), the simulation (sim.py) and the unit harness
(tests/unit/raft_harness.py) all call `apply_ready`; each brings its own `ReadyPorts` (the
real store, hard-state file and peer links; a fake disk with a page cache and a fake
network; a MemLog and a queue). So the order the simulation checks is the order the broker
runs. The ports do the I/O; this module does none.

The order, and why it is safe:
  1. `save_hard_state`: the term and vote are replaced atomically and fsynced before the
     call returns (HardStateFile: write, fsync, rename, fsync the directory). A vote or a
     message of a new term is created by the same input and only sent in step 3, so no one
     hears of a vote this node could forget in a crash (two leaders in one term).
  2. the log: `reset_to` (the first entry of `append` restarts the log) or `truncate_from`,
     then `append`. These are written, not yet fsynced.
  3. messages. If step 2 wrote anything beyond what is durable (`unsynced_mark`), every
     message of this Ready waits in `ports.outbox` until the flusher reports the log durable
     up to that mark (`release`, from the driver's `on_flushed`), and a flush is requested.
     Messages are released in order, and one that needs nothing waits behind any that
     wait, because it may vouch for the same writes (a COMPARE answered from an entry not
     yet fsynced). So an ack never promises more than the disk holds: a follower that acks
     and then loses power still holds what it acked. The fsync is asynchronous (the store's
     group-commit flusher); an fsync that fails never reports, so what waits is never sent
     (the store refuses writes until a restart re-reads the files).
     A cut (step 2 truncated or reset the log) drops every message still waiting: each may
     vouch for entries the cut removed, and the mark it waits for may now lie beyond the
     log's end, where no flush would ever reach (the node would go mute). A dropped message
     is what a lossy network does anyway; the leader's timeouts resend.
     Without a write (or with `flush: async`, whose mark is always None) messages go out at
     once, unless older ones still wait.
  4. `role_changed`, then `committed`: a commit index is a quorum's fact, so it is applied
     even while this node's own copy waits for its fsync (after a power loss the store's
     recovery clamps it to the log it still holds). Then `append_noop` for a new leader,
     whose own appends count toward a quorum only once fsynced (the driver's
     `local_waiting`, mirrored by the simulation).
An exception from steps 1-2 propagates with nothing of the Ready sent or applied; the caller
decides what follows (the driver restarts its core from disk, the simulation crashes the node).
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from replication.raft.core import HardState, Ready
from replication.raft.messages import Entry, Message


class Outbox:
    """Messages waiting for the log to be durable up to a mark, in the order they were made."""

    def __init__(self):
        self.q: deque = deque()  # (mark needed, peer, message)

    def __bool__(self) -> bool:
        return bool(self.q)

    def __len__(self) -> int:
        return len(self.q)

    def hold(self, need: int, to: str, msg: Message) -> None:
        self.q.append((need, to, msg))

    def take(self, durable: int) -> list[tuple[str, Message]]:
        out = []
        while self.q and self.q[0][0] <= durable:
            _, to, msg = self.q.popleft()
            out.append((to, msg))
        return out

    def clear(self) -> None:
        self.q.clear()


class ReadyPorts(Protocol):
    outbox: Outbox

    def save_hard_state(self, hs: HardState) -> None: ...  # durable (fsynced) when it returns

    def reset_to(self, first: Entry) -> None: ...  # delete everything; the log restarts with `first`

    def truncate_from(self, index: int) -> None: ...  # delete entries >= index

    def append(self, entries: list[Entry]) -> None: ...  # write (durable only once flushed)

    def unsynced_mark(self) -> int | None: ...  # the written end if beyond the durable one

    def request_flush(self) -> None: ...  # the flusher fsyncs, then calls `release`

    def send(self, to: str, msg: Message) -> None: ...

    def role_changed(self, is_leader: bool) -> None: ...

    def committed(self, index: int) -> None: ...

    def append_noop(self) -> None: ...


def apply_ready(node, ports: ReadyPorts) -> Ready:
    """Take `node`'s Ready and apply all of it through `ports`, in the order above."""
    r = node.ready()
    if r.empty():
        return r
    if r.hard_state is not None:
        ports.save_hard_state(r.hard_state)
    entries = r.append
    cut = r.reset_to is not None or r.truncate_from is not None
    if r.reset_to is not None:
        ports.reset_to(entries[0])
        entries = entries[1:]
    elif r.truncate_from is not None:
        ports.truncate_from(r.truncate_from)
    if entries:
        ports.append(entries)
    out = ports.outbox
    if cut:
        out.clear()
    need = ports.unsynced_mark() if cut or entries else None
    for to, msg in r.messages:
        if need is None and not out:
            ports.send(to, msg)
        else:
            out.hold(need if need is not None else -1, to, msg)
    if need is not None:
        ports.request_flush()
    if r.role_changed:
        ports.role_changed(node.is_leader)
    if r.commit_index is not None:
        ports.committed(r.commit_index)
    if r.append_noop:
        ports.append_noop()
    return r


def release(ports: ReadyPorts, durable: int) -> int:
    """The log is durable up to `durable`: send what waited for it (and what waited behind
    it). Returns how many messages went out."""
    sent = ports.outbox.take(durable)
    for to, msg in sent:
        ports.send(to, msg)
    return len(sent)
