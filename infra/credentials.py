"""SSH credentials from an Airflow connection of type `ssh` (Airflow's usual place for secrets).

A spec may say `ssh: {connection_id: tidelog_ssh}` instead of a key path. The connection is
read by apache-airflow-providers-ssh's own `SSHHook`, so it is the form Admin › Connections
already has for the `ssh` type: *Login* is the SSH user, *Password* a password (if any), and
the extra's `key_file` (a path on the worker) or `private_key` (the key itself, with
`private_key_passphrase`) the key; an empty Login means the spec's `ssh.user`. Inside a task
the hook asks the Task SDK (the API server and secrets backends); elsewhere (the CLI) the
secrets backends and the metadata DB.

Host keys are never taken from the connection: the spec's `known_hosts` (paramiko's
RejectPolicy) decides, whatever the connection's `no_host_key_check` says.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


class CredentialsError(RuntimeError):
    pass


@dataclass(frozen=True)
class SSHCredentials:
    user: str
    key_file: Path | None = None
    pkey: object | None = None      # a paramiko PKey (from the connection's private_key)
    password: str | None = None


def airflow_ssh(conn_id: str, remote_host: str, default_user: str) -> SSHCredentials:
    """The user and key (or password) of Airflow connection `conn_id`, through SSHHook; an
    empty Login means the spec's ssh.user. `remote_host`: one of the spec's hosts (the hook
    wants one; the spec, not the connection, says where the hosts are)."""
    try:
        from airflow.providers.ssh.hooks.ssh import SSHHook
    except ImportError as e:
        raise CredentialsError(f"ssh.connection_id {conn_id!r} needs apache-airflow-providers-ssh "
                               f"on this machine ({e})") from None
    try:
        login = SSHHook.get_connection(conn_id).login
        hook = SSHHook(ssh_conn_id=conn_id, remote_host=remote_host, username=login or default_user)
    except Exception as e:  # noqa: BLE001 - the hook raises AirflowNotFoundException and friends
        words = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "isn't defined" in words or "not found" in words.lower():
            words = "not found"
        raise CredentialsError(f"Airflow connection {conn_id!r} {words}; create it (type SSH) in "
                               f"Admin > Connections or as AIRFLOW_CONN_{conn_id.upper()}") from None
    if not (hook.key_file or hook.pkey or hook.password):
        raise CredentialsError(f"Airflow connection {conn_id!r} holds no key or password: set its extra "
                               f"key_file (a path on the worker) or private_key, or its password")
    return SSHCredentials(user=hook.username,
                          key_file=Path(hook.key_file).expanduser() if hook.key_file else None,
                          pkey=hook.pkey, password=hook.password or None)


def airflow_broker(conn_id: str):
    """Broker client credentials from Airflow connection `conn_id` (any type; Generic will do):
    *Login* the user, *Password* the password, optionally extra `ca_file` (a path on the worker)
    or `ca_pem` (the CA certificate itself, written to a private temporary file); without them
    ca_file is None (the caller knows the cluster's CA)."""
    from broker.client.security import Credentials

    try:
        from airflow.sdk import BaseHook
        conn = BaseHook.get_connection(conn_id)
    except Exception as e:  # noqa: BLE001 - AirflowNotFoundException and friends
        words = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CredentialsError(f"Airflow connection {conn_id!r}: {words}; create it in Admin > Connections "
                               f"(Login, Password, extra {{\"ca_file\": ...}}) or as AIRFLOW_CONN_{conn_id.upper()}") from None
    extra = conn.extra_dejson or {}
    ca_file = extra.get("ca_file")
    if ca_file is None and extra.get("ca_pem"):
        ca_file = str(_private_ca_file(conn_id, extra["ca_pem"]))
    if not conn.login or not conn.password:
        raise CredentialsError(f"Airflow connection {conn_id!r} needs a Login and a Password: the "
                               f"brokers authenticate users (and it is the admin user deploy sets up)")
    return Credentials(conn.login, conn.password, str(Path(ca_file).expanduser()) if ca_file else None,
                       source=f"Airflow connection {conn_id}")


def _private_ca_file(conn_id: str, pem: str) -> Path:
    """The connection's CA written where only this user can write (~/.tidelog/airflow-ca, 0700),
    rewritten every time: a file planted at a predictable shared path must never be trusted."""
    import os

    from broker.store.files import write_atomic

    d = Path("~/.tidelog/airflow-ca").expanduser()
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    path = d / f"{conn_id}.crt"
    write_atomic(path, pem.encode(), 0o600)
    return path
