"""SSH credentials from an Airflow connection (Airflow's usual place for secrets).

A spec may say `ssh: {connection_id: tidelog_ssh}` instead of a key path. The connection's
login is the SSH user; its extra holds `key_file` (a path on the worker) or `private_key`
(the key itself), as apache-airflow-providers-ssh reads them.
"""

from __future__ import annotations

from pathlib import Path


class CredentialsError(RuntimeError):
    pass


def _get(conn_id: str):
    errors = []
    try:  # inside a task: the Task SDK asks the API server (or the secrets backends)
        from airflow.sdk import Connection

        return Connection.get(conn_id)
    except Exception as e:  # noqa: BLE001 - fall back to the secrets backends below
        errors.append(f"{type(e).__name__}: {e}")
    try:  # outside a task (CLI, tests): environment variables, metadata DB, secrets backends
        from airflow.models.connection import Connection as ModelConnection

        return ModelConnection.get_connection_from_secrets(conn_id)
    except Exception as e:  # noqa: BLE001
        errors.append(f"{type(e).__name__}: {e}")
    raise CredentialsError(f"Airflow connection {conn_id!r} not found ({'; '.join(errors)}); "
                           f"create it in Admin > Connections or as AIRFLOW_CONN_{conn_id.upper()}")


def airflow_ssh(conn_id: str, default_user: str) -> tuple[str, Path | None, str | None]:
    """(user, key file, key text) from the connection."""
    c = _get(conn_id)
    extra = c.extra_dejson if hasattr(c, "extra_dejson") else {}
    key_file = extra.get("key_file")
    key_text = extra.get("private_key")
    if not key_file and not key_text:
        raise CredentialsError(f"Airflow connection {conn_id!r} has neither extra.key_file nor "
                               f"extra.private_key")
    return c.login or default_user, Path(key_file) if key_file else None, key_text
