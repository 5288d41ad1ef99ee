"""A broker as a child process on this machine: start, wait until it serves, stop, kill.

Single brokers for the demo and the multi-process tests (a group runs through ops.cluster,
which deploys like `tidelog deploy`). The broker writes
`<data_dir>/broker.json` (pid and port) once it listens; `start` waits for that and for the
port to accept connections, and fails with the tail of the broker's log if it dies first.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_free(host: str, port: int) -> bool:
    """Nothing listens on (or holds) host:port right now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """n distinct free ports (held open together while chosen, so none repeats)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def pid_alive(pid: int) -> bool:
    """Running (a zombie, which PID 1 reaps slowly here, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def stop_pid(pid: int, timeout_s: float = 20.0) -> bool:
    """SIGTERM, wait, then SIGKILL; True if it had to be killed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return False
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


class BrokerStartError(RuntimeError):
    pass


class LocalBroker:
    def __init__(self, data_dir: Path, host: str = "127.0.0.1", port: int | None = None,
                 **config):
        self.data_dir = Path(data_dir).resolve()
        self.host = host
        self.port = port or free_port(host)
        # the tests' and the standalone demo's broker: plain TCP unless given tls (tests/secure.py)
        # (no Kafka listener unless asked for: its default port, the client port + 2, is not
        # one free_port chose)
        self.config = {"listen": f"{host}:{self.port}", "data_dir": str(self.data_dir),
                       "insecure": "tls" not in config, "kafka_listener": None, **config}
        self.proc: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "broker.yaml"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout_s: float = 30.0) -> LocalBroker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        runfile = self.data_dir / "broker.json"
        runfile.unlink(missing_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ops.cli.main", "broker", "start", "--config", str(self.config_path)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerStartError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            if runfile.exists() and self._serves(runfile):
                return self
            time.sleep(0.02)
        self.kill()
        raise BrokerStartError(f"broker did not start within {timeout_s}s:\n{self.log_tail()}")

    def _serves(self, runfile: Path) -> bool:
        try:
            info = json.loads(runfile.read_text())
        except ValueError:
            return False
        if info.get("pid") != self.proc.pid:
            return False
        try:
            socket.create_connection((self.host, self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def stop(self, timeout_s: float = 20.0) -> int:
        """SIGTERM (graceful: flush, checkpoint) and wait; SIGKILL if it hangs."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode
        self.proc = None
        return rc

    def kill(self) -> None:
        """kill -9: the crash that recovery must survive."""
        if self.proc is not None:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def signal(self, sig: int) -> None:
        """Send a signal (SIGSTOP / SIGCONT for a hung node)."""
        if self.pid is not None:
            os.kill(self.pid, sig)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> LocalBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
