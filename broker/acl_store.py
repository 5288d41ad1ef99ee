"""Users and roles changed at runtime (ACL_UPDATE, issue 14), persisted in
`<data_dir>/config/acl.json` and pushed into the broker's Guard.

The broker config's `users` and `roles` are the base; the runtime changes are an overlay kept
apart from it, so a config edit and a runtime change never overwrite each other silently:

    effective users = config users, then every runtime change by name: a runtime set wins over
                      the config's entry of that name, a runtime delete removes it
    effective roles = likewise

acl.json holds only the overlay (a deleted name is kept as null: a tombstone, so the delete
survives a restart with the config still naming that user):

    {"version": 1,
     "users": {"late": {"roles": ["rw"], "scram": "SCRAM-SHA-256$4096:..."}, "gone": null},
     "roles": {"rw": {"admin": false, "pub": ["orders"], "sub": ["orders"], "groups": []}}}

It holds SCRAM verifiers (never passwords) and is written 0600, atomically (tmp, fsync,
rename, fsync of the directory), like topics.json.

A change reaches the store as a committed %ACL% system entry (broker/system.py) on every
member: raft through the log, standalone and a master-slave master where it is made; slaves
copy the whole overlay with the metadata sync (`replace`). `apply` never refuses a change --
the request was validated where it was made (broker/processors/admin.py) and every member
must reach the same state -- it only skips what it cannot read, logged.

The Guard and the SystemEntries of one broker are built separately from what they already
get (the config, the topic manager); `shared(path)` gives both the same store for one data
directory (held weakly: it lives as long as its broker).
"""

from __future__ import annotations

import json
import logging
import os
import weakref
from pathlib import Path
from typing import Callable

from broker.config import RoleEntry, UserEntry
from broker.store.files import write_atomic

log = logging.getLogger(__name__)

ACL_FILE = "acl.json"
VERSION = 1

Listener = Callable[[tuple, dict], None]  # listener(users: tuple[UserEntry], roles: {name: RoleEntry})


class AclError(ValueError):
    pass


def _check(users: dict, roles: dict) -> None:
    """Every entry of an overlay is well formed (a None is a delete)."""
    for n, u in users.items():
        if u is not None:
            _user(n, u)
    for r in roles.values():
        if r is not None:
            _role(r)


def _user(name: str, d: dict) -> UserEntry:
    return UserEntry(name=name, roles=tuple(d.get("roles") or ()), scram=d["scram"], scram512=d.get("scram512"))


def _role(d: dict) -> RoleEntry:
    return RoleEntry(admin=bool(d.get("admin", False)), pub=tuple(d.get("pub") or ()),
                     sub=tuple(d.get("sub") or ()), groups=tuple(d.get("groups") or ()))


