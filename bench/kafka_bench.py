"""The Kafka rows of `make bench` (broker/kafka/):

- `kafka-fuzz`: a live standalone broker's Kafka listener takes >= 200,000 generated requests
  and must come out alive, serving a librdkafka produce and fetch, without leaked sockets or
  RSS growth past RSS_GROWTH_KB_MAX. Requests (seeded; the seed is printed): every served API
  at every version, encoded from defaults, then bytes flipped, cut or added; random api keys,
  versions and bodies; and "killers" (a negative or absurd size, a header cut short) after which
  the broker closes the connection and the sender reconnects.
- `kafka-produce-raft3`: one librdkafka producer, 1 KiB records, acks=all, linger.ms=5, into a
  raft-3 group through the Kafka listener (no TLS, as the other rows: NATS's defaults) until
  1,000,000 are acknowledged (or PRODUCE_S_MAX); records/s and the brokers' CPU per record.
- `kafka-consume-raft3`: a librdkafka consumer draining those 1,000,000 acknowledged records from
  the leader; records/s and the brokers' CPU per record.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import struct
import sys
import time
from pathlib import Path

from bench.fuzz_bench import mutate, proc_stats

FUZZ = "kafka-fuzz"
PRODUCE = "kafka-produce-raft3"
CONSUME = "kafka-consume-raft3"
NAMES = (FUZZ, PRODUCE, CONSUME)
FUZZ_REQUESTS = 200_000
CORPUS = 5000  # structured requests, reused in random order
DIRTY_SHARE = 0.3  # connections that also send malformed requests and framing killers
WINDOW = 2000  # requests a connection may have unanswered
ANSWER_WAIT_S = 10.0  # a connection without a new answer for this long is given up
RSS_GROWTH_KB_MAX = 64 << 10  # 64 MiB: buffers and caches, not a leak per request
RECORD_BYTES = 1024
DRAIN_RECORDS = 1_000_000
PRODUCE_S_MAX = 180.0  # what the produce row may take to store DRAIN_RECORDS
TOPIC = "kbench"


# --- kafka-fuzz ----------------------------------------------------------------------------------

TOPICS = ("kfuzz", "kfuzz-check", "kf-%d", "", "%SYS%", "a" * 300)
INTS = {"int8": (-128, 127), "int16": (-32768, 32767), "int32": (-(1 << 31), (1 << 31) - 1),
        "int64": (-(1 << 63), (1 << 63) - 1), "uint16": (0, 65535)}


def random_value(rng: random.Random, f, type, version: int, depth: int = 0):
    """A value of the field's type: small and edge-case numbers, topic-like strings, short
    arrays, structs of random fields, record batches (valid, flipped, or garbage)."""
    import uuid

    from broker.kafka import records as kr

    if isinstance(type, tuple):
        def one():
            return {g.name: random_value(rng, g, g.type, version, depth + 1) for g in type if g.lo <= version <= g.hi}
        if not f.array:
            return one()
        return None if f.nullable and rng.random() < 0.1 else [one() for _ in range(rng.randrange(0, 4 if depth < 2 else 2))]
    if type.startswith("["):
        inner = type[1:-1]
        return [random_value(rng, f, inner, version, depth + 1) for _ in range(rng.randrange(0, 4))]
    if type in INTS:
        lo, hi = INTS[type]
        return rng.choice([0, 1, -1, 2, 5, lo, hi, rng.randint(lo, hi), rng.randint(-5, 100)])
    if type == "string":
        if f.nullable and rng.random() < 0.1:
            return None
        return rng.choice(TOPICS).replace("%d", str(rng.randrange(50)))
    if type == "bytes":
        return rng.randbytes(rng.randrange(0, 40))
    if type == "records":
        if rng.random() < 0.2:
            return None
        b = kr.encode([kr.Record(k, k, rng.randbytes(4), rng.randbytes(rng.randrange(0, 200)), [])
                       for k in range(rng.randint(1, 5))], compression=rng.randrange(5),
                      producer_id=rng.choice([-1, 7, rng.randrange(1 << 40)]), producer_epoch=0,
                      base_sequence=rng.randrange(10))
        return b if rng.random() < 0.6 else mutate(rng, b)
    if type == "bool":
        return rng.random() < 0.5
    if type == "float64":
        return rng.random()
    if type == "uuid":
        return uuid.UUID(int=rng.getrandbits(128))
    raise AssertionError(type)


# on the clean connections, not: SaslAuthenticate out of SaslHandshake's order closes the
# connection (as Kafka's does); a JoinGroup or SyncGroup may wait for a rebalance, and every
# answer behind it waits with it (answers go in request order)
ENDING = {36, 11, 14}


def structured(rng: random.Random, closing: bool = False) -> bytes:
    """A well-framed request of a served API at a served version with random field values
    (`closing`: SaslAuthenticate too, which ends the connection)."""
    from broker.kafka import apis, codec
    from broker.kafka.service import SERVED

    key = rng.choice([k for k in sorted(SERVED) if closing or k not in ENDING])
    lo, hi = SERVED[key]
    v = rng.randint(lo, hi)
    api = apis.APIS[key]
    obj = {f.name: random_value(rng, f, f.type, v) for f in api.request.fields if f.lo <= v <= f.hi and f.tag is None}
    if key == 0:  # Produce: acks=0 is never answered, which would leave the count of answers short
        obj["acks"] = rng.choice([1, -1])
        obj["timeout_ms"] = 1000
    if key == 1:  # Fetch: no long poll (the sender would wait it out)
        obj["max_wait_ms"] = 0
    try:
        body = codec.encode(api.request, v, obj)
    except (ValueError, OverflowError, struct.error, AttributeError, TypeError):
        body = codec.encode(api.request, v, {})
    head = struct.pack(">hhih", key, v, rng.randrange(1 << 31), 4) + b"fuzz"
    if api.request.flexible(v):
        head += b"\x00"
    return head + body


def corpus(rng: random.Random, closing: bool = False) -> list[bytes]:
    """Structured requests (random field values) of every served API and version."""
    return [structured(rng, closing) for _ in range(CORPUS)]


def request(rng: random.Random, base: list[bytes], dirty: bool) -> bytes:
    """A structured request; on a `dirty` connection often a mutated or random one too (which
    makes the broker close it: the clean connections carry most requests to the handlers)."""
    r = rng.random() if dirty else 0.5
    if r < 0.2:
        body = mutate(rng, rng.choice(base))
    elif r < 0.9:
        body = rng.choice(base)
    else:
        body = struct.pack(">hhi", rng.randrange(-2, 80), rng.randrange(-2, 20), rng.randrange(1 << 31)) + \
            rng.randbytes(rng.randrange(0, 64))
    return struct.pack(">i", len(body)) + body


def killer(rng: random.Random) -> bytes:
    return rng.choice([struct.pack(">i", -rng.randrange(1, 1 << 31)), struct.pack(">i", 1 << 30) + b"x" * 32,
                       struct.pack(">i", 3) + b"abc"])


class _Answers:
    """Answers read off one connection (size-prefixed frames), counted."""

    def __init__(self, sock, counts: dict):
        self.sock, self.counts, self.buf, self.n = sock, counts, bytearray(), 0

    def read(self, timeout: float | None) -> bool:
        """Read what is there (timeout 0) or wait up to `timeout`; False once the broker closed."""
        self.sock.settimeout(timeout)
        try:
            got = self.sock.recv(1 << 16)
        except (BlockingIOError, socket.timeout):
            return True
        if not got:
            return False
        self.counts["answer_bytes"] += len(got)
        self.buf += got
        while len(self.buf) >= 4 and len(self.buf) >= 4 + int.from_bytes(self.buf[:4], "big"):
            del self.buf[:4 + int.from_bytes(self.buf[:4], "big")]
            self.n += 1
            self.counts["answers"] += 1
        return True


def fuzz(host: str, port: int, n: int, seed: int) -> dict:
    """Send `n` requests over sequential connections. A clean connection (structured requests
    only) is read until every request is answered (ANSWER_WAIT_S without progress ends it); a
    dirty one (mutations, random requests, framing killers) until the broker closes it."""
    rng = random.Random(seed)
    clean, dirty_base = corpus(rng), corpus(rng, closing=True)
    counts = {"sent": 0, "connections": 0, "closed_by_broker": 0, "answer_bytes": 0, "answers": 0,
              "clean_sent": 0, "clean_unanswered": 0}
    while counts["sent"] < n:
        s = socket.create_connection((host, port), timeout=10)
        counts["connections"] += 1
        answers = _Answers(s, counts)
        dirty = rng.random() < DIRTY_SHARE
        sent = 0
        try:
            for _ in range(rng.randint(1, 20) if dirty else rng.randint(50, 400)):
                k = rng.randint(1, 50)
                data = b"".join(request(rng, dirty_base if dirty else clean, dirty) for _ in range(k))
                if dirty and rng.random() < 0.2:
                    data += killer(rng)
                    k += 1
                s.settimeout(10)
                s.sendall(data)
                sent += k
                counts["sent"] += k
                while answers.read(0) and sent - answers.n > WINDOW:  # (at most WINDOW unanswered)
                    if not answers.read(ANSWER_WAIT_S):
                        raise ConnectionResetError
                if counts["sent"] >= n:
                    break
            deadline = time.monotonic() + ANSWER_WAIT_S
            while (dirty or answers.n < sent) and time.monotonic() < deadline:
                before = answers.n
                if not answers.read(1.0):
                    raise ConnectionResetError
                if answers.n > before:
                    deadline = time.monotonic() + ANSWER_WAIT_S
        except (ConnectionError, OSError):
            counts["closed_by_broker"] += 1
        finally:
            s.close()
        if not dirty:
            counts["clean_sent"] += sent
            counts["clean_unanswered"] += sent - answers.n
    return counts


def serves(bootstrap: str) -> bool:
    """A librdkafka produce and fetch-back of one record."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    value = os.urandom(8).hex().encode()
    got = []
    p.produce("kfuzz-check", value, partition=0, on_delivery=lambda e, m: got.append((e, m.offset())))
    p.flush(15)
    if not got or got[0][0] is not None:
        return False
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "kfuzz"})
    c.assign([TopicPartition("kfuzz-check", 0, got[0][1])])
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                return m.value() == value
    finally:
        c.close()
    return False


