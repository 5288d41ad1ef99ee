"""Admin over every broker group that a bootstrap list's addresses belong to, without a name
server: `tidelog cluster env` puts every node of every group in one TIDELOG_BOOTSTRAP, and the
CLI's topic, group, query and transfer-leader commands ask each group (as mqadmin asks every
broker of a cluster). The groups are found from the nodes' own STATUS."""

from __future__ import annotations

import logging
import os
import time
import zlib

from broker.client.admin import Admin
from broker.client.connection import parse_bootstrap
from broker.client.errors import (AuthenticationError, BrokerError, ConnectError, ConnectionLost, RequestTimeout,
                                  TidelogError)
from broker.namesrv import TEMPLATE_TOPIC
from broker.protocol import namesrv as ns
from broker.protocol.codes import Code

log = logging.getLogger(__name__)

TEMPLATE_PROBE = "tidelog-route-probe"  # asked (with a random end) for the template: never created


def bootstrap_groups(bootstrap, **auth) -> dict[str, list[str]]:
    """The broker groups that `bootstrap`'s addresses belong to, {broker_name: its members'
    addresses, leader first when known}, as the nodes' STATUS says (`tidelog cluster env` puts
    every node of every group in one TIDELOG_BOOTSTRAP; no name server needed). One STATUS per
    group: the first member that answers names the others. An address that does not answer and
    that no member names is a group of its own as far as anyone can tell, {address: [address]}
    (a group that is down is not left out unseen); when no address answers, the error is raised."""
    groups: dict[str, list[str]] = {}
    placed: set[str] = set()
    errors: dict[str, TidelogError] = {}
    for host, port in parse_bootstrap(bootstrap):
        address = f"{host}:{port}"
        if address in placed:
            continue
        try:
            with Admin([address], **auth) as a:
                st = a.status()
        except AuthenticationError:
            raise  # every member checks the same users: the next one would refuse too
        except (ConnectError, ConnectionLost, RequestTimeout) as e:
            errors[address] = e
            continue
        r = st.get("replication") or {}
        members = groups.setdefault(st["broker_name"], [])
        for m in (r.get("leader_address"), r.get("master_address"), address, *(r.get("peers") or {}).values()):
            if m and m not in members:
                members.append(m)
        placed.update(members)
    if not groups:
        e = list(errors.values())
        raise e[0] if len(e) == 1 else ConnectError("; ".join(map(str, e)),
                                                    refused=all(getattr(x, "refused", False) for x in e))
    return groups | {a: [a] for a in errors if a not in placed}


def answering(found: dict[str, list[str]]) -> tuple[dict[str, list[str]], list[str]]:
    """`bootstrap_groups`' answer split: (the groups some member answered for, the addresses
    that did not answer and that no member names -- its {address: [address]} entries)."""
    groups = {name: members for name, members in found.items() if members != [name]}
    return groups, sorted(name for name in found if name not in groups)


def per_group(bootstrap, ask, **auth) -> dict[str, object]:
    """ask(Admin) on each broker group of `bootstrap` (`bootstrap_groups`), the Admin given
    every member of the group: {broker_name: its answer or the TidelogError it raised}, in
    broker_name order."""
    return on_groups(bootstrap_groups(bootstrap, **auth), ask, **auth)


def on_groups(groups: dict[str, list[str]], ask, **auth) -> dict[str, object]:
    """per_group over groups already found ({broker_name: members' addresses})."""
    out: dict[str, object] = {}
    for name, addresses in sorted(groups.items()):
        try:
            with Admin(addresses, **auth) as a:
                out[name] = ask(a)
        except TidelogError as e:  # reported per group
            out[name] = e
    return out


def describe_topic(bootstrap, topic: str, **auth) -> dict[str, object]:
    """The topic as each broker group of `bootstrap` describes it (`bootstrap_groups`), every
    group's queues as mqadmin topicStatus lists every broker's: {broker_name: TopicInfo or the
    error that group raised (TOPIC_NOT_EXIST where it does not live)}."""
    return per_group(bootstrap, lambda a: a.describe_topic(topic), **auth)


def list_topics(bootstrap, **auth) -> dict[str, object]:
    """Each broker group's topics (mqadmin topicList over a cluster): {broker_name: [topic, ...]
    or the error that group raised}."""
    return per_group(bootstrap, lambda a: a.list_topics(), **auth)


def list_groups(bootstrap, **auth) -> dict[str, object]:
    """Each broker group's consumer groups, each with its lag there: {broker_name:
    [GroupSummary, ...] or the error that group raised}."""
    return per_group(bootstrap, lambda a: a.list_groups(), **auth)


def describe_group(bootstrap, group: str, topic: str | None = None, **auth) -> dict[str, object]:
    """The consumer group as each broker group sees it (Admin.describe_group: offsets and lag
    of that group's queues, the members heartbeating to it): {broker_name: the view or the
    error that group raised (SUBSCRIPTION_GROUP_NOT_EXIST where the consumer group never was)}."""
    return per_group(bootstrap, lambda a: a.describe_group(group, topic), **auth)


def group_of(bootstrap, node: str, **auth) -> tuple[str, dict[str, str]]:
    """The broker group of `bootstrap` (`bootstrap_groups`) that has member `node`, and its
    members {node id: address}, as its STATUS says; ValueError naming every group reached and
    its members when none has it."""
    seen: dict[str, list[str]] = {}
    for name, addresses in sorted(bootstrap_groups(bootstrap, **auth).items()):
        try:
            with Admin(addresses, **auth) as a:
                st = a.status()
        except AuthenticationError:
            raise
        except TidelogError:
            continue  # a group that does not answer now: the others may hold the node
        peers = dict((st.get("replication") or {}).get("peers") or {})
        if node in peers:
            return st["broker_name"], peers
        seen[st["broker_name"]] = sorted(peers) or [f"{st.get('mode', 'standalone')}: no replicas"]
    groups = ", ".join(f"{g} (members: {', '.join(m)})" for g, m in seen.items())
    raise ValueError(f"no node {node!r} in group{'s' if len(seen) > 1 else ''} {groups or '(none answered)'}")


