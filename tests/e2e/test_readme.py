"""The README is executed: its "Quick start" targets exist and its "A tour" blocks run as written.

What runs. README.md's fenced blocks under "## A tour" (up to the next "## " heading), in order:
the standalone broker tour, the raft `cluster` block, the master-slave block, then the Python
snippet under "From Python:". Each shell block is one bash script (`set -uo pipefail`, so a
`VAR=$(...)` assignment carries to later lines of the same block), run from the repository's
root with a timeout; every command line runs as written, with its comment stripped, its stdout
and stderr kept apart, and its exit status checked as `set -e` would, line by line. The Python
block runs with `.venv/bin/python`. Quick start: `make -n <target>` for every `make <target>`
line there (not run: `make run` is tests/e2e/test_demo_and_bench.py, `make test` would recurse).

The rules the harness reads the README by:
- Foreground lines. A `tidelog broker start` line runs a broker in the foreground until Ctrl-C
  (the README says so: "a broker in the foreground", "in another shell: the old master
  returns"): the harness starts it in the background (`&`, its pid recorded), waits until the
  `listen` address in the config it names accepts a connection (failing if it exits first),
  and goes on with the next line. At the end it is stopped with SIGINT (Ctrl-C) by pid and
  checked gone. The master-slave block's hand-started n0 must already be gone after that
  block: its `cluster down` says it stops "the n0 started by hand too".
- Exit codes. A line exits 0, unless its comment says `(exit N)` (e.g. `cluster status ...
  # degraded (exit 1)`), then N.
- Pipelines. A line with a pipe runs without pipefail, as in a user's interactive shell: in
  `tidelog consume ... | head` the consumer may be cut off by `head` (SIGPIPE), which a user
  never sees as a failure. No line may print a Python traceback, piped or not.
- Known failures. A line in KNOWN_FAILURES (a code bug, not README drift) that fails with the
  output listed there does not stop its block; the test then ends as xfail, naming it.

Isolation: loopback only; HOME, TIDELOG_CLUSTER_DIR (the raft block's default cluster) in
tmp_path; TIDELOG_BOOTSTRAP unset (the tour relies on the default 127.0.0.1:10911). The
SUBSTITUTIONS below are the only changes made to the README's text. If something already listens
on 127.0.0.1:10911 (the example broker's address), the test is skipped rather than fight it.
At the end: every process the harness started is gone (by pid), every node the `cluster up`
lines reported is gone, and neither cluster directory has a node running. It takes ~35 s.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from ops.cluster import LocalCluster
from ops.localbroker import pid_alive

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
VENV_PY = REPO / ".venv" / "bin" / "python"
EXAMPLE_CONFIG = "broker/examples/broker.yaml"

# README text -> what runs; "{tmp}" is the test's tmp_path. Nothing else in the README is changed.
SUBSTITUTIONS = [
    (EXAMPLE_CONFIG, "{tmp}/standalone/broker.yaml"),  # a byte-for-byte copy: its ./data lands in tmp
    ("/tmp/ms", "{tmp}/ms"),                           # the master-slave block's --data-dir
]

# Code bugs that make a README line fail as written (the README is right, the code is not): when
# that line fails with that output, the block goes on and the test ends as xfail with the reason;
# when the line passes, nothing is excused. (command as written, regex on its stderr, reason)
KNOWN_FAILURES: list[tuple[str, str, str]] = []   # (README line, error it fails with, why): none now

BLOCK_TIMEOUT_S = 150       # one shell block, every line in it
PYTHON_TIMEOUT_S = 60
LISTEN_TIMEOUT_S = 30       # a foreground broker, until its address accepts connections
GONE_TIMEOUT_S = 20         # a stopped process, until it is gone
OUTPUT_CHARS_MAX = 4000     # per stream, per line, in a failure report

WAITER = '''\
import socket, sys, time, yaml
from ops.localbroker import pid_alive
config, pid, timeout_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline, address = time.monotonic() + timeout_s, None
while time.monotonic() < deadline:
    if not pid_alive(pid):
        sys.exit(f"harness: pid {pid} exited before it listened (on {address or '?'})")
    try:
        address = (yaml.safe_load(open(config)) or {}).get("listen", "127.0.0.1:10911")
        host, port = address.rsplit(":", 1)
        socket.create_connection((host, int(port)), timeout=0.5).close()
        sys.exit(0)
    except (OSError, ValueError, AttributeError):
        time.sleep(0.1)
sys.exit(f"harness: pid {pid} not listening on {address or '?'} (its config: {config}) after {timeout_s}s")
'''


@dataclass
class Line:
    text: str           # the README's line (comment included), for reports
    cmd: str            # what runs: comment stripped, substitutions applied
    expect: int         # its expected exit status
    foreground: bool    # `tidelog broker start`: started in the background by the harness
    known: tuple[str, str] | None = None   # (stderr regex, reason) from KNOWN_FAILURES


@dataclass
class Block:
    lang: str
    body: str


# --- reading the README ------------------------------------------------------------------------

def section(text: str, heading: str) -> str:
    m = re.search(rf"^{re.escape(heading)}\s*$(.*?)(?=^## )", text, re.M | re.S)
    assert m, f"README.md has no section {heading!r}"
    return m.group(1)


def blocks(text: str) -> list[Block]:
    return [Block(m.group(1).strip(), m.group(2))
            for m in re.finditer(r"^```([^\n]*)\n(.*?)^```\s*$", text, re.M | re.S)]


def split_comment(line: str) -> tuple[str, str]:
    """(command, comment): the comment starts at a `#` that begins a word outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1:].strip()
    return line.rstrip(), ""


