"""The harness's last line of cleanup: stops the servers of a run's work dir once the harness is gone,
however it went (a SIGKILL too, which no handler sees).

Tidelog brokers are started by ops/nodes.py as `tidelog cluster up` starts them: detached
(setsid, through a shell that exits at once), so a parent-death signal cannot tie them to the
harness the way nats_cluster.py ties nats-server. Instead the harness starts this process (in a
session of its own, so a kill of the harness's process group does not reach it) with the read end
of a pipe as stdin and keeps the write end; the kernel closes that when the harness exits for any
reason, stdin reads EOF here, and every process of this user whose command line names a server
config under the work dir (`.../broker.yaml`, `.../nats.conf`) gets SIGTERM, then SIGKILL after
STOP_TIMEOUT_S. After a clean exit the harness has stopped them all already: nothing matches.

    python -m bench.peers.reaper WORK_DIR   < pipe
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STOP_TIMEOUT_S = 10.0
CONFIG_NAMES = ("/broker.yaml", "/nats.conf")


def servers_under(work: str | os.PathLike) -> list[int]:
    """Pids of this user's live processes with an argument naming a server config under `work`."""
    prefix = os.path.realpath(work).rstrip("/") + "/"
    raw = str(work).rstrip("/") + "/"
    me, uid, found = os.getpid(), os.getuid(), []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            if d.stat().st_uid != uid:
                continue
            args = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(a.startswith((prefix, raw)) and a.endswith(CONFIG_NAMES) for a in args):
            found.append(int(d.name))
    return found


def stop(pids: list[int], timeout_s: float = STOP_TIMEOUT_S) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while pids and time.monotonic() < deadline:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and
                    Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
            time.sleep(0.1)
        if not pids:
            return


def start(work: Path) -> int:
    """Start the reaper for `work`; the write end of its pipe (keep it open until exit)."""
    r, w = os.pipe()   # both ends close-on-exec: no server the harness starts holds the write end
    subprocess.Popen([sys.executable, "-m", "bench.peers.reaper", str(work)], stdin=r,
                     stdout=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    os.close(r)
    return w


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a terminal's Ctrl-C is for the harness
    work = sys.argv[1]
    while os.read(0, 4096):
        pass
    left = servers_under(work)
    if left:
        print(f"bench-peers reaper: stopping {left} left under {work}", file=sys.stderr, flush=True)
        stop(left)
    return 0


if __name__ == "__main__":
    sys.exit(main())
