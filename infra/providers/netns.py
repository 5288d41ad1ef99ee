"""Provider `netns`: hosts as Linux network namespaces on a private bridge, each with its own
IP, hostname, private /srv and sshd — real SSH and real network faults on one machine.

    root namespace:  bridge tl-<hash> with <subnet>.1
    host h:          namespace tl-<cluster>-<h>, veth eth0 <subnet>.(11+i), default route
                     via the bridge, sshd on :22 started under `unshare --uts --mount` with
                     hostname h and <state>/hosts/h/srv bind-mounted on /srv

`infra up` generates the client key and each host's host key under the cluster's state
directory and writes a known_hosts file with exactly those keys, so deploy checks host keys
with RejectPolicy like against real VMs. Needs root; installs openssh-server and iptables
with apt-get when missing. The bridge's traffic is allowed explicitly in the root namespace's
FORWARD chain, so the hosts still reach each other where dockerd runs (it sets FORWARD's policy
to DROP and turns bridge netfilter on). `infra down` kills everything in the namespaces and
removes the namespaces, the bridge, those FORWARD rules and the state directory.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from infra.providers.base import Faults, GeneratedKeys, Provider, ProviderError
from infra.spec import NodePlan

PACKAGES = {"sshd": ("/usr/sbin/sshd", "openssh-server"), "iptables": ("/usr/sbin/iptables", "iptables")}


def sh(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(list(args), capture_output=True, text=True)
    if check and p.returncode != 0:
        raise ProviderError(f"`{' '.join(args)}` failed ({p.returncode}): {(p.stderr or p.stdout).strip()}")
    return p


def ensure_packages() -> list[str]:
    """apt-get install what is missing; the packages installed."""
    missing = [pkg for path, pkg in PACKAGES.values() if not Path(path).exists()]
    if not missing:
        return []
    if not shutil.which("apt-get"):
        raise ProviderError(f"netns provider: {missing} missing and no apt-get to install them")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:  # stale package lists: refresh once
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise ProviderError(f"netns provider: apt-get install {' '.join(missing)} failed: "
                            f"{p.stderr.strip()[-500:]}")
    return missing


class NetnsProvider(GeneratedKeys, Provider):
    kind = "netns"

    # --- names -------------------------------------------------------------------------------

    def _tag(self, *parts: str) -> str:
        return hashlib.sha1("/".join((self.spec.name, *parts)).encode()).hexdigest()[:8]

    @property
    def bridge(self) -> str:
        return self.spec.network.bridge or f"tl-{self._tag('bridge')}"

    def ns(self, host: str) -> str:
        return f"tl-{self.spec.name}-{host}"

    def veth(self, host: str) -> str:
        return f"tlv{self._tag(host)}"

    def host_dir(self, host: str) -> Path:
        return self.spec.state / "hosts" / host

    # --- up ----------------------------------------------------------------------------------

    def _require_root(self) -> None:
        if os.geteuid() != 0:
            raise ProviderError("the netns provider needs root (network namespaces, a bridge, sshd); "
                                "run as root or use provider: local")

    def up(self) -> dict:
        self._require_root()
        made = [f"installed {p}" for p in ensure_packages()]
        state = self.spec.state
        state.mkdir(parents=True, exist_ok=True)
        if not self.key_path.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"tidelog@{self.spec.name}",
               "-f", str(self.key_path))
            made.append(f"client key {self.key_path}")
        authorized = state / "authorized_keys"
        authorized.write_text(Path(str(self.key_path) + ".pub").read_text())
        net = ipaddress.ip_network(self.spec.subnet)
        gw = f"{net.network_address + 1}/{net.prefixlen}"
        if sh("ip", "link", "show", self.bridge, check=False).returncode != 0:
            sh("ip", "link", "add", self.bridge, "type", "bridge")
            sh("ip", "addr", "add", gw, "dev", self.bridge)
            made.append(f"bridge {self.bridge} {gw}")
        sh("ip", "link", "set", self.bridge, "up")
        made += self._allow_forward()
        Path("/run/sshd").mkdir(exist_ok=True)
        known = []
        for h in self.spec.hosts:
            made += self._host_up(h.name, net.prefixlen, str(net.network_address + 1))
            pub = (self.host_dir(h.name) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            port = h.ssh_port or self.spec.ssh.port
            addr = self.spec.address_of(h.name)
            known.append(f"{addr if port == 22 else f'[{addr}]:{port}'} {' '.join(pub)}")
        self.known_hosts().write_text("\n".join(known) + "\n")
        for h in self.spec.hosts:
            self._wait_ssh(h.name)
        self.save_inventory({"bridge": self.bridge, "known_hosts": str(self.known_hosts()),
                             "key": str(self.key_path)})
        return {"cluster": self.spec.name, "provider": self.kind, "made": made,
                "hosts": {h.name: self.spec.address_of(h.name) for h in self.spec.hosts},
                "known_hosts": str(self.known_hosts()), "key": str(self.key_path)}

    def _forward_rules(self) -> list[list[str]]:
        # only frames between two ports of the bridge: nothing routed in from other interfaces
        return [["-i", self.bridge, "-o", self.bridge, "-j", "ACCEPT"]]

    def _allow_forward(self) -> list[str]:
        """Let the bridge's own traffic through the root namespace's FORWARD chain. With bridge
        netfilter on (net.bridge.bridge-nf-call-iptables=1), frames between two ports of one
        bridge go through FORWARD; dockerd turns that on and sets FORWARD's policy to DROP,
        which silently cuts every namespace host off from the others. Idempotent (-C first);
        `down` removes exactly these rules."""
        made = []
        for rule in self._forward_rules():
            if sh("iptables", "-w", "-C", "FORWARD", *rule, check=False).returncode != 0:
                sh("iptables", "-w", "-I", "FORWARD", *rule)
                made.append(f"iptables FORWARD {' '.join(rule)}")
        return made

    def _disallow_forward(self) -> list[str]:
        removed = []
        wider = [["-i", self.bridge, "-j", "ACCEPT"], ["-o", self.bridge, "-j", "ACCEPT"]]  # an older release's
        for rule in self._forward_rules() + wider:
            while sh("iptables", "-w", "-C", "FORWARD", *rule, check=False).returncode == 0:
                sh("iptables", "-w", "-D", "FORWARD", *rule, check=False)
                removed.append(f"iptables FORWARD {' '.join(rule)}")
        return removed

    def _host_up(self, host: str, prefixlen: int, gateway: str) -> list[str]:
        made = []
        ns, veth, d = self.ns(host), self.veth(host), self.host_dir(host)
        (d / "srv").mkdir(parents=True, exist_ok=True)
        if not Path(f"/run/netns/{ns}").exists():
            sh("ip", "netns", "add", ns)
            made.append(f"namespace {ns}")
        if sh("ip", "link", "show", veth, check=False).returncode != 0:
            sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{self.spec.address_of(host)}/{prefixlen}", "dev", "eth0")
            made.append(f"veth {veth} -> {ns}:eth0 {self.spec.address_of(host)}")
        sh("ip", "link", "set", veth, "master", self.bridge, "up")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "route", "replace", "default", "via", gateway)
        hostkey = d / "ssh_host_ed25519_key"
        if not hostkey.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host}@{self.spec.name}",
               "-f", str(hostkey))
        pidfile = d / "sshd.pid"
        if self._alive(pidfile):
            return made
        port = self.spec.host(host).ssh_port or self.spec.ssh.port
        (d / "sshd_config").write_text("\n".join([
            f"Port {port}", f"ListenAddress {self.spec.address_of(host)}", f"HostKey {hostkey}",
            f"PidFile {pidfile}", f"AuthorizedKeysFile {self.spec.state / 'authorized_keys'}",
            "PermitRootLogin prohibit-password", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "StrictModes no", "UsePAM no", "UseDNS no",
            "Subsystem sftp internal-sftp", "MaxSessions 64", "MaxStartups 64:30:128", ""]))
        # own hostname and a private /srv, then sshd (it daemonizes and writes its pid file)
        sh("ip", "netns", "exec", ns, "unshare", "--uts", "--mount", "--propagation", "private",
           "sh", "-c", self.sshd_inner(host, d))
        made.append(f"sshd {host} on {self.spec.address_of(host)}:{port}")
        return made

    @staticmethod
    def sshd_inner(host: str, d: Path) -> str:
        """The shell line run in the host's namespace: its hostname, its /srv, then sshd (the
        state directory comes from the spec: every word is quoted)."""
        q = shlex.quote
        return (f"hostname {q(host)} && mount --bind {q(str(d / 'srv'))} /srv && "
                f"exec /usr/sbin/sshd -f {q(str(d / 'sshd_config'))} -E {q(str(d / 'sshd.log'))}")

    @staticmethod
    def _alive(pidfile: Path) -> bool:
        try:
            pid = int(pidfile.read_text())
            os.kill(pid, 0)
            return True
        except (OSError, ValueError):
            return False

    def _wait_ssh(self, host: str, timeout_s: float = 10.0) -> None:
        addr = self.spec.address_of(host)
        port = self.spec.host(host).ssh_port or self.spec.ssh.port
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((addr, port), timeout=1).close()
                return
            except OSError as e:
                if time.monotonic() > deadline:
                    log = (self.host_dir(host) / "sshd.log")
                    tail = log.read_text()[-500:] if log.exists() else ""
                    raise ProviderError(f"sshd on {host} ({addr}:{port}) does not answer: {e}; {tail}") from None
                time.sleep(0.05)

    # --- down --------------------------------------------------------------------------------

    def down(self) -> dict:
        self._require_root()
        removed = []
        for h in self.spec.hosts:
            ns = self.ns(h.name)
            if Path(f"/run/netns/{ns}").exists():
                pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
                for pid in pids:  # sshd, brokers, anything a deploy left running in there
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, ValueError):
                        pass
                sh("ip", "netns", "del", ns, check=False)
                removed.append(f"namespace {ns} ({len(pids)} processes killed)")
            if sh("ip", "link", "show", self.veth(h.name), check=False).returncode == 0:
                sh("ip", "link", "del", self.veth(h.name), check=False)
        if sh("ip", "link", "show", self.bridge, check=False).returncode == 0:
            sh("ip", "link", "del", self.bridge)
            removed.append(f"bridge {self.bridge}")
        if shutil.which("iptables"):
            removed += self._disallow_forward()
        if self.spec.state.exists():
            shutil.rmtree(self.spec.state)
            removed.append(str(self.spec.state))
        return {"cluster": self.spec.name, "provider": self.kind, "removed": removed}

    def status(self) -> dict:
        missing = [h.name for h in self.spec.hosts if not Path(f"/run/netns/{self.ns(h.name)}").exists()]
        if len(missing) < len(self.spec.hosts):
            return super().status()  # made (at least partly): ask each host over SSH
        return {"cluster": self.spec.name, "provider": self.kind, "verdict": "down",
                "hosts": [{"name": h.name, "address": self.spec.address_of(h.name), "state": "absent",
                           "error": f"namespace {self.ns(h.name)} does not exist (tidelog infra up makes it)"}
                          for h in self.spec.hosts]}

    def faults(self) -> Faults:
        return NetnsFaults(self)


class NetnsFaults(Faults):
    """iptables inside the namespaces, run from the root namespace (so an isolated host
    can still be healed: its own SSH is cut too)."""

    CHAIN = "TIDELOG"

    def __init__(self, provider: NetnsProvider):
        self.p = provider
        self.touched: set[str] = set()
        self.links_down: set[str] = set()

    def _ipt(self, host: str, *rule: str) -> None:
        ns = self.p.ns(host)
        if host not in self.touched:
            sh("ip", "netns", "exec", ns, "iptables", "-w", "-N", self.CHAIN, check=False)
            for chain in ("INPUT", "OUTPUT"):
                if sh("ip", "netns", "exec", ns, "iptables", "-w", "-C", chain, "-j", self.CHAIN,
                      check=False).returncode != 0:
                    sh("ip", "netns", "exec", ns, "iptables", "-w", "-I", chain, "-j", self.CHAIN)
            self.touched.add(host)
        sh("ip", "netns", "exec", ns, "iptables", "-w", "-A", self.CHAIN, *rule)

    def partition(self, node: NodePlan, others: list[NodePlan]) -> None:
        for o in others:
            self._ipt(node.host, "-s", o.ip, "-j", "DROP")
            self._ipt(node.host, "-d", o.ip, "-j", "DROP")

    def isolate(self, node: NodePlan) -> None:
        sh("ip", "link", "set", self.p.veth(node.host), "down")  # the host's cable, pulled
        self.links_down.add(node.host)

    def heal(self) -> None:
        for host in sorted(self.links_down):
            sh("ip", "link", "set", self.p.veth(host), "up")
        for host in sorted(self.touched):
            sh("ip", "netns", "exec", self.p.ns(host), "iptables", "-w", "-F", self.CHAIN, check=False)
        self.links_down.clear()
        self.touched.clear()
