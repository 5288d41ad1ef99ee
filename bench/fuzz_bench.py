"""The `fuzz` bench row: a live standalone broker takes >= 1,000,000 generated frames and must
come out alive, answering, and without leaked file descriptors.

Frames (seeded; the seed is printed) come from a corpus of well-framed requests of every
request code whose bodies are valid encodings with bytes flipped, cut or added (SEND,
SEND_BATCH, PULL, the JSON families, raft messages), random codes, versions, flags and
bodies; the broker answers those (BAD_REQUEST, REQUEST_CODE_NOT_SUPPORTED, ...) on the same
connection. Some batches end with a frame-level "killer" (bad magic, an absurd size, a broken
header map, random bytes, a frame cut short): the broker closes that connection and the sender
reconnects. Several connections write batches of many frames per write while a reader drains
the answers. Before and after: the broker's VmRSS and open fds (/proc/<pid>); at the end a
normal send and pull must work.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import struct
import sys
import time
from pathlib import Path

from broker.protocol import frame as fr
from broker.protocol import pull as pp
from broker.protocol import send as sp
from broker.protocol.codes import Req
from replication.raft import messages as rm
from replication.raft import wire as rw

NAME = "fuzz"
FRAMES = 1_000_000
CONNECTIONS = 4
BATCH_FRAMES = 2000  # frames per write
KILL_RATE = 0.2  # batches that end with a frame the broker must close the connection for
CORPUS = 6000
TOPIC = "fuzz"
SETTLE_S = 10.0  # after the last connection closes: how long fds may take to come back


# --- generation --------------------------------------------------------------------------------

def mutate(rng: random.Random, b: bytes) -> bytes:
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(5)
        i = rng.randrange(len(b)) if b else 0
        if op == 0 and b:
            b[i] = rng.randrange(256)
        elif op == 1 and b:
            del b[i:i + rng.randint(1, 8)]
        elif op == 2:
            b[i:i] = rng.randbytes(rng.randint(1, 8))
        elif op == 3:
            b += rng.randbytes(rng.randint(1, 16))
        elif b:
            del b[i:]
    return bytes(b)


def _json_bodies(rng: random.Random) -> dict[int, bytes]:
    j = lambda d: json.dumps(d).encode()  # noqa: E731
    return {
        Req.QUERY_OFFSET: j({"group": "g", "topic": TOPIC, "queue_ids": [0, 1]}),
        Req.COMMIT_OFFSET: j({"group": "g", "topic": TOPIC, "offsets": {"0": 1}}),
        Req.LIST_TOPICS: b"{}",
        Req.DESCRIBE_TOPIC: j({"topic": TOPIC}),
        Req.GET_ROUTE: j({"topic": TOPIC}),
        Req.QUERY_BY_KEY: j({"topic": TOPIC, "key": "k", "max_results": 4}),
        Req.QUERY_BY_ID: j({"msg_id": "00" * 16}),
        Req.HEARTBEAT: j({"client_id": f"fuzz-{rng.randrange(8)}", "group": "g", "topics": [TOPIC]}),
        Req.LIST_GROUPS: b"{}",
        Req.DESCRIBE_GROUP: j({"group": "g"}),
        Req.STATUS: b"{}",
        Req.GET_METADATA: b"{}",
        Req.HA_ROLE: j({"action": "fence", "ms": 10}),
        Req.FAULT: j({"isolate": True}),
        Req.TRANSFER_LEADER: j({"target": "n2"}),
    }


def _request(rng: random.Random) -> tuple[int, bytes]:
    """(code, body): a request of a random family, its body mutated most of the time."""
    kind = rng.randrange(10)
    if kind < 3:
        body = sp.encode_request(sp.SendRequest(TOPIC, rng.randrange(4), 0, int(time.time() * 1000),
                                                rng.randbytes(16), b"", rng.randbytes(rng.randrange(200))))
        return Req.SEND, mutate(rng, body) if rng.random() < 0.9 else body
    if kind == 3:
        msgs = [sp.BatchMessage(0, 0, rng.randbytes(16), b"", rng.randbytes(rng.randrange(64)))
                for _ in range(rng.randint(1, 4))]
        return Req.SEND_BATCH, mutate(rng, sp.encode_batch_request(sp.SendBatchRequest(TOPIC, 0, msgs)))
    if kind == 4:
        body = pp.encode_request(pp.PullRequest(TOPIC, rng.randrange(4), rng.randrange(1000), 32, 1 << 16,
                                                rng.randrange(20)))
        return Req.PULL, mutate(rng, body)
    if kind == 5:
        msg = rng.choice([rm.Heartbeat("n1", 1, 0), rm.VoteRequest("n1", 2, 0, 0, True),
                          rm.Push("n1", 1, rm.PushType.APPEND, 0, ((1, 1, b"x" * 10),), 1)])
        return Req.RAFT, mutate(rng, rw.encode(msg))
    if kind < 9:
        code, body = rng.choice(list(_json_bodies(rng).items()))
        if rng.random() < 0.02:  # an error that quotes a huge request must still be answered
            return Req.CREATE_TOPIC, json.dumps({"topic": "x" * 100_000}).encode()
        return code, mutate(rng, body)
    return rng.randrange(1 << 16), rng.randbytes(rng.randrange(64))


def well_framed(rng: random.Random) -> bytes:
    code, body = _request(rng)
    r = rng.random()
    flags = 0 if r < 0.8 else fr.FLAG_ONEWAY if r < 0.95 else rng.randrange(256)
    version = fr.PROTOCOL_VERSION if rng.random() < 0.97 else rng.randrange(256)
    headers = {"k": "v" * rng.randrange(40)} if rng.random() < 0.05 else None
    return fr.encode(code, rng.randrange(1 << 32), body, headers, flags, version)


def killer(rng: random.Random) -> tuple[bytes, bool]:
    """(bytes, cut): a frame the broker cannot read, so it closes the connection; or (cut) a
    frame cut short by the sender's half-close."""
    k = rng.randrange(6)
    if k == 0:  # not our magic
        return struct.pack(">IHBBHIH", 20, rng.randrange(1 << 16) | 1, 1, 0, 10, 1, 0) + b"abcd", False
    if k == 1:  # an absurd size
        return fr.HEADER.pack(rng.randrange(1 << 25, 1 << 32), fr.MAGIC, 1, 0, Req.SEND, 1, 0), False
    if k == 2:  # a size that cannot hold its header map
        return fr.HEADER.pack(fr.HEADER_SIZE + 2, fr.MAGIC, 1, 0, Req.STATUS, 1, 40) + b"xx", False
    if k == 3:  # a broken header map
        hm = mutate(rng, fr.encode_headers({"error": "x", "leader": "h:1"}))
        return fr.HEADER.pack(fr.HEADER_SIZE + len(hm), fr.MAGIC, 1, 0, Req.STATUS, 1, len(hm)) + hm, False
    if k == 4:  # random bytes
        return rng.randbytes(rng.randint(16, 200)), False
    f = well_framed(rng)  # cut short, then the sender closes
    return f[:rng.randrange(1, len(f))], True


