"""Admin over every broker group that a bootstrap list's addresses belong to, without a name
server: `tidelog cluster env` puts every node of every group in one TIDELOG_BOOTSTRAP, and the
CLI's topic, group, query and transfer-leader commands ask each group (as mqadmin asks every
broker of a cluster). The groups are found from the nodes' own STATUS."""

from __future__ import annotations

import time

from broker.client.admin import Admin
from broker.client.connection import parse_bootstrap
from broker.client.errors import AuthenticationError, ConnectError, ConnectionLost, RequestTimeout, TidelogError


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


def per_group(bootstrap, ask, **auth) -> dict[str, object]:
    """ask(Admin) on each broker group of `bootstrap` (`bootstrap_groups`), the Admin given
    every member of the group: {broker_name: its answer or the TidelogError it raised}, in
    broker_name order."""
    out: dict[str, object] = {}
    for name, addresses in sorted(bootstrap_groups(bootstrap, **auth).items()):
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
