"""`make bench`: one JSON line per workload on stdout.

The brokers run as their own processes on loopback (one for standalone, three for raft,
two or three for master-slave); this process is the client. Every message is individually
acknowledged. Each connection keeps at most `window` sends in flight (a semaphore), issuing
with `Producer.send_nowait` when the client has it, else a task per `send_async`
(`client_api` says which); latency runs from the issue to the ack. Each workload warms up,
then measures until `duration_s` or `messages` runs out. `server_cpu_s` sums every broker
process of the group; the `*_cpu_us_per_msg` fields divide the measured window's CPU by the
acknowledged messages: this process, each broker in node order (`server_nodes` gives each
one's id, its role when the measured window started and `role_end` when it ended; a raft
row's window starts once every group has a leader, so that it never measures an election), their sum,
and everything (`cpu_us_per_msg`).
`hop-floor-raft3-w1` is raft-3's W=1 round trip with no broker in it (bench/hop_floor.py):
three bare processes that frame, pwrite and forward, the floor under `raft3-c1-w1`.
`raft3-failover` kills the leader with SIGKILL ten times and reports how long the group
took to have a new leader (polling every 10 ms). `reconcile-3replicas` times the Spark
reconcile job on 3 x N crafted 1 KiB entries against a sequential Python scan
(bench/reconcile_bench.py). `sql-query-server` times 10 queries through the SQL query server
against one `tidelog sql` on the cold path (bench/sql_bench.py). `fuzz` sends 1,000,000
generated frames (mutated valid ones and garbage, seeded) to a standalone broker over several
connections and reports its RSS and open fds before and after, and whether it still serves
(bench/fuzz_bench.py).
`raft3x2-ns-c1-w1` / `-w256` start two raft groups of three nodes and one name server, create
the topic on both groups through the name server (QUEUES per group) and send through
`ClusterProducer`, bootstrapped from the name server only; `server_cpu_s` sums all six brokers
and the name server, `group_acked` counts each group's acknowledgements (the SendResult's
`broker_name`). Every process shares this machine, so that row is a CPU-per-message figure;
what two groups give is one group's throughput times the groups, on separate hosts (`note`).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import uvloop

from broker.client import Admin, Producer
from broker.client.cluster import ClusterProducer, create_topic
from bench.window import Window, frozen_heap, process_cpu_s, run_window
from ops.cluster import LocalCluster

TOPIC = "bench"
QUEUES = 8
WARMUP_S = 0.5
SETTLE_S = 15.0  # sends still unanswered this long after the phase ends count as errors
FAILOVER_TRIALS = 10


@dataclass(frozen=True)
class Workload:
    name: str
    flush: str
    conns: int
    window: int
    mode: str = "standalone"
    payload: int = 1024
    nodes: int = 1
    ha: tuple = ()  # master-slave: (ha_replication, in_sync_replicas)
    secure: bool = False  # TLS + SCRAM auth + ACL checks on (the default of deploy / cluster up)
    groups: int = 1  # broker groups of `nodes` nodes each; with more than one, behind `namesrv`
    namesrv: int = 0  # name servers: the producer is a ClusterProducer bootstrapped from them

    @property
    def replicas(self) -> int:
        return self.nodes

    @property
    def full_name(self) -> str:
        return f"{self.name}-{self.flush}" + ("-tls" if self.secure else "")

    @property
    def group(self) -> tuple:
        """Workloads with the same group share one running cluster."""
        return (self.mode, self.nodes, self.flush, self.ha, self.secure, self.groups, self.namesrv)

    def cluster_config(self) -> dict:
        if self.mode != "master-slave":
            return {}
        return {"ha_replication": self.ha[0], "in_sync_replicas": self.ha[1]}


WORKLOADS = [
    Workload(name, flush, conns, window)
    for flush in ("async", "sync")
    for name, conns, window in (("send-c1-w1", 1, 1), ("send-c1-w256", 1, 256), ("send-c4-w256", 4, 256))
] + [
    Workload(name, flush, 1, window, mode="raft", nodes=3)
    for flush in ("async", "sync")
    for name, window in (("raft3-c1-w1", 1), ("raft3-c1-w256", 256))
] + [  # master-slave, flush async: SYNC with 1 slave, SYNC with 2 (either / both ack), ASYNC
    Workload(name, "async", 1, window, mode="master-slave", nodes=nodes, ha=ha)
    for name, window, nodes, ha in (
        ("ms-sync-1slave-c1-w1", 1, 2, ("sync", 2)),
        ("ms-sync-1slave-c1-w256", 256, 2, ("sync", 2)),
        ("ms-sync-2slaves-c1-w256", 256, 3, ("sync", 2)),
        ("ms-sync-2slaves-all-c1-w256", 256, 3, ("sync", 3)),
        ("ms-async-2slaves-c1-w256", 256, 3, ("async", 2)),
    )
] + [  # the cost of security: the same W=256 rows with TLS on every port and an authenticated user
    Workload("send-c1-w256", "async", 1, 256, secure=True),
    Workload("raft3-c1-w256", "async", 1, 256, mode="raft", nodes=3, secure=True),
] + [  # issue 16: the topic over 2 raft groups x 3 nodes, clients routed by 1 name server
    Workload(name, "async", 1, window, mode="raft", nodes=3, groups=2, namesrv=1)
    for name, window in (("raft3x2-ns-c1-w1", 1), ("raft3x2-ns-c1-w256", 256))
]
FAILOVER = "raft3-failover"
GROUPS_NOTE = (f"all processes (both groups' brokers, the name server, the client) share this machine's "
               f"{os.cpu_count()} cores: "
               "this row is a CPU-per-message figure, not a scaling claim; the scaling claim is one group's "
               "msgs_per_s (the raft3 row) times the groups, each group on hosts of its own")


def cpu_steal_s() -> float:
    """CPU time the hypervisor gave to someone else (all cores), from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def percentile(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return 0.0
    k = min(len(sorted_vals) - 1, max(0, int(round(p / 100 * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


class ServerNode(NamedTuple):
    """One broker process of the group, as the run found it before measuring."""
    id: str
    role: str | None  # leader/follower, master/slave, standalone (None: no answer)
    pid: int


def us_per_msg(cpu_s: float, n: int) -> float:
    return round(cpu_s / n * 1e6, 2) if n else 0.0


def measured(m: Window, wall: float, payload: int, client_cpu: float, server_cpu: list[float]) -> dict:
    """A row's measured fields (the broker rows' and the hop floor's alike): throughput,
    latency percentiles of the acknowledged sends, CPU seconds."""
    lat = sorted(m.lat)
    n = len(lat)
    return {
        "n_acked": n, "errors": m.errors,
        "wall_s": round(wall, 3), "msgs_per_s": round(n / wall, 1),
        "MB_per_s": round(n * payload / wall / 1e6, 2),
        "lat_ms_p50": round(percentile(lat, 50) * 1e3, 3),
        "lat_ms_p99": round(percentile(lat, 99) * 1e3, 3),
        "lat_ms_p999": round(percentile(lat, 99.9) * 1e3, 3),
        "client_cpu_s": round(client_cpu, 3),
        "server_cpu_s": round(sum(server_cpu), 3),
    }


def cpu_per_msg(n: int, client_cpu: float, server_cpu: list[float]) -> dict:
    """CPU per acknowledged message: the client's, each server's, in all."""
    return {
        "client_cpu_us_per_msg": us_per_msg(client_cpu, n),
        "server_cpu_us_per_msg_each": [us_per_msg(x, n) for x in server_cpu],
        "server_cpu_us_per_msg": us_per_msg(sum(server_cpu), n),
        "cpu_us_per_msg": us_per_msg(client_cpu + sum(server_cpu), n),
    }


def sender(p: Producer, acked: Counter | None = None) -> tuple[str, object]:
    """The pipelined path the client has: `send_nowait` (coalescing) or a task per send_async;
    with `acked`, each acknowledgement counted under its SendResult's broker_name."""
    nowait = getattr(p, "send_nowait", None)
    if nowait is not None:
        api, send = "send_nowait", lambda body: nowait(TOPIC, body)
    else:
        api, send = "send_async", lambda body: asyncio.ensure_future(p.send_async(TOPIC, body))
    if acked is None:
        return api, send

    def count(f: asyncio.Future) -> None:
        if not f.cancelled() and f.exception() is None:
            acked[f.result().broker_name] += 1

    def counted(body: bytes) -> asyncio.Future:
        f = send(body)
        f.add_done_callback(count)
        return f
    return api, counted


async def run_workload(w: Workload, bootstrap: list[str], servers: list[ServerNode], duration_s: float,
                       messages: int, credentials=None, roles_now=lambda: {}) -> dict:
    """`bootstrap`: the group's addresses, or with `w.namesrv` the name servers'; `roles_now()`:
    each broker's role (blocking: run in a thread), asked as the measured window starts and ends."""
    if w.namesrv:
        producers = [ClusterProducer(bootstrap, send_timeout_ms=10_000, credentials=credentials)
                     for _ in range(w.conns)]
    else:
        producers = [Producer(bootstrap, send_timeout_ms=10_000, credentials=credentials) for _ in range(w.conns)]
    acked = Counter() if w.namesrv else None
    sends = [sender(p, acked) for p in producers]
    body = b"x" * w.payload

    async def phase(m: Window) -> None:
        await asyncio.gather(*(run_window(send, body, w.window, m, SETTLE_S) for _, send in sends))

    # warm up: connections, routes, page cache (counted nowhere)
    await phase(Window(time.perf_counter() + WARMUP_S, 1 << 62))
    if acked is not None:
        acked.clear()  # the warm-up's acks are all in: phase() waited for them
    roles_start = await asyncio.to_thread(roles_now)
    deadline = time.monotonic() + LEADER_WAIT_S
    while w.mode == "raft" and not _every_group_led(roles_start) and time.monotonic() < deadline:
        # a group is between leaders (a loaded box's pause can cost one an election):
        # measure once each group leads again, not an election
        await asyncio.sleep(0.05)
        roles_start = await asyncio.to_thread(roles_now)
    s0, steal0, c0 = [process_cpu_s(s.pid) for s in servers], cpu_steal_s(), time.process_time()
    t0 = time.perf_counter()
    m = Window(t0 + duration_s, messages)
    await phase(m)
    wall = time.perf_counter() - t0
    c1, s1, steal1 = time.process_time(), [process_cpu_s(s.pid) for s in servers], cpu_steal_s()
    roles_end = await asyncio.to_thread(roles_now)
    for p in producers:
        await p.aclose()
    client_cpu, server_cpu = c1 - c0, [b - a for a, b in zip(s0, s1)]
    groups = {}
    if w.namesrv:
        groups = {"groups": w.groups, "namesrvs": w.namesrv, "client": "ClusterProducer",
                  "group_acked": dict(sorted(acked.items())), "note": GROUPS_NOTE}
    return {
        "workload": w.full_name, "mode": w.mode, "replicas": w.replicas, "flush": w.flush, **groups,
        "security": "tls+scram" if w.secure else "off",
        **({"ha_replication": w.ha[0], "in_sync_replicas": w.ha[1]} if w.ha else {}),
        "payload": w.payload, "conns": w.conns, "window": w.window, "client_api": sends[0][0],
        **measured(m, wall, w.payload, client_cpu, server_cpu),
        "server_nodes": [{"id": s.id, "role": roles_start.get(s.id, s.role), "role_end": roles_end.get(s.id, s.role)}
                         for s in servers],
        **cpu_per_msg(len(m.lat), client_cpu, server_cpu),
        # this machine is a VM: CPU the host took away during the run explains slow runs
        "cpu_steal_s": round(steal1 - steal0, 3),
    }


LEADER_WAIT_S = 15.0


def _every_group_led(roles: dict[str, str | None]) -> bool:
    """Whether each group (node ids "g<k>-n<i>", or "n<i>" for one group) has a leader;
    an empty answer (no roles asked for) counts as led."""
    groups: dict[str, bool] = {}
    for node, role in roles.items():
        if role == "namesrv":
            continue
        g = node.split("-", 1)[0] if "-" in node else ""
        groups[g] = groups.get(g, False) or role == "leader"
    return all(groups.values())


def roles(c: LocalCluster) -> dict[str, str | None]:
    """Each broker's role now, in every group (None: no answer)."""
    return {r["id"]: r.get("role") for g in c.health()["groups"] for r in g["nodes"]}


def server_nodes(c: LocalCluster) -> list[ServerNode]:
    """The broker processes of every group in node order, each with the role it has now, then
    the name servers (role `namesrv`)."""
    now = roles(c)
    nodes = [ServerNode(n.id, now.get(n.id), n.pid) for n in c.nodes]
    nodes += [ServerNode(n.id, "namesrv", n.pid) for n in c.namesrvs]
    down = [s.id for s in nodes if s.pid is None]
    if down:
        raise RuntimeError(f"bench: {', '.join(down)} not running; its CPU cannot be measured")
    return nodes


def failover_trials(c: LocalCluster, trials: int) -> dict:
    """Kill -9 the leader, time until another node leads; restart it; `trials` times."""
    times = []
    for _ in range(trials):
        old = c.wait_for_leader()
        time.sleep(0.3)  # followers have heard the leader recently (its lease holds)
        t0 = time.perf_counter()
        c.kill(old, signal.SIGKILL)
        c.wait_for_leader(timeout_s=15, exclude=old)
        times.append((time.perf_counter() - t0) * 1000)
        c.restart(old)
    times.sort()
    return {"workload": FAILOVER, "mode": "raft", "replicas": 3, "trials": trials,
            "leader_ms_p50": round(statistics.median(times), 1), "leader_ms_min": round(times[0], 1),
            "leader_ms_max": round(times[-1], 1), "raft_election_timeout_ms": 300}


def workload_names() -> list[tuple[str, list[str]]]:
    """Every workload's name (what -w takes) by kind, in the order they run: for `tidelog bench
    --help` and the error for an unknown one."""
    from bench import fuzz_bench, hop_floor, kafka_bench, reconcile_bench, sql_bench

    kinds: dict[str, list[str]] = {}
    for w in WORKLOADS:
        kind = "TLS + auth" if w.secure else f"{w.groups} raft groups + name server" if w.namesrv else w.mode
        kinds.setdefault(kind, []).append(w.full_name)
    kinds["others"] = [hop_floor.NAME, FAILOVER, fuzz_bench.NAME, reconcile_bench.NAME, sql_bench.NAME]
    kinds["Kafka protocol"] = list(kafka_bench.NAMES)
    return list(kinds.items())


def workloads_help(width: int = 80) -> str:
    """The workloads by kind, each list wrapped at commas (never inside a name)."""
    return "\n".join(["Workloads (-w NAME; a NAME without its -async/-sync/-tls end picks every variant):"] + [
        textwrap.fill(f"{kind}: {', '.join(names)}", width, initial_indent="  ", subsequent_indent="    ",
                      break_on_hyphens=False, break_long_words=False)
        for kind, names in workload_names()])


def main(names: list[str], duration_s: float, messages: int, data_dir: Path,
         reconcile_entries: int = 1_000_000, fuzz_frames: int | None = None,
         fuzz_seed: int | None = None) -> int:
    from bench import fuzz_bench, hop_floor, kafka_bench, reconcile_bench, sql_bench

    chosen = [w for w in WORKLOADS if not names or w.full_name in names or w.name in names]
    floor = not names or hop_floor.NAME in names
    failover = not names or FAILOVER in names
    reconcile = not names or reconcile_bench.NAME in names
    sql = not names or sql_bench.NAME in names
    fuzz = not names or fuzz_bench.NAME in names
    kafka_fuzz = not names or kafka_bench.FUZZ in names
    kafka_rates = not names or kafka_bench.PRODUCE in names or kafka_bench.CONSUME in names
    unknown = [n for n in names if n not in {w.name for w in WORKLOADS} | {n for _, ns in workload_names() for n in ns}]
    if unknown:
        print(f"error: no such workload: {', '.join(unknown)}\n{workloads_help()}", file=sys.stderr)
        return 2
    data_dir = Path(data_dir).resolve()
    failed = 0
    groups = list(dict.fromkeys(w.group for w in chosen))
    for key in groups:
        group = [w for w in chosen if w.group == key]
        mode, nodes, flush = key[:3]
        first = group[0]
        secure = first.secure
        spread = (f"x{first.groups}", f"ns{first.namesrv}") if first.namesrv else ()
        c = LocalCluster(data_dir / "-".join(map(str, (mode, nodes, flush) + key[3] + spread
                                                 + (("tls",) if secure else ()))))
        try:  # measured like NATS's defaults (no TLS, no auth) unless the row says -tls
            # with name servers: deploy's health and route gates (every group led, every name
            # server routing every group to its leader) before the topic is created
            c.up(nodes, mode, flush, fresh=True, segment_bytes=256 << 20, log_level="WARNING",
                 insecure=not secure, groups=first.groups, namesrv=first.namesrv, wait=bool(first.namesrv),
                 **first.cluster_config())
            creds = str(c.credentials_file) if secure else None
            if mode != "standalone":
                c.wait_for_leader()
            if mode == "master-slave" and c.wait_healthy()["verdict"] != "healthy":
                raise RuntimeError(f"{mode} group did not get healthy")
            if first.namesrv:
                bootstrap = c.namesrv_addresses
                made = create_topic(bootstrap, TOPIC, QUEUES, credentials=creds)
                bad = {g: r for g, r in made.items() if isinstance(r, Exception)}
                if bad or len(made) != first.groups:
                    raise RuntimeError(f"bench: topic {TOPIC} not created on every group: {made}")
            else:
                bootstrap = c.addresses
                with Admin(c.addresses, credentials=creds) as a:
                    a.create_topic(TOPIC, QUEUES)
            for w in group:
                print(f"bench: {w.full_name} ...", file=sys.stderr, flush=True)
                with frozen_heap():
                    result = uvloop.run(run_workload(w, bootstrap, server_nodes(c), duration_s, messages, creds,
                                                     roles_now=lambda: roles(c)))
                failed += result["errors"] > 0
                print(json.dumps(result), flush=True)
        finally:
            c.down()
            shutil.rmtree(c.dir, ignore_errors=True)
    if floor:
        print(f"bench: {hop_floor.NAME} ...", file=sys.stderr, flush=True)
        try:
            result = hop_floor.run(data_dir, duration_s, messages)
        except (RuntimeError, OSError, ValueError, asyncio.TimeoutError) as e:  # the row fails, not the bench
            result = {"workload": hop_floor.NAME, "errors": 1, "error": f"{type(e).__name__}: {e}"}
        failed += result["errors"] > 0
        print(json.dumps(result), flush=True)
    if failover:
        print(f"bench: {FAILOVER} ...", file=sys.stderr, flush=True)
        c = LocalCluster(data_dir / "raft-failover")
        try:
            c.up(3, "raft", "async", fresh=True, segment_bytes=64 << 20, log_level="WARNING", insecure=True)
            print(json.dumps(failover_trials(c, FAILOVER_TRIALS)), flush=True)
        finally:
            c.down()
            shutil.rmtree(c.dir, ignore_errors=True)
    if fuzz:
        print(f"bench: {fuzz_bench.NAME} ...", file=sys.stderr, flush=True)
        result = fuzz_bench.run(data_dir, fuzz_frames or fuzz_bench.FRAMES, fuzz_seed)
        failed += result["errors"] > 0
        print(json.dumps(result), flush=True)
    if kafka_fuzz:
        print(f"bench: {kafka_bench.FUZZ} ...", file=sys.stderr, flush=True)
        result = kafka_bench.run_fuzz(data_dir, seed=fuzz_seed)
        failed += result["errors"] > 0
        print(json.dumps(result), flush=True)
    if kafka_rates:
        print(f"bench: {kafka_bench.PRODUCE}, {kafka_bench.CONSUME} ...", file=sys.stderr, flush=True)
        for result in kafka_bench.run_produce_consume(data_dir, duration_s):
            failed += result["errors"] > 0
            print(json.dumps(result), flush=True)
    if reconcile:
        print(f"bench: {reconcile_bench.NAME} (3 x {reconcile_entries} entries) ...", file=sys.stderr, flush=True)
        result = reconcile_bench.run(data_dir, reconcile_entries)
        failed += result["errors"] > 0
        print(json.dumps(result), flush=True)
    if sql:
        print(f"bench: {sql_bench.NAME} ...", file=sys.stderr, flush=True)
        result = sql_bench.run(data_dir)
        failed += result["errors"] > 0
        print(json.dumps(result), flush=True)
    return 1 if failed else 0
