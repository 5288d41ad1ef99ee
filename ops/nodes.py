"""One node on one host: install a build, write its config, start it detached, stop it.

On every host, under the spec's install_dir:

    wheels/                    uploaded wheels (Tidelog builds and their dependencies)
    versions/<v>-<build>/venv  one venv per build, side by side (rollback = start the old one)
    nodes/<id>/broker.yaml     the node's config (rewritten by deploy)
    nodes/<id>/build           which build the node runs
    nodes/<id>/console.log     stdout/stderr of the process; broker.log: its log
    nodes/<id>/data/           the store; data/broker.json: pid and port once it listens
    nodes/ns-<host>/           a name server (kind namesrv): namesrv.yaml, namesrv.log, and
                               namesrv.pid (written at launch: a name server keeps no files)

Everything goes through `Host.run/put/write_text`, so it is the same for a local process,
a namespace host and a VM.
"""

from __future__ import annotations

import json
import shlex
import socket
import sys
import time

import yaml

from infra.hosts import Host, HostError
from infra.spec import NodePlan
from ops.build import Artifact, wheelhouse


class NodeError(RuntimeError):
    pass


def q(s) -> str:
    return shlex.quote(str(s))


def install(host: Host, root: str, art: Artifact, python: str) -> bool:
    """Make `art` runnable on `host`; False when it already was."""
    if art.wheel is None:
        return False  # in place (provider local, version current)
    vdir = f"{root}/versions/{art.name}"
    if host.read_text(f"{vdir}/installed") == art.build_id:
        return False
    have = {name: size for name, _, size in host.listdir(f"{root}/wheels")}
    for w in [art.wheel, *sorted(wheelhouse(art.wheel).glob("*.whl"))]:
        if have.get(w.name) != w.stat().st_size:
            host.put(w, f"{root}/wheels/{w.name}")
    host.run(f"rm -rf {q(vdir)} && mkdir -p {q(vdir)} && {q(python)} -m venv {q(vdir + '/venv')} && "
             f"{q(vdir + '/venv/bin/pip')} install --quiet --disable-pip-version-check --no-index "
             f"--find-links {q(root + '/wheels')} {q(root + '/wheels/' + art.wheel.name)}",
             timeout_s=600)
    host.write_text(f"{vdir}/installed", art.build_id)
    return True


def read_pid(text: str | None) -> int | None:
    """The pid in a broker's broker.json ({"pid": ...}) or a name server's namesrv.pid (a number)."""
    try:
        v = json.loads(text) if text else None
        return int(v if isinstance(v, int) else v["pid"]) if v is not None else None
    except (ValueError, KeyError, TypeError):
        return None


