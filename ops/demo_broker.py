"""`tidelog demo --broker-only`: one standalone broker end to end, on embedded defaults.

Starts a `flush: sync` broker on loopback, produces messages through the Python client,
consumes them as a group, kills the broker with SIGKILL (a crash, not a clean stop),
restarts it, shows every acknowledged message is still there once and in order, looks
messages up by key and by id, prints a summary and stops everything.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import click
import uvloop

from broker.client import Admin, Consumer, Credentials, Producer
from broker.client.cluster import ClusterConsumer, ClusterProducer
from ops.localbroker import LocalBroker, free_port

TOPIC = "demo-orders"
QUEUES = 4


def say(msg: str) -> None:
    click.echo(click.style("==> ", fg="cyan", bold=True) + msg)


class Acked(NamedTuple):
    """Where a send was acknowledged: the group (ClusterProducer; None with one group), queue and
    offset; and whether the producer retried it after an attempt whose outcome it could not know
    (a timeout: that attempt may have stored it too, so it may be read twice)."""
    group: str | None
    queue_id: int
    queue_offset: int
    body: bytes
    possible_duplicate: bool = False


async def produce(bootstrap: list[str], n: int, credentials=None, namesrv: bool = False) -> dict[str, Acked]:
    """n keyed messages from 64 concurrent senders; `namesrv`: `bootstrap` names name servers and
    the sends go over every group holding the topic (ClusterProducer)."""
    acked: dict[str, Acked] = {}
    it = iter(range(n))
    client = ClusterProducer if namesrv else Producer
    async with client(bootstrap, credentials=credentials) as p:
        async def worker():
            for i in it:
                body = f"order {i:06d} amount {i * 7 % 1000}.00".encode()
                r = await p.send_async(TOPIC, body, key=f"order-{i}", tags="paid" if i % 3 else "refund")
                acked[r.msg_id] = Acked(r.broker_name, r.queue_id, r.queue_offset, body, r.possible_duplicate)
        await asyncio.gather(*(worker() for _ in range(64)))
    return acked


def consume_all(bootstrap: list[str], group: str, expect: int, timeout_s: float = 30.0, credentials=None,
                namesrv: bool = False):
    """Poll as consumer group `group` until `expect` distinct messages came (or timeout_s), then
    commit; `namesrv`: from every broker group through the name servers (ClusterConsumer).
    Returns (every message polled, duplicates included; what one more short poll brought)."""
    got, ids = [], set()
    client = ClusterConsumer if namesrv else Consumer
    with client(bootstrap, group, TOPIC, credentials=credentials) as c:
        deadline = time.monotonic() + timeout_s
        while len(ids) < expect and time.monotonic() < deadline:
            batch = c.poll(timeout_ms=500, max_messages=1000)
            got += batch
            ids.update(m.msg_id for m in batch)
        extra = c.poll(timeout_ms=300)
        c.commit()
    return got, extra


def retried_copies(acked: dict[str, Acked], got: list) -> int:
    """Extra copies read of messages whose producer flagged a retry (possible_duplicate): the
    at-least-once contract, not a fault (check() names any other duplicate)."""
    counts: dict[str, int] = {}
    for m in got:
        counts[m.msg_id] = counts.get(m.msg_id, 0) + 1
    return sum(k - 1 for mid, k in counts.items() if k > 1 and mid in acked and acked[mid].possible_duplicate)


def check(acked: dict[str, Acked], got: list) -> list[str]:
    """Every acknowledged message read back, one copy where it was acknowledged (group, queue,
    offset) with its body; more than one copy only of a send the producer retried after an
    unknown outcome (possible_duplicate); each queue in order."""
    problems = []
    copies: dict[str, list] = {}
    for m in got:
        copies.setdefault(m.msg_id, []).append(m)
    for mid, ms in copies.items():
        if len(ms) > 1 and not (mid in acked and acked[mid].possible_duplicate):
            at = ", ".join(_where(m.broker_name, m.queue_id, m.queue_offset) for m in ms)
            problems.append(f"{mid} delivered {len(ms)} times, at {at} (the producer retried no send of it)")
    for mid, a in acked.items():
        ms = copies.get(mid)
        if not ms:
            problems.append(f"acknowledged message {mid} is missing")
        elif not any((m.broker_name, m.queue_id, m.queue_offset, m.body) == a[:4] for m in ms):
            problems.append(f"{mid} came back at {_where(ms[0].broker_name, ms[0].queue_id, ms[0].queue_offset)}, "
                            f"acked at {_where(a.group, a.queue_id, a.queue_offset)}")
    per_queue: dict[tuple, list[int]] = {}
    for m in got:
        per_queue.setdefault((m.broker_name, m.queue_id), []).append(m.queue_offset)
    for (g, q), offs in per_queue.items():
        if offs != sorted(offs):
            problems.append(f"queue {_where(g, q)} delivered out of order")
    return problems


def _where(group: str | None, queue_id: int, offset: int | None = None) -> str:
    return (f"{group}/" if group else "") + str(queue_id) + (f":{offset}" if offset is not None else "")


def secure_standalone(root: Path, address: str) -> tuple[dict, Credentials]:
    """A CA, a certificate for `address` and an admin user, as deploy makes them: the broker
    config's security fields and the client's credentials (files 0600 under root/security)."""
    import secrets

    from broker.client.security import write_credentials_file
    from broker.security import ca as cas
    from broker.security.scram import make_verifier

    sec = root / "security"
    ca = cas.create_ca(sec, "demo")
    cert = cas.issue_node_cert(ca, sec, "b0", [address.rsplit(":", 1)[0]])
    password = secrets.token_urlsafe(18)
    creds = write_credentials_file(sec / "admin.credentials.yaml", "admin", password, ca.cert_file)
    fields = {"insecure": False, "tls": {"ca_file": str(ca.cert_file), "cert_file": str(cert.cert_file),
                                        "key_file": str(cert.key_file)},
              "users": [{"name": "admin", "roles": ["admin"], "scram": make_verifier(password)}]}
    return fields, Credentials.load(creds)


def main(data_dir: Path, n: int) -> int:
    root = Path(data_dir).resolve() / "standalone"
    shutil.rmtree(root, ignore_errors=True)
    port = free_port()
    fields, creds = secure_standalone(root, f"127.0.0.1:{port}")
    broker = LocalBroker(root / "broker", port=port, flush="sync", segment_bytes=64 << 20, **fields)
    rows = []
    try:
        t0 = time.perf_counter()
        broker.start()
        say(f"broker started on {broker.address} (pid {broker.pid}, flush: sync, TLS + user admin, data in {root})")
        with Admin([broker.address], credentials=creds) as a:
            a.create_topic(TOPIC, QUEUES)
        say(f"topic {TOPIC} created with {QUEUES} queues")

        t = time.perf_counter()
        acked = uvloop.run(produce([broker.address], n, creds))
        dt = time.perf_counter() - t
        say(f"produced {len(acked)} messages, each acknowledged after fsync ({len(acked) / dt:,.0f} msg/s)")
        rows.append(("produced and acknowledged", len(acked)))

        got, _ = consume_all([broker.address], "demo-billing", n, credentials=creds)
        problems = check(acked, got)
        say(f"consumer group demo-billing read {len(got)} messages; committed its offsets")
        rows.append(("consumed before the crash", len(got)))

        broker.kill()
        say("broker killed with SIGKILL (a crash: no shutdown, no final flush)")
        t = time.perf_counter()
        broker.start()
        say(f"broker restarted in {time.perf_counter() - t:.2f}s; recovery checked the log tail")

        got2, _ = consume_all([broker.address], "demo-audit", n, credentials=creds)
        problems += check(acked, got2)
        say(f"a new group demo-audit read {len(got2)} messages after the restart")
        rows.append(("present after crash + restart", len(got2)))

        _, again = consume_all([broker.address], "demo-billing", 0, timeout_s=1, credentials=creds)
        rows.append(("redelivered to demo-billing (committed)", len(again)))
        if again:
            problems.append(f"demo-billing got {len(again)} messages again after committing")

        with Admin([broker.address], credentials=creds) as a:
            some_id, first = next(iter(acked.items()))
            by_id = a.query_by_id(some_id)
            by_key = a.query_by_key(TOPIC, "order-42")
            status = a.status()
        if by_id is None or by_id.body != first.body:
            problems.append(f"lookup by id {some_id} failed")
        if [m.body[:12] for m in by_key] != [b"order 000042"]:
            problems.append("lookup by key order-42 failed")
        say(f"lookup by id {some_id[:12]}...: {by_id.body.decode() if by_id else None!r}")
        say(f"lookup by key order-42: {[m.body.decode() for m in by_key]}")
        rows.append(("CommitLog entries", status["store"]["next_index"]))
    finally:
        rc = broker.stop()
    rows.append(("broker exit code after SIGTERM", rc))

    ok = summary("Tidelog demo summary", rows, t0, problems,
                 "OK: every acknowledged message survived the crash, once, in order per queue; "
                 "the broker stopped cleanly.", width=42)
    if ok:
        click.echo(f"Broker log: {broker.log_path}")
    return 0 if ok else 1


def summary(title: str, rows: list[tuple], t0: float, problems: list[str], ok_line: str, width: int,
            paths: dict | None = None) -> bool:
    """The demos' closing table; True when there was no problem."""
    click.echo()
    click.echo(click.style(title, bold=True))
    for k, v in rows:
        click.echo(f"  {k:<{width}} {v!s:>8}")
    click.echo(f"  {'total time':<{width}} {time.perf_counter() - t0:>7.1f}s")
    for k, v in (paths or {}).items():
        click.echo(f"  {k + ':':<14} {v}")
    if problems:
        click.echo(click.style(f"FAILED: {len(problems)} problem(s):", fg="red", bold=True))
        for p in problems[:20]:
            click.echo(f"  - {p}")
        return False
    click.echo(click.style(ok_line, fg="green", bold=True))
    return True
