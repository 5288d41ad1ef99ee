"""Issue 14 acceptance, on a real broker process with security on (TLS from a test CA, SCRAM
users, roles): authentication, authorization, TLS trust on both sides, and where a client
takes its credentials from. Users (tests/secure.py): admin [admin]; app [pub orders, sub
orders, group billing]; reader [sub orders, group billing]."""

from __future__ import annotations

import os
import socket
import ssl
import time

import pytest

from broker.client import (Admin, AuthenticationError, BrokerError, Consumer, PermissionDenied, Producer,
                           SendError)
from broker.protocol import frame as fr
from broker.protocol.codes import Code, Req
from broker.security.tls import client_context
from tests.helpers import run_tidelog
from tests.secure import wait_log, PASSWORDS, Pki, log_text, standalone, tls_socket

pytestmark = pytest.mark.slow

BOUNDED = {"send_timeout_ms": 3000, "retry_times_when_send_failed": 0, "failover_timeout_ms": 2000}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("secure")
    pki = Pki(root)
    b = standalone(pki, root / "broker")
    b.start()
    with Admin([b.address], **pki.client("admin")) as a:
        a.create_topic("orders", 2)
        a.create_topic("secret", 2)
    yield pki, b
    b.stop()


def round_trip(pki, b, topic="orders", user="admin") -> None:
    """The broker still serves: a send and its read back, as `user`."""
    body = b"alive-%d" % time.monotonic_ns()
    with Producer([b.address], **pki.client(user), **BOUNDED) as p:
        r = p.send(topic, body)
    with Admin([b.address], **pki.client("admin")) as a:
        m = a.query_by_id(r.msg_id)
    assert m is not None and m.body == body


# --- authentication --------------------------------------------------------------------------

def test_no_credentials_is_answered_auth_failed(env):
    pki, b = env
    with Producer([b.address], **pki.client(None), **BOUNDED) as p:  # TLS with the CA, no user
        with pytest.raises(AuthenticationError) as ei:
            p.send("orders", b"x")
    e = ei.value
    assert e.code == Code.AUTH_FAILED and e.stored is False, e
    assert "AUTH_FAILED" in str(e) and "authenticate first" in str(e), e
    with Admin([b.address], **pki.client(None)) as a:  # any request, not only sends
        with pytest.raises(AuthenticationError, match="authenticate first"):
            a.list_topics()


def test_wrong_password_and_unknown_user_get_the_same_answer(env):
    pki, b = env
    with Producer([b.address], **pki.client("app", "not-the-password"), **BOUNDED) as p:
        with pytest.raises(AuthenticationError) as wrong:
            p.send("orders", b"x")
    assert wrong.value.stored is False and wrong.value.code == Code.AUTH_FAILED
    assert "'app'" in str(wrong.value) and "unknown user or wrong password" in str(wrong.value)
    assert "authentication failed for user 'app': unknown user or wrong password" in log_text(b)
    with Producer([b.address], **pki.client("nobody", "whatever"), **BOUNDED) as p:
        with pytest.raises(AuthenticationError) as unknown:
            p.send("orders", b"x")
    assert "'nobody'" in str(unknown.value)
    # the broker's words are the same: they do not tell whether the user exists
    why = lambda e: str(e).rsplit(": ", 1)[1]  # noqa: E731
    assert why(wrong.value) == why(unknown.value) == "unknown user or wrong password"
    with Admin([b.address], **pki.client("app", "bad")) as a:
        with pytest.raises(AuthenticationError, match="refused user 'app'"):
            a.status()


def test_plain_tcp_to_the_secure_port_fails_and_the_broker_keeps_serving(env):
    pki, b = env
    s = socket.create_connection(("127.0.0.1", b.port), timeout=5)
    try:
        s.sendall(fr.encode(Req.STATUS, 1, b"{}"))
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except (ConnectionResetError, socket.timeout):
            pass
        # no frame comes back: what the broker sent, if anything, is a TLS alert, not a frame
        assert len(got) < fr.HEADER_SIZE or int.from_bytes(got[4:6], "big") != fr.MAGIC, got[:32]
    finally:
        s.close()
    # and the client says so (no CA given: it speaks plain TCP)
    with Producer([b.address], **BOUNDED) as p:
        with pytest.raises(SendError) as ei:
            p.send("orders", b"plain")
    assert ei.value.stored is not True
    assert "speaks TLS only" in str(ei.value) and "ca_file" in str(ei.value), ei.value
    round_trip(pki, b)


# --- authorization ---------------------------------------------------------------------------

