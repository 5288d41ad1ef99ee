"""The query server's security, its Python side, without a JVM (issue 39 item 1): which users
the server gets (every cluster's verifiers, a name two clusters share kept once per cluster,
broken entries skipped and said), the warehouse admin made once and kept, its files private,
and who `tidelog sql` logs in as (first found wins; nothing found is one line naming what to
give, exit 2, before anything connects)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from broker.client.security import CredentialsError, write_credentials_file
from broker.security.scram import make_verifier, parse_verifier
from ops.cli.main import cli
from ops.security import cluster_security_dirs
from spark_jobs import sqlsecurity, sqlserver


def cluster(root, name, users, roles=None):
    """A cluster's state as deploy leaves it: users.yaml {user: (password, roles)}, roles.yaml
    (the built-in admin role, then `roles`); its security directory."""
    d = root / name / "security"
    d.mkdir(parents=True)
    (d / "users.yaml").write_text(yaml.safe_dump({u: {"password": pw, "roles": roles, "scram": make_verifier(pw)}
                                                  for u, (pw, roles) in users.items()}))
    (d / "roles.yaml").write_text(yaml.safe_dump({"admin": {"admin": True}, **(roles or {})}))
    return d


def test_every_clusters_users_are_imported_each_with_its_own_verifier(tmp_path):
    a = cluster(tmp_path, "a", {"imp-admin": ("pa", ["admin"]), "imp-app": ("pw", ["app"])}, {"app": {}})
    b = cluster(tmp_path, "b", {"imp-admin": ("pb", ["admin"])})
    c = cluster(tmp_path, "c", {})
    (c / "users.yaml").write_text(yaml.safe_dump(
        {"bad": {"roles": ["app"], "scram": "SCRAM-SHA-256$10:xx$yy:zz"}, "no/slash": {"scram": make_verifier("x")},
         sqlsecurity.ADMIN_USER: {"roles": ["admin"], "scram": make_verifier("x")}}))
    dirs = cluster_security_dirs([tmp_path, tmp_path / "a" / ".."])  # the same root twice: once
    assert [d.parent.name for d in dirs] == ["a", "b", "c"]
    warnings = []
    users = sqlsecurity.import_users(dirs, warnings)
    assert sorted(users) == ["imp-admin", "imp-app"]
    assert [(e["roles"], e["admin"], e["from"]) for e in users["imp-admin"]] == [(["admin"], True, str(a)),
                                                                                 (["admin"], True, str(b))]
    assert users["imp-app"][0]["roles"] == ["app"] and users["imp-app"][0]["admin"] is False
    assert "password" not in users["imp-app"][0]  # verifiers only: the server never holds a password
    assert len(warnings) == 3 and all(w.startswith(str(c)) and ": user " in w for w in warnings), warnings
    assert any("'bad' skipped: not a SCRAM verifier" in w for w in warnings)
    assert any(f"{sqlsecurity.ADMIN_USER!r} skipped: the name is the warehouse admin's" in w for w in warnings)


def test_admin_is_the_roles_admin_flag_never_a_roles_name(tmp_path):
    """A role named admin that a spec made plain grants no SQL admin; a role of another name
    with the admin flag does (the broker's own rule: broker/security/acl.py)."""
    cluster(tmp_path, "a", {"flag-ops": ("p1", ["ops"]), "flag-named": ("p2", ["admin"]), "flag-none": ("p3", ["gone"])},
            {"ops": {"admin": True}, "admin": {"admin": False}})
    users = sqlsecurity.import_users(cluster_security_dirs([tmp_path]), [])
    assert {n: [e["admin"] for e in es] for n, es in users.items()} == {
        "flag-ops": [True], "flag-named": [False], "flag-none": [False]}


def test_a_name_an_admin_and_a_plain_user_share_is_said(tmp_path):
    cluster(tmp_path, "a", {"shared-name": ("p1", ["admin"])})
    cluster(tmp_path, "b", {"shared-name": ("p2", ["app"])}, {"app": {}})
    warnings = []
    users = sqlsecurity.import_users(cluster_security_dirs([tmp_path]), warnings)
    assert [e["admin"] for e in users["shared-name"]] == [True, False]
    (w,) = warnings
    assert w.startswith("user 'shared-name' is an admin in ") and "it is no SQL admin" in w


def test_the_warehouse_admin_is_made_once_and_its_files_are_private(tmp_path):
    wh = tmp_path / "wh"
    sqlsecurity._private_dir(sqlsecurity.security_dir(wh))
    legacy = sqlsecurity.security_dir(wh) / sqlsecurity.LEGACY_ADMIN_CREDENTIALS  # an earlier build's `admin`
    write_credentials_file(legacy, "admin", "old", sqlsecurity.public_ca(wh))
    cluster(tmp_path / "states", "a", {"app": ("pw", ["app"])}, {"app": {}})
    path, warnings = sqlsecurity.write_users(wh, [tmp_path / "states"])
    first = sqlsecurity.ensure_admin(wh)
    path, _ = sqlsecurity.write_users(wh, [tmp_path / "states"])
    assert sqlsecurity.ensure_admin(wh).password == first.password and warnings == []
    assert first.username == "warehouse-admin" and len(first.password) >= 43 and not legacy.exists()
    users = yaml.safe_load(path.read_text())
    assert sorted(users) == ["app", "warehouse-admin"]
    assert [(e["admin"], e.get("service")) for e in users["warehouse-admin"]] == [(True, True)]
    assert users["app"][0].get("service") is None  # a cluster's user is never a service entry
    for f in (path, sqlsecurity.admin_credentials_file(wh)):
        assert stat.S_IMODE(f.stat().st_mode) == 0o600
    assert stat.S_IMODE(sqlsecurity.security_dir(wh).stat().st_mode) == 0o700


def test_a_security_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "security"
    d.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(d).st_uid + 1)
    with pytest.raises(sqlsecurity.SecurityError, match="belongs to uid .* remove it, or run the server as its owner"):
        sqlsecurity._private_dir(d)


