"""What every provider offers, and the SSH plumbing the remote ones share."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from infra.credentials import SSHCredentials
from infra.hosts import Host, HostError, SSHHost
from infra.spec import ClusterSpec, NodePlan, check_address


class ProviderError(RuntimeError):
    """A provider cannot do what was asked (no root, no engine, a host unreachable...)."""


class Faults:
    """Network faults for drills, at the level the provider can reach.

    `partition(node, others)`: `node` and `others` stop hearing each other (clients still reach
    `node`); `isolate(node)`: `node` is cut off from everyone, clients included; `heal()` undoes
    every fault this object made.
    """

    def partition(self, node: NodePlan, others: list[NodePlan]) -> None:
        raise NotImplementedError

    def isolate(self, node: NodePlan) -> None:
        raise NotImplementedError

    def heal(self) -> None:
        raise NotImplementedError


class Provider:
    kind = "?"

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self._hosts: dict[str, Host] = {}
        self._credentials: SSHCredentials | None = None

    # --- lifecycle (overridden) --------------------------------------------------------------

    def up(self) -> dict:
        raise NotImplementedError

    def down(self) -> dict:
        raise NotImplementedError

    def faults(self) -> Faults:
        raise NotImplementedError

    # --- hosts -------------------------------------------------------------------------------

    @property
    def inventory_path(self) -> Path:
        return self.spec.state / "inventory.json"

    def save_inventory(self, extra: dict | None = None) -> None:
        self.spec.state.mkdir(parents=True, exist_ok=True)
        inv = {"cluster": self.spec.name, "provider": self.kind,
               "hosts": {h.name: self.spec.address_of(h.name) for h in self.spec.hosts}, **(extra or {})}
        tmp = self.inventory_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(inv, indent=1))
        tmp.replace(self.inventory_path)

    def inventory(self) -> dict:
        try:
            return json.loads(self.inventory_path.read_text())
        except FileNotFoundError:
            return {}

    def hosts(self) -> dict[str, Host]:
        if not self._hosts:
            self._hosts = {h.name: self.make_host(h.name) for h in self.spec.hosts}
        return self._hosts

    def host(self, name: str) -> Host:
        return self.hosts()[name]

    def make_host(self, name: str) -> Host:
        return self.ssh_host(name)

    def ssh_credentials(self) -> SSHCredentials:
        """From the spec, or from the Airflow `ssh` connection it names (read once per provider)."""
        ssh = self.spec.ssh
        if not ssh.connection_id:
            return SSHCredentials(ssh.user, ssh.key)
        if self._credentials is None:
            from infra.credentials import airflow_ssh

            self._credentials = airflow_ssh(ssh.connection_id, self.spec.address_of(self.spec.hosts[0].name), ssh.user)
        return self._credentials

    def known_hosts(self) -> Path | None:
        return self.spec.ssh.known_hosts

    def ssh_host(self, name: str) -> SSHHost:
        h = self.spec.host(name)
        return SSHHost(name, self.spec.address_of(name), credentials=self.ssh_credentials(),
                       port=h.ssh_port or self.spec.ssh.port, known_hosts=self.known_hosts(),
                       accept_new_host_keys=self.spec.ssh.accept_new_host_keys,
                       connect_timeout_s=self.spec.ssh.connect_timeout_s)

    def close(self) -> None:
        for h in self._hosts.values():
            h.close()
        self._hosts = {}

    def status(self) -> dict:
        """Each host: reachable or not (and why), its hostname and Python."""
        out = {"cluster": self.spec.name, "provider": self.kind, "hosts": []}
        for name, host in self.hosts().items():
            row = {"name": name, "address": host.address}
            try:
                r = host.run(f"hostname; {shlex.quote(self.spec.python)} -V", timeout_s=15)
                hostname, py = (r.out.strip().splitlines() + ["", ""])[:2]
                row.update(state="up", hostname=hostname, python=py)
            except HostError as e:
                row.update(state="unreachable", error=str(e))
            out["hosts"].append(row)
        up = sum(r["state"] == "up" for r in out["hosts"])
        out["verdict"] = "up" if up == len(out["hosts"]) else "down" if up == 0 else "partial"
        return out


class GeneratedKeys:
    """For providers that make their hosts: the client key and known_hosts live in the state
    directory unless the spec names its own."""

    spec: ClusterSpec

    @property
    def key_path(self) -> Path:
        return self.spec.ssh.key or self.spec.state / "id_ed25519"

    def known_hosts(self) -> Path:
        return self.spec.ssh.known_hosts or self.spec.state / "known_hosts"

    def ssh_credentials(self) -> SSHCredentials:
        if self.spec.ssh.connection_id:
            return Provider.ssh_credentials(self)
        return SSHCredentials(self.spec.ssh.user, self.key_path)


class SSHFaults(Faults):
    """iptables on the host itself, over SSH (static VMs); SSH's own port is never blocked."""

    CHAIN = "TIDELOG"

    def __init__(self, provider: Provider):
        self.p = provider
        self.touched: set[str] = set()

    @staticmethod
    def iptables(*args: str) -> str:
        """One iptables command line, every argument quoted (addresses come from the spec)."""
        return shlex.join(["iptables", "-w", *map(str, args)])

    def commands(self, rules: list[list[str]]) -> str:
        """The shell line that makes the chain, hooks it into INPUT/OUTPUT once, appends `rules`."""
        ipt, c = self.iptables, self.CHAIN
        setup = (f"{ipt('-N', c)} 2>/dev/null; "
                 f"{ipt('-C', 'INPUT', '-j', c)} 2>/dev/null || {ipt('-I', 'INPUT', '-j', c)}; "
                 f"{ipt('-C', 'OUTPUT', '-j', c)} 2>/dev/null || {ipt('-I', 'OUTPUT', '-j', c)}")
        return "; ".join([setup] + [ipt("-A", c, *r) for r in rules])

    def _ipt(self, host: str, rules: list[list[str]]) -> None:
        self.run(host, self.commands(rules))
        self.touched.add(host)

    def run(self, host: str, command: str) -> None:
        self.p.host(host).run(command, timeout_s=30)

    def partition(self, node: NodePlan, others: list[NodePlan]) -> None:
        rules = []
        for o in others:
            check_address(o.ip)  # the spec checked it; a plan built another way is checked here
            rules += [["-s", o.ip, "-j", "DROP"], ["-d", o.ip, "-j", "DROP"]]
        self._ipt(node.host, rules)

    def isolate(self, node: NodePlan) -> None:
        port = str(int(self.p.spec.host(node.host).ssh_port or self.p.spec.ssh.port))
        self._ipt(node.host, [["-p", "tcp", "--dport", port, "-j", "ACCEPT"],
                              ["-p", "tcp", "--sport", port, "-j", "ACCEPT"],
                              ["-i", "lo", "-j", "ACCEPT"], ["-o", "lo", "-j", "ACCEPT"], ["-j", "DROP"]])

    def heal(self) -> None:
        for host in sorted(self.touched):
            self.run(host, f"{self.iptables('-F', self.CHAIN)} 2>/dev/null || true")
        self.touched.clear()
