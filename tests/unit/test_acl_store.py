"""Runtime users and roles (broker/acl_store.py, issue 14): the config is the base, acl.json's
changes overlay it (a runtime set wins, a runtime delete removes a config user), persisted
0600 and atomically, pushed into the Guard; the Guard re-resolves open user connections."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import pytest

from broker.acl_store import AclError, AclStore, shared
from broker.config import BrokerConfig, RoleEntry, UserEntry
from broker.protocol import acl as aclp
from broker.protocol.codes import BadRequest, Req
from broker.processors.admin import acl_change
from broker.security.guard import ADMIN_ONLY, AuthState, Guard
from broker.security.scram import make_verifier
from broker.system import ACL_TOPIC, SystemEntries, acl_entry

V1 = make_verifier("one-password")
V2 = make_verifier("two-password")
BASE_USERS = (UserEntry(name="admin", roles=("admin",), scram=V1), UserEntry(name="app", roles=("app",), scram=V1))
BASE_ROLES = {"admin": RoleEntry(admin=True), "app": RoleEntry(pub=("orders",), sub=("orders",))}


def store(tmp_path, seen=None) -> AclStore:
    s = AclStore(tmp_path / "config" / "acl.json")
    s.bind(BASE_USERS, BASE_ROLES, (lambda u, r: seen.append((u, r))) if seen is not None else None)
    return s


def names(users) -> list[str]:
    return sorted(u.name for u in users)


def test_without_changes_the_config_is_the_acl(tmp_path):
    users, roles = store(tmp_path).effective()
    assert names(users) == ["admin", "app"] and set(roles) == {"admin", "app"}
    assert not (tmp_path / "config" / "acl.json").exists()


def test_a_runtime_set_wins_over_the_config_entry_and_a_delete_removes_a_config_user(tmp_path):
    seen = []
    s = store(tmp_path, seen)
    s.apply({"op": "set_role", "name": "rw", "admin": False, "pub": ["orders"], "sub": ["orders"], "groups": []})
    s.apply({"op": "set_user", "name": "app", "roles": ["rw"], "scram": V2})  # same name as a config user
    s.apply({"op": "set_user", "name": "late", "roles": ["rw"], "scram": V1})
    s.apply({"op": "delete_user", "name": "admin"})  # a config user
    users, roles = s.effective()
    by = {u.name: u for u in users}
    assert sorted(by) == ["app", "late"]
    assert by["app"].roles == ("rw",) and by["app"].scram == V2
    assert roles["rw"].pub == ("orders",)
    assert seen[-1] == s.effective()  # the listener (the Guard) heard every change
    # the view never shows a verifier, and says where each entry comes from
    view = s.view()
    assert "SCRAM" not in json.dumps(view)
    assert {u["name"]: u["source"] for u in view["users"]} == {"app": "runtime", "late": "runtime"}
    assert view["roles"]["app"]["source"] == "config" and view["roles"]["rw"]["source"] == "runtime"


def test_changes_persist_0600_and_overlay_the_config_at_the_next_start(tmp_path):
    s = store(tmp_path)
    s.apply({"op": "set_user", "name": "late", "roles": ["app"], "scram": V1})
    s.apply({"op": "delete_user", "name": "admin"})
    s.apply({"op": "delete_role", "name": "admin"})
    path = tmp_path / "config" / "acl.json"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert not path.with_name("acl.json.tmp").exists()
    data = json.loads(path.read_text())
    assert data["users"]["admin"] is None and data["users"]["late"]["scram"] == V1  # a tombstone
    again = store(tmp_path)  # a restart: the same config, acl.json read back
    users, roles = again.effective()
    assert names(users) == ["app", "late"] and "admin" not in roles
    # a runtime set after a runtime delete brings the user back
    again.apply({"op": "set_user", "name": "admin", "roles": ["app"], "scram": V2})
    assert "admin" in names(store(tmp_path).effective()[0])


def test_a_replayed_change_does_not_rewrite_the_file(tmp_path):
    seen = []
    s = store(tmp_path, seen)
    change = {"op": "set_user", "name": "late", "roles": ["app"], "scram": V1}
    s.apply(change)
    n, mtime = len(seen), os.stat(s.path).st_mtime_ns
    s.apply(change)
    assert len(seen) == n and os.stat(s.path).st_mtime_ns == mtime


def test_a_damaged_file_is_named(tmp_path):
    path = tmp_path / "config" / "acl.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"users": {"x": {"roles": []}}, "roles": {}}')  # no scram
    with pytest.raises(AclError, match="acl.json is damaged"):
        AclStore(path)


def test_replace_is_a_slaves_copy_of_the_masters_overlay(tmp_path):
    master = store(tmp_path / "m")
    master.apply({"op": "set_user", "name": "late", "roles": ["app"], "scram": V1})
    master.apply({"op": "delete_user", "name": "app"})
    slave = store(tmp_path / "s")
    slave.replace(master.state())
    assert names(slave.effective()[0]) == ["admin", "late"]
    assert json.loads(slave.path.read_text())["users"] == master.state()["users"]


def test_system_entries_apply_acl_entries_to_the_shared_store(tmp_path):
    topics = SimpleNamespace(path=tmp_path / "config" / "topics.json")
    s = shared(tmp_path / "config" / "acl.json")
    s.bind(BASE_USERS, BASE_ROLES, None)
    system = SystemEntries(topics, None)
    assert system.acl is s
    system.apply(*acl_entry({"op": "delete_user", "name": "app"}))
    system.apply(ACL_TOPIC, b"{not json")  # logged and ignored
    assert names(s.effective()[0]) == ["admin"]


def test_requests_are_validated_where_they_are_made():
    users, roles = BASE_USERS, BASE_ROLES
    with pytest.raises(BadRequest, match=r"^no role nope in this cluster \(roles: admin, app\): create it first "
                                         r"\(tidelog role set nope \.\.\.\)$"):
        acl_change(aclp.AclUpdate("set_user", "late", roles=("nope",), scram=V1), users, roles)
    with pytest.raises(BadRequest, match="scram"):
        acl_change(aclp.AclUpdate("set_user", "late", roles=("app",), scram="password"), users, roles)
    with pytest.raises(BadRequest, match="name"):
        acl_change(aclp.AclUpdate("delete_user", "bad name"), users, roles)
    with pytest.raises(BadRequest, match="held by users"):
        acl_change(aclp.AclUpdate("delete_role", "app"), users, roles)
    assert acl_change(aclp.AclUpdate("delete_user", "app"), users, roles) == {"op": "delete_user", "name": "app"}
    assert Req.ACL_UPDATE in ADMIN_ONLY


class Conn:
    def __init__(self):
        self.auth = AuthState()
        self.principal = None
        self.peer = "test"


def test_the_guard_re_resolves_open_connections_and_logs_out_deleted_users(tmp_path):
    cfg = BrokerConfig(data_dir=tmp_path, insecure=True, users=[u.model_dump() for u in BASE_USERS],
                       roles={k: v.model_dump() for k, v in BASE_ROLES.items()})
    s = AclStore(tmp_path / "config" / "acl.json")
    g = Guard(cfg, store=s)
    conns = {}
    for name in ("admin", "app"):  # as if each had authenticated (Guard._auth's bookkeeping)
        c = conns[name] = Conn()
        c.principal = g.acl.principal(name)
        c.auth.user, c.auth.verifier = name, g.verifiers[name]
        g._sessions.add(c)
    assert conns["app"].principal.pub == ("orders",)
    s.apply({"op": "set_role", "name": "app", "admin": False, "pub": ["other"], "sub": [], "groups": []})
    assert conns["app"].principal.pub == ("other",)  # new rights without a new login
    s.apply({"op": "delete_user", "name": "app"})
    assert conns["app"].principal is None  # logged out: its next request is AUTH_FAILED
    assert "app" not in g.verifiers
    s.apply({"op": "set_user", "name": "admin", "roles": ["admin"], "scram": V2})  # a new password
    assert conns["admin"].principal is None
