"""A host we run commands on and copy files to: this machine, or one reached over SSH.

ops/ speaks only this interface (`run`, `put`, `get`, `listdir`, `read_text`, `write_text`),
so deploy, upgrade, drills and collection are the same code for local processes, namespace
hosts, containers and real VMs. SSH uses paramiko with host keys checked against a
known_hosts file; an unknown key is refused unless the spec says to accept new ones, and a
changed key is always refused.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from infra.credentials import SSHCredentials


class HostError(RuntimeError):
    """A host could not be reached or a command on it failed; the message names the host."""


class HostKeyError(HostError):
    """The host's SSH key is unknown (and not to be trusted) or does not match known_hosts."""


@dataclass(frozen=True)
class Result:
    rc: int
    out: str
    err: str


class Host:
    name: str
    address: str  # where brokers on this host listen (and clients connect)

    def run(self, command: str, timeout_s: float = 120.0, check: bool = True) -> Result:
        raise NotImplementedError

    def put(self, local: Path, remote: str) -> None:
        raise NotImplementedError

    def get(self, remote: str, local: Path) -> None:
        raise NotImplementedError

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        """(name, is_dir, size) of each entry; [] when the directory does not exist."""
        raise NotImplementedError

    def read_text(self, remote: str) -> str | None:
        raise NotImplementedError

    def write_text(self, remote: str, text: str) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _checked(self, command: str, r: Result, check: bool) -> Result:
        if check and r.rc != 0:
            tail = (r.err or r.out).strip()[-800:]
            raise HostError(f"{self.name}: `{command[:200]}` exited with {r.rc}: {tail}")
        return r

    def get_tree(self, remote: str, local: Path) -> int:
        """Copy a directory tree; the bytes copied."""
        total = 0
        local.mkdir(parents=True, exist_ok=True)
        for name, is_dir, size in self.listdir(remote):
            if is_dir:
                total += self.get_tree(f"{remote}/{name}", local / name)
            else:
                self.get(f"{remote}/{name}", local / name)
                total += size
        return total


