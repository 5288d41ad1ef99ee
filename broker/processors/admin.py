"""The low-rate requests: topics, routes, consumer offsets, lookups, heartbeats, status."""

from __future__ import annotations

import dataclasses
import logging

import re

from broker.processors.groups import GroupsProcessor
from broker.protocol import acl as aclp
from broker.protocol import admin as ap
from broker.protocol.ha import HARole
from broker.protocol import jsonbody
from broker.protocol import offsets as op
from broker.protocol import query as qp
from broker.protocol import topics as tp
from broker.protocol.codes import BadRequest, Code, Req
from broker.security.acl import may_group, may_sub
from broker.security.guard import Guard
from broker.topics import TopicError
from broker.security.scram import SHA512, parse_verifier
from broker.system import acl_entry, offsets_entry, topic_entry
from replication.errors import PromotionRefused

log = logging.getLogger(__name__)


def respond_later(conn, f, body_fn=lambda: b"{}"):
    """done(code, error) for an answer that comes later (a quorum, an fsync)."""
    conn.add_inflight(1)

    def done(code: int, error: str | None) -> None:
        conn.done_inflight(1)
        if not conn.closed:
            conn.respond(f, code, body_fn() if code == Code.SUCCESS else b"", error=error)
            conn.flush()
    return done


def acl_change(r: aclp.AclUpdate, users, roles: dict) -> dict:
    """The %ACL% entry an ACL_UPDATE makes, validated against the effective `users` and
    `roles` (BadRequest naming what is wrong): every member applies it without checking."""
    if not re.fullmatch(aclp.NAME_RE.removeprefix("^").removesuffix("$"), r.name):
        raise BadRequest(f"AclUpdate: name: {r.name!r} is not 1-64 characters of A-Z a-z 0-9 _ . @ -")
    if r.action == "set_user":
        unknown = [x for x in r.roles if x not in roles]
        if unknown:
            raise BadRequest(f"no role {', '.join(unknown)} in this cluster (roles: {', '.join(sorted(roles))}): "
                             f"create it first (tidelog role set {unknown[0]} ...)")
        try:
            parse_verifier(r.scram)
            if r.scram512:
                parse_verifier(r.scram512, SHA512)
        except ValueError as e:
            raise BadRequest(f"AclUpdate: scram: {e} (make it with broker.security.scram.make_verifier)") from None
        change = {"op": "set_user", "name": r.name, "roles": list(dict.fromkeys(r.roles)), "scram": r.scram}
        return change | ({"scram512": r.scram512} if r.scram512 else {})
    if r.action == "delete_user":
        if r.name not in {u.name for u in users}:
            raise BadRequest(f"AclUpdate: no user {r.name!r}")
        return {"op": "delete_user", "name": r.name}
    if r.action == "set_role":
        for what, patterns in (("pub", r.pub), ("sub", r.sub), ("groups", r.groups)):
            bad = [p for p in patterns if not p or len(p.encode()) > aclp.PATTERN_BYTES_MAX]
            if bad:
                raise BadRequest(f"AclUpdate: {what}: {bad[:3]} are not patterns (a name, a prefix "
                                 f"ending in *, or *; 1-{aclp.PATTERN_BYTES_MAX} bytes)")
        return {"op": "set_role", "name": r.name, "admin": r.admin, "pub": list(r.pub),
                "sub": list(r.sub), "groups": list(r.groups)}
    # delete_role
    if r.name not in roles:
        raise BadRequest(f"AclUpdate: no role {r.name!r}")
    holders = sorted(u.name for u in users if r.name in u.roles)
    if holders:
        raise BadRequest(f"AclUpdate: role {r.name!r} is held by users {holders}: set their roles first")
    return {"op": "delete_role", "name": r.name}


