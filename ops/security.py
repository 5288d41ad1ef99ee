"""A cluster's secrets, made and kept on the controller: its CA, its nodes' certificates, its
users' passwords, and the credentials files clients read. `tidelog deploy` (and so `cluster
up`) calls `ensure`; node configs get `broker_fields`; `tidelog upgrade` re-issues each
node's certificate as it restarts the node (rotation).

    <state>/security/ca.crt, ca.key            the cluster CA (key 0600)
    <state>/security/nodes/<id>.crt, .key       node certificates, as issued (keys 0600), each
                                                naming its broker group; name servers
                                                (ns-<host>) get one the same way, with no group
    <state>/security/users.yaml                 users: password, roles, SCRAM verifier (0600)
    <state>/security/roles.yaml                 the roles deploy gives the nodes (admin flag,
                                                patterns), for the SQL query server's import
    <state>/security/acl.json                   the runtime changes (`tidelog user|role set|
                                                delete`) this controller made, kept as the nodes
                                                keep theirs (broker/acl_store.py; 0600)
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

from broker.acl_store import AclError, AclStore
from broker.client.security import Credentials, write_credentials_file
from broker.config import RoleEntry, UserEntry
from broker.security import ca as cas
from broker.security.scram import SHA512, make_verifier
from broker.store.files import write_atomic

ADMIN_USER = "admin"
SECURITY_DIR = "security"
USERS_FILE = "users.yaml"
ROLES_FILE = "roles.yaml"
RUNTIME_ACL_FILE = "acl.json"
BUILTIN_ROLES = {"admin": RoleEntry(admin=True)}  # every cluster has it (a spec may redefine it)
ROTATE_WITHIN_DAYS = 30  # deploy re-issues a certificate this close to expiring
PASSWORD_BYTES = 18


class ClusterSecurity:
    def __init__(self, spec):
        self.spec = spec
        self.conf = spec.security
        self.dir = spec.state / SECURITY_DIR

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
                users[name] = {"password": password, "roles": list(roles), "scram": make_verifier(password),
                               "scram512": make_verifier(password, mechanism=SHA512)}
                changed = True
            elif list(u["roles"]) != list(roles):
                u["roles"] = list(roles)
                changed = True
            if not users[name].get("scram512"):  # (made before Kafka's SCRAM-SHA-512 was offered)
                users[name]["scram512"] = make_verifier(users[name]["password"], mechanism=SHA512)
                changed = True
        for name in list(users):
            if name not in self.wanted_users():
                del users[name]
                changed = True
        if changed:
            write_atomic(self.users_file, yaml.safe_dump(users, sort_keys=True).encode(), 0o600)
        roles = yaml.safe_dump({n: r.model_dump(mode="json") for n, r in self.roles().items()}, sort_keys=True)
        if not self.roles_file.exists() or self.roles_file.read_text() != roles:
            write_atomic(self.roles_file, roles.encode(), 0o600)
            changed = True
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
        if changed:
            _users_changed()

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

    def roles(self) -> dict[str, RoleEntry]:
        """The roles the nodes' configs get: the built-in admin role, then the spec's."""
        return {**BUILTIN_ROLES, **self.conf.roles}

    @property
    def users_file(self) -> Path:
        return self.dir / USERS_FILE

    @property
    def roles_file(self) -> Path:
        return self.dir / ROLES_FILE

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
            "users": [{"name": n, "roles": list(u["roles"]), "scram": u["scram"],
                       **({"scram512": u["scram512"]} if u.get("scram512") else {})} for n, u in sorted(users.items())],
            "roles": {"admin": BUILTIN_ROLES["admin"].model_dump(exclude_defaults=True),
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


def state_roots() -> list[Path]:
    """Where `tidelog deploy` and `cluster up` keep clusters' states on this controller."""
    from infra.spec import STATE_ROOT
    from ops.cluster import DEFAULT_DIR

    return [DEFAULT_DIR / "state", DEFAULT_DIR, STATE_ROOT]