def test_who_tidelog_sql_logs_in_as(tmp_path, monkeypatch):
    for v in ("TIDELOG_USERNAME", "TIDELOG_PASSWORD", "TIDELOG_CA_FILE", "TIDELOG_CREDENTIALS"):
        monkeypatch.delenv(v, raising=False)
    wh = tmp_path / "wh"
    ca = str(sqlsecurity.public_ca(wh))
    with pytest.raises(CredentialsError, match="needs a user: give --credentials FILE"):
        sqlsecurity.client_credentials(wh)
    admin = sqlsecurity.ensure_admin(wh)
    c = sqlsecurity.client_credentials(wh)
    assert (c.username, c.password, c.ca_file) == ("warehouse-admin", admin.password, ca)
    cluster_ca = tmp_path / "cluster-ca.crt"
    f = write_credentials_file(tmp_path / "app.credentials.yaml", "app", "pw", cluster_ca)
    monkeypatch.setenv("TIDELOG_CREDENTIALS", str(f))
    c = sqlsecurity.client_credentials(wh)
    assert (c.username, c.ca_file) == ("app", ca)  # the warehouse's CA, never the cluster's
    monkeypatch.setenv("TIDELOG_USERNAME", "bob")
    monkeypatch.setenv("TIDELOG_PASSWORD", "bobs")
    assert sqlsecurity.client_credentials(wh).username == "bob"
    g = write_credentials_file(tmp_path / "eve.credentials.yaml", "eve", "x", cluster_ca)
    assert sqlsecurity.client_credentials(wh, g).username == "eve"  # --credentials first
    monkeypatch.delenv("TIDELOG_PASSWORD")
    with pytest.raises(CredentialsError, match="user 'bob' has no password"):
        sqlsecurity.client_credentials(wh)


