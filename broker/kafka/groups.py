"""Kafka's classic consumer groups on a broker (broker/kafka/service.py's third part): the
requests mapped onto the pure coordinator (coordinator.py) and the broker's own offsets.

The coordinator of every group is the node that takes writes (the raft leader, the master):
FindCoordinator names it, and the other nodes answer the group requests NOT_COORDINATOR,
which makes a client look again. Membership lives in memory on the coordinator (a failover
makes the clients rejoin, as a Kafka coordinator move does); committed offsets are the
broker's group offsets (`%OFFSET%` system entries: replicated and kept as a native
consumer's, under the same group name), committed through `repl.commit_system` and answered
once that says they are kept.

ACLs: every group request needs the group (`may_group`); OffsetCommit and OffsetFetch also
need SUB on each topic.
"""

from __future__ import annotations

import time

from broker.kafka import coordinator as C
from broker.kafka import errors as E
from broker.security import acl
from broker.system import offsets_entry

FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 10, 11, 12, 13, 14
OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, LIST_GROUPS = 8, 9, 15, 16
SERVED = {OFFSET_COMMIT: (2, 8), OFFSET_FETCH: (1, 7), FIND_COORDINATOR: (0, 3), JOIN_GROUP: (0, 7),
          HEARTBEAT: (0, 4), LEAVE_GROUP: (0, 4), SYNC_GROUP: (0, 5), DESCRIBE_GROUPS: (0, 5),
          LIST_GROUPS: (0, 4)}
NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS = 16, 14
TICK_S = 0.1
REBALANCE_TIMEOUT_MS_MAX = 300_000  # a join waits at most this long (the clients' max.poll.interval.ms default)
GROUP_KEY = 0  # FindCoordinator key_type: a group (1 is a transaction: not supported)


def _ms() -> int:
    return time.monotonic_ns() // 1_000_000


