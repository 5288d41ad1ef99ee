"""Real master-slave groups on loopback (one process per node): SYNC masters under load, a
slave's death, kill -9 of the master with promotion of the best slave and the old master's
return (truncated to the fork point), and the same failover with an ASYNC master, where we
measure what is lost."""

import asyncio
import collections
import random
import signal
import time

import pytest
import uvloop

from broker.client import Admin, Consumer, Producer, SendError
from broker.protocol.codes import Code
from broker.store.logreader import iter_entries, log_bytes
from ops.cluster import LocalCluster

pytestmark = pytest.mark.slow

TOPIC = "ha"
FAST = dict(segment_bytes=1 << 20, message_body_bytes_max=64 << 10, ha_heartbeat_interval_ms=200,
            ha_housekeeping_interval_ms=1500, slave_ack_timeout_ms=1000, metadata_sync_interval_ms=500,
            ha_probe_interval_ms=300, log_level="INFO")
# small kernel buffers on the HA sockets: a paused slave cannot soak up what its master writes,
# so a master that goes on alone (or dies) holds a suffix its slaves never got; heartbeats of
# 700 ms: a paused slave counts as in sync for 1.4 s (2 heartbeats), the length of the pauses
# below, so the master stores sends its slaves never get (after that it refuses them)
FORK = dict(FAST, ha_socket_buffer_bytes=16 << 10, ha_heartbeat_interval_ms=700)


class Load:
    """Producers sending numbered messages; what each send's answer was."""

    def __init__(self, addresses, rng, window=16, body_max=200):
        self.addresses, self.rng, self.window, self.body_max = addresses, rng, window, body_max
        self.acked = {}  # msg_id -> (queue_id, queue_offset, body, time)
        self.stored_unconfirmed = set()  # bodies answered FLUSH_SLAVE_TIMEOUT / FLUSH_DISK_TIMEOUT
        self.unknown = set()  # bodies whose outcome is unknown
        self.codes = collections.Counter()
        self.stop = False

    async def run(self, seconds):
        p = Producer(self.addresses, retry_times_when_send_failed=0, send_timeout_ms=3000,
                     failover_timeout_ms=20_000)
        stop_at = time.monotonic() + seconds
        counter = iter(range(10**9))

        async def worker():
            while time.monotonic() < stop_at and not self.stop:
                body = b"msg-%08d-" % next(counter) + self.rng.randbytes(self.rng.randrange(self.body_max))
                try:
                    r = await p.send_async(TOPIC, body)
                except SendError as e:
                    self.codes[Code(e.code).name] += 1
                    if e.stored is True:
                        self.stored_unconfirmed.add(body)
                    elif e.stored is None:
                        self.unknown.add(body)
                    await asyncio.sleep(0.01)
                    continue
                self.codes["SUCCESS"] += 1
                self.acked[r.msg_id] = (r.queue_id, r.queue_offset, body, time.monotonic())

        await asyncio.gather(*(worker() for _ in range(self.window)))
        await p.aclose()


def admin(addresses, fn):
    with Admin(addresses) as a:
        return fn(a)


def read_all(addresses, expect, group="verify"):
    """Everything in the topic: until `expect` messages came, or nothing came for 1.5 s."""
    got, idle = [], 0
    with Consumer(addresses, group, TOPIC, auto_commit=False) as c:
        deadline = time.monotonic() + 30
        while len(got) < expect and time.monotonic() < deadline and (idle < 3 or not got):
            batch = c.poll(timeout_ms=500, max_messages=1000)
            idle = 0 if batch else idle + 1
            got += batch
        got += c.poll(timeout_ms=300)
    return got


def check_once_in_order(load, got, may_lose=()):
    seen = {}
    for m in got:
        assert m.msg_id not in seen, "a message is stored twice"
        seen[m.msg_id] = m
    missing = [mid for mid in load.acked if mid not in seen and mid not in may_lose]
    assert not missing, f"{len(missing)} acknowledged messages lost"
    for mid, (qid, qoff, body, _) in load.acked.items():
        if mid in seen:
            assert (seen[mid].queue_id, seen[mid].queue_offset, seen[mid].body) == (qid, qoff, body)
    extra = [m for m in got if m.msg_id not in load.acked]
    assert all(m.body in load.stored_unconfirmed | load.unknown for m in extra)
    per_queue = {}
    for m in got:
        per_queue.setdefault(m.queue_id, []).append(m.queue_offset)
    for q, offs in per_queue.items():
        assert offs == list(range(offs[0], offs[0] + len(offs))), f"queue {q} has gaps"
    return seen


def replicas_agree(c: LocalCluster) -> int:
    """Every node's CommitLog bytes are equal up to the slowest node's end; that end."""
    ends = [n["store"]["max_offset"] for n in c.status()["nodes"]]
    limit = min(ends)
    blobs = [log_bytes(n.data_dir, limit) for n in c.nodes]
    assert all(b == blobs[0] for b in blobs), "replicas differ below the slowest one's end"
    return limit


