"""Test helpers: brokers in a thread of this process or as child processes, raw sockets,
reading a consumer until it has returned enough."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from pathlib import Path

import uvloop
import yaml

from broker.config import from_dict
from broker.protocol import frame as fr
from broker.server import Broker
from ops.localbroker import free_port


class BrokerThread:
    """A real broker (real sockets, files, fsync) on its own event loop in a thread."""

    def __init__(self, data_dir, **config):
        self.config = from_dict({"listen": "127.0.0.1:0", "data_dir": str(data_dir), "insecure": "tls" not in config,
                                 "segment_bytes": 1 << 20, "message_body_bytes_max": 256 << 10,
                                 "cq_records_per_file": 1024, "index_slots": 1024,
                                 "index_entries_max": 8192, **config})
        self.broker: Broker | None = None
        self.loop = uvloop.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> BrokerThread:
        self.thread.start()
        self.broker = Broker(self.config)
        asyncio.run_coroutine_threadsafe(self.broker.start(), self.loop).result(30)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.broker is not None and self.broker.server is not None:
            asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(30)
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    def call(self, fn, *args):
        """Run fn(*args) on the broker's loop and return its result."""
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.broker.listen_port}"

    @property
    def port(self) -> int:
        return self.broker.listen_port


class RawClient:
    """A blocking socket that speaks (or deliberately mis-speaks) the frame protocol."""

    def __init__(self, port: int, timeout_s: float = 5.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.decoder = fr.FrameDecoder()
        self.frames: list[fr.Frame] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def request(self, code: int, body: bytes = b"", corr: int = 1, headers=None) -> fr.Frame:
        self.send(fr.encode(code, corr, body, headers))
        return self.read_frame()

    def read_frame(self) -> fr.Frame:
        deadline = time.monotonic() + 10
        while not self.frames:
            if time.monotonic() > deadline:
                raise TimeoutError("no frame")
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed by the broker")
            self.frames += self.decoder.feed(data)
        return self.frames.pop(0)

    def read_until_closed(self) -> tuple[list[fr.Frame], bool]:
        """All frames until the broker closes; (frames, closed)."""
        out = list(self.frames)
        self.frames.clear()
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    return out, True
                out += self.decoder.feed(data)
        except ConnectionResetError:
            return out, True
        except socket.timeout:
            return out, False

    def close(self) -> None:
        self.sock.close()


def raw_header(size: int, code: int = 10, corr: int = 7, hlen: int = 0, magic: int = fr.MAGIC,
               version: int = fr.PROTOCOL_VERSION) -> bytes:
    return struct.pack(">IHBBHIH", size, magic, version, 0, code, corr, hlen)


def run_tidelog(*args, check: bool = True, timeout_s: float = 600, env: dict | None = None):
    """`tidelog ARGS` as a subprocess of this interpreter (progress bars off; `env`: more variables,
    e.g. TIDELOG_CREDENTIALS as a user exports it after deploy)."""
    import os
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ops.cli.main", *args], capture_output=True, text=True,
                       timeout=timeout_s, env={**os.environ, "TIDELOG_NO_PROGRESS": "1", **(env or {})})
    if check:
        assert p.returncode == 0, p.stderr + p.stdout
    return p


def local_spec(tmp: Path, name: str, mode: str = "raft", **extra) -> Path:
    """A spec file for a local 3-node group (provider local, a free port, state under tmp)."""
    port = free_port("127.0.0.11")
    config = {"segment_bytes": 8 << 20}
    group = {"name": "g0", "mode": mode, "hosts": ["h1", "h2", "h3"], "port": port, "config": config}
    if mode == "raft":
        config["raft_election_timeout_ms"] = 600
    else:  # a SYNC master: a send waits for one slave
        group["replication"] = "sync"
        config["in_sync_replicas"] = 2
    d = {"name": name, "provider": "local", "state_dir": str(tmp / "state"),
         "hosts": [{"name": f"h{i}"} for i in (1, 2, 3)], "groups": [group],
         "health": {"timeout_s": 30}, **extra}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(d))
    return path


def poll_until(c, n: int, timeout_s: float = 10, poll_ms: int = 300, max_messages: int | None = None) -> list:
    """What consumer `c` returns, polled until that is `n` messages or `timeout_s` has passed.
    max_messages: per poll (None: no more than the messages still wanted)."""
    got: list = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        got += c.poll(timeout_ms=poll_ms, max_messages=max_messages or n - len(got))
    return got


class SilentOnce(asyncio.Protocol):
    """A fake broker for a client test: answers GET_ROUTE (topic "t", one queue), ignores the
    first SEND and answers the next ones, as a broker whose first answer got lost would (it
    stored it: the producer's resend is a possible duplicate). Reset `sends` before each use."""

    sends = 0

    def connection_made(self, t):
        self.t, self.dec = t, fr.FrameDecoder()

    def data_received(self, data):
        from broker.protocol import jsonbody
        from broker.protocol import send as sp
        from broker.protocol import topics as tp
        from broker.protocol.codes import Code, Req

        for f in self.dec.feed(data):
            if f.code == Req.GET_ROUTE:
                body = jsonbody.encode(tp.Route("t", 1, 1, 6, True))
                self.t.write(fr.encode_response(Code.SUCCESS, f.corr_id, body))
            elif f.code == Req.SEND:
                SilentOnce.sends += 1
                if SilentOnce.sends > 1:
                    self.t.write(fr.encode_response(Code.SUCCESS, f.corr_id, sp.encode_response(
                        sp.SendResponse(0, SilentOnce.sends, 0, 0, 0))))
