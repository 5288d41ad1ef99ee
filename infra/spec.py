"""The cluster spec: one YAML file describing hosts, broker groups and how to reach them.

    name: raft3                      # the cluster (names its state directory, bridge, tables)
    provider: netns                  # local | netns | docker | static
    version: current                 # current (build this tree) | 0.2.0 | path/to/tidelog-*.whl
    install_dir: /srv/tidelog        # on every host: wheels/, versions/<v>/venv, nodes/<id>/
    ssh: {user: root, key: ..., known_hosts: ..., connection_id: ..., accept_new_host_keys: false}
    network: {subnet: 10.231.0.0/24} # local / netns / docker: where hosts get addresses
    hosts: [{name: h1}, {name: h2, address: 10.0.0.12}]
    groups:
      - name: g0
        mode: raft                   # raft | master-slave | standalone (one node, no replication)
        replication: sync            # master-slave: SYNC or ASYNC master
        flush: async                 # when a node fsyncs
        hosts: [h1, h2, h3]          # one node per host; master-slave: the first is the master
        port: 10911                  # client port (ha_port: port + 1 unless given)
        config: {segment_bytes: 67108864}   # any broker config field (README)
    namesrv:                         # optional: name servers every broker registers with
      hosts: [h1, h2]                # one name server per host, id ns-<host>
      port: 9876
      config: {broker_expire_ms: 120000}   # any name-server config field (README)

Validated on load: an error names the field (`groups[0].hosts[2]: no host 'h4'`). Values that
end up in commands on the hosts are what their field says and nothing more: host addresses are
IP addresses or DNS names, ssh.user a POSIX user name, python an interpreter name or absolute
path, install_dir an absolute path without shell characters, network.bridge an interface name,
docker.image an image reference (and the commands quote them all the same). The spec
also derives every node's plan (id, addresses, directories, broker config), so deploy,
status, drills and collection all agree on where things are.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from broker import config as broker_config

NAME = r"^[a-z0-9][a-z0-9-]{0,30}$"  # also used in bridge/namespace names: keep it short

# Spec values end up in commands run as root on the hosts (ops/nodes.py, providers/base.py).
# Every command quotes them (shlex.quote / argument lists); these patterns are the second wall:
# a value that is not what its field says (an address, a user name, a path) is refused at load.
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")  # RFC 1123 hostname label
_SCOPE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")                          # fe80::1%eth0
USER = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")                   # POSIX portable user name
PYTHON = re.compile(r"^(?:/[\w.+-]+)+$|^[A-Za-z0-9][\w.+-]*$")        # python3.11 or /abs/path
IFNAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}$")              # a kernel interface name
# an install path: absolute, and nothing a shell would act on ({host} is a placeholder)
INSTALL_PATH = re.compile(r"^/[\w ./+,=@%:~-]*$")
VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}$")            # PEP 440-ish, or current
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?"
_PATHC = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(rf"^(?:{_DOMAIN}/)?{_PATHC}(?:/{_PATHC})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?"
                   r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")


def _no_control(v: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in v):
        raise ValueError(f"{what} must not contain newlines or other control characters")
    return v


def check_address(v: str) -> str:
    """An IP address (IPv4, IPv6, IPv6 with an interface scope) or a DNS host name; else ValueError."""
    if not v or len(v) > 253:
        raise ValueError("must be an IP address or a DNS host name (1-253 characters)")
    bad = ("must be an IP address (10.0.1.11, fd00::11) or a DNS host name (vm1.example.com: letters, "
           "digits, hyphens and dots, labels of 1-63 characters not starting or ending with a "
           "hyphen); nothing else (no spaces, quotes, ;, $ or other shell characters)")
    try:
        ip = ipaddress.ip_address(v)
    except ValueError:
        ip = None
    if ip is not None:
        scope = getattr(ip, "scope_id", None)
        if scope is not None and not _SCOPE.fullmatch(scope):
            raise ValueError(bad)
        return v
    labels = v.removesuffix(".").split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        raise ValueError(bad)
    if labels[-1].isdigit():  # 10.0.0.256 is not a host name, and not an address either
        raise ValueError(f"{v!r} is not a valid IP address; it " + bad)
    return v


def _control_free_path(v: Path | None, what: str) -> Path | None:
    if v is not None:
        _no_control(str(v), what)
    return v
STATE_ROOT = Path(os.environ.get("TIDELOG_STATE_DIR", "~/.tidelog/clusters")).expanduser()


class SpecError(ValueError):
    """A problem with a cluster spec, worded for the operator (names the file and field)."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SSHSpec(_Model):
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    key: Path | None = None              # private key file; netns: generated when omitted
    connection_id: str | None = None     # an Airflow SSH connection holding user/key instead
    known_hosts: Path | None = None      # netns: written by `infra up`; static: required
    accept_new_host_keys: bool = False   # never trust an unknown host key unless told to
    connect_timeout_s: float = Field(10.0, gt=0, le=300)

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not USER.fullmatch(v):
            raise ValueError("must be a POSIX user name (root, tidelog: letters, digits, _ . -, up to 32 "
                             "characters, not starting with a digit, - or .)")
        return v

    @field_validator("key", "known_hosts")
    @classmethod
    def _paths(cls, v: Path | None) -> Path | None:
        return _control_free_path(v, "a file path")

    @field_validator("connection_id")
    @classmethod
    def _conn_id(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[\w.-]{1,250}", v):
            raise ValueError("must be an Airflow connection id (letters, digits, _ . -)")
        return v


class NetworkSpec(_Model):
    subnet: str = "10.231.0.0/24"        # local: 127.0.0.0/24; hosts get .11, .12, ...
    bridge: str | None = None            # netns: default tl-<name>

    @field_validator("subnet")
    @classmethod
    def _subnet(cls, v: str) -> str:
        net = ipaddress.ip_network(v, strict=True)
        if net.version != 4 or net.prefixlen > 26:
            raise ValueError("an IPv4 network of /26 or larger")
        return v

    @field_validator("bridge")
    @classmethod
    def _bridge(cls, v: str | None) -> str | None:
        if v is not None and (not IFNAME.fullmatch(v) or v in (".", "..")):
            raise ValueError("must be a network interface name: 1-15 characters of letters, digits, _ . - "
                             "(not starting with - or .), e.g. tl-raft3")
        return v


class DockerSpec(_Model):
    image: str = "python:3.11-slim"      # must have python3.11 and an sshd, or get one
    base_url: str | None = None          # default: DOCKER_HOST or the local socket

    @field_validator("image")
    @classmethod
    def _image(cls, v: str) -> str:
        if len(v) > 255 or not IMAGE.fullmatch(v):
            raise ValueError("must be a Docker image reference ([registry[:port]/]name[:tag][@digest], e.g. "
                             "python:3.11-slim or registry.example.com:5000/team/img:1.2)")
        return v

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, v: str | None) -> str | None:
        return v if v is None else _no_control(v, "base_url")


