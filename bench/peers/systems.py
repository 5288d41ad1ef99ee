"""The systems `make bench-peers` compares, by the keys compare.sh's SYSTEMS takes, and how each
is started and stopped.

Tidelog groups come from the project's own LocalCluster (ops/cluster.py), started the way
`tidelog cluster up --insecure --fresh` starts them (the CLI's defaults otherwise): security off,
as NATS runs without TLS or auth. NATS from bench/peers/nats_cluster.py.

Both are stopped when their `with` block ends, however it ends. The brokers are detached the way
`cluster up` detaches them (setsid through ops/nodes.py's shell), so no parent-death signal can
tie them to the harness: if the harness is SIGKILLed, bench/peers/reaper.py stops them.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator, NamedTuple

from bench.peers.nats_cluster import NatsCluster


class System(NamedTuple):
    key: str            # what SYSTEMS names
    kind: str           # "nats" | "tidelog"
    nodes: int
    label: str          # tidelog: "raft3"...; nats: "R3"... (after "nats <version> ")
    mode: str = ""      # tidelog: raft | standalone | master-slave
    flush: str = "async"
    sync_interval: str | None = None   # nats: "always" = fsync before the PubAck
    config: tuple = ()  # tidelog: broker config fields, (name, value) pairs


SYSTEMS = {s.key: s for s in (
    System("nats3", "nats", 3, "R3"),
    System("nats1", "nats", 1, "R1"),
    System("nats3sync", "nats", 3, "R3 sync", sync_interval="always"),
    System("raft", "tidelog", 3, "raft3", "raft"),
    System("raftsync", "tidelog", 3, "raft3-sync", "raft", flush="sync"),
    System("standalone", "tidelog", 1, "standalone", "standalone"),
    System("ms", "tidelog", 2, "ms-sync", "master-slave",
           config=(("ha_replication", "sync"), ("in_sync_replicas", 2))),
)}
DEFAULT = "nats3 nats1 nats3sync raft raftsync standalone ms"


class Target(NamedTuple):
    """A running system, what the client loop needs of it."""
    system: System
    name: str            # the row's name: "nats v2.15.1 R3", "tidelog raft3" (compare.sh's)
    servers: list[str]   # client addresses
    pids: list[int]      # every server process, for CPU accounting
    leader: str | None   # tidelog: the leader's / master's address (NATS: per stream, found later)


def parse(keys: str) -> list[System]:
    unknown = [k for k in keys.split() if k not in SYSTEMS]
    if unknown:
        raise ValueError(f"unknown system(s) {unknown}: choose from {' '.join(SYSTEMS)}")
    return [SYSTEMS[k] for k in keys.split()]


@contextlib.contextmanager
def running(system: System, work: Path, nats_binary: str | None = None,
            nats_version: str = "") -> Iterator[Target]:
    if system.kind == "nats":
        with NatsCluster(system.nodes, work / f"nats-{system.key}", system.sync_interval, nats_binary) as c:
            yield Target(system, f"nats {nats_version} {system.label}".replace("  ", " "), c.urls, c.pids, None)
        return
    from ops.cluster import LocalCluster

    c = LocalCluster(work / f"tl-{system.key}")
    try:
        c.up(system.nodes, system.mode, system.flush, fresh=True, wait=True, insecure=True, **dict(system.config))
        leader = c.node(c.wait_for_leader()).address
        pids = [n.pid for n in c.nodes]
        if None in pids:
            raise RuntimeError(f"tidelog {system.label}: a node is not running after up: {c.nodes}")
        yield Target(system, f"tidelog {system.label}", c.addresses, pids, leader)
    finally:
        if c.spec_path.exists():
            c.down()