class AclStore:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.users: dict[str, dict | None] = {}  # the overlay: name -> {"roles", "scram"} or None (deleted)
        self.roles: dict[str, dict | None] = {}  # name -> {"admin", "pub", "sub", "groups"} or None
        self.base_users: tuple = ()
        self.base_roles: dict = {}
        self._listener: Listener | None = None
        self.load()

    # --- the broker's side -----------------------------------------------------------------------

    def bind(self, base_users, base_roles: dict, listener: Listener | None) -> None:
        """Set the config's users and roles (the base) and who hears of every change (the
        Guard); the listener is called now with the effective users and roles."""
        self.base_users = tuple(base_users)
        self.base_roles = dict(base_roles)
        self._listener = listener
        self._notify()

    def load(self) -> None:
        if not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text())
            users, roles = dict(data["users"]), dict(data["roles"])
            _check(users, roles)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise AclError(f"{self.path} is damaged ({e}); restore it, or remove it to start with the "
                           "config's users and roles only (runtime user changes are then lost)") from None
        self.users, self.roles = users, roles

    def state(self) -> dict:
        """acl.json's content: the overlay (what a slave copies)."""
        return {"version": VERSION, "users": dict(self.users), "roles": dict(self.roles)}

    # --- changes -----------------------------------------------------------------------------------

    def apply(self, change: dict) -> None:
        """One committed change: {"op": "set_user", "name", "roles", "scram"} | {"op":
        "delete_user", "name"} | {"op": "set_role", "name", "admin", "pub", "sub", "groups"} |
        {"op": "delete_role", "name"}."""
        op, name = change["op"], change["name"]
        if op == "set_user":
            value = {"roles": list(change.get("roles") or ()), "scram": change["scram"]}
            if change.get("scram512"):
                value["scram512"] = change["scram512"]
            _user(name, value)
            table = self.users
        elif op == "delete_user":
            value, table = None, self.users
        elif op == "set_role":
            value = {k: change.get(k, False if k == "admin" else []) for k in ("admin", "pub", "sub", "groups")}
            value = {"admin": bool(value["admin"]), **{k: list(value[k]) for k in ("pub", "sub", "groups")}}
            _role(value)
            table = self.roles
        elif op == "delete_role":
            value, table = None, self.roles
        else:
            raise AclError(f"unknown ACL change {op!r}")
        if name in table and table[name] == value:
            return  # a replay (raft re-dispatch after a restart): nothing new
        had, old = name in table, table.get(name)
        table[name] = value
        try:
            self.save()
        except OSError:  # not saved: not applied either, so a retry does it (not a "replay")
            if had:
                table[name] = old
            else:
                del table[name]
            raise
        log.info("ACL: %s %r", op.replace("_", " "), name)
        self._notify()

    def replace(self, state: dict) -> None:
        """A slave's copy of its master's overlay (metadata sync)."""
        users, roles = dict(state.get("users") or {}), dict(state.get("roles") or {})
        if users == self.users and roles == self.roles:
            return
        _check(users, roles)
        old = self.users, self.roles
        self.users, self.roles = users, roles
        try:
            self.save()
        except OSError:
            self.users, self.roles = old  # the next sync tries again
            raise
        log.info("ACL: copied the master's runtime users and roles (%d users, %d roles changed)",
                 len(users), len(roles))
        self._notify()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps(self.state(), indent=1, sort_keys=True).encode()
        write_atomic(self.path, data, 0o600)  # verifiers: owner only

    # --- the effective view --------------------------------------------------------------------

    def effective(self) -> tuple[tuple, dict]:
        """(users, roles): the config's, overlaid with the runtime changes."""
        users = {u.name: u for u in self.base_users}
        for name, u in self.users.items():
            if u is None:
                users.pop(name, None)
            else:
                users[name] = _user(name, u)
        roles = dict(self.base_roles)
        for name, r in self.roles.items():
            if r is None:
                roles.pop(name, None)
            else:
                roles[name] = _role(r)
        return tuple(users.values()), roles

    def view(self) -> dict:
        """Users with their roles (never verifiers) and roles, for `tidelog user list`."""
        users, roles = self.effective()
        return {"users": [{"name": u.name, "roles": list(u.roles),
                           "source": "runtime" if u.name in self.users else "config"}
                          for u in sorted(users, key=lambda u: u.name)],
                "roles": {n: {"admin": r.admin, "pub": list(r.pub), "sub": list(r.sub),
                              "groups": list(r.groups), "source": "runtime" if n in self.roles else "config"}
                          for n, r in sorted(roles.items())}}

    def _notify(self) -> None:
        if self._listener is not None:
            self._listener(*self.effective())


_SHARED: "weakref.WeakValueDictionary[str, AclStore]" = weakref.WeakValueDictionary()


def shared(path: Path) -> AclStore:
    """The one store of the data directory `path` is in (see the module docstring)."""
    key = os.path.abspath(path)
    store = _SHARED.get(key)
    if store is None:
        store = AclStore(Path(key))
        _SHARED[key] = store
    return store