class HostSpec(_Model):
    name: str = Field(pattern=NAME)
    address: str | None = None           # static: required; others: assigned from network.subnet
    ssh_port: int | None = Field(None, ge=1, le=65535)

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None) -> str | None:
        return v if v is None else check_address(v)


class GroupSpec(_Model):
    name: str = Field("g0", pattern=NAME)
    mode: Literal["raft", "master-slave", "standalone"] = "raft"
    replication: Literal["sync", "async"] = "sync"
    flush: Literal["async", "sync"] = "async"
    hosts: list[str] = Field(min_length=1, max_length=9)
    port: int = Field(10911, ge=1, le=65535)
    ha_port: int | None = Field(None, ge=1, le=65535)
    config: dict = Field(default_factory=dict)

    @field_validator("config")
    @classmethod
    def _no_derived(cls, v: dict) -> dict:
        derived = {"mode", "node_id", "peers", "listen", "data_dir", "role", "ha_replication", "flush",
                   "broker_name"} & set(v)
        if derived:
            raise ValueError(f"{sorted(derived)} come from the group itself, not from config")
        return v


class NamesrvSpec(_Model):
    """Name servers (docs/design/name-server.md §9): with this section every broker node
    registers with all of them (namesrv_addresses), under cluster_name = the spec's name and
    broker_name = its group's name."""
    hosts: list[str] = Field(min_length=1, max_length=9)
    port: int = Field(9876, ge=1, le=65535)
    config: dict = Field(default_factory=dict)

    @field_validator("config")
    @classmethod
    def _no_derived(cls, v: dict) -> dict:
        derived = {"listen", "namesrv_id", "tls", "users", "roles", "insecure", "log_file",
                   "pid_file"} & set(v)
        if derived:
            raise ValueError(f"{sorted(derived)} come from the spec (hosts, port, security), not from config")
        return v


class UserSpec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    roles: list[str] = Field(default_factory=list)


