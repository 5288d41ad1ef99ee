"""The `hop-floor-raft3-w1` bench row: raft-3's W=1 round trip with no broker in it.

Three processes on loopback, CPython on uvloop like the brokers, do only what that round
trip cannot do without: this process sends a 1 KiB frame to a "leader", which pwrites it
to a file and writes it with a sequence number to two "followers"; each pwrites it and
answers with the number; the leader answers this process at the first answer (2 of 3, a
quorum). The same windowed client loop as the broker rows (bench/window.py, W=1) and the
same CPU accounting. Its msgs_per_s is the ceiling that the four loopback hops and five
processes' wake-ups leave on this machine, and its CPU per message what they cost: beside
`raft3-c1-w1-async` of the same run, the rest of that row's round trip is the brokers' own
work per hop (issue 15, W=1).

A model of the broker's round trip (TIDELOG_HOP_WORK): each process may burn a given CPU
time at the points where a broker works -- e.g. `TIDELOG_HOP_WORK=leader_send=135,
leader_answer=57,leader_second=60,follower_before=120,follower_after=60,client=110` (µs, see
WORK_POINTS) reproduces raft3-c1-w1's rate and CPU columns on this machine -- so one can ask
what a cheaper hop would buy before building it (docs/design/native-path.md). The row then
carries `model_work_us`; unset, it is the floor.

`python -m bench.hop_floor leader|follower DATA_DIR [FOLLOWER_PORTS]` runs one of the
processes: it listens on a free loopback port and prints it on stdout.
"""

from __future__ import annotations

import asyncio
import os
import select
import shutil
import struct
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

import uvloop

from bench.window import Window, frozen_heap, process_cpu_s, run_window

NAME = "hop-floor-raft3-w1"
WARMUP_S = 0.5
SETTLE_S = 5.0
START_TIMEOUT_S = 30.0  # for a process to print its port
PAYLOAD = 1024
_LEN = struct.Struct(">I")
_SEQ = struct.Struct(">Q")
WORK_ENV = "TIDELOG_HOP_WORK"
WORK_POINTS = {  # name -> where that process burns the CPU time asked for
    "client": "the client, on each answer, before its next send",
    "leader_send": "the leader, on a send, before its write and the pushes",
    "leader_answer": "the leader, on the first follower's answer, before answering the client",
    "leader_second": "the leader, on the second follower's answer",
    "follower_before": "a follower, on a push, before its write and answer",
    "follower_after": "a follower, after its answer",
}


def parse_work(text: str | None) -> dict[str, float]:
    """TIDELOG_HOP_WORK's `name=µs,...` as {name: µs} (empty: the floor). Raises ValueError
    naming the item that is wrong."""
    work: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in (text or "").split(","))):
        name, eq, value = item.partition("=")
        name = name.strip()
        if name not in WORK_POINTS:
            raise ValueError(f"{WORK_ENV}: {name!r} is not a work point; the points: {', '.join(WORK_POINTS)}")
        try:
            us = float(value) if eq else float("nan")
        except ValueError:
            us = float("nan")
        if not 0 <= us <= 100_000:
            raise ValueError(f"{WORK_ENV}: {item!r} needs name=µs with 0 <= µs <= 100000")
        work[name] = us
    return work


def spin(us: float) -> None:
    """Burn `us` µs of this thread's CPU time (not wall time: a preempted spin is not cut short)."""
    if us > 0:
        clock = time.thread_time
        end = clock() + us / 1e6
        while clock() < end:
            pass


WORK: dict[str, float] = {}  # this process's (run() and __main__ read TIDELOG_HOP_WORK)


class Framed(asyncio.Protocol):
    """u32 length + body frames; `on_frame(protocol, body)` for each."""

    def __init__(self, on_frame):
        self.on_frame = on_frame
        self.buf = bytearray()
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        buf = self.buf
        buf += data
        while len(buf) >= 4:
            (n,) = _LEN.unpack_from(buf, 0)
            if len(buf) < 4 + n:
                break
            body = bytes(buf[4:4 + n])
            del buf[:4 + n]
            self.on_frame(self, body)