class NodeOps:
    """Start, stop and inspect one node through its host: a broker node or a name server
    (`plan.kind`): the same process handling, another subcommand, config file and pid file."""

    def __init__(self, plan: NodePlan, host: Host, fault_injection: bool = False):
        self.plan, self.host = plan, host
        self.root = plan.spec.install_dir_of(plan.host)
        self.fault_injection = fault_injection

    @property
    def home(self) -> str:
        return self.plan.home

    def command(self, art_name: str) -> str:
        if art_name.endswith("-src"):  # this tree, in place
            return f"{q(sys.executable)} -m ops.cli.main"
        # an installed build runs its own code: a PYTHONPATH inherited from whoever deploys
        # (an Airflow worker, a shell with the source tree on it) must not shadow it
        return f"env -u PYTHONPATH -u PYTHONHOME {q(f'{self.root}/versions/{art_name}/venv/bin/tidelog')}"

    # --- state ---------------------------------------------------------------------------------

    def build(self) -> str | None:
        b = self.host.read_text(f"{self.home}/build")
        return b.strip() if b else None

    @property
    def kind(self) -> str:
        return self.plan.kind

    @property
    def config_path(self) -> str:
        return self.plan.config_file

    @property
    def pid_file(self) -> str:
        return f"{self.home}/namesrv.pid" if self.kind == "namesrv" else f"{self.plan.data_dir}/broker.json"

    def config_text(self) -> str:
        from ops.security import ClusterSecurity
        cfg = self.plan.config(self.fault_injection)
        cfg.update(ClusterSecurity(self.plan.spec).broker_fields(self.plan))
        return yaml.safe_dump(cfg, sort_keys=False)

    def config_current(self) -> bool:
        return self.host.read_text(self.config_path) == self.config_text()

    def pid(self) -> int | None:
        """The process's pid if it is running (a pid file naming a live process of this node)."""
        pid = read_pid(self.host.read_text(self.pid_file))
        if pid is None:
            return None
        r = self.host.run(f"grep -qs {q(self.config_path)} /proc/{pid}/cmdline && "
                          f"! grep -qs '^[0-9]* (.*) Z' /proc/{pid}/stat", check=False, timeout_s=15)
        return pid if r.rc == 0 else None

    def listening(self, timeout_s: float = 0.5) -> bool:
        host, port = self.plan.address.rsplit(":", 1)
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            return True
        except OSError:
            return False

    # --- actions -------------------------------------------------------------------------------

    def write_config(self, rotate_cert: bool = False) -> None:
        """The node's config and its TLS files (a new certificate with `rotate_cert`: upgrade).
        The config holds user verifiers, so it is not readable by others."""
        from ops.security import ClusterSecurity
        ClusterSecurity(self.plan.spec).install(self.host, self.plan, rotate=rotate_cert)
        self.host.run(f"umask 077 && mkdir -p {q(self.home)} && chmod 700 {q(self.home)}", timeout_s=30)
        self.host.write_text(self.config_path, self.config_text())
        self.host.run(f"chmod 600 {q(self.config_path)}", timeout_s=30)

    def start(self, art_name: str, timeout_s: float = 60.0) -> int:
        """Start detached (setsid, no terminal, output to console.log); wait until it serves."""
        if self.pid() is not None:
            raise NodeError(f"{self.plan.id} is already running")
        self.host.write_text(f"{self.home}/build", art_name)
        # a broker and a name server write their own pid file once they listen (a name server's
        # is namesrv.yaml's pid_file): one that cannot bind its port never looks started
        workdir = self.home if self.kind == "namesrv" else self.plan.data_dir
        r = self.host.run(f"mkdir -p {q(workdir)}; rm -f {q(self.pid_file)}; "
                          f"cd {q(self.home)}; setsid {self.command(art_name)} {self.kind} start "
                          f"--config {q(self.config_path)} >> console.log 2>&1 < /dev/null & "
                          f"echo $!",
                          timeout_s=30)
        launched = int(r.out.split()[-1])  # setsid execs in place here: this is the process's pid
        deadline = time.monotonic() + timeout_s
        why = f"did not start within {timeout_s}s"
        while time.monotonic() < deadline:
            pid = self.pid()
            if pid is not None and self.listening():
                return pid
            if pid is None and not self._running(launched):
                why = "exited at start"
                break
            time.sleep(0.1)
        tail = self.host.run(f"tail -n 20 {q(self.home + '/console.log')} {q(self.plan.log_file)}",
                             check=False).out
        raise NodeError(f"{self.plan.id} {why}:\n{tail}")

    def _running(self, pid: int) -> bool:
        pid = int(pid)
        return self.host.run(f"[ -e /proc/{pid} ] && ! grep -qs '^[0-9]* (.*) Z' /proc/{pid}/stat",
                             check=False, timeout_s=15).rc == 0

    def stop(self, timeout_s: float = 30.0) -> bool:
        """SIGTERM (flush and checkpoint), wait, SIGKILL if it hangs; False if it was not running."""
        pid = self.pid()
        if pid is None:
            return False
        self.host.run(f"kill -TERM {pid}; for i in $(seq {int(timeout_s * 10)}); do "
                      f"[ -e /proc/{pid} ] && ! grep -qs '^[0-9]* (.*) Z' /proc/{pid}/stat || exit 0; "
                      f"sleep 0.1; done; kill -KILL {pid}", timeout_s=timeout_s + 15)
        return True

    def signal(self, sig: str) -> int:
        """kill -SIG the process (KILL, STOP, CONT); its pid."""
        pid = self.pid()
        if pid is None:
            raise NodeError(f"{self.plan.id} is not running")
        if sig not in ("KILL", "STOP", "CONT", "TERM"):
            raise ValueError(f"signal {sig!r}: expected KILL, STOP, CONT or TERM")
        self.host.run(f"kill -{sig} {int(pid)}", timeout_s=15)
        return pid

    def wait_gone(self, pid: int, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._running(pid):
                return
            time.sleep(0.05)
        raise NodeError(f"{self.plan.id}: pid {pid} still running after {timeout_s}s")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return self.host.run(f"tail -n {int(lines)} {q(self.plan.log_file)}", check=False).out
        except HostError as e:
            return f"(no log: {e})"
