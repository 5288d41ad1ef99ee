"""The Guard's edges found in review (issue 14): a password changed during an exchange, a
malformed AUTH body, the made-up salt of unknown users, ACL changes that fail to save."""

from __future__ import annotations

import re

import pytest

from broker.acl_store import AclStore
from broker.config import BrokerConfig, RoleEntry, UserEntry
from broker.protocol import frame as fr
from broker.protocol import jsonbody
from broker.protocol.auth import Auth, AuthStep
from broker.protocol.codes import Code, Req
from broker.security.guard import AuthState, Guard
from broker.security.scram import ClientExchange, make_verifier

OLD, NEW = "old-password", "new-password"


class Conn:
    """What the Guard touches on a connection; answers are kept as (code, body, error)."""

    def __init__(self):
        self.auth = AuthState()
        self.principal = None
        self.member = None
        self.peer = "10.0.0.9:4242"
        self.answers = []
        self.closed = False

    def respond(self, f, code, body=b"", error=None, headers=None):
        self.answers.append((code, body, error))

    def close(self):
        self.closed = True


def guard(tmp_path, verifier: str, tls: bool = True) -> tuple[Guard, AclStore]:
    extra = {"tls": {"ca_file": "/x/ca", "cert_file": "/x/c", "key_file": "/x/k"}} if tls else {"insecure": True}
    cfg = BrokerConfig(data_dir=tmp_path, users=[{"name": "alice", "roles": ["admin"], "scram": verifier}], **extra)
    store = AclStore(tmp_path / "config" / "acl.json")
    return Guard(cfg, store=store), store


def auth_frame(message: str) -> fr.Frame:
    body = jsonbody.encode(Auth(message))
    return fr.Frame(fr.PROTOCOL_VERSION, 0, Req.AUTH, 1, {}, memoryview(body))


def step(g: Guard, conn: Conn, message: str) -> tuple[int, AuthStep | None]:
    g.gate(conn, auth_frame(message))
    code, body, _ = conn.answers[-1]
    return code, jsonbody.decode(AuthStep, body) if code == Code.SUCCESS else None


def test_a_password_changed_during_an_exchange_does_not_let_the_old_one_in(tmp_path):
    g, store = guard(tmp_path, make_verifier(OLD))
    conn = Conn()
    g.on_connect(conn, None)
    client = ClientExchange("alice", OLD)
    code, first = step(g, conn, client.first())
    assert code == Code.SUCCESS
    store.apply({"op": "set_user", "name": "alice", "roles": ["admin"], "scram": make_verifier(NEW)})
    code, _ = step(g, conn, client.step(first.message))  # the proof against the old verifier
    assert code == Code.AUTH_FAILED and conn.principal is None


def test_the_new_password_works_after_the_change(tmp_path):
    g, store = guard(tmp_path, make_verifier(OLD))
    store.apply({"op": "set_user", "name": "alice", "roles": ["admin"], "scram": make_verifier(NEW)})
    conn = Conn()
    g.on_connect(conn, None)
    client = ClientExchange("alice", NEW)
    _, first = step(g, conn, client.first())
    code, final = step(g, conn, client.step(first.message))
    client.finish(final.message)
    assert code == Code.SUCCESS and conn.principal.name == "alice"


def test_a_malformed_auth_body_is_bad_request_not_an_exception(tmp_path):
    g, _ = guard(tmp_path, make_verifier(OLD))
    conn = Conn()
    g.on_connect(conn, None)
    for _ in range(3):
        assert g.gate(conn, fr.Frame(fr.PROTOCOL_VERSION, 0, Req.AUTH, 1, {}, memoryview(b"x"))) is True
    assert [a[0] for a in conn.answers] == [Code.BAD_REQUEST] * 3 and conn.closed  # three strikes


def test_requests_before_authenticating_count_as_failures(tmp_path):
    g, _ = guard(tmp_path, make_verifier(OLD))
    conn = Conn()
    g.on_connect(conn, None)
    pull = fr.Frame(fr.PROTOCOL_VERSION, 0, Req.PULL, 1, {}, memoryview(b""))
    for _ in range(3):
        assert g.gate(conn, pull) is True
    assert [a[0] for a in conn.answers] == [Code.AUTH_FAILED] * 3 and conn.closed


def salt_of(g: Guard, user: str) -> str:
    conn = Conn()
    g.on_connect(conn, None)
    _, first = step(g, conn, ClientExchange(user, "whatever").first())
    return re.search(r",s=([^,]+),", first.message).group(1)


def test_an_unknown_users_salt_is_the_same_on_every_member_and_across_restarts(tmp_path):
    v = make_verifier(OLD)
    n1, _ = guard(tmp_path / "n1", v)
    n2, _ = guard(tmp_path / "n2", v)  # another member (or this one restarted): same users
    assert salt_of(n1, "mallory") == salt_of(n2, "mallory")  # nothing tells mallory from a user
    assert salt_of(n1, "mallory") != salt_of(n1, "trudy")


def test_an_acl_change_that_cannot_be_saved_is_not_applied_and_a_retry_applies_it(tmp_path):
    g, store = guard(tmp_path, make_verifier(OLD))
    store.path.parent.mkdir(parents=True, exist_ok=True)
    store.path.mkdir()  # acl.json is a directory: the save fails (as on EIO or a full disk)
    change = {"op": "delete_user", "name": "alice"}
    with pytest.raises(OSError):
        store.apply(change)
    assert "alice" in g.verifiers  # not saved, not applied
    store.path.rmdir()
    store.apply(change)  # the retry is not mistaken for a replay
    assert "alice" not in g.verifiers and store.path.exists()
