"""Promotion in a master-slave group (`tidelog admin promote`, HA_ROLE requests), run by
the node being promoted:

- its master is up (a switchover): fence it under this switchover's own fence id (it refuses
  writes while any switchover's fence is on; giving up lifts only its own; if nobody lifts it or
  tells it the new master within `leadership_transfer_timeout_ms`, it steps down and leads
  again only as a restarting master: NodeCore.fence_lapsed), copy the rest of its log (held
  in line with the master's epochs, not just as long: roles.holds_log_of) and its metadata,
  then lead; the follow requests name the fenced epoch, so a member that has
  seen a later one refuses (roles.seen_since_fence);
- its master is down (a failover): lead only if no acknowledged message can be missing here
  beyond what the replication mode accepts (roles.promotion_problems), or with `force`, which
  the report calls unclean. An ASYNC failover with the master unreachable is never clean
  either: its master acknowledged alone, and the report says what may be lost
  (roles.async_loss: what the master held at its last report here, and the bound, if any);
then tell every reachable member to follow it in a new epoch (HA_ROLE follow: each records
the epoch, and records one master per epoch), and lead that epoch only once
`roles.promotion_quorum` members (itself included) have recorded it -- so that a master
restarting cut off from the others can never open the same epoch (roles.restart_decision).
Members that were down learn it when they come back (a probe, or a refused HELLO).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time

from broker.protocol.codes import Req
from broker.protocol.ha import HARole
from replication.errors import PromotionRefused
from replication.master_slave.core import Refused, StopLink
from replication.master_slave.epochs import EpochList
from replication.master_slave.peers import PeerCallError
from replication.master_slave import roles
from replication.master_slave.roles import MASTER

log = logging.getLogger(__name__)

CATCH_UP_POLL_S = 0.01


async def handle(d, req: HARole) -> dict:
    if req.action == "promote":
        try:
            return await promote(d, req.force)
        except PromotionRefused as e:
            log.warning("promotion refused: %s", e)  # the operator's answer, and this log
            raise
    if req.action == "fence":
        try:
            d.node.fence(req.ms, _ms(), req.fence_id)
        except Refused as e:
            raise PromotionRefused(str(e)) from None
        if req.ms:
            log.warning("fenced for a switchover (%s): refusing writes for up to %d ms", req.fence_id, req.ms)
        else:
            log.warning("switchover %s gave up: its fence is lifted (%s)", req.fence_id,
                        "still fenced by another" if d.node.fenced() else "taking writes again")
        return {"end_offset": d.store.commitlog.tail.offset, "epoch": d.epochs.last_epoch,
                "epochs": d.epochs.to_list()}
    if req.action == "follow":
        master, epoch = req.master, req.epoch
        async with d.switching:
            was_master = d.role == MASTER
            try:
                effects = d.node.on_follow(master, epoch, req.takes_over)  # roles.accepts_follow
            except Refused as e:
                raise PromotionRefused(str(e)) from None
            if was_master:
                log.warning("%s is now master (epoch %d): this node follows it", master, epoch)
            await d.apply(effects)
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
        loss = None  # what an ASYNC failover may lose (roles.async_loss)
        switchover = live_master is not None and not force
        takes_over = fence_id = None
        if switchover:
            fence_id = f"{d.me}:{secrets.token_hex(6)}"  # this switchover's own fence
            problems, takes_over = await _take_over_from(d, live_master.node, fence_id)
        else:
            problems = d.node.failover_problems(views, down, d.store.commitlog.tail.offset, d.lag(),
                                                live_master.node if live_master is not None else None)
            loss = d.node.failover_loss(views, down, d.store.commitlog.tail.offset, d.lag(), bool(problems))
        if problems and not force:
            if switchover and live_master is not None:
                d.spawn(f"unfence {fence_id}", d.peers.call(live_master.node, Req.HA_ROLE,
                                                HARole("fence", ms=0, fence_id=fence_id)))
            raise PromotionRefused("; ".join(problems) + " (--force promotes anyway, uncleanly)")
        cl = d.store.commitlog
        epoch = d.node.new_epoch(views, cl.tail.offset)
        start = cl.tail.offset
        recorded, told = await record_epoch(d, views, epoch, takes_over)
        why = d.node.promotion_shortfall(epoch, recorded)  # roles.promotion_quorum
        if why is not None:
            if not force:
                raise PromotionRefused(why + " (--force promotes anyway, uncleanly)")
            problems.append(why)
            loss = d.node.failover_loss(views, down, start, d.lag(), True)  # (no bound past a problem)
        # the link to the old master winds down first: nothing is appended to this log, and no
        # write of the new epoch is taken, while it does
        await d.apply([StopLink()])
        await d.apply(d.node.promoted(epoch, cl.tail.offset, d.durable_end(), d.store.confirm_offset, _ms()))
    report = {
        "node": d.me, "epoch": epoch, "start_offset": start, "previous_master": old,
        "switchover": switchover, "clean": not problems and loss is None, "problems": problems,
        "may_lose": None if loss is None else loss.to_dict(),
        "followers": {v.node: ("following" if isinstance(r, dict) else str(r))
                      for v, r in zip(views, told)},
        "unreachable": down,
    }
    unclean = problems + ([loss.text()] if loss is not None else [])
    log.warning("promoted to master of epoch %d at offset %d (%s)%s", epoch, start,
                "switchover" if switchover else "failover",
                "" if not unclean else " UNCLEAN: " + "; ".join(unclean))
    return report


async def record_epoch(d, views, epoch: int, takes_over: int | None = None) -> tuple[int, list]:
    """Tell every member in `views` to follow this node in `epoch` (HA_ROLE follow), before
    it leads: (members that recorded it, this node included; each call's answer or error).
    `takes_over`: a switchover's fenced epoch (see roles.accepts_follow)."""
    d.node.promoting = True
    try:
        told = await asyncio.gather(*(d.peers.call(v.node, Req.HA_ROLE, HARole(
            "follow", master=d.me, epoch=epoch, takes_over=takes_over), 3.0) for v in views),
            return_exceptions=True)
    finally:
        d.node.promoting = False
    return 1 + sum(1 for r in told if isinstance(r, dict)), told


async def _take_over_from(d, master: str, fence_id: str) -> tuple[list[str], int | None]:
    """A planned switchover: the master stops taking writes, this node copies the rest.
    (problems, the fenced master's epoch)."""
    timeout_ms = d.cfg.leadership_transfer_timeout_ms
    try:
        r = await d.peers.call(master, Req.HA_ROLE, HARole("fence", ms=timeout_ms, fence_id=fence_id), 2.0)
    except PeerCallError as e:
        return [f"could not fence master {master}: {e}"], None
    end = int(r["end_offset"])
    fenced_epoch = r.get("epoch")  # (None from a build before it was sent: a rolling upgrade)
    try:  # (None from a build before it was sent: then the length alone, as that build did)
        theirs = EpochList(r["epochs"]) if r.get("epochs") is not None else None
    except (TypeError, ValueError) as e:
        return [f"{master}'s answer to the fence holds no valid epoch list ({e})"], fenced_epoch

    def caught_up() -> bool:
        if theirs is None:
            return d.durable_end() >= end
        return roles.holds_log_of(d.epochs, d.durable_end(), theirs, end)

    deadline = time.monotonic() + timeout_ms / 1000
    while not caught_up() and time.monotonic() < deadline:
        await asyncio.sleep(CATCH_UP_POLL_S)
    if not caught_up():
        why = f"{d.durable_end()} < {end}" if d.durable_end() < end else \
            f"this node's log is not in line with its below {end}: epochs {d.epochs.to_list()}, its {theirs.to_list()}"
        return [f"did not catch up with {master} within leadership_transfer_timeout_ms ({why})"], fenced_epoch
    if roles.seen_since_fence(d.node.epoch_seen, fenced_epoch):
        # what this node copied may be another epoch's (the fenced master restarted and
        # opened one): its catch-up proves nothing
        return [f"epoch {d.node.epoch_seen} began after {master} was fenced in epoch {fenced_epoch}"], fenced_epoch
    if d.master == master:
        await d.sync_metadata()
    return [], fenced_epoch


def _ms() -> int:
    return int(time.monotonic() * 1000)
