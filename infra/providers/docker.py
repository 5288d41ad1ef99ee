"""Provider `docker`: hosts as containers through the Docker SDK, reached over SSH like VMs.

    network tidelog-<cluster>:  a user-defined bridge with the spec's subnet
    host h:                     container tidelog-<cluster>-<h> (label tidelog.cluster=<cluster>),
                                hostname h, IP <subnet>.(11+i), NET_ADMIN (drill partitions are
                                iptables inside the container, over SSH), sshd as its only service

Nothing is bind-mounted: a container is a separate machine with its own filesystem, and deploy
ships the Tidelog wheel and its dependency wheels over SFTP like to a VM (ops/nodes.py), then
builds a venv with the image's python3.11 offline (`pip --no-index`). The image must carry
python3.11 with venv, and preferably sshd, iptables and procps: `tidelog-base:bookworm`
(infra/docker_image.py builds it from Debian packages where no registry is reachable). An image
without sshd gets it with apt-get at first boot (needs a package mirror).

Like the netns provider, `infra up` generates the client key and each host's SSH host key under
the cluster's state directory, copies them into the container before it starts (with an sshd
config of ours), and writes a known_hosts file with exactly those keys: deploy checks host keys
with RejectPolicy, never trust on first use. Where no Docker engine answers, every command fails
with a message saying so. `infra down` removes the containers, the network and the state.
"""

from __future__ import annotations

import io
import shlex
import shutil
import tarfile
import time
from pathlib import Path

from infra.hosts import HostKeyError
from infra.providers.base import Faults, GeneratedKeys, Provider, ProviderError, SSHFaults
from infra.providers.netns import sh

CONF_DIR = "/etc/tidelog"  # in the container: our sshd config, host key, authorized keys
LABEL = "tidelog.cluster"
SSH_UP_TIMEOUT_S = 180     # an image without sshd installs it at first boot
# sshd is the container's main process; an image without it installs it first (needs a mirror)
BOOT = ("set -e; if [ ! -x /usr/sbin/sshd ]; then apt-get update -q && DEBIAN_FRONTEND=noninteractive "
        "apt-get install -y -q --no-install-recommends openssh-server iptables procps; fi; "
        f"mkdir -p /run/sshd; exec /usr/sbin/sshd -D -e -f {CONF_DIR}/sshd_config")


