"""The one interface a broker drives its replication through, and the standalone mode.

    Replication (this module)            mode standalone: the store alone
    raft.driver.RaftDriver               mode raft: quorum commit through the log
    master_slave.driver.MasterSlaveDriver  mode master-slave: HA streams, epochs, promotion

The broker calls only what `Replication` declares; processors never ask which mode runs.
A replication sees the broker through `Ports`, the narrow part it may use (the store, its
config, the flush request, the dispatcher, the system entries, ...), never the Broker.

What a mode does not offer answers BAD_REQUEST naming the mode that does (transfer-leader
needs raft, promotion master-slave).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from broker.protocol.codes import BadRequest, Code
from broker.system import OFFSET_TOPIC

Done = Callable[[int, "str | None"], None]  # done(code, error message)


@dataclass
class Ports:
    """What a replication may use of its broker."""
    store: Any  # broker.store.message_store.MessageStore
    config: Any  # broker.config.BrokerConfig
    data_dir: Path
    faults: Any  # broker.faults.FaultSwitch: a drill's dropped peers
    topics: Any  # broker.topics.TopicManager (master-slave metadata sync)
    offsets: Any  # broker.offsets.OffsetManager (likewise)
    system: Any  # broker.system.SystemEntries: applies topic configs and offsets
    request_flush: Callable[[], None]  # ask the flusher for a round now
    # index what became visible: lazily, yet before any request that reads (Broker.schedule_dispatch)
    schedule_dispatch: Callable[[], None]
    dispatch_now: Callable[[], None]  # ... now (before this callback returns)
    role_changed: Callable[[], None]  # this node's role changed: clients may need redirecting
    persist_offsets: Callable[[Done], None]  # write the consumer offsets, then done(code, error)


class Replication:
    """Standalone: every request is served here; a send is answered by the store's flush
    policy; topic configs and offsets are applied where they are made."""

    mode = "standalone"
    # the store's flush may make more visible (standalone, master-slave); raft commits do that
    dispatch_after_flush = True

    def __init__(self, ports: Ports):
        self.ports = ports

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def handlers(self) -> dict:
        """Request code -> handler(conn, frame) that this mode adds to the broker's."""
        return {}

    # --- requests ------------------------------------------------------------------------------

    def check(self, kind: str, headers: dict | None = None) -> None:
        """Raise replication.errors.NotLeader unless this node serves a request of `kind`:
        "write" (sends, topic changes), "commit" (offset commits), "group" (offset queries,
        heartbeats) or "read" (pulls, lookups)."""

    @property
    def accepting_writes(self) -> bool:
        return True

    @property
    def role_name(self) -> str:
        return "standalone"

    @property
    def leader_id(self) -> str | None:
        """The member that takes writes now (raft: the leader, master-slave: the master), as
        far as this node knows; None if none is known. Standalone: this node (its name)."""
        return self.ports.config.node_id or self.ports.config.broker_name

    def append(self, items: list, done: Done | None) -> tuple[Any, bool]:
        """Store a send: (PutBatch, whether `done(code, error)` will be called once the
        replicas hold it; if False the send is answered by the flush policy)."""
        return self.ports.store.put(items), False

    def commit_system(self, topic: str, body: bytes, done: Done) -> None:
        """Make a system entry (broker.system: a topic config, consumer offsets) take effect,
        then done(code, error). Here: applied now; offsets answered once on disk."""
        self.ports.system.apply(topic, body)
        if topic == OFFSET_TOPIC:
            self.ports.persist_offsets(done)
        else:
            done(Code.SUCCESS, None)

    def share_auto_created(self, topic: str, body: bytes) -> None:
        """A send auto-created a topic here (already applied): let the other members know."""

    def transfer_leader(self, target: str) -> str | None:
        raise BadRequest(f"transfer-leader needs mode raft (this node runs {self.mode})")

    async def handle_role_request(self, req) -> dict:
        raise BadRequest(f"promotion needs mode master-slave (this node runs {self.mode})")

    def metadata(self):
        raise BadRequest(f"GET_METADATA needs mode master-slave (this node runs {self.mode})")

    def on_faults_changed(self, drop_peers) -> None:
        """A drill changed the peers this node drops traffic with."""

    # --- events from the broker ------------------------------------------------------------------

    def on_flushed(self, offset: int) -> None:
        pass

    def on_dispatched(self, touched) -> None:
        pass

    def after_input(self) -> None:
        """The frames of one read were handled: send what they made (peer traffic) now."""

    # --- status and retention ------------------------------------------------------------------

    def retention_holders(self) -> list:
        """Segments retention must keep for replicas that still need them."""
        return []

    def status(self) -> dict:
        return {}