# --- the run -----------------------------------------------------------------------------------

def proc_stats(pid: int) -> tuple[int, int, int]:
    """(VmRSS in kB, open fds, of which sockets) of a process."""
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    fds = sockets = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        fds += 1
        try:
            sockets += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # closed meanwhile
    return rss, fds, sockets


SENTINEL = 0xFFFFFFFF  # corr_id of the STATUS a worker sends after its last frame
LAST_ANSWER_S = 30.0  # how long a worker waits for that answer (a loaded box answers late)


async def _drain(reader: asyncio.StreamReader, counts: dict, last: asyncio.Event) -> None:
    dec = fr.FrameDecoder()
    try:
        while True:
            data = await reader.read(1 << 18)
            if not data:
                return
            got = dec.feed(data)
            counts["answers"] += len(got)
            if any(f.corr_id == SENTINEL and f.code == 0 for f in got):
                last.set()
    except (ConnectionError, OSError):
        return


async def fuzz(host: str, port: int, frames: int, seed: int, conns: int = CONNECTIONS,
               batch: int = BATCH_FRAMES) -> dict:
    """Send `frames` frames over `conns` connections (reconnecting whenever the broker closes
    one); counts of what happened."""
    rng = random.Random(seed)
    corpus = [well_framed(rng) for _ in range(CORPUS)]
    killers = [killer(rng) for _ in range(200)]
    counts = {"sent": 0, "answers": 0, "connections": 0, "closed_by_broker": 0, "connect_errors": 0}
    left = [frames]

    async def worker(k: int):
        wrng = random.Random(seed * 1000 + k)
        while left[0] > 0:
            try:
                reader, writer = await asyncio.open_connection(host, port)
            except OSError:
                counts["connect_errors"] += 1
                if counts["connect_errors"] > 50:
                    raise
                await asyncio.sleep(0.05)
                continue
            counts["connections"] += 1
            last = asyncio.Event()
            drain = asyncio.create_task(_drain(reader, counts, last))
            cut = kill = False
            try:
                while left[0] > 0 and not drain.done():
                    n = min(batch, left[0])
                    left[0] -= n
                    data = b"".join(wrng.choices(corpus, k=n))
                    kill = wrng.random() < KILL_RATE
                    if kill:
                        tail, cut = wrng.choice(killers)
                        data += tail
                        n += 1
                    writer.write(data)
                    counts["sent"] += n
                    await writer.drain()
                    if kill:
                        break
            except (ConnectionError, OSError):
                pass
            try:
                if kill:
                    # after a killer the broker answers what came before it and closes; a cut
                    # frame is ended by our half-close, which the broker must answer the same way
                    if cut:
                        writer.write_eof()
                    await asyncio.wait_for(asyncio.shield(drain), LAST_ANSWER_S)
                    counts["closed_by_broker"] += 1
                elif not drain.done():
                    # done: the broker answers a connection's frames in order (but for a parked
                    # long-poll PULL or an HA_ROLE answered from a task: those may come later and
                    # go uncounted, so the count is a lower bound), so once the answer to a STATUS
                    # sent last is in, the answers before it are counted (a fixed wait dropped the
                    # last batch's answers on a loaded box)
                    writer.write(fr.encode(Req.STATUS, SENTINEL, b"{}"))
                    await writer.drain()
                    await asyncio.wait_for(last.wait(), LAST_ANSWER_S)
            except (ConnectionError, OSError, asyncio.TimeoutError):
                pass
            writer.close()
            await asyncio.wait_for(drain, 10.0)

    await asyncio.gather(*(worker(k) for k in range(conns)))
    return counts