def _tar(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar archive of {path: (content, mode)} under CONF_DIR, owned by root."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        d = tarfile.TarInfo(CONF_DIR.lstrip("/"))
        d.type, d.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(d)
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(f"{CONF_DIR.lstrip('/')}/{name}")
            info.size, info.mode, info.mtime = len(data), mode, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


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

    # --- names -------------------------------------------------------------------------------

    @property
    def network_name(self) -> str:
        return f"tidelog-{self.spec.name}"

    def container_name(self, host: str) -> str:
        return f"tidelog-{self.spec.name}-{host}"

    def host_dir(self, host: str) -> Path:
        return self.spec.state / "hosts" / host

    def ssh_port(self, host: str) -> int:
        return self.spec.host(host).ssh_port or self.spec.ssh.port

    # --- up ----------------------------------------------------------------------------------

    def up(self) -> dict:
        c = self.client()  # first: a missing SDK or no engine is a ProviderError saying so
        import docker

        try:
            return self._up(c, docker)
        except docker.errors.DockerException as e:  # the engine refused something: say what
            raise ProviderError(f"docker provider: {type(e).__name__}: {str(e)[:500]}") from None

    def _up(self, c, docker) -> dict:
        self.spec.state.mkdir(parents=True, exist_ok=True)
        made = []
        if not self.key_path.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"tidelog@{self.spec.name}",
               "-f", str(self.key_path))
            made.append(f"client key {self.key_path}")
        self._image(c, docker)
        try:
            net = c.networks.get(self.network_name)
        except docker.errors.NotFound:
            ipam = docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=self.spec.subnet)])
            try:
                net = c.networks.create(self.network_name, driver="bridge", ipam=ipam,
                                        labels={LABEL: self.spec.name})
            except docker.errors.APIError as e:
                raise ProviderError(f"docker network {self.network_name} ({self.spec.subnet}): {e.explanation or e}; "
                                    f"pick another network.subnet if it overlaps a network in use") from None
            made.append(f"network {self.network_name} {self.spec.subnet}")
        if ((net.attrs.get("IPAM") or {}).get("Config") or [{}])[0].get("Subnet") != self.spec.subnet:
            raise ProviderError(f"docker network {self.network_name} exists with another subnet than "
                                f"{self.spec.subnet}: `tidelog infra down` first")
        known = []
        for h in self.spec.hosts:
            made += self._container_up(c, docker, h.name)
            pub = (self.host_dir(h.name) / "ssh_host_ed25519_key.pub").read_text().split()[:2]
            addr, port = self.spec.address_of(h.name), self.ssh_port(h.name)
            known.append(f"{addr if port == 22 else f'[{addr}]:{port}'} {' '.join(pub)}")
        self.known_hosts().write_text("\n".join(known) + "\n")
        for h in self.spec.hosts:
            self._wait_ssh(c, docker, h.name)
        self.save_inventory({"network": self.network_name, "known_hosts": str(self.known_hosts()),
                             "key": str(self.key_path), "image": self.spec.docker.image})
        return {"cluster": self.spec.name, "provider": self.kind, "made": made,
                "hosts": {h.name: self.spec.address_of(h.name) for h in self.spec.hosts},
                "known_hosts": str(self.known_hosts()), "key": str(self.key_path)}

    def _image(self, c, docker) -> None:
        image = self.spec.docker.image
        try:
            c.images.get(image)
            return
        except docker.errors.ImageNotFound:
            pass
        try:
            c.images.pull(image)
        except docker.errors.APIError as e:
            raise ProviderError(
                f"docker image {image} is not in the engine and cannot be pulled ({str(e)[:200]}); where no "
                f"registry is reachable, build tidelog-base:bookworm from Debian packages with "
                f"`python -m infra.docker_image` and set docker.image to it") from None

    def _container_up(self, c, docker, host: str) -> list[str]:
        name = self.container_name(host)
        d = self.host_dir(host)
        d.mkdir(parents=True, exist_ok=True)
        hostkey = d / "ssh_host_ed25519_key"
        if not hostkey.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{host}@{self.spec.name}", "-f", str(hostkey))
        try:
            ct = c.containers.get(name)
        except docker.errors.NotFound:
            ct = None
        if ct is not None:
            if ct.status != "running":
                ct.start()
                return [f"container {name} started again"]
            return []
        port = self.ssh_port(host)
        config = "\n".join([
            f"Port {port}", f"HostKey {CONF_DIR}/ssh_host_ed25519_key", "PidFile /run/sshd.pid",
            f"AuthorizedKeysFile {CONF_DIR}/authorized_keys", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "UseDNS no",
            "Subsystem sftp internal-sftp", "MaxSessions 64", "MaxStartups 64:30:128", ""])
        files = {"sshd_config": (config.encode(), 0o644),
                 "ssh_host_ed25519_key": (hostkey.read_bytes(), 0o600),
                 "ssh_host_ed25519_key.pub": (hostkey.with_suffix(".pub").read_bytes(), 0o644),
                 "authorized_keys": (Path(str(self.key_path) + ".pub").read_bytes(), 0o600)}
        api = c.api
        addr = self.spec.address_of(host)
        created = api.create_container(
            self.spec.docker.image, ["sh", "-c", BOOT], name=name, hostname=host, detach=True,
            labels={LABEL: self.spec.name, "tidelog.host": host},
            host_config=api.create_host_config(cap_add=["NET_ADMIN"], network_mode=self.network_name,
                                               init=True),
            networking_config=api.create_networking_config(
                {self.network_name: api.create_endpoint_config(ipv4_address=addr)}))
        ct = c.containers.get(created["Id"])
        try:
            ct.put_archive("/", _tar(files))
            ct.start()
        except Exception:  # a container without its keys and config would come back broken at the next up
            ct.remove(force=True)
            raise
        return [f"container {name} ({self.spec.docker.image}) on {addr}"]

    def _wait_ssh(self, c, docker, host: str) -> None:
        """sshd answers with the pinned host key and our client key (or the container's log
        says why not)."""
        deadline = time.monotonic() + SSH_UP_TIMEOUT_S
        h = self.ssh_host(host)
        try:
            while True:
                try:
                    h.run("true", timeout_s=10)
                    return
                except HostKeyError as e:  # a container from an older `infra up`, keys since regenerated
                    raise ProviderError(f"{e}: `tidelog infra down` and up again") from None
                except Exception as e:  # noqa: BLE001 - sshd not listening yet
                    ct = c.containers.get(self.container_name(host))
                    if ct.status == "exited" or time.monotonic() > deadline:
                        tail = ct.logs(tail=20).decode(errors="replace").strip()
                        why = "exited" if ct.status == "exited" else f"did not answer within {SSH_UP_TIMEOUT_S}s"
                        raise ProviderError(f"container {self.container_name(host)}: sshd {why} ({e}); "
                                            f"its output: {tail[-800:]}") from None
                    time.sleep(0.2)
        finally:
            h.close()

    # --- down / status -----------------------------------------------------------------------

    def _ours(self, c) -> list:
        """This cluster's containers: by label (also ones a changed spec no longer names)."""
        return c.containers.list(all=True, filters={"label": f"{LABEL}={self.spec.name}"})

    def down(self) -> dict:
        c = self.client()
        import docker

        self.close()
        removed = []
        try:
            for ct in self._ours(c):
                ct.remove(force=True)
                removed.append(f"container {ct.name}")
            try:
                c.networks.get(self.network_name).remove()
                removed.append(f"network {self.network_name}")
            except docker.errors.NotFound:
                pass
        except docker.errors.DockerException as e:  # the state stays: a later down can finish
            raise ProviderError(f"docker provider: removing {self.spec.name}'s containers and network: "
                                f"{type(e).__name__}: {str(e)[:500]} (removed so far: {removed or 'nothing'})") from None
        if self.spec.state.exists():
            shutil.rmtree(self.spec.state)
            removed.append(str(self.spec.state))
        return {"cluster": self.spec.name, "provider": self.kind, "removed": removed}

    def status(self) -> dict:
        running = {ct.labels.get("tidelog.host") for ct in self._ours(self.client()) if ct.status == "running"}
        if running:
            return super().status()  # made (at least partly): ask each host over SSH
        return {"cluster": self.spec.name, "provider": self.kind, "verdict": "down",
                "hosts": [{"name": h.name, "address": self.spec.address_of(h.name), "state": "absent",
                           "error": f"container {shlex.quote(self.container_name(h.name))} is not running "
                                    f"(tidelog infra up makes it)"}
                          for h in self.spec.hosts]}

    def faults(self) -> Faults:
        return SSHFaults(self)
