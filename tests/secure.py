"""Test helpers for security on (issue 14): a cluster CA, node certificates, SCRAM user
entries, and broker configs that turn TLS + authentication on, for brokers run as child
processes (ops.localbroker.LocalBroker: `tidelog broker start --config X`).

    pki = Pki(tmp_path)                                 # a CA (ca.crt, ca.key) under tmp_path/pki
    cfg = pki.broker_config("n0", ["127.0.0.1"])        # tls + users + roles for one node
    with LocalBroker(tmp_path / "b", **cfg) as b:       # a secure broker on loopback
        Producer([b.address], **pki.client("app"))      # ca_file, username, password
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from pathlib import Path

from broker.client.connection import ClientConnection
from broker.client.security import Credentials, write_credentials_file
from broker.security.ca import CaFiles, NodeCert, create_ca, issue_node_cert
from broker.security.scram import SHA512, make_verifier
from ops.localbroker import LocalBroker, free_ports

# who the tests are (issue 14's acceptance): an admin, an application that publishes and
# subscribes to `orders` in group `billing`, and a reader that may only subscribe
PASSWORDS = {"admin": "admin-secret-1", "app": "app-secret-2", "reader": "reader-secret-3"}
ROLES = {
    "admin": {"admin": True},
    "app": {"pub": ["orders"], "sub": ["orders"], "groups": ["billing", "app-*"]},
    "reader": {"sub": ["orders"], "groups": ["billing"]},
}
USER_ROLES = {"admin": ["admin"], "app": ["app"], "reader": ["reader"]}
_VERIFIERS: dict[str, str] = {}  # a verifier costs a PBKDF2 (4096 rounds): made once per process


def user_entries() -> list[dict]:
    """The `users:` of a broker config: name, roles and the SCRAM verifier (never the password)."""
    out = []
    for name, password in PASSWORDS.items():
        if name not in _VERIFIERS:
            _VERIFIERS[name] = (make_verifier(password), make_verifier(password, mechanism=SHA512))
        out.append({"name": name, "roles": USER_ROLES[name], "scram": _VERIFIERS[name][0],
                    "scram512": _VERIFIERS[name][1]})
    return out


class Pki:
    """A cluster CA in `root`/pki (or `name`), and the certificates it issues."""

    def __init__(self, root: Path, name: str = "pki", cluster: str = "test"):
        self.dir = Path(root) / name
        self.ca: CaFiles = create_ca(self.dir, cluster)

    @property
    def ca_file(self) -> str:
        return str(self.ca.cert_file)

    def node_cert(self, node_id: str, addresses=("127.0.0.1",)) -> NodeCert:
        return issue_node_cert(self.ca, self.dir / "nodes", node_id, list(addresses))

    def tls(self, cert_id: str, addresses=("127.0.0.1",)) -> dict:
        c = self.node_cert(cert_id, addresses)
        return {"ca_file": self.ca_file, "cert_file": str(c.cert_file), "key_file": str(c.key_file)}

    def broker_config(self, cert_id: str, addresses=("127.0.0.1",), **extra) -> dict:
        """The security fields of a broker config (tls with a certificate for member `cert_id`,
        users, roles) plus `extra`."""
        return {"tls": self.tls(cert_id, addresses), "users": user_entries(), "roles": ROLES,
                "insecure": False, **extra}

    def client(self, user: str | None, password: str | None = None) -> dict:
        """Client keyword arguments: trust this CA, log in as `user` (None: no user)."""
        kw = {"ca_file": self.ca_file}
        if user is not None:
            kw.update(username=user, password=password if password is not None else PASSWORDS[user])
        return kw

    def credentials(self, user: str | None = None, member: str | None = None) -> Credentials:
        """Credentials for a user, or for a member's certificate (`member`, issued by this CA)."""
        kw = {}
        if member is not None:
            c = self.node_cert(member)
            kw = {"cert_file": str(c.cert_file), "key_file": str(c.key_file)}
        return Credentials(user, PASSWORDS.get(user) if user else None, self.ca_file, **kw)

    def credentials_file(self, path: Path, user: str) -> Path:
        return write_credentials_file(Path(path), user, PASSWORDS[user], Path(self.ca_file))


