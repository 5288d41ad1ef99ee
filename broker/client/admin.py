"""The Admin client: topics, consumer groups, status, lookups by key and id, leadership and promotion."""

from __future__ import annotations

import dataclasses

from broker.client.base import ClientBase
from broker.client.connection import parse_bootstrap
from broker.client.errors import BrokerError, PermissionDenied
from broker.client.consumer import Message, allocate
from broker.protocol import acl as aclp
from broker.protocol import admin as ap
from broker.protocol.ha import HARole
from broker.protocol import jsonbody
from broker.protocol import query as qp
from broker.protocol import topics as tp
from broker.protocol.codes import Code, Req
from broker.security.scram import SHA512, make_verifier
from broker.store import codec


def group_view(info: ap.GroupInfo) -> dict:
    """A DESCRIBE_GROUP answer as one JSON-ready dict: every queue with its owner, every
    member with the queues it owns (by the consumers' own allocation over the members in
    the broker's order), and the group's total lag."""
    members = [m.client_id for m in info.members]
    owns: dict[str, dict[str, list[int]]] = {m: {} for m in members}
    owner: dict[tuple[str, int], str] = {}
    for t in info.topics:
        for m in members:
            mine = allocate(list(range(t.read_queues)), members, m)
            if mine:
                owns[m][t.topic] = mine
            owner.update({(t.topic, q): m for q in mine})
    queues = [dataclasses.asdict(q) | {"topic": t.topic, "owner": owner.get((t.topic, q.queue_id))}
              for t in info.topics for q in t.queues]
    return {"group": info.group, "lag": sum(q["lag"] or 0 for q in queues), "queues": queues,
            "members": [dataclasses.asdict(m) | {"owns": owns[m.client_id]} for m in info.members]}


def answered_messages(body: bytes, match) -> list:
    """The messages of a QUERY answer that `match` (a codec.Message -> bool), each once, in
    (store time, index, place in batch) order, the broker's. The answer holds whole entries
    of either format: a record batch (TLE2) comes back whole when any of its messages was
    found, so the client picks the ones asked for. Raises codec.CorruptEntry."""
    seen = {(m.index, m.batch_pos): m for m in codec.iter_messages(body, verify=True) if match(m)}
    return sorted(seen.values(), key=lambda m: (m.store_ts_ms, m.index, m.batch_pos))


