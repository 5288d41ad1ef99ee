"""What the raft lanes' differential tests share (test_raft_lane.py, test_leader_lane.py)."""

from __future__ import annotations

import logging
import os
import random
import shutil
from pathlib import Path

from broker.config import BrokerConfig
from broker.faults import FaultSwitch
from broker.protocol import frame as fr
from broker.protocol.codes import Req
from broker.security.acl import Principal
from broker.store.message_store import MessageStore
from replication.base import Ports
from replication.raft.driver import RaftDriver

log = logging.getLogger(__name__)
SMALL_INDEX = {"index_slots": 1024, "index_entries_max": 4096}  # (key index files of kilobytes, not 42 MB)


class Conn:
    """What a lane reads of a broker connection: an authenticated member's (`secure`: the
    member its certificate proves)."""

    def __init__(self, member: str, secure: bool = False):
        self.principal = Principal(f"member:{member}", admin=True, member=member)
        self.member = member if secure else None
        self.peer = f"{member}-peer"
        self.closed = False
        self.decoder = fr.FrameReader(1 << 20, capacity=1 << 16, initial=4096)


def read(d: RaftDriver, conn: Conn, data: bytes) -> None:
    """As the broker reads `data` on `conn`: the lane first, the frames it left to the
    driver's RAFT handler as Broker.handle gives them (none while the node is isolated; a
    failure contained to its frame)."""
    r = conn.decoder
    while data:
        buf = r.get_buffer(-1)
        n = min(len(buf), len(data))
        buf[:n] = data[:n]
        r.fill(n)
        data = data[n:]
        handle = d.handlers()[Req.RAFT]
        for f in r.frames():
            assert f.code == Req.RAFT
            if d.ports.faults.isolated:
                continue
            try:
                handle(conn, f)
            except Exception:
                log.exception("request %s from %s failed", f.code, conn.peer)


def driver(home: Path, cfg: BrokerConfig) -> tuple[MessageStore, RaftDriver]:
    """A raft driver over an opened store at `home`, with ports that do nothing."""
    store = MessageStore(home, cfg.store_options())
    store.open()
    noop = lambda *a: None  # noqa: E731
    ports = Ports(store, cfg, home, FaultSwitch(), None, None, None, request_flush=noop,
                  schedule_dispatch=noop, dispatch_now=noop, role_changed=noop, persist_offsets=noop)
    return store, RaftDriver(ports)


def run_seeds(scenario, tmp_path: Path, what: str, default: int) -> list[int]:
    """scenario(dir, seed) -> counts (what the lane took, the total...) for
    TIDELOG_LANE_SEEDS (else `default`) seeds from a random base, summed; a seed that fails
    is printed for its replay."""
    sums: list[int] = []
    base = random.randrange(1 << 30)
    for k in range(int(os.environ.get("TIDELOG_LANE_SEEDS", str(default)))):
        seed = base + k
        try:
            counts = scenario(tmp_path / str(seed), seed)
        except Exception:
            print(f"{what} scenario failed: seed {seed} (replay: scenario(tmp_path, {seed}))")
            raise
        sums = [a + b for a, b in zip(sums, counts)] if sums else list(counts)
        shutil.rmtree(tmp_path / str(seed), ignore_errors=True)  # (a failing seed's files stay)
    return sums