def wait_caught_up(c: LocalCluster, timeout_s=20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        st = c.status()
        ends = {n["id"]: n.get("store", {}).get("max_offset") for n in st["nodes"]}
        if st["verdict"] == "healthy" and len(set(ends.values())) == 1:
            return st
        assert time.monotonic() < deadline, f"the group did not catch up: {st}"
        time.sleep(0.1)


def start_group(c: LocalCluster, nodes: int, topic_queues: int | None = 4, **cfg) -> list[str]:
    """Start a master-slave group, wait until every slave copies, create the topic."""
    c.up(nodes, "master-slave", "async", **cfg)
    assert c.wait_healthy()["verdict"] == "healthy"
    if topic_queues:
        with Admin(c.addresses) as a:
            a.create_topic(TOPIC, topic_queues)
    return c.addresses


def test_sync_master_with_two_slaves_under_load_and_a_switchover(tmp_path, seed):
    """Every acknowledged send is on the master and a slave; the HA status says so; a
    planned switchover (promote with the master alive) loses nothing."""
    rng = random.Random(seed)
    c = LocalCluster(tmp_path / "cluster")
    load = Load(None, rng)
    try:
        load.addresses = start_group(c, 3, ha_replication="sync", **FAST)

        async def scenario():
            task = asyncio.create_task(load.run(6.0))
            await asyncio.sleep(2.0)
            st = await asyncio.to_thread(c.status)
            before = load.codes["SUCCESS"]
            report = await asyncio.to_thread(admin, c.addresses[1:], lambda a: a.promote("n1"))
            await asyncio.sleep(2.0)
            assert load.codes["SUCCESS"] > before + 50, "producers did not carry on after the switchover"
            await task
            return st, report

        st, report = uvloop.run(scenario())
        m = next(n for n in st["nodes"] if n["id"] == "n0")["replication"]
        assert m["role"] == "master" and m["slave_count"] == 2 and m["in_sync_count"] == 3
        assert all(s["ack_offset"] > 0 and s["in_sync"] for s in m["slaves"].values())
        assert any(s["transfer_rate_bytes_per_s"] > 0 for s in m["slaves"].values())
        assert report["switchover"] and report["clean"] and report["followers"]["n0"] == "following"
        st = wait_caught_up(c)
        assert {n["id"]: n["role"] for n in st["nodes"]} == {"n0": "slave", "n1": "master", "n2": "slave"}
        got = read_all(c.addresses, len(load.acked))
        replicas_agree(c)
    finally:
        c.down()
    assert len(load.acked) > 300, f"too little load: {load.codes}"
    check_once_in_order(load, got)
    assert not load.stored_unconfirmed, load.codes  # a switchover is not a failure


def test_dead_slave_gives_clear_errors_and_nothing_acked_is_missing_from_it(tmp_path, seed):
    rng = random.Random(seed)
    c = LocalCluster(tmp_path / "cluster")
    load = Load(None, rng)
    try:
        load.addresses = start_group(c, 2, None, ha_replication="sync", **FAST)[:1]

        async def scenario():
            task = asyncio.create_task(load.run(60.0))  # stopped once sends succeed again
            await asyncio.sleep(1.5)
            c.kill("n1")
            killed_at = time.monotonic()
            await asyncio.sleep(0.3)
            on_slave = {e.msg_id.hex() for e in iter_entries(c.node("n1").data_dir)}
            acked_then = {mid for mid, (*_, t) in load.acked.items()}
            await asyncio.sleep(2.0)
            during = collections.Counter(load.codes)
            acked_while_dead = [mid for mid, (*_, t) in load.acked.items() if t > killed_at + 0.05]
            await asyncio.to_thread(c.restart, "n1")
            # (a restart took seconds on a loaded box: a load of a fixed 6 s could end first)
            deadline = time.monotonic() + 30
            while load.codes["SUCCESS"] <= during["SUCCESS"] + 20 and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            load.stop = True
            await task
            return on_slave, acked_then, during, acked_while_dead

        on_slave, acked_then, during, acked_while_dead = uvloop.run(scenario())
        assert acked_then and acked_then <= on_slave, "an acknowledged send is not on the slave"
        assert not acked_while_dead, "a send was acknowledged while its only slave was dead"
        assert during["SLAVE_NOT_AVAILABLE"] > 0, during
        with Admin(c.addresses) as a:
            assert a.status()["replication"]["in_sync_count"] == 2  # the slave is back
        wait_caught_up(c)
        got = read_all(c.addresses, len(load.acked))
        replicas_agree(c)
    finally:
        c.down()
    assert load.codes["SUCCESS"] > during["SUCCESS"], "sends did not succeed again after the slave came back"
    check_once_in_order(load, got)


def run_failover(tmp_path, rng, replication, pause_s, window, body_max):
    """Pause both slaves (the master goes on alone for a moment), kill -9 the master, wake
    the slaves, promote the best one, keep producing, bring the old master back."""
    c = LocalCluster(tmp_path / "cluster")
    load = Load(None, rng, window, body_max)
    facts = {}
    try:
        load.addresses = start_group(c, 3, ha_replication=replication, **FORK)

        async def scenario():
            task = asyncio.create_task(load.run(7.0))
            await asyncio.sleep(1.5)
            for n in ("n1", "n2"):
                c.kill(n, signal.SIGSTOP)
            await asyncio.sleep(pause_s)
            c.kill("n0")
            for n in ("n1", "n2"):
                c.kill(n, signal.SIGCONT)
            old_log = list(iter_entries(c.node("n0").data_dir))
            await asyncio.sleep(0.5)
            ends = {n: (await asyncio.to_thread(admin, [c.node(n).address], Admin.status))["store"]["max_offset"]
                    for n in ("n1", "n2")}
            best = max(ends, key=lambda n: (ends[n], n == "n1"))
            t0 = time.monotonic()
            report = await asyncio.to_thread(admin, [c.node(best).address], lambda a: a.promote(best))
            facts["promote_s"] = time.monotonic() - t0
            before = load.codes["SUCCESS"]
            await asyncio.sleep(2.0)
            facts["carried_on"] = load.codes["SUCCESS"] - before
            await asyncio.to_thread(c.restart, "n0")
            await task
            return old_log, best, report

        old_log, best, report = uvloop.run(scenario())
        st = wait_caught_up(c)
        new_master = next(n for n in st["nodes"] if n["id"] == best)["replication"]
        fork = new_master["epochs"][-1][1]
        rejoined = next(n for n in st["nodes"] if n["id"] == "n0")["replication"]
        assert rejoined["role"] == "slave" and rejoined["master"] == best
        assert rejoined["epochs"] == new_master["epochs"]
        got = read_all(c.addresses, len(load.acked))
        agreed = replicas_agree(c)
    finally:
        c.down()
    # SYNC: every acknowledged send is on the promoted slave. ASYNC: the master acknowledged
    # alone, so a failover with it unreachable is never clean, and says what may be lost
    # (issue 39 item 4: it had been reported clean, and lost what the test below counts)
    assert report["clean"] == (replication == "sync"), report
    facts["report"] = report
    assert facts["carried_on"] > 20, "producers did not carry on after the promotion"
    assert agreed > fork
    forked = [e for e in old_log if e.phys_offset >= fork]
    assert forked, "the old master wrote nothing past the fork point: no truncation was tested"
    with open(c.node("n0").home + "/broker.log") as f:
        assert f"cut this log at offset {fork}" in f.read()
    return load, got, forked, facts


def test_sync_failover_promote_and_old_master_rejoins_truncated(tmp_path, seed):
    # paused longer than slave_ack_timeout_ms: some sends are answered FLUSH_SLAVE_TIMEOUT
    # (bodies of up to 16 KiB: the one window of sends stored during the pause, ~256 KiB, outgrows
    # the ~64 KiB of kernel buffers per slave even when a slow box stores only one round)
    load, got, forked, facts = run_failover(tmp_path, random.Random(seed), "sync", 1.3, 32, 16384)
    check_once_in_order(load, got)  # nothing acknowledged is lost
    forked_ids = {e.msg_id.hex() for e in forked if e.topic == TOPIC}
    assert not forked_ids & set(load.acked)  # what the fork cut was never acknowledged
    assert load.codes["FLUSH_SLAVE_TIMEOUT"] > 0, load.codes


def test_async_failover_loses_only_the_unreplicated_suffix(tmp_path, seed, record_property):
    load, got, forked, facts = run_failover(tmp_path, random.Random(seed), "async", 0.6, 8, 400)
    present = {m.msg_id for m in got}
    lost = {mid for mid in load.acked if mid not in present}
    forked_ids = {e.msg_id.hex() for e in forked if e.topic == TOPIC}
    assert lost == forked_ids & set(load.acked), "lost messages are exactly the acknowledged ones past the fork"
    check_once_in_order(load, got, may_lose=lost)
    lost_bytes = sum(e.size for e in forked if e.msg_id.hex() in lost)
    record_property("async_failover_lost_acked", len(lost))
    loss = facts["report"]["may_lose"]
    print(f"\nASYNC failover: {len(lost)} acknowledged messages ({lost_bytes} bytes) lost out of "
          f"{len(load.acked)}; the master ran 0.6 s with its slaves paused; the verdict: {loss['text']}")
    assert lost, "the scenario should lose the acknowledged suffix an ASYNC master wrote alone"
    # no self-fence: what the master held at its last report is all the promoter knows, and
    # it does not bound what was lost (the master took more after it): the verdict says so
    assert loss["master"] == "n0" and loss["bytes_max"] is None and "no bound" in loss["text"], loss
    assert loss["at_last_report_bytes"] is not None, loss