def handlers(broker) -> dict:
    """Request code -> handler(conn, frame)."""
    groups = GroupsProcessor(broker)

    def topic_info(cfg) -> tp.TopicInfo:
        queues = [tp.QueueInfo(q, *broker.store.queue_bounds(cfg.name, q))
                  for q in range(max(cfg.read_queues, cfg.write_queues))]
        return tp.TopicInfo(cfg.name, cfg.write_queues, cfg.read_queues, cfg.perm, queues)

    def unread_in(topic: str):
        """Per queue of `topic`: held messages the furthest-behind group that read the topic has
        not consumed (every held one when no group has)."""
        committed = [qs for g, ts in broker.offsets.offsets.items() for t, qs in ts.items() if t == topic]

        def unread(q: int) -> int:
            lo, hi = broker.store.queue_bounds(topic, q)
            if not committed:
                return hi - lo
            return max(0, hi - max(lo, min(qs.get(q, lo) for qs in committed)))
        return unread

    def create_topic(conn, f):
        r = jsonbody.decode(tp.CreateTopic, f.body)
        broker.serve_or_raise("write")
        try:
            cfg = broker.topics.validate(r.topic, r.write_queues, r.read_queues, r.perm, r.update)
        except FileExistsError:
            return conn.respond(f, Code.TOPIC_EXISTS, error=f"topic {r.topic} exists (update it to change it)")
        except TopicError as e:
            raise BadRequest(str(e)) from None
        hidden = None if r.force else broker.topics.hides_messages(broker.topics.get(r.topic), cfg, unread_in(r.topic))
        if hidden is not None:
            raise BadRequest(f"topic {r.topic}: {hidden}")
        broker.repl.commit_system(*topic_entry(cfg), respond_later(
            conn, f, lambda: jsonbody.encode(topic_info(broker.topics.get(cfg.name) or cfg))))

    def list_topics(conn, f):
        conn.respond(f, Code.SUCCESS, jsonbody.encode(tp.TopicList(sorted(broker.topics.topics))))

    def describe_topic(conn, f):
        r = jsonbody.decode(tp.TopicName, f.body)
        cfg = broker.topics.get(r.topic)
        if cfg is None:
            return conn.respond(f, Code.TOPIC_NOT_EXIST, error=f"topic {r.topic} does not exist")
        conn.respond(f, Code.SUCCESS, jsonbody.encode(topic_info(cfg)))

    def get_route(conn, f):
        r = jsonbody.decode(tp.TopicName, f.body)
        cfg = broker.topics.get(r.topic)
        exists = cfg is not None
        if cfg is None:
            if not broker.topics.auto_create:
                return conn.respond(f, Code.TOPIC_NOT_EXIST, error=f"topic {r.topic} does not "
                                    "exist and auto_create_topic_enable is off")
            cfg = broker.topics.template(r.topic)
        conn.respond(f, Code.SUCCESS, jsonbody.encode(
            tp.Route(cfg.name, cfg.write_queues, cfg.read_queues, cfg.perm, exists)))

    def query_offset(conn, f):
        r = jsonbody.decode(op.QueryOffsets, f.body)
        Guard.require(may_group(conn.principal, r.group) or may_sub(conn.principal, r.topic))
        broker.serve_or_raise("group")
        conn.respond(f, Code.SUCCESS, jsonbody.encode(
            op.Offsets(broker.offsets.query(r.group, r.topic, r.queue_ids))))

    def commit_offset(conn, f):
        r = jsonbody.decode(op.CommitOffsets, f.body)
        if not r.group:
            raise BadRequest("CommitOffsets: group: must not be empty")
        if any(o < 0 for o in r.offsets.values()):
            raise BadRequest("CommitOffsets: offsets: must not be negative")
        Guard.require(may_group(conn.principal, r.group) or may_sub(conn.principal, r.topic))
        broker.serve_or_raise("commit")
        broker.repl.commit_system(*offsets_entry(r.group, r.topic, r.offsets), respond_later(conn, f))

    def query_by_key(conn, f):
        r = jsonbody.decode(qp.QueryByKey, f.body)
        Guard.require(may_sub(conn.principal, r.topic))
        broker.serve_or_raise("read", f.headers)
        found = broker.store.lookup_key(r.topic, r.key, r.begin_ms, r.end_ms, max(1, min(r.max_results, 256)))
        if not found:
            return conn.respond(f, Code.QUERY_NOT_FOUND, error=f"no message with key {r.key!r} in {r.topic}")
        # whole entries, each once: a record batch holding several matches goes out one time
        # (the client picks the messages with the key)
        # and no more bytes than a pull answer (at least one entry): a frame a client takes
        parts, total = [], 0
        for p, n in dict.fromkeys((e.phys_offset, e.size) for e in found):
            if parts and total + n > broker.config.pull_bytes_max:
                break
            parts.append(broker.store.commitlog.read(p, n))
            total += n
        conn.respond(f, Code.SUCCESS, b"".join(parts))

    def query_by_id(conn, f):
        r = jsonbody.decode(qp.QueryById, f.body)
        broker.serve_or_raise("read", f.headers)
        try:
            mid = bytes.fromhex(r.msg_id)
            if len(mid) != 16:
                raise ValueError
        except ValueError:
            raise BadRequest(f"QueryById: msg_id: {r.msg_id!r} is not 32 hex characters") from None
        e = broker.store.lookup_id(mid, r.begin_ms, r.end_ms)
        if e is None or may_sub(conn.principal, e.topic) is not None:  # no hint that it exists
            return conn.respond(f, Code.QUERY_NOT_FOUND, error=f"no message with id {r.msg_id}")
        conn.respond(f, Code.SUCCESS, broker.store.commitlog.read(e.phys_offset, e.size))

    def status(conn, f):
        conn.respond(f, Code.SUCCESS, jsonbody.encode(broker.status()))

    def transfer_leader(conn, f):
        r = jsonbody.decode(ap.TransferLeader, f.body)
        broker.serve_or_raise("write")
        err = broker.repl.transfer_leader(r.target)
        if err is not None:
            raise BadRequest(err)
        rs = broker.repl.status()
        if rs.get("id") == r.target and rs.get("role") == "leader":  # nothing to move: say so
            return conn.respond(f, Code.SUCCESS, jsonbody.encode(
                {"already_leader": True, "leader": r.target, "term": rs.get("term")}))
        conn.respond(f, Code.SUCCESS, b"{}")

    def acl_update(conn, f):
        r = jsonbody.decode(aclp.AclUpdate, f.body)
        store = broker.guard.acl_store
        if r.action == "list":
            return conn.respond(f, Code.SUCCESS, jsonbody.encode(store.view()))
        broker.serve_or_raise("write")
        change = acl_change(r, *store.effective())
        log.info("ACL_UPDATE from %s: %s %r", conn.principal, r.action, r.name)
        broker.repl.commit_system(*acl_entry(change), respond_later(conn, f, lambda: jsonbody.encode(store.view())))

    def get_metadata(conn, f):
        m = broker.repl.metadata()
        if getattr(m, "acl", None) is not None and conn.member is None:
            # the users' verifiers go to members only: an admin *user* could mount an offline
            # dictionary attack with them (and ServerKey impersonates the broker)
            m = dataclasses.replace(m, acl=None)
        conn.respond(f, Code.SUCCESS, jsonbody.encode(m))

    def ha_role(conn, f):
        req = jsonbody.decode(HARole, f.body)
        conn.add_inflight(1)

        async def run():
            try:
                body, code, err = jsonbody.encode(await broker.repl.handle_role_request(req)), Code.SUCCESS, None
            except (PromotionRefused, BadRequest) as e:
                body, code, err = b"", Code.BAD_REQUEST, str(e)
            except Exception as e:  # a bug: answered, logged, the broker serves on
                log.exception("HA_ROLE %s failed", req)
                body, code, err = b"", Code.SYSTEM_ERROR, f"{type(e).__name__}: {e}"
            conn.done_inflight(1)
            if not conn.closed:
                conn.respond(f, code, body, error=err)
                conn.flush()
        broker.spawn(run())

    def fault(conn, f):
        if not broker.config.fault_injection:
            return conn.respond(f, Code.FAULT_INJECTION_DISABLED,
                                error="this node does not take FAULT requests (fault_injection: false)")
        req = jsonbody.decode(ap.Faults, f.body)
        peers = {p.id for p in broker.config.peers}
        unknown = set(req.drop_peers) - peers
        if unknown:
            raise BadRequest(f"drop_peers {sorted(unknown)} are not members of this group")
        if broker.faults.set(req.drop_peers, req.isolate):
            broker.repl.on_faults_changed(broker.faults.drop_peers)
        conn.respond(f, Code.SUCCESS, jsonbody.encode({"drop_peers": sorted(broker.faults.drop_peers),
                                                        "isolate": broker.faults.isolated}))

    return {
        Req.FAULT: fault, Req.ACL_UPDATE: acl_update,
        Req.GET_METADATA: get_metadata, Req.HA_ROLE: ha_role,
        Req.CREATE_TOPIC: create_topic, Req.LIST_TOPICS: list_topics,
        Req.DESCRIBE_TOPIC: describe_topic, Req.GET_ROUTE: get_route,
        Req.QUERY_OFFSET: query_offset, Req.COMMIT_OFFSET: commit_offset,
        Req.QUERY_BY_KEY: query_by_key, Req.QUERY_BY_ID: query_by_id,
        Req.HEARTBEAT: groups.heartbeat, Req.LIST_GROUPS: groups.list_groups,
        Req.DESCRIBE_GROUP: groups.describe_group,
        Req.STATUS: status, Req.TRANSFER_LEADER: transfer_leader,
    }
