"""The one client loop both systems are measured with, and the record each run leaves.

It is ../shared/peers/bench.py's run_conn in "async" mode: one connection, a semaphore of W
permits, per message one future from the system's own pipelined publish (NATS: nats-py's
`js.publish_async`; Tidelog: `Producer.send_nowait` when the client has it, else the
`send_async` coroutine as a task); the permit comes back when the ack (or error) does.
Latency is the client's time from the publish call to its ack. CPU: this process's
(getrusage) and each server process's (Linux's per-process CPU clock, ns, as bench/run.py reads
it; /proc/<pid>/stat's 10 ms ticks only where that clock is refused), sampled around the measured
part only.
"""

from __future__ import annotations

import array
import asyncio
import os
import platform
import resource
import time

from bench.window import Window, frozen_heap, process_cpu_s, run_window

SUBJECT = "peers.bench"
STREAM = "PEERS"
TIDELOG_QUEUES = int(os.environ.get("TIDELOG_QUEUES", "8"))  # write queues per topic, as `make bench`
DRAIN_TIMEOUT_S = 15.0   # after the last publish, wait this long for the outstanding acks
SETUP_TIMEOUT_S = 30.0   # NATS: stream created and every replica current
SEND_TIMEOUT_MS = 10_000


# --------------------------------------------------------------------------- the two adapters

class NatsPublisher:
    """A JetStream stream with file storage and R replicas; a publish is acked once stored by the
    stream leader and (R > 1) by a quorum."""

    def __init__(self, servers: list[str], replicas: int):
        self.servers, self.replicas = list(servers), replicas
        self.nc = self.js = None

    async def connect(self, prefer: str | None = None) -> None:
        import nats
        servers = ([prefer] if prefer else []) + [s for s in self.servers if s != prefer]
        self.nc = await nats.connect(servers=servers, dont_randomize=True, connect_timeout=5,
                                     max_reconnect_attempts=0, allow_reconnect=False,
                                     pending_size=64 * 1024 * 1024)
        self.js = self.nc.jetstream(timeout=10, publish_async_max_pending=1 << 20)

    async def setup(self) -> str | None:
        """A fresh stream; the URL of its leader (producers connect there)."""
        from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType
        from nats.js.errors import NotFoundError
        try:
            await self.js.delete_stream(STREAM)
        except NotFoundError:
            pass
        deadline = time.monotonic() + SETUP_TIMEOUT_S
        while True:  # a just-elected meta leader may still refuse: bounded retries
            try:
                await self.js.add_stream(name=STREAM, subjects=[SUBJECT], storage=StorageType.FILE,
                                         num_replicas=self.replicas, retention=RetentionPolicy.LIMITS,
                                         discard=DiscardPolicy.OLD)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        info = None
        while time.monotonic() < deadline:
            info = await self.js.stream_info(STREAM)
            cl = info.cluster
            if self.replicas == 1 or (cl and cl.leader and cl.replicas and len(cl.replicas) == self.replicas - 1
                                      and all(r.current for r in cl.replicas)):
                break
            await asyncio.sleep(0.1)
        leader = info.cluster.leader if info and info.cluster else None  # server name "nK"
        if leader and leader[1:].isdigit() and int(leader[1:]) <= len(self.servers):
            return self.servers[int(leader[1:]) - 1]
        return None

    async def publish_async(self, payload: bytes) -> asyncio.Future:
        return await self.js.publish_async(SUBJECT, payload)

    async def stored(self) -> int:
        return (await self.js.stream_info(STREAM)).state.messages

    async def close(self) -> None:
        if self.nc is not None:
            await self.nc.close()

    @staticmethod
    def client_version() -> str:
        from importlib.metadata import version
        return f"nats-py {version('nats-py')}"


class TidelogPublisher:
    """A fresh topic per run (TIDELOG_QUEUES write queues) made at the leader / master; one
    Producer = one connection, its sends pipelined on it."""

    topic: str | None = None

    def __init__(self, servers: list[str], leader: str | None):
        self.servers, self.leader = list(servers), leader
        self.p = self.admin = None
        self._nowait = None

    def _bootstrap(self) -> list[str]:
        first = self.leader if self.leader in self.servers else None
        return ([first] if first else []) + [s for s in self.servers if s != first]

    async def connect(self, prefer: str | None = None) -> None:
        from broker.client import Admin, Producer
        self.admin = Admin(self._bootstrap())
        self.p = Producer(self._bootstrap(), send_timeout_ms=SEND_TIMEOUT_MS)  # connects on the first send
        self._nowait = getattr(self.p, "send_nowait", None)

    async def setup(self) -> str | None:
        TidelogPublisher.topic = f"peers_{os.getpid()}_{int(time.time() * 1000)}"
        await self.admin.create_topic_async(TidelogPublisher.topic, TIDELOG_QUEUES)
        return self.leader

    async def publish_async(self, payload: bytes) -> asyncio.Future:
        if self._nowait is not None:
            return self._nowait(TidelogPublisher.topic, payload)
        return asyncio.ensure_future(self.p.send_async(TidelogPublisher.topic, payload))

    async def stored(self) -> int:
        info = await self.admin.describe_topic_async(TidelogPublisher.topic)
        return sum(q.max_offset - q.min_offset for q in info.queues)

    async def close(self) -> None:
        for c in (self.p, self.admin):
            if c is not None:
                await c.aclose()

    def client_version(self) -> str:
        import broker
        how = "send_nowait" if self._nowait is not None else "send_async task"
        return f"tidelog.broker.client {broker.__version__} ({how})"