class SecuritySpec(_Model):
    """TLS on every port, SCRAM users and roles (ops/security.py makes the CA, certificates and
    passwords in the state directory). An `admin` user with the admin role always exists."""
    insecure: bool = False               # no TLS, no authentication: the brokers warn at every start
    connection_id: str | None = Field(None, pattern=r"^[\w.-]+$")  # an Airflow connection holding the
                                         # client credentials (login, password, extra ca_file) for ops
    users: list[UserSpec] = Field(default_factory=list)
    roles: dict[str, broker_config.RoleEntry] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known_roles(self) -> SecuritySpec:
        names = {"admin", *self.roles}
        for i, u in enumerate(self.users):
            bad = [r for r in u.roles if r not in names]
            if bad:
                raise ValueError(f"users[{i}] ({u.name}): roles {bad} are not defined in security.roles "
                                 f"(defined: {sorted(names)})")
            if u.name == "admin":
                raise ValueError("users: 'admin' is always there (with the admin role); name others")
        return self


class HealthSpec(_Model):
    lag_entries_max: int = Field(1000, ge=0)     # raft: a follower this far behind is not caught up
    lag_bytes_max: int = Field(1 << 20, ge=0)    # master-slave: same, in bytes
    timeout_s: float = Field(60.0, gt=0)         # deploy/upgrade wait this long for health