def check_serves(address: str) -> bool:
    """A normal send, then a pull that reads it back."""
    from broker.client import Consumer, Producer

    body = os.urandom(16)
    with Producer([address], send_timeout_ms=10_000) as p:
        r = p.send("fuzz-check", body, queue_id=0)
    with Consumer([address], "fuzz-check-group", "fuzz-check", queues=[0]) as c:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if any(m.body == body and m.queue_offset == r.queue_offset for m in c.poll(timeout_ms=500)):
                return True
    return False


def run_against(address: str, pid: int, frames: int = FRAMES, seed: int | None = None,
                conns: int = CONNECTIONS) -> dict:
    """Fuzz a running broker (`pid` is its process); the bench row."""
    import uvloop

    seed = int.from_bytes(os.urandom(4), "big") if seed is None else seed
    print(f"bench: {NAME}: seed {seed} ({frames} frames, {conns} connections)", file=sys.stderr, flush=True)
    host, port = address.rsplit(":", 1)
    check_serves(address)  # warm: the check's topic and group exist before the baseline
    rss0, fds0, socks0 = proc_stats(pid)
    t0 = time.perf_counter()
    error = None
    try:
        counts = uvloop.run(fuzz(host, int(port), frames, seed, conns))
    except OSError as e:  # nothing listens any more
        counts, error = {}, f"{type(e).__name__}: {e}"
    seconds = time.perf_counter() - t0
    alive = os.path.exists(f"/proc/{pid}")
    serves = alive and check_serves(address)
    rss1, fds1, socks1 = proc_stats(pid) if alive else (0, 0, 0)
    deadline = time.monotonic() + SETTLE_S
    while alive and socks1 > socks0 and time.monotonic() < deadline:  # closes still being noticed
        time.sleep(0.1)
        rss1, fds1, socks1 = proc_stats(pid)
    crashed = not serves
    # fds may grow legitimately: a mutated SEND may name a new (auto-created) topic whose
    # queue files then stay open; a leaked connection shows as a socket
    return {"workload": NAME, "frames": counts.get("sent", 0), "seed": seed,
            "rss_before_kb": rss0, "rss_after_kb": rss1, "fds_before": fds0, "fds_after": fds1,
            "sockets_before": socks0, "sockets_after": socks1, "crashed": crashed, "seconds": round(seconds, 2),
            "frames_per_s": round(counts.get("sent", 0) / seconds, 1) if seconds else 0.0,
            "answers": counts.get("answers", 0), "connections": counts.get("connections", 0),
            "closed_by_broker": counts.get("closed_by_broker", 0),
            "errors": int(crashed or socks1 > socks0 or error is not None),
            **({"error": error} if error else {})}


def run(data_dir: Path, frames: int = FRAMES, seed: int | None = None) -> dict:
    """Start a standalone broker of its own, fuzz it, stop it."""
    from ops.cluster import LocalCluster

    c = LocalCluster(Path(data_dir) / "fuzz")
    try:
        # plain TCP, so the frames reach every decoder (with security on they would stop at the
        # TLS handshake and the AUTH gate)
        c.up(1, "standalone", "async", fresh=True, segment_bytes=64 << 20, log_level="ERROR", insecure=True)
        return run_against(c.addresses[0], c.nodes[0].pid, frames, seed)
    finally:
        c.down()
        shutil.rmtree(c.dir, ignore_errors=True)
