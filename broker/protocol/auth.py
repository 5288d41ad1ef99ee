"""AUTH bodies (JSON, broker/protocol/jsonbody.py): one SCRAM-SHA-256 exchange step each way
(broker/security/scram.py explains the exchange)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Auth:
    message: str  # client-first, then client-final
    mechanism: str = "SCRAM-SHA-256"


@dataclass(frozen=True)
class AuthStep:
    message: str  # server-first, then server-final
    done: bool
