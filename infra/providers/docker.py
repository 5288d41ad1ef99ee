"""Provider `docker`: hosts as containers through the Docker SDK, reached over SSH like VMs.

Each host is a container of `docker.image` on a user-defined bridge network with the spec's
subnet and a fixed IP, running sshd with the cluster's key authorized. Where no Docker
engine answers, every command fails with a message saying so (this repository's CI machines
have only the docker CLI, no engine).
"""

from __future__ import annotations

import time

from infra.providers.base import Faults, GeneratedKeys, Provider, ProviderError, SSHFaults
from infra.providers.netns import sh

BOOT = ("set -e; (command -v sshd >/dev/null || (apt-get update -q && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server iptables)); "
        "mkdir -p /run/sshd /root/.ssh; printf '%s\\n' \"$TIDELOG_PUBKEY\" > /root/.ssh/authorized_keys; "
        "ssh-keygen -A; exec /usr/sbin/sshd -D -e")


class DockerProvider(GeneratedKeys, Provider):
    kind = "docker"

    def client(self):
        try:
            import docker
        except ImportError as e:
            raise ProviderError(f"docker provider: the docker SDK is not installed ({e})") from None
        try:
            c = (docker.DockerClient(base_url=self.spec.docker.base_url) if self.spec.docker.base_url
                 else docker.from_env())
            c.ping()
            return c
        except Exception as e:  # noqa: BLE001 - the SDK raises several kinds for "no engine"
            where = self.spec.docker.base_url or "DOCKER_HOST or unix:///var/run/docker.sock"
            raise ProviderError(f"docker provider: no Docker engine answers at {where} ({type(e).__name__}: "
                                f"{str(e)[:200]}); start dockerd, point docker.base_url at one, "
                                f"or use provider netns/static") from None

    def up(self) -> dict:
        import docker

        c = self.client()
        self.spec.state.mkdir(parents=True, exist_ok=True)
        made = []
        if not self.key_path.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.key_path))
        net_name = f"tidelog-{self.spec.name}"
        try:
            net = c.networks.get(net_name)
        except docker.errors.NotFound:
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=self.spec.subnet)])
            net = c.networks.create(net_name, driver="bridge", ipam=ipam)
            made.append(f"network {net_name}")
        pub = self.key_path.with_suffix(".pub").read_text().strip()
        for h in self.spec.hosts:
            name = f"tidelog-{self.spec.name}-{h.name}"
            try:
                c.containers.get(name)
                continue
            except docker.errors.NotFound:
                pass
            ct = c.containers.create(self.spec.docker.image, ["sh", "-c", BOOT], name=name, hostname=h.name,
                                     environment={"TIDELOG_PUBKEY": pub}, cap_add=["NET_ADMIN"], detach=True)
            net.connect(ct, ipv4_address=self.spec.address_of(h.name))
            ct.start()
            made.append(f"container {name}")
        # host keys are generated inside; trust them on first use and pin them in known_hosts
        deadline = time.monotonic() + 180
        for h in self.spec.hosts:
            host = self.ssh_host(h.name)
            host.accept_new, host.known_hosts = True, self.known_hosts()
            while True:
                try:
                    host.run("true", timeout_s=10)
                    break
                except Exception as e:  # noqa: BLE001 - sshd still installing
                    if time.monotonic() > deadline:
                        raise ProviderError(f"container {h.name}: sshd did not come up: {e}") from None
                    time.sleep(1)
            host.close()
        self.save_inventory({"network": net_name, "known_hosts": str(self.known_hosts())})
        return {"cluster": self.spec.name, "provider": self.kind, "made": made,
                "hosts": {h.name: self.spec.address_of(h.name) for h in self.spec.hosts}}

    def down(self) -> dict:
        import shutil

        import docker

        c = self.client()
        removed = []
        for h in self.spec.hosts:
            try:
                c.containers.get(f"tidelog-{self.spec.name}-{h.name}").remove(force=True)
                removed.append(f"container {h.name}")
            except docker.errors.NotFound:
                pass
        try:
            c.networks.get(f"tidelog-{self.spec.name}").remove()
            removed.append("network")
        except docker.errors.NotFound:
            pass
        shutil.rmtree(self.spec.state, ignore_errors=True)
        return {"cluster": self.spec.name, "provider": self.kind, "removed": removed}

    def faults(self) -> Faults:
        return SSHFaults(self)