def cluster_security_dirs(roots: list[Path] | None = None) -> list[Path]:
    """Every cluster's security directory on this controller, each once: <root>/<name>/security
    and <root>/security under `roots` (default: state_roots())."""
    out: list[Path] = []
    seen: set[Path] = set()
    for root in state_roots() if roots is None else roots:
        for d in sorted(Path(root).glob(f"*/{SECURITY_DIR}")) + [Path(root) / SECURITY_DIR]:
            if d.is_dir() and d.resolve() not in seen:
                seen.add(d.resolve())
                out.append(d)
    return out


def find_credentials(bootstrap: str, roots: list[Path] | None = None) -> Path | None:
    """A credentials file written by deploy / cluster up for a cluster one of whose nodes is in
    `bootstrap` (the CLI's default when no credentials are given)."""
    wanted = {b.strip() for b in bootstrap.split(",") if b.strip()}
    for d in cluster_security_dirs(roots):
        try:
            data = yaml.safe_load((d / f"{ADMIN_USER}.credentials.yaml").read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if wanted & {b.strip() for b in str(data.get("bootstrap", "")).split(",")}:
            return d / f"{ADMIN_USER}.credentials.yaml"
    return None


# --- the controller's view of a cluster's users (the SQL query server imports it) ---------------

def record_runtime_change(bootstrap: str, change: dict) -> Path | None:
    """Keep a runtime ACL change the cluster at `bootstrap` committed (broker/acl_store.py
    AclStore.apply's change) in its state on this controller, for the query servers' users;
    the security directory, or None when this controller has no state for that cluster."""
    found = find_credentials(bootstrap)
    if found is None:
        return None
    AclStore(found.parent / RUNTIME_ACL_FILE).apply(change)
    return found.parent


def controller_acl(security_dir: Path, warnings: list[str]) -> tuple[tuple[UserEntry, ...], dict[str, RoleEntry]]:
    """A cluster's users and roles as this controller knows them: deploy's users.yaml and
    roles.yaml, overlaid with the runtime changes in acl.json (the nodes' own rule,
    broker/acl_store.py effective). An entry that cannot be read is skipped and said in
    `warnings`; a damaged acl.json skips the whole cluster (it may hold deletes)."""
    d = Path(security_dir)
    base_users = []
    for name, u in sorted(_yaml_mapping(d / USERS_FILE, warnings).items()):
        try:
            base_users.append(UserEntry(name=str(name), roles=tuple(u.get("roles") or ()), scram=str(u["scram"])))
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            warnings.append(f"{d / USERS_FILE}: user {name!r} skipped: not a user entry ({_first_line(e)})")
    if (d / ROLES_FILE).exists():
        base_roles = {}
        for name, r in _yaml_mapping(d / ROLES_FILE, warnings).items():
            try:
                base_roles[str(name)] = RoleEntry(**r)
            except (TypeError, ValueError) as e:
                warnings.append(f"{d / ROLES_FILE}: role {name!r} skipped ({_first_line(e)})")
    else:
        base_roles = dict(BUILTIN_ROLES)
        warnings.append(f"{d / ROLES_FILE} is missing (deployed by an older build): only the role admin "
                        f"counts as admin; `tidelog deploy` writes it")
    try:
        store = AclStore(d / RUNTIME_ACL_FILE)
    except AclError as e:
        warnings.append(f"{d}: no user imported: {e}")
        return (), {}
    store.bind(base_users, base_roles, None)
    return store.effective()


def _yaml_mapping(path: Path, warnings: list[str]) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        warnings.append(f"{path}: not read ({e})")
        return {}
    if not isinstance(data, dict):
        warnings.append(f"{path}: not a mapping")
        return {}
    return data


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def _users_changed() -> None:
    """A cluster's users changed on this controller: the query servers running here read them
    again (spark_jobs/sqlserver.py refresh_users)."""
    from spark_jobs.sqlserver import refresh_users

    refresh_users()
