"""A cluster's secrets, made and kept on the controller: its CA, its nodes' certificates, its
users' passwords, and the credentials files clients read. `tidelog deploy` (and so `cluster
up`) calls `ensure`; node configs get `broker_fields`; `tidelog upgrade` re-issues each
node's certificate as it restarts the node (rotation).

    <state>/security/ca.crt, ca.key            the cluster CA (key 0600)
    <state>/security/nodes/<id>.crt, .key       node certificates, as issued (keys 0600), each
                                                naming its broker group; name servers
                                                (ns-<host>) get one the same way, with no group
    <state>/security/users.yaml                 users: password, roles, SCRAM verifier (0600)
    <state>/security/<user>.credentials.yaml    what a client needs: user, password, CA (0600)

On each host a node's files live in <node home>/tls/ (a 0700 directory): ca.crt, node.crt,
node.key. The spec's `security` section names users and roles; an `admin` user with the
admin role always exists. `security: {insecure: true}` turns it all off (the brokers warn
at every start).
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from pathlib import Path

from dataclasses import replace

import yaml

from broker.client.security import Credentials, write_credentials_file
from broker.security import ca as cas
from broker.security.scram import make_verifier
from broker.store.files import write_atomic

ADMIN_USER = "admin"
ROTATE_WITHIN_DAYS = 30  # deploy re-issues a certificate this close to expiring
PASSWORD_BYTES = 18


class ClusterSecurity:
    def __init__(self, spec):
        self.spec = spec
        self.conf = spec.security
        self.dir = spec.state / "security"

    @property
    def insecure(self) -> bool:
        return self.conf.insecure

    # --- controller side ------------------------------------------------------------------------

    def ensure(self) -> None:
        """The CA, every user's password and verifier, and their credentials files (idempotent:
        what exists is kept, so configs do not change from one deploy to the next)."""
        if self.insecure:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        cas.create_ca(self.dir, self.spec.name)
        users = self._users()
        changed = False
        given = self._airflow_admin()
        for name, roles in self.wanted_users().items():
            u = users.get(name)
            password = given.password if given is not None and name == given.username else None
            if u is None or (password is not None and u["password"] != password):
                password = password or secrets.token_urlsafe(PASSWORD_BYTES)
                users[name] = {"password": password, "roles": list(roles), "scram": make_verifier(password)}
                changed = True
            elif list(u["roles"]) != list(roles):
                u["roles"] = list(roles)
                changed = True
        for name in list(users):
            if name not in self.wanted_users():
                del users[name]
                changed = True
        if changed:
            write_atomic(self.users_file, yaml.safe_dump(users, sort_keys=True).encode(), 0o600)
        bootstrap = self._bootstrap()
        for name, u in users.items():
            path = self.credentials_file(name)
            # the addresses too: a cluster rebuilt in the same directory (cluster up --fresh, or
            # another size or mode) has new ones, and the CLI finds a file by its bootstrap
            want = {"username": name, "password": u["password"], "ca_file": str(self.ca.cert_file),
                    "bootstrap": bootstrap or None}
            have = yaml.safe_load(path.read_text()) if path.exists() else None
            if not have or any(have.get(k) != v for k, v in want.items()):
                write_credentials_file(path, name, u["password"], self.ca.cert_file, bootstrap)

    def _airflow_admin(self) -> Credentials | None:
        """With security.connection_id: the Airflow connection's Login and Password are the
        admin user ops code (and the DAGs' tasks) connect as -- the operator keeps the secret in
        Airflow, deploy gives the brokers its verifier."""
        if not self.conf.connection_id:
            return None
        from infra.credentials import airflow_broker
        return airflow_broker(self.conf.connection_id)

    def wanted_users(self) -> dict[str, tuple[str, ...]]:
        out = {ADMIN_USER: ("admin",)}
        given = self._airflow_admin()
        if given is not None:
            out[given.username] = ("admin",)
        for u in self.conf.users:
            out[u.name] = tuple(u.roles)
        return out

    @property
    def users_file(self) -> Path:
        return self.dir / "users.yaml"

    @property
    def ca(self) -> cas.CaFiles:
        return cas.CaFiles(self.dir / cas.CA_CERT_NAME, self.dir / cas.CA_KEY_NAME)

    def credentials_file(self, user: str = ADMIN_USER) -> Path:
        return self.dir / f"{user}.credentials.yaml"

    def credentials(self, user: str = ADMIN_USER) -> Credentials | None:
        """What ops code (health checks, drills, upgrades) connects with; None when insecure."""
        if self.insecure:
            return None
        path = self.credentials_file(user)
        if not path.exists():  # never deployed: nothing to authenticate to yet (probes say unreachable)
            return None
        return Credentials.load(path)

    def _users(self) -> dict:
        try:
            return yaml.safe_load(self.users_file.read_text()) or {}
        except FileNotFoundError:
            return {}

    def _bootstrap(self) -> str:
        # what find_credentials matches a client's --bootstrap or --namesrv against
        return ",".join([p.address for p in self.spec.nodes()] + self.spec.namesrv_addresses)

    def node_cert(self, plan, rotate: bool = False) -> cas.NodeCert:
        """This node's certificate on the controller, issued now if it is missing, names other
        addresses, is near its end, does not name the node's broker group (a certificate from
        before groups were named, or a node moved to another group), or `rotate` asks for a
        new one. A broker node's certificate names its group (its config's broker_name): name
        servers take that group's registrations from it only; a name server's names none."""
        out = self.dir / "nodes"
        crt, key = out / f"{plan.id}.crt", out / f"{plan.id}.key"
        addresses = _addresses(plan)
        group = _group(plan)
        if rotate or not key.exists() or cas.needs_rotation(crt, ROTATE_WITHIN_DAYS, ca_file=self.ca.cert_file,
                                                            node_id=plan.id, addresses=addresses, group=group):
            return cas.issue_node_cert(self.ca, out, plan.id, addresses, group=group)
        return cas.NodeCert(crt, key, dt.datetime.fromisoformat(cas.cert_info(crt)["not_after"]))

    def names_no_group(self, plan) -> bool:
        """The node's certificate (as issued, on the controller) names no broker group, or
        another one: a certificate from before groups were named. Name servers of this build
        refuse its registrations, so a whole-cluster upgrade re-issues the groups' certificates
        (by restarting them) before it restarts the name servers."""
        group = _group(plan)
        if self.insecure or group is None:
            return False
        crt = self.dir / "nodes" / f"{plan.id}.crt"
        return crt.exists() and cas.needs_rotation(crt, 0, group=group)

    # --- node side ----------------------------------------------------------------------------

    @staticmethod
    def tls_dir(plan) -> str:
        return f"{plan.home}/tls"

    def broker_fields(self, plan) -> dict:
        """The security part of a node's broker config."""
        if self.insecure:
            return {"insecure": True}
        d = self.tls_dir(plan)
        users = self._users()
        return {
            "tls": {"ca_file": f"{d}/ca.crt", "cert_file": f"{d}/node.crt", "key_file": f"{d}/node.key"},
            "users": [{"name": n, "roles": list(u["roles"]), "scram": u["scram"]} for n, u in sorted(users.items())],
            "roles": {"admin": {"admin": True},
                      **{name: r.model_dump() for name, r in self.conf.roles.items()}},
        }

    def install(self, host, plan, rotate: bool = False) -> None:
        """Put the CA and this node's certificate and key into its tls/ directory (0700, the
        key 0600) on its host."""
        if self.insecure:
            return
        from ops.nodes import q
        cert = self.node_cert(plan, rotate)
        d = self.tls_dir(plan)
        host.run(f"umask 077 && mkdir -p {q(d)} && chmod 700 {q(d)}", timeout_s=30)
        host.write_text(f"{d}/ca.crt", self.ca.cert_file.read_text())
        host.write_text(f"{d}/node.crt", cert.cert_file.read_text())
        host.write_text(f"{d}/node.key", cert.key_file.read_text())
        host.run(f"chmod 600 {q(d + '/node.key')} {q(d + '/node.crt')} {q(d + '/ca.crt')}", timeout_s=30)