def test_pub_permissions(env):
    pki, b = env
    with Producer([b.address], **pki.client("app"), **BOUNDED) as p:
        r = p.send("orders", b"order-1")
        with pytest.raises(SendError) as ei:
            p.send("secret", b"leak")
    e = ei.value
    assert e.code == Code.NO_PERMISSION and e.stored is False, e
    assert "'app'" in str(e) and "'secret'" in str(e) and "publish" in str(e), e
    with Producer([b.address], **pki.client("reader"), **BOUNDED) as p:
        with pytest.raises(SendError) as ei:
            p.send("orders", b"not mine to write")
    assert ei.value.code == Code.NO_PERMISSION and ei.value.stored is False
    assert "'reader'" in str(ei.value) and "'orders'" in str(ei.value)
    with pytest.raises(SendError) as ei:  # a batch is checked the same way
        with Producer([b.address], **pki.client("reader"), **BOUNDED) as p:
            p.send_batch("orders", [b"a", b"b"])
    assert ei.value.code == Code.NO_PERMISSION and ei.value.stored is False
    # app reads back what it wrote
    with Consumer([b.address], "billing", "orders", auto_commit=False, **pki.client("app")) as c:
        got = []
        deadline = time.monotonic() + 10
        while r.msg_id not in {m.msg_id for m in got} and time.monotonic() < deadline:
            got += c.poll(timeout_ms=300)
    assert r.msg_id in {m.msg_id for m in got}
    # nothing refused was stored
    with Admin([b.address], **pki.client("admin")) as a:
        assert a.query_by_key("secret", "x") == []
        st = a.describe_topic("secret")
        assert all(q.max_offset == 0 for q in st.queues), st


def test_sub_and_group_permissions(env):
    pki, b = env
    with Producer([b.address], **pki.client("app"), **BOUNDED) as p:
        r = p.send("orders", b"for-reader")
    with Consumer([b.address], "billing", "orders", auto_commit=True, **pki.client("reader")) as c:
        got = []
        deadline = time.monotonic() + 10
        while r.msg_id not in {m.msg_id for m in got} and time.monotonic() < deadline:
            got += c.poll(timeout_ms=300)
        assert r.msg_id in {m.msg_id for m in got}
        c.commit()  # its group's offsets too
    with Consumer([b.address], "other", "orders", **pki.client("reader")) as c:
        with pytest.raises(BrokerError) as ei:
            c.poll(timeout_ms=500)
    assert ei.value.code == Code.NO_PERMISSION, ei.value
    assert "'reader'" in str(ei.value) and "'other'" in str(ei.value)


def test_subscribing_to_a_topic_without_sub_raises_from_poll(env):
    pki, b = env
    with Consumer([b.address], "billing", "secret", **pki.client("reader")) as c:
        with pytest.raises(BrokerError) as ei:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                c.poll(timeout_ms=300)
    assert ei.value.code == Code.NO_PERMISSION and "'secret'" in str(ei.value), ei.value


def test_consume_refused_by_the_acl_prints_one_error(env):
    """`tidelog consume` as a user the ACL refuses: the one error line, exit 1. Refused at the
    join (no right on the group), the consumer never joined, so it does not try to leave (that
    try was refused too, and printed a warning before the error); refused at the pull (no sub
    on the topic), it joined and leaves cleanly."""
    pki, b = env
    reader = {"TIDELOG_USERNAME": "reader", "TIDELOG_PASSWORD": PASSWORDS["reader"], "TIDELOG_CA_FILE": pki.ca_file,
              "TIDELOG_CREDENTIALS": ""}
    for topic, group, refused in (("orders", "other", "'other'"), ("secret", "billing", "'secret'")):
        p = run_tidelog("consume", "-b", b.address, "-t", topic, "-g", group, "--idle-timeout-s", "3", "--json",
                        check=False, env=reader)
        lines = p.stderr.splitlines()
        assert p.returncode == 1 and len(lines) == 1, p.stderr
        assert lines[0].startswith("error: NO_PERMISSION: ") and refused in lines[0], p.stderr
        assert p.stdout == ""


def test_admin_operations_need_the_admin_role(env):
    pki, b = env
    with Admin([b.address], **pki.client("app")) as a:
        for op in (lambda: a.create_topic("app-made", 1), lambda: a.transfer_leader("n1"),
                   lambda: a.list_groups()):
            with pytest.raises(PermissionDenied) as ei:
                op()
            assert ei.value.code == Code.NO_PERMISSION
            assert "'app'" in str(ei.value) and "admin role" in str(ei.value), ei.value
        assert "app-made" not in a.list_topics()  # listing topics is open to any user
    with Admin([b.address], **pki.client("admin")) as a:
        a.create_topic("admin-made", 1)
        assert "admin-made" in a.list_topics()
        assert isinstance(a.list_groups(), list)
        try:
            a.transfer_leader("n1")  # standalone: refused for what it is, not for who asks
        except BrokerError as e:
            assert not isinstance(e, PermissionDenied) and e.code != Code.NO_PERMISSION, e


# --- TLS trust ---------------------------------------------------------------------------------

def test_a_client_trusting_another_ca_is_refused(env, tmp_path):
    pki, b = env
    other = Pki(tmp_path, "other-ca", cluster="other")
    with Producer([b.address], ca_file=other.ca_file, username="app", password=PASSWORDS["app"],
                  **BOUNDED) as p:
        with pytest.raises(AuthenticationError) as ei:
            p.send("orders", b"x")
    assert "TLS" in str(ei.value) and other.ca_file in str(ei.value), ei.value
    assert ei.value.stored is False
    round_trip(pki, b)