class KafkaGroups:
    def __init__(self, broker, service):
        self.broker, self.service = broker, service
        self.coord = C.Coordinator(C.Bounds(), id_prefix=f"{service.me}-{_ms() % 100000}-")
        self._timer = None
        self.handlers = {FIND_COORDINATOR: self.find_coordinator, JOIN_GROUP: self.join, SYNC_GROUP: self.sync,
                         HEARTBEAT: self.heartbeat, LEAVE_GROUP: self.leave, OFFSET_COMMIT: self.offset_commit,
                         OFFSET_FETCH: self.offset_fetch, DESCRIBE_GROUPS: self.describe,
                         LIST_GROUPS: self.list_groups}

    # --- plumbing --------------------------------------------------------------------------

    def _coordinating(self) -> bool:
        """This node takes writes, and (several groups) its group coordinates (cluster.py)."""
        return self.broker.repl.accepting_writes and self.service.cluster.coordinates()

    def _group_error(self, conn, group: str) -> int:
        if conn.principal is not None and acl.may_group(conn.principal, group) is not None:
            return E.GROUP_AUTHORIZATION_FAILED
        return E.NONE if self._coordinating() else NOT_COORDINATOR

    def _deliver(self, replies) -> None:
        """The coordinator's answers to waiting joins and syncs (tokens: conn, header, slot)."""
        for r in replies:
            conn, h, slot = r.token
            if not conn.closed:
                self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, **r.body})
                conn.done_inflight(1)
                conn.flush()
        self._arm()

    def _arm(self) -> None:
        if self._timer is None and self.coord.groups:
            self._timer = self.broker.loop.call_later(TICK_S, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if not self._coordinating():
            return self.role_changed()
        self._deliver(self.coord.tick(_ms()))

    def role_changed(self) -> None:
        """No longer the coordinator: every group's members rejoin where FindCoordinator says."""
        if self._coordinating():
            return
        out = []
        for g in list(self.coord.groups.values()):
            for m in list(g.members.values()):
                if m.join_token is not None:
                    out.append(C.Reply(m.join_token, "join", C._join_error(NOT_COORDINATOR, m.member_id)))
                if m.sync_token is not None:
                    out.append(C.Reply(m.sync_token, "sync", {"error_code": NOT_COORDINATOR, "assignment": b""}))
        self.coord.groups.clear()
        self._deliver(out)

    def _wait(self, conn, h, slot, replies: list) -> None:
        """Deliver `replies`; the request itself may be among them, or wait (counted in flight)."""
        conn.add_inflight(1)
        self._deliver(replies)

    # --- FindCoordinator ----------------------------------------------------------------------

    def find_coordinator(self, conn, h, req, slot) -> None:
        cluster = self.service.cluster
        if cluster.multi:
            return self.service._spawn(conn, self._find_coordinator_multi(conn, h, req, slot))
        out = {"throttle_time_ms": 0, "error_code": E.NONE, "error_message": None, "node_id": -1, "host": "", "port": -1}
        leader = self.broker.repl.leader_id
        addr = self.service.addresses.get(leader)
        if req.get("key_type", GROUP_KEY) != GROUP_KEY:
            out.update(error_code=E.UNSUPPORTED_VERSION, error_message="transactions are not supported")
        elif conn.principal is not None and acl.may_group(conn.principal, req["key"]) is not None:
            out.update(error_code=E.GROUP_AUTHORIZATION_FAILED,
                       error_message=acl.may_group(conn.principal, req["key"]))
        elif addr is None:
            out.update(error_code=C.COORDINATOR_NOT_AVAILABLE, error_message="no leader known: retry")
        else:
            out.update(node_id=self.service.node_ids[leader], host=addr[0], port=addr[1])
        self.service._answer(conn, slot, h, h.api_version, out)

    async def _find_coordinator_multi(self, conn, h, req, slot) -> None:
        from broker.kafka.cluster import kafka_address_of, node_id_of

        out = {"throttle_time_ms": 0, "error_code": E.NONE, "error_message": None, "node_id": -1, "host": "", "port": -1}
        why = None if conn.principal is None else acl.may_group(conn.principal, req["key"])
        coord = None if why else await self.service.cluster.coordinator()
        if req.get("key_type", GROUP_KEY) != GROUP_KEY:
            out.update(error_code=E.UNSUPPORTED_VERSION, error_message="transactions are not supported")
        elif why:
            out.update(error_code=E.GROUP_AUTHORIZATION_FAILED, error_message=why)
        elif coord is None or coord[1] is None:
            out.update(error_code=C.COORDINATOR_NOT_AVAILABLE, error_message="no leader of the coordinating group: retry")
        else:
            host, port = kafka_address_of(coord[1])
            out.update(node_id=node_id_of(coord[1]), host=host, port=port)
        self.service._answer(conn, slot, h, h.api_version, out)

    # --- membership ---------------------------------------------------------------------------

    def join(self, conn, h, req, slot) -> None:
        err = self._group_error(conn, req["group_id"])
        if err:
            return self.service._answer(conn, slot, h, h.api_version,
                                        {"throttle_time_ms": 0, **C._join_error(err, req["member_id"])})
        rebalance = min(req.get("rebalance_timeout_ms", -1), REBALANCE_TIMEOUT_MS_MAX)
        self._wait(conn, h, slot, self.coord.join(
            (conn, h, slot), _ms(), req["group_id"], req["member_id"], h.client_id or "", conn.source,
            req["session_timeout_ms"], rebalance if rebalance > 0 else req["session_timeout_ms"],
            req["protocol_type"], [(p["name"], p["metadata"]) for p in req["protocols"]],
            req.get("group_instance_id"), require_known_member_id=h.api_version >= 4))

    def sync(self, conn, h, req, slot) -> None:
        err = self._group_error(conn, req["group_id"])
        if err:
            return self.service._answer(conn, slot, h, h.api_version,
                                        {"throttle_time_ms": 0, "error_code": err, "assignment": b""})
        self._wait(conn, h, slot, self.coord.sync(
            (conn, h, slot), _ms(), req["group_id"], req["member_id"], req["generation_id"],
            {a["member_id"]: a["assignment"] for a in req["assignments"]}))

    def heartbeat(self, conn, h, req, slot) -> None:
        err = self._group_error(conn, req["group_id"]) or self.coord.heartbeat(
            _ms(), req["group_id"], req["member_id"], req["generation_id"])
        self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "error_code": err})

    def leave(self, conn, h, req, slot) -> None:
        v = h.api_version
        ids = [req["member_id"]] if v < 3 else [m["member_id"] for m in req["members"]]
        err = self._group_error(conn, req["group_id"])
        if err:
            errors, replies = [err] * len(ids), []
        else:
            errors, replies = self.coord.leave(_ms(), req["group_id"], ids)
        out = {"throttle_time_ms": 0, "error_code": err or (errors[0] if v < 3 and errors else E.NONE),
               "members": [{"member_id": m, "group_instance_id": None, "error_code": e} for m, e in zip(ids, errors)]}
        self.service._answer(conn, slot, h, v, out)
        self._deliver(replies)

    # --- offsets --------------------------------------------------------------------------------

    def offset_commit(self, conn, h, req, slot) -> None:
        group = req["group_id"]
        err = self._group_error(conn, group) or self.coord.may_commit(
            group, req["member_id"], req["generation_id_or_member_epoch"])
        topics, pending = [], []
        for t in req["topics"]:
            parts = []
            topics.append({"name": t["name"], "partitions": parts})
            why = None if conn.principal is None else acl.may_sub(conn.principal, t["name"])
            offsets = {}
            for p in t["partitions"]:
                a = {"partition_index": p["partition_index"], "error_code": err}
                parts.append(a)
                if not err and why is not None:
                    a["error_code"] = E.TOPIC_AUTHORIZATION_FAILED
                elif not err and p["committed_offset"] < 0:
                    a["error_code"] = E.OFFSET_OUT_OF_RANGE
                elif not err:
                    offsets[p["partition_index"]] = p["committed_offset"]
            if offsets:
                pending.append((t["name"], offsets, [a for a in parts if a["error_code"] == E.NONE]))
        if not pending:
            return self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "topics": topics})
        left = [len(pending)]
        conn.add_inflight(1)

        def done(answers, code, error):
            if code:
                for a in answers:
                    a["error_code"] = E.from_code(code)
            left[0] -= 1
            if left[0] == 0:
                conn.done_inflight(1)
                if not conn.closed:
                    self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "topics": topics})
                    conn.flush()
        for topic, offsets, answers in pending:
            self.broker.repl.commit_system(*offsets_entry(group, topic, offsets),
                                           lambda code, error, a=answers: done(a, code, error))

    def offset_fetch(self, conn, h, req, slot) -> None:
        group = req["group_id"]
        err = self._group_error(conn, group)
        offsets = self.broker.offsets
        names = [t["name"] for t in req["topics"]] if req["topics"] is not None else \
            sorted(offsets.offsets.get(group, {}))
        wanted = {t["name"]: t["partition_indexes"] for t in req["topics"] or ()}
        topics = []
        for name in names:
            denied = conn.principal is not None and acl.may_sub(conn.principal, name) is not None
            have = {} if err or denied else dict(offsets.offsets.get(group, {}).get(name, {}))
            qs = wanted.get(name) or sorted(have)
            topics.append({"name": name, "partitions": [
                {"partition_index": q, "committed_offset": have.get(q, -1), "metadata": "",
                 "error_code": err or (E.TOPIC_AUTHORIZATION_FAILED if denied else E.NONE)} for q in qs]})
        self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "topics": topics,
                                                             "error_code": err})

    # --- DescribeGroups, ListGroups -----------------------------------------------------------------

    def describe(self, conn, h, req, slot) -> None:
        groups = []
        for g in req["groups"]:
            err = self._group_error(conn, g)
            d = self.coord.describe(g) if not err else {"group_id": g, "group_state": "", "protocol_type": "",
                                                         "protocol_data": "", "members": []}
            groups.append({"error_code": err, **d})
        self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "groups": groups})

    def list_groups(self, conn, h, req, slot) -> None:
        p = conn.principal
        states = set(req.get("states_filter") or ())
        groups = [{"group_id": g.group_id, "protocol_type": g.protocol_type or "", "group_state": g.state}
                  for g in self.coord.groups.values()
                  if (p is None or acl.may_group(p, g.group_id) is None) and (not states or g.state in states)]
        err = E.NONE if self._coordinating() else NOT_COORDINATOR
        self.service._answer(conn, slot, h, h.api_version, {"throttle_time_ms": 0, "error_code": err,
                                                             "groups": groups})
