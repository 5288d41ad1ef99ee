"""The query server's client: one statement at a time over HiveServer2's protocol, through
impyla (a maintained HiveServer2 client: Thrift, SASL PLAIN, TLS), with the names the callers
use -- `Connection`, `Result`, `HS2Error`, `first_line`.

The server authenticates every connection (spark_jobs/sqlsecurity.py): TLS checked against
the warehouse's CA (hostname 127.0.0.1 included), then the user's name and password in SASL
PLAIN inside it. `Credentials` say both (sqlsecurity.client_credentials finds them).
"""

from __future__ import annotations

import json
import re
from typing import NamedTuple

from broker.client.security import Credentials

FETCH_ROWS_MAX = 10_000
COMPLEX_TYPES = {"ARRAY", "MAP", "STRUCT", "UNION"}  # the server sends them as JSON text
TIMEOUT_S = 600.0


class HS2Error(Exception):
    """The server refused a statement: str() is Spark's one-line message (`[PARSE_SYNTAX_ERROR]
    Syntax error at or near 'SELEC'...`), `detail` the whole text the server sent."""

    def __init__(self, message: str, sql_state: str | None = None):
        super().__init__(first_line(message))
        self.detail = message
        self.sql_state = sql_state


class LoginRefused(HS2Error):
    """The server did not let this connection in (no TLS, wrong password, unknown user, locked)."""


# "Error running query: [CLASS] org.apache...SomeException: \n[CLASS] the message..."
_NOISE = re.compile(r"^(Error running query: )?(\[[A-Z0-9_.]+\] )?([\w.$]+(Exception|Error): ?)?")


def first_line(message: str) -> str:
    for line in message.splitlines():
        line = _NOISE.sub("", line.strip(), count=1) if "Exception" in line or "Error running" in line else line.strip()
        if line:
            return line
    return message.strip()


class Result(NamedTuple):
    columns: list[str]
    rows: list[tuple]


def _server_message(e: Exception) -> str:
    """The server's text as impyla hands it over: HiveServer2's status message, which starts
    with the server-side exception's class (org.apache.hive.service.cli.HiveSQLException: Error
    running query: ...) and goes on with its stack."""
    return re.sub(r"^[\w.$]*HiveSQLException: ", "", str(e))


class Connection:
    """One HiveServer2 session: `with Connection(host, port, credentials=c) as s: s.execute(sql)`."""

    def __init__(self, host: str, port: int, database: str | None = None, *, credentials: Credentials,
                 timeout_s: float = TIMEOUT_S):
        from impala.dbapi import connect
        from impala.error import Error as ImpylaError
        from thrift.transport.TTransport import TTransportException

        self.user = credentials.username
        where = f"{host}:{port}"
        try:
            self.conn = connect(host=host, port=port, use_ssl=True, ca_cert=credentials.ca_file,
                                auth_mechanism="PLAIN", user=credentials.username, password=credentials.password,
                                timeout=timeout_s, retries=1)  # one try: a retry of a refused call
                                                               # meets a closed socket
            self.cursor = self.conn.cursor(configuration={"use:database": database} if database else None,
                                           close_finished_queries=False)
        except (TTransportException, ImpylaError, OSError) as e:
            text = str(e)
            if "Error validating the login" in text or "Authentication failed" in text or "Bad status: 5" in text:
                raise LoginRefused(f"the query server {where} refused the login of user {self.user!r} (unknown user "
                                   f"or wrong password; {_credentials_hint(credentials)})") from None
            if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
                raise LoginRefused(f"the query server {where} did not prove itself with the warehouse's certificate "
                                   f"({credentials.ca_file}): {text}") from None
            raise LoginRefused(f"could not open a session on the query server {where}: {text}") from None

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.cursor.close()
            self.conn.close()
        except Exception:  # noqa: BLE001 - a connection the server dropped is closed all the same
            pass

    def execute(self, statement: str, rows_max: int = FETCH_ROWS_MAX) -> Result:
        """Run one statement to completion; its columns and up to `rows_max` rows."""
        from impala.error import Error as ImpylaError
        from thrift.Thrift import TException

        try:
            self.cursor.execute(statement)
            if not self.cursor.has_result_set or not self.cursor.description:
                return Result([], [])
            names = [d[0] for d in self.cursor.description]
            complex_cols = [str(d[1]).upper() in COMPLEX_TYPES for d in self.cursor.description]
            try:
                rows = self.cursor.fetchmany(rows_max) if rows_max else []
            except IndexError:  # impyla on a result of no columns (USE, SET ...): no rows
                rows = []
            return Result(names, [tuple(_json_or_text(v) if cx and v is not None else v
                                        for v, cx in zip(r, complex_cols)) for r in rows])
        except (ImpylaError, TException) as e:
            raise HS2Error(_server_message(e)) from None
        finally:
            try:
                self.cursor.close_operation()
            except Exception:  # noqa: BLE001 - nothing to close after a failed statement
                pass


def _credentials_hint(c: Credentials) -> str:
    return f"credentials from {c.source}: give --credentials FILE, or TIDELOG_USERNAME and TIDELOG_PASSWORD"


def _json_or_text(s: str | bytes):
    if isinstance(s, (bytes, bytearray)):  # impyla leaves ARRAY columns undecoded
        s = bytes(s).decode(errors="replace")
    try:
        return json.loads(s)
    except ValueError:
        return s