def test_tidelog_sql_with_no_credentials_is_one_line_before_connecting(tmp_path, monkeypatch):
    for v in ("TIDELOG_USERNAME", "TIDELOG_PASSWORD", "TIDELOG_CA_FILE", "TIDELOG_CREDENTIALS"):
        monkeypatch.delenv(v, raising=False)
    wh = tmp_path / "wh"
    (wh / "reconciled_log").mkdir(parents=True)
    (wh / "reconciled_log" / "_schema.ddl").write_text("`index` bigint\n")
    monkeypatch.setattr(sqlserver, "running", lambda w: {"host": "127.0.0.1", "port": 1, "pid": 1, "warehouse": str(w)})

    def no_query(*a, **k):
        raise AssertionError("connected without credentials")

    monkeypatch.setattr(sqlserver, "query", no_query)
    for extra in ((), ("--credentials", str(tmp_path / "missing.yaml"))):
        r = CliRunner().invoke(cli, ["sql", "--warehouse", str(wh), *extra, "SELECT 1"])
        assert r.exit_code == 2, r.output
        (line,) = r.stderr.splitlines()
        assert line.startswith("error: the query server of" if not extra else
                               f"error: cannot read the credentials file {tmp_path / 'missing.yaml'}")


def proves(password: str, verifier: str) -> bool:
    """Does `password` match the SCRAM verifier (RFC 5802's StoredKey)?"""
    import hashlib
    import hmac

    salt, stored, _, iterations = parse_verifier(verifier)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    return hashlib.sha256(hmac.new(salted, b"Client Key", hashlib.sha256).digest()).digest() == stored


def test_runtime_user_changes_reach_the_running_query_servers_users(tmp_path, monkeypatch):
    """`tidelog user set|delete` and `role set` on a cluster this controller deployed: once the
    cluster has the change (admin_call, faked here), the cluster's state here keeps it and the
    users file of every query server running here is written again (the server reads it at the
    next login: tests/unit/test_sql_users.py, and the real one in test_sql_server.py)."""
    import infra.spec
    import ops.cluster
    from ops.cli import acl_cmds

    states, bootstrap = tmp_path / "states", "127.0.0.1:19999"
    d = cluster(states, "prod", {"rt-stays": ("stays-pw", ["app"]), "rt-goes": ("goes-pw", ["app"])}, {"app": {}})
    write_credentials_file(d / "admin.credentials.yaml", "admin", "x", d / "ca.crt", bootstrap)
    monkeypatch.setattr(infra.spec, "STATE_ROOT", states)
    monkeypatch.setattr(ops.cluster, "DEFAULT_DIR", tmp_path / "no-cluster")
    monkeypatch.setenv("TIDELOG_CREDENTIALS", str(d / "admin.credentials.yaml"))  # -b's own lookup: nothing to do
    monkeypatch.setattr(sqlserver, "SERVERS_DIR", tmp_path / "servers")
    wh, elsewhere = (tmp_path / "wh").resolve(), (tmp_path / "stopped").resolve()
    for w in (wh, elsewhere):
        sqlsecurity._private_dir(sqlsecurity.security_dir(w))
        path, _ = sqlsecurity.write_users(w)  # as `serve` leaves it
        sqlserver._register(w)
    monkeypatch.setattr(sqlserver, "running", lambda w: {"pid": 1} if Path(w) == wh else None)
    sent = []
    monkeypatch.setattr(acl_cmds, "admin_call", lambda b, fn: sent.append(b))

    def users():
        return yaml.safe_load((sqlsecurity.security_dir(wh) / "users.yaml").read_text())

    assert sorted(users()) == ["rt-goes", "rt-stays", "warehouse-admin"]
    before = (sqlsecurity.security_dir(elsewhere) / "users.yaml").read_text()
    r = CliRunner().invoke(acl_cmds.user, ["set", "rt-late", "-r", "app", "--password-stdin", "-b", bootstrap],
                           input="late-password\n")
    assert r.exit_code == 0 and sent == [bootstrap], r.output
    (late,) = users()["rt-late"]
    assert late["roles"] == ["app"] and late["admin"] is False and proves("late-password", late["scram"])
    r = CliRunner().invoke(acl_cmds.user, ["delete", "rt-goes", "-b", bootstrap])
    assert r.exit_code == 0 and r.stderr == "", r.output
    assert sorted(users()) == ["rt-late", "rt-stays", "warehouse-admin"]
    r = CliRunner().invoke(acl_cmds.role, ["set", "app", "--admin", "-b", bootstrap])
    assert r.exit_code == 0, r.output
    assert [e["admin"] for e in users()["rt-late"]] == [True]
    # kept as the nodes keep it, so the next `serve` (or deploy) imports the same users
    assert set(json.loads((d / "acl.json").read_text())["users"]) == {"rt-late", "rt-goes"}
    assert stat.S_IMODE((d / "acl.json").stat().st_mode) == 0o600
    # a server that no longer runs is left alone, and taken off the list
    assert (sqlsecurity.security_dir(elsewhere) / "users.yaml").read_text() == before
    assert [w for w, _ in sqlserver.served_warehouses()] == [wh]
    # a refresh from a process with other state roots imports from the server's own
    monkeypatch.setattr(infra.spec, "STATE_ROOT", tmp_path / "other-states")
    assert [r["warehouse"] for r in sqlserver.refresh_users()] == [str(wh)]
    assert sorted(users()) == ["rt-late", "rt-stays", "warehouse-admin"]


