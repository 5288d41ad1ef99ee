"""kill -9 of a `flush: sync` broker under load, then restart: every acknowledged message
is there, once, where it was acknowledged, in order per queue (a multi-process test)."""

import asyncio
import random
import time

import pytest
import uvloop

from broker.client import Consumer, Producer, SendError
from ops.localbroker import LocalBroker
from tests.helpers import poll_until

pytestmark = pytest.mark.slow

TOPIC = "crash"


async def load(address: str, rng: random.Random, seconds: float, acked: dict, unknown: set, n0: int):
    """Send with 32 in flight until the broker dies or time is up."""
    p = Producer([address], retry_times_when_send_failed=0, send_timeout_ms=2000)
    counter = iter(range(n0, n0 + 10**7))
    stop_at = time.monotonic() + seconds

    async def worker():
        while time.monotonic() < stop_at:
            i = next(counter)
            body = b"msg-%09d-" % i + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400)))
            try:
                r = await p.send_async(TOPIC, body, key=f"k{i}")
            except SendError as e:
                if e.stored is not False:
                    unknown.add(body)  # may or may not be there
                return
            acked[r.msg_id] = (r.queue_id, r.queue_offset, body)

    await asyncio.gather(*(worker() for _ in range(32)))
    await p.aclose()


def read_all(address: str, group: str, expect: int) -> list:
    with Consumer([address], group, TOPIC, auto_commit=False) as c:
        got = poll_until(c, expect, 30, 500, max_messages=1000)
        got += c.poll(timeout_ms=500)  # (and any more: a duplicate is a failure)
    return got


def test_kill_minus_9_under_load_loses_nothing_acknowledged(tmp_path, seed):
    rng = random.Random(seed)
    b = LocalBroker(tmp_path / "b", flush="sync", segment_bytes=1 << 20, message_body_bytes_max=64 << 10,
                    cq_records_per_file=512,
                    index_slots=4096, index_entries_max=65536, log_level="WARNING")
    acked: dict = {}
    unknown: set = set()
    try:
        b.start()
        for rnd in range(3):
            async def round_():
                task = asyncio.create_task(load(b.address, rng, 3.0, acked, unknown, rnd * 10**6))
                await asyncio.sleep(0.4 + rng.random() * 0.8)
                b.kill()  # SIGKILL while sends are in flight
                await task
            uvloop.run(round_())
            b.start()
        got = read_all(b.address, "verify", len(acked))
    finally:
        b.stop()
    assert len(acked) > 500, f"too little load to mean anything ({len(acked)} acked)"
    seen = {}
    for m in got:
        assert m.msg_id not in seen, f"{m.msg_id} is stored twice"
        seen[m.msg_id] = m
    missing = [mid for mid in acked if mid not in seen]
    assert not missing, f"{len(missing)} acknowledged messages lost, e.g. {missing[:3]}"
    for mid, (qid, qoff, body) in acked.items():
        m = seen[mid]
        assert (m.queue_id, m.queue_offset, m.body) == (qid, qoff, body)
    extra = [m for m in got if m.msg_id not in acked]
    assert all(m.body in unknown for m in extra), "a message appeared that was never sent"
    per_queue = {}
    for m in got:
        per_queue.setdefault(m.queue_id, []).append(m.queue_offset)
    for q, offs in per_queue.items():
        assert offs == list(range(offs[0], offs[0] + len(offs))), f"queue {q} has gaps or disorder"
