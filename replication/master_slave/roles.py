"""Who is master: the pure rules behind start-up, fencing and `tidelog admin promote`.

A node learns about the others from views (what each member's STATUS says: role, epochs,
whom it follows, its log's end). The rules:
- the master with the highest epoch is the master; a node that hears of a higher epoch
  than its own stops acting as master and follows that master (fencing: an old master that
  comes back, or wakes up from a pause, cannot keep taking writes);
- an epoch is opened only once enough members have recorded it (HA_ROLE follow: each member
  records one master per epoch, `accepts_follow`), so no two masters ever write under one
  epoch number and every later opener hears of it: a promotion needs `promotion_quorum(n)`
  members (itself included), a node restarting as master `restart_quorum(n)`; any two of
  these quorums share a member. A restarting master also waits while any member it hears
  from knows of an epoch newer than its log's whose master does not answer
  (`restart_decision`): a master restarting cut off from the others (or from all who know of
  a promotion made while it was down) waits as a slave without a master instead of reusing
  the promoted master's epoch and winning with its longer log -- unless every member
  answers and no log holds an entry of an epoch newer than its own (nothing of that epoch
  exists, and its master, which may be this very node, may never answer as master);
- a slave may be promoted cleanly only if no acknowledged message can be missing from it:
  it holds at least what every reachable slave holds, and every acknowledged message is on
  at least one reachable slave (more slaves acknowledge each send than are unreachable);
  otherwise promotion needs `force` and the report calls it unclean.
"""

from __future__ import annotations

from dataclasses import dataclass

from replication.master_slave.epochs import EPOCH_MAX, EpochLimitError, EpochList, check_epoch, consistent_point

MASTER, SLAVE = "master", "slave"


@dataclass(frozen=True)
class View:
    node: str
    role: str  # MASTER or SLAVE
    epoch: int  # the last epoch in its log
    epoch_seen: int  # the highest epoch it has heard of
    master: str | None  # whom it follows (a slave), itself (a master)
    end: int  # its CommitLog end offset
    fenced: bool = False  # a master that stopped taking writes for a switchover


def rank(v: View) -> tuple:
    return (v.epoch, v.end, v.node)


def newest_master(views) -> View | None:
    masters = [v for v in views if v.role == MASTER]
    return max(masters, key=rank, default=None)


def whom_to_follow(me: View, views: list[View]) -> str | None:
    """The master this node should follow now, if that differs from what it does."""
    m = newest_master(views)
    if me.role == MASTER:
        if m is not None and rank(m) > rank(me):
            return m.node
        newer = [v for v in views if v.epoch_seen > me.epoch and v.master and v.master != me.node]
        if newer:  # promoted elsewhere; that master may be unreachable from here
            return max(newer, key=lambda v: v.epoch_seen).master
        return None
    if m is not None and m.node != me.master and m.epoch >= me.epoch_seen:
        return m.node
    return None


def new_epoch(me: View, views: list[View]) -> int:
    """One more than any epoch heard of. Raises EpochLimitError past EPOCH_MAX (only a forged
    or corrupt epoch gets there), naming who reported it and the way out."""
    heard = [(max(me.epoch, me.epoch_seen), me.node)] + [(max(v.epoch, v.epoch_seen), v.node) for v in views]
    top, who = max(heard)
    if top + 1 > EPOCH_MAX:
        raise EpochLimitError(
            f"cannot open epoch {top + 1}: the limit is EPOCH_MAX={EPOCH_MAX} ({who} reports epoch "
            f"{top}, which no group reaches by promotions: a forged or corrupt epoch). Stop the "
            f"members that report it and set \"epoch_seen\" in their ha/role.json to the highest "
            f"epoch in any member's ha/epochs.json, then promote again")
    return top + 1


def promotion_quorum(members: int) -> int:
    """Members (the new master included) that must record a new epoch before its master
    takes writes: a majority, or the one surviving node of a pair."""
    return 1 if members <= 2 else members // 2 + 1


def restart_quorum(members: int) -> int:
    """Members (itself included) that must record the epoch a restarting master opens: a
    majority that also meets every promotion quorum (for a pair: both)."""
    p = promotion_quorum(members)
    return max(p, members - p + 1)


def restart_decision(me: View, views: list[View], members: int) -> tuple[str, object]:
    """What a node that was master when it stopped does at start (and while it waits):
    ("follow", node) -- a master of a newer epoch exists; ("wait", why) -- it may not open
    an epoch yet (it stays a slave without a master, taking no writes, and asks again); or
    ("open", epoch)."""
    target = whom_to_follow(me, views)
    if target is not None:
        return "follow", target
    newer = [v.node for v in views if max(v.epoch, v.epoch_seen) > me.epoch]
    if newer and 1 + len(views) == members and all(v.epoch <= me.epoch for v in views):
        newer = []  # every member answers and no log holds an entry of a newer epoch
    if newer:
        return "wait", (f"{', '.join(newer)} heard of an epoch newer than this log's "
                        f"({me.epoch}) whose master does not answer: promote a node, or "
                        "wait for that master")
    need = restart_quorum(members)
    if 1 + len(views) < need:
        return "wait", (f"{1 + len(views)} of the {need} members needed (this node included) "
                        "answer: a newer master may exist among the others")
    return "open", new_epoch(me, views)


