"""ACL_UPDATE (admin only): list, set or delete one user or one role at runtime (issue 14).

Request body (JSON):

    {"action": "list"}
    {"action": "set_user", "name": "late", "roles": ["rw"], "scram": "SCRAM-SHA-256$4096:..."}
    {"action": "delete_user", "name": "late"}
    {"action": "set_role", "name": "rw", "admin": false, "pub": ["orders"], "sub": ["orders"], "groups": []}
    {"action": "delete_role", "name": "rw"}

The client computes `scram` with broker.security.scram.make_verifier: the password never
travels. A change is answered once committed (raft: a quorum holds it) with the same body as
"list": the effective users (name, roles, source "config" | "runtime" -- never a verifier)
and roles (admin, pub, sub, groups, source).

`SyncedMetadata` is GET_METADATA's answer with the master's acl.json overlay added (a
master-slave slave copies it with the topic configs; a slave of an older version ignores it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal, Optional

from annotated_types import Len

from broker.protocol.ha import Metadata

NAME_RE = r"^[A-Za-z0-9_.@-]{1,64}$"  # as broker.config.UserEntry.name
PATTERNS_MAX = 256  # topic / group patterns in one role
PATTERN_BYTES_MAX = 255

Patterns = Annotated[tuple[str, ...], Len(max_length=PATTERNS_MAX)]


@dataclass(frozen=True)
class AclUpdate:
    action: Literal["list", "set_user", "delete_user", "set_role", "delete_role"]
    name: str = ""
    roles: Annotated[tuple[str, ...], Len(max_length=64)] = ()  # set_user
    scram: str = ""  # set_user: the SCRAM verifier
    scram512: str = ""  # set_user: the same password's SCRAM-SHA-512 verifier (Kafka clients; optional)
    admin: bool = False  # set_role
    pub: Patterns = ()
    sub: Patterns = ()
    groups: Patterns = ()


@dataclass(frozen=True)
class SyncedMetadata(Metadata):
    acl: Optional[dict] = None  # acl.json's content (broker/acl_store.py state())