# --------------------------------------------------------------------------- measuring

def cpu_self_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def machine_ticks() -> tuple[float, float, float]:
    """(all, idle + iowait, steal) ticks of every core, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return float(sum(v)), float(v[3] + v[4]), float(v[7]) if len(v) > 7 else 0.0


def pct(sorted_vals, p: float) -> float | None:
    """The nearest-rank percentile (bench.py's)."""
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1, int(round(p / 100.0 * len(sorted_vals) + 0.5)) - 1))
    return sorted_vals[k]


async def publish_n(pub, n: int, window: int, payload: bytes, deadline: float,
                    lat: array.array) -> tuple[int, int]:
    """Publish n messages with at most `window` unacknowledged (bench/window.py, the loop
    `make bench` uses too). Returns (acked, errors)."""
    m = Window(deadline, n, lat)
    acked_before = len(lat)
    await run_window(pub.publish_async, payload, window, m, DRAIN_TIMEOUT_S)
    return len(lat) - acked_before, m.errors


async def measure(target, window: int, messages: int, cap_s: float, warmup: int, payload_bytes: int) -> dict:
    """One run against a running system: fresh stream/topic, warm-up, N messages or cap_s."""
    if target.system.kind == "nats":
        control, pub = NatsPublisher(target.servers, target.system.nodes), NatsPublisher(target.servers,
                                                                                        target.system.nodes)
    else:
        control, pub = TidelogPublisher(target.servers, target.leader), TidelogPublisher(target.servers,
                                                                                        target.leader)
    await control.connect()
    try:
        leader = await control.setup()
    finally:
        await control.close()
    payload = os.urandom(payload_bytes)
    with frozen_heap():  # not what bench.py does (see frozen_heap): the harness's own objects out of the way
        return await _measure(target, pub, leader, window, messages, cap_s, warmup, payload_bytes, payload)


async def _measure(target, pub, leader, window, messages, cap_s, warmup, payload_bytes, payload) -> dict:
    await pub.connect(prefer=leader)
    try:
        warm = 0
        if warmup:
            warm, _ = await publish_n(pub, warmup, window, payload, time.perf_counter() + 30, array.array("d"))
        lat = array.array("d")
        m0, s0, c0 = machine_ticks(), [process_cpu_s(p) for p in target.pids], cpu_self_s()
        t0 = time.perf_counter()
        acked, errors = await publish_n(pub, messages, window, payload, t0 + cap_s, lat)
        t1 = time.perf_counter()
        c1, s1, m1 = cpu_self_s(), [process_cpu_s(p) for p in target.pids], machine_ticks()
        stored = await pub_stored(pub, target)
        client = pub.client_version()
    finally:
        await pub.close()
    wall = t1 - t0
    sl = sorted(lat)
    ms = lambda x: None if x is None else round(x * 1000, 4)
    per_msg = lambda s: round(s / max(acked, 1) * 1e6, 1)
    server_each = [b - a for a, b in zip(s0, s1)]
    ticks = m1[0] - m0[0]
    return {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%S"), "label": f"a_w{window}",
        "system": "nats-jetstream" if target.system.kind == "nats" else "tidelog",
        "system_key": target.system.key, "server_version": target.name, "client": client,
        "python": platform.python_version(), "replicas": target.system.nodes, "payload": payload_bytes,
        "conns": 1, "window": window, "mode": "async", "leader": leader,
        "n_target": messages, "n_acked": acked, "errors": errors, "warmup_acked": warm,
        "stream_msgs": stored, "wall_s": round(wall, 3), "msgs_per_s": round(acked / wall, 1),
        "MB_per_s": round(acked * payload_bytes / wall / 1e6, 2),
        "lat_ms_p50": ms(pct(sl, 50)), "lat_ms_p99": ms(pct(sl, 99)), "lat_ms_p999": ms(pct(sl, 99.9)),
        "lat_ms_max": ms(sl[-1] if sl else None),
        "client_cpu_s": round(c1 - c0, 3), "client_cpu_us_per_msg": per_msg(c1 - c0),
        "server_cpu_s": round(sum(server_each), 3), "server_cpu_us_per_msg": per_msg(sum(server_each)),
        "server_pids": list(target.pids), "server_cpu_us_per_msg_each": [per_msg(s) for s in server_each],
        "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "machine_busy_frac": round(1 - (m1[1] - m0[1]) / ticks, 3) if ticks > 0 else None,
        "machine_steal_frac": round((m1[2] - m0[2]) / ticks, 3) if ticks > 0 else None,
        "cpus": os.cpu_count(),
    }


async def pub_stored(pub, target) -> int | None:
    """Messages the system holds for this run's stream/topic (warm-up included); None if it cannot say."""
    try:
        return await pub.stored()
    except Exception:
        return None