# --- secure brokers as child processes --------------------------------------------------------

QUICK = {"segment_bytes": 1 << 20, "message_body_bytes_max": 64 << 10, "cq_records_per_file": 1024,
         "index_slots": 1024, "index_entries_max": 8192, "log_level": "INFO"}


def standalone(pki: Pki, data_dir: Path, **config) -> LocalBroker:
    """A secure standalone broker (not started)."""
    return LocalBroker(data_dir, **pki.broker_config("b0", **QUICK, **config))


def raft_group(pki: Pki, root: Path, n: int = 3, **config) -> list[LocalBroker]:
    """A secure raft group n0..n{n-1} on loopback (not started): each node has its own
    certificate (member URI tidelog-member:<id>, IP SAN 127.0.0.1)."""
    ports = free_ports(n)
    peers = [{"id": f"n{i}", "address": f"127.0.0.1:{ports[i]}"} for i in range(n)]
    return [LocalBroker(root / f"n{i}", port=ports[i], **pki.broker_config(
        f"n{i}", **QUICK, **{"mode": "raft", "node_id": f"n{i}", "peers": peers, "raft_election_timeout_ms": 600,
                             **config}))
            for i in range(n)]


def master_slave_group(pki: Pki, root: Path, n: int = 2, **config) -> list[LocalBroker]:
    """A secure SYNC master-slave group: n0 the master, n1.. slaves (not started). Every
    node's HA port is given explicitly (`ha_address`)."""
    ports = free_ports(2 * n)
    peers = [{"id": f"n{i}", "address": f"127.0.0.1:{ports[2 * i]}", "ha_address": f"127.0.0.1:{ports[2 * i + 1]}"}
             for i in range(n)]
    return [LocalBroker(root / f"n{i}", port=ports[2 * i], **pki.broker_config(
        f"n{i}", **QUICK, **{"mode": "master-slave", "node_id": f"n{i}", "peers": peers,
                             "role": "master" if i == 0 else "slave", "ha_replication": "sync",
                             "in_sync_replicas": 2, "slave_ack_timeout_ms": 1000, **config}))
            for i in range(n)]


def start_all(nodes: list[LocalBroker]) -> None:
    for b in nodes:
        b.start()


def stop_all(nodes: list[LocalBroker]) -> None:
    for b in nodes:
        try:
            b.stop(10)
        except Exception:  # noqa: BLE001 -- a cleanup: the next node still stops
            b.kill()


def log_text(b: LocalBroker) -> str:
    try:
        return b.log_path.read_text(errors="replace")
    except OSError:
        return ""


def wait_log(b: LocalBroker, needle: str, timeout_s: float = 10.0) -> str:
    """Wait until the broker's log contains `needle`; the matching line."""
    deadline = time.monotonic() + timeout_s
    while True:
        for line in log_text(b).splitlines():
            if needle in line:
                return line
        if time.monotonic() > deadline:
            raise AssertionError(f"{b.address}'s log has no {needle!r}; its tail:\n{b.log_tail(20)}")
        time.sleep(0.05)


# --- raw connections ----------------------------------------------------------------------------

async def open_raw(address: str, credentials: Credentials | None, timeout_s: float = 5.0) -> ClientConnection:
    """A client connection (TLS + SCRAM as `credentials` say) for sending hand-made frames."""
    host, port = address.rsplit(":", 1)
    return await ClientConnection.open(host, int(port), timeout_s, credentials=credentials)


def tls_socket(address: str, ctx: ssl.SSLContext, timeout_s: float = 5.0) -> ssl.SSLSocket:
    """A blocking TLS socket (handshake done); ssl.SSLError / OSError if refused."""
    import socket
    host, port = address.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=timeout_s)
    try:
        s = ctx.wrap_socket(raw, server_hostname=host)
        s.settimeout(timeout_s)
        return s
    except BaseException:
        raw.close()
        raise


def run(coro):
    return asyncio.run(coro)


def chmod_0600(path: Path) -> int:
    return os.stat(path).st_mode & 0o777