class Admin(ClientBase):
    # --- async API -------------------------------------------------------------------------

    async def create_topic_async(self, topic: str, queues: int = 4, read_queues: int | None = None,
                                 perm: int = tp.PERM_RW, update: bool = False, force: bool = False) -> tp.TopicInfo:
        """`force`: an update that leaves unconsumed messages where no consumer reads (fewer
        read queues than write queues, or read queues removed before they were drained);
        refused with BAD_REQUEST and why otherwise."""
        return await self._session().call_json(
            Req.CREATE_TOPIC, tp.CreateTopic(topic, queues, read_queues, perm, update, force), tp.TopicInfo)

    async def list_topics_async(self) -> list[str]:
        return (await self._session().call_json(Req.LIST_TOPICS, None, tp.TopicList)).topics

    async def describe_topic_async(self, topic: str) -> tp.TopicInfo:
        return await self._session().call_json(Req.DESCRIBE_TOPIC, tp.TopicName(topic), tp.TopicInfo)

    async def route_async(self, topic: str) -> tp.Route:
        """What a producer asks before sending (GET_ROUTE): the topic's queues, or -- for an
        unknown topic on a broker that creates topics on first send -- its template
        (`exists` False; nothing is created by asking)."""
        return await self._session().call_json(Req.GET_ROUTE, tp.TopicName(topic), tp.Route)

    async def status_async(self) -> dict:
        f = await self._session().call_json(Req.STATUS, None)
        return jsonbody.decode(dict, f.body)

    async def query_by_key_async(self, topic: str, key: str, begin_ms: int = 0,
                                 end_ms: int = qp.TIME_MAX_MS, max_results: int = 32) -> list[Message]:
        f = await self._session().call_json(Req.QUERY_BY_KEY, qp.QueryByKey(topic, key, begin_ms, end_ms, max_results),
                                            ok=(Code.SUCCESS, Code.QUERY_NOT_FOUND))
        if f.code != Code.SUCCESS:
            return []
        found = answered_messages(f.body, lambda m: m.topic == topic and key in m.keys)
        return [Message.from_entry(m) for m in found[:max_results]]

    async def query_by_id_async(self, msg_id: str, begin_ms: int = 0,
                                end_ms: int = qp.TIME_MAX_MS) -> Message | None:
        f = await self._session().call_json(Req.QUERY_BY_ID, qp.QueryById(msg_id, begin_ms, end_ms),
                                            ok=(Code.SUCCESS, Code.QUERY_NOT_FOUND))
        if f.code != Code.SUCCESS:
            return None
        want = msg_id.lower()
        found = answered_messages(f.body, lambda m: m.msg_id.hex() == want)
        return Message.from_entry(found[0]) if found else None

    async def transfer_leader_async(self, target: str) -> dict:
        """Start moving a raft group's leadership to `target`: {} once started, or
        {"already_leader": True, "leader", "term"} when `target` leads already (nothing moves)."""
        f = await self._session().call_json(Req.TRANSFER_LEADER, ap.TransferLeader(target))
        return jsonbody.decode(dict, f.body)

    async def promote_async(self, node: str, force: bool = False, timeout_ms: int = 30_000) -> dict:
        """Make slave `node` of a master-slave group its master; the report says whether it
        was clean (no acknowledged message can be lost) and who follows it now."""
        st = await self.status_async()
        peers = (st.get("replication") or {}).get("peers") or {}
        if st.get("mode") != "master-slave":
            raise BrokerError(Code.BAD_REQUEST, f"promote needs a master-slave group (this is {st.get('mode')})")
        if node not in peers:
            raise BrokerError(Code.BAD_REQUEST, f"no node {node!r} in the group (members: {', '.join(sorted(peers))})")
        f = await self._direct(peers[node], Req.HA_ROLE, HARole("promote", force), timeout_ms)
        return jsonbody.decode(dict, f.body)

    async def _direct(self, address: str, code: int, body, timeout_ms: int):
        """One request to one node (no following of NOT_LEADER)."""
        host, port = parse_bootstrap([address])[0]
        conn = await self.open_connection(host, port)
        try:
            f = await conn.request(code, jsonbody.encode(body), timeout_ms / 1000)
        finally:
            conn.close()
        if f.code == Code.NO_PERMISSION:
            raise PermissionDenied(f.code, f.headers.get("error", ""))
        if f.code != Code.SUCCESS:
            raise BrokerError(f.code, f.headers.get("error", ""))
        return f

    async def set_faults_async(self, address: str, drop_peers=(), isolate: bool = False) -> dict:
        """Set one node's transport fault switch (drills; the node needs fault_injection: true)."""
        f = await self._direct(address, Req.FAULT, ap.Faults(list(drop_peers), isolate),
                               int(self.request_timeout_s * 1000))
        return jsonbody.decode(dict, f.body)

    async def list_groups_async(self) -> list[ap.GroupSummary]:
        return (await self._session().call_json(Req.LIST_GROUPS, None, ap.GroupList)).groups

    async def describe_group_async(self, group: str, topic: str | None = None) -> dict:
        """The group's offsets and lag per queue and its members, each with the queues it
        owns (see `group_view`); BrokerError SUBSCRIPTION_GROUP_NOT_EXIST for an unknown group."""
        return group_view(await self._session().call_json(
            Req.DESCRIBE_GROUP, ap.DescribeGroup(group, topic), ap.GroupInfo))

    # users and roles at runtime (ACL_UPDATE; admin only): each answer is the effective
    # {"users": [{name, roles, source}], "roles": {name: {admin, pub, sub, groups, source}}}

    async def _acl(self, req: aclp.AclUpdate) -> dict:
        f = await self._session().call_json(Req.ACL_UPDATE, req)
        return jsonbody.decode(dict, f.body)

    async def set_user_async(self, name: str, password: str, roles=()) -> dict:
        """Create or replace user `name`; its SCRAM verifier is made here (the password never
        leaves this process). Its existing connections must log in again."""
        if not password:
            raise ValueError("set_user: password: must not be empty")
        return await self._acl(aclp.AclUpdate("set_user", name, roles=tuple(roles), scram=make_verifier(password),
                                              scram512=make_verifier(password, mechanism=SHA512)))

    async def delete_user_async(self, name: str) -> dict:
        return await self._acl(aclp.AclUpdate("delete_user", name))

    async def set_role_async(self, name: str, admin: bool = False, pub=(), sub=(), groups=()) -> dict:
        return await self._acl(aclp.AclUpdate("set_role", name, admin=admin, pub=tuple(pub), sub=tuple(sub),
                                              groups=tuple(groups)))

    async def delete_role_async(self, name: str) -> dict:
        return await self._acl(aclp.AclUpdate("delete_role", name))

    async def acl_async(self) -> dict:
        """The effective users (with their roles, never their verifiers) and roles."""
        return await self._acl(aclp.AclUpdate("list"))

    async def heartbeat_async(self, client_id: str, group: str = "") -> ap.GroupMembers:
        return await self._session().call_json(Req.HEARTBEAT, ap.Heartbeat(client_id, group), ap.GroupMembers)

    # --- blocking API ----------------------------------------------------------------------

    def create_topic(self, topic: str, queues: int = 4, read_queues: int | None = None,
                     perm: int = tp.PERM_RW, update: bool = False, force: bool = False) -> tp.TopicInfo:
        return self._run(self.create_topic_async(topic, queues, read_queues, perm, update, force))

    def list_topics(self) -> list[str]:
        return self._run(self.list_topics_async())

    def describe_topic(self, topic: str) -> tp.TopicInfo:
        return self._run(self.describe_topic_async(topic))

    def status(self) -> dict:
        return self._run(self.status_async())

    def set_user(self, name: str, password: str, roles=()) -> dict:
        return self._run(self.set_user_async(name, password, roles))

    def delete_user(self, name: str) -> dict:
        return self._run(self.delete_user_async(name))

    def set_role(self, name: str, admin: bool = False, pub=(), sub=(), groups=()) -> dict:
        return self._run(self.set_role_async(name, admin, pub, sub, groups))

    def delete_role(self, name: str) -> dict:
        return self._run(self.delete_role_async(name))

    def acl(self) -> dict:
        return self._run(self.acl_async())

    def list_groups(self) -> list[ap.GroupSummary]:
        return self._run(self.list_groups_async())

    def describe_group(self, group: str, topic: str | None = None) -> dict:
        return self._run(self.describe_group_async(group, topic))

    def set_faults(self, address: str, drop_peers=(), isolate: bool = False) -> dict:
        return self._run(self.set_faults_async(address, drop_peers, isolate))

    def transfer_leader(self, target: str) -> dict:
        return self._run(self.transfer_leader_async(target))

    def promote(self, node: str, force: bool = False, timeout_ms: int = 30_000) -> dict:
        return self._run(self.promote_async(node, force, timeout_ms))

    def query_by_key(self, topic: str, key: str, begin_ms: int = 0, end_ms: int = qp.TIME_MAX_MS,
                     max_results: int = 32) -> list[Message]:
        return self._run(self.query_by_key_async(topic, key, begin_ms, end_ms, max_results))

    def query_by_id(self, msg_id: str, begin_ms: int = 0, end_ms: int = qp.TIME_MAX_MS) -> Message | None:
        return self._run(self.query_by_id_async(msg_id, begin_ms, end_ms))

