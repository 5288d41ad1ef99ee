"""The drill's workload: acknowledged sends at a fixed rate, every operation recorded; after
healing, a drain that reads every queue of the topic from its start.

Each operation's message carries its op id (key `op-<id>`, body `<run>:<id>`), so the checker
can tell every read apart. Sends are scheduled at `rate` per second (open loop, at most
`concurrency` in flight), so a stalled group shows as a gap in acknowledgements rather than
as a workload that slowed down politely.

With name servers (`namesrv`), the sends go through a ClusterProducer over every group holding
the topic: each operation records the group that acknowledged it, and the drain reads each
group's queues directly (through no name server: what it proves must not depend on them),
each read labelled with its group. The producer refreshes its routes every
ROUTE_REFRESH_MS, so a name-server outage is felt (failed refreshes that keep the known
route) rather than slept through between two refreshes 30 s apart.
"""

from __future__ import annotations

import asyncio
import threading
import time

from broker.client import Admin, Consumer, Producer
from broker.client.cluster import ClusterProducer
from broker.client.errors import SendError, TidelogError
from ops.drill.checker import Op, Read

TOPIC_QUEUES = 4
ROUTE_REFRESH_MS = 1000


class WorkloadThread:
    """A drill workload's life (this module's Workload, kafka_workload.KafkaWorkload): its
    operations, sent from a thread of its own by `_run` until `stop`; what `_run` raises is
    kept in `error` for the drill to report."""

    thread_name = "drill-workload"

    def __init__(self, bootstrap: list[str], topic: str, run_id: str, rate: float, credentials=None):
        self.bootstrap, self.topic, self.run_id, self.rate = bootstrap, topic, run_id, rate
        self.credentials = credentials  # ops.security.credentials_for(spec)
        self.ops: list[Op] = []
        self.acked = 0  # operations acknowledged so far (for progress)
        self.t_start = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def now(self) -> float:
        return time.monotonic() - self.t_start

    def start(self, t_start: float) -> None:
        self.t_start = t_start
        self._thread = threading.Thread(target=self._main, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop issuing; wait for the operations in flight to complete (each is bounded by the
        client's own timeouts)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the drill, never silently lost
            self.error = e

    def _run(self) -> None:
        raise NotImplementedError


class Workload(WorkloadThread):
    def __init__(self, bootstrap: list[str], topic: str, run_id: str, rate: float, concurrency: int = 16,
                 send_timeout_ms: int = 2000, failover_timeout_ms: int = 10_000, credentials=None,
                 namesrv: list[str] | None = None):
        super().__init__(bootstrap, topic, run_id, rate, credentials)
        self.namesrv = namesrv  # name server addresses: send through them to every group
        self.concurrency = concurrency
        self.send_timeout_ms, self.failover_timeout_ms = send_timeout_ms, failover_timeout_ms

    # --- producing -------------------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.run(self._produce())

    async def _produce(self) -> None:
        kw = dict(send_timeout_ms=self.send_timeout_ms, credentials=self.credentials,
                  failover_timeout_ms=self.failover_timeout_ms, retry_times_when_send_failed=2)
        p = (ClusterProducer(self.namesrv, route_refresh_interval_ms=ROUTE_REFRESH_MS, **kw) if self.namesrv
             else Producer(self.bootstrap, **kw))
        sem = asyncio.Semaphore(self.concurrency)
        tasks: set[asyncio.Task] = set()
        try:
            i = 0
            while not self._stop.is_set():
                due = i / self.rate
                wait = due - self.now()
                if wait > 0:
                    await asyncio.sleep(min(wait, 0.1))
                    continue
                await sem.acquire()
                op = Op(i, t0=self.now())
                self.ops.append(op)
                t = asyncio.create_task(self._one(p, op))
                tasks.add(t)
                t.add_done_callback(lambda t: (tasks.discard(t), sem.release()))
                i += 1
            if tasks:
                await asyncio.wait(tasks)
        finally:
            await p.aclose()

    async def _one(self, p: Producer | ClusterProducer, op: Op) -> None:
        try:
            r = await p.send_async(self.topic, f"{self.run_id}:{op.id}".encode(), key=f"op-{op.id}")
            op.outcome, op.queue, op.offset = "ok", r.queue_id, r.queue_offset
            if self.namesrv:
                op.group = r.broker_name
            self.acked += 1
            op.attempts, op.possible_duplicate = r.attempts, r.possible_duplicate
        except SendError as e:
            op.outcome = "fail" if e.stored is False else "unknown"
            op.attempts, op.error = e.attempts, str(e)[:200]
        except TidelogError as e:
            op.outcome, op.error = "unknown", f"{type(e).__name__}: {e}"[:200]
        except Exception as e:  # noqa: BLE001 - a client bug is recorded, not a crashed drill
            op.outcome, op.error = "unknown", f"{type(e).__name__}: {e}"[:200]
        op.t1 = self.now()


def ensure_topic(bootstrap: list[str], topic: str, queues: int = TOPIC_QUEUES, timeout_s: float = 30,
                 credentials=None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with Admin(bootstrap, request_timeout_ms=3000, credentials=credentials) as a:
                if topic not in a.list_topics():
                    a.create_topic(topic, queues)
                return
        except TidelogError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def queue_ranges(bootstrap: list[str], topic: str, credentials=None) -> dict[int, tuple[int, int]]:
    """queue -> (min offset, max offset), asking every node and keeping the highest end: a
    follower that is still catching up (healthy: within its lag bound) answers from its own
    ConsumeQueue and would make a drain stop short."""
    ranges: dict[int, tuple[int, int]] = {}
    errors = []
    for address in bootstrap:
        try:
            with Admin([address], request_timeout_ms=5000, credentials=credentials) as a:
                info = a.describe_topic(topic)
        except TidelogError as e:
            errors.append(f"{address}: {e}")
            continue
        for q in info.queues:
            lo, hi = ranges.get(q.queue_id, (q.min_offset, q.max_offset))
            ranges[q.queue_id] = (min(lo, q.min_offset), max(hi, q.max_offset))
    if not ranges:
        raise TidelogError(f"no node described topic {topic}: {'; '.join(errors)}")
    return ranges


def drain(bootstrap: list[str], topic: str, run_id: str, timeout_s: float = 60.0,
          problems: list[str] | None = None, credentials=None, group: str | None = None) -> list[Read]:
    """Read every message of `topic` from each queue's start to its end (after healing). With a
    `problems` list, a drain that cannot finish (a node serving an unreadable entry, time out)
    says why there and returns what it read: the checker then reports what is missing.
    `group`: the broker group `bootstrap` belongs to, stamped on every read (several groups)."""
    expect = sum(hi - lo for lo, hi in queue_ranges(bootstrap, topic, credentials).values())
    reads: list[Read] = []
    prefix = f"{run_id}:".encode()
    consumer_group = f"drill-drain-{run_id}-{int(time.time() * 1000)}"
    try:
        with Consumer(bootstrap, consumer_group, topic, from_where="earliest", auto_commit=False,
                      credentials=credentials) as c:
            deadline = time.monotonic() + timeout_s
            while len(reads) < expect and time.monotonic() < deadline:
                for m in c.poll(timeout_ms=500, max_messages=1000):
                    op_id = int(m.body[len(prefix):]) if m.body.startswith(prefix) else None
                    reads.append(Read(op_id, m.queue_id, m.queue_offset, group))
        if len(reads) < expect:
            raise TidelogError(f"drain read {len(reads)} of {expect} messages in {timeout_s}s")
    except TidelogError as e:
        if problems is None:
            raise
        problems.append(f"drain{f' of group {group}' if group else ''} stopped after {len(reads)} "
                        f"of {expect} messages: {e}")
    return reads