class Log:
    """An append-only file written with pwrite, as a CommitLog's tail is."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        self.end = 0

    def append(self, data: bytes) -> None:
        os.pwrite(self.fd, data, self.end)
        self.end += len(data)


async def _serve(factory) -> None:
    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.Event().wait()


async def _follower(data_dir: Path) -> None:
    log = Log(data_dir / f"follower-{os.getpid()}.log")
    before, after = WORK.get("follower_before", 0), WORK.get("follower_after", 0)

    def on_push(p, body):
        spin(before)
        log.append(body)
        p.transport.write(_LEN.pack(_SEQ.size) + body[:_SEQ.size])
        spin(after)
    await _serve(lambda: Framed(on_push))


async def _leader(data_dir: Path, follower_ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    log = Log(data_dir / "leader.log")
    waiting: dict[bytes, list] = {}  # seq -> [client protocol, answers so far]
    seq = 0
    on_send_us, first_us, second_us = (WORK.get(k, 0) for k in ("leader_send", "leader_answer", "leader_second"))

    def on_answer(_, body):
        w = waiting.get(body)
        if w is None:
            return
        w[1] += 1
        if w[1] == 1:  # a quorum: this node and one follower
            spin(first_us)
            w[0].transport.write(_LEN.pack(len(body)) + body)
        else:
            spin(second_us)
            del waiting[body]

    links = [(await loop.create_connection(lambda: Framed(on_answer), "127.0.0.1", port))[0]
             for port in follower_ports]

    def on_send(p, body):
        nonlocal seq
        spin(on_send_us)
        log.append(body)
        seq += 1
        s = _SEQ.pack(seq)
        waiting[s] = [p, 0]
        frame = _LEN.pack(len(s) + len(body)) + s + body
        for t in links:
            t.write(frame)
    await _serve(lambda: Framed(on_send))


def _start(data_dir: Path, *args: str) -> tuple[subprocess.Popen, int]:
    role, *rest = args
    proc = subprocess.Popen([sys.executable, "-m", "bench.hop_floor", role, str(data_dir), *rest],
                            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], START_TIMEOUT_S)
    line = proc.stdout.readline() if ready else ""
    if not line.strip().isdigit():
        proc.kill()
        proc.wait()
        raise RuntimeError(f"bench: {NAME}'s {role} did not start within {START_TIMEOUT_S:.0f} s "
                           f"(exit {proc.poll()})")
    return proc, int(line)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        p.stdout.close()


class Client:
    """One connection to the leader; `send(body)` returns the future of its answer (answers
    come back in the order the sends went out). A lost connection fails what waits."""

    def __init__(self):
        self.pending: deque[asyncio.Future] = deque()
        self.transport = None

    async def connect(self, port: int) -> None:
        loop = asyncio.get_running_loop()
        self.transport, proto = await loop.create_connection(lambda: Framed(self._answer), "127.0.0.1", port)
        proto.connection_lost = self._lost

    def _lost(self, exc) -> None:
        while self.pending:
            f = self.pending.popleft()
            if not f.done():
                f.set_exception(ConnectionError(f"{NAME}: the leader closed the connection ({exc})"))

    def _answer(self, _, body) -> None:
        spin(WORK.get("client", 0))
        self.pending.popleft().set_result(body)

    def send(self, body: bytes) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        if self.transport.is_closing():
            fut.set_exception(ConnectionError(f"{NAME}: no connection to the leader"))
            return fut
        self.pending.append(fut)
        self.transport.write(_LEN.pack(len(body)) + body)
        return fut


async def _measure(port: int, pids: list[int], duration_s: float, messages: int) -> dict:
    from bench.run import cpu_per_msg, measured
    client = Client()
    await client.connect(port)
    body = b"x" * PAYLOAD
    await run_window(client.send, body, 1, Window(time.perf_counter() + WARMUP_S, 1 << 62), SETTLE_S)
    s0, c0 = [process_cpu_s(p) for p in pids], time.process_time()
    t0 = time.perf_counter()
    m = Window(t0 + duration_s, messages)
    await run_window(client.send, body, 1, m, SETTLE_S)
    wall = time.perf_counter() - t0
    c1, s1 = time.process_time(), [process_cpu_s(p) for p in pids]
    client.transport.close()
    client_cpu, server_cpu = c1 - c0, [b - a for a, b in zip(s0, s1)]
    model = {"model_work_us": WORK, "note": "a model: the floor plus the CPU time model_work_us asks "
             "for at each point (bench/hop_floor.py WORK_POINTS)"} if WORK else {}
    return {
        "workload": NAME, "mode": "floor", "replicas": 3, "flush": "none", "security": "off",
        "payload": PAYLOAD, "conns": 1, "window": 1, "client_api": "future",
        **measured(m, wall, PAYLOAD, client_cpu, server_cpu),
        "server_nodes": [{"id": "f1", "role": "follower"}, {"id": "f2", "role": "follower"},
                         {"id": "l", "role": "leader"}],
        **cpu_per_msg(len(m.lat), client_cpu, server_cpu),
        "note": "no broker: framing, pwrite and the loopback hops of raft-3's W=1 round trip only",
        **model,
    }


def run(data_dir: Path, duration_s: float, messages: int) -> dict:
    """Start the three processes in `data_dir`, measure, stop them (by pid) and remove their
    files whatever happens."""
    global WORK
    WORK = parse_work(os.environ.get(WORK_ENV))  # (as the processes will read it: a bad one fails here)
    data_dir = Path(data_dir) / "hop-floor"
    data_dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen] = []
    try:
        f1, p1 = _start(data_dir, "follower")
        procs.append(f1)
        f2, p2 = _start(data_dir, "follower")
        procs.append(f2)
        lead, port = _start(data_dir, "leader", f"{p1},{p2}")
        procs.append(lead)
        # bounded whatever the processes do (a crashed follower leaves a send unanswered)
        bound_s = WARMUP_S + duration_s + 2 * SETTLE_S + START_TIMEOUT_S
        with frozen_heap():
            return uvloop.run(asyncio.wait_for(_measure(port, [f1.pid, f2.pid, lead.pid], duration_s, messages),
                                               bound_s))
    finally:
        _stop(procs)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    WORK = parse_work(os.environ.get(WORK_ENV))
    role, where = sys.argv[1], Path(sys.argv[2])
    if role == "follower":
        uvloop.run(_follower(where))
    else:
        uvloop.run(_leader(where, [int(x) for x in sys.argv[3].split(",")]))
