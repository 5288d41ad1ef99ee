"""A Docker engine for the tests (as root, as CI runs): Debian's docker.io, installed when
missing; dockerd started only when no engine answers, and then stopped by its pid afterwards,
with the host firewall settings it changed put back; the base image (infra/docker_image.py),
built once and cached.

dockerd changes the host on start: it turns IP forwarding on and, when it was off (a fresh
machine), sets FORWARD's policy to DROP; it turns bridge netfilter on
(net.bridge.bridge-nf-call-iptables=1). That would cut the netns provider's hosts off from each
other had that provider not allowed its bridge explicitly. When the engine was ours, `engine()`
puts all three back after stopping it and removes the docker0 bridge it made, so the next run
starts from the same state; the chains dockerd added (DOCKER, DOCKER-USER, ...) stay, empty of
anything that matters without it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = {"/usr/sbin/dockerd": "docker.io", "/usr/sbin/debootstrap": "debootstrap"}
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
BRIDGE_NF_ALL = [BRIDGE_NF, BRIDGE_NF.with_name("bridge-nf-call-ip6tables"), BRIDGE_NF.with_name("bridge-nf-call-arptables")]
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


class EngineError(RuntimeError):
    pass


@dataclass
class Engine:
    client: object                 # docker.DockerClient
    started: bool                  # dockerd started here (and stopped on exit)
    pid: int | None = None
    log: Path | None = None
    ip_forward_was_off: bool = False  # when ours started: so it set FORWARD's policy to DROP
    timings: dict = field(default_factory=dict)


def ensure_packages() -> list[str]:
    """apt-get install docker.io / debootstrap when missing; the packages installed. (Debian's
    policy-rc.d on these machines keeps apt from starting dockerd itself.)"""
    missing = [pkg for path, pkg in PACKAGES.items() if not Path(path).exists()]
    if not missing:
        return []
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    cmd = ["apt-get", "install", "-y", "-q", *missing]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:  # stale package lists: refresh once
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env)
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise EngineError(f"apt-get install {' '.join(missing)} failed: {p.stderr.strip()[-800:]}")
    return missing


def _answers():
    """A client of the engine at DOCKER_HOST or the default socket, or None."""
    import docker

    try:
        c = docker.from_env(timeout=10)
        c.ping()
        return c
    except Exception:  # noqa: BLE001 - no socket, refused, not docker...
        return None


def _forward_policy() -> str | None:
    p = subprocess.run(["iptables", "-w", "-S", "FORWARD"], capture_output=True, text=True)
    first = p.stdout.splitlines()[:1]
    return first[0].split()[-1] if first and first[0].startswith("-P FORWARD") else None


@contextmanager
def engine(workdir: Path):
    """Yield an Engine: the one that answers, else a dockerd of ours (stopped on exit)."""
    t0 = time.monotonic()
    installed = ensure_packages()
    timings = {"install_s": round(time.monotonic() - t0, 1)} if installed else {}
    c = _answers()
    if c is not None:
        yield Engine(c, started=False, timings=timings)
        return
    policy = _forward_policy()
    had_docker0 = Path("/sys/class/net/docker0").exists()
    ip_forward = IP_FORWARD.read_text().strip()
    bridge_nf = {f: f.read_text().strip() if f.exists() else None for f in BRIDGE_NF_ALL}
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / "dockerd.log"
    t0 = time.monotonic()
    with open(log, "ab") as out:
        proc = subprocess.Popen([shutil.which("dockerd") or "/usr/sbin/dockerd"], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while c is None:
            if proc.poll() is not None:
                raise EngineError(f"dockerd exited with {proc.returncode} at start: {log.read_text()[-1500:]}")
            if time.monotonic() - t0 > START_TIMEOUT_S:
                raise EngineError(f"dockerd did not answer within {START_TIMEOUT_S}s: {log.read_text()[-1500:]}")
            time.sleep(0.2)
            c = _answers()
        timings["dockerd_start_s"] = round(time.monotonic() - t0, 1)
        yield Engine(c, started=True, pid=proc.pid, log=log, ip_forward_was_off=ip_forward == "0", timings=timings)
    finally:
        if c is not None:
            c.close()
        proc.terminate()
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:  # hung: its session too (the containerd it started)
            os.killpg(proc.pid, signal.SIGKILL)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:  # still restore the host below
                pass
        if IP_FORWARD.read_text().strip() != ip_forward:
            IP_FORWARD.write_text(ip_forward)  # else the next dockerd finds it on and keeps FORWARD open
        if policy is not None and _forward_policy() != policy:
            subprocess.run(["iptables", "-w", "-P", "FORWARD", policy], capture_output=True)
        for f, was in bridge_nf.items():  # iptables, ip6tables and arptables switches alike
            if was is not None and f.exists() and f.read_text().strip() != was:
                f.write_text(was)
            elif was is None and f.exists():
                f.write_text("0")  # br_netfilter was loaded by dockerd: make it a no-op again
        if not had_docker0 and Path("/sys/class/net/docker0").exists():
            subprocess.run(["ip", "link", "del", "docker0"], capture_output=True)  # dockerd's default bridge