def wait_leader(members: dict[str, str], target: str, timeout_s: float, **auth) -> tuple[str | None, int | None]:
    """Wait (at most timeout_s) until member `target` of the group `members` ({node id:
    address}) says it leads; (the leader, its term): `target` when it does, else the leader
    the group's members name now (None when none answers or none leads)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        ms = int(max(0.2, min(1.0, left)) * 1000)
        try:
            with Admin([members[target]], request_timeout_ms=ms, connect_timeout_ms=ms, **auth) as a:
                r = a.status().get("replication") or {}
            if r.get("id") == target and r.get("role") == "leader":
                return target, r.get("term")
        except AuthenticationError:
            raise
        except TidelogError:
            pass  # the target does not answer now: asked again until the deadline
        if time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    for address in members.values():  # who leads instead
        try:
            with Admin([address], request_timeout_ms=1000, connect_timeout_ms=1000, **auth) as a:
                r = a.status().get("replication") or {}
        except TidelogError:
            continue
        if r.get("leader"):
            return r["leader"], r.get("term")
    return None, None


class BootstrapRoutes:
    """The name servers' part for a ClusterProducer / ClusterConsumer when there are none to
    ask: the broker groups `bootstrap_groups` found ({broker_name: members' addresses}) are
    asked themselves. A topic's route is every group whose leader holds it (GET_ROUTE, the
    question a one-group Producer asks; STATUS names the leader, as a name server routes it:
    a fenced master or a slave cut off from its master names none); the auto-creation template
    is every group whose broker would create an unknown topic on its first send (its GET_ROUTE
    answers with its own template then). Used by `tidelog produce|consume` when the `-b`
    addresses span several groups (`tidelog cluster env` of `cluster up --groups N`). A group
    that does not answer is left out of the route, with a warning whenever that set changes."""

    source = ("the groups of the addresses given", "-b <one group's addresses>")  # (NameServers.source)

    def __init__(self, groups: dict[str, list[str]], **auth):
        self.groups = {name: Admin(addresses, **auth) for name, addresses in sorted(groups.items())}
        self.missing: frozenset[str] = frozenset()  # the groups that did not answer the last fetch

    async def topic_route(self, topic: str) -> ns.TopicRoute | None:
        """The groups that hold `topic` (for TEMPLATE_TOPIC: that would create an unknown
        topic), or None when none of those that answered does; when none answers, the error
        is raised (RouteCache keeps a route it knows)."""
        template = topic == TEMPLATE_TOPIC
        ask = f"{TEMPLATE_PROBE}-{os.urandom(6).hex()}" if template else topic
        routes: dict[str, ns.GroupRoute] = {}
        errors: dict[str, TidelogError] = {}
        for name, admin in self.groups.items():
            try:
                st = await admin.status_async()
                conn = admin._session().conn
                answered = conn.address if conn is not None else None  # the member STATUS reached
                r = await admin.route_async(ask)
            except BrokerError as e:
                if e.code != Code.TOPIC_NOT_EXIST:  # (not held there: an answer)
                    errors[name] = e
                continue
            except TidelogError as e:  # down or unreachable now: the others may answer
                errors[name] = e
                continue
            if r.exists == template or st["broker_name"] in routes:
                continue  # not held (for the template: a probe that exists is no template)
            routes[st["broker_name"]] = _group_route(st, answered, admin.addresses, r)
        self._left_out(topic, errors)
        if not routes and len(errors) == len(self.groups):
            raise next(iter(errors.values()))  # nobody answered: nothing is known
        if not routes:
            return None
        groups = [routes[n] for n in sorted(routes)]
        return ns.TopicRoute(topic, zlib.crc32(repr(groups).encode()), not template, groups)

    def _left_out(self, topic: str, errors: dict[str, TidelogError]) -> None:
        missing = frozenset(errors)
        if missing and missing != self.missing:
            log.warning("broker group%s %s left out of topic %s's route: %s", "s" if len(missing) > 1 else "",
                        ", ".join(sorted(missing)), topic, "; ".join(f"{n}: {e}" for n, e in sorted(errors.items())))
        self.missing = missing

    async def aclose(self) -> None:
        for admin in self.groups.values():
            await admin.aclose()

    def close(self) -> None:
        for admin in self.groups.values():
            admin.close()


def _group_route(st: dict, answered: str | None, addresses, r) -> ns.GroupRoute:
    """A group's route from one member's STATUS: its leader as a name server would route it
    (broker/registrar.py: a raft leader, a master that takes writes, a standalone broker;
    else the leader or master it names, while it follows one)."""
    rep = st.get("replication") or {}
    role = st.get("role")
    if role in ns.LEADING_ROLES and not rep.get("fenced") and not rep.get("waiting_to_lead"):
        leader = answered  # (fenced, waiting_to_lead: a master's, which takes no writes then)
    elif role == "slave":
        leader = rep.get("master_address") if rep.get("connected") else None
    else:
        leader = rep.get("leader_address")
    members = {f"{h}:{p}" for h, p in addresses} | ({answered} if answered else set())
    return ns.GroupRoute(st["broker_name"], r.write_queues, r.read_queues, r.perm, leader,
                         int(rep.get("term") or rep.get("epoch") or 0), sorted(m for m in members if m != leader))
