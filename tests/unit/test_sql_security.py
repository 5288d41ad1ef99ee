"""The query server's security, its Python side, without a JVM (issue 39 item 1): which users
the server gets (every cluster's verifiers, a name two clusters share kept once per cluster,
broken entries skipped and said), the warehouse admin made once and kept, its files private,
and who `tidelog sql` logs in as (first found wins; nothing found is one line naming what to
give, exit 2, before anything connects)."""

from __future__ import annotations

import os
import stat

import pytest
import yaml
from click.testing import CliRunner

from broker.client.security import CredentialsError, write_credentials_file
from broker.security.scram import make_verifier
from ops.cli.main import cli
from spark_jobs import sqlsecurity, sqlserver


def cluster(root, name, users):
    d = root / name / "security"
    d.mkdir(parents=True)
    f = d / "users.yaml"
    f.write_text(yaml.safe_dump({u: {"password": pw, "roles": roles, "scram": make_verifier(pw)}
                                 for u, (pw, roles) in users.items()}))
    return f


def test_every_clusters_users_are_imported_each_with_its_own_verifier(tmp_path):
    a = cluster(tmp_path, "a", {"admin": ("pa", ["admin"]), "app": ("pw", ["app"])})
    b = cluster(tmp_path, "b", {"admin": ("pb", ["admin"])})
    (tmp_path / "c" / "security").mkdir(parents=True)
    (tmp_path / "c" / "security" / "users.yaml").write_text(yaml.safe_dump(
        {"bad": {"roles": ["app"], "scram": "SCRAM-SHA-256$10:xx$yy:zz"}, "no/slash": {"scram": make_verifier("x")}}))
    files = sqlsecurity.cluster_user_files([tmp_path, tmp_path / "a" / ".."])  # the same root twice: once
    assert [f.parent.parent.name for f in files] == ["a", "b", "c"]
    warnings = []
    users = sqlsecurity.import_users(files, warnings)
    assert sorted(users) == ["admin", "app"]
    assert [(e["roles"], e["from"]) for e in users["admin"]] == [(["admin"], str(a)), (["admin"], str(b))]
    assert users["app"][0]["roles"] == ["app"]
    assert "password" not in users["app"][0]  # verifiers only: the server never holds a password
    assert len(warnings) == 2 and all("c/security/users.yaml: user" in w for w in warnings)
    assert any("'bad' skipped: not a SCRAM verifier" in w for w in warnings)


def test_the_warehouse_admin_is_made_once_and_its_files_are_private(tmp_path):
    wh = tmp_path / "wh"
    sqlsecurity._private_dir(sqlsecurity.security_dir(wh))
    cluster(tmp_path / "states", "a", {"app": ("pw", ["app"])})
    path, warnings = sqlsecurity.write_users(wh, [tmp_path / "states"])
    first = sqlsecurity.ensure_admin(wh)
    path, _ = sqlsecurity.write_users(wh, [tmp_path / "states"])
    assert sqlsecurity.ensure_admin(wh).password == first.password and warnings == []
    users = yaml.safe_load(path.read_text())
    assert sorted(users) == ["admin", "app"] and users["admin"][0]["roles"] == ["admin"]
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
    assert (c.username, c.password, c.ca_file) == ("admin", admin.password, ca)
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