def substitute(text: str, tmp: Path) -> str:
    for old, new in SUBSTITUTIONS:
        text = text.replace(old, new.format(tmp=tmp))
    return text


def lines(block: Block, tmp: Path) -> list[Line]:
    out = []
    for raw in block.body.replace("\\\n", " ").splitlines():
        cmd, comment = split_comment(raw)
        if not cmd:
            continue
        m = re.search(r"\(exit (\d+)\)", comment)
        words = shlex.split(cmd)
        foreground = any(Path(w).name == "tidelog" and words[i + 1:i + 3] == ["broker", "start"]
                         for i, w in enumerate(words))
        known = next(((rx, why) for c, rx, why in KNOWN_FAILURES if c == cmd.strip()), None)
        out.append(Line(raw.strip(), substitute(cmd, tmp), int(m.group(1)) if m else 0, foreground, known))
    return out


def config_of(cmd: str) -> str:
    words = shlex.split(cmd)
    return next(b for a, b in zip(words, words[1:]) if a in ("--config", "-c"))


# --- running it ----------------------------------------------------------------------------------

def script(block_lines: list[Line], log: Path, waiter: Path) -> str:
    """One bash script for a block: each line's output in log/<i>.out|.err, its status in <i>.rc;
    the first unexpected status ends the script (as `set -e` would)."""
    out = ["set -uo pipefail", f"LOG={shlex.quote(str(log))}"]
    for i, ln in enumerate(block_lines):
        io = f'>"$LOG/{i}.out" 2>"$LOG/{i}.err" </dev/null'
        if ln.foreground:
            out += [f"{ln.cmd} {io} &",
                    f'echo $! >"$LOG/{i}.pid"',
                    f"{shlex.quote(str(VENV_PY))} {shlex.quote(str(waiter))} {shlex.quote(config_of(ln.cmd))} "
                    f'$! {LISTEN_TIMEOUT_S} 2>"$LOG/{i}.wait"; rc=$?']
        elif "|" in ln.cmd:
            out += [f"set +o pipefail; {{ {ln.cmd}\n}} {io}; rc=$?; set -o pipefail"]
        else:
            out += [f"{{ {ln.cmd}\n}} {io}; rc=$?"]
        excuse = f" || grep -qE {shlex.quote(ln.known[0])} \"$LOG/{i}.err\"" if ln.known else ""
        out += [f'echo $rc >"$LOG/{i}.rc"; [ $rc -eq {ln.expect} ]{excuse} || exit 3']
    return "\n".join(out) + "\n"


def read(p: Path) -> str:
    try:
        text = p.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return text if len(text) <= OUTPUT_CHARS_MAX else "...\n" + text[-OUTPUT_CHARS_MAX:]


def report(name: str, block_lines: list[Line], log: Path, failed: int | None, why: str) -> str:
    def one(i: int) -> str:
        ln = block_lines[i]
        rc = read(log / f"{i}.rc").strip() or "(did not finish)"
        return (f"$ {ln.text}\n  runs as: {ln.cmd}\n  exit {rc}, README expects {ln.expect}"
                + ("  [foreground: started in the background]" if ln.foreground else "")
                + f"\n--- stdout\n{read(log / f'{i}.out')}--- stderr\n{read(log / f'{i}.err')}"
                + (f"--- harness\n{read(log / f'{i}.wait')}" if read(log / f"{i}.wait") else ""))
    head = f"README {name} block: {why}\n"
    if failed is None:
        return head + "\n".join(one(i) for i in range(len(block_lines)))
    return (head + "FAILING LINE:\n" + one(failed) + "\nthe lines before it, in order:\n"
            + "\n".join(one(i) for i in range(failed))
            + "".join(f"\nnot run: {ln.text}" for ln in block_lines[failed + 1:]))