def test_an_address_the_certificate_does_not_name_is_refused_with_a_reason(env):
    pki, b = env
    with Producer([f"localhost:{b.port}"], **pki.client("app"), **BOUNDED) as p:  # the cert names 127.0.0.1
        with pytest.raises(AuthenticationError) as ei:
            p.send("orders", b"x")
    assert "Hostname mismatch" in str(ei.value) and "does not name localhost" in str(ei.value), ei.value


def test_a_client_certificate_from_another_ca_fails_the_handshake(env, tmp_path):
    pki, b = env
    other = Pki(tmp_path, "other-ca", cluster="other")
    forged = other.node_cert("n1")  # a "member" certificate the cluster CA never issued
    ctx = client_context(pki.ca_file, forged.cert_file, forged.key_file)
    refused = False
    try:
        s = tls_socket(b.address, ctx)
    except (ssl.SSLError, OSError):
        refused = True
    else:  # TLS 1.3: the server checks the client's certificate after the client is done
        try:
            s.sendall(fr.encode(Req.STATUS, 1, b"{}"))
            data = s.recv(65536)
            refused = data == b""
        except (ssl.SSLError, OSError):
            refused = True
        finally:
            s.close()
    assert refused, "the broker accepted a client certificate from another CA"
    # and it says so (broker/listener.py: the handshake runs where the broker sees it fail)
    line = wait_log(b, "TLS handshake failed: CERTIFICATE_VERIFY_FAILED")
    assert "refused a connection from 127.0.0.1" in line, line
    # the same with the cluster's own CA completes the handshake (the test tells the two apart);
    # but a certificate naming no member of this broker's group gives no rights: authenticate first
    good = pki.node_cert("n1")
    s = tls_socket(b.address, client_context(pki.ca_file, good.cert_file, good.key_file))
    try:
        s.sendall(fr.encode(Req.CREATE_TOPIC, 1, b"{}"))
        dec = fr.FrameDecoder()
        frames = []
        while not frames:
            chunk = s.recv(65536)
            assert chunk, "closed"
            frames += dec.feed(chunk)
        assert frames[0].code == Code.AUTH_FAILED, frames[0]
    finally:
        s.close()
    assert "a certificate for 'n1', not a member of this group" in log_text(b), b.log_tail(10)
    round_trip(pki, b)


# --- where credentials come from -------------------------------------------------------------

def test_credentials_from_the_environment(env, monkeypatch):
    pki, b = env
    monkeypatch.setenv("TIDELOG_USERNAME", "app")
    monkeypatch.setenv("TIDELOG_PASSWORD", PASSWORDS["app"])
    monkeypatch.setenv("TIDELOG_CA_FILE", pki.ca_file)
    monkeypatch.delenv("TIDELOG_CREDENTIALS", raising=False)
    with Producer([b.address], **BOUNDED) as p:
        assert p.credentials.source.startswith("the environment")
        p.send("orders", b"from-env")
        with pytest.raises(SendError) as ei:
            p.send("secret", b"x")
    assert ei.value.code == Code.NO_PERMISSION  # it is app, not an admin
    monkeypatch.setenv("TIDELOG_PASSWORD", "wrong")
    with Producer([b.address], **BOUNDED) as p:
        with pytest.raises(AuthenticationError, match="the environment"):
            p.send("orders", b"x")


def test_credentials_from_a_file(env, tmp_path, monkeypatch):
    pki, b = env
    path = pki.credentials_file(tmp_path / "creds" / "app.yaml", "app")
    assert os.stat(path).st_mode & 0o777 == 0o600
    for var in ("TIDELOG_USERNAME", "TIDELOG_PASSWORD", "TIDELOG_CA_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TIDELOG_CREDENTIALS", str(path))
    with Producer([b.address], **BOUNDED) as p:
        assert p.credentials.source == str(path)
        p.send("orders", b"from-file")
    monkeypatch.delenv("TIDELOG_CREDENTIALS")
    with Producer([b.address], credentials=str(path), **BOUNDED) as p:  # or named directly
        p.send("orders", b"from-file-arg")


def test_an_unknown_group_names_only_the_groups_the_user_may_use(env):
    """Issue 39 item 7: DESCRIBE_GROUP of a group that does not exist (but that the user's
    role grants: `app-*`) lists the existing groups -- only those the user may use, never
    every group on the broker (listing every group is admin-only)."""
    pki, b = env
    with Consumer([b.address], "payroll-private", "orders", auto_commit=True, **pki.client("admin")) as c:
        c.poll(timeout_ms=300)
        c.commit()
    with Admin([b.address], **pki.client("admin")) as a:
        assert "payroll-private" in {g.group for g in a.list_groups()}
    with Admin([b.address], **pki.client("app")) as a:
        with pytest.raises(BrokerError) as ei:
            a.describe_group("app-none")
    assert ei.value.code == Code.SUBSCRIPTION_GROUP_NOT_EXIST, ei.value
    assert "payroll-private" not in str(ei.value), ei.value