def _group(plan) -> str | None:
    """The broker_name the node's config will have (a group's `config` may set it), None for a
    name server."""
    if getattr(plan, "kind", "broker") != "broker":
        return None
    return plan.broker_config().get("broker_name")


def _addresses(plan) -> list[str]:
    out = []
    for a in (plan.address, plan.ha_address):
        if a:
            host = a.rsplit(":", 1)[0].strip("[]")
            if host not in out:
                out.append(host)
    return out


def credentials_for(spec) -> Credentials | None:
    """What ops code (health checks, drills, upgrades, the DAGs' tasks) connects to `spec`'s
    brokers with: the Airflow connection `security.connection_id` names, else the admin
    credentials deploy wrote in the state directory; None when insecure."""
    if spec.security.insecure:
        return None
    sec = ClusterSecurity(spec)
    given = sec._airflow_admin()
    if given is not None:
        return given if given.ca_file else replace(given, ca_file=str(sec.ca.cert_file))
    return sec.credentials()


def find_credentials(bootstrap: str) -> Path | None:
    """A credentials file written by deploy / cluster up for a cluster one of whose nodes is in
    `bootstrap` (the CLI's default when no credentials are given)."""
    from infra.spec import STATE_ROOT
    from ops.cluster import DEFAULT_DIR

    wanted = {b.strip() for b in bootstrap.split(",") if b.strip()}
    for root in (DEFAULT_DIR / "state", DEFAULT_DIR, STATE_ROOT):
        for f in sorted(Path(root).glob(f"*/security/{ADMIN_USER}.credentials.yaml")) + sorted(
                Path(root).glob(f"security/{ADMIN_USER}.credentials.yaml")):
            try:
                data = yaml.safe_load(f.read_text()) or {}
            except (OSError, yaml.YAMLError):
                continue
            if wanted & {b.strip() for b in str(data.get("bootstrap", "")).split(",")}:
                return f
    return None
