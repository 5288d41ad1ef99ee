"""How a client proves who it is: TLS (trusting the cluster CA) and a SCRAM-SHA-256 user.

Where the credentials come from, first found wins:
1. arguments: `Producer(..., username=, password=, ca_file=)` or `credentials=Credentials(...)`
   or `credentials="path/to/credentials.yaml"`;
2. the environment: TIDELOG_USERNAME, TIDELOG_PASSWORD, TIDELOG_CA_FILE;
3. a credentials file named by TIDELOG_CREDENTIALS (YAML: username, password, ca_file; a
   relative ca_file is relative to the file) -- `tidelog cluster up` and `tidelog deploy`
   write one (0600) and print where.
With none of these the client speaks plain TCP without authenticating: that only works with
a broker that runs `insecure: true`.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from broker.store.files import write_atomic

ENV_USERNAME = "TIDELOG_USERNAME"
ENV_PASSWORD = "TIDELOG_PASSWORD"
ENV_CA_FILE = "TIDELOG_CA_FILE"
ENV_CREDENTIALS = "TIDELOG_CREDENTIALS"


class CredentialsError(ValueError):
    """Credentials that cannot be used (a missing file, a password without a user...)."""


@dataclass(frozen=True)
class Credentials:
    username: str | None = None
    password: str | None = None
    ca_file: str | None = None       # the cluster CA: TLS is on when it is set
    cert_file: str | None = None     # a member's own certificate (group members talking to each other)
    key_file: str | None = None
    source: str = "arguments"        # where these came from (said in errors)
    _ctx: list = field(default_factory=list, compare=False, repr=False)

    @property
    def tls(self) -> bool:
        return self.ca_file is not None

    @property
    def insecure(self) -> bool:
        return self.ca_file is None and self.username is None

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        if not self._ctx:
            from broker.security.tls import client_context
            try:
                self._ctx.append(client_context(self.ca_file, self.cert_file, self.key_file))
            except (OSError, ssl.SSLError) as e:
                raise CredentialsError(f"credentials from {self.source}: cannot load the TLS files "
                                       f"(ca_file {self.ca_file}): {e}") from None
        return self._ctx[0]

    @classmethod
    def load(cls, path) -> Credentials:
        path = Path(path).expanduser()
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as e:
            raise CredentialsError(f"cannot read the credentials file {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise CredentialsError(f"credentials file {path} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise CredentialsError(f"credentials file {path}: expected a mapping (username, password, ca_file)")
        unknown = set(data) - {"username", "password", "ca_file", "cert_file", "key_file", "bootstrap"}
        if unknown:
            raise CredentialsError(f"credentials file {path}: unknown fields {sorted(unknown)}")

        def rel(v):
            return None if v is None else str((path.parent / str(v)).resolve())
        return cls(data.get("username"), data.get("password"), rel(data.get("ca_file")),
                   rel(data.get("cert_file")), rel(data.get("key_file")), source=str(path))

    @classmethod
    def resolve(cls, credentials=None, username: str | None = None, password: str | None = None,
                ca_file: str | None = None) -> Credentials:
        if isinstance(credentials, (str, os.PathLike)):
            base = cls.load(credentials)
        elif isinstance(credentials, Credentials):
            base = credentials
        elif credentials is not None:
            raise CredentialsError(f"credentials must be a Credentials or a file path, not {type(credentials).__name__}")
        elif username or password or ca_file:
            base = cls()
        elif os.environ.get(ENV_USERNAME) or os.environ.get(ENV_CA_FILE):
            base = cls(os.environ.get(ENV_USERNAME), os.environ.get(ENV_PASSWORD),
                       os.environ.get(ENV_CA_FILE), source="the environment (TIDELOG_USERNAME...)")
        elif os.environ.get(ENV_CREDENTIALS):
            base = cls.load(os.environ[ENV_CREDENTIALS])
        else:
            base = cls(source="nowhere (plain TCP)")
        out = replace(base, username=username or base.username, password=password or base.password,
                      ca_file=str(ca_file) if ca_file else base.ca_file)
        if out.username and out.password is None:
            raise CredentialsError(f"credentials from {out.source}: user {out.username!r} has no password")
        if out.password and not out.username:
            raise CredentialsError(f"credentials from {out.source}: a password without a user name "
                                   f"(give username=, TIDELOG_USERNAME or username: in the file)")
        return out


def write_credentials_file(path: Path, username: str, password: str, ca_file: Path,
                           bootstrap: str | None = None) -> Path:
    """A credentials file (0600, created so: never readable by others, not even briefly)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"username": username, "password": password, "ca_file": str(ca_file)}
    if bootstrap:
        data["bootstrap"] = bootstrap
    write_atomic(path, yaml.safe_dump(data, sort_keys=False).encode(), 0o600)
    return path
