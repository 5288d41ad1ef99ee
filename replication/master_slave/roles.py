"""Who is master: the pure rules behind start-up, fencing and `tidelog admin promote`.

A node learns about the others from views (what each member's STATUS says: role, epochs,
whom it follows, its log's end). The rules:
- the master with the highest epoch is the master; a node that hears of a higher epoch
  than its own stops acting as master and follows that master (fencing: an old master that
  comes back, or wakes up from a pause, cannot keep taking writes);
- a node that starts as master opens a new epoch, one more than any epoch any reachable
  member has heard of (so a restarted master's new writes never reuse an epoch);
- a slave may be promoted cleanly only if no acknowledged message can be missing from it:
  it holds at least what every reachable slave holds, and every acknowledged message is on
  at least one reachable slave (more slaves acknowledge each send than are unreachable);
  otherwise promotion needs `force` and the report calls it unclean.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    return max([me.epoch, me.epoch_seen] + [max(v.epoch, v.epoch_seen) for v in views]) + 1


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
    if f.lag_at_loss is None:
        out.append("this node never copied from a master")
    elif f.lag_at_loss > f.fallbehind_max_bytes:
        out.append(f"it was {f.lag_at_loss} bytes behind its master when it lost contact "
                   f"(ha_slave_fallbehind_max_bytes={f.fallbehind_max_bytes})")
    for v in f.others:
        if v.role == SLAVE and v.end > f.me.end:
            out.append(f"{v.node} holds more of the log ({v.end} > {f.me.end}): promote it instead")
    slaves_down = [n for n in f.unreachable if n != f.me.master]
    if f.sync and slaves_down and f.acks_from_slaves <= len(slaves_down):
        out.append(f"unreachable {', '.join(slaves_down)} may hold acknowledged messages that "
                   f"no reachable node has (each send waits for {f.acks_from_slaves} slave(s))")
    if not f.sync:
        if slaves_down:
            out.append(f"unreachable {', '.join(slaves_down)} may hold more of the log")
    return out