class ClusterSpec(_Model):
    name: str = Field(pattern=NAME)
    provider: Literal["local", "netns", "docker", "static"]
    version: str = "current"
    install_dir: str | None = None       # default: /srv/tidelog (local: under the state dir)
    python: str = "python3.11"           # the interpreter on each host that makes the venvs
    wheels_dir: Path | None = None       # where `--version X` finds tidelog-X-*.whl (default dist/)
    state_dir: Path | None = None        # controller side: keys, known_hosts, inventory
    ssh: SSHSpec = SSHSpec()
    network: NetworkSpec = NetworkSpec()
    docker: DockerSpec = DockerSpec()
    health: HealthSpec = HealthSpec()
    security: SecuritySpec = SecuritySpec()
    hosts: list[HostSpec] = Field(min_length=1, max_length=50)
    groups: list[GroupSpec] = Field(min_length=1)
    namesrv: NamesrvSpec | None = None

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v.endswith(".whl"):
            return _no_control(v, "a wheel path")
        if not VERSION.fullmatch(v):
            raise ValueError("must be current, a version (0.2.0: letters, digits, . + _ -) or a path to a "
                             "tidelog-*.whl")
        return v

    @field_validator("install_dir")
    @classmethod
    def _install_dir(cls, v: str | None) -> str | None:
        if v is not None and not INSTALL_PATH.fullmatch(v.replace("{host}", "h")):
            raise ValueError("must be an absolute path (/srv/tidelog) of letters, digits, spaces and . _ - + , = "
                             "@ % : ~ / (and {host} for the host's name); no quotes, $, ;, |, &, "
                             "backticks, brackets, globs or control characters")
        return v

    @field_validator("python")
    @classmethod
    def _python(cls, v: str) -> str:
        if not PYTHON.fullmatch(v):
            raise ValueError("must be an interpreter name (python3.11) or an absolute path to one "
                             "(/usr/bin/python3.11): letters, digits, . _ + - and /")
        return v

    @field_validator("wheels_dir", "state_dir")
    @classmethod
    def _dirs(cls, v: Path | None) -> Path | None:
        return _control_free_path(v, "a directory path")

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        names = [h.name for h in self.hosts]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"hosts: names must be unique (repeated: {sorted(dup)})")
        gnames = [g.name for g in self.groups]
        if len(set(gnames)) != len(gnames):
            raise ValueError("groups: names must be unique")
        used: dict[tuple[str, int], str] = {}
        for gi, g in enumerate(self.groups):
            for hi, h in enumerate(g.hosts):
                if h not in names:
                    near = difflib.get_close_matches(h, names, n=1)
                    hint = f" (did you mean '{near[0]}'?)" if near else ""
                    raise ValueError(f"groups[{gi}].hosts[{hi}]: no host '{h}' in hosts{hint}")
            if len(set(g.hosts)) != len(g.hosts):
                raise ValueError(f"groups[{gi}].hosts: one node per host")
            if g.mode == "standalone" and len(g.hosts) != 1:
                raise ValueError(f"groups[{gi}].hosts: a standalone group runs one node (one host)")
            ports = [g.port] + ([g.ha_port or g.port + 1] if g.mode == "master-slave" else [])
            for h in g.hosts:
                for p in ports:
                    if (h, p) in used:
                        raise ValueError(f"groups[{gi}]: port {p} on host {h} is already used by "
                                         f"group {used[(h, p)]}")
                    used[(h, p)] = g.name
        if self.namesrv is not None:
            ns = self.namesrv
            for hi, h in enumerate(ns.hosts):
                if h not in names:
                    near = difflib.get_close_matches(h, names, n=1)
                    hint = f" (did you mean '{near[0]}'?)" if near else ""
                    raise ValueError(f"namesrv.hosts[{hi}]: no host '{h}' in hosts{hint}")
                if (h, ns.port) in used:
                    raise ValueError(f"namesrv.port: port {ns.port} on host {h} is already used by group "
                                     f"{used[(h, ns.port)]} (pick another namesrv.port)")
            if len(set(ns.hosts)) != len(ns.hosts):
                raise ValueError("namesrv.hosts: one name server per host")
            for gi, g in enumerate(self.groups):
                own = {"namesrv_addresses", "cluster_name"} & set(g.config)
                if own:
                    raise ValueError(f"groups[{gi}].config: {sorted(own)} come from the namesrv section "
                                     f"and the spec's name, not from config")
        if self.provider == "static":
            for i, h in enumerate(self.hosts):
                if not h.address:
                    raise ValueError(f"hosts[{i}].address: a static host needs its address")
            if self.ssh.known_hosts is None and not self.ssh.accept_new_host_keys:
                raise ValueError("ssh.known_hosts: a static inventory needs a known_hosts file "
                                 "(or ssh.accept_new_host_keys: true, which trusts on first use)")
        if self.provider in ("local", "netns", "docker"):
            net = ipaddress.ip_network(self.subnet)
            if len(self.hosts) > net.num_addresses - 20:
                raise ValueError(f"network.subnet {net} is too small for {len(self.hosts)} hosts")
        return self

    # --- derived ----------------------------------------------------------------------------

    @property
    def subnet(self) -> str:
        if self.provider == "local" and "subnet" not in self.network.model_fields_set:
            return "127.0.0.0/24"
        return self.network.subnet

    @property
    def state(self) -> Path:
        return Path(self.state_dir or STATE_ROOT / self.name).expanduser().resolve()

    @property
    def install_root(self) -> str:
        if self.install_dir:
            return self.install_dir
        return str(self.state / "hosts" / "{host}") if self.provider == "local" else "/srv/tidelog"

    def install_dir_of(self, host: str) -> str:
        return self.install_root.replace("{host}", host)

    def host(self, name: str) -> HostSpec:
        return next(h for h in self.hosts if h.name == name)

    def address_of(self, name: str) -> str:
        h = self.host(name)
        if h.address:
            return h.address
        net = ipaddress.ip_network(self.subnet)
        return str(net.network_address + 11 + [x.name for x in self.hosts].index(name))

    def group(self, name: str | None = None) -> GroupSpec:
        if name is None:
            return self.groups[0]
        for g in self.groups:
            if g.name == name:
                return g
        raise SpecError(f"no group {name!r} in the spec (groups: {[g.name for g in self.groups]})")

    def nodes(self, group: str | None = None) -> list[NodePlan]:
        groups = self.groups if group is None else [self.group(group)]
        return [NodePlan(self, g, h) for g in groups for h in g.hosts]

    def node(self, node_id: str) -> NodePlan:
        for n in self.nodes():
            if n.id == node_id or n.host == node_id:
                return n
        raise SpecError(f"no node {node_id!r} (nodes: {[n.id for n in self.nodes()]})")

    def namesrvs(self) -> list[NodePlan]:
        """The name servers' plans (none without a namesrv section); not in nodes()."""
        return [] if self.namesrv is None else [NodePlan(self, None, h, kind="namesrv")
                                                for h in self.namesrv.hosts]

    @property
    def namesrv_addresses(self) -> list[str]:
        return [p.address for p in self.namesrvs()]


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class NodePlan:
    """Where one node lives and how it is configured (derived from the spec, never stored).
    `kind` broker: a node of `group`; namesrv: a name server (group None, id ns-<host>)."""

    def __init__(self, spec: ClusterSpec, group: GroupSpec | None, host: str,
                 kind: Literal["broker", "namesrv"] = "broker"):
        self.spec, self.group, self.host, self.kind = spec, group, host, kind
        self.ip = spec.address_of(host)
        self.ha_address = None
        if kind == "namesrv":
            self.id = f"ns-{host}"
            self.address = _join(self.ip, spec.namesrv.port)
        else:
            # a node's id is its host's name when it is the only group; else group-host
            self.id = host if len(spec.groups) == 1 else f"{group.name}-{host}"
            self.address = _join(self.ip, group.port)
            if group.mode == "master-slave":
                self.ha_address = _join(self.ip, group.ha_port or group.port + 1)
        self.home = f"{spec.install_dir_of(host)}/nodes/{self.id}"
        self.data_dir = f"{self.home}/data"
        self.config_file = f"{self.home}/{kind}.yaml"    # broker.yaml | namesrv.yaml
        self.log_file = f"{self.home}/{kind}.log"

    def __repr__(self) -> str:
        return f"NodePlan({self.id}@{self.address})"

    def config(self, fault_injection: bool = False) -> dict:
        """The process's config without its security fields (ops/security.py adds those)."""
        return self.namesrv_config() if self.kind == "namesrv" else self.broker_config(fault_injection)

    def namesrv_config(self) -> dict:
        cfg = {"listen": self.address, "namesrv_id": self.id, "log_file": self.log_file,
               "pid_file": f"{self.home}/namesrv.pid"}
        cfg.update(self.spec.namesrv.config)
        return cfg

    def peers(self) -> list[NodePlan]:
        return [NodePlan(self.spec, self.group, h) for h in self.group.hosts]

    def broker_config(self, fault_injection: bool = False) -> dict:
        g = self.group
        cfg = {"broker_name": f"{self.spec.name}-{g.name}", "listen": self.address,
               "data_dir": self.data_dir, "mode": g.mode, "flush": g.flush, "node_id": self.id,
               "log_file": self.log_file}
        if self.spec.namesrv is not None:
            # the name servers (and `topic create --groups g0,g1`) know a group by broker_name
            cfg.update(broker_name=g.name, cluster_name=self.spec.name,
                       namesrv_addresses=self.spec.namesrv_addresses)
        peers = []
        for p in self.peers():
            peer = {"id": p.id, "address": p.address}
            if p.ha_address:
                peer["ha_address"] = p.ha_address
            peers.append(peer)
        cfg["peers"] = peers
        if g.mode == "master-slave":
            cfg["role"] = "master" if self.host == g.hosts[0] else "slave"
            cfg["ha_replication"] = g.replication
            cfg.setdefault("in_sync_replicas", min(2, len(g.hosts)))
        if fault_injection:
            cfg["fault_injection"] = True
        cfg.update(g.config)
        return cfg


