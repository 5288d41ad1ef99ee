"""What a master-slave node keeps on disk besides its store (atomic, fsynced writes):

`<data_dir>/ha/epochs.json`  its epoch list: (epoch, start offset) pairs
`<data_dir>/ha/role.json`    its role, whom it follows, the highest epoch it has heard of

The epoch list is checked against the CommitLog on start (its entries carry their epoch in
the term field): epochs whose start lies past the log's end are dropped (a cut that the
file missed), and an epoch found in the log but missing from the file is added, starting
where the previous epoch's last entry ends.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from broker.store.commitlog import POSITION
from broker.store.files import write_atomic
from replication.master_slave.epochs import EpochList

log = logging.getLogger(__name__)


@dataclass
class RoleState:
    role: str  # "master" | "slave"
    master: str | None  # the node id it follows (a slave), or its own (a master)
    epoch_seen: int = 0


class HAFiles:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.epochs_path = self.dir / "epochs.json"
        self.role_path = self.dir / "role.json"

    def _write(self, path: Path, obj) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(obj).encode())

    def load_role(self) -> RoleState | None:
        try:
            d = json.loads(self.role_path.read_text())
            return RoleState(d["role"], d.get("master"), int(d.get("epoch_seen", 0)))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            log.error("%s is damaged (%s): starting from the configured role", self.role_path, e)
            return None

    def save_role(self, st: RoleState) -> None:
        self._write(self.role_path, asdict(st))

    def load_epochs(self) -> EpochList | None:
        try:
            return EpochList(json.loads(self.epochs_path.read_text())["epochs"])
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            log.error("%s is damaged (%s): rebuilding it from the CommitLog", self.epochs_path, e)
            return None

    def save_epochs(self, epochs: EpochList) -> None:
        self._write(self.epochs_path, {"epochs": epochs.to_list()})


def reconcile_epochs(epochs: EpochList | None, commitlog) -> tuple[EpochList, bool]:
    """The epoch list made to agree with the log (see the module doc); (list, changed)."""
    epochs = EpochList() if epochs is None else EpochList(epochs.to_list())
    changed = epochs.truncate(commitlog.tail.offset + 1)
    first, end = commitlog.first_index, commitlog.tail.next_index
    i = first
    while i < end:  # each distinct term in the log, found by binary search
        term = _term(commitlog, i)
        if epochs.find(term) is None and term > epochs.last_epoch:
            start = _end_of(commitlog, i - 1) if i > first else _phys(commitlog, i)
            log.warning("epoch %d (from offset %d) found in the CommitLog, added to the epoch list",
                        term, start)
            epochs.open(term, start)
            changed = True
        lo, hi = i + 1, end
        while lo < hi:
            mid = (lo + hi) // 2
            if _term(commitlog, mid) > term:
                hi = mid
            else:
                lo = mid + 1
        i = lo
    return epochs, changed


def _pos(commitlog, i: int):
    return POSITION.unpack(commitlog.positions.read(i))


def _term(commitlog, i: int) -> int:
    return _pos(commitlog, i)[2]


def _phys(commitlog, i: int) -> int:
    return _pos(commitlog, i)[0]


def _end_of(commitlog, i: int) -> int:
    phys, size, _ = _pos(commitlog, i)
    return phys + size
