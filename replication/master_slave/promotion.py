"""Promotion in a master-slave group (`tidelog admin promote`, HA_ROLE requests), run by
the node being promoted:

- its master is up (a switchover): fence it (it refuses writes for up to
  `leadership_transfer_timeout_ms`), copy the rest of its log and its metadata, then lead;
- its master is down (a failover): lead only if no acknowledged message can be missing here
  (roles.promotion_problems), or with `force`, which the report calls unclean;
then tell every reachable member to follow it in a new epoch (HA_ROLE follow: each records
the epoch, and records one master per epoch), and lead that epoch only once
`roles.promotion_quorum` members (itself included) have recorded it -- so that a master
restarting cut off from the others can never open the same epoch (roles.restart_decision).
Members that were down learn it when they come back (a probe, or a refused HELLO).
"""

from __future__ import annotations

import asyncio
import logging
import time

from broker.protocol.codes import Req
from broker.protocol.ha import HARole
from replication.errors import PromotionRefused
from replication.master_slave.peers import PeerCallError
from replication.master_slave.roles import (MASTER, SLAVE, PromotionFacts, accepts_follow, new_epoch,
                                            promotion_problems, promotion_quorum)
from replication.master_slave.state import RoleState

log = logging.getLogger(__name__)

CATCH_UP_POLL_S = 0.01


async def handle(d, req: HARole) -> dict:
    if req.action == "promote":
        return await promote(d, req.force)
    if req.action == "fence":
        if d.role != MASTER:
            raise PromotionRefused(f"{d.me} is not the master")
        d.fenced_until = time.monotonic() + req.ms / 1000
        if req.ms:
            log.warning("fenced for a switchover: refusing writes for up to %d ms", req.ms)
        return {"end_offset": d.store.commitlog.tail.offset}
    if req.action == "follow":
        master, epoch = req.master, req.epoch
        if master not in d.addresses or master == d.me:
            raise PromotionRefused(f"cannot follow {master!r}")
        async with d.switching:
            if not accepts_follow(d.epoch_seen, d.master, epoch, master):
                raise PromotionRefused(
                    f"epoch {epoch} is older than {d.epoch_seen}, known here" if epoch < d.epoch_seen
                    else f"epoch {epoch} already has master {d.master} here")
            d.epoch_seen = epoch
            if d.role == MASTER:
                log.warning("%s is now master (epoch %d): this node follows it", master, epoch)
            if d.role == MASTER or d.master != master:
                await d.become_slave(master)
            else:
                d.files.save_role(RoleState(SLAVE, master, epoch))
        return {"following": master}
    raise PromotionRefused(f"unknown action {req.action!r}")


async def promote(d, force: bool) -> dict:
    async with d.switching:
        if d.role == MASTER:
            return {"node": d.me, "epoch": d.epochs.last_epoch, "already_master": True}
        views, down = await d.peers.views()
        old = d.master
        live_master = next((v for v in views if v.role == MASTER), None)
        problems: list[str] = []
        switchover = live_master is not None and not force
        if switchover:
            problems = await _take_over_from(d, live_master.node)
        else:
            core_sync = d.cfg.ha_replication == "sync"
            acks = (d.cfg.min_in_sync_replicas if d.cfg.ha_auto_degrade else d.cfg.in_sync_replicas) - 1
            problems = promotion_problems(PromotionFacts(
                d.view(), views, down, d.lag(), d.cfg.ha_slave_fallbehind_max_bytes,
                core_sync, acks))
            if live_master is not None:
                problems.append(f"{live_master.node} is still master: it will be made to follow "
                                "and lose what this node does not have")
        if problems and not force:
            if switchover and live_master is not None:
                d.spawn("unfence", d.peers.call(live_master.node, Req.HA_ROLE,
                                                       HARole("fence", ms=0)))
            raise PromotionRefused("; ".join(problems) + " (--force promotes anyway, uncleanly)")
        epoch = new_epoch(d.view(), views)
        start = d.store.commitlog.tail.offset
        recorded, told = await record_epoch(d, views, epoch)
        need = promotion_quorum(len(d.addresses))
        if recorded < need:
            why = (f"only {recorded} of the {need} members needed (this node included) recorded "
                   f"epoch {epoch}: a master restarting apart from them could reuse it")
            if not force:
                raise PromotionRefused(why + " (--force promotes anyway, uncleanly)")
            problems.append(why)
        d.epoch_seen = max(d.epoch_seen, epoch)
        await d.become_master(epoch)
        d.promotions += 1
    report = {
        "node": d.me, "epoch": epoch, "start_offset": start, "previous_master": old,
        "switchover": switchover, "clean": not problems, "problems": problems,
        "followers": {v.node: ("following" if isinstance(r, dict) else str(r))
                      for v, r in zip(views, told)},
        "unreachable": down,
    }
    log.warning("promoted to master of epoch %d at offset %d (%s)%s", epoch, start,
                "switchover" if switchover else "failover",
                "" if not problems else " UNCLEAN: " + "; ".join(problems))
    return report


async def record_epoch(d, views, epoch: int) -> tuple[int, list]:
    """Tell every member in `views` to follow this node in `epoch` (HA_ROLE follow), before
    it leads: (members that recorded it, this node included; each call's answer or error)."""
    d.promoting = True
    try:
        told = await asyncio.gather(*(d.peers.call(v.node, Req.HA_ROLE, HARole(
            "follow", master=d.me, epoch=epoch), 3.0) for v in views), return_exceptions=True)
    finally:
        d.promoting = False
    return 1 + sum(1 for r in told if isinstance(r, dict)), told


async def _take_over_from(d, master: str) -> list[str]:
    """A planned switchover: the master stops taking writes, this node copies the rest."""
    timeout_ms = d.cfg.leadership_transfer_timeout_ms
    try:
        r = await d.peers.call(master, Req.HA_ROLE, HARole("fence", ms=timeout_ms), 2.0)
    except PeerCallError as e:
        return [f"could not fence master {master}: {e}"]
    end = int(r["end_offset"])
    deadline = time.monotonic() + timeout_ms / 1000
    while d.durable_end() < end and time.monotonic() < deadline:
        await asyncio.sleep(CATCH_UP_POLL_S)
    if d.durable_end() < end:
        return [f"did not catch up with {master} within leadership_transfer_timeout_ms "
                f"({d.durable_end()} < {end})"]
    if d.master == master:
        await d.sync_metadata()
    return []
