"""Master-slave requests between members and from `tidelog admin promote` (JSON bodies, see
jsonbody.py). The replication stream itself has its own wire: replication/master_slave/wire.py.

GET_METADATA {}      -> Metadata     a slave copies the master's topics and consumer offsets
HA_ROLE      HARole  -> report       promote: make this slave the master (answers a report:
                                     epoch, clean or not, who follows now);
                                     fence: a master stops taking writes for `ms` (a planned
                                     switchover) and answers {"end_offset": ..., "epoch": ...,
                                     "epochs": [[epoch, start], ...]} (the promoter must hold
                                     that log, in line with those epochs, to take over);
                                     `fence_id` names the switchover (ms=0 lifts only that
                                     fence; absent: an older promoter's; an older master
                                     ignores it);
                                     follow: become a slave of `master`, of epoch `epoch`
                                     (0..EPOCH_MAX, replication/master_slave/epochs.py:
                                     a body with an epoch past it is refused, BAD_REQUEST);
                                     in a switchover `takes_over` names the fenced epoch
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from annotated_types import Interval
from pydantic import StringConstraints

from replication.master_slave.epochs import EPOCH_MAX, check_epoch


@dataclass(frozen=True)
class HARole:
    action: Literal["promote", "fence", "follow"]
    force: bool = False  # promote: even if acknowledged messages may be lost
    ms: Annotated[int, Interval(ge=0, le=3_600_000)] = 3000  # fence: for how long at most (0 lifts it)
    # fence: which switchover's fence, "<promoter id>:<random token>" (a member id is at most
    # 64 characters). Older builds send none and ignore it (pydantic drops fields a dataclass
    # does not declare): an older master keeps one fence, which any lift lifts, so the
    # protection needs the master and the promoters upgraded
    fence_id: Annotated[str, StringConstraints(min_length=1, max_length=96)] | None = None
    master: str | None = None  # follow: whom
    epoch: Annotated[int, Interval(ge=0, le=EPOCH_MAX)] = 0  # follow: the new master's epoch (an older one is refused)
    # follow, in a switchover: the epoch whose master it fenced (refused by a member that has
    # seen a later one: roles.accepts_follow)
    takes_over: Annotated[int, Interval(ge=0, le=EPOCH_MAX)] | None = None

    def __post_init__(self):
        check_epoch(self.epoch, "HARole epoch")  # EpochLimitError (a BadRequest) before anything is sent
        if self.takes_over is not None:
            check_epoch(self.takes_over, "HARole takes_over")


@dataclass(frozen=True)
class Metadata:
    topics: list[dict]
    offsets: dict[str, dict[str, dict[int, int]]]  # group -> topic -> queue -> offset