class LocalHost(Host):
    """This machine (provider `local`): commands through bash, files copied."""

    def __init__(self, name: str, address: str):
        self.name, self.address = name, address

    def run(self, command: str, timeout_s: float = 120.0, check: bool = True) -> Result:
        try:
            p = subprocess.run(["bash", "-c", command], capture_output=True, text=True,
                               timeout=timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise HostError(f"{self.name}: `{command[:200]}` did not finish within {timeout_s}s") from None
        return self._checked(command, Result(p.returncode, p.stdout, p.stderr), check)

    def put(self, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(remote + ".part")
        shutil.copyfile(local, tmp)
        tmp.replace(remote)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(remote, local)

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        try:
            return [(e.name, e.is_dir(), e.stat().st_size if e.is_file() else 0)
                    for e in os.scandir(remote)]
        except FileNotFoundError:
            return []

    def read_text(self, remote: str) -> str | None:
        try:
            return Path(remote).read_text()
        except FileNotFoundError:
            return None

    def write_text(self, remote: str, text: str) -> None:
        p = Path(remote)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(text)
        tmp.replace(p)


class SSHHost(Host):
    """A host over SSH (paramiko): one connection, opened on first use, reused."""

    def __init__(self, name: str, address: str, *, credentials: SSHCredentials, port: int = 22,
                 known_hosts: Path | None = None, accept_new_host_keys: bool = False,
                 connect_timeout_s: float = 10.0):
        self.name, self.address = name, address
        self.creds, self.port = credentials, port
        self.known_hosts, self.accept_new = known_hosts, accept_new_host_keys
        self.connect_timeout_s = connect_timeout_s
        self._client = None
        self._sftp = None
        self._lock = threading.Lock()

    def _connect(self):
        import paramiko

        with self._lock:
            if self._client is not None and self._client.get_transport() \
                    and self._client.get_transport().is_active():
                return self._client
            c = paramiko.SSHClient()
            if self.known_hosts and Path(self.known_hosts).exists():
                c.load_host_keys(str(self.known_hosts))  # new keys accepted are saved here
            elif not self.accept_new:
                raise HostKeyError(f"{self.name}: known_hosts file {self.known_hosts} does not exist; "
                                   f"write it (ssh-keyscan) or set ssh.accept_new_host_keys: true")
            c.set_missing_host_key_policy(paramiko.AutoAddPolicy() if self.accept_new
                                          else paramiko.RejectPolicy())
            cr = self.creds
            try:
                c.connect(self.address, self.port, username=cr.user, pkey=cr.pkey, password=cr.password,
                          key_filename=str(cr.key_file) if cr.key_file and not cr.pkey else None,
                          timeout=self.connect_timeout_s, banner_timeout=self.connect_timeout_s,
                          auth_timeout=self.connect_timeout_s, allow_agent=False, look_for_keys=False)
            except paramiko.BadHostKeyException as e:
                raise HostKeyError(
                    f"{self.name} ({self.address}:{self.port}): host key mismatch: the host offered "
                    f"{e.key.get_name()} {e.key.get_fingerprint().hex()}, known_hosts {self.known_hosts} "
                    f"has another. Refusing to connect (a rebuilt host or a man in the middle); "
                    f"if the host was rebuilt, replace its line in known_hosts.") from None
            except paramiko.SSHException as e:
                if "not found in known_hosts" in str(e):
                    raise HostKeyError(
                        f"{self.name} ({self.address}:{self.port}): host key not in known_hosts "
                        f"{self.known_hosts}; add it (ssh-keyscan -p {self.port} {self.address}) or "
                        f"set ssh.accept_new_host_keys: true") from None
                raise HostError(f"{self.name} ({self.address}:{self.port}): SSH failed: {e}") from None
            except OSError as e:
                raise HostError(f"{self.name} ({self.address}:{self.port}): cannot connect: "
                                f"{e.strerror or e}") from None
            if self.accept_new and self.known_hosts:
                Path(self.known_hosts).parent.mkdir(parents=True, exist_ok=True)
                c.save_host_keys(str(self.known_hosts))
            self._client, self._sftp = c, None
            return c

    def sftp(self):
        c = self._connect()
        if self._sftp is None:
            self._sftp = c.open_sftp()
        return self._sftp

    def run(self, command: str, timeout_s: float = 120.0, check: bool = True) -> Result:
        import socket

        c = self._connect()
        try:
            _, stdout, stderr = c.exec_command(f"bash -c {shlex.quote(command)}", timeout=timeout_s)
            out = stdout.read().decode(errors="replace")
            err = stderr.read().decode(errors="replace")
            rc = stdout.channel.recv_exit_status()
        except (socket.timeout, TimeoutError):
            raise HostError(f"{self.name}: `{command[:200]}` did not finish within {timeout_s}s") from None
        except Exception as e:  # paramiko raises SSHException / EOFError when the link drops
            self.close()
            raise HostError(f"{self.name}: `{command[:200]}` failed: {type(e).__name__}: {e}") from None
        return self._checked(command, Result(rc, out, err), check)

    def put(self, local: Path, remote: str) -> None:
        s = self.sftp()
        self.run(f"mkdir -p {shlex.quote(str(Path(remote).parent))}")
        s.put(str(local), remote + ".part")
        s.posix_rename(remote + ".part", remote)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.sftp().get(remote, str(local))

    def listdir(self, remote: str) -> list[tuple[str, bool, int]]:
        try:
            return [(a.filename, stat.S_ISDIR(a.st_mode), a.st_size or 0)
                    for a in self.sftp().listdir_attr(remote)]
        except FileNotFoundError:
            return []

    def read_text(self, remote: str) -> str | None:
        try:
            with self.sftp().open(remote, "r") as f:
                return f.read().decode()
        except FileNotFoundError:
            return None

    def write_text(self, remote: str, text: str) -> None:
        s = self.sftp()
        self.run(f"mkdir -p {shlex.quote(str(Path(remote).parent))}")
        with s.open(remote + ".tmp", "w") as f:
            f.write(text.encode())
        s.posix_rename(remote + ".tmp", remote)

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
            self._client = self._sftp = None

