"""Users and roles at runtime (ACL_UPDATE, admin only): `tidelog user ...` and `tidelog role ...`.

A change is replicated like a topic config (raft: through the log; master-slave: slaves copy
it with the metadata sync), persisted in each node's acl.json and enforced at once. The
password never leaves this process: the SCRAM verifier is made here.

Once the cluster has committed a change, it is kept in the cluster's state on this controller
too (ops.security.record_runtime_change) and every SQL query server running here imports its
users again (spark_jobs.sqlserver.refresh_users): a deleted user cannot log in to them from
the next login on. A cluster this controller has no state for is said on stderr.
"""

from __future__ import annotations

import secrets
import sys

import click

from broker.security.scram import make_verifier
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
    _reach_sql_servers(bootstrap, {"op": "set_user", "name": name, "roles": list(roles),
                                   "scram": make_verifier(password)})
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
    _reach_sql_servers(bootstrap, {"op": "delete_user", "name": name})
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


def _reach_sql_servers(bootstrap: str, change: dict) -> None:
    """The committed change into the cluster's state here, then the query servers' users (see
    the module's docstring); what could not be done is said on stderr, never an exit: the
    cluster has the change already."""
    from ops.security import record_runtime_change
    from spark_jobs.sqlserver import refresh_users, served_warehouses

    try:
        if record_runtime_change(bootstrap, change) is None:
            if served_warehouses():
                click.echo(f"note: this controller has no state for the cluster at {bootstrap}: the SQL query "
                           f"servers running here do not import its users", err=True)
            return
    except (OSError, ValueError) as e:
        click.echo(f"warning: the change is made, but not kept on this controller ({e}): the SQL query "
                   f"servers' users do not follow it", err=True)
        return
    for r in refresh_users():
        if "error" in r:
            click.echo(f"warning: the query server of {r['warehouse']} kept its users: {r['error']}", err=True)


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
    _reach_sql_servers(bootstrap, {"op": "set_role", "name": name, "admin": admin, "pub": list(pub),
                                   "sub": list(sub), "groups": list(groups)})
    click.echo(f"role {name} set")


@role.command("delete")
@bootstrap_option
@click.argument("name")
def role_delete(bootstrap, name):
    """Delete role NAME (refused while a user holds it)."""
    admin_call(bootstrap, lambda a: a.delete_role(name))
    _reach_sql_servers(bootstrap, {"op": "delete_role", "name": name})
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
