"""Errors the Tidelog client raises. Every one says whether the message may have been stored."""

from __future__ import annotations

from broker.protocol.codes import Code, name as code_name
# A ValueError raised before anything is sent: an argument the wire cannot carry (a topic over
# TOPIC_BYTES_MAX bytes, ...). Defined with the protocol, whose encoders raise it.
from broker.protocol.codes import FieldLimitError  # noqa: F401


class TidelogError(Exception):
    pass


class ConnectError(TidelogError):
    """Could not connect to any address: nothing was sent. `refused`: every address
    refused the connection (nothing listens there; waiting will not help), as opposed to
    one that timed out (a host that may be cut off for a moment)."""

    stored = False

    def __init__(self, message: str, refused: bool = False):
        super().__init__(message)
        self.refused = refused


class AuthenticationError(ConnectError):
    """The broker did not accept these credentials (AUTH_FAILED: unknown user, wrong password,
    none given) or the TLS handshake failed (a certificate the client does not trust):
    nothing was sent; retrying with the same credentials will not help."""

    code = Code.AUTH_FAILED
    login = False

    def __init__(self, message: str, login: bool = False):
        super().__init__(message, refused=True)
        self.login = login  # the broker refused the user itself (not one node's TLS)


class TLSRequired(AuthenticationError):
    """A broker with security on closed a plain (non-TLS) connection before it answered
    anything: the client has no cluster CA (no credentials file). Nothing was sent; retrying
    without them will not help."""

    HINT = ("give the client the cluster's credentials: eval \"$(tidelog cluster env --data-dir D)\" "
            "(D: the cluster's directory), or export TIDELOG_CREDENTIALS=D/security/admin.credentials.yaml "
            "(the CA alone: TIDELOG_CA_FILE, or ca_file= in Python)")

    def __init__(self, where: str):
        super().__init__(f"TLS required: {where}: a broker with security on speaks TLS only, and this client "
                         f"connected without TLS; {self.HINT}")


class NotSent(TidelogError):
    """The connection failed before the request was written: nothing was stored."""


class RequestTimeout(TidelogError):
    """No answer in time: the request may or may not have been carried out."""


class ConnectionLost(TidelogError):
    """The connection broke after the request was written: it may have been carried out.
    `plain_to_tls`: a plain connection the broker closed before it answered anything (a broker
    with security on speaks TLS only): nothing was carried out."""

    def __init__(self, message: str, plain_to_tls: bool = False):
        super().__init__(message)
        self.plain_to_tls = plain_to_tls


class BrokerError(TidelogError):
    """The broker answered with an error code."""

    def __init__(self, code: int, message: str = ""):
        self.code = code
        self.code_name = code_name(code)
        super().__init__(f"{self.code_name}: {message}" if message else self.code_name)


class PermissionDenied(BrokerError):
    """NO_PERMISSION: the user's roles do not allow this (publish or subscribe to a topic, use a
    consumer group, an admin operation). Nothing was done."""


class SendError(BrokerError):
    """A send that did not succeed. `stored`: True (stored, durability not confirmed),
    False (certainly not stored) or None (unknown: a timeout or a lost connection)."""

    def __init__(self, code: int, message: str, stored: bool | None, result=None, attempts: int = 1):
        super().__init__(code, message)
        self.stored = stored
        self.result = result
        self.attempts = attempts


class CorruptMessage(TidelogError):
    """A pulled entry failed its CRC check; `seek` past it to go on."""

    def __init__(self, topic: str, queue_id: int, offset: int, reason: str):
        self.topic, self.queue_id, self.offset = topic, queue_id, offset
        super().__init__(f"corrupt message in {topic}/{queue_id} at queue offset {offset}: {reason}")


class SendConnectError(SendError, ConnectError):
    """A send whose last attempt reached no broker (code NOT_CONNECTED); its words are the
    connect error's, e.g. `cannot connect to 127.0.0.1:1: [Errno 111] Connection refused`.
    stored=False only when no earlier attempt may have stored it: after an attempt whose
    outcome is unknown (a lost connection, a timeout, SYSTEM_ERROR), a refused reconnect says
    nothing about that attempt, so stored=None.

    When the broker refused the credentials (the error is an AuthenticationError), the
    exception is a SendAuthenticationError (code AUTH_FAILED): `except AuthenticationError`
    catches it as well."""

    def __new__(cls, error=None, *args, **kwargs):
        if cls is SendConnectError and isinstance(error, AuthenticationError):
            cls = SendAuthenticationError
        return SendError.__new__(cls)

    def __init__(self, error: TidelogError, attempts: int, earlier_unknown: bool = False,
                 stored: bool | None = False):
        if earlier_unknown:
            stored = None
        words = f"outcome unknown (may be stored), then: {error}" if stored is None else str(error)
        super().__init__(Code.NOT_CONNECTED, words, stored=stored, attempts=attempts)
        self.refused = getattr(error, "refused", False)
        self.args = (words,)

    def __str__(self) -> str:
        return self.args[0]


class SendAuthenticationError(SendConnectError, AuthenticationError):
    """A send the broker refused because it did not accept the credentials (code AUTH_FAILED:
    none given, an unknown user, a wrong password, a CA the broker does not use). Nothing was
    stored by that attempt; retrying with the same credentials will not help."""

    def __init__(self, error: TidelogError, attempts: int, earlier_unknown: bool = False,
                 stored: bool | None = False):
        super().__init__(error, attempts, earlier_unknown, stored)
        self.code = Code.AUTH_FAILED
        self.code_name = code_name(Code.AUTH_FAILED)
