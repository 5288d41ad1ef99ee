"""`tidelog user set` refuses a short password before it asks any broker (the new user's
'short' became an admin's password)."""

from click.testing import CliRunner

from ops.cli import acl_cmds


def test_a_short_password_is_refused_before_any_request(monkeypatch):
    calls = []
    monkeypatch.setattr(acl_cmds, "admin_call", lambda *a, **k: calls.append(a))
    r = CliRunner().invoke(acl_cmds.user, ["set", "ops", "--role", "admin", "--password-stdin"], input="short\n")
    assert r.exit_code == 2 and calls == [], r.output
    assert "a password of 5 characters is too easy to guess: at least 8" in r.output
    r = CliRunner().invoke(acl_cmds.user, ["set", "ops", "--role", "admin", "--password-stdin"],
                           input="correct horse battery\n")
    assert r.exit_code == 0 and len(calls) == 1, r.output
