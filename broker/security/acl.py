"""Who may do what: users, roles and the permission check (after RocketMQ ACL 2.0 and Kafka
ACLs, kept small). Pure: no sockets, no files.

A role grants topic patterns to publish to (`pub`) and subscribe to (`sub`), consumer-group
patterns (`groups`) and the admin operations (`admin`). A pattern is a name, a prefix ending
in `*`, or `*`. A user holds roles; a group member (proved by its certificate, not a password)
is a principal of its own that may also send replication traffic. Everything not granted is
refused, with a reason that names the user, the permission and the resource.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Principal:
    name: str
    admin: bool = False
    pub: tuple[str, ...] = ()
    sub: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    member: str | None = None  # a group member (mutual TLS): replication traffic and admin

    def __str__(self) -> str:
        return f"member {self.member}" if self.member else f"user {self.name!r}"


def matches(patterns: Iterable[str], name: str) -> bool:
    for p in patterns:
        if p == "*" or p == name or (p.endswith("*") and name.startswith(p[:-1])):
            return True
    return False


class Acl:
    """The users' roles resolved into principals (rebuilt when the configuration changes)."""

    def __init__(self, roles: dict, users: Iterable):
        self._principals: dict[str, Principal] = {}
        for u in users:
            rs = [roles[r] for r in u.roles if r in roles]
            self._principals[u.name] = Principal(
                u.name, admin=any(r.admin for r in rs),
                pub=tuple(p for r in rs for p in r.pub), sub=tuple(p for r in rs for p in r.sub),
                groups=tuple(p for r in rs for p in r.groups))

    def principal(self, user: str) -> Principal | None:
        return self._principals.get(user)

    @staticmethod
    def member(node_id: str) -> Principal:
        return Principal(f"member:{node_id}", admin=True, pub=("*",), sub=("*",), groups=("*",), member=node_id)


ANONYMOUS = Principal("anonymous", admin=True, pub=("*",), sub=("*",), groups=("*",))  # insecure: true


def may_pub(p: Principal, topic: str) -> str | None:
    """None if `p` may publish to `topic`, else why not."""
    if p.admin or matches(p.pub, topic):
        return None
    return f"{p} may not publish to topic {topic!r} (no role grants pub on it)"


def may_sub(p: Principal, topic: str) -> str | None:
    if p.admin or matches(p.sub, topic):
        return None
    return f"{p} may not subscribe to topic {topic!r} (no role grants sub on it)"


def may_group(p: Principal, group: str) -> str | None:
    if p.admin or matches(p.groups, group):
        return None
    return f"{p} may not use consumer group {group!r} (no role grants it in groups)"


def may_admin(p: Principal, what: str) -> str | None:
    if p.admin:
        return None
    return f"{p} may not {what}: it needs the admin role"