def from_dict(data, source: str = "spec") -> ClusterSpec:
    if not isinstance(data, dict):
        raise SpecError(f"{source}: expected a mapping, got {type(data).__name__}")
    try:
        spec = ClusterSpec(**data)
    except ValidationError as e:
        raise SpecError(broker_config.describe_errors(e, source, ClusterSpec.model_fields)) from None
    for gi, g in enumerate(spec.groups):  # every node's broker config must itself be valid
        for n in spec.nodes(g.name):
            try:
                # the security fields come from ops/security.py at deploy time
                broker_config.from_dict({**n.broker_config(), "insecure": True}, f"{source}: groups[{gi}].config")
            except broker_config.ConfigError as e:
                raise SpecError(str(e)) from None
            break
    if spec.namesrv is not None:  # and so must every name server's
        from broker.namesrv import config as namesrv_config
        for n in spec.namesrvs():
            try:
                namesrv_config.from_dict({**n.namesrv_config(), "insecure": True}, f"{source}: namesrv.config")
            except broker_config.ConfigError as e:
                raise SpecError(str(e)) from None
            break
    return spec


def load(path: Path | str) -> ClusterSpec:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as e:
        raise SpecError(f"{path}: cannot read the spec: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{path}: not valid YAML: {e}") from None
    base = path.parent.resolve()
    if isinstance(data, dict):  # relative paths in a spec are relative to the spec file
        for sect, key in (("ssh", "key"), ("ssh", "known_hosts"), (None, "wheels_dir"), (None, "state_dir")):
            d = data.get(sect) if sect else data
            if isinstance(d, dict) and isinstance(d.get(key), str) and not d[key].startswith(("/", "~")):
                d[key] = str(base / d[key])
        if isinstance(data.get("version"), str) and data["version"].endswith(".whl") \
                and not data["version"].startswith(("/", "~")):
            data["version"] = str(base / data["version"])
    return from_dict(data, str(path))


def short(name: str, limit: int = 15) -> str:
    """A kernel interface name (<= 15 chars) for `name`."""
    s = re.sub(r"[^a-z0-9-]", "", name.lower())
    return s[:limit]
