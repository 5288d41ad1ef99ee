"""Users and roles at runtime (ACL_UPDATE, admin only): `tidelog user ...` and `tidelog role ...`.

A change is replicated like a topic config (raft: through the log; master-slave: slaves copy
it with the metadata sync), persisted in each node's acl.json and enforced at once. The
password never leaves this process: the SCRAM verifier is made here.
"""

from __future__ import annotations

import secrets
import sys

import click

from ops.cli.client_cmds import admin_call
from ops.cli.common import bootstrap_option, emit_json, fail, json_option, print_table


@click.group("user")
def user():
    """Add, change, delete and list users (SCRAM-SHA-256) on a running group."""


PASSWORD_CHARS_MIN = 8


@user.command("set")
@bootstrap_option
@click.argument("name")
@click.option("--role", "-r", "roles", multiple=True, help="A role the user holds (repeat for more)")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from stdin's first line (default: generate one and print it once)")
@json_option
def user_set(bootstrap, name, roles, password_stdin, as_json):
    """Create or replace user NAME (its open connections must log in again)."""
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            fail("--password-stdin: stdin's first line is empty")
        if len(password) < PASSWORD_CHARS_MIN:  # NIST SP 800-63B's floor
            fail(f"--password-stdin: a password of {len(password)} characters is too easy to guess: at least "
                 f"{PASSWORD_CHARS_MIN} (leave --password-stdin out for a generated one)", 2)
        generated = None
    else:
        password = generated = secrets.token_urlsafe(24)
    admin_call(bootstrap, lambda a: a.set_user(name, password, roles))
    if as_json:
        emit_json({"user": name, "roles": list(roles)} | ({"password": generated} if generated else {}))
    else:
        click.echo(f"user {name}: roles {', '.join(roles) or '(none)'}")
        if generated:
            click.echo(f"password (shown once, keep it): {generated}")


@user.command("delete")
@bootstrap_option
@click.argument("name")
def user_delete(bootstrap, name):
    """Delete user NAME: its open connections lose access at once."""
    admin_call(bootstrap, lambda a: a.delete_user(name))
    click.echo(f"user {name} deleted")


@user.command("list")
@bootstrap_option
@json_option
def user_list(bootstrap, as_json):
    """Users with their roles (never their verifiers) and the roles' permissions."""
    view = admin_call(bootstrap, lambda a: a.acl())
    if as_json:
        emit_json(view)
        return
    print_table(["user", "roles", "from"], [[u["name"], ", ".join(u["roles"]), u["source"]] for u in view["users"]],
                title="users")
    _print_roles(view["roles"])


def _print_roles(roles: dict) -> None:
    print_table(["role", "admin", "pub", "sub", "groups", "from"],
                [[n, "yes" if r["admin"] else "", ", ".join(r["pub"]), ", ".join(r["sub"]),
                  ", ".join(r["groups"]), r["source"]] for n, r in roles.items()], title="roles")


@click.group("role")
def role():
    """Add, change, delete and list roles (topic PUB/SUB, groups, admin) on a running group."""


@role.command("set")
@bootstrap_option
@click.argument("name")
@click.option("--admin", is_flag=True, help="Grant the admin operations")
@click.option("--pub", multiple=True, help="A topic pattern it may publish to (name, prefix*, *)")
@click.option("--sub", multiple=True, help="A topic pattern it may subscribe to")
@click.option("--group", "groups", multiple=True, help="A consumer-group pattern it may use")
def role_set(bootstrap, name, admin, pub, sub, groups):
    """Create or replace role NAME (its users get the new rights at once)."""
    admin_call(bootstrap, lambda a: a.set_role(name, admin, pub, sub, groups))
    click.echo(f"role {name} set")


@role.command("delete")
@bootstrap_option
@click.argument("name")
def role_delete(bootstrap, name):
    """Delete role NAME (refused while a user holds it)."""
    admin_call(bootstrap, lambda a: a.delete_role(name))
    click.echo(f"role {name} deleted")


@role.command("list")
@bootstrap_option
@json_option
def role_list(bootstrap, as_json):
    view = admin_call(bootstrap, lambda a: a.acl())
    if as_json:
        emit_json(view["roles"])
    else:
        _print_roles(view["roles"])


COMMANDS = [user, role]
