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
- a master that hears of a newer epoch whose master does not answer as master (a slave names
  it) stops acting as master but follows nobody yet: it waits as a restarting master does
  (`promoted_elsewhere`, then `restart_decision`). Following the named node blindly made a
  master follow a node that never became master (its promotion recorded the epoch on some
  members and died before it led), and the group had no master until an operator acted.
  The node named may be this master itself (a promotion of its own that died before it led,
  then a lower epoch led): it leads again above the epoch named;
- a slave may be promoted cleanly only if no acknowledged message can be missing from it:
  it holds at least what every reachable slave holds, and every acknowledged message is on
  at least one reachable slave (more slaves acknowledge each send than are unreachable);
  otherwise promotion needs `force` and the report calls it unclean;
- an ASYNC master acknowledges alone, so a failover while it is unreachable is never clean
  (`async_loss`): it may have acknowledged sends this node never got -- what it held at its
  last report to this node (`lag_at_loss`), what it took after that report, and, if it is up
  behind a partition, all it takes until it hears of the new master. Nothing bounds that
  unless the master fences itself (MasterConfig.async_fence_replicas: it takes a send only
  while a majority that meets every promotion quorum holds its log to within
  `fallbehind_max_bytes`): then at most fallbehind_max_bytes plus one append is lost.
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
    """The master this node should follow now, if that differs from what it does: always one
    that answers as master (see `promoted_elsewhere` for one that does not)."""
    m = newest_master(views)
    if me.role == MASTER:
        if m is not None and rank(m) > rank(me):
            return m.node
        return None
    if m is not None and m.node != me.master and m.epoch >= me.epoch_seen:
        return m.node
    return None


def promoted_elsewhere(me: View, views: list[View]) -> tuple[str, int] | None:
    """(the node, the epoch) a member names as master of an epoch newer than this master's,
    when no master that outranks it answers (whom_to_follow is None): this master stops
    taking writes and waits as a restarting one (restart_decision). It must not follow that
    node: the node may never have led (its promotion died between recording the epoch and
    leading), and a master following it would leave the group without one.
    The node named may be this master itself: a promotion of its own that died before it led
    (nothing on its disk keeps the epoch it asked the members to record), after which it led
    a lower epoch, which the members that recorded the higher one refuse to follow for good.
    Restarting, it opens an epoch above that one once every member answers and no log holds
    an entry of it."""
    newer = [v for v in views if v.epoch_seen > me.epoch and v.master]
    if me.role != MASTER or not newer:
        return None
    v = max(newer, key=lambda v: (v.epoch_seen, v.master != me.node))
    return v.master, v.epoch_seen


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
    # ASYNC with the master's self-fence: the most it acknowledges past what a majority holds
    # (fallbehind_max_bytes plus one append); None: no self-fence (RocketMQ's ASYNC_MASTER)
    self_fence_bytes_max: int | None = None


def _master_down(f: PromotionFacts) -> bool:
    return f.me.master is not None and f.me.master in f.unreachable


def promotion_problems(f: PromotionFacts) -> list[str]:
    """Why promoting `f.me` could lose acknowledged messages beyond what its replication mode
    accepts ([] = it may go ahead without `force`; an ASYNC failover still loses what
    `async_loss` says)."""
    out = []
    if f.me.role != SLAVE:
        return out
    # SYNC: every acknowledged send is on `acks_from_slaves` slaves (under the flush policy:
    # with `flush: async` in their page cache, which survives a kill -9 but not a power loss,
    # the acknowledgement's own promise), so the checks below on the others prove it is
    # here, whatever this node's own history (a slave that restarted, or followed a
    # switchover's master that died before it led, does not know its lag).
    # ASYNC: the master acknowledged alone; while it is unreachable, only how far behind it
    # this node was tells anything (a master that answers shows its log in `others`).
    if not f.sync and _master_down(f) and f.lag_at_loss is None:
        out.append("this node never copied from a master")
    elif not f.sync and _master_down(f) and f.lag_at_loss > f.fallbehind_max_bytes:
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


@dataclass(frozen=True)
class AsyncLoss:
    """What an ASYNC failover may lose: acknowledged bytes this node does not hold."""
    master: str
    at_last_report: int | None  # what the master held at its last report here, past this log
    bytes_max: int | None  # at most this many (None: no bound)

    def text(self) -> str:
        seen = ("its master's last report here was " + (f"{self.at_last_report} bytes" if
                self.at_last_report else "nothing") + " past this log") \
            if self.at_last_report is not None else "this node never copied from it"
        head = (f"ASYNC failover with {self.master} unreachable: it acknowledged sends alone, and "
                f"{seen}; ")
        if self.bytes_max is not None:
            return head + (f"up to {self.bytes_max} bytes of acknowledged messages may be lost (its "
                           "self-fence stops it acknowledging once no majority holds its log to within "
                           "ha_slave_fallbehind_max_bytes)")
        return head + ("those may be lost, and so may all it acknowledged after that report -- if it "
                       "is up behind a partition, everything it takes until it hears of this "
                       "promotion: no bound (ha_replication: sync bounds it; so would an ASYNC "
                       "master that fences itself)")

    def to_dict(self) -> dict:
        return {"master": self.master, "at_last_report_bytes": self.at_last_report,
                "bytes_max": self.bytes_max, "text": self.text()}


def async_loss(f: PromotionFacts, forced: bool = False) -> AsyncLoss | None:
    """None if promoting `f.me` cannot lose an acknowledged message that its replication mode
    promised to keep (SYNC: promotion_problems proves it; ASYNC: the master that
    acknowledged answers, so `others` shows its log). Otherwise what may be lost: ASYNC with
    its master unreachable. The bound holds only for a promotion the rules allow
    (`forced`: past a problem, there is none): with the self-fence, every send the master
    acknowledged was held to within the window by a majority that meets this promotion's
    quorum, and this node holds at least what each member of that quorum holds."""
    if f.sync or f.me.role != SLAVE or not _master_down(f):
        return None
    bound = None if forced else f.self_fence_bytes_max
    return AsyncLoss(f.me.master, f.lag_at_loss, bound)