def run_fuzz(data_dir: Path, n: int = FUZZ_REQUESTS, seed: int | None = None) -> dict:
    from ops.cluster import LocalCluster

    seed = int.from_bytes(os.urandom(4), "big") if seed is None else seed
    print(f"bench: {FUZZ}: seed {seed} ({n} requests)", file=sys.stderr, flush=True)
    c = LocalCluster(Path(data_dir) / "kafka-fuzz")
    try:
        c.up(1, "standalone", "async", fresh=True, segment_bytes=64 << 20, log_level="ERROR", insecure=True,
             auto_create_topic_enable=True)
        host, port = c.addresses[0].rsplit(":", 1)
        kport = int(port) + 2
        bootstrap = f"{host}:{kport}"
        pid = c.nodes[0].pid
        serves(bootstrap)  # warm: the check's topic exists before the baseline
        rss0, fds0, socks0 = proc_stats(pid)
        t0 = time.perf_counter()
        counts = fuzz(host, kport, n, seed)
        seconds = time.perf_counter() - t0
        alive = os.path.exists(f"/proc/{pid}")
        ok = alive and serves(bootstrap)
        rss1, fds1, socks1 = proc_stats(pid) if alive else (0, 0, 0)
        deadline = time.monotonic() + 10
        while alive and socks1 > socks0 and time.monotonic() < deadline:
            time.sleep(0.1)
            rss1, fds1, socks1 = proc_stats(pid)
    finally:
        c.down()
        shutil.rmtree(c.dir, ignore_errors=True)
    bad = not ok or socks1 > socks0 or rss1 - rss0 > RSS_GROWTH_KB_MAX or counts["clean_unanswered"] > 0
    return {"workload": FUZZ, "requests": counts["sent"], "seed": seed, "seconds": round(seconds, 2),
            "requests_per_s": round(counts["sent"] / seconds, 1), "answers": counts["answers"],
            "clean_requests": counts["clean_sent"], "clean_unanswered": counts["clean_unanswered"],
            "connections": counts["connections"],
            "closed_by_broker": counts["closed_by_broker"], "rss_before_kb": rss0, "rss_after_kb": rss1,
            "rss_growth_kb_max": RSS_GROWTH_KB_MAX, "fds_before": fds0, "fds_after": fds1,
            "sockets_before": socks0, "sockets_after": socks1, "crashed": not ok, "errors": int(bad)}


