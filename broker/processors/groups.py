"""HEARTBEAT, LIST_GROUPS, DESCRIBE_GROUP: consumer groups' members, offsets and lag
(RocketMQ's consumerProgress, kafka-consumer-groups --describe).

Members, their last heartbeats, the address each heartbeats from and the topics it reads live
in `broker.groups` (ConsumerGroups). Which queues a member owns is not the broker's business:
the client works it out with the same allocation the consumers use.
"""

from __future__ import annotations

import time

from broker.protocol import admin as ap
from broker.protocol import jsonbody
from broker.protocol.codes import Code
from broker.security.acl import may_group
from broker.security.guard import Guard


class GroupsProcessor:
    def __init__(self, broker):
        self.broker = broker

    def heartbeat(self, conn, f) -> None:
        r = jsonbody.decode(ap.Heartbeat, f.body)
        if r.group:
            Guard.require(may_group(conn.principal, r.group))
        self.broker.serve_or_raise("group")  # a group's members meet at the leader / master
        groups = self.broker.groups
        now_ms = time.monotonic() * 1000
        if r.group and r.leaving:
            groups.leave(r.group, r.client_id)
            members = groups.live(r.group, now_ms)
        else:
            members = groups.heartbeat(r.group, r.client_id, now_ms, conn.peer, r.topics) if r.group else []
        conn.respond(f, Code.SUCCESS, jsonbody.encode(ap.GroupMembers(r.group, members)))

    def _names(self, now_ms: float) -> list[str]:
        return sorted(set(self.broker.offsets.offsets) | set(self.broker.groups.names(now_ms)))

    def _info(self, group: str, topic: str | None, now_ms: float) -> ap.GroupInfo:
        b = self.broker
        live = b.groups.live_members(group, now_ms)
        members = [ap.GroupMember(cid, m.address, int(now_ms - m.last_heartbeat_ms), list(m.topics))
                   for cid, m in sorted(live.items())]
        committed = b.offsets.offsets.get(group, {})
        names = set(committed) | {t for m in members for t in m.topics}
        topics = []
        for t in sorted(names if topic is None else names & {topic}):
            cfg = b.topics.get(t)
            read_queues = cfg.read_queues if cfg is not None else 0
            have = committed.get(t, {})
            rows = []
            for q in sorted(set(range(read_queues)) | set(have)):
                broker_offset = b.store.queue_bounds(t, q)[1]
                c = have.get(q)
                rows.append(ap.GroupQueue(q, broker_offset, -1 if c is None else c,
                                          None if c is None else max(0, broker_offset - c)))
            topics.append(ap.GroupTopic(t, read_queues, rows))
        return ap.GroupInfo(group, topics, members)

    def list_groups(self, conn, f) -> None:
        self.broker.serve_or_raise("group")
        now_ms = time.monotonic() * 1000
        out = []
        for g in self._names(now_ms):
            info = self._info(g, None, now_ms)
            out.append(ap.GroupSummary(g, [t.topic for t in info.topics], len(info.members),
                                       sum(q.lag or 0 for t in info.topics for q in t.queues)))
        conn.respond(f, Code.SUCCESS, jsonbody.encode(ap.GroupList(out)))

    def describe_group(self, conn, f) -> None:
        r = jsonbody.decode(ap.DescribeGroup, f.body)
        Guard.require(may_group(conn.principal, r.group))
        self.broker.serve_or_raise("group")
        now_ms = time.monotonic() * 1000
        names = self._names(now_ms)
        if r.group not in names:
            # only the groups this principal may use: listing every group is an admin's right
            shown = [g for g in names if may_group(conn.principal, g) is None]
            return conn.respond(f, Code.SUBSCRIPTION_GROUP_NOT_EXIST,
                                error=f"no consumer group {r.group!r} (groups you may use: {', '.join(shown) or 'none'})")
        conn.respond(f, Code.SUCCESS, jsonbody.encode(self._info(r.group, r.topic, now_ms)))