def holds_log_of(mine: EpochList, my_end: int, master: EpochList, end: int) -> bool:
    """Whether a switchover's promoter, its (durable) log ending at `my_end` with epochs
    `mine`, holds the fenced master's log up to `end`: long enough, and in line with it epoch
    by epoch below `end`. Length alone proves nothing: a slave that diverged (a master that
    restarted and wrote a tail of its own, then came back as a slave) and was not yet told
    by its new master where to cut holds other entries at those offsets."""
    if my_end < end:
        return False
    cp = consistent_point(mine, my_end, master, end)
    return end == 0 or (cp is not None and cp >= end)


def seen_since_fence(epoch_seen: int, fenced: int | None) -> bool:
    """Whether a node that has seen `epoch_seen` has seen an epoch begin after a switchover
    fenced the master of epoch `fenced` (the master restarted and opened one, and may have
    acknowledged sends in it): it must not take part in that switchover."""
    return fenced is not None and epoch_seen > fenced


def accepts_follow(epoch_seen: int, current_master: str | None, epoch: int, master: str,
                   takes_over: int | None = None) -> bool:
    """Whether a member records `master` as the master of `epoch` (a promotion's request):
    never an older epoch, and each epoch has one master (a promise, as in Paxos). A
    switchover names the epoch whose master it fenced (`takes_over`): its catch-up proved
    that this node holds that master's log, nothing newer; a member that has seen a later
    epoch (the fenced master restarted and opened one, and may have acknowledged sends in it)
    refuses. Raises EpochLimitError for an epoch outside 0..EPOCH_MAX (it is never recorded)."""
    check_epoch(epoch, "follow epoch")
    again = epoch == epoch_seen and master == current_master
    if seen_since_fence(epoch_seen, takes_over) and not again:
        return False
    return epoch > epoch_seen or again


@dataclass(frozen=True)
class PromotionFacts:
    me: View
    others: list[View]  # reachable members, fresh
    unreachable: list[str]  # members that did not answer
    lag_at_loss: int | None  # how far behind the master this node was when it lost it
    fallbehind_max_bytes: int
    sync: bool  # the group acknowledges sends only once slaves hold them
    acks_from_slaves: int  # slaves that acknowledge each send (required - 1, at worst)


def promotion_problems(f: PromotionFacts) -> list[str]:
    """Why promoting `f.me` could lose acknowledged messages ([] = a clean promotion)."""
    out = []
    if f.me.role != SLAVE:
        return out
    # SYNC: every acknowledged send is on `acks_from_slaves` slaves (under the flush policy:
    # with `flush: async` in their page cache, which survives a kill -9 but not a power loss,
    # the acknowledgement's own promise), so the checks below on the others prove it is
    # here, whatever this node's own history (a slave that restarted, or followed a
    # switchover's master that died before it led, does not know its lag).
    # ASYNC: the master acknowledged alone; only how far behind it this node was bounds the loss.
    if not f.sync and f.lag_at_loss is None:
        out.append("this node never copied from a master")
    elif not f.sync and f.lag_at_loss > f.fallbehind_max_bytes:
        out.append(f"it was {f.lag_at_loss} bytes behind its master when it lost contact "
                   f"(ha_slave_fallbehind_max_bytes={f.fallbehind_max_bytes})")
    for v in f.others:  # newer: a later epoch in its log, or more of the same epoch's
        if v.role == SLAVE and (v.epoch, v.end) > (f.me.epoch, f.me.end):
            out.append(f"{v.node} holds more of the log (epoch {v.epoch} to offset {v.end} > epoch "
                       f"{f.me.epoch} to {f.me.end}): promote it instead")
    slaves_down = [n for n in f.unreachable if n != f.me.master]
    if f.sync and f.acks_from_slaves <= 0:
        out.append("the master may have acknowledged sends that no slave holds (ha_auto_degrade "
                   "lets it acknowledge alone: min_in_sync_replicas=1)")
    elif f.sync and slaves_down and f.acks_from_slaves <= len(slaves_down):
        out.append(f"unreachable {', '.join(slaves_down)} may hold acknowledged messages that "
                   f"no reachable node has (each send waits for {f.acks_from_slaves} slave(s))")
    if not f.sync:
        if slaves_down:
            out.append(f"unreachable {', '.join(slaves_down)} may hold more of the log")
    return out