def test_a_cluster_this_controller_has_no_state_for_is_said_when_a_server_runs(tmp_path, monkeypatch):
    import infra.spec
    import ops.cluster
    from ops.cli import acl_cmds

    monkeypatch.setattr(infra.spec, "STATE_ROOT", tmp_path / "none")
    monkeypatch.setattr(ops.cluster, "DEFAULT_DIR", tmp_path / "none")
    monkeypatch.setenv("TIDELOG_CREDENTIALS", str(tmp_path / "some.credentials.yaml"))
    monkeypatch.setattr(acl_cmds, "admin_call", lambda b, fn: None)
    monkeypatch.setattr(sqlserver, "served_warehouses", lambda: [(tmp_path / "wh", [])])
    r = CliRunner().invoke(acl_cmds.user, ["delete", "someone", "-b", "127.0.0.1:19998"])
    assert r.exit_code == 0 and r.stderr.splitlines() == [
        "note: this controller has no state for the cluster at 127.0.0.1:19998: the SQL query servers running "
        "here do not import its users"], r.output


def test_deploy_keeps_the_roles_and_tells_the_running_servers(tmp_path, monkeypatch):
    """deploy (ClusterSecurity.ensure) writes roles.yaml beside users.yaml, so the import knows
    which roles are admin; a deploy that changed the users has the running servers import again."""
    from infra import spec as specs
    from ops.security import ClusterSecurity

    spec = specs.from_dict({
        "name": "dep", "provider": "local", "state_dir": str(tmp_path / "state"),
        "install_dir": str(tmp_path / "hosts"), "network": {"subnet": "127.0.79.0/24"}, "hosts": [{"name": "h1"}],
        "groups": [{"name": "g0", "mode": "standalone", "hosts": ["h1"]}],
        "security": {"users": [{"name": "dep-ops", "roles": ["ops"]}, {"name": "dep-app", "roles": ["app"]}],
                     "roles": {"ops": {"admin": True}, "app": {"sub": ["*"]}}}})
    refreshed = []
    monkeypatch.setattr(sqlserver, "refresh_users", lambda: refreshed.append(1) or [])
    sec = ClusterSecurity(spec)
    sec.ensure()
    assert refreshed == [1] and stat.S_IMODE(sec.roles_file.stat().st_mode) == 0o600
    sec.ensure()
    assert refreshed == [1]  # nothing changed, nothing to import
    users = sqlsecurity.import_users([sec.dir], [])
    assert {n: [e["admin"] for e in es] for n, es in users.items()} == {
        "admin": [True], "dep-ops": [True], "dep-app": [False]}
