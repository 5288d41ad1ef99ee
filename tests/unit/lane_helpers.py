"""What the raft lanes' differential tests share (test_raft_lane.py, test_leader_lane.py)."""

from __future__ import annotations

import os
import random
from pathlib import Path

from broker.config import BrokerConfig
from broker.faults import FaultSwitch
from broker.store.message_store import MessageStore
from replication.base import Ports
from replication.raft.driver import RaftDriver


def driver(home: Path, cfg: BrokerConfig) -> tuple[MessageStore, RaftDriver]:
    """A raft driver over an opened store at `home`, with ports that do nothing."""
    store = MessageStore(home, cfg.store_options())
    store.open()
    noop = lambda *a: None  # noqa: E731
    ports = Ports(store, cfg, home, FaultSwitch(), None, None, None, request_flush=noop,
                  schedule_dispatch=noop, dispatch_now=noop, role_changed=noop, persist_offsets=noop)
    return store, RaftDriver(ports)


def run_seeds(scenario, tmp_path: Path, what: str, default: int) -> tuple[int, int]:
    """scenario(dir, seed) -> (taken by the lane, total) for TIDELOG_LANE_SEEDS (else
    `default`) seeds from a random base; a seed that fails is printed for its replay."""
    taken = total = 0
    base = random.randrange(1 << 30)
    for k in range(int(os.environ.get("TIDELOG_LANE_SEEDS", str(default)))):
        seed = base + k
        try:
            t, n = scenario(tmp_path / str(seed), seed)
        except Exception:
            print(f"{what} scenario failed: seed {seed} (replay: scenario(tmp_path, {seed}))")
            raise
        taken, total = taken + t, total + n
    return taken, total