def gone(pid: int) -> bool:
    return not pid_alive(pid)   # a zombie counts as gone: PID 1 reaps slowly here


def wait_gone(pid: int, timeout_s: float = GONE_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def listening(host: str, port: int) -> bool:
    """Something listens on host:port (a bind with SO_REUSEADDR fails only then, not on TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return False
        except OSError:
            return True


class Tour:
    """Runs the blocks; remembers every pid the harness started and every node `cluster up` printed."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.env = {k: v for k, v in os.environ.items() if k != "TIDELOG_BOOTSTRAP"}
        self.env.update(HOME=str(tmp / "home"), TIDELOG_CLUSTER_DIR=str(tmp / "cluster"),
                        PYTHONUNBUFFERED="1")
        (tmp / "home").mkdir()
        self.waiter = tmp / "harness_wait_listen.py"
        self.waiter.write_text(WAITER)
        self.started: dict[int, str] = {}   # pid -> the README line (foreground lines)
        self.stopped_by_readme: set[int] = set()   # of those, the ones a README line stops
        self.logs: dict[int, Path] = {}     # pid -> its stderr
        self.nodes: dict[int, str] = {}     # pid -> "n0 of <cluster up line>"
        self.cluster_dirs = [tmp / "cluster", tmp / "ms"]
        self.known: list[str] = []          # KNOWN_FAILURES that happened

    def run_block(self, name: str, block_lines: list[Line]) -> None:
        log = self.tmp / "log" / name
        log.mkdir(parents=True)
        path = log / "block.sh"
        path.write_text(script(block_lines, log, self.waiter))
        timed_out = False
        try:
            subprocess.run(["bash", str(path)], cwd=REPO, env=self.env, timeout=BLOCK_TIMEOUT_S,
                           stdin=subprocess.DEVNULL, capture_output=True)
        except subprocess.TimeoutExpired:
            timed_out = True
        for i, ln in enumerate(block_lines):
            if (log / f"{i}.pid").exists():
                pid = int(read(log / f"{i}.pid"))
                self.started[pid], self.logs[pid] = ln.text, log / f"{i}.err"
            if ln.cmd.split()[1:3] == ["cluster", "up"]:
                for m in re.finditer(r"^\s+(n\d+)\s+\S+\s+pid (\d+)", read(log / f"{i}.out"), re.M):
                    self.nodes[int(m.group(2))] = f"{m.group(1)} of `{ln.text}`"
        rcs = [read(log / f"{i}.rc").strip() for i in range(len(block_lines))]
        failed = None
        for i, (ln, rc) in enumerate(zip(block_lines, rcs)):
            if rc == str(ln.expect):
                continue
            if ln.known and rc and re.search(ln.known[0], read(log / f"{i}.err")):
                self.known.append(f"`{ln.text}` (exit {rc}: {read(log / f'{i}.err').strip()}): {ln.known[1]}")
                continue
            failed = i
            break
        if timed_out:
            pytest.fail(report(name, block_lines, log, failed, f"did not finish in {BLOCK_TIMEOUT_S}s"), False)
        if failed is not None:
            pytest.fail(report(name, block_lines, log, failed, "a line exited with an unexpected status"), False)
        for i, ln in enumerate(block_lines):
            if "Traceback (most recent call last)" in read(log / f"{i}.err") + read(log / f"{i}.out"):
                pytest.fail(report(name, block_lines, log, i, "a line printed a Python traceback"), False)

    def cleanup(self) -> list[str]:
        """Stop what still runs (Ctrl-C, by pid), then the clusters; what would not go."""
        stuck = []
        for pid, text in self.started.items():
            if gone(pid):
                if pid not in self.stopped_by_readme:
                    stuck.append(f"pid {pid} ({text}) was gone before the end of the tour:\n{read(self.logs[pid])}")
                continue
            os.kill(pid, signal.SIGINT)
            if not wait_gone(pid):
                os.kill(pid, signal.SIGKILL)
                stuck.append(f"pid {pid} ({text}) ignored SIGINT (Ctrl-C) for {GONE_TIMEOUT_S}s: killed")
            elif "Traceback (most recent call last)" in read(self.logs[pid]):
                stuck.append(f"pid {pid} ({text}) printed a traceback when stopped:\n{read(self.logs[pid])}")
        for d in self.cluster_dirs:
            if (d / "cluster.yaml").exists():
                subprocess.run([str(REPO / ".venv/bin/tidelog"), "cluster", "down", "--data-dir", str(d)],
                               cwd=REPO, env=self.env, timeout=60, capture_output=True)
        for pid, what in self.nodes.items():
            if not wait_gone(pid, 5):
                os.kill(pid, signal.SIGKILL)
                stuck.append(f"node pid {pid} ({what}) still ran after the test's cluster down: killed")
        return stuck


# --- the tests -----------------------------------------------------------------------------------

def test_quick_start_targets_exist():
    cmds = [split_comment(x)[0] for b in blocks(section(README.read_text(), "## Quick start"))
            for x in b.body.splitlines()]
    targets = [c.split()[1] for c in cmds if c.startswith("make ")]
    assert targets, "no `make <target>` line in README's Quick start"
    for t in targets:
        r = subprocess.run(["make", "-n", t], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"README Quick start: `make {t}` is not a Makefile target:\n{r.stderr}"


def test_tour_runs_as_written(tmp_path):
    if listening("127.0.0.1", 10911):
        pytest.skip("something already listens on 127.0.0.1:10911 (the tour's standalone broker address); "
                    "not fighting it")
    tour_blocks = blocks(section(README.read_text(), "## A tour"))
    shell = [b for b in tour_blocks if b.lang in ("", "sh", "bash", "console")]
    python = [b for b in tour_blocks if b.lang == "python"]
    assert len(shell) == 3 and len(python) == 1, (
        f"README's tour: expected the standalone, raft and master-slave blocks and one Python block, "
        f"found {[b.lang or 'shell' for b in tour_blocks]}: update this test with the README")
    (tmp_path / "standalone").mkdir()
    (tmp_path / "standalone" / "broker.yaml").write_bytes((REPO / EXAMPLE_CONFIG).read_bytes())
    had_example_data = (REPO / "broker/examples/data").exists()

    tour = Tour(tmp_path)
    t0 = time.monotonic()
    try:
        for name, block in zip(["standalone", "raft", "master-slave"], shell):
            block_lines = lines(block, tmp_path)
            tour.run_block(name, block_lines)
            if name == "master-slave":  # `cluster down` stops "the n0 started by hand too"
                for i, ln in enumerate(block_lines):
                    pid_file = tmp_path / "log" / name / f"{i}.pid"
                    if ln.foreground and pid_file.exists():
                        pid = int(pid_file.read_text())
                        tour.stopped_by_readme.add(pid)
                        assert wait_gone(pid, 10), f"`{ln.text}`: pid {pid} still runs after the block's cluster down"
        snippet = tmp_path / "from_python.py"
        snippet.write_text(substitute(textwrap.dedent(python[0].body), tmp_path))
        r = subprocess.run([str(VENV_PY), str(snippet)], cwd=REPO, env=tour.env, capture_output=True,
                           text=True, timeout=PYTHON_TIMEOUT_S)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (
            f"README 'From Python:' snippet exited {r.returncode}:\n{python[0].body}\n--- stdout\n{r.stdout}"
            f"--- stderr\n{r.stderr}")
        # it sends b"order 42" tagged "paid" and polls the tag: the message comes back
        assert "b'order 42'" in r.stdout, f"the Python snippet's consumer printed no message:\n{r.stdout}"
        # the README's `cluster down` lines stopped every node (checked before cleanup's own cluster down)
        assert tour.nodes, "no `cluster up` line printed its nodes' pids"
        for pid, what in tour.nodes.items():
            assert wait_gone(pid, 10), f"node pid {pid} ({what}) still runs after the README's cluster down"
        for d in tour.cluster_dirs:
            assert (d / "cluster.yaml").exists(), f"the tour made no cluster in {d}"
            assert LocalCluster(d).running() == [], f"nodes of {d} still run after the README's cluster down"
    finally:
        stuck = tour.cleanup()
        print(f"README tour ran in {time.monotonic() - t0:.1f}s")
    assert not stuck, "\n".join(stuck)
    for pid, text in tour.started.items():
        assert gone(pid), f"pid {pid} ({text}) still runs"
    assert (REPO / "broker/examples/data").exists() == had_example_data, "the tour left data in the repo"
    if tour.known:
        pytest.xfail("; ".join(tour.known))