# --- produce and consume through librdkafka ----------------------------------------------------------

def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds the processes used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_produce_consume(data_dir: Path, duration_s: float, drain: int = DRAIN_RECORDS) -> list[dict]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from broker.client import Admin
    from ops.cluster import LocalCluster

    c = LocalCluster(Path(data_dir) / "kafka-raft3")
    rows = []
    try:
        c.up(3, "raft", "async", fresh=True, segment_bytes=256 << 20, log_level="WARNING", insecure=True)
        leader = c.wait_for_leader()
        with Admin(c.addresses) as a:
            a.create_topic(TOPIC, 8)
        boot = ",".join(f"{a.rsplit(':', 1)[0]}:{int(a.rsplit(':', 1)[1]) + 2}" for a in c.addresses)
        pids = [n.pid for n in c.nodes]
        p = Producer({"bootstrap.servers": boot, "acks": "all", "linger.ms": 5, "enable.idempotence": True,
                      "queue.buffering.max.messages": 1_000_000, "batch.size": 1 << 20})
        value = os.urandom(RECORD_BYTES // 2).hex().encode()
        acked, failed = [0], [0]

        def report(err, _msg):
            if err is None:
                acked[0] += 1
            else:
                failed[0] += 1
        sent, cpu0, t0 = 0, cpu_s(pids), time.perf_counter()
        while sent < drain and time.perf_counter() - t0 < max(duration_s, PRODUCE_S_MAX):
            try:
                p.produce(TOPIC, value, key=b"%d" % (sent % 1024), on_delivery=report)
                sent += 1
            except BufferError:
                p.poll(0.005)
            if sent % 1000 == 0:
                p.poll(0)
        p.flush(60)
        seconds = time.perf_counter() - t0
        cpu = cpu_s(pids) - cpu0
        rows.append({"workload": PRODUCE, "mode": "raft", "replicas": 3, "client": "librdkafka",
                     "record_bytes": RECORD_BYTES, "acks": "all", "linger_ms": 5, "records": acked[0],
                     "records_per_s": round(acked[0] / seconds, 1), "mb_per_s": round(acked[0] * RECORD_BYTES / seconds / 1e6, 2),
                     "broker_cpu_us_per_record": round(cpu / max(1, acked[0]) * 1e6, 2), "errors": failed[0]})
        k = Consumer({"bootstrap.servers": boot, "group.id": "kbench-drain", "fetch.max.bytes": 64 << 20,
                      "max.partition.fetch.bytes": 8 << 20, "enable.auto.commit": False})
        k.assign([TopicPartition(TOPIC, q, 0) for q in range(8)])
        got, cpu0, t0 = 0, cpu_s(pids), time.perf_counter()
        deadline = t0 + max(60.0, duration_s * 4)
        while got < acked[0] and time.perf_counter() < deadline:
            for m in k.consume(10_000, 0.5):
                if not m.error():
                    got += 1
        seconds = time.perf_counter() - t0
        cpu = cpu_s(pids) - cpu0
        k.close()
        rows.append({"workload": CONSUME, "mode": "raft", "replicas": 3, "client": "librdkafka", "leader": leader,
                     "record_bytes": RECORD_BYTES, "records": got, "records_per_s": round(got / seconds, 1),
                     "mb_per_s": round(got * RECORD_BYTES / seconds / 1e6, 2),
                     "broker_cpu_us_per_record": round(cpu / max(1, got) * 1e6, 2),
                     "errors": int(got < acked[0])})
    finally:
        c.down()
        shutil.rmtree(c.dir, ignore_errors=True)
    return rows
